"""The data path's throttle curves: seconds per GB against the delay, one initiator. In the guest.

What it owns
    curve(datapath, ip, device, mode, rw, bs, qd, size, delays_ms): for each delay,
    the initiator put in the ladder's class at or above it (the product's Datapath),
    a short warm-up transfer (a sudden rise of the delay past about twice the
    connection's smoothed RTT makes the target send one spurious tail-loss probe
    while its RTT estimate catches up: counted apart, as `transition`), then `size`
    bytes moved once (or `repeat` times, in rounds over the delays, the fastest
    counting: on a shared host contention only adds time, and a starved stretch
    slows one round, not every run of a point); per point the seconds, s/GB, MB/s
    and the target's TCP counters (summed over the rounds).  fit(points): the line
    s/GB = a + b x delay (labkit.analysis.fit_line) and the retransmissions.  Shared
    by the lab tier's data path test and vagrant/experiments/datapath_lab.py.

Worked example
    pts = curve(d, "10.0.0.2", "/dev/sdb", "all", "write", "64k", 1, 32 << 20, (0, 10, 20))
    fit(pts) -> {"intercept_s_per_gb": 20.1, "slope_s_per_gb_per_ms": 18.6, "r2": 0.994,
                 "retrans": 0, ...}
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from labkit import fio, probes, topology
from labkit.analysis import fit_line

NETNS = topology.NETNS  # the target host's namespace ...
DEVICE = topology.VETH_TGT  # ... and its veth end facing the initiators
PORTS = (topology.ISCSI_PORT, topology.NVME_PORT)
GB = 1e9
WARMUP_SIZE = 1 << 20


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a}


def add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + v for k, v in b.items()}


def counters() -> dict[str, int]:
    """The target's TCP counters that tell retransmissions apart (absolute)."""
    return probes.nstat(NETNS)


@contextlib.contextmanager
def netns_sysctl(key: str, value: str, netns: str = NETNS) -> Iterator[None]:
    """Set a sysctl in the target's namespace for the block, then put it back."""
    ns = ["ip", "netns", "exec", netns, "sysctl"]
    old = " ".join(topology.sh([*ns, "-n", key]).split())
    topology.sh([*ns, "-qw", f"{key}={value}"])
    try:
        yield
    finally:
        topology.sh([*ns, "-qw", f"{key}={old}"])


def curve(
    d,
    ip: str,
    device: str,
    mode: str,
    rw: str,
    bs: str,
    qd: int,
    size: int,
    delays_ms,
    log: Callable[[str], None] = print,
    repeat: int = 1,
) -> list[dict]:
    """Seconds per GB at each delay for one initiator, and the target's retransmissions
    (module header); `d` is the product's Datapath on the target's veth."""
    # the repeats in rounds over the delays: a stretch of a starved host slows one
    # round's transfers, and each point's fastest is from another round
    points: list[dict] = []
    for r in range(repeat):
        for i, asked_ms in enumerate(delays_ms):
            k = d.spec.ladder.class_at_least(asked_ms / 1000)  # the ladder's delay at or above
            d.set_classes({ip: k}, mode=mode)
            c0 = counters()
            fio.once(device, rw, bs, qd, WARMUP_SIZE, offset=size)
            c1 = counters()
            secs = fio.once(device, rw, bs, qd, size)
            c2 = counters()
            if r == 0:
                points.append({"delay_ms": d.spec.delay_us(k) / 1000, "class": k, "runs_s": [],
                               "target_retrans": 0, "measured": {}, "transition": {}})  # fmt: skip
            p = points[i]
            p["runs_s"].append(secs)
            p["target_retrans"] += c2["TcpRetransSegs"] - c1["TcpRetransSegs"]
            p["measured"] = add(p["measured"], diff(c1, c2))
            p["transition"] = add(p["transition"], diff(c0, c1))
    d.set_classes({ip: 0})
    for p in points:
        secs = p["seconds"] = min(p["runs_s"])
        p["s_per_gb"] = secs / (size / GB)
        p["mb_s"] = size / secs / 1e6
        tr = p["transition"]
        log(
            f"  {mode:>4} {rw:>5} {bs} qd{qd} delay {p['delay_ms']:5.1f} ms: {p['mb_s']:7.2f} MB/s "
            f"{p['s_per_gb']:7.1f} s/GB (runs {', '.join(f'{x:.2f}' for x in p['runs_s'])} s), "
            f"target retrans {p['target_retrans']} "
            f"(class changes: {tr['TcpRetransSegs']} retrans, {tr['TcpExtTCPLossProbes']} TLP)"
        )
    return points


def fit(points: list[dict]) -> dict:
    """The line s/GB = a + b x delay over a curve's points, and its retransmissions: of
    the measured transfers, those the initiator reported as duplicates (D-SACK: nothing
    was lost) and the tail-loss probes; at the class changes, apart."""
    line = fit_line([(p["delay_ms"], p["s_per_gb"]) for p in points])
    assert line is not None, "a curve needs two points"
    return {
        "intercept_s_per_gb": line.c_s,
        "slope_s_per_gb_per_ms": line.m_s,
        "r2": line.r2,
        "retrans": sum(p["target_retrans"] for p in points),
        "dsack": sum(p["measured"]["TcpExtTCPDSACKRecv"] for p in points),
        "tlp": sum(p["measured"]["TcpExtTCPLossProbes"] for p in points),
        "transition_retrans": sum(p["transition"]["TcpRetransSegs"] for p in points),
        "transition_tlp": sum(p["transition"]["TcpExtTCPLossProbes"] for p in points),
    }
