"""Measuring in the lab guest: fio runs, the target's TCP counters, throttle curves.

Shared by the lab tier's data path tests (tests/lab/test_datapath_lab.py)
and the on-demand experiments (vagrant/experiments/datapath_lab.py).  Runs in
the guest (vagrant/qemu/lab.py), where vagrant/qemu/guest/topology.py built
the storage topology: the target in network namespace NETNS, its veth end
DEVICE facing the initiators.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
TOPOLOGY_PY = CHECKOUT / "vagrant" / "qemu" / "guest" / "topology.py"

NETNS = "tgt"  # topology.py: the target host's namespace ...
DEVICE = "lab-tgt"  # ... and its veth end facing the initiators
PORTS = (3260, 4420)
GB = 1e9
WARMUP_SIZE = 1 << 20


def load_topology():
    """vagrant/qemu/guest/topology.py as a module, loaded once."""
    mod = sys.modules.get("santhrottle_lab_topology")
    if mod is None:
        spec = importlib.util.spec_from_file_location("santhrottle_lab_topology", TOPOLOGY_PY)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["santhrottle_lab_topology"] = mod
        spec.loader.exec_module(mod)
    return mod


def diskstats() -> dict[str, list[int]]:
    """/proc/diskstats: each block device's counters (reads completed first)."""
    out = {}
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        out[f[2]] = [int(x) for x in f[3:]]
    return out


def sh(cmd, check=True, timeout=300, input=None) -> str:
    """topology.sh (stdout and stderr together; an error names the command),
    with this file's longer default timeout for fio runs."""
    return load_topology().sh([str(c) for c in cmd], input=input, check=check, timeout=timeout)


@contextlib.contextmanager
def netns_sysctl(key: str, value: str, netns: str = NETNS):
    """Set a sysctl in the target's namespace for the block, then put it back."""
    ns = ["ip", "netns", "exec", netns, "sysctl"]
    old = " ".join(sh([*ns, "-n", key]).split())
    sh([*ns, "-qw", f"{key}={value}"])
    try:
        yield
    finally:
        sh([*ns, "-qw", f"{key}={old}"])


TCP_COUNTERS = (
    "TcpRetransSegs",
    "TcpExtTCPLossProbes",
    "TcpExtTCPSpuriousRTOs",
    "TcpExtTCPDSACKRecv",
    "TcpExtTCPSACKReorder",
    "TcpExtTCPTSReorder",
    "TcpExtTCPFastRetrans",
    "TcpExtTCPSlowStartRetrans",
    "TcpExtTCPTimeouts",
)


def tcp_counters(netns: str = NETNS) -> dict[str, int]:
    """The target's TCP counters that tell retransmissions apart (absolute)."""
    out = dict.fromkeys(TCP_COUNTERS, 0)
    for line in sh(["ip", "netns", "exec", netns, "nstat", "-saz"]).splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in out:
            out[parts[0]] = int(parts[1])
    return out


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a}


def fio_once(device: str, rw: str, bs: str, qd: int, size: int, offset: int = 0) -> float:
    """Move `size` bytes with fio (direct, libaio); returns the seconds it took."""
    out = sh(
        [
            "fio", "--output-format=json", "--name=dp", f"--filename={device}", "--direct=1",
            "--ioengine=libaio", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
            f"--size={size}", f"--offset={offset}", "--verify_state_save=0",
        ],
        timeout=600,
    )  # fmt: skip
    job = json.loads(out[out.index("{") :])["jobs"][0]
    side = job["read" if rw == "read" else "write"]
    if job["error"] or side["io_bytes"] != size:
        raise RuntimeError(f"fio {rw} {bs} qd{qd}: error {job['error']}, {side['io_bytes']} bytes")
    return side["runtime"] / 1000.0  # ms of the job's own clock


def linear_fit(xs, ys) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, R^2)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, (1.0 - ss_res / ss_tot) if ss_tot else 1.0


def curve(
    d, ip, device, mode, rw, bs, qd, size, delays_ms, log=print, repeat: int = 1
) -> list[dict]:
    """Seconds per GB at each delay for one initiator, and the target's
    retransmissions.  After each class change a short warm-up transfer runs
    first: a sudden delay increase of more than about twice the connection's
    smoothed RTT makes the target send one spurious tail-loss probe (counted
    in TcpRetransSegs) while its RTT estimate catches up; that transition is
    recorded separately (`transition`) from the measured transfers.  With
    repeat > 1 the point is the fastest of the runs: on a shared host,
    contention only ever adds time."""
    points = []
    for asked_ms in delays_ms:
        k = d.spec.ladder.class_at_least(asked_ms / 1000)  # the ladder's delay at or above
        ms = d.spec.delay_us(k) / 1000
        d.set_classes({ip: k}, mode=mode)
        c0 = tcp_counters()
        fio_once(device, rw, bs, qd, WARMUP_SIZE, offset=size)
        c1 = tcp_counters()
        runs = [fio_once(device, rw, bs, qd, size) for _ in range(repeat)]
        c2 = tcp_counters()
        secs = min(runs)
        p = {
            "delay_ms": ms,
            "class": k,
            "seconds": secs,
            "runs_s": runs,
            "s_per_gb": secs / (size / GB),
            "mb_s": size / secs / 1e6,
            "target_retrans": c2["TcpRetransSegs"] - c1["TcpRetransSegs"],
            "measured": diff(c1, c2),
            "transition": diff(c0, c1),
        }
        points.append(p)
        tr = p["transition"]
        log(
            f"  {mode:>4} {rw:>5} {bs} qd{qd} delay {ms:5.1f} ms: {p['mb_s']:7.2f} MB/s "
            f"{p['s_per_gb']:7.1f} s/GB (runs {', '.join(f'{x:.2f}' for x in runs)} s), "
            f"target retrans {p['target_retrans']} "
            f"(class change: {tr['TcpRetransSegs']} retrans, {tr['TcpExtTCPLossProbes']} TLP)"
        )
    d.set_classes({ip: 0})
    return points


def summarize(points: list[dict]) -> dict:
    xs = [p["delay_ms"] for p in points]
    ys = [p["s_per_gb"] for p in points]
    a, b, r2 = linear_fit(xs, ys)
    return {
        "intercept_s_per_gb": a,
        "slope_s_per_gb_per_ms": b,
        "r2": r2,
        "retrans": sum(p["target_retrans"] for p in points),
        # of the measured transfers: retransmissions the initiator reported as
        # duplicates (D-SACK: spurious, nothing was lost) and tail-loss probes
        "dsack": sum(p["measured"]["TcpExtTCPDSACKRecv"] for p in points),
        "tlp": sum(p["measured"]["TcpExtTCPLossProbes"] for p in points),
        "transition_retrans": sum(p["transition"]["TcpRetransSegs"] for p in points),
        "transition_tlp": sum(p["transition"]["TcpExtTCPLossProbes"] for p in points),
    }
