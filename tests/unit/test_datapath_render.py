"""The data path's pure parts: naming, sizing, the rendered tc / iptables / ipset
texts and the reconciliation plans (no root, no kernel)."""

from __future__ import annotations

import pytest

from santhrottle.appliance.datapath import members as mb
from santhrottle.appliance.datapath import names as nm
from santhrottle.appliance.datapath import rules as rl
from santhrottle.appliance.datapath import tctree as tt
from santhrottle.appliance.datapath.host import NETEM_MISSING_MSG, module_available
from santhrottle.controller.ladder import Ladder

LIN = Ladder.linear(500, 100)


def test_delay_to_class_exact_delays_of_the_ladder_only():
    assert nm.delay_to_class(5000, LIN) == 10
    assert nm.delay_to_class(0, LIN) == 0
    with pytest.raises(
        nm.DatapathError, match=r"not a delay of the ladder: use 1ms \(class 2\) or"
    ):
        nm.delay_to_class(1200, LIN)
    with pytest.raises(nm.DatapathError, match=r"above the maximum 50ms \(class 100\)"):
        nm.delay_to_class(60_000, LIN)
    geo = Ladder()  # 0.5 ms steps to 10 ms, x1.05 above
    assert nm.delay_to_class(29_000, geo) == 43 and geo.delay_us(44) == 30_500
    with pytest.raises(nm.DatapathError, match=r"use 29ms \(class 43\) or 30.5ms \(class 44\)"):
        nm.delay_to_class(30_000, geo)


def test_check_ip():
    assert nm.check_ip("10.0.0.3") == "10.0.0.3"
    for bad in ("10.0.0.x", "010.0.0.3", "10.0.0.0/24", "fd00::/64", "fd00::g", ""):
        with pytest.raises(nm.DatapathError, match="bad initiator address"):
            nm.check_ip(bad)


def test_check_ip_gives_ipv6_as_the_kernel_prints_it():
    assert nm.check_ip("FD00:0:0::0:2") == "fd00::2"
    assert nm.check_ip("fe80::1%eth1") == "fe80::1"  # a member is an address, not a link
    assert nm.check_ip("::ffff:10.0.0.3") == "10.0.0.3"  # a dual-stack socket's IPv4 peer
    assert nm.check_ip("2001:db8::ffff:1.2.3.4") == "2001:db8::ffff:102:304"
    for ip in ("10.0.0.3", "fd00::2", "::1", "2001:db8:0:1:1:1:1:1"):
        assert nm.is_canonical_ip(nm.check_ip(ip))
    for raw in ("FD00::2", "fd00:0::2", "::ffff:10.0.0.3", "010.0.0.3", "fd00::2%eth1"):
        assert not nm.is_canonical_ip(raw)
    assert nm.set_name("ack", "fd00::2") == "santhrottle-ack6"
    assert nm.set_name("ack", "10.0.0.2") == "santhrottle-ack"
    assert sorted(["fd00::1", "10.0.0.10", "::2", "10.0.0.9"], key=nm.ip_key) == [
        "10.0.0.9", "10.0.0.10", "::2", "fd00::1"]  # fmt: skip
    assert len(max(nm.OWNED_SETS, key=len)) <= 31  # IPSET_MAXNAMELEN - 1


# ----------------------------------------------------------------- naming


def test_class_minor_reads_as_the_class_number():
    assert nm.class_minor(20) == 0x20
    assert nm.classid(20) == "5374:20"
    assert nm.classid(100) == "5374:100"
    assert nm.classid(0) == "5374:0"  # HTB's direct queue
    seen = set()
    for k in range(1, nm.MAX_CLASSES + 1):
        m = nm.class_minor(k)
        assert nm.minor_class(m) == k
        assert m != nm.DIRECT_MINOR and m < nm.ROOT_MAJOR  # leaf handle k: below the root
        seen.add(m)
    assert len(seen) == nm.MAX_CLASSES
    assert nm.minor_class(0xA) is None and nm.minor_class(0xFFFF) is None
    with pytest.raises(ValueError):
        nm.class_minor(0)


def test_set_names_fit_ipset_and_are_ours():
    for name in nm.OWNED_SETS:
        assert name.startswith("santhrottle-") and len(name) <= 31


# ----------------------------------------------------------------- sizing


