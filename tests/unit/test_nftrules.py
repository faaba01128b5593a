"""Bridge mode's nftables gate, rendered and parsed (datapath/nftrules.py): pure."""

from __future__ import annotations

import json

import pytest

from santhrottle.appliance.datapath import nftrules as nr
from santhrottle.appliance.datapath.host import Tools
from santhrottle.appliance.datapath.names import ALL_SET_NAMES, DatapathError

Q = "bridge santhrottle"


def test_the_chain_names_the_ports_and_counts_only_what_it_classifies():
    rules = nr.render_chain_rules((3260, 4420))
    assert rules[0] == "tcp sport != { 3260, 4420 } return"
    assert nr.render_chain_rules((3260,))[0] == "tcp sport != 3260 return"
    assert nr.parse_ports(rules) == (3260, 4420)
    assert nr.parse_ports(nr.render_chain_rules((3260,))) == (3260,)
    assert nr.parse_ports([]) is None
    # every classifying rule counts after its map lookup (a miss ends the rule first), in
    # the counted set of its map's family
    for r in rules[1:]:
        if "map @" in r:
            v6 = " ip6 daddr map " in r
            assert r.endswith("ip6 daddr @santhrottle-counted6" if v6 else
                              "ip daddr @santhrottle-counted")  # fmt: skip
    # read mode: only packets with a payload; the RETURN after leaves pure ACKs to ack
    assert rules[3].startswith("@ih,0,8 & 0x0 == 0x0 ") and "@santhrottle-read " in rules[3]
    assert rules[4].startswith("@ih,0,8 & 0x0 == 0x0 ") and "@santhrottle-read6 " in rules[4]
    assert rules[5] == "@ih,0,8 & 0x0 == 0x0 return"
    assert (
        rules[6].startswith("tcp flags ack / fin,syn,rst,ack ") and "@santhrottle-ack " in rules[6]
    )
    assert (
        rules[7].startswith("tcp flags ack / fin,syn,rst,ack ")
        and "@santhrottle-ack6 " in (rules[7])
    )


def test_every_mode_has_a_rule_per_family_as_nft_lists_it():
    """The exact texts `nft list` prints back (nftables 1.0.6, checked in a namespace):
    reconcile compares them with the listed rules."""
    rules = nr.render_chain_rules((3260, 4420))
    assert rules[1:] == [
        "meta priority set ip daddr map @santhrottle-all ip daddr @santhrottle-counted",
        "meta priority set ip6 daddr map @santhrottle-all6 ip6 daddr @santhrottle-counted6",
        "@ih,0,8 & 0x0 == 0x0 meta priority set ip daddr map @santhrottle-read"
        " ip daddr @santhrottle-counted",
        "@ih,0,8 & 0x0 == 0x0 meta priority set ip6 daddr map @santhrottle-read6"
        " ip6 daddr @santhrottle-counted6",
        "@ih,0,8 & 0x0 == 0x0 return",
        "tcp flags ack / fin,syn,rst,ack meta priority set ip daddr map @santhrottle-ack"
        " ip daddr @santhrottle-counted",
        "tcp flags ack / fin,syn,rst,ack meta priority set ip6 daddr map @santhrottle-ack6"
        " ip6 daddr @santhrottle-counted6",
    ]


def test_ensure_adds_only_what_is_missing():
    text, created = nr.render_ensure(nr.NftState())
    assert text.splitlines()[0] == f"add table {Q}"
    assert created == ["santhrottle-all", "santhrottle-ack", "santhrottle-read",
                       "santhrottle-counted", "santhrottle-all6", "santhrottle-ack6",
                       "santhrottle-read6", "santhrottle-counted6"]  # fmt: skip
    assert f"add map {Q} santhrottle-all {{ typeof ip daddr : meta priority; }}" in text
    assert f"add map {Q} santhrottle-all6 {{ typeof ip6 daddr : meta priority; }}" in text
    assert f"add set {Q} santhrottle-counted {{ typeof ip daddr; counter; }}" in text
    assert f"add set {Q} santhrottle-counted6 {{ typeof ip6 daddr; counter; }}" in text
    assert f"add chain {Q} delay" in text
    full = nr.NftState(table=True, maps=set(ALL_SET_NAMES),
                       counted={"santhrottle-counted", "santhrottle-counted6"},
                       chains={"delay"})  # fmt: skip
    assert nr.render_ensure(full) == ("", [])


