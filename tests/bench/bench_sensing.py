"""Sensing cost: 1,000 block devices and 10,000 connections (goal <= 20 ms per pass).

Synthetic inputs in the kernel's own formats, in a temporary directory:
a /proc/diskstats with 1,000 dm devices (20 fields, as 6.1 prints them), a
sysfs tree of 1,000 LVM LVs in 100 VGs, 1,000 LIO TPGs with one LUN and
portal each (the objects LioSensor returns; the rtslib walk of a real
configfs tree is not in this figure), and 10,000 established connections
as sock_diag records, ten initiators per LUN. Beside it, the LIO scan of the lab's
captured configfs tree (tests/fixtures/lab) by a sensor kept from one second to the
next, as the daemon keeps it (lio_scan_ms_median: rtslib's walk at most every
FULL_WALK_EVERY_S, the sessions and counters read again in between).
Measured, per simulated second as the daemon runs it: the per-tick pass (read
diskstats, interval, per-resource read samples), then the convergence at the
same moment (LVM map with its rotating name check, sock_diag, discovery, write
samples from the tick's diskstats snapshot); the goal applies to their sum, the
full pass (median; the max is reported too).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from santhrottle.appliance.daemon.core.gcwatch import GcFreezer
from santhrottle.appliance.sensing.conns import ConnectionSensor, parse_diag_dump
from santhrottle.appliance.sensing.lio import LioLun, LioSensor, LioTpg
from santhrottle.appliance.sensing.target import TargetSensor

N_DEV = 1000
N_VG = 100
# BENCH_SENSING_CONNECTIONS=50000: issue 46's 50,000 live connections (several holder
# processes: one holds at most HOLDER_MAX_FDS sockets)
N_CONN = int(os.environ.get("BENCH_SENSING_CONNECTIONS", "10000"))
HOLDER_MAX_CONN = 15000
GOAL_MS = 20.0
TICK_S = 0.1
ROUNDS = 22  # 20 measured seconds: two rotations of the LVM name check


def _portal(t: int) -> str:
    return f"10.67.{t // 250}.{t % 250 + 1}"


def _peer(c: int) -> str:
    return f"10.68.{c // 250}.{c % 250 + 1}"


HOLDER = r"""
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n_dev, first, n_conn, role = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keep = []
if role == "server":  # one of several on the port (SO_REUSEPORT): it takes what comes
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    srv.bind(("0.0.0.0", 3260)); srv.listen(4096)
    print("listening", flush=True)
    while True:
        keep.append(srv.accept()[0])
else:
    for c in range(first, first + n_conn):
        t = c % n_dev
        s = socket.socket()
        s.bind((f"10.68.{c // 250}.{c % 250 + 1}", 0))
        s.connect((f"10.67.{t // 250}.{t % 250 + 1}", 3260))
        keep.append(s)
