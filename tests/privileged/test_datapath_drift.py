"""The drift check's reads on the host kernel (datapath/drift.py, presence.py, mangle.py).

The presence read (every convergence) and the full comparison (every 10 s) read the
chain and its jumps in-process through nftables where iptables is iptables-nft, and
through `iptables -S` / `ip6tables -S` with the legacy backend.  Before, every full
comparison ran those two programs.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from santhrottle.appliance import datapath as dp
from santhrottle.appliance.datapath import host as host_mod
from santhrottle.appliance.datapath.actuation import Actuation
from santhrottle.appliance.datapath.drift import RULES_DRIFT
from tests.privileged.conftest import MEMBER_IP
from tests.privileged.test_datapath_netns import TARGET_DEV

pytestmark = pytest.mark.privileged

PIN = {MEMBER_IP: (5, "all")}


def _actuation(pair, tools: dp.Tools | None = None) -> Actuation:
    spec = dp.DatapathSpec((TARGET_DEV,), leaf="pfifo", link_bits_s=10_000_000_000)
    return Actuation(dp.Datapath(spec, netns=pair.target, tools=tools))


@contextlib.contextmanager
def _pinned(pair) -> Iterator[tuple[Actuation, Any, str, Any, Any]]:
    """The data path applied with PIN in the pair's target, and a drift Watch on it:
    (actuation, spec, namespace, watch, expected); both removed at the end."""
    from santhrottle.appliance.datapath import drift

    a = _actuation(pair)
    w = drift.Watch(pair.target)
    try:
        a.apply()
        a.reconcile(PIN, ordered=False)
        yield a, a.datapath.spec, pair.target, w, a.expected()
    finally:
        w.close()
        a.cleanup()


@pytest.fixture
def programs(monkeypatch):
    """Every program the data path runs in the namespace from now on (argv through
    nsenter: the test's own `ip netns exec` are not recorded)."""
    ran: list[list[str]] = []
    real = subprocess.run

    def recording(cmd, *a, **kw):
        if list(cmd)[:1] == ["nsenter"]:
            ran.append(list(cmd))
        return real(cmd, *a, **kw)

    monkeypatch.setattr(host_mod.subprocess, "run", recording)
    return ran


def test_with_iptables_nft_the_chain_is_read_without_a_program(netns_pair, programs):
    if "nf_tables" not in subprocess.run(["iptables", "-V"], capture_output=True, text=True).stdout:
        pytest.skip("iptables is not iptables-nft here")
    a = _actuation(netns_pair)
    try:
        a.apply()
        a.reconcile(PIN, ordered=False)
        e = a.expected()
        assert e.rules is not None and e.rules_gen is not None
        programs.clear()
        assert a.missing(e) == [] and a.drift(e) == []
        assert programs == []  # no iptables -S, no nsenter
        netns_pair.sh(netns_pair.target, "iptables", "-t", "mangle", "-D", "SANTHROTTLE", "2")
        assert a.missing(e) == [RULES_DRIFT] and a.drift(e) == [RULES_DRIFT]
        assert programs == []
        a.repair()
        a.reconcile(PIN, ordered=False)
        e = a.expected()
        assert a.missing(e) == [] and a.drift(e) == []
        # replaced in place, same matches, another set: the handle and the fingerprint
        # stay, nftables' generation moves; the full comparison asks the programs once
        netns_pair.sh(
            netns_pair.target, "iptables", "-t", "mangle", "-R", "SANTHROTTLE", "2",
            "-j", "SET", "--map-set", "santhrottle-read", "dst", "--map-prio",
        )  # fmt: skip
        programs.clear()
        assert a.missing(e) == []
        assert a.drift(e) == [RULES_DRIFT]
        assert any("iptables" in " ".join(argv) for argv in programs)
        a.repair()
        a.reconcile(PIN, ordered=False)
        e = a.expected()
        assert a.drift(e) == []
        netns_pair.sh(netns_pair.target, "nft", "add", "table", "inet", "someone-elses")
        programs.clear()
        assert a.drift(e) == []  # another table: the programs once, for this generation
        n = len(programs)
        assert n >= 1 and a.drift(e) == [] and a.missing(e) == [] and len(programs) == n
    finally:
        a.cleanup()


def test_with_legacy_iptables_the_chain_is_read_by_the_programs(netns_pair):
    legacy = ("iptables-legacy", "iptables-legacy-restore", "ip6tables-legacy",
              "ip6tables-legacy-restore")  # fmt: skip
    missing = [t for t in legacy if not shutil.which(t)]
    if missing:
        pytest.skip(f"{missing[0]} is not installed")
    tools = dp.Tools(
        iptables=legacy[0], iptables_restore=legacy[1], ip6tables=legacy[2],
        ip6tables_restore=legacy[3],
    )  # fmt: skip
    a = _actuation(netns_pair, tools)
    try:
        try:
            a.apply()
        except dp.DatapathError as e:
            pytest.skip(f"this kernel has no legacy x_tables mangle table: {e}")
        a.reconcile(PIN, ordered=False)
        e = a.expected()
        assert e.rules is None  # nothing of it in nftables: the programs read it
        assert a.missing(e) == [] and a.drift(e) == []
        netns_pair.sh(netns_pair.target, legacy[0], "-t", "mangle", "-F", "SANTHROTTLE")
        assert a.drift(e) == [RULES_DRIFT]
        a.repair()
        a.reconcile(PIN, ordered=False)
        assert a.drift(a.expected()) == []
    finally:
        a.cleanup()


def test_the_check_reads_the_namespace_from_whichever_thread_calls_it(netns_pair):
    """Before, the daemon's first check (its main thread) opened the sockets, and the
    convergence worker's later checks reused them: pyroute2 opens a socket per thread
    at that thread's first request, there outside the namespace, and the full
    comparison failed ("No such file or directory") until the next period."""
    import threading

    a = _actuation(netns_pair)
    try:
        a.apply()
        a.reconcile(PIN, ordered=False)
        e = a.expected()
        assert a.drift(e) == []  # the main thread first
        netns_pair.sh(netns_pair.target, "ipset", "flush", "santhrottle-all")
        got: list[object] = []

        def worker() -> None:
            try:
                got.append((a.missing(e), a.drift(e)))
            except Exception as ex:
                got.append(ex)

        t = threading.Thread(target=worker)
        t.start()
        t.join(60)
        line = "ipset: santhrottle-all holds 0 members, santhrottle left 1 there"
        assert got == [([line], [line])]
    finally:
        a.cleanup()


def _presence_reads(spec, e, w) -> list[list[str]]:
    """TREE_DIGEST_EVERY presence reads in a row: one of them takes the trees' digests."""
    from santhrottle.appliance.datapath import drift

    return [drift.find_missing(spec, e, w) for _ in range(drift.TREE_DIGEST_EVERY)]


def test_the_presence_read_sees_a_class_or_a_leaf_changed_inside_the_tree(netns_pair):
    """Each device's tree digest (presence.py) against the one the full comparison last
    found as wanted, at every TREE_DIGEST_EVERY-th presence read: a class's rate or a
    leaf changed by hand is named within that many reads, the full comparison confirms
    it, and after the repair both are quiet; a glide leaf's own change is no drift."""
    from santhrottle.appliance.datapath import drift
    from santhrottle.appliance.datapath.names import GLIDE_MINOR_BASE

    quiet = [[]] * drift.TREE_DIGEST_EVERY
    with _pinned(netns_pair) as (a, spec, tgt, w, e):
        assert drift.find_missing(spec, e, w) == []  # no full comparison yet: nothing known
        assert drift.find_drift(spec, e, w) == [] and TARGET_DEV in w.trees
        assert _presence_reads(spec, e, w) == quiet
        changed = [f"tc: {TARGET_DEV}: {drift.TREE_CHANGED}"]
        tc = ("tc", "-n", tgt)
        glide = f"5374:{GLIDE_MINOR_BASE:x}"
        subprocess.run([*tc, "qdisc", "change", "dev", TARGET_DEV, "parent", glide, "pfifo",
                        "limit", "7"], check=True)  # fmt: skip
        assert _presence_reads(spec, e, w) == quiet  # a glide leaf's: the data path's own
        subprocess.run([*tc, "class", "change", "dev", TARGET_DEV, "classid", "5374:5",
                        "parent", "5374:1", "htb", "rate", "1mbit"], check=True)  # fmt: skip
        assert changed in _presence_reads(spec, e, w)
        (found,) = drift.find_drift(spec, e, w)
        assert found.startswith(f"tc: {TARGET_DEV}: ") and found.endswith("missing or changed")
        assert TARGET_DEV not in w.trees
        a.apply()  # the repair
        assert drift.find_drift(spec, e, w) == [] and _presence_reads(spec, e, w) == quiet
        subprocess.run([*tc, "qdisc", "replace", "dev", TARGET_DEV, "parent", "5374:6",
                        "pfifo", "limit", "3"], check=True)  # fmt: skip
        assert changed in _presence_reads(spec, e, w)


def test_the_presence_read_takes_the_digests_at_every_tree_digest_every_th_read(netns_pair):
    """The tree's digest was the largest part of the presence read in the one-vCPU lab
    guest (0.16 s a convergence under the profiler): it is taken at one presence read
    in TREE_DIGEST_EVERY; the root qdisc at every one (a root removed is named at once).
    The full comparison takes none of a tree known as wanted; one the presence read
    found not as it was is no longer known so, and the full comparison looks at it."""
    from santhrottle.appliance.datapath import drift

    with _pinned(netns_pair) as (_a, spec, tgt, w, e):
        assert drift.find_drift(spec, e, w) == []
        digests = []
        real = w.tree
        w.tree = lambda dev: digests.append(dev) or real(dev)
        for _ in range(2 * drift.TREE_DIGEST_EVERY):
            assert drift.find_missing(spec, e, w) == []
        assert digests == [TARGET_DEV] * 2
        assert drift.find_drift(spec, e, w) == []  # a tree known as wanted: no digest there
        assert digests == [TARGET_DEV] * 2
        subprocess.run(["tc", "-n", tgt, "qdisc", "del", "dev", TARGET_DEV, "root"], check=True)
        (line,) = drift.find_missing(spec, e, w)
        assert line.startswith(f"tc: {TARGET_DEV}: the root qdisc is not santhrottle's")
        assert digests == [TARGET_DEV] * 2
        (found,) = drift.find_drift(spec, e, w)  # no longer known as wanted: looked at
        assert found.startswith(f"tc: {TARGET_DEV}: the root qdisc is not santhrottle's")


def test_the_full_comparison_sees_a_member_moved_to_another_class_by_hand(netns_pair):
    """A member's skbprio changed by hand (`ipset add -exist ... skbprio`) keeps every
    set's count, so the presence read cannot see it: the full comparison lists the
    members (one dump a set, presence.py) and names it, and after the repair the
    next reconcile puts the member back in its class.  Before, only the counts were
    compared and the member stayed in the hand-picked class."""
    from santhrottle.appliance.datapath import drift
    from santhrottle.appliance.datapath.presence import Presence

    a = _actuation(netns_pair)
    spec, tgt = a.datapath.spec, netns_pair.target
    w = drift.Watch(tgt)
    p = Presence(dp.Host(tgt))
    try:
        a.apply()
        a.reconcile(PIN, ordered=False)
        e = a.expected()
        assert drift.find_drift(spec, e, w) == []
        assert p.set_members("santhrottle-all") == {MEMBER_IP: 0x5374_0005}
        netns_pair.sh(tgt, "ipset", "add", "-exist", "santhrottle-all", MEMBER_IP,
                      "skbprio", "5374:1")  # fmt: skip
        assert p.set_members("santhrottle-all") == {MEMBER_IP: 0x5374_0001}
        assert drift.find_missing(spec, e, w) == []  # the counts stayed
        line = "ipset: 1 member(s) not in the set or class santhrottle left"
        assert drift.find_drift(spec, e, w) == [line]
        netns_pair.sh(tgt, "ipset", "add", "-exist", "santhrottle-all", MEMBER_IP)
        assert drift.find_drift(spec, e, w) == [line]  # no skbprio: HTB's direct queue
        a.repair()
        a.reconcile(PIN, ordered=False)
        assert p.set_members("santhrottle-all") == {MEMBER_IP: 0x5374_0005}
        assert drift.find_drift(spec, a.expected(), w) == []
    finally:
        p.close()
        w.close()
        a.cleanup()


def test_a_tree_whose_digest_is_as_wanted_is_not_decoded_again(netns_pair, monkeypatch):
    """The full comparison looks at a device's tree through pyroute2 (its whole cost:
    3-8 s of CPU in the one-vCPU lab guest) only where the digest is not the one it
    last found as wanted for this spec, and every TREE_RECHECK_EVERY-th time, which
    then also sees a glide leaf's options that the digest leaves out.  Before, it
    decoded the tree at every full comparison."""
    from dataclasses import replace

    from santhrottle.appliance.datapath import drift
    from santhrottle.appliance.datapath.names import GLIDE_MINOR_BASE

    looks: list[str] = []

    class Counted(drift.TcDevice):
        def observe(self):
            looks.append(self.device)
            return super().observe()

    monkeypatch.setattr(drift, "TcDevice", Counted)
    with _pinned(netns_pair) as (a, spec, tgt, w, e):
        assert drift.find_drift(spec, e, w) == [] and looks == [TARGET_DEV]
        for _ in range(drift.TREE_RECHECK_EVERY - 1):
            assert drift.find_drift(spec, e, w) == []
        assert looks == [TARGET_DEV]  # the digest as found: no decoding
        glide = f"5374:{GLIDE_MINOR_BASE:x}"
        subprocess.run(["tc", "-n", tgt, "qdisc", "change", "dev", TARGET_DEV, "parent", glide,
                        "pfifo", "limit", "7"], check=True)  # fmt: skip
        assert drift.find_missing(spec, e, w) == []  # out of the digest
        (found,) = drift.find_drift(spec, e, w)  # the TREE_RECHECK_EVERY-th: looked at
        assert looks == [TARGET_DEV] * 2 and found.endswith("missing or changed")
        a.apply()
        assert drift.find_drift(spec, e, w) == [] and len(looks) == 3  # not found as wanted
        assert drift.find_drift(spec, e, w) == [] and len(looks) == 3
        other = replace(spec, max_delay_us=spec.max_delay_us // 2)  # a reload's new ladder
        (found,) = drift.find_drift(other, e, w)
        assert len(looks) == 4 and found.endswith("missing or changed")