def test_a_table_from_before_ipv6_gains_the_ipv6_maps_and_rules():
    """An IPv4-only table (maps, counted set and the five rules of before): ensure adds
    the IPv6 maps and counted set only, reconcile rebuilds the chain in one transaction."""
    old = nr.NftState(table=True, maps={"santhrottle-all", "santhrottle-ack",
                      "santhrottle-read"}, counted={"santhrottle-counted"},
                      chains={"delay"})  # fmt: skip
    text, created = nr.render_ensure(old)
    assert created == ["santhrottle-all6", "santhrottle-ack6", "santhrottle-read6",
                       "santhrottle-counted6"]  # fmt: skip
    assert text.splitlines() == [
        f"add map {Q} santhrottle-all6 {{ typeof ip6 daddr : meta priority; }}",
        f"add map {Q} santhrottle-ack6 {{ typeof ip6 daddr : meta priority; }}",
        f"add map {Q} santhrottle-read6 {{ typeof ip6 daddr : meta priority; }}",
        f"add set {Q} santhrottle-counted6 {{ typeof ip6 daddr; counter; }}",
    ]
    v4_rules = [r for r in nr.render_chain_rules((3260, 4420)) if "ip6 daddr" not in r]
    assert len(v4_rules) == 5
    text2 = nr.render_reconcile((3260, 4420), v4_rules, None, ["br-i"], False)
    assert text2 is not None
    lines = text2.splitlines()
    assert lines[0] == f"flush chain {Q} delay"
    assert lines[1:] == [f"add rule {Q} delay {r}" for r in nr.render_chain_rules((3260, 4420))]


def test_reconcile_rebuilds_a_chain_that_differs_and_keeps_one_that_does_not():
    want = nr.render_chain_rules((3260, 4420))
    assert nr.render_reconcile((3260, 4420), want, None, ["br-i"], False) is None
    text = nr.render_reconcile((3260,), want, None, ["br-i"], False)
    assert text is not None and text.splitlines()[0] == f"flush chain {Q} delay"
    assert text.count("add rule") == 8
    fresh = nr.render_reconcile((3260, 4420), None, None, ["br-i"], True)
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


def test_ipv6_ops_go_to_the_ipv6_maps_and_counted_set():
    text = nr.render_ops([("add", "santhrottle-all6", "fd00::3", 0x20)], {})
    assert text.splitlines() == [
        f"add element {Q} santhrottle-all6 {{ fd00::3 : 5374:20 }}",
        f"add element {Q} santhrottle-counted6 {{ fd00::3 }}",
    ]
    before = {"fd00::3": ("all", 0x20)}
    glided = nr.render_ops([("add", "santhrottle-all6", "fd00::3", 0x6000)], before)
    assert glided.splitlines() == [
        f"delete element {Q} santhrottle-all6 {{ fd00::3 }}",
        f"add element {Q} santhrottle-all6 {{ fd00::3 : 5374:6000 }}",
    ]  # santhrottle-counted6 untouched: the counter goes on
    moved = nr.render_ops(
        [("del", "santhrottle-all6", "fd00::3", 0), ("add", "santhrottle-ack6", "fd00::3", 0x5)],
        before,
    )
    assert moved.splitlines() == [
        f"delete element {Q} santhrottle-all6 {{ fd00::3 }}",
        f"add element {Q} santhrottle-ack6 {{ fd00::3 : 5374:5 }}",
    ]
    gone = nr.render_ops([("del", "santhrottle-all6", "fd00::3", 0)], before)
    assert gone.splitlines() == [
        f"delete element {Q} santhrottle-all6 {{ fd00::3 }}",
        f"delete element {Q} santhrottle-counted6 {{ fd00::3 }}",
    ]


