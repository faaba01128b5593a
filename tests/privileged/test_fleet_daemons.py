"""Two santhrottled processes in fleet mode on a real 3-member etcd cluster.

The cluster is tests/privileged/etcd_cluster.py's (each member in a network
namespace this test makes); each daemon runs in a member's namespace (its
engine traffic goes there) with its data path in a namespace of its own
(pfifo leaves: the host kernel has no netem, so classification only; the
delays and the closed loop through two bridges are the lab's).  What only
real processes on a real engine show:
  - both register, one leads the resource, the other follows (fleet status);
  - kill -9 of the leader: the other leads within 2 s and the dead one's
    member key ends with its lease (no orphan member);
  - a partition of one daemon's member: that daemon reports "degraded" within
    the agent's bound, the other keeps leading, and both are back in fleet
    mode once the link returns;
  - SIGTERM leaves the fleet at once (the other leads well before the lease's
    TTL) and the kernel as it was.
Skips, with the reason, without root, ip, tc, ipset or etcd.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santhrottle.appliance.daemon.control import request
from santhrottle.appliance.fleet.agent import DEGRADED_AFTER_S
from santhrottle.appliance.fleet.etcd import CALL_BUDGET_S, REQUEST_TIMEOUT_S
from tests.privileged.etcd_cluster import Credentials, appliance_grants, cluster, missing
from tests.privileged.test_daemon_netns import _start

pytestmark = pytest.mark.privileged
BIN = Path(sys.executable).parent
FAILOVER_BOUND_S = 2.0
# The agent notices an outage after DEGRADED_AFTER_S of failing rounds; a round
# that hangs takes at most the call budget and one attempt's connect and read.
DEGRADE_BOUND_S = DEGRADED_AFTER_S + CALL_BUDGET_S + 2 * REQUEST_TIMEOUT_S + 0.5
POLL_S = 0.05


def sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)


@contextlib.contextmanager
def _fleet(tmp_path, secure: bool):
    why = missing(secure)
    if why:
        pytest.skip(why)
    for tool in ("tc", "ipset", "iptables-restore"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    tag = f"{os.getpid()}{'s' if secure else 'd'}"
    dps = [f"stfd-{tag}-{x}" for x in "ab"]
    procs: dict[str, subprocess.Popen] = {}
    try:
        for ns in dps:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "add", "st-d0", "type", "veth", "peer", "st-d1")
            sh("ip", "-n", ns, "link", "set", "st-d0", "up")
        with cluster(tag, secure=secure) as c:
            yield c, dps, procs, tmp_path
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)  # our own children, by PID
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=30)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for ns in dps:
            sh("ip", "netns", "del", ns)


@pytest.fixture
def fleet(tmp_path):
    with _fleet(tmp_path, secure=False) as f:
        yield f


@pytest.fixture
def secure_fleet(tmp_path):
    """TLS, client certificates and etcd's authentication on (etcd_cluster.Pki)."""
    with _fleet(tmp_path, secure=True) as f:
        f[0].enable_auth()
        yield f


def start(fleet, name: str, member: int, creds: Credentials | None = None, lead: bool = True):
    """santhrottled `name` in etcd member `member`'s namespace; its control socket.
    creds: its [fleet] ca, cert, key, user and password_file."""
    c, dps, procs, tmp = fleet
    d = tmp / name
    d.mkdir()
    sock = str(d / "control.sock")
    disk = next(iter(sorted(p.name for p in Path("/sys/block").iterdir())), "vda")
    order = [member, *(i for i in range(3) if i != member)]
    endpoints = ", ".join(f'"{c.endpoint(i)}"' for i in order)
    security = "" if lead else "lead = false\n"
    for key in ("ca", "cert", "key", "user", "password_file"):
        value = None if creds is None else getattr(creds, key)
        security += "" if value is None else f'{key} = "{value}"\n'
    conf = d / "s.toml"
    conf.write_text(
        f'[daemon]\ncontrol_socket = "{sock}"\nnetns = "{dps["ab".index(name)]}"\n'
        f'state_dir = "{d / "state"}"\n'
        f'[datapath]\ndevices = ["st-d0"]\nleaf = "pfifo"\nlink_speed = "10gbit"\n'
        f"[metrics]\nport = 0\n"
        f'[resources.r0]\nthreshold = "20ms"\ndevices = ["{disk}"]\n'
        f'[fleet]\nendpoints = [{endpoints}]\narray = "arr"\nappliance = "{name}"\n{security}'
    )
    procs[name] = _start(conf, sock, ("ip", "netns", "exec", c.ns[member]), d / "log")
    return sock


