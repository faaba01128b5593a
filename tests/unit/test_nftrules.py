"""Bridge mode's nftables gate, rendered and parsed (datapath/nftrules.py): pure."""

from __future__ import annotations

import json

import pytest

from santhrottle.appliance.datapath import nftrules as nr
from santhrottle.appliance.datapath.names import DatapathError

Q = "bridge santhrottle"


def test_the_chain_names_the_ports_and_counts_only_what_it_classifies():
    rules = nr.render_chain_rules((3260, 4420))
    assert rules[0] == "tcp sport != { 3260, 4420 } return"
    assert nr.render_chain_rules((3260,))[0] == "tcp sport != 3260 return"
    assert nr.parse_ports(rules) == (3260, 4420)
    assert nr.parse_ports(nr.render_chain_rules((3260,))) == (3260,)
    assert nr.parse_ports([]) is None
    # every classifying rule counts after its map lookup (a miss ends the rule first)
    for r in rules[1:]:
        if "map @" in r:
            assert r.endswith("ip daddr @santhrottle-counted")
    # read mode: only packets with a payload; the RETURN after leaves pure ACKs to ack
    assert rules[2].startswith("@ih,0,8 & 0x0 == 0x0 ") and "@santhrottle-read" in rules[2]
    assert rules[3] == "@ih,0,8 & 0x0 == 0x0 return"
    assert (
        rules[4].startswith("tcp flags ack / fin,syn,rst,ack ") and "@santhrottle-ack" in rules[4]
    )


def test_ensure_adds_only_what_is_missing():
    text, created = nr.render_ensure(nr.NftState())
    assert text.splitlines()[0] == f"add table {Q}"
    assert created == ["santhrottle-all", "santhrottle-ack", "santhrottle-read",
                       "santhrottle-counted"]  # fmt: skip
    assert f"add map {Q} santhrottle-all {{ typeof ip daddr : meta priority; }}" in text
    assert f"add chain {Q} delay" in text
    full = nr.NftState(table=True, maps={"santhrottle-all", "santhrottle-ack",
                       "santhrottle-read"}, counted=True, chains={"delay"})  # fmt: skip
    assert nr.render_ensure(full) == ("", [])


def test_converge_rebuilds_a_chain_that_differs_and_keeps_one_that_does_not():
    want = nr.render_chain_rules((3260, 4420))
    assert nr.render_converge((3260, 4420), want, None, ["br-i"], False) is None
    text = nr.render_converge((3260,), want, None, ["br-i"], False)
    assert text is not None and text.splitlines()[0] == f"flush chain {Q} delay"
    assert text.count("add rule") == 5
    fresh = nr.render_converge((3260, 4420), None, None, ["br-i"], True)
    assert fresh is not None
    assert fresh.splitlines()[0] == f"add chain {Q} delay"
    assert f'add rule {Q} postrouting oifname "br-i" meta l4proto tcp jump delay' in fresh


def test_the_hook_chain_exists_only_while_somebody_is_delayed():
    jump = nr.jump_rule("br-i")
    assert nr.parse_jump_device(jump) == "br-i"
    on = nr.render_jumps(["br-i"], True, None)
    assert on.splitlines() == [
        f"add chain {Q} postrouting {{ type filter hook postrouting priority 0; policy accept; }}",
        f"add rule {Q} postrouting {jump}",
    ]
    assert nr.render_jumps(["br-i"], True, [jump]) == ""
    off = nr.render_jumps(["br-i"], False, [jump])
    assert off.splitlines() == [f"flush chain {Q} postrouting", f"delete chain {Q} postrouting"]
    assert nr.render_jumps(["br-i"], False, None) == ""
    # the cleanup's call (no device): the hook chain goes, whatever it holds
    assert nr.render_jumps([], True, [jump]) == off
    moved = nr.render_jumps(["br-j"], True, [jump])
    assert f"flush chain {Q} postrouting" in moved and 'oifname "br-j"' in moved