@pytest.mark.parametrize(
    ("gbit", "rate", "burst"),
    [
        (10, 1_250_000_000, 1_250_000),
        (25, 3_125_000_000, 3_125_000),
        (100, 12_500_000_000, 12_500_000),
    ],
)
def test_htb_params_per_link_speed(gbit, rate, burst):
    hp = tt.htb_params(gbit * 10**9)
    assert hp.rate_bytes_s == hp.ceil_bytes_s == rate
    assert hp.burst_bytes == hp.cburst_bytes == burst
    assert hp.quantum_bytes == 200_000
    assert hp.tc_args() == (
        f"rate {gbit * 10**9}bit ceil {gbit * 10**9}bit burst {burst}b cburst {burst}b "
        "quantum 200000 prio 0"
    )


def test_htb_burst_never_below_two_gso_packets():
    assert tt.htb_params(100 * 10**6).burst_bytes == 2 * 65536


def test_netem_limit_holds_link_rate_times_delay_of_min_frames():
    # 10 Gbit/s x 10 ms = 12.5 MB = 195313 frames of 64 B
    assert tt.netem_limit(10**10, 10_000) == 195_313
    assert tt.netem_limit(10**10, 50_000) == 976_563
    assert tt.netem_limit(10**8, 500) == 1000  # the floor
    for k in range(1, 101):
        lim = tt.netem_limit(10**10, k * 500)
        assert lim * 64 >= 1.25e9 * k * 500e-6


# ---------------------------------------------------------------- tc plan


def _want(step_us=500, max_class=100, gbit=10, leaf="netem"):
    return tt.desired_tree(Ladder.linear(step_us, max_class).delays_us, gbit * 10**9, leaf)


def test_fresh_build_is_one_batch():
    lines = tt.render_tc_plan("eth1", _want(), None)
    # unthrottled packets take HTB's direct queue: no default class
    assert lines[0] == "qdisc add dev eth1 root handle 5374: htb default 0"
    assert lines[1].startswith("class add dev eth1 parent 5374: classid 5374:1 htb rate ")
    assert len(lines) == 1 + 100 + 100
    assert "class add dev eth1 parent 5374: classid 5374:20 htb rate 10000000000bit" in "\n".join(
        lines
    )
    assert "qdisc add dev eth1 parent 5374:20 handle 20: netem delay 10000us limit 195313" in lines
    assert (
        "qdisc add dev eth1 parent 5374:100 handle 100: netem delay 50000us limit 976563" in lines
    )
    # a kernel default root (handle 0:) is replaced by a fresh build too
    assert tt.render_tc_plan("eth1", _want(), tt.TcTree("noqueue", 0)) == lines


def test_plan_is_empty_when_the_tree_matches():
    want = _want()
    assert tt.render_tc_plan("eth1", want, _want()) == []


def test_step_change_replaces_leaves_in_place_and_extra_classes_go_last():
    have = _want(step_us=500, max_class=100)
    want = _want(step_us=1000, max_class=50)
    lines = tt.render_tc_plan("eth1", want, have)
    assert not any(ln.startswith("qdisc add dev eth1 root") for ln in lines)
    replaces = [ln for ln in lines if ln.startswith("qdisc replace")]
    assert len(replaces) == 50
    assert "qdisc replace dev eth1 parent 5374:20 handle 20: netem delay 20000us limit 390625" in (
        replaces
    )
    dels = [ln for ln in lines if ln.startswith("class del")]
    assert len(dels) == 50 and lines[-50:] == dels
    assert "class del dev eth1 classid 5374:51" in dels


def test_another_default_class_means_a_rebuild():
    # e.g. a tree of santhrottle <= 0.3 (default class 5374:ffff): rebuilt
    have = _want()
    have.default_minor = 0xFFFF
    have.classes[0xFFFF] = tt.htb_params(10**10)
    lines = tt.render_tc_plan("eth1", _want(), have)
    assert lines[:2] == [
        "qdisc del dev eth1 root",
        "qdisc add dev eth1 root handle 5374: htb default 0",
    ]
    assert len(lines) == 2 + 100 + 100


def test_link_speed_change_changes_classes():
    lines = tt.render_tc_plan("eth1", _want(gbit=25), _want(gbit=10))
    changes = [ln for ln in lines if ln.startswith("class change")]
    assert len(changes) == 100
    assert "rate 25000000000bit ceil 25000000000bit burst 3125000b" in changes[0]