def until(fn, within_s: float, what: str):
    """fn()'s first true value and the seconds it took."""
    t0 = time.monotonic()
    while True:
        got = fn()
        if got:
            return got, time.monotonic() - t0
        if time.monotonic() - t0 > within_s:
            raise AssertionError(f"{what}: not within {within_s} s (last: {got!r})")
        time.sleep(POLL_S)


def fs(sock: str) -> dict:
    return request(sock, "fleet_status")


def leader_of(sock: str) -> str | None:
    got = fs(sock)["leaders"].get("r0")
    return None if got is None else got["appliance"]


def both_in_fleet(a: str, b: str):
    sa, sb = fs(a), fs(b)
    ok = (
        sa["mode"] == sb["mode"] == "fleet"
        and sa["appliances"] == sb["appliances"] == ["a", "b"]
        and leader_of(a) is not None
        and leader_of(a) == leader_of(b)
    )
    return (sa, sb) if ok else None


def test_kill_9_of_the_leader_hands_over_within_2_s_without_an_orphan(fleet):
    socks = {"a": start(fleet, "a", 0), "b": start(fleet, "b", 1)}
    (sa, _sb), _ = until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    lead = sa["leaders"]["r0"]["appliance"]
    other = "b" if lead == "a" else "a"
    follower = fs(socks[other])
    assert follower["leading"] == [] and fs(socks[lead])["leading"] == ["r0"]
    assert follower["parts"][lead]["tick_seq"] > 0  # the leader's samples arrive
    cli = subprocess.run(
        [str(BIN / "santhrottle"), "fleet", "status", "--socket", socks[other]],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    print(f"\n$ santhrottle fleet status\n{cli.stdout}", end="")
    assert cli.returncode == 0 and f"r0  leader {lead}" in cli.stdout, cli.stderr
    epoch = sa["leaders"]["r0"]["epoch"]
    fleet[2][lead].kill()  # SIGKILL, our own child: its lease ends by itself
    fleet[2][lead].wait(timeout=10)
    t0 = time.monotonic()
    until(lambda: fs(socks[other])["leading"] == ["r0"], 10.0, "the survivor leads")
    took = time.monotonic() - t0
    st = fs(socks[other])
    print(f"\nleader {lead} killed -> {other} leads after {took:.2f} s")
    assert st["leaders"]["r0"]["epoch"] > epoch and st["mode"] == "fleet"
    assert took < FAILOVER_BOUND_S
    until(lambda: fs(socks[other])["appliances"] == [other], 5.0, "the dead appliance's key gone")


def test_a_partitioned_daemon_degrades_and_rejoins(fleet):
    c = fleet[0]
    socks = {"a": start(fleet, "a", 0), "b": start(fleet, "b", 1)}
    until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    c.link(1, up=False)  # b's member namespace off the network: b sees no engine
    t0 = time.monotonic()
    st, _ = until(
        lambda: (s := fs(socks["b"]))["mode"] == "degraded" and s, DEGRADE_BOUND_S + 2, "b degrades"
    )
    took = time.monotonic() - t0
    print(f"\npartitioned: b degraded after {took:.2f} s: {st['reason']}")
    assert took < DEGRADE_BOUND_S and st["reason"]
    assert st["leaders"] == {} and st["following"] == {}  # alone: nobody else's classes
    # a, in the majority, leads r0 once b's lease is gone
    until(lambda: fs(socks["a"])["leading"] == ["r0"], 10.0, "a leads")
    until(lambda: fs(socks["a"])["appliances"] == ["a"], 5.0, "b's key gone")
    assert fs(socks["a"])["mode"] == "fleet"
    c.link(1, up=True)
    _, back = until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet again")
    print(f"link back: both in fleet mode after {back:.2f} s")
    assert fs(socks["b"])["counters"]["leases_lost"] >= 1  # it joined again


def test_sigterm_leaves_the_fleet_at_once_and_the_kernel_clean(fleet):
    _c, dps, procs, _tmp = fleet
    before = sh("ip", "netns", "exec", dps[0], "tc", "qdisc", "show", "dev", "st-d0").stdout
    socks = {"a": start(fleet, "a", 0), "b": start(fleet, "b", 1)}
    (sa, _sb), _ = until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    lead = sa["leaders"]["r0"]["appliance"]
    other = "b" if lead == "a" else "a"
    procs[lead].send_signal(signal.SIGTERM)  # our own child, by PID
    t0 = time.monotonic()
    assert procs[lead].wait(timeout=30) == 0
    until(lambda: fs(socks[other])["leading"] == ["r0"], 5.0, "the other leads")
    took = time.monotonic() - t0
    print(f"\nleader {lead} stopped -> {other} leads after {took:.2f} s")
    assert fs(socks[other])["appliances"] == [other]
    if lead == "a":
        after = sh("ip", "netns", "exec", dps[0], "tc", "qdisc", "show", "dev", "st-d0").stdout
        assert after == before


FORGED_SEQ = 999_999_999_999
STRANGER = "10.9.9.9"  # an initiator that nobody's controller delays


def stranger_delayed(dp: str) -> bool:
    """STRANGER is in the data path's member set (of the follower's namespace)."""
    got = sh("ip", "netns", "exec", dp, "ipset", "list", "santhrottle-all")
    return f"{STRANGER} " in got.stdout


@pytest.mark.parametrize("under", ["no lease", "the leader's lease"])
def test_a_forged_decision_with_a_huge_seq_never_wedges_the_follower(fleet, under):
    """A well-formed decision put into etcd by hand (etcdctl): the leader's epoch, seq
    999999999999, the top class for an initiator nobody delays.  The follower never
    keeps it: not at all when it is not under the leader's lease, for a round at most
    when it is (the leader's next decision replaces it)."""
    c, dps, _procs, _tmp = fleet
    socks = {"a": start(fleet, "a", 0), "b": start(fleet, "b", 1)}
    (sa, _sb), _ = until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    lead = sa["leaders"]["r0"]["appliance"]
    other = "b" if lead == "a" else "a"
    until(lambda: "r0" in fs(socks[other])["following"], 10.0, "the follower follows")
    epoch = sa["leaders"]["r0"]["epoch"]
    lease = json.loads(c.etcdctl(2, "get", "/santhrottle/arr/leader/r0", "-w", "json"))
    lease_hex = f"{int(lease['kvs'][0]['lease']):x}"
    payload = {"v": 1, "seq": FORGED_SEQ, "class": 88, "members": {STRANGER: 88}}
    value = json.dumps({"epoch": epoch, "appliance": lead, "payload": payload})
    cmd = ["put", "/santhrottle/arr/decisions/r0", value]
    if under != "no lease":
        cmd.insert(1, f"--lease={lease_hex}")
    before = fs(socks[other])["counters"]
    c.etcdctl(2, *cmd)  # anyone with write access to etcd
    t0 = time.monotonic()
    seen: list[tuple[float, bool]] = []
    while time.monotonic() - t0 < 5.0:
        seen.append((time.monotonic() - t0, stranger_delayed(dps["ab".index(other)])))
        time.sleep(POLL_S)
    after = fs(socks[other])
    n = sum(d for _, d in seen)
    print(f"\nforged decision ({under}): counters {before} -> {after['counters']}; "
          f"following {after['following']}; STRANGER delayed in {n} of {len(seen)} polls "
          "over 5 s")  # fmt: skip
    assert not any(d for t, d in seen if t > 2.0), "the follower keeps the forged decision"
    assert after["following"]["r0"]["seq"] < FORGED_SEQ
    if under == "no lease":  # never bound to the leader: never applied
        assert not any(d for _, d in seen)


def test_over_tls_with_least_rights_users_a_follower_only_appliance_never_leads(secure_fleet):
    """Both daemons on the secure cluster, each with its own etcd user and client
    certificate; b's user may not write leaders or decisions (fleet.lead = false).
    a leads, b follows; a killed, b controls on in fleet mode and never leads."""
    c, _dps, procs, _tmp = secure_fleet
    creds = {
        "a": c.add_user("a", appliance_grants("arr", "a", lead=True)),
        "b": c.add_user("b", appliance_grants("arr", "b", lead=False)),
    }
    socks = {"b": start(secure_fleet, "b", 1, creds["b"], lead=False)}
    time.sleep(1.0)  # b first: it could campaign, and does not
    socks["a"] = start(secure_fleet, "a", 0, creds["a"])
    (_sa, sb), took = until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    assert leader_of(socks["a"]) == "a" and sb["leading"] == []
    until(lambda: "r0" in fs(socks["b"])["following"], 10.0, "b follows a")
    print(f"\nTLS and users: both in fleet after {took:.2f} s; b follows a")
    procs["a"].kill()  # SIGKILL, our own child: its lease ends by itself
    procs["a"].wait(timeout=10)
    until(lambda: fs(socks["b"])["appliances"] == ["b"], 10.0, "a's lease gone")
    time.sleep(1.0)  # rounds in which b could campaign
    st = fs(socks["b"])
    assert st["mode"] == "fleet" and st["leaders"] == {} and st["leading"] == []
    assert st["counters"]["elections_won"] == 0 and st["counters"]["failures"] == 0, st


def _garbage(n: int) -> tuple[str, str]:
    """The n-th of 120 values no appliance wrote: (key under /santhrottle/arr/, value)."""
    bad_decisions = [
        "not json", "[1, 2]", '{"epoch": 4}', '{"epoch": 4, "appliance": "a", "payload": 7}',
        '{"epoch": "x", "appliance": "a", "payload": {}}', "null", '"text"',
        '{"epoch": 4, "appliance": "a", "payload": {"v": 2, "seq": 1, "class": 1, "members": {}}}',
        '{"epoch": 4, "appliance": "a", "payload": {"v": 1, "seq": -1, "class": 1, "members": {}}}',
        '{"epoch": 4, "appliance": "a", "payload": {"v": 1, "seq": 1, "class": 99999, '
        '"members": {"10.66.0.1": 99999}}}',
        '{"epoch": 4, "appliance": "a", "payload": {"v": 1, "seq": 1, "class": 1, '
        '"members": {"10.66.0.2": "x"}}}',
        '{"epoch": 4, "appliance": "a", "payload": {"v": 1, "seq": 999999999999, "class": 5, '
        '"members": {"10.66.0.3": 5}}}',
    ]  # fmt: skip
    bad_samples = ["{}", "[]", '{"tick": 1, "conv": null}', '{"tick": {"v": 1}, "conv": null}',
                   '{"tick": {"v": 1, "appliance": "g", "seq": 1, "at_s": 1, "reads": '
                   '[["r0", -5, 1e309, null, null]], "writes": [], "devices": [], "ios": []}, '
                   '"conv": null}', "\udcff\udcfe not UTF-8"]  # fmt: skip
    if n < 50:
        return "decisions/r0", bad_decisions[n % len(bad_decisions)]
    if n < 90:
        return f"samples/ghost{n}", bad_samples[n % len(bad_samples)]
    if n < 100:
        return f"appliances/ghost{n}", ["not json", "[]", "{}"][n % 3]
    if n < 110:
        return "leader/r0", ["ghost", "", '{"x": 1}'][n % 3]
    return [f"other/{n}", f"decisions/r0/deeper{n}", f"samples/{n}/x"][n % 3], "{}"


def test_120_garbage_payloads_in_etcd_are_refused_and_the_fleet_goes_on(fleet):
    """Values of every wrong shape put into etcd by hand under the array's prefix:
    the daemons skip and count them, never delay an address they name, and the
    fleet has one leader and a follower again once it stops."""
    c, dps, procs, tmp = fleet
    socks = {"a": start(fleet, "a", 0), "b": start(fleet, "b", 1)}
    until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    t0 = time.monotonic()
    for n in range(120):
        key, value = _garbage(n)
        c.etcdctl(2, "put", f"/santhrottle/arr/{key}", value)
    took = time.monotonic() - t0

    def settled():
        sa, sb = fs(socks["a"]), fs(socks["b"])
        lead = sa["leaders"].get("r0")
        if sa["mode"] != "fleet" or sb["mode"] != "fleet" or lead is None:
            return None
        if lead != sb["leaders"].get("r0") or lead["appliance"] not in ("a", "b"):
            return None
        other = "b" if lead["appliance"] == "a" else "a"
        return (sa, sb) if "r0" in fs(socks[other])["following"] else None

    (sa, sb), back = until(settled, 20.0, "one leader and its follower again")
    counted = {x: s["counters"]["bad_payloads"] + s["counters"]["unbound_decisions"]
               for x, s in (("a", sa), ("b", sb))}  # fmt: skip
    won = {x: s["counters"]["elections_won"] for x, s in (("a", sa), ("b", sb))}
    print(f"\n120 garbage payloads in {took:.1f} s; one leader and a follower {back:.2f} s "
          f"later; skipped and counted: {counted}; elections won: {won}")  # fmt: skip
    assert all(p.poll() is None for p in procs.values())
    assert sum(counted.values()) > 0
    for ns in dps:
        members = sh("ip", "netns", "exec", ns, "ipset", "list", "santhrottle-all").stdout
        assert "10.66." not in members, members
    for x in "ab":
        log = (tmp / x / "log").read_text()
        assert "Traceback" not in log, log[-3000:]


def test_an_etcd_outage_degrades_both_and_they_come_back(fleet):
    """Every etcd member killed under two daemons: both control alone (degraded)
    within the agent's bound; the members started again (their data kept), both
    are back in the fleet with one leader."""
    c = fleet[0]
    socks = {"a": start(fleet, "a", 0), "b": start(fleet, "b", 1)}
    until(lambda: both_in_fleet(socks["a"], socks["b"]), 20.0, "both in fleet")
    for i in range(3):
        c.stop(i)  # SIGKILL, our own children
    t0 = time.monotonic()
    until(lambda: all(fs(s)["mode"] == "degraded" for s in socks.values()), DEGRADE_BOUND_S + 2,
          "both degraded")  # fmt: skip
    degraded = time.monotonic() - t0
    for i in range(3):
        c.start(i)
    t1 = time.monotonic()

    def back():
        sa, sb = fs(socks["a"]), fs(socks["b"])
        lead = sa["leaders"].get("r0")
        ok = sa["mode"] == sb["mode"] == "fleet" and lead and lead == sb["leaders"].get("r0")
        return ok and (time.monotonic() - t1)

    took, _ = until(back, 30.0, "both back in the fleet")
    print(f"\netcd outage: both degraded {degraded:.2f} s after the kill; back in the fleet "
          f"{took:.2f} s after the members' start")  # fmt: skip
    assert degraded < DEGRADE_BOUND_S
