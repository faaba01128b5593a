"""What a phase measured, from its samples: windows, LQ fits, the phase's summary. Pure.

What it owns
    The definitions every experiment's figures rest on, once (docs/lab.md, "What a
    run must show"), over a phase as labkit.sampler records it: `rows`, each
    {"t": s from the phase's start, "ds": {device: diskstats counters}, and what
    the other probes read ("status", "retrans", ...)}, and `events` [(t, what)]
    ("reader on", "settle", "writers on", "writers off", "reader off").

    window     per sample b: from the last sample a at least WINDOW_S before it,
               the reader's mean read latency (read ticks / reads completed, None
               without reads), the writers' bytes written per second and the
               array's mean queue (weighted IO time / interval, Little's law).  A
               window across a stall of the sampler is as long as the stall.
    latencies  the windows from the end of the learning burst (the first
               on-period; a phase that marks "settle" counts from its mark) to
               the reader's departure ("reader off").
    writes     the mean of the windows that lie wholly inside an on-period,
               each on-period counted from its first write (under TCG a writer
               host's fio starts 9-22 s after its mark) to the writers' end.
    LQ line    least squares L = C + m x Q over points (fit_line), and over a
               phase's windows: the reader's latency against the array's Q
               (fit_lq).
    summary    summarize(): p50/p95/p99, the time above T and where it was
               (over_threshold: each run of windows over T), the writes, the
               writers' start, the target's TCP counters, the retransmissions
               per connection, the classes, the release, the CPU shares; and
               over the same span, where the phase kept them, the p50/p95 and
               time above T of what the initiator saw (fio's 1 s means of the
               reader's completion latency, "reader_clat") and of what the
               daemon's sensor measured (sensor_windows: in bridge mode the
               wire's).

    The diskstats counters are the product's (santhrottle.appliance.sensing.
    diskstats.DevCounters from `reads` on, as labkit.probes records them); runs
    recorded before the kit kept all of /proc/diskstats' fields from there, whose
    first eleven are the same.

Worked example
    rows at t = 0.0 and 1.0 with the reader's (reads, read ms) (100, 400) then
    (200, 800): windows() -> [Window(t=1.0, read_latency_s=0.004, write_bps=0.0,
    array_q=..., span_s=1.0)]; fit_line([(0, 2e-3), (1, 7e-3), (2, 12e-3)]) ->
    Fit(c_s=0.002, m_s=0.005, r2=1.0, points=3).
"""

from __future__ import annotations

import bisect
import math
import os
from typing import Any, NamedTuple

from santhrottle.appliance.sensing.diskstats import SECTOR_BYTES, DevCounters
from santhrottle.sim.measure import percentile as percentile

# The reader's latency, the writes and the array's queue over windows of at least 1 s.
WINDOW_S = 1.0
# Positions in a sample's diskstats counters: DevCounters' fields from `reads` on.
_FIRST = DevCounters._fields.index("reads")
READS = DevCounters._fields.index("reads") - _FIRST
READ_TICKS = DevCounters._fields.index("read_ticks_ms") - _FIRST
WRITES = DevCounters._fields.index("writes") - _FIRST
WRITE_SECTORS = DevCounters._fields.index("write_sectors") - _FIRST
WEIGHTED_MS = DevCounters._fields.index("weighted_ms") - _FIRST
RELEASE_FRACTION = 0.9  # the writers are back at 90 % of their uncontrolled throughput


class Window(NamedTuple):
    t: float
    read_latency_s: float | None
    write_bps: float
    array_q: float
    span_s: float


class Fit(NamedTuple):
    """L = c_s + m_s x Q, least squares."""

    c_s: float
    m_s: float
    r2: float
    points: int


def events(ph: dict, name: str) -> list[float]:
    return [t for t, e in ph["events"] if e == name]


def windows(
    rows: list[dict], reader: str, writers: list[str], array: str | None, span_s: float = WINDOW_S
) -> list[Window]:
    """One window per sample that has one at least span_s before it (module header)."""
    ts = [r["t"] for r in rows]
    out = []
    for b in rows:
        j = bisect.bisect_right(ts, b["t"] - span_s) - 1
        if j < 0:
            continue
        a = rows[j]
        dt = b["t"] - a["t"]
        if dt <= 0 or reader not in a["ds"] or reader not in b["ds"]:
            continue
        ra, rb = a["ds"][reader], b["ds"][reader]
        n = rb[READS] - ra[READS]
        lat = (rb[READ_TICKS] - ra[READ_TICKS]) / 1000 / n if n else None
        wr = (
            sum(b["ds"][d][WRITE_SECTORS] - a["ds"][d][WRITE_SECTORS] for d in writers)
            * SECTOR_BYTES
            / dt
        )
        q = (
            (b["ds"][array][WEIGHTED_MS] - a["ds"][array][WEIGHTED_MS]) / 1000 / dt
            if array
            else 0.0
        )
        out.append(Window(b["t"], lat, wr, q, dt))
    return out