def test_missing_leaf_and_class_are_added():
    have = _want()
    del have.leaves[nm.class_minor(7)]
    del have.classes[nm.class_minor(8)]
    del have.leaves[nm.class_minor(8)]
    lines = tt.render_tc_plan("eth1", _want(), have)
    assert lines == [
        "qdisc add dev eth1 parent 5374:7 handle 7: netem delay 3500us limit 68360",
        "class add dev eth1 parent 5374: classid 5374:8 htb " + tt.htb_params(10**10, 3).tc_args(),
        "qdisc add dev eth1 parent 5374:8 handle 8: netem delay 4000us limit 78125",
    ]


# Records as Datapath._tc_record makes them from pyroute2 (captured on 6.18
# and, for netem, on the lab's 6.1 kernel).
def _root_record(defcls=0):
    return {
        "handle": 0x53740000,
        "parent": 0xFFFFFFFF,
        "kind": "htb",
        "options": {
            "attrs": [
                ("TCA_HTB_INIT", {"version": 196625, "rate2quantum": 10, "defcls": defcls}),
                ("TCA_HTB_DIRECT_QLEN", 1000),
            ]
        },
    }


def _class_record(minor, rate=1_250_000_000, buffer=15625, prio=None):
    if prio is None:
        prio = nm.class_prio(nm.minor_class(minor) or 1)
    htb_parms = {"rate": rate, "ceil": rate, "buffer": buffer, "cbuffer": buffer, "quantum": 200000,
                 "prio": prio}  # fmt: skip
    attrs = [("TCA_HTB_PARMS", htb_parms)]
    if rate > 0xFFFFFFFF:
        htb_parms["rate"] = htb_parms["ceil"] = 0xFFFFFFFF
        attrs += [("TCA_HTB_RATE64", rate), ("TCA_HTB_CEIL64", rate)]
    return {
        "handle": 0x53740000 | minor,
        "parent": 0xFFFFFFFF,
        "kind": "htb",
        "options": {"attrs": attrs},
    }


def _netem_record(k, step_us=500, gbit=10):
    delay_ns = k * step_us * 1000
    minor = nm.class_minor(k)
    return {
        "handle": minor << 16,
        "parent": 0x53740000 | minor,
        "kind": "netem",
        "options": {
            "delay": delay_ns // 64,  # the kernel's legacy latency field, 64 ns ticks
            "limit": tt.netem_limit(gbit * 10**9, k * step_us),
            "loss": 0,
            "gap": 0,
            "duplicate": 0,
            "jitter": 0,
            "attrs": [],
        },
    }


def test_observe_tree_from_kernel_records_adopts():
    max_class = 12
    qd = [_root_record()] + [_netem_record(k) for k in range(1, max_class + 1)]
    cl = [_class_record(nm.class_minor(k)) for k in range(1, 13)]
    have = tt.observe_tree(qd, cl)
    assert have.ours and have.default_minor == 0
    assert tt.render_tc_plan("eth1", _want(max_class=max_class), have) == []
    # a tree from before the prios (all 0): HTB cannot move an active class
    # to another prio's round-robin row, so it is rebuilt
    old = tt.observe_tree(qd, [_class_record(nm.class_minor(k), prio=0) for k in range(1, 13)])
    assert tt.render_tc_plan("eth1", _want(max_class=max_class), old)[:2] == [
        "qdisc del dev eth1 root",
        "qdisc add dev eth1 root handle 5374: htb default 0",
    ]
    s = tt.tree_summary(have)
    assert s["step_us"] == 500 and s["max_class"] == 12 and s["leaf"] == "netem"
    assert s["link_bits_s"] == 10**10


def test_observe_tree_100gbit_uses_rate64():
    qd = [_root_record()]
    cl = [_class_record(0x1, rate=12_500_000_000, buffer=1562)]
    have = tt.observe_tree(qd, cl)
    hp = have.classes[0x1]
    assert hp.rate_bytes_s == 12_500_000_000
    # 1562 ticks of 64 ns at 12.5 GB/s = 1249600 B ~ 1250000 B: within the tick rounding
    assert hp.close_to(tt.htb_params(10**11)) is False  # 12.5 MB burst wanted, 1.25 MB there
    assert hp.close_to(tt.HtbParams(12_500_000_000, 12_500_000_000, 1_250_000, 1_250_000, 200_000))


