"""The data path's pure parts: units, naming, sizing, the rendered tc / iptables /
ipset texts, reconciliation plans, and the CLI's one-line errors (no root)."""

from __future__ import annotations

import pytest

from santhrottle.appliance import datapath as dp
from santhrottle.appliance.cli import main

# ------------------------------------------------------------------ units


@pytest.mark.parametrize(
    ("text", "us"),
    [
        ("0", 0),
        ("500us", 500),
        ("5ms", 5000),
        ("1.5ms", 1500),
        ("0.5ms", 500),
        ("2s", 2_000_000),
        ("0.0005s", 500),
        ("50ms", 50_000),
    ],
)
def test_parse_delay(text, us):
    assert dp.parse_delay_us(text) == us


@pytest.mark.parametrize("text", ["5", "5 ms", "-5ms", "5MS", "ms", "1.2345ms", "5m", "", "1e3us"])
def test_parse_delay_rejects(text):
    with pytest.raises(dp.DatapathError, match="bad delay"):
        dp.parse_delay_us(text)


@pytest.mark.parametrize(
    ("us", "text"), [(0, "0"), (500, "500us"), (5000, "5ms"), (1500, "1.5ms"), (2_000_000, "2s")]
)
def test_fmt_us(us, text):
    assert dp.fmt_us(us) == text
    assert dp.parse_delay_us(text) == us


def test_delay_to_class_exact_multiples_only():
    assert dp.delay_to_class(5000, 500, 100) == 10
    assert dp.delay_to_class(0, 500, 100) == 0
    with pytest.raises(
        dp.DatapathError, match=r"not a multiple of the step 500us: use 1ms or 1.5ms"
    ):
        dp.delay_to_class(1200, 500, 100)
    with pytest.raises(dp.DatapathError, match=r"above the maximum 50ms \(class 100 of 500us\)"):
        dp.delay_to_class(60_000, 500, 100)


def test_parse_rate_and_ports():
    assert dp.parse_rate_bits("10gbit") == 10**10
    assert dp.parse_rate_bits("25Gbit") == 25 * 10**9
    assert dp.parse_rate_bits("100gbit") == 10**11
    for bad in ("10g", "10 gbit", "fast", "100kbit"):
        with pytest.raises(dp.DatapathError):
            dp.parse_rate_bits(bad)
    assert dp.parse_ports("3260,4420") == (3260, 4420)
    for bad in ("3260,3260", "0", "70000", "a", ",".join(str(1000 + i) for i in range(16))):
        with pytest.raises(dp.DatapathError):
            dp.parse_ports(bad)


def test_check_ip():
    assert dp.check_ip("10.0.0.3") == "10.0.0.3"
    for bad in ("10.0.0.x", "010.0.0.3", "::1", "10.0.0.0/24"):
        with pytest.raises(dp.DatapathError, match="bad initiator address"):
            dp.check_ip(bad)


# ----------------------------------------------------------------- naming


def test_class_minor_reads_as_the_class_number():
    assert dp.class_minor(20) == 0x20
    assert dp.classid(20) == "5374:20"
    assert dp.classid(100) == "5374:100"
    assert dp.classid(0) == "5374:0"  # HTB's direct queue
    seen = set()
    for k in range(1, dp.MAX_CLASS_LIMIT + 1):
        m = dp.class_minor(k)
        assert dp.minor_class(m) == k
        assert m != dp.DIRECT_MINOR and m < dp.ROOT_MAJOR  # leaf handle k: below the root
        seen.add(m)
    assert len(seen) == dp.MAX_CLASS_LIMIT
    assert dp.minor_class(0xA) is None and dp.minor_class(0xFFFF) is None
    with pytest.raises(ValueError):
        dp.class_minor(0)