def phase_windows(ph: dict, reader: str | None = None) -> list[Window]:
    """A recorded phase's windows: its reader's (or `reader`'s), its writers', its array's."""
    return windows(ph["rows"], reader or ph["reader_dm"], ph["writer_dms"], ph.get("array"))


def fit_line(pts: list[tuple[float, float | None]]) -> Fit | None:
    """Least squares L = C + m Q over (Q, L) points (None: left out); None under 2 points."""
    pts = [(q, v) for q, v in pts if v is not None]
    n = len(pts)
    if n < 2:
        return None
    mq = sum(q for q, _ in pts) / n
    ml = sum(v for _, v in pts) / n
    sqq = sum((q - mq) ** 2 for q, _ in pts)
    sql = sum((q - mq) * (v - ml) for q, v in pts)
    m = sql / sqq if sqq else 0.0
    c = ml - m * mq
    ss_res = sum((v - c - m * q) ** 2 for q, v in pts)
    ss_tot = sum((v - ml) ** 2 for _, v in pts)
    return Fit(c, m, 1 - ss_res / ss_tot if ss_tot else 0.0, n)


def fit_lq(ph: dict) -> Fit | None:
    """The LQ line of a phase's 1 s windows: the reader's latency against the array's Q."""
    return fit_line([(w.array_q, w.read_latency_s) for w in phase_windows(ph)])


def device_delta(d0: list[int], d1: list[int], dt: float) -> dict:
    """One device between two samples: reads, writes, IOs, Q (weighted IO time /
    interval), L (weighted IO time / IOs, Little's law), the reads' latency, IOPS and
    write MB/s."""
    dd = [b - a for a, b in zip(d0, d1, strict=False)]
    reads, writes = dd[READS], dd[WRITES]
    ios = reads + writes
    weighted_ms = dd[WEIGHTED_MS]
    return {
        "reads": reads,
        "writes": writes,
        "ios": ios,
        "q": weighted_ms / 1000 / dt,
        "l_s": weighted_ms / 1000 / ios if ios else None,
        "read_l_s": dd[READ_TICKS] / 1000 / reads if reads else None,
        "iops": ios / dt,
        "write_mb_s": dd[WRITE_SECTORS] * SECTOR_BYTES / dt / 1e6,
    }


def plant_delta(s0: dict | None, s1: dict | None) -> dict | None:
    """The known plant between two readings of its own counters (labkit.probes.
    plant_stats): its Q (the integral of the IOs in flight / interval), its L (the
    IOs' latency there), the queue each IO was charged for, IOPS; None without two."""
    if not s0 or not s1 or s1["t"] <= s0["t"]:
        return None
    dt = s1["t"] - s0["t"]
    ios = s1["ios"] - s0["ios"]
    return {
        "q": (s1["inflight_s"] - s0["inflight_s"]) / dt,
        "l_s": (s1["lat_sum_s"] - s0["lat_sum_s"]) / ios if ios else None,
        "n_arrival": (s1["n_arrival_sum"] - s0["n_arrival_sum"]) / ios if ios else None,
        "iops": ios / dt,
        "interval_s": dt,
    }


# --------------------------------------------------------------------- a phase
def classes(ph: dict) -> list[tuple[float, int]]:
    """(t, the highest class any initiator had) from the daemon's status samples."""
    out = []
    for r in ph["rows"]:
        st = r.get("status")
        if st is not None:
            out.append((r["t"], max(st["initiators"].values(), default=0)))
    return out


def futile_releases(ph: dict) -> list[tuple[float, int]]:
    """(t, the futile-delay releases of the first resource so far) from the daemon's
    status samples that keep them (controller/futile.py); [] for older runs."""
    out = []
    for r in ph["rows"]:
        res = ((r.get("status") or {}).get("resources") or [{}])[0]
        if res.get("futile_releases") is not None:
            out.append((r["t"], res["futile_releases"]))
    return out


def members(ph: dict) -> list[tuple[float, int]]:
    """(t, write-heavy members of the resource) from the daemon's status (0 without)."""
    out = []
    for r in ph["rows"]:
        st = r.get("status")
        if st is not None:
            ms_ = [len(x.get("members") or []) for x in st["resources"]]
            out.append((r["t"], max(ms_, default=0)))
    return out