def test_observe_foreign_and_default_roots():
    fq = {"handle": 0x10000, "parent": 0xFFFFFFFF, "kind": "tbf", "options": {}}
    t = tt.observe_tree([fq], [])
    assert not t.ours and not t.kernel_default and t.root_kind == "tbf"
    noq = {"handle": 0, "parent": 0xFFFFFFFF, "kind": "noqueue", "options": {}}
    t = tt.observe_tree([noq], [])
    assert not t.ours and t.kernel_default
    assert tt.observe_tree([], []).kernel_default


# -------------------------------------------------------------- iptables

MANGLE_FOREIGN = """\
-P PREROUTING ACCEPT
-P INPUT ACCEPT
-P FORWARD ACCEPT
-P OUTPUT ACCEPT
-P POSTROUTING ACCEPT
-N KUBE-HINT
-A POSTROUTING -o eth0 -j MARK --set-xmark 0x1/0xffffffff
"""


J1 = (
    "-A POSTROUTING -o eth1 -p tcp"
    " -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE"
)
J2 = J1.replace("eth1", "eth2")


def test_rules_render_as_iptables_prints_them():
    assert rl.jump_rule("eth1") == J1
    rules = rl.render_chain_rules((3260, 4420))
    # the chain holds the storage ports: an idle data path (no jump) still names them
    assert rules[0] == "-A SANTHROTTLE -p tcp -m multiport ! --sports 3260,4420 -j RETURN"
    assert rules[1] == "-A SANTHROTTLE -j SET --map-set santhrottle-all dst --map-prio"
    assert rules[2].startswith(
        "-A SANTHROTTLE -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK ACK "
        "-m set --match-set santhrottle-ack dst ! --update-counters "
        '-m bpf --bytecode "15,48 0 0 9,'
    )
    # ip6tables: the same chain on the IPv6 sets, the pure-ACK test on an IPv6 header
    rules6 = rl.render_chain_rules((3260, 4420), family=6)
    assert rules6[0] == rules[0]
    assert rules6[1] == "-A SANTHROTTLE -j SET --map-set santhrottle-all6 dst --map-prio"
    assert (
        "--match-set santhrottle-ack6 dst" in rules6[2] and '--bytecode "13,48 0 0 6,' in rules6[2]
    )
    assert rules6[4] == "-A SANTHROTTLE -j SET --map-set santhrottle-read6 dst --map-prio"
    assert rules[2].endswith("-j SET --map-set santhrottle-ack dst --map-prio")
    assert rules[3].startswith(
        "-A SANTHROTTLE -m set --match-set santhrottle-read dst ! --update-counters -m bpf"
    )
    assert rules[3].endswith("-j RETURN")
    assert rules[4] == "-A SANTHROTTLE -j SET --map-set santhrottle-read dst --map-prio"
    assert rl.parse_rule_ports(rules) == (3260, 4420)


def test_idle_rules_are_the_chain_alone():
    jumps, chain = rl.parse_mangle_rules(MANGLE_FOREIGN)
    assert jumps == [] and chain is None
    text = rl.render_rules_restore(["eth1"], (3260,), False, jumps, chain)
    lines = text.splitlines()
    assert lines[0] == "*mangle" and lines[-1] == "COMMIT"
    assert ":SANTHROTTLE - [0:0]" in lines and len(lines) == 3 + 5
    assert not any("POSTROUTING" in ln for ln in lines)  # idle: no jump at all
    assert not any("MARK" in ln or "KUBE" in ln for ln in lines)  # never touches others
    installed = MANGLE_FOREIGN + "-N SANTHROTTLE\n" + "\n".join(rl.render_chain_rules((3260,)))
    jumps, chain = rl.parse_mangle_rules(installed + "\n")
    assert jumps == [] and rl.render_rules_restore(["eth1"], (3260,), False, jumps, chain) is None


def test_the_first_member_brings_the_jumps_and_the_last_takes_them():
    chain = rl.render_chain_rules((3260,))
    assert rl.render_rules_restore(["eth1"], (3260,), True, [], chain).splitlines() == [
        "*mangle",
        "-I" + J1[2:],  # first in POSTROUTING: no earlier ACCEPT hides it
        "COMMIT",
    ]
    assert rl.render_jumps(["eth1", "eth2"], True, []).splitlines() == [
        "*mangle", "-I" + J1[2:], "-I" + J2[2:], "COMMIT"
    ]  # fmt: skip
    assert rl.render_jumps(["eth1"], True, [J1]) is None
    # the last member left: every jump to our chain goes, whatever its device
    assert rl.render_jumps([], False, [J1, J2]).splitlines() == [
        "*mangle", "-D" + J1[2:], "-D" + J2[2:], "COMMIT"
    ]  # fmt: skip
    assert rl.render_jumps(["eth1"], False, []) is None