print("ready", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def _live_connections() -> Iterator[tuple[str | None, bool]]:
    """10,000 real connections into a "target" netns from a "clients" netns, both
    ours, joined by a veth pair; portal and client ranges are routed as local
    (AnyIP) on each side. Yields (the target netns, whether the clients have a TCP
    hash table of their own), or (None, False) when not root."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        yield None, False
        return
    tgt, cli, par = (f"st-b{x}-{os.getpid()}" for x in "tcp")
    procs: list[subprocess.Popen] = []
    made: list[str] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True)

    try:
        # The target's sockets in the host's global TCP hash table (262,144 buckets
        # here), as on a target host; the clients' in a table of their own, as if
        # on other machines (Linux 6.1+: tcp_child_ehash_entries of the netns the
        # client netns is created from, a parent netns of ours). Without it the
        # dump also steps over the clients' 10,000 sockets.
        ip("netns", "add", tgt)
        made.append(tgt)
        child_ehash = False
        if Path("/proc/sys/net/ipv4/tcp_child_ehash_entries").exists():
            ip("netns", "add", par)
            made.append(par)
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    par,
                    "sysctl",
                    "-qw",
                    "net.ipv4.tcp_child_ehash_entries=16384",
                ],
                check=True,
            )
            subprocess.run(
                ["nsenter", f"--net=/run/netns/{par}", "ip", "netns", "add", cli], check=True
            )
            child_ehash = True
        else:
            ip("netns", "add", cli)
        made.append(cli)
        for ns in (tgt, cli):
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", tgt, "link", "add", "st-bv0", "type", "veth", "peer", "st-bv1", "netns", cli)
        ip("-n", tgt, "addr", "add", "10.66.0.1/24", "dev", "st-bv0")
        ip("-n", cli, "addr", "add", "10.66.0.2/24", "dev", "st-bv1")
        ip("-n", tgt, "link", "set", "st-bv0", "up")
        ip("-n", cli, "link", "set", "st-bv1", "up")
        ip("-n", tgt, "route", "add", "local", "10.67.0.0/16", "dev", "lo")
        ip("-n", tgt, "route", "add", "10.68.0.0/16", "via", "10.66.0.2")
        ip("-n", cli, "route", "add", "local", "10.68.0.0/16", "dev", "lo")
        ip("-n", cli, "route", "add", "10.67.0.0/16", "via", "10.66.0.1")
        holders = -(-N_CONN // HOLDER_MAX_CONN)  # enough processes for the sockets
        share = -(-N_CONN // holders)
        jobs = [(tgt, "server", 0, 0)] * (holders + 1) + [
            (cli, "client", k * share, min(share, N_CONN - k * share)) for k in range(holders)
        ]
        for ns, role, first, count in jobs:
            cmd = [sys.executable, "-c", HOLDER, str(N_DEV), str(first), str(count), role]
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, *cmd], stdout=subprocess.PIPE, text=True
            )
            procs.append(p)
            assert p.stdout is not None
            p.stdout.readline()  # listening / ready (the clients: all connected)
        time.sleep(1.0 + N_CONN / 20000)  # the servers take the last ones from their queues
        yield tgt, child_ehash
    finally:
        for p in procs:
            p.kill()  # our own children, by PID
            p.wait()
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], check=False)


class _Static:
    last_skipped: tuple[str, ...] = ()

    def __init__(self, tpgs: list[LioTpg]) -> None:
        self.tpgs = tpgs

    def scan(self) -> list[LioTpg]:
        return self.tpgs


class _Conns:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def connections(self) -> Any:
        return parse_diag_dump(self.records, (3260, 4420))


def _diskstats(k: int) -> str:
    lines = []
    for i in range(N_DEV):
        r = 1000 * k + i
        lines.append(
            f" 253 {i} dm-{i} {r} 0 {r * 8} {r * 2} {r} 0 {r * 128} {r * 3} 0 {r} {r * 5}"
            " 0 0 0 0 0 0"
        )
    return "\n".join(lines) + "\n"


def bench_sensing() -> dict[str, Any]:
    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(N_DEV):
            d = root / "sys" / "block" / f"dm-{i}"
            (d / "dm").mkdir(parents=True)
            (d / "dm" / "name").write_text(f"vg{i % N_VG}-lv{i}\n")
            (d / "dm" / "uuid").write_text(f"LVM-{i:064d}\n")
            (d / "dev").write_text(f"253:{i}\n")
            (d / "slaves").mkdir()
        proc = root / "proc"
        proc.mkdir()
        # one target (TPG, portal, LUN) per LV, each shared by 10 initiators (clusters)
        tpgs = [
            LioTpg(
                "iscsi",
                f"iqn.2003-01.org.b:t{t}",
                1,
                True,
                True,
                ((_portal(t), 3260),),
                (LioLun(0, f"block/lv{t}", f"/dev/vg{t % N_VG}/lv{t}"),),
                (),
            )
            for t in range(N_DEV)
        ]
        records = [
            {
                "idiag_src": _portal(c % N_DEV),
                "idiag_sport": 3260,
                "idiag_dst": _peer(c),
                "idiag_dport": 30000 + rng.randrange(30000),
                "idiag_state": 1,
            }
            for c in range(N_CONN)
        ]
        with _live_connections() as (netns, child_ehash):
            r = _measure(root, proc, tpgs, records, netns)
            r["clients_own_tcp_hash"] = child_ehash
        lio = _lio_scan_ms(root)
        r["lio_scan_ms_median"] = lio
        r["summary"] += f"; the lab's LIO tree, kept sensor: {lio:.3f} ms a scan (median)"
        return r


LAB_CONFIGFS = Path(__file__).parents[1] / "fixtures" / "lab" / "configfs"
LIO_SCANS = 200


def _lio_scan_ms(tmp: Path) -> float:
    """The median CPU of one scan of a copy of the lab's configfs tree, 200 scans in a
    row by one sensor (the daemon's: one a convergence)."""
    tree = tmp / "configfs"
    shutil.copytree(LAB_CONFIGFS, tree, symlinks=True)
    for rel in json.loads((LAB_CONFIGFS.parent / "empty_dirs.json").read_text()):
        if rel.startswith("configfs/"):  # those git does not keep (tests/conftest.py)
            (tree.parent / rel).mkdir(parents=True, exist_ok=True)
    sensor = LioSensor(tree)
    times = []
    for _ in range(LIO_SCANS):
        t0 = time.process_time()
        sensor.scan()
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times)


def _measure(root: Path, proc: Path, tpgs: list[LioTpg], records: list, netns: str | None) -> dict:
    now = [0.0]
    s = TargetSensor(
        proc_root=proc,
        sys_root=root / "sys",
        clock=lambda: now[0],
        connections=ConnectionSensor([3260], netns) if netns else _Conns(records),  # type: ignore[arg-type]
        snapshot_reuse_s=TICK_S,  # as santhrottled builds it
    )
    s.lio = _Static(tpgs)  # type: ignore[assignment]
    tick_ms: list[float] = []
    conv_ms: list[float] = []
    samples = 0
    gcf = GcFreezer()
    for k in range(ROUNDS):
        # a second of the daemon: the tick, then the convergence at the same moment
        (proc / "diskstats").write_text(_diskstats(k))
        now[0] = float(k)
        t0 = time.perf_counter()
        reads = s.read_samples()
        t1 = time.perf_counter()
        disc, writes = s.converge()
        t2 = time.perf_counter()
        gcf.after_convergence(s.discoveries)  # what santhrottled does after each convergence
        if k >= 2:
            tick_ms.append((t1 - t0) * 1000)
            conv_ms.append((t2 - t1) * 1000)
            samples = len(reads), len(writes)
    assert disc is not None
    tick = statistics.median(tick_ms)
    conv = statistics.median(conv_ms)
    full = [a + b for a, b in zip(tick_ms, conv_ms, strict=True)]
    full_med, full_max = statistics.median(full), max(full)
    return {
        "name": "sensing pass, 1,000 devices x 10,000 connections",
        "tick_ms_median": tick,
        "converge_ms_median": conv,
        "full_pass_ms_median": full_med,
        "full_pass_ms_max": full_max,
        "rounds": len(full),
        "lvm_full_scans": s.lvm.full_scans,
        "initiators": len(disc.initiators),
        "read_samples": samples[0],
        "write_samples": samples[1],
        "goal_ms": GOAL_MS,
        "met": full_med <= GOAL_MS,
        "connections": "live sock_diag in a netns" if netns else "synthetic records",
        "summary": f"full pass {full_med:.2f} ms (max {full_max:.1f} ms over {len(full)} "
        f"seconds) = per-tick pass (diskstats, {samples[0]} resources) {tick:.2f} ms + "
        f"convergence (sysfs, {len(disc.initiators)} initiators over "
        f"{'live sock_diag, 10,000 conns' if netns else 'synthetic sock_diag records'}, "
        f"discovery, {samples[1]} write samples) {conv:.2f} ms (medians)",
    }