def test_set_names_fit_ipset_and_are_ours():
    for name in dp.OWNED_SETS:
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
    hp = dp.htb_params(gbit * 10**9)
    assert hp.rate_bytes_s == hp.ceil_bytes_s == rate
    assert hp.burst_bytes == hp.cburst_bytes == burst
    assert hp.quantum_bytes == 200_000
    assert hp.tc_args() == (
        f"rate {gbit * 10**9}bit ceil {gbit * 10**9}bit burst {burst}b cburst {burst}b "
        "quantum 200000 prio 0"
    )


def test_htb_burst_never_below_two_gso_packets():
    assert dp.htb_params(100 * 10**6).burst_bytes == 2 * 65536


def test_netem_limit_holds_link_rate_times_delay_of_min_frames():
    # 10 Gbit/s x 10 ms = 12.5 MB = 195313 frames of 64 B
    assert dp.netem_limit(10**10, 10_000) == 195_313
    assert dp.netem_limit(10**10, 50_000) == 976_563
    assert dp.netem_limit(10**8, 500) == 1000  # the floor
    for k in range(1, 101):
        lim = dp.netem_limit(10**10, k * 500)
        assert lim * 64 >= 1.25e9 * k * 500e-6


# ---------------------------------------------------------------- tc plan


def _want(step_us=500, max_class=100, gbit=10, leaf="netem"):
    return dp.desired_tree(step_us, max_class, gbit * 10**9, leaf)


def test_fresh_build_is_one_batch():
    lines = dp.render_tc_plan("eth1", _want(), None)
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
    assert dp.render_tc_plan("eth1", _want(), dp.TcTree("noqueue", 0)) == lines


def test_plan_is_empty_when_the_tree_matches():
    want = _want()
    assert dp.render_tc_plan("eth1", want, _want()) == []


def test_step_change_replaces_leaves_in_place_and_extra_classes_go_last():
    have = _want(step_us=500, max_class=100)
    want = _want(step_us=1000, max_class=50)
    lines = dp.render_tc_plan("eth1", want, have)
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
    have.classes[0xFFFF] = dp.htb_params(10**10)
    lines = dp.render_tc_plan("eth1", _want(), have)
    assert lines[:2] == [
        "qdisc del dev eth1 root",
        "qdisc add dev eth1 root handle 5374: htb default 0",
    ]
    assert len(lines) == 2 + 100 + 100


def test_link_speed_change_changes_classes():
    lines = dp.render_tc_plan("eth1", _want(gbit=25), _want(gbit=10))
    changes = [ln for ln in lines if ln.startswith("class change")]
    assert len(changes) == 100
    assert "rate 25000000000bit ceil 25000000000bit burst 3125000b" in changes[0]