def test_other_devices_jumps_stay_and_duplicates_collapse():
    chain = rl.render_chain_rules((3260,))
    assert rl.render_rules_restore(["eth1"], (3260,), True, [J1, J2], chain) is None
    lines = rl.render_rules_restore(["eth1"], (3260,), True, [J1, J1], chain).splitlines()
    assert lines == ["*mangle", "-D" + J1[2:], "COMMIT"]
    old = "-A POSTROUTING -o eth1 -p tcp -m multiport --sports 3260 -j SANTHROTTLE"
    assert rl.render_jumps(["eth1"], True, [old]).splitlines() == [
        "*mangle", "-D" + old[2:], "-I" + J1[2:], "COMMIT"
    ]  # fmt: skip


def test_another_port_list_or_an_edited_chain_rewrites_the_chain():
    chain = rl.render_chain_rules((3260,))
    text = rl.render_rules_restore(["eth1"], (3260, 4420), True, [J1], chain)
    lines = text.splitlines()
    assert lines[:2] == ["*mangle", ":SANTHROTTLE - [0:0]"] and "-D" + J1[2:] not in lines
    assert "-A SANTHROTTLE -p tcp -m multiport ! --sports 3260,4420 -j RETURN" in lines
    text = rl.render_rules_restore(["eth1"], (3260,), True, [J1], chain[:2])
    assert ":SANTHROTTLE - [0:0]" in text and text.count("-A SANTHROTTLE") == 5
    assert rl.parse_jump_device(J1) == "eth1"


def test_cleanup_rules():
    assert rl.render_rules_cleanup([], False) is None
    text = rl.render_rules_cleanup(["-A POSTROUTING -o eth1 -j SANTHROTTLE"], True)
    assert text.splitlines() == [
        "*mangle",
        "-D POSTROUTING -o eth1 -j SANTHROTTLE",
        ":SANTHROTTLE - [0:0]",
        "-X SANTHROTTLE",
        "COMMIT",
    ]


@pytest.mark.parametrize(
    ("text", "backend"),
    [
        ("iptables v1.8.9 (nf_tables)\n", "nf_tables"),
        ("iptables v1.8.7 (legacy)\n", "legacy"),
        ("iptables v1.6.1\n", "legacy"),
        ("weird", "unknown"),
    ],
)
def test_backend(text, backend):
    assert rl.parse_backend(text) == backend


# ------------------------------------------------------------------ ipset


def test_ipset_texts():
    text = mb.render_ipset_changes(
        [
            ("add", "santhrottle-all", "10.0.0.2", nm.class_minor(20)),
            ("del", "santhrottle-ack", "10.0.0.3", 0),
        ]
    )
    assert text == "add santhrottle-all 10.0.0.2 skbprio 5374:20\ndel santhrottle-ack 10.0.0.3\n"
    swap = mb.render_ipset_swap("santhrottle-read", {"10.0.0.2": 3}, 65536).splitlines()
    assert swap == [
        "create santhrottle-read-tmp hash:ip family inet hashsize 1024 maxelem 65536 counters "
        "skbinfo",
        "add santhrottle-read-tmp 10.0.0.2 skbprio 5374:3",
        "swap santhrottle-read-tmp santhrottle-read",
        "destroy santhrottle-read-tmp",
    ]
    swap6 = mb.render_ipset_swap("santhrottle-read6", {"fd00::2": 3}, 65536).splitlines()
    assert swap6[0].startswith("create santhrottle-read6-tmp hash:ip family inet6 hashsize")
    assert swap6[1:] == [
        "add santhrottle-read6-tmp fd00::2 skbprio 5374:3",
        "swap santhrottle-read6-tmp santhrottle-read6",
        "destroy santhrottle-read6-tmp",
    ]


def test_swap_set_is_sized_for_its_members():
    members = {f"10.0.{i >> 8}.{i & 255}": 1 for i in range(10_000)}
    first = mb.render_ipset_swap("santhrottle-all", members, 65536).splitlines()[0]
    assert " hashsize 4096 " in first