def test_ops_replace_an_element_to_change_its_class_and_keep_its_counter():
    text = nr.render_ops([("add", "santhrottle-all", "10.0.0.3", 0x20)], {})
    assert text.splitlines() == [
        f"add element {Q} santhrottle-all {{ 10.0.0.3 : 5374:20 }}",
        f"add element {Q} santhrottle-counted {{ 10.0.0.3 }}",
    ]
    before = {"10.0.0.3": ("all", 0x20)}
    text = nr.render_ops([("add", "santhrottle-all", "10.0.0.3", 0x6000)], before)
    assert text.splitlines() == [
        f"delete element {Q} santhrottle-all {{ 10.0.0.3 }}",
        f"add element {Q} santhrottle-all {{ 10.0.0.3 : 5374:6000 }}",
    ]  # santhrottle-counted untouched: the counter goes on
    moved = nr.render_ops(
        [("del", "santhrottle-all", "10.0.0.3", 0), ("add", "santhrottle-read", "10.0.0.3", 0x5)],
        before,
    )
    assert "counted" not in moved and "santhrottle-read { 10.0.0.3 : 5374:5 }" in moved
    gone = nr.render_ops([("del", "santhrottle-all", "10.0.0.3", 0)], before)
    assert gone.splitlines()[-1] == f"delete element {Q} santhrottle-counted {{ 10.0.0.3 }}"
    # a del of what the membership does not hold is no line (nft would fail the batch)
    assert nr.render_ops([("del", "santhrottle-ack", "10.0.0.9", 0)], before) == ""


def test_replace_sets_a_map_to_exactly_its_members():
    before = {"10.0.0.3": ("all", 0x20), "10.0.0.4": ("read", 0x3)}
    text = nr.render_replace("read", {"10.0.0.3": 0x5}, before)
    lines = text.splitlines()
    assert lines[0] == f"flush map {Q} santhrottle-read"
    assert f"delete element {Q} santhrottle-all {{ 10.0.0.3 }}" in lines
    assert f"add element {Q} santhrottle-read {{ 10.0.0.3 : 5374:5 }}" in lines
    assert lines[-1] == f"delete element {Q} santhrottle-counted {{ 10.0.0.4 }}"


def _listing(*items: dict) -> str:
    return json.dumps({"nftables": [{"metainfo": {"version": "1.0.6"}}, *items]})


def test_parse_json_reads_members_with_their_counters_and_ignores_other_tables():
    text = _listing(
        {"table": {"family": "bridge", "name": "santhrottle", "handle": 1}},
        {"table": {"family": "bridge", "name": "admin", "handle": 2}},
        {"map": {"family": "bridge", "name": "santhrottle-all", "table": "santhrottle",
                 "type": "ipv4_addr", "map": "classid",
                 "elem": [["10.0.0.3", "5374:20"], ["10.0.0.4", "5374:6000"],
                          ["10.0.0.5", "1:2"]]}},
        {"map": {"family": "bridge", "name": "santhrottle-ack", "table": "admin",
                 "elem": [["10.0.0.9", "5374:3"]]}},
        {"set": {"family": "bridge", "name": "santhrottle-counted", "table": "santhrottle",
                 "elem": [{"elem": {"val": "10.0.0.3",
                                    "counter": {"packets": 12, "bytes": 3000}}},
                          "10.0.0.4"]}},
        {"chain": {"family": "bridge", "table": "santhrottle", "name": "delay"}},
    )  # fmt: skip
    st = nr.parse_json(text)
    assert st.table and st.counted and st.chains == {"delay"}
    assert st.maps == {"santhrottle-all"}, "the admin's table is not ours"
    assert st.members == {"10.0.0.3": ("all", 0x20, 12, 3000), "10.0.0.4": ("all", 0x6000, 0, 0)}
    assert nr.parse_json(_listing()) == nr.NftState()
    with pytest.raises(DatapathError, match="not nftables JSON"):
        nr.parse_json("Error: garbage")


def test_parse_chains_reads_our_table_only():
    rules = nr.render_chain_rules((3260,))
    ours = "\n".join(
        ["table bridge admin {", "\tchain delay {", "\t\tcounter", "\t}", "}",
         "table bridge santhrottle {", "\tmap santhrottle-all {",
         "\t\ttypeof ip daddr : meta priority", "\t}", "", "\tchain delay {",
         *[f"\t\t{r}" for r in rules], "\t}", "", "\tchain postrouting {",
         "\t\ttype filter hook postrouting priority 0; policy accept;",
         f"\t\t{nr.jump_rule('br-i')}", "\t}", "}"]
    )  # fmt: skip
    assert nr.parse_chains(ours) == (rules, [nr.jump_rule("br-i")])
    assert nr.parse_chains("") == (None, None)