def conn_retrans(conns: list[dict[str, str]]) -> dict[str, int]:
    """Initiator IP -> retransmissions of its storage connections so far (ss's
    `retrans:out/total`; absent: 0)."""
    out: dict[str, int] = {}
    for c in conns:
        ip = c["peer"].rsplit(":", 1)[0].strip("[]")  # ss: "[fd00:5374::5]:51234"
        out[ip] = out.get(ip, 0) + int(c.get("retrans", "0/0").split("/")[1])
    return out


def retrans_split(ph: dict) -> tuple[dict[str, int] | None, list[dict]]:
    """Per initiator IP, the retransmissions of its connection in this phase (ss at the
    phase's start and end); and each writer retransmission found in the samples: `t`,
    the sample that saw it, `after_s`, the one before, `until_s`, when the read of the
    sample that saw it ended (it happened after after_s and before until_s: ss reads
    after its row's t, seconds after under TCG; t where the read was not stamped);
    `classes`, the writer's class at each status sample from the last one up to
    after_s to t, [when its read ended (its t if not stamped), class]; `classes_before`,
    the classes of the status samples among the 16 samples up to t (the figure the
    reports before the kit printed; under TCG the status probe takes seconds, and these
    span several)."""
    if "tcp_conns_start" not in ph:  # runs before the per-connection record
        return None, []
    t0, t1 = conn_retrans(ph["tcp_conns_start"]), conn_retrans(ph["tcp_conns"])
    per_ip = {ip: t1[ip] - t0.get(ip, 0) for ip in t1}
    found = []
    prev: dict[str, int] | None = None
    prev_t = 0.0
    for i, r in enumerate(ph["rows"]):
        cur = r.get("retrans")
        if cur is None:
            continue
        for ip in ph["writer_ips"]:
            if prev is not None and cur.get(ip, 0) > prev.get(ip, 0):
                seen = [
                    x["status"]["initiators"].get(ip, 0)
                    for x in ph["rows"][max(0, i - 15) : i + 1]
                    if "status" in x
                ]
                status = [
                    (x["t"], [x.get("status_t", x["t"]), x["status"]["initiators"].get(ip, 0)])
                    for x in ph["rows"][: i + 1]
                    if "status" in x
                ]
                first = max((j for j, (t, _) in enumerate(status) if t <= prev_t), default=0)
                found.append(
                    {
                        "t": r["t"],
                        "initiator": ip,
                        "n": cur[ip] - prev.get(ip, 0),
                        "after_s": prev_t,
                        "until_s": r.get("retrans_t", r["t"]),
                        "classes": [c for _, c in status[first:]],
                        "classes_before": seen,
                    }
                )
        prev, prev_t = cur, r["t"]
    return per_ip, found


def writing_starts(ph: dict, w: list[Window]) -> tuple[list[float], list[float]]:
    """Each on-period's first write (its end when none) and its end (inf: never ended)."""
    on, off = events(ph, "writers on"), events(ph, "writers off")
    off = off + [math.inf] * (len(on) - len(off))  # writers never stopped: on to the end
    starts = [
        next((x.t for x in w if a < x.t < b and x.write_bps > 0.0), b)
        for a, b in zip(on, off, strict=False)
    ]
    return starts, off


def settle_time(ph: dict) -> float:
    """Where a phase's figures start: its "settle" mark, else the end of the learning
    burst (the first on-period), else its start."""
    return (events(ph, "settle") or events(ph, "writers off")[:1] or [0.0])[0]