def test_plan_changes_diffs_against_membership():
    have = {"10.0.0.2": ("all", 4), "10.0.0.3": ("ack", 2)}  # as read back

    def plan(classes, mode="all"):
        return mb.plan_changes(have, classes, mode, 100, nm.MINOR_CLASS)

    assert plan({"10.0.0.2": 4}) == []  # already there: nothing sent
    assert plan({"10.0.0.2": 6}) == [("add", "santhrottle-all", "10.0.0.2", 6)]
    assert plan({"10.0.0.2": 0}) == [("del", "santhrottle-all", "10.0.0.2", 0)]
    assert plan({"10.0.0.9": 0}) == []
    assert plan({"10.0.0.3": 2}, mode="all") == [
        ("del", "santhrottle-ack", "10.0.0.3", 0),
        ("add", "santhrottle-all", "10.0.0.3", 2),
    ]
    assert plan({"10.0.0.2": 12}) == [("add", "santhrottle-all", "10.0.0.2", 0x12)]
    with pytest.raises(nm.DatapathError, match="bad class 101"):
        plan({"10.0.0.2": 101})
    with pytest.raises(nm.DatapathError, match="bad class True"):
        plan({"10.0.0.2": True})
    with pytest.raises(nm.DatapathError, match="bad initiator address"):
        plan({"10.0.0": 1})
    with pytest.raises(nm.DatapathError, match="bad mode"):
        plan({"10.0.0.2": 1}, mode="write")


def test_plan_changes_puts_ipv6_initiators_in_their_familys_sets():
    have = {"10.0.0.2": ("all", 4), "fd00::3": ("ack", 2)}

    def plan(classes, mode="all"):
        return mb.plan_changes(have, classes, mode, 100, nm.MINOR_CLASS)

    # one batch, both families: each op names its member's family's set
    assert plan({"10.0.0.2": 6, "FD00::3": 6, "fd00::9": 1}) == [
        ("add", "santhrottle-all", "10.0.0.2", 6),
        ("del", "santhrottle-ack6", "fd00::3", 0),
        ("add", "santhrottle-all6", "fd00::3", 6),
        ("add", "santhrottle-all6", "fd00::9", 1),
    ]
    assert plan({"fd00::3": 0}) == [("del", "santhrottle-ack6", "fd00::3", 0)]
    assert plan({"fd00::3": 2}, mode="ack") == []
    after = mb.members_after(have, plan({"fd00::3": 5, "fd00::9": 1}))
    assert after == {"10.0.0.2": ("all", 4), "fd00::3": ("all", 5), "fd00::9": ("all", 1)}
    assert mb.modes_in(after) == {"santhrottle-all", "santhrottle-all6"}
    text = mb.render_ipset_changes([("add", "santhrottle-all6", "fd00::9", 0x12)])
    assert text == "add santhrottle-all6 fd00::9 skbprio 5374:12\n"
    save = "add santhrottle-all6 fd00::9 packets 3 bytes 180 skbprio 5374:12\n"
    assert mb.parse_ipset_save(save) == {"fd00::9": ("all", 0x12, 3, 180)}


def test_members_after_and_the_bulk_choice():
    have = {f"10.0.0.{i}": ("all", 1) for i in range(1, 101)}
    ops = [("add", "santhrottle-all", f"10.0.0.{i}", 2) for i in range(1, 61)]
    ops.append(("del", "santhrottle-all", "10.0.0.100", 0))
    after = mb.members_after(have, ops)
    assert after["10.0.0.1"] == ("all", 2) and "10.0.0.100" not in after and len(after) == 99
    # 61 changes rewrite 99 members: swapping a rebuilt set in is cheaper than in place
    swap = mb.bulk_plan(after, ops)
    assert swap is not None and len(swap["santhrottle-all"]) == 99
    # 20 changes among 99: in place
    assert mb.bulk_plan(after, ops[:20]) is None
    assert mb.modes_in(after) == {"santhrottle-all"}
    # a mixed batch rebuilds each family's set with its own members
    have6 = {**have, **{f"fd00::{i:x}": ("all", 1) for i in range(1, 41)}}
    ops6 = ops + [("add", "santhrottle-all6", f"fd00::{i:x}", 2) for i in range(1, 41)]
    swap6 = mb.bulk_plan(mb.members_after(have6, ops6), ops6)
    assert swap6 is not None and sorted(swap6) == ["santhrottle-all", "santhrottle-all6"]
    assert len(swap6["santhrottle-all"]) == 99 and len(swap6["santhrottle-all6"]) == 40
    assert all(":" in ip for ip in swap6["santhrottle-all6"])