def test_missing_leaf_and_class_are_added():
    have = _want()
    del have.leaves[dp.class_minor(7)]
    del have.classes[dp.class_minor(8)]
    del have.leaves[dp.class_minor(8)]
    lines = dp.render_tc_plan("eth1", _want(), have)
    assert lines == [
        "qdisc add dev eth1 parent 5374:7 handle 7: netem delay 3500us limit 68360",
        "class add dev eth1 parent 5374: classid 5374:8 htb " + dp.htb_params(10**10, 3).tc_args(),
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
        prio = dp.class_prio(dp.minor_class(minor) or 1)
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
    minor = dp.class_minor(k)
    return {
        "handle": minor << 16,
        "parent": 0x53740000 | minor,
        "kind": "netem",
        "options": {
            "delay": delay_ns // 64,  # the kernel's legacy latency field, 64 ns ticks
            "limit": dp.netem_limit(gbit * 10**9, k * step_us),
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
    cl = [_class_record(dp.class_minor(k)) for k in range(1, 13)]
    have = dp.observe_tree(qd, cl)
    assert have.ours and have.default_minor == 0
    assert dp.render_tc_plan("eth1", _want(max_class=max_class), have) == []
    # a tree from before the prios (all 0): HTB cannot move an active class
    # to another prio's round-robin row, so it is rebuilt
    old = dp.observe_tree(qd, [_class_record(dp.class_minor(k), prio=0) for k in range(1, 13)])
    assert dp.render_tc_plan("eth1", _want(max_class=max_class), old)[:2] == [
        "qdisc del dev eth1 root",
        "qdisc add dev eth1 root handle 5374: htb default 0",
    ]
    s = dp.tree_summary(have)
    assert s["step_us"] == 500 and s["max_class"] == 12 and s["leaf"] == "netem"
    assert s["link_bits_s"] == 10**10


def test_observe_tree_100gbit_uses_rate64():
    qd = [_root_record()]
    cl = [_class_record(0x1, rate=12_500_000_000, buffer=1562)]
    have = dp.observe_tree(qd, cl)
    hp = have.classes[0x1]
    assert hp.rate_bytes_s == 12_500_000_000
    # 1562 ticks of 64 ns at 12.5 GB/s = 1249600 B ~ 1250000 B: within the tick rounding
    assert hp.close_to(dp.htb_params(10**11)) is False  # 12.5 MB burst wanted, 1.25 MB there
    assert hp.close_to(dp.HtbParams(12_500_000_000, 12_500_000_000, 1_250_000, 1_250_000, 200_000))


def test_observe_foreign_and_default_roots():
    fq = {"handle": 0x10000, "parent": 0xFFFFFFFF, "kind": "tbf", "options": {}}
    t = dp.observe_tree([fq], [])
    assert not t.ours and not t.kernel_default and t.root_kind == "tbf"
    noq = {"handle": 0, "parent": 0xFFFFFFFF, "kind": "noqueue", "options": {}}
    t = dp.observe_tree([noq], [])
    assert not t.ours and t.kernel_default
    assert dp.observe_tree([], []).kernel_default


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
    "-A POSTROUTING -o eth1 -p tcp -m multiport --sports 3260"
    " -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE"
)


def test_rules_render_as_iptables_prints_them():
    assert dp.jump_rule("eth1", (3260, 4420)) == (
        "-A POSTROUTING -o eth1 -p tcp -m multiport --sports 3260,4420"
        " -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE"
    )
    rules = dp.render_chain_rules()
    assert rules[0] == "-A SANTHROTTLE -j SET --map-set santhrottle-all dst --map-prio"
    assert rules[1].startswith(
        "-A SANTHROTTLE -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK ACK "
        "-m set --match-set santhrottle-ack dst ! --update-counters "
        '-m bpf --bytecode "15,48 0 0 9,'
    )
    assert rules[1].endswith("-j SET --map-set santhrottle-ack dst --map-prio")
    assert rules[2].startswith(
        "-A SANTHROTTLE -m set --match-set santhrottle-read dst ! --update-counters -m bpf"
    )
    assert rules[2].endswith("-j RETURN")
    assert rules[3] == "-A SANTHROTTLE -j SET --map-set santhrottle-read dst --map-prio"


def test_rules_restore_fresh_and_adopted():
    jumps, chain = dp.parse_mangle_rules(MANGLE_FOREIGN)
    assert jumps == [] and chain is None
    text = dp.render_rules_restore("eth1", (3260,), jumps, chain)
    assert text is not None
    lines = text.splitlines()
    assert lines[0] == "*mangle" and lines[-1] == "COMMIT"
    assert ":SANTHROTTLE - [0:0]" in lines
    assert "-I" + J1[2:] in lines
    assert not any("MARK" in ln or "KUBE" in ln for ln in lines)  # never touches others
    installed = MANGLE_FOREIGN + f"-N SANTHROTTLE\n{J1}\n" + "\n".join(dp.render_chain_rules())
    jumps, chain = dp.parse_mangle_rules(installed + "\n")
    assert jumps == [J1]
    assert dp.render_rules_restore("eth1", (3260,), jumps, chain) is None
    # another port list: the jump is replaced in one transaction, the chain kept
    text = dp.render_rules_restore("eth1", (3260, 4420), jumps, chain)
    assert text.splitlines() == [
        "*mangle",
        "-D" + J1[2:],
        "-I POSTROUTING -o eth1 -p tcp -m multiport --sports 3260,4420"
        " -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE",
        "COMMIT",
    ]
    # a chain someone edited is rewritten whole
    text = dp.render_rules_restore("eth1", (3260,), jumps, chain[:2])
    assert ":SANTHROTTLE - [0:0]" in text and text.count("-A SANTHROTTLE") == 4
    assert dp.parse_rule_ports(jumps) == (3260,)
    assert dp.parse_jump_device(jumps[0]) == "eth1"


def test_other_devices_jumps_are_left_alone():
    """Several egress devices share the chain and the sets: applying on eth2
    adds its jump and touches neither eth1's nor the chain."""
    text = dp.render_rules_restore("eth2", (3260,), [J1], dp.render_chain_rules())
    assert text.splitlines() == [
        "*mangle",
        "-I POSTROUTING -o eth2 -p tcp -m multiport --sports 3260"
        " -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE",
        "COMMIT",
    ]
    j2 = (
        "-A POSTROUTING -o eth2 -p tcp -m multiport --sports 3260"
        " -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE"
    )
    assert dp.render_rules_restore("eth1", (3260,), [J1, j2], dp.render_chain_rules()) is None


def test_duplicate_jumps_are_collapsed():
    text = dp.render_rules_restore("eth1", (3260,), [J1, J1], dp.render_chain_rules())
    lines = text.splitlines()
    assert lines.count("-D" + J1[2:]) == 2
    assert lines.count("-I" + J1[2:]) == 1


def test_cleanup_rules():
    assert dp.render_rules_cleanup([], False) is None
    text = dp.render_rules_cleanup(["-A POSTROUTING -o eth1 -j SANTHROTTLE"], True)
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
    assert dp.parse_backend(text) == backend


# ------------------------------------------------------------------ ipset


def test_ipset_texts():
    text = dp.render_ipset_changes(
        [
            ("add", "santhrottle-all", "10.0.0.2", dp.class_minor(20)),
            ("del", "santhrottle-ack", "10.0.0.3", 0),
        ]
    )
    assert text == "add santhrottle-all 10.0.0.2 skbprio 5374:20\ndel santhrottle-ack 10.0.0.3\n"
    swap = dp.render_ipset_swap("read", {"10.0.0.2": 3}, 65536).splitlines()
    assert swap == [
        "create santhrottle-read-tmp hash:ip family inet hashsize 1024 maxelem 65536 counters "
        "skbinfo",
        "add santhrottle-read-tmp 10.0.0.2 skbprio 5374:3",
        "swap santhrottle-read-tmp santhrottle-read",
        "destroy santhrottle-read-tmp",
    ]


def test_swap_set_is_sized_for_its_members():
    members = {f"10.0.{i >> 8}.{i & 255}": 1 for i in range(10_000)}
    first = dp.render_ipset_swap("all", members, 65536).splitlines()[0]
    assert " hashsize 4096 " in first


def _dp(**kw):
    d = dp.Datapath("eth1", **kw)
    d._members = {"10.0.0.2": ("all", 4), "10.0.0.3": ("ack", 2)}  # as read back
    return d


def test_plan_changes_diffs_against_membership():
    d = _dp()
    assert d.plan_changes({"10.0.0.2": 4}) == []  # already there: nothing sent
    assert d.plan_changes({"10.0.0.2": 6}) == [("add", "santhrottle-all", "10.0.0.2", 6)]
    assert d.plan_changes({"10.0.0.2": 0}) == [("del", "santhrottle-all", "10.0.0.2", 0)]
    assert d.plan_changes({"10.0.0.9": 0}) == []
    assert d.plan_changes({"10.0.0.3": 2}, mode="all") == [
        ("del", "santhrottle-ack", "10.0.0.3", 0),
        ("add", "santhrottle-all", "10.0.0.3", 2),
    ]
    with pytest.raises(dp.DatapathError, match="bad class 101"):
        d.plan_changes({"10.0.0.2": 101})
    with pytest.raises(dp.DatapathError, match="bad initiator address"):
        d.plan_changes({"10.0.0": 1})
    with pytest.raises(dp.DatapathError, match="bad mode"):
        d.plan_changes({"10.0.0.2": 1}, mode="write")


# ------------------------------------------------------- ordered descent


def test_glide_leaves_are_built_with_a_rate_and_their_delay_is_run_time_state():
    want = dp.desired_tree(500, 100, 10**10, "netem", glides=2)
    lines = dp.render_tc_plan("eth1", want, None)
    assert len(lines) == 1 + 2 * 102
    # after the delay classes; the largest limit; a rate keeps the queue in order
    assert lines[-1] == (
        "qdisc add dev eth1 parent 5374:6001 handle 6001: netem delay 0us "
        "rate 34359738360bit limit 976563"
    )
    assert all(dp.minor_class(m) is None for m in (0x6000, 0x6001))
    # a leaf gliding at 3 ms is what apply wants: nothing to change
    have = dp.desired_tree(500, 100, 10**10, "netem", glides=2)
    have.leaves[0x6000] = dp.Leaf("netem", 0x6000, 976563, 3000, 2**32 - 1)
    assert dp.render_tc_plan("eth1", want, have) == []
    # ... but a leaf without the rate is not (nor one of santhrottle 0.6, at link rate)
    for rate in (0, 1_250_000_000):
        have.leaves[0x6000] = dp.Leaf("netem", 0x6000, 976563, 3000, rate)
        assert dp.render_tc_plan("eth1", want, have) == [
            "qdisc replace dev eth1 parent 5374:6000 handle 6000: netem delay 0us "
            "rate 34359738360bit limit 976563"
        ]
    # served after every shared class; among those a lower delay first
    assert [want.classes[m].prio for m in (0x6000, 0x6001)] == [dp.GLIDE_PRIO] * 2
    prios = [want.classes[dp.class_minor(k)].prio for k in range(1, 101)]
    assert prios == sorted(prios) and prios[0] == 0 and prios[-1] == dp.GLIDE_PRIO - 1
    assert [dp.class_prio(k) for k in (1, 2, 3, 4, 8, 16, 32, 64, 5000)] == [0, 1, 1, 2, 3, 4, 5,
                                                                           6, 6]  # fmt: skip


def _gliding(**kw):
    d = dp.Datapath("eth1", leaf="pfifo", glide_leaves=2, **kw)
    d.clock = lambda: 100.0
    d._members = {
        "10.0.0.2": ("all", dp.class_minor(4)),
        "10.0.0.3": ("all", dp.class_minor(4)),
        "10.0.0.4": ("all", dp.class_minor(12)),
        "10.0.0.5": ("read", dp.class_minor(2)),
    }
    d._gated = {"santhrottle-all", "santhrottle-read"}  # the gate lists the sets with members
    return d


def _glide_plan(d, classes, mode="all"):
    return d._plan_glides(d.plan_changes(classes, mode), mode, d._members)


def test_a_descent_goes_through_one_glide_leaf_per_step():
    d = _gliding()
    ops, pre, post = _glide_plan(d, {"10.0.0.2": 3, "10.0.0.3": 3, "10.0.0.4": 0})
    a, b = dp.glide_minor(0), dp.glide_minor(1)
    # each group moves at its old delay into a leaf set to it first ...
    assert pre == [(a, 4), (b, 12)]
    assert sorted(ops) == [
        ("add", "santhrottle-all", "10.0.0.2", a),
        ("add", "santhrottle-all", "10.0.0.3", a),
        ("add", "santhrottle-all", "10.0.0.4", b),
    ]
    # ... whose delay then goes down in place (to 0 for a release)
    assert post == [(a, 3), (b, 0)]


def test_a_leaf_its_group_fills_glides_in_place_and_others_take_their_own():
    d = _gliding()
    g = d._glides[dp.glide_minor(0)] = dp.Glide(dp.glide_minor(0), 3, {"10.0.0.2", "10.0.0.3"})
    for ip in g.members:
        d._members[ip] = ("all", g.minor)
    # the whole leaf goes 3 -> 2: no ipset op at all
    assert _glide_plan(d, {"10.0.0.2": 2, "10.0.0.3": 2}) == ([], [], [(g.minor, 2)])
    # only one of them goes down: it takes the other leaf, its neighbour stays
    ops, pre, post = _glide_plan(d, {"10.0.0.2": 1})
    other = dp.glide_minor(1)
    assert (ops, pre, post) == ([("add", "santhrottle-all", "10.0.0.2", other)], [(other, 3)],
                                [(other, 1)])  # fmt: skip
    # one of them going up leaves the leaf for the shared class (a higher delay,
    # served after the leaf when both have packets ready)
    assert _glide_plan(d, {"10.0.0.3": 5}) == (
        [("add", "santhrottle-all", "10.0.0.3", dp.class_minor(5))],
        [],
        [],
    )


def test_increases_mode_changes_and_busy_leaves_do_not_glide():
    d = _gliding()
    ops, pre, post = _glide_plan(d, {"10.0.0.2": 9, "10.0.0.5": 1}, mode="all")
    assert pre == post == []  # up; and a mode change (read -> all) is a new set
    assert ("add", "santhrottle-all", "10.0.0.2", dp.class_minor(9)) in ops
    # every leaf busy (still draining a higher delay): moved unordered, counted
    for i in range(2):
        d._glides[dp.glide_minor(i)] = dp.Glide(dp.glide_minor(i), 0, set(), 100.001)
    ops, pre, post = _glide_plan(d, {"10.0.0.4": 11})
    assert (ops, pre, post) == ([("add", "santhrottle-all", "10.0.0.4", dp.class_minor(11))],
                                [], [])  # fmt: skip
    assert d.unordered_moves == 1


def test_a_rise_within_one_htb_prio_takes_a_leaf_at_the_new_delay():
    d = _gliding()
    a = dp.glide_minor(0)
    assert dp.class_prio(12) == dp.class_prio(14) < dp.class_prio(16)
    # HTB would round-robin classes 12 and 14 when both have a packet due: a leaf
    # (served after every shared class) at the new delay keeps the order
    assert _glide_plan(d, {"10.0.0.4": 14}) == ([("add", "santhrottle-all", "10.0.0.4", a)],
                                                [(a, 14)], [(a, 14)])  # fmt: skip
    # to a higher prio, and up from unthrottled: the shared class is served in order
    assert _glide_plan(d, {"10.0.0.4": 16, "10.0.0.6": 14}) == (
        [("add", "santhrottle-all", "10.0.0.4", dp.class_minor(16)),
         ("add", "santhrottle-all", "10.0.0.6", dp.class_minor(14))],
        [],
        [],
    )  # fmt: skip
    assert d.glided == 0  # counts descents only


def test_settle_hands_a_leaf_on_only_after_a_look_that_saw_no_traffic(monkeypatch):
    d = _gliding()
    sent = []
    monkeypatch.setattr(d, "_apply_netlink", sent.extend)
    looks = iter([(0, 10), (0, 12), (0, 12)])
    monkeypatch.setattr(d, "_glide_backlog", lambda minors: {m: next(looks) for m in minors})
    now = [100.0]
    d.clock = lambda: now[0]
    d.set_classes({"10.0.0.4": 14})  # a rise into leaf 6000
    g = d._glides[dp.glide_minor(0)]
    assert g.members == {"10.0.0.4"} and g.klass == 14
    now[0] = 101.0
    # nothing queued, but packets go through between two looks: a packet could
    # enter the leaf while it is handed on, and the shared class would overtake it
    assert d.settle() == 0 and g.sent_seen == 10
    assert d.settle() == 0 and g.sent_seen == 12
    assert d.settle() == 1 and g.members == set()
    assert sent[-1] == ("add", "santhrottle-all", "10.0.0.4", dp.class_minor(14))


def test_settle_waits_for_the_old_delay_to_drain(monkeypatch):
    d = _gliding()
    sent = []
    monkeypatch.setattr(d, "_apply_netlink", sent.extend)
    queued = {dp.glide_minor(0): 0}
    monkeypatch.setattr(d, "_glide_backlog", lambda minors: {m: (queued[m], 7) for m in minors})
    now = [100.0]
    d.clock = lambda: now[0]
    d.set_classes({"10.0.0.4": 10})  # 6 ms -> 5 ms through leaf 6000
    g = d._glides[dp.glide_minor(0)]
    # moved in at 6 ms; what it sent before still waits in class 12 until 100.006,
    # and nothing in the leaf holds new packets behind those yet: not lowered
    assert g.members == {"10.0.0.4"} and g.klass == 12 and d._klass(g.minor) == 12
    assert (g.lower_to, g.lower_at_s) == (10, pytest.approx(100.006))
    assert d.set_classes({"10.0.0.4": 10}) == 0  # asked again: still waiting, no op
    assert d.settle() == 0 and g.klass == 12
    now[0] = 100.0061
    assert d.settle() == 0  # lowered in place now; its 6 ms packets leave by 100.0121
    assert g.klass == 10 and g.lower_to is None
    assert g.busy_until_s == pytest.approx(100.0121)
    assert d.set_classes({"10.0.0.4": 9}) == 0  # the group fills it: glides in place at once
    assert g.klass == 9 and g.busy_until_s == pytest.approx(100.0121)
    now[0] = 100.0122
    queued[g.minor] = 3
    assert d.settle() == 0  # its packets still queued in the leaf: they would be overtaken
    assert g.members == {"10.0.0.4"}
    queued[g.minor] = 0
    assert d.settle() == 1  # now the shared class of the same delay takes it over
    assert sent[-1] == ("add", "santhrottle-all", "10.0.0.4", dp.class_minor(9))
    assert g.members == set() and g.busy_until_s == pytest.approx(100.0167)
    assert d.settle() == 0


def test_a_leaf_whose_members_go_up_goes_up_in_place_and_is_not_lowered_later(monkeypatch):
    d = _gliding()
    sent = []
    monkeypatch.setattr(d, "_apply_netlink", sent.extend)
    # its traffic never stops: the leaf always holds some, settle() never hands it over
    monkeypatch.setattr(d, "_glide_backlog", lambda minors: {m: (5, 0) for m in minors})
    now = [100.0]
    d.clock = lambda: now[0]
    d.set_classes({"10.0.0.4": 10})  # into leaf 6000 at 12, lowering due at 100.006
    g = d._glides[dp.glide_minor(0)]
    assert len(sent) == 1
    # up before the lowering was due: in place (a FIFO keeps its order), no ipset op
    assert d.set_classes({"10.0.0.4": 20}) == 0 and len(sent) == 1
    assert g.members == {"10.0.0.4"} and g.klass == 20 and g.lower_to is None
    now[0] = 100.01
    assert d.settle() == 0
    assert g.klass == 20 and g.lower_to is None  # the old lowering is not done later
    # only one of two members going up takes the shared class: the leaf stays
    d._members["10.0.0.2"] = ("all", g.minor)
    g.members.add("10.0.0.2")
    assert d.set_classes({"10.0.0.2": 24}) == 1
    assert sent[-1] == ("add", "santhrottle-all", "10.0.0.2", dp.class_minor(24))
    assert g.members == {"10.0.0.4"} and g.klass == 20


def test_constructor_validates():
    with pytest.raises(dp.DatapathError, match="bad step"):
        dp.Datapath("eth1", step_s=0.00050001)
    with pytest.raises(dp.DatapathError, match="bad maximum class"):
        dp.Datapath("eth1", max_class=dp.MAX_CLASS_LIMIT + 1)
    with pytest.raises(dp.DatapathError, match="bad write mode"):
        dp.Datapath("eth1", write_mode="read")
    with pytest.raises(dp.DatapathError, match="at most 15"):
        dp.Datapath("eth1", ports=range(1000, 1016))
    d = dp.Datapath("eth1")
    assert d.step_us == 500 and d.max_class == 100 and d.write_mode == "all"
    assert d.ports == (3260, 4420)


def test_netns_path_missing_is_one_line(tmp_path):
    d = dp.Datapath("eth1", netns="nope", netns_dir=str(tmp_path))
    with pytest.raises(dp.DatapathError, match=r"no network namespace nope"):
        d._cmd(["tc"])
    d = dp.Datapath("eth1", netns="there", netns_dir=str(tmp_path))
    (tmp_path / "there").touch()
    assert d._cmd(["tc", "-batch", "-"]) == [
        "nsenter",
        f"--net={tmp_path}/there",
        "tc",
        "-batch",
        "-",
    ]


# ------------------------------------------------------- kernel features


def test_module_available(tmp_path):
    sysmod = tmp_path / "sys"
    mods = tmp_path / "lib"
    sysmod.mkdir()
    assert dp.module_available("sch_netem", str(sysmod), str(mods), "6.1.0") is None
    tree = mods / "6.1.0"
    tree.mkdir(parents=True)
    (tree / "modules.builtin").write_text("kernel/net/sched/sch_htb.ko\n")
    (tree / "modules.dep").write_text(
        "kernel/net/sched/sch_tbf.ko.xz:\nkernel/net/netfilter/xt_set.ko.xz: ip_set.ko.xz\n"
    )
    assert dp.module_available("sch_netem", str(sysmod), str(mods), "6.1.0") is False
    assert dp.module_available("sch_htb", str(sysmod), str(mods), "6.1.0") is True
    assert dp.module_available("xt_set", str(sysmod), str(mods), "6.1.0") is True
    (tree / "modules.dep").write_text("kernel/net/sched/sch_netem.ko.xz:\n")
    assert dp.module_available("sch_netem", str(sysmod), str(mods), "6.1.0") is True
    (sysmod / "sch_foo").mkdir()
    assert dp.module_available("sch_foo", str(sysmod), str(mods), "6.1.0") is True


def test_netem_missing_message_names_the_module():
    assert "sch_netem" in dp.NETEM_MISSING_MSG and "\n" not in dp.NETEM_MISSING_MSG


# -------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pin", "10.0.0.x", "--delay", "5ms"], "bad initiator address '10.0.0.x'"),
        (["pin", "10.0.0.3", "--delay", "5"], "bad delay '5'"),
        (["pin", "10.0.0.3", "--delay", "0"], "delay 0 throttles nothing"),
        (["unpin", "10.0.0"], "bad initiator address"),
        (
            ["datapath", "apply", "--device", "eth1", "--max-delay", "1.2ms"],
            "maximum delay 1.2ms is not a positive multiple of the step 500us",
        ),
        (["datapath", "apply", "--device", "eth1", "--step", "0"], "bad step '0'"),
        (["datapath", "apply", "--device", "eth1", "--ports", "3260,x"], "bad port 'x'"),
        (["datapath", "apply", "--device", "eth1", "--link-speed", "fast"], "bad link speed"),
        (
            ["datapath", "apply", "--device", "eth1", "--step", "1us", "--max-delay", "1s"],
            "needs 1000000 classes of 1us: at most 5000",
        ),
    ],
)
def test_cli_errors_are_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("santhrottle: ")
    assert message in err


def test_cli_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["pin", "--help"])
    out = capsys.readouterr().out
    assert "santhrottle pin 10.0.0.3 --delay 5ms" in out
    with pytest.raises(SystemExit):
        main(["datapath", "--help"])
    assert "santhrottle datapath apply --device eth1" in capsys.readouterr().out