def summarize(ph: dict, threshold_s: float | None, uncontrolled_wr: float | None) -> dict:
    """A phase's figures (module header); threshold_s: the time above it, the classes and
    the release; uncontrolled_wr: the release's throughput back to 90 % of it."""
    w = phase_windows(ph)
    settle = settle_time(ph)
    reader_off = (events(ph, "reader off") or [math.inf])[0]
    lat = [
        x.read_latency_s for x in w if settle <= x.t < reader_off and x.read_latency_s is not None
    ]
    starts, _ = writing_starts(ph, w)
    on = events(ph, "writers on")
    writing = [x.write_bps for x in writing_windows(ph)]
    per_ip, found = retrans_split(ph)
    nst = ph["nstat"]
    out: dict[str, Any] = {
        "threshold_s": threshold_s,
        "windows": len(lat),
        "read_latency_p50_s": percentile(lat, 50),
        "read_latency_p95_s": percentile(lat, 95),
        "read_latency_p99_s": percentile(lat, 99),
        "write_bytes_per_s": sum(writing) / len(writing) if writing else 0.0,
        # seconds from each "writers on" mark to the first write (fio's start)
        "writers_start_s": [round(x - a, 1) for a, x in zip(on, starts, strict=False)],
        "target_retrans_segs": nst.get("TcpRetransSegs", 0),
        "target_loss_probes": nst.get("TcpExtTCPLossProbes", 0),
        "target_fast_retrans": nst.get("TcpExtTCPFastRetrans", 0),
        "target_timeouts": nst.get("TcpExtTCPTimeouts", 0),
        # retransmissions the initiators already had (their DSACKs): spurious
        "target_dsack_recv": nst.get("TcpExtTCPDSACKRecv", 0),
        # timers that found their segment still in the qdisc (None: not recorded)
        "target_held_in_qdisc": nst.get("TcpExtTCPSpuriousRtxHostQueues"),
        "target_sack_reorder": nst.get("TcpExtTCPSACKReorder", 0),
        "min_rtt_ms": sorted(float(c["minrtt"]) for c in ph.get("tcp_conns", []) if "minrtt" in c),
        "retrans_by_initiator": per_ip,
        # the writers' connections are the ones santhrottle delays; the reader's never
        "target_retrans_writers": None
        if per_ip is None
        else sum(per_ip.get(ip, 0) for ip in ph["writer_ips"]),
        "target_retrans_others": None
        if per_ip is None
        else sum(n for ip, n in per_ip.items() if ip not in ph["writer_ips"]),
        "writer_retrans_events": found,
        # closed_loop.py --capture: the order the packets to the writers left the qdisc
        "capture": ph.get("capture"),
        "sets_left_after_stop": ph["sets_left_after_stop"],
    }
    # what the initiator saw (fio's 1 s means) and, with a daemon, what its sensor
    # measured (in bridge mode the wire), over the same span as the array's windows
    seen = {
        "reader_clat": [v for t, v in ph.get("reader_clat") or [] if settle <= t < reader_off],
        "sensor": [v for t, v in sensor_windows(ph) if settle <= t < reader_off and v is not None],
    }
    for key, vals in seen.items():
        if vals:
            out[f"{key}_windows"] = len(vals)
            out[f"{key}_p50_s"] = percentile(vals, 50)
            out[f"{key}_p95_s"] = percentile(vals, 95)
            if threshold_s is not None:
                out[f"{key}_above_threshold_pct"] = (
                    100.0 * sum(1 for v in vals if v > threshold_s) / len(vals)
                )
    if threshold_s is not None:
        out["time_above_threshold_pct"] = (
            100.0 * sum(1 for v in lat if v > threshold_s) / len(lat) if lat else math.nan
        )
        cl = classes(ph)
        out["max_delay_class"] = max((c for _, c in cl), default=0)
        out["over_threshold"] = over_threshold(ph, threshold_s)
        last = next((r["status"] for r in reversed(ph["rows"]) if "status" in r), {})
        # initiators' descents in order (glide leaves) and without (all leaves busy)
        out["glided_descents"] = last.get("glided", 0)
        out["unordered_descents"] = last.get("unordered", 0)
        if math.isfinite(reader_off):
            zero = next((t for t, c in cl if t > reader_off and c == 0), None)
            out["release_class_zero_after_s"] = None if zero is None else zero - reader_off
            if uncontrolled_wr:
                back = next(
                    (
                        x.t
                        for x in w
                        if x.t > reader_off + 1.0
                        and x.write_bps >= RELEASE_FRACTION * uncontrolled_wr
                    ),
                    None,
                )
                out["release_throughput_back_after_s"] = None if back is None else back - reader_off
    out.update(cpu_shares(ph.get("cpu")))
    return out


# A futile release (controller/futile.py) takes the class down a class a tick: from
# the top of the ladder that is 9 s before the reader is over T again.
FUTILE_LOOKBACK_S = 10.0