# ------------------------------------------------------- ordered descent


def test_glide_leaves_are_built_with_a_rate_and_their_delay_is_run_time_state():
    want = tt.desired_tree(LIN.delays_us, 10**10, "netem", glides=2)
    lines = tt.render_tc_plan("eth1", want, None)
    assert len(lines) == 1 + 2 * 102
    # after the delay classes; the largest limit; a rate keeps the queue in order
    assert lines[-1] == (
        "qdisc add dev eth1 parent 5374:6001 handle 6001: netem delay 0us "
        "rate 34359738360bit limit 976563"
    )
    assert all(nm.minor_class(m) is None for m in (0x6000, 0x6001))
    # a leaf gliding at 3 ms is what apply wants: nothing to change
    have = tt.desired_tree(LIN.delays_us, 10**10, "netem", glides=2)
    have.leaves[0x6000] = tt.Leaf("netem", 0x6000, 976563, 3000, 2**32 - 1)
    assert tt.render_tc_plan("eth1", want, have) == []
    # ... but a leaf without the rate is not (nor one of santhrottle 0.6, at link rate)
    for rate in (0, 1_250_000_000):
        have.leaves[0x6000] = tt.Leaf("netem", 0x6000, 976563, 3000, rate)
        assert tt.render_tc_plan("eth1", want, have) == [
            "qdisc replace dev eth1 parent 5374:6000 handle 6000: netem delay 0us "
            "rate 34359738360bit limit 976563"
        ]
    # served after every shared class; among those a lower delay first
    assert [want.classes[m].prio for m in (0x6000, 0x6001)] == [nm.GLIDE_PRIO] * 2
    prios = [want.classes[nm.class_minor(k)].prio for k in range(1, 101)]
    assert prios == sorted(prios) and prios[0] == 0 and prios[-1] == nm.GLIDE_PRIO - 1
    assert [nm.class_prio(k) for k in (1, 2, 3, 4, 8, 16, 32, 64, 5000)] == [0, 1, 1, 2, 3, 4, 5,
                                                                           6, 6]  # fmt: skip


# ------------------------------------------------------- kernel features


def test_module_available(tmp_path):
    sysmod = tmp_path / "sys"
    mods = tmp_path / "lib"
    sysmod.mkdir()
    assert module_available("sch_netem", str(sysmod), str(mods), "6.1.0") is None
    tree = mods / "6.1.0"
    tree.mkdir(parents=True)
    (tree / "modules.builtin").write_text("kernel/net/sched/sch_htb.ko\n")
    (tree / "modules.dep").write_text(
        "kernel/net/sched/sch_tbf.ko.xz:\nkernel/net/netfilter/xt_set.ko.xz: ip_set.ko.xz\n"
    )
    assert module_available("sch_netem", str(sysmod), str(mods), "6.1.0") is False
    assert module_available("sch_htb", str(sysmod), str(mods), "6.1.0") is True
    assert module_available("xt_set", str(sysmod), str(mods), "6.1.0") is True
    (tree / "modules.dep").write_text("kernel/net/sched/sch_netem.ko.xz:\n")
    assert module_available("sch_netem", str(sysmod), str(mods), "6.1.0") is True
    (sysmod / "sch_foo").mkdir()
    assert module_available("sch_foo", str(sysmod), str(mods), "6.1.0") is True


def test_netem_missing_message_names_the_module():
    assert "sch_netem" in NETEM_MISSING_MSG and "\n" not in NETEM_MISSING_MSG


def test_members_read_back_from_ipset_save():
    text = (
        "create santhrottle-all hash:ip family inet hashsize 1024 maxelem 65536 counters "
        "skbinfo bucketsize 12 initval 0x2594bc4c\n"
        "add santhrottle-all 10.0.0.3 packets 12 bytes 3000 skbprio 5374:20\n"
        "add santhrottle-all 10.0.0.4 packets 0 bytes 0 skbprio 5374:6000\n"
        "add santhrottle-read 10.0.0.5 packets 1 bytes 2 skbprio 1:3\n"
        "add admin-set 10.9.9.9\n"
    )
    assert mb.parse_ipset_save(text) == {
        "10.0.0.3": ("all", 0x20, 12, 3000),
        "10.0.0.4": ("all", 0x6000, 0, 0),
        "10.0.0.5": ("read", 0, 1, 2),  # not one of our classes: HTB's direct queue
    }