def test_a_mixed_batch_is_one_transaction_with_each_family_in_its_own_sets():
    before = {"10.0.0.3": ("all", 0x3), "fd00::3": ("all", 0x3), "fd00::4": ("read", 0x2)}
    ops = [
        ("add", "santhrottle-all", "10.0.0.3", 0x5),
        ("add", "santhrottle-all6", "fd00::3", 0x7),
        ("add", "santhrottle-all", "10.0.0.9", 0x1),
        ("add", "santhrottle-all6", "fd00::9", 0x1),
        ("del", "santhrottle-read6", "fd00::4", 0),
    ]
    assert nr.render_ops(ops, before).splitlines() == [
        f"delete element {Q} santhrottle-all {{ 10.0.0.3 }}",
        f"add element {Q} santhrottle-all {{ 10.0.0.3 : 5374:5 }}",
        f"delete element {Q} santhrottle-all6 {{ fd00::3 }}",
        f"add element {Q} santhrottle-all6 {{ fd00::3 : 5374:7 }}",
        f"add element {Q} santhrottle-all {{ 10.0.0.9 : 5374:1 }}",
        f"add element {Q} santhrottle-all6 {{ fd00::9 : 5374:1 }}",
        f"delete element {Q} santhrottle-read6 {{ fd00::4 }}",
        f"delete element {Q} santhrottle-counted6 {{ fd00::4 }}",
        f"add element {Q} santhrottle-counted {{ 10.0.0.9 }}",
        f"add element {Q} santhrottle-counted6 {{ fd00::9 }}",
    ]


@pytest.mark.parametrize(
    ("op", "match"),
    [
        (("add", "santhrottle-all", "fd00::3", 0x20),
         r"^fd00::3 is not an IPv4 address: santhrottle-all holds IPv4 initiators "
         r"\(its IPv6 set is santhrottle-all6\)$"),
        (("del", "santhrottle-ack6", "10.0.0.3", 0),
         r"^10\.0\.0\.3 is not an IPv6 address: santhrottle-ack6 holds IPv6 initiators "
         r"\(its IPv4 set is santhrottle-ack\)$"),
        (("add", "santhrottle-members", "10.0.0.3", 0x20), r"^bad member op 'add' on"),
        (("swap", "santhrottle-all", "10.0.0.3", 0x20), r"^bad member op 'swap' on"),
    ],
)  # fmt: skip
def test_an_op_whose_set_does_not_fit_is_one_error(op, match):
    """The set name decides the family: an address of the other one is refused before
    nft sees it (nft would fail the whole batch with a message about types)."""
    with pytest.raises(DatapathError, match=match):
        nr.render_ops([("add", "santhrottle-all", "10.0.0.1", 0x1), op], {})


def test_replace_sets_both_maps_of_the_mode_from_a_mixed_membership():
    before = {
        "10.0.0.3": ("all", 0x20),
        "fd00::3": ("read", 0x3),
        "fd00::4": ("all", 0x4),
        "10.0.0.5": ("ack", 0x1),
    }
    text = nr.render_replace("all", {"10.0.0.3": 0x5, "fd00::3": 0x6, "fd00::7": 0x7}, before)
    assert text.splitlines() == [
        f"flush map {Q} santhrottle-all",
        f"flush map {Q} santhrottle-all6",
        f"delete element {Q} santhrottle-read6 {{ fd00::3 }}",
        f"add element {Q} santhrottle-all {{ 10.0.0.3 : 5374:5 }}",
        f"add element {Q} santhrottle-all6 {{ fd00::3 : 5374:6, fd00::7 : 5374:7 }}",
        f"delete element {Q} santhrottle-counted6 {{ fd00::4 }}",
        f"add element {Q} santhrottle-counted6 {{ fd00::7 }}",
    ]
    # emptied: both maps of the mode flushed, every member of it leaves its counted set
    empty = nr.render_replace("all", {}, before).splitlines()
    assert empty == [
        f"flush map {Q} santhrottle-all",
        f"flush map {Q} santhrottle-all6",
        f"delete element {Q} santhrottle-counted {{ 10.0.0.3 }}",
        f"delete element {Q} santhrottle-counted6 {{ fd00::4 }}",
    ]


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
    assert st.table and st.counted == {"santhrottle-counted"} and st.chains == {"delay"}
    assert st.maps == {"santhrottle-all"}, "the admin's table is not ours"
    assert st.members == {"10.0.0.3": ("all", 0x20, 12, 3000), "10.0.0.4": ("all", 0x6000, 0, 0)}
    assert nr.parse_json(_listing()) == nr.NftState()
    with pytest.raises(DatapathError, match="not nftables JSON"):
        nr.parse_json("Error: garbage")