def over_threshold(ph: dict, threshold_s: float) -> list[dict]:
    """Where summarize()'s latencies went over threshold_s: each run of windows over it
    as {"from_s", "to_s" (their ends), "peak_s", "into_burst_s" (seconds from the
    on-period's first write, None in a pause), "classes" [least, most] (the status
    samples from a second before it to its end; None without one), "futile" (the
    futile-delay releases from FUTILE_LOOKBACK_S before it to its end: a release lets
    the class down a class a tick first; None where the samples do not keep them)}."""
    w = phase_windows(ph)
    settle = settle_time(ph)
    reader_off = (events(ph, "reader off") or [math.inf])[0]
    starts, off = writing_starts(ph, w)
    cl = classes(ph)
    fut = futile_releases(ph)
    runs: list[list[Window]] = []
    last_over = False
    for x in w:
        if not settle <= x.t < reader_off or x.read_latency_s is None:
            continue
        over = x.read_latency_s > threshold_s
        if over and last_over:
            runs[-1].append(x)
        elif over:
            runs.append([x])
        last_over = over
    out = []
    for r in runs:
        a, b = r[0].t, r[-1].t
        into = [a - s for s, e in zip(starts, off, strict=False) if s <= a < e]
        ks = [k for t, k in cl if a - WINDOW_S <= t <= b]
        before = [n for t, n in fut if t < a - FUTILE_LOOKBACK_S]
        during = [n for t, n in fut if t <= b]
        out.append(
            {
                "from_s": a,
                "to_s": b,
                "peak_s": max(x.read_latency_s or 0.0 for x in r),
                "into_burst_s": into[0] if into else None,
                "classes": [min(ks), max(ks)] if ks else None,
                "futile": (during[-1] - (before[-1] if before else 0)) if during else None,
            }
        )
    return out


def sensor_windows(ph: dict, span_s: float = WINDOW_S) -> list[tuple[float, float | None]]:
    """Per status sample, from the last one at least span_s before it: the mean read
    latency the daemon's sensor measured for its first resource (its reads_completed
    and read_time_s totals; in bridge mode the wire's), None without reads; [] for runs
    from before the totals were kept."""
    rows = []
    for r in ph["rows"]:
        res = (r.get("status") or {}).get("resources") or [{}]
        if res[0].get("reads_completed") is not None and res[0].get("read_time_s") is not None:
            rows.append((r["t"], res[0]["reads_completed"], res[0]["read_time_s"]))
    ts = [t for t, _, _ in rows]
    out: list[tuple[float, float | None]] = []
    for t, n, s in rows:
        j = bisect.bisect_right(ts, t - span_s) - 1
        if j < 0:
            continue
        _, n0, s0 = rows[j]
        out.append((t, (s - s0) / (n - n0) if n > n0 else None))
    return out


def writing_windows(ph: dict) -> list[Window]:
    """The windows summarize() counts the writes over: after the learning burst, wholly
    inside an on-period from its first write, before the reader left."""
    w = phase_windows(ph)
    starts, off = writing_starts(ph, w)
    settle = settle_time(ph)
    reader_off = (events(ph, "reader off") or [math.inf])[0]
    return [
        x
        for x in w
        if settle <= x.t < reader_off
        and any(a <= x.t - 1.0 and x.t < b for a, b in zip(starts, off, strict=False))
    ]


def writing_class(ph: dict) -> int:
    """The median class the controller gave the writers while they wrote (each
    on-period from its first write, as summarize counts writes) and the reader was
    there, after the learning burst; 1 without any: where a static search starts."""
    w = phase_windows(ph)
    starts, off = writing_starts(ph, w)
    settle = settle_time(ph)
    reader_off = (events(ph, "reader off") or [math.inf])[0]
    ks = []
    for r in ph["rows"]:
        st, t = r.get("status"), r["t"]
        if st is None or not settle <= t < reader_off:
            continue
        if any(a <= t < b for a, b in zip(starts, off, strict=False)):
            ks += [st["initiators"].get(ip, 0) for ip in ph["writer_ips"]]
    return sorted(ks)[len(ks) // 2] if ks else 1


def cpu_shares(cpu: dict | None) -> dict:
    """Of the guest's CPU over the phase (its "cpu" record): the daemon's share and its
    tick loop's, the sampler's in the daemon's status probe (its client side; the
    daemon's side is in the daemon's), and the guest's idle share ({} for runs from
    before it was kept)."""
    if not cpu:
        return {}
    ticks = cpu["guest_ticks"]
    total = sum(ticks.values()) or 1
    hz = os.sysconf("SC_CLK_TCK")
    out = {"guest_idle_share": (ticks.get("idle", 0) + ticks.get("iowait", 0)) / total}
    d = cpu.get("daemon")
    if d:
        out["daemon_cpu_share"] = d["cpu_s"] * hz / total
        out["daemon_tick_cpu_share"] = d["main_thread_cpu_s"] * hz / total
        if "children_cpu_s" in d:  # the programs it ran (tc, ipset, nft ...)
            out["daemon_children_cpu_share"] = d["children_cpu_s"] * hz / total
    probe_s = (cpu.get("probes_cpu_s") or {}).get("status")
    if d and probe_s is not None:  # the lab's status probe, its side of the socket
        out["status_probe_cpu_share"] = probe_s * hz / total
    return out


def spread(xs: list[float]) -> tuple[float, float, float] | None:
    """(median, min, max), or None without values."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return percentile(xs, 50), xs[0], xs[-1]
