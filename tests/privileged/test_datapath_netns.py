"""The data path on the host kernel, with real TCP traffic between namespaces.

The development kernel has no sch_netem: these tests build the very same
tree with pfifo leaves (DatapathSpec(leaf="pfifo")) and prove the
classification -- which packets land in which HTB class -- from the kernel's
own counters: HTB class counters (tc stats via pyroute2) and ipset member
counters.  The delays themselves are measured in the lab tier (real netem,
tests/lab/test_datapath_lab.py).

Exactness: the target's veth sends one skb per TCP segment (gso_max_segs 1,
see conftest), so a class and a set member count the same packets; HTB
counts the 14-byte Ethernet header, iptables does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from santhrottle.appliance import datapath as dp
from santhrottle.appliance.config import default
from santhrottle.appliance.datapath.glide import LOOK_GAP_MIN_S
from santhrottle.appliance.datapath.names import (
    ALL_SET_NAMES,
    GLIDE_PRIO,
    MEMBERS_SET,
    SET_NAMES,
)
from santhrottle.appliance.datapath.tc import installed_devices
from santhrottle.appliance.datapath.tctree import htb_params

pytestmark = pytest.mark.privileged

# The addresses and device conftest.netns_pair builds.
TARGET_DEV = "st-tgt"
MEMBER_IP = "192.0.2.2"
OTHER_IP = "192.0.2.3"
ETH_HLEN = 14
# A pure ACK with TCP timestamps: 20 B IP + 32 B TCP; the largest TCP header
# (60 B) + IP = 80 B.  Any packet carrying data in these tests is >= 1 kB.
MAX_ACK_IP_BYTES = 80
MB = 1 << 20


GLIDE_LEAVES = default("datapath.glide_leaves")


def _dp(pair, devices=(TARGET_DEV,), clock=None, **kw) -> dp.Datapath:
    # pfifo leaves: this kernel has no sch_netem (checked in test_missing_netem...)
    kw.setdefault("leaf", "pfifo")
    max_class = kw.pop("max_class", 20)  # a linear ladder of the default step
    kw.setdefault("ladder_ratio", 1.0)
    kw.setdefault("max_delay_us", kw.get("step_us", default("datapath.step")) * max_class)
    extra = {"clock": clock} if clock else {}
    return dp.Datapath(dp.DatapathSpec(devices, **kw), netns=pair.target, **extra)


def _jumps(pair) -> list[str]:
    text = pair.tsh("iptables", "-t", "mangle", "-S", "POSTROUTING")
    return [ln for ln in text.splitlines() if ln.endswith("-j SANTHROTTLE")]


def _leaf(d: dp.Datapath, leaf: str) -> dict:
    return next(g for g in dp.glide_status(d) if g["leaf"] == leaf)


def _counters(d: dp.Datapath):
    classes = d.device().class_counters()
    members = {ip: (m.packets, m.bytes) for ip, m in d.current().items()}
    return classes, members


def _delta(after, before):
    classes = {
        k: (
            after[0][k][0] - before[0].get(k, (0, 0))[0],
            after[0][k][1] - before[0].get(k, (0, 0))[1],
        )
        for k in after[0]
    }
    members = {
        ip: (v[0] - before[1].get(ip, (0, 0))[0], v[1] - before[1].get(ip, (0, 0))[1])
        for ip, v in after[1].items()
    }
    return classes, members


def _measured(pair, d: dp.Datapath, *transfers: tuple[str, int, int, int], start: bool = True):
    """Start the server, run the transfers (ip, port, bytes up, bytes down) and
    return what they added to the class and member counters."""
    if start:
        pair.start_server()
    before = _counters(d)
    for ip, port, up, down in transfers:
        pair.transfer(ip, port, up=up, down=down)
    return _delta(_counters(d), before)


def _only(classes: dict, *ks: int) -> dict:
    """Classes other than ks that saw traffic (must be empty)."""
    return {k: v for k, v in classes.items() if k not in ks and v != (0, 0)}


def test_ack_mode_pure_acks_go_to_the_class_payload_does_not(netns_pair):
    pair = netns_pair
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 3}, mode="ack")
        classes, members = _measured(
            pair,
            d,
            (MEMBER_IP, 3260, 16 * MB, 256 * 1024),  # a write, a small read back
        )
    pkts, nbytes = members[MEMBER_IP]
    assert pkts > 50, "the writer's pure ACKs matched the ack rule"
    # class 3 got exactly the packets the rule matched, and all are ACK-sized
    assert classes[3] == (pkts, nbytes + ETH_HLEN * pkts)
    assert nbytes <= MAX_ACK_IP_BYTES * pkts
    # the 256 KiB of payload, the SYN-ACK and the FIN went to the default class
    assert classes[0][1] >= 256 * 1024
    assert _only(classes, 0, 3) == {}


def test_read_mode_payload_goes_to_the_class_acks_do_not(netns_pair):
    pair = netns_pair
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 5}, mode="read")
        classes, members = _measured(
            pair,
            d,
            (MEMBER_IP, 3260, 2 * MB, 4 * MB),  # ACKs for 2 MB, then 4 MB read
        )
    pkts, nbytes = members[MEMBER_IP]
    assert classes[5] == (pkts, nbytes + ETH_HLEN * pkts)
    assert nbytes >= 4 * MB, "all the read payload went through class 5"
    assert nbytes / pkts > 1000, "and nothing ACK-sized did"
    # the target's ACKs for the upload, SYN-ACK, FIN: default class, all small
    dpkts, dbytes = classes[0]
    assert dpkts > 20 and dbytes <= (MAX_ACK_IP_BYTES + ETH_HLEN) * dpkts
    assert _only(classes, 0, 5) == {}


def test_all_mode_everything_goes_to_the_class(netns_pair):
    pair = netns_pair
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 7})  # the default write mode
        assert d.current()[MEMBER_IP].mode == "all"
        classes, members = _measured(
            pair,
            d,
            (MEMBER_IP, 3260, 2 * MB, 2 * MB),
            (MEMBER_IP, 4420, 256 * 1024, 256 * 1024),  # NVMe/TCP port too
        )
    pkts, nbytes = members[MEMBER_IP]
    assert classes[7] == (pkts, nbytes + ETH_HLEN * pkts)
    assert nbytes >= 2 * MB + 256 * 1024
    assert classes[0] == (0, 0), "not one packet to the member escaped class 7"
    assert _only(classes, 7) == {}


def test_non_members_and_other_ports_stay_unthrottled(netns_pair):
    pair = netns_pair
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 7})
        classes, members = _measured(
            pair,
            d,
            (OTHER_IP, 3260, MB, MB),  # not a member
            (MEMBER_IP, 5201, MB, MB),  # a member, not a storage port
        )
    assert members[MEMBER_IP] == (0, 0)
    assert classes[0][1] >= 2 * MB
    assert _only(classes, 0) == {}


def _gate(pair) -> set[str]:
    text = pair.tsh("ipset", "list", MEMBERS_SET)
    return set(text.split("Members:", 1)[1].split())


def test_the_gate_lists_only_the_mode_sets_that_have_members(netns_pair):
    """Nobody throttled: the jump's list:set is empty, the cheapest miss for
    every storage packet; a mode set is listed from its first member on and
    leaves the list with its last."""
    pair = netns_pair
    with _dp(pair) as d:
        # a previous version listed all three: apply takes the empty ones out
        pair.tsh("ipset", "create", MEMBERS_SET, "list:set")
        for name in SET_NAMES.values():
            pair.tsh("ipset", "create", name, "hash:ip", "counters", "skbinfo")
            pair.tsh("ipset", "add", MEMBERS_SET, name)
        d.apply()
        assert _gate(pair) == set() and _jumps(pair) == []
        d.set_classes({MEMBER_IP: 3})
        assert _gate(pair) == {"santhrottle-all"} and len(_jumps(pair)) == 1
        classes, members = _measured(pair, d, (MEMBER_IP, 3260, MB, MB))
        assert classes[3][0] == members[MEMBER_IP][0] > 100  # gated: delayed
        d.set_classes({MEMBER_IP: 2}, mode="read")  # a mode change: read in, all out
        assert _gate(pair) == {"santhrottle-read"}
        d.replace_members("ack", {OTHER_IP: 4})
        assert _gate(pair) == {"santhrottle-read", "santhrottle-ack"}
        d.replace_members("ack", {})
        d.set_classes({MEMBER_IP: 0}, mode="read")  # ordered: it glides out first
        assert _gate(pair) == {"santhrottle-read"} and MEMBER_IP in d.current()  # in a leaf
        d.set_classes({MEMBER_IP: 0}, mode="read", ordered=False)
        assert _gate(pair) == set() and d.current() == {} and _jumps(pair) == []
        with _dp(pair) as fresh:  # another process reads the gate back from the kernel
            fresh.set_classes({OTHER_IP: 5}, mode="ack")
        assert _gate(pair) == {"santhrottle-ack"} and len(_jumps(pair)) == 1
        d.cleanup()


def test_idle_no_rule_and_no_hook_sees_a_packet(netns_pair):
    """Nobody throttled: no jump at all (not even an empty gate to look up);
    the jump goes in with the first member and out with the last, and the
    empty hook iptables-nft leaves behind goes with it."""
    pair = netns_pair
    now = [1000.0]
    with _dp(pair, glide_leaves=1, clock=lambda: now[0]) as d:
        d.apply()
        assert _jumps(pair) == [] and "-N SANTHROTTLE" in pair.tsh("iptables", "-t", "mangle", "-S")
        classes, _ = _measured(pair, d, (MEMBER_IP, 3260, MB, MB))
        assert _only(classes, 0) == {}
        d.set_classes({MEMBER_IP: 4, OTHER_IP: 4})
        assert _jumps(pair) == [dp.rules.jump_rule(TARGET_DEV)]
        d.set_classes({OTHER_IP: 0}, ordered=False)
        assert len(_jumps(pair)) == 1  # a member is left
        d.set_classes({MEMBER_IP: 0})  # glides out: still a member, in the leaf
        assert len(_jumps(pair)) == 1 and MEMBER_IP in d.current()
        for _ in range(4):  # lowered, then two quiet looks hand it out of the set
            now[0] += 0.01
            d.advance_glides()
        assert d.current() == {} and _jumps(pair) == []
        if d.mangle.backend() == "nf_tables":
            nft = ["ip", "netns", "exec", pair.target, "nft", "list", "table", "ip", "mangle"]
            ruleset = subprocess.run(nft, capture_output=True, text=True, check=False)
            if ruleset.returncode == 0:  # nft is installed
                assert "hook" not in ruleset.stdout, ruleset.stdout
        classes, _ = _measured(pair, d, (MEMBER_IP, 3260, MB, MB), start=False)
        assert classes[0][1] >= MB and _only(classes, 0) == {}


def test_ports_are_configurable(netns_pair):
    pair = netns_pair
    with _dp(pair, ports=(5201,)) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 2})
        pair.start_server()
        before = _counters(d)
        pair.transfer(MEMBER_IP, 3260, up=0, down=MB)  # no longer a storage port
        mid = _counters(d)
        pair.transfer(MEMBER_IP, 5201, up=0, down=MB)
        after = _counters(d)
    c1, _ = _delta(mid, before)
    c2, _ = _delta(after, mid)
    assert c1[2] == (0, 0) and c1[0][1] >= MB
    assert c2[2][1] >= MB and c2[0] == (0, 0)


def test_moving_between_classes_and_modes_is_netlink_only(netns_pair):
    """Class changes never touch iptables or tc: the rule text and the tc
    tree stay byte-identical while members move (single ops and bulk)."""
    pair = netns_pair
    # no glide leaves: plain moves (ordered descent has its own test below)
    with _dp(pair, max_class=100, glide_leaves=0) as d:
        d.apply()
        tree = pair.tsh("tc", "class", "show", "dev", TARGET_DEV)
        ips = [f"10.{i >> 8 & 255}.{i & 255}.1" for i in range(600)]
        # bulk: one ipset restore (and the jump, with the first members)
        assert d.set_classes({ip: 1 + i % 100 for i, ip in enumerate(ips)}) == 600
        rules = pair.tsh("iptables", "-t", "mangle", "-S")
        # small: single netlink messages, including a mode change and a removal
        n = d.set_classes({ips[0]: 50, ips[1]: 0})
        n += d.set_classes({ips[2]: 9}, mode="read")
        assert n == 4  # add, del, del+add
        got = {ip: (m.mode, m.klass) for ip, m in d.current().items()}
        assert got[ips[0]] == ("all", 50)
        assert ips[1] not in got
        assert got[ips[2]] == ("read", 9)
        assert got[ips[3]] == ("all", 4)
        assert len(got) == 599
        # moving all of them again, by the bulk path, from a fresh reader
        with _dp(pair, max_class=100, glide_leaves=0) as d2:
            d2.set_classes({ip: 100 - i % 100 for i, ip in enumerate(ips) if i not in (1, 2)})
            got = {ip: m.klass for ip, m in d2.current().items() if m.mode == "all"}
        assert got[ips[5]] == 95 and len(got) == 598
        # the whole set replaced atomically (temporary set + swap)
        d.replace_members("ack", {"10.9.9.9": 3, "10.9.9.10": 4})
        acks = {ip: m.klass for ip, m in d.current().items() if m.mode == "ack"}
        assert acks == {"10.9.9.9": 3, "10.9.9.10": 4}
        assert pair.tsh("iptables", "-t", "mangle", "-S") == rules
        assert pair.tsh("tc", "class", "show", "dev", TARGET_DEV) == tree
        assert "santhrottle-ack-tmp" not in pair.tsh("ipset", "list", "-n")


def test_apply_is_idempotent_and_adopts_a_previous_run(netns_pair):
    pair = netns_pair
    with _dp(pair) as d:
        rep = d.apply()
        assert rep.tc_fresh and rep.tc_lines == 1 + 2 * (20 + GLIDE_LEAVES)
        assert rep.rules_changed and _jumps(pair) == []
        assert sorted(rep.sets_created) == sorted([*ALL_SET_NAMES, MEMBERS_SET])
        d.set_classes({MEMBER_IP: 4})
    snap = pair.snapshot()
    with _dp(pair) as d:  # a new process would see the same
        rep = d.apply()
        assert (rep.tc_lines, rep.sets_created, rep.rules_changed) == (0, [], False)
        assert "tc: adopted; sets: adopted; rules: adopted" in rep.summary()
        assert d.current()[MEMBER_IP].klass == 4  # members survive
        assert _jumps(pair) == [dp.rules.jump_rule(TARGET_DEV)]
    assert pair.snapshot() == snap
    # a new configuration is reconciled in place: the root stays, members stay
    with _dp(pair, max_class=10, ports=(3260,)) as d:
        rep = d.apply()
        # 10 classes deleted, the glide leaves resized for the new largest delay
        assert not rep.tc_fresh and rep.tc_lines == 10 + GLIDE_LEAVES
        assert rep.rules_changed
        assert d.current()[MEMBER_IP].klass == 4
    assert "qdisc htb 5374: root" in pair.tsh("tc", "qdisc", "show", "dev", TARGET_DEV)
    classes = pair.tsh("tc", "class", "show", "dev", TARGET_DEV)
    assert "5374:10 " in classes and "5374:11 " not in classes
    assert _jumps(pair) == [dp.rules.jump_rule(TARGET_DEV)]
    chain = pair.tsh("iptables", "-t", "mangle", "-S", "SANTHROTTLE")
    assert "-A SANTHROTTLE -p tcp -m multiport ! --sports 3260 -j RETURN" in chain
    # members above a lowered maximum are clamped, not silently unthrottled
    with _dp(pair, max_class=20) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 20})
    with _dp(pair, max_class=10) as d:
        rep = d.apply()
        assert rep.clamped == {MEMBER_IP: 10}
        assert d.current()[MEMBER_IP].klass == 10


def test_two_devices_share_the_sets_and_the_chain(netns_pair):
    """One Datapath for every egress device (the daemon's datapath.devices): a
    tree and a jump on each, one set of sets and one chain; cleanup removes all."""
    pair = netns_pair
    pair.tsh("ip", "link", "add", "st-x0", "type", "veth", "peer", "name", "st-x1")
    pair.tsh("ip", "link", "set", "st-x0", "up")
    before = pair.snapshot()
    with _dp(pair, devices=(TARGET_DEV, "st-x0"), glide_leaves=2) as d:
        rep = d.apply()
        assert rep.tc_fresh and rep.tc_lines == 2 * (1 + 2 * (20 + 2)) and rep.rules_changed
        assert installed_devices(d.host) == ["st-tgt", "st-x0"]
        d.set_classes({MEMBER_IP: 3})
        assert sorted(_jumps(pair)) == sorted(dp.rules.jump_rule(x) for x in ("st-tgt", "st-x0"))
        with _dp(pair, devices=("st-x0",)) as other:  # the sets are shared
            assert other.current()[MEMBER_IP].klass == 3
        d.set_classes({MEMBER_IP: 2})  # a descent: the glide leaf on both devices
        assert _leaf(d, "5374:6000")["members"] == [MEMBER_IP]
        assert dp.glide_status(d, "st-x0")[0]["members"] == [MEMBER_IP]
        rep = d.cleanup()
        # a jump per device in iptables and in ip6tables
        assert rep.qdiscs == ["st-tgt", "st-x0"] and rep.rules == 2 * 2
    after = pair.snapshot()
    for what in before:
        assert after[what] == before[what], what


def test_cleanup_leaves_the_kernel_exactly_as_before(netns_pair):
    pair = netns_pair
    # Someone else's state that must survive untouched.
    pair.tsh("ipset", "create", "admin-set", "hash:ip")
    pair.tsh("iptables", "-t", "mangle", "-N", "ADMIN")
    pair.tsh("iptables", "-t", "mangle", "-A", "POSTROUTING", "-o", "lo", "-j", "ADMIN")
    pair.tsh(
        "iptables", "-t", "mangle", "-A", "ADMIN", "-p", "udp", "-j", "MARK", "--set-mark", "7"
    )
    before = pair.snapshot()
    nft_before = _nft_tables(pair.target)
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 3, OTHER_IP: 5})
        d.set_classes({"10.0.0.9": 1}, mode="read")
        pair.start_server()
        pair.transfer(MEMBER_IP, 3260, up=MB, down=MB)
        assert pair.snapshot() != before
        rep = d.cleanup()
    assert rep.qdiscs == [TARGET_DEV] and rep.chain and rep.rules == 2  # iptables, ip6tables
    assert sorted(rep.sets) == sorted([*ALL_SET_NAMES, MEMBERS_SET])
    after = pair.snapshot()
    for what in before:
        assert after[what] == before[what], what
    assert _nft_tables(pair.target) == nft_before
    with _dp(pair) as d:  # a second cleanup finds nothing
        assert d.cleanup().summary() == "nothing of santhrottle's was installed"


FOREIGN_RULE = ("-t", "filter", "-A", "OUTPUT", "-m", "set", "--match-set", "santhrottle-all",
                "dst", "-j", "ACCEPT")  # fmt: skip


def test_cleanup_tries_a_busy_set_again(netns_pair):
    """Another program holds santhrottle-all busy while the cleanup first tries it (here
    a rule naming it, gone at the cleanup's first pause): the next attempt removes it,
    and nothing is left."""
    pair = netns_pair
    before = pair.snapshot()
    pauses = []

    def pause(s: float) -> None:
        pauses.append(s)
        if len(pauses) == 1:
            pair.tsh("iptables", *FOREIGN_RULE[:2], "-D", *FOREIGN_RULE[3:])

    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 3})
        pair.tsh("iptables", *FOREIGN_RULE)
        d.sleep = pause
        rep = d.cleanup()
    assert pauses == [dp.cleanup.CLEANUP_PAUSE_S]
    assert sorted(rep.sets) == sorted([*ALL_SET_NAMES, MEMBERS_SET])
    assert rep.qdiscs == [TARGET_DEV] and rep.chain
    assert pair.snapshot() == before


def test_cleanup_removes_the_rest_past_a_set_it_cannot(netns_pair):
    """A set another program's rule keeps naming: one error naming it, after the
    attempts; the tree, the chain and the other sets are gone, and that set has no
    member (nobody delayed).  Once the rule is gone, a cleanup finishes."""
    pair = netns_pair
    before = pair.snapshot()
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 3})
        pair.tsh("iptables", *FOREIGN_RULE)
        pauses: list[float] = []
        d.sleep = pauses.append
        left = r"left the sets after 3 attempts: .*santhrottle-all"
        with pytest.raises(dp.DatapathError, match=left):
            d.cleanup()
    assert len(pauses) == dp.cleanup.CLEANUP_ATTEMPTS - 1
    assert pair.tsh("ipset", "list", "-n").split() == ["santhrottle-all"]
    assert "Members:\n" in pair.tsh("ipset", "list", "santhrottle-all") and MEMBER_IP not in (
        pair.tsh("ipset", "list", "santhrottle-all")
    )
    assert "SANTHROTTLE" not in pair.tsh("iptables", "-t", "mangle", "-S")
    assert "5374" not in pair.tsh("tc", "qdisc", "show", "dev", TARGET_DEV)
    pair.tsh("iptables", *FOREIGN_RULE[:2], "-D", *FOREIGN_RULE[3:])
    with _dp(pair) as d:
        assert d.cleanup().sets == ["santhrottle-all"]
    assert pair.snapshot() == before


def test_cleanup_on_a_fresh_namespace_leaves_no_nft_table(netns_pair):
    """iptables-nft creates `table ip mangle` for our jump; cleanup removes it
    again when it is empty (and only then: see the test above)."""
    pair = netns_pair
    assert _nft_tables(pair.target) == []
    with _dp(pair) as d:
        d.apply()
        if d.mangle.backend() != "nf_tables":
            pytest.skip(f"iptables uses the {d.mangle.backend()} backend here")
        assert "mangle" in _nft_tables(pair.target)
        assert d.cleanup().nft_table
    assert _nft_tables(pair.target) == []


def test_refuses_a_root_qdisc_it_did_not_create(netns_pair):
    pair = netns_pair
    pair.tsh("tc", "qdisc", "add", "dev", TARGET_DEV, "root", "handle", "1:", "tbf", "rate",
             "1gbit", "burst", "100k", "latency", "10ms")  # fmt: skip
    before = pair.snapshot()
    with (
        _dp(pair) as d,
        pytest.raises(dp.ForeignQdisc, match=r"root qdisc tbf 1: that santhrottle"),
    ):
        d.apply()
    assert pair.snapshot() == before  # no sets, no rules, the tbf untouched


def test_missing_netem_is_one_clear_error(netns_pair):
    pair = netns_pair
    probe = subprocess.run(
        ["ip", "netns", "exec", pair.target, "tc", "qdisc", "add", "dev", "lo", "root", "netem"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode == 0:
        pytest.skip("this kernel has sch_netem: the error path cannot be shown here")
    before = pair.snapshot()
    spec = dp.DatapathSpec((TARGET_DEV,))
    with dp.Datapath(spec, netns=pair.target) as d, pytest.raises(dp.NetemMissing) as ei:
        d.apply()
    assert "sch_netem" in str(ei.value) and "\n" not in str(ei.value)
    assert pair.snapshot() == before, "nothing half-built is left"
    p = subprocess.run(
        [sys.executable, "-m", "santhrottle.appliance.cli", "datapath", "apply", "--device",
         TARGET_DEV, "--netns", pair.target],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert p.returncode == 1  # the kernel refused
    assert p.stderr.count("\n") == 1 and "sch_netem" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_pin_and_unpin_from_the_cli(netns_pair):
    pair = netns_pair
    with _dp(pair, max_class=100) as d:
        d.apply()

    def cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "santhrottle.appliance.cli", *argv, "--netns", pair.target],
            capture_output=True,
            text=True,
            check=False,
        )

    assert _jumps(pair) == []
    p = cli("pin", MEMBER_IP, "--delay", "5ms", "--mode", "read")
    assert p.returncode == 0, p.stderr
    assert "pinned 192.0.2.2: read" in p.stdout and "class 10, 5374:10" in p.stdout
    assert _jumps(pair) == [dp.rules.jump_rule(TARGET_DEV)]
    p = cli("pin", OTHER_IP, "--delay", "1.2ms")
    assert p.returncode == 2 and "not a delay of the ladder: use 1ms (class 2)" in p.stderr
    p = cli("pin", OTHER_IP, "--delay", "51ms")
    assert p.returncode == 2 and "above the maximum 50ms" in p.stderr
    p = cli("pin", OTHER_IP, "--delay", "5ms", "--device", "nope0")
    assert p.returncode == 1 and "applied on st-tgt, not nope0" in p.stderr
    p = cli("datapath", "show", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    st = doc["data"]
    assert doc["protocol"] >= 1
    assert st["device"] == TARGET_DEV and st["backend"] in ("nf_tables", "legacy")
    assert st["members"] == [
        {"ip": MEMBER_IP, "mode": "read", "class": 10, "delay_us": None, "packets": 0, "bytes": 0}
    ]
    p = cli("datapath", "show")
    assert p.returncode == 0 and "192.0.2.2" in p.stdout and "read" in p.stdout
    p = cli("unpin", MEMBER_IP)
    assert p.returncode == 0 and "unpinned 192.0.2.2 (was read, class 10)" in p.stdout
    with _dp(pair) as d:
        assert d.current() == {}
    assert _jumps(pair) == []
    for ip in (MEMBER_IP, OTHER_IP):
        assert cli("pin", ip, "--delay", "2ms").returncode == 0
    p = cli("cleanup", "--delays-only")
    assert p.returncode == 0 and "no initiator is delayed any more" in p.stdout, p.stderr
    with _dp(pair) as d:
        assert d.current() == {} and _jumps(pair) == []
    p = cli("cleanup")
    assert p.returncode == 0 and "removed root qdisc 5374: on st-tgt" in p.stdout
    p = cli("pin", MEMBER_IP, "--delay", "5ms")
    assert p.returncode == 1 and "not applied" in p.stderr


def test_pin_unpin_and_cleanup_json(netns_pair):
    """--json on the kernel paths: {"protocol": N, "data": ...} with what was done."""
    pair = netns_pair

    def cli(*argv):
        p = subprocess.run(
            [sys.executable, "-m", "santhrottle.appliance.cli", *argv, "--json",
             "--netns", pair.target],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert set(doc) == {"protocol", "data"} and doc["protocol"] >= 2
        return doc["data"]

    with _dp(pair, max_class=20) as d:  # this host may have no netem: `datapath apply
        d.apply()  # --json` is tests/lab/test_datapath_lab.py's
    pinned = cli("pin", MEMBER_IP, "--delay", "5ms", "--mode", "read")
    assert pinned == {
        "initiator": MEMBER_IP, "class": 10, "delay_s": 0.005, "mode": "read",
        "through": "kernel", "classid": "5374:10", "ports": [3260, 4420],
        "devices": [TARGET_DEV], "applied_on": None,
    }  # fmt: skip
    assert cli("unpin", MEMBER_IP) == {
        "initiator": MEMBER_IP, "unpinned": True, "through": "kernel",
        "was": {"mode": "read", "class": 10},
    }  # fmt: skip
    assert cli("unpin", MEMBER_IP)["unpinned"] is False
    cli("pin", OTHER_IP, "--delay", "2ms")
    done = cli("cleanup", "--delays-only")
    assert done["namespaces"] == [{"netns": pair.target, "delays_removed": True}]
    assert done["stopped"] == [] and done["delays_only"] is True
    with _dp(pair) as d:
        assert d.current() == {}
    (removed,) = cli("cleanup")["namespaces"]
    assert removed["netns"] == pair.target and removed["removed"]["qdiscs"] == [TARGET_DEV]
    assert removed["removed"]["chain"] and removed["removed"]["sets"]


def _nft_tables(ns: str) -> list[str]:
    """nft table names in a namespace (nft itself may not be installed)."""
    code = (
        "import os\n"
        "from pyroute2.nftables.main import NFTables\n"
        "print(' '.join(sorted(t.get_attr('NFTA_TABLE_NAME') for t in NFTables().get_tables())))\n"
    )
    p = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    return p.stdout.split()


def test_jump_gate_follows_a_swapped_set(netns_pair):
    """The jump tests membership through santhrottle-members (a list:set of
    the mode sets that have members).  A bulk change swaps a temporary set in under the same
    name: the gate must see the new members, and a non-member must never
    reach the chain."""
    pair = netns_pair
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 2})
        others = {f"10.7.{i >> 8}.{i & 255}": 1 + i % 20 for i in range(100)}
        d.replace_members("all", {**others, MEMBER_IP: 6})  # temporary set + swap
        assert _gate(pair) == {"santhrottle-all"}
        classes, members = _measured(
            pair,
            d,
            (MEMBER_IP, 3260, MB, MB),
            (OTHER_IP, 3260, MB, MB),
        )
    pkts, nbytes = members[MEMBER_IP]
    assert nbytes >= MB and classes[6] == (pkts, nbytes + ETH_HLEN * pkts)
    assert classes[2] == (0, 0)
    assert classes[0][1] >= MB  # the non-member's download, unthrottled
    assert _only(classes, 0, 6) == {}
    # the jump's own counter: only the member's packets entered the chain
    jump = pair.tsh("iptables", "-t", "mangle", "-L", "POSTROUTING", "-v", "-n", "-x")
    entered = int(next(ln for ln in jump.splitlines() if "SANTHROTTLE" in ln).split()[0])
    assert entered == pkts


def test_a_descent_glides_through_its_own_leaf_then_settles(netns_pair):
    """Lowering a member's class moves it into a glide leaf (pfifo here: the
    delay change itself, and that it keeps order, is the lab's to measure),
    whose traffic counts in no class; advance_glides() hands it to the shared class."""
    pair = netns_pair
    now = [1000.0]
    with _dp(pair, glide_leaves=2, clock=lambda: now[0]) as d:
        d.apply()
        assert [g["leaf"] for g in dp.glide_status(d)] == ["5374:6000", "5374:6001"]
        d.set_classes({MEMBER_IP: 6})
        d.set_classes({MEMBER_IP: 2})
        # read back from the kernel by a fresh reader: skbprio is the glide leaf
        with _dp(pair) as other:
            assert _leaf(other, "5374:6000")["members"] == [MEMBER_IP]
        # in at class 6; lowered only once what it sent before has left class 6
        assert d.current()[MEMBER_IP].klass == 6
        assert [g["lowering_to_us"] for g in dp.glide_status(d)] == [d.spec.delay_us(2), None]
        before = {g["leaf"]: g["packets"] for g in dp.glide_status(d)}
        classes, members = _measured(pair, d, (MEMBER_IP, 3260, MB, MB))
        gliding = {g["leaf"]: g for g in dp.glide_status(d)}
        pkts, _ = members[MEMBER_IP]
        assert gliding["5374:6000"]["packets"] - before["5374:6000"] == pkts > 100
        assert gliding["5374:6000"]["members"] == [MEMBER_IP]
        assert _only(classes) == {}, "the glide leaf's packets count in no class"
        assert d.advance_glides() == 0 and d.current()[MEMBER_IP].klass == 6  # not due yet
        now[0] += 6 * d.spec.step_s
        assert d.advance_glides() == 0  # lowered in place; its class-6 packets may still be queued
        assert d.current()[MEMBER_IP].klass == 2
        now[0] += 6 * d.spec.step_s
        # due, and nothing queued; but it sent since the last look (the transfer):
        # only a look that sees no traffic since the one before hands it on
        assert d.advance_glides() == 0 and _leaf(d, "5374:6000")["state"] == "handoff"
        assert d.advance_glides() == 1 and _leaf(d, "5374:6000")["state"] == "draining"
        assert d.current()[MEMBER_IP].klass == 2
        classes, members = _measured(pair, d, (MEMBER_IP, 3260, MB, MB), start=False)
        assert classes[2][0] == members[MEMBER_IP][0] > 100
        assert _only(classes, 2) == {}
        # a release glides too (through the other leaf: the first still holds
        # what it sent at delay 2), to delay 0, and settles out of the set
        d.set_classes({MEMBER_IP: 0})
        assert d.current()[MEMBER_IP].klass == 2
        assert _leaf(d, "5374:6001")["members"] == [MEMBER_IP]
        now[0] += 2 * d.spec.step_s
        assert d.advance_glides() == 0 and d.current()[MEMBER_IP].klass == 0
        now[0] += 2 * d.spec.step_s
        assert d.advance_glides() == 0  # the first look at leaf 6001
        assert d.advance_glides() == 1 and MEMBER_IP not in d.current()
        d.cleanup()


def test_advance_glides_keeps_a_member_while_its_packets_are_queued_in_the_leaf(netns_pair):
    """Handing a leaf's members to a shared class (or out of the set) while
    the leaf still holds their packets would let the next ones overtake
    those: advance_glides() reads the leaf's queue from the kernel and waits."""
    pair = netns_pair
    now = [1000.0]
    with _dp(pair, glide_leaves=1, clock=lambda: now[0]) as d:
        d.apply()
        d.set_classes({MEMBER_IP: 6})
        d.set_classes({MEMBER_IP: 2})
        now[0] += 6 * d.spec.step_s
        d.advance_glides()  # lowered in place
        now[0] += 6 * d.spec.step_s  # due, by time
        # a slow leaf (pfifo here has no delay) so that the download queues in it
        leaf = "5374:6000"
        slow = f"rate 80kbit ceil 80kbit burst 1600b cburst 1600b prio {GLIDE_PRIO}"
        pair.tsh("tc", "class", "change", "dev", TARGET_DEV, "parent", "5374:", "classid", leaf,
                 "htb", *slow.split())  # fmt: skip
        pair.start_server()
        t = threading.Thread(target=pair.transfer, args=(MEMBER_IP, 3260, 0, 256 << 10))
        t.start()
        try:
            deadline = time.monotonic() + 10
            while dp.glide_status(d)[0]["queued"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert dp.glide_status(d)[0]["queued"] > 0
            assert d.advance_glides() == 0
            assert _leaf(d, "5374:6000")["members"] == [MEMBER_IP]
        finally:
            fast = htb_params(d.spec.link_bits_s, GLIDE_PRIO).tc_args()
            pair.tsh("tc", "class", "change", "dev", TARGET_DEV, "parent", "5374:", "classid",
                     leaf, "htb", *fast.split())  # fmt: skip
            t.join()
        assert dp.glide_status(d)[0]["queued"] == 0
        assert d.advance_glides() == 0  # the queue drained through the leaf since the last look
        assert d.advance_glides() == 0  # two looks in a row saw traffic: the next pair waits
        now[0] += LOOK_GAP_MIN_S
        assert d.advance_glides() == 1 and d.current()[MEMBER_IP].klass == 2
        d.cleanup()


def test_a_temporary_set_a_crash_left_does_not_block_a_bulk_move(netns_pair):
    pair = netns_pair
    with _dp(pair, glide_leaves=0) as d:
        d.apply()
        pair.tsh("ipset", "create", "santhrottle-all-tmp", "hash:ip")  # a crash mid-swap
        ips = {f"10.8.{i >> 8}.{i & 255}": 1 + i % 20 for i in range(100)}
        assert d.set_classes(ips) == 100  # bulk: rebuilt and swapped in
        assert {ip: m.klass for ip, m in d.current().items()} == ips
        assert "santhrottle-all-tmp" not in pair.tsh("ipset", "list", "-n")
        d.cleanup()