def test_parse_json_reads_both_families_into_one_membership():
    text = _listing(
        {"table": {"family": "bridge", "name": "santhrottle", "handle": 1}},
        {"map": {"family": "bridge", "name": "santhrottle-all", "table": "santhrottle",
                 "type": "ipv4_addr", "map": "classid", "elem": [["10.0.0.3", "5374:20"]]}},
        {"set": {"family": "bridge", "name": "santhrottle-counted", "table": "santhrottle",
                 "type": "ipv4_addr", "stmt": [{"counter": None}],
                 "elem": [{"elem": {"val": "10.0.0.3",
                                    "counter": {"packets": 3, "bytes": 300}}}]}},
        {"map": {"family": "bridge", "name": "santhrottle-all6", "table": "santhrottle",
                 "type": "ipv6_addr", "map": "classid",
                 "elem": [["fd00::3", "5374:20"], ["fd00:5374::1:2", "5374:6000"]]}},
        {"map": {"family": "bridge", "name": "santhrottle-read6", "table": "santhrottle",
                 "type": "ipv6_addr", "map": "classid", "elem": [["fd00::4", "5374:3"]]}},
        {"set": {"family": "bridge", "name": "santhrottle-counted6", "table": "santhrottle",
                 "type": "ipv6_addr", "stmt": [{"counter": None}],
                 "elem": [{"elem": {"val": "fd00::3",
                                    "counter": {"packets": 12, "bytes": 3000}}},
                          {"elem": {"val": "fd00:5374::1:2",
                                    "counter": {"packets": 0, "bytes": 0}}},
                          "fd00::4"]}},
    )  # fmt: skip
    st = nr.parse_json(text)
    assert st.maps == {"santhrottle-all", "santhrottle-all6", "santhrottle-read6"}
    assert st.counted == {"santhrottle-counted", "santhrottle-counted6"}
    assert st.members == {
        "10.0.0.3": ("all", 0x20, 3, 300),
        "fd00::3": ("all", 0x20, 12, 3000),
        "fd00:5374::1:2": ("all", 0x6000, 0, 0),
        "fd00::4": ("read", 0x3, 0, 0),
    }
    # what ensure still has to add for this table: the maps it lacks
    _, created = nr.render_ensure(st)
    assert created == ["santhrottle-ack", "santhrottle-read", "santhrottle-ack6"]


def test_parse_chains_reads_our_table_only():
    rules = nr.render_chain_rules((3260,))
    assert any("ip6 daddr" in r for r in rules)
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


class _FakeHost:
    """What NftSets asks of a Host: the nft tool's name and run() (recorded, not run).
    Its tools name another nft than the default, so the gate runs that program rather
    than libnftables in the process (datapath/nftlib.py, tests/privileged/test_nftlib.py)."""

    def __init__(self) -> None:
        self.tools = Tools(nft="recorded-nft")
        self.sent: list[str] = []

    def run(self, argv: list[str], stdin: str | None = None, what: str | None = None) -> str:
        assert argv == ["recorded-nft", "-f", "-"], argv
        self.sent.append(stdin or "")
        return ""


class _FakeGeneration:
    """NftGeneration's interface (datapath/nftgate.py; read for real in
    tests/privileged/test_bridge_netdev.py): each transaction's end, recorded."""

    def __init__(self) -> None:
        self.writes: list[bool] = []
        self.last: int | None = None

    def after_write(self, ok: bool) -> None:
        self.writes.append(ok)


def test_the_gate_of_a_mixed_membership_names_each_familys_maps():
    """NftSets (datapath/nftgate.py) sends a mixed batch as one transaction and knows
    the maps that hold members, per family; the generation is read after it."""
    from santhrottle.appliance.datapath.nftgate import NftSets

    host, generation = _FakeHost(), _FakeGeneration()
    sets = NftSets(host, generation)  # type: ignore[arg-type]
    ops = [
        ("add", "santhrottle-all", "10.0.0.3", 0x3),
        ("add", "santhrottle-read6", "fd00::3", 0x5),
    ]
    after = sets.send(ops, {})
    assert after == {"10.0.0.3": ("all", 0x3), "fd00::3": ("read", 0x5)}
    assert len(host.sent) == 1 and "santhrottle-counted6 { fd00::3 }" in host.sent[0]
    assert generation.writes == [True]
    assert sets.gate_now() == {"santhrottle-all", "santhrottle-read6"}
    with pytest.raises(DatapathError, match="not an IPv6 address"):
        sets.send([("add", "santhrottle-all6", "10.0.0.4", 0x3)], after)
    assert len(host.sent) == 1, "nothing sent"
