"""`make lab-light`'s report: work conservation on a plant the writers leave under T.

What it owns
    From a closed_loop.py --light run (raw.json's "light": the slopes tried and kept, the
    threshold; its phases, each with its repetition "rep"): per repetition the
    uncontrolled, controlled, observed (--observed: the daemon with no threshold),
    bridge-observed (--observed with --bridge: the bridge's daemon with no threshold)
    and bridged phases at the chosen T
    (labkit.analysis.summarize), the slopes tried (plant_lines), each one's writes against the
    uncontrolled phase of its repetition, how long the writers were delayed at all
    (the share of the daemon's status samples, from the end of the learning burst to
    the reader's departure, with any initiator above class 0) and the highest class;
    the medians with their spread (labkit.analysis.spread) and the verdict
    (labkit.regime.CONSERVE_AT_LEAST: the controlled writers' median ratio on the target
    host, with every repetition's uncontrolled p95 under T).

Worked example
    repetitions with uncontrolled writes 7.0, 6.8, 7.1 MB/s and controlled 6.9, 6.9,
    6.8 MB/s: ratios 0.986, 1.015, 0.958 -> median 98.6 % (95.8-101.5 %), holds.
"""

from __future__ import annotations

import math

from labkit import regime
from labkit.analysis import classes, events, settle_time, spread, summarize

from santhrottle.appliance.units import parse_duration_s

KINDS = ("uncontrolled", "controlled", "observed", "bridge-observed", "bridge")
# each controlled kind against the same daemon with no threshold: what control costs
OBSERVED_OF = {"controlled": "observed", "bridge": "bridge-observed"}


def delayed_share(ph: dict) -> float | None:
    """Of the daemon's status samples from the end of the learning burst to the reader's
    departure, the share with any initiator above class 0 (None without a daemon)."""
    lo = settle_time(ph)
    hi = (events(ph, "reader off") or [math.inf])[0]
    cl = [c for t, c in classes(ph) if lo <= t < hi]
    return sum(1 for c in cl if c > 0) / len(cl) if cl else None


def summary(raw: dict) -> dict:
    """summary.json of a --light run."""
    choice = raw["light"]
    thr = choice["threshold"]
    t_s = parse_duration_s(thr) if thr else None
    reps: dict[int, dict] = {}
    for ph in raw["phases"]:
        s = summarize(ph, t_s, None)
        if ph["kind"] != "uncontrolled":
            s["delayed_share"] = delayed_share(ph)
        reps.setdefault(ph.get("rep", 0), {})[ph["kind"]] = s
    rows = []
    for rep in sorted(reps):
        r = {"rep": rep, **reps[rep]}
        unc = r.get("uncontrolled")
        for kind in KINDS[1:]:
            if kind in r and unc and unc["write_bytes_per_s"]:
                r[kind]["vs_uncontrolled_writes"] = (
                    r[kind]["write_bytes_per_s"] / unc["write_bytes_per_s"]
                )
        for kind, observed in OBSERVED_OF.items():  # what control costs
            obs = r.get(observed)
            if kind in r and obs and obs["write_bytes_per_s"]:
                r[kind]["vs_observed_writes"] = (
                    r[kind]["write_bytes_per_s"] / obs["write_bytes_per_s"]
                )
        rows.append(r)

    def med(kind: str, key: str) -> tuple[float, float, float] | None:
        return spread([r[kind][key] for r in rows if key in r.get(kind, {})])

    ctl = med("controlled", "vs_uncontrolled_writes")
    under = [
        r["uncontrolled"]["read_latency_p95_s"] <= t_s
        for r in rows
        if t_s is not None and "uncontrolled" in r
    ]
    return {
        "args": raw["args"],
        "array_config": raw.get("array_config"),
        "guest_wall_s": raw.get("guest_wall_s"),
        "light": choice,
        "repetitions": rows,
        "medians": {
            f"{kind}.{key}": med(kind, key)
            for kind in KINDS
            for key in (
                "read_latency_p95_s",
                "write_bytes_per_s",
                "vs_uncontrolled_writes",
                "vs_observed_writes",
                "delayed_share",
                "max_delay_class",
                "daemon_cpu_share",
                "daemon_tick_cpu_share",
                "status_probe_cpu_share",
                "guest_idle_share",
                "target_retrans_segs",
                "reader_clat_p95_s",
                "reader_clat_above_threshold_pct",
                "sensor_p95_s",
                "daemon_children_cpu_share",
            )
            if med(kind, key) is not None
        },
        "uncontrolled_under_t": bool(under) and all(under),
        "conserved": None if ctl is None else ctl[0] >= regime.CONSERVE_AT_LEAST,
    }


def pct(x: tuple[float, float, float] | None) -> str:
    if x is None:
        return "-"
    return f"{x[0]:.1%} ({x[1]:.1%}-{x[2]:.1%})"


def plant_lines(ch: dict) -> list[str]:
    """The slopes tried for the light plant and the one kept (closed_loop.py --light)."""
    out = [
        f"  plant C {t['c_ms']:g} ms, m {t['m_ms']:g} ms/IO: uncontrolled p95 "
        f"{t['p95_s'] * 1e3:.2f} ms; the array's Q {t['q']:.2f} at {t['iops']:.0f} IOPS of "
        "the writers" + (f"; next: m {t['next_m_ms']:g} ms/IO" if t.get("next_m_ms") else "")
        for t in ch.get("tries", [])
    ]
    if "m_ms" in ch:
        out.append(
            f"  chosen: m {ch['m_ms']:g} ms/IO (aimed at an uncontrolled p95 of "
            f"{ch['aim_x']:g} x the smallest threshold, labkit.regime.light_slope)"
        )
    return out


def initiator_line(md: dict) -> str | None:
    """What the initiator saw (fio's 1 s means of the reader's completion latency), per
    kind of phase, and what the bridge's wire measured: through the bridge T is about
    the former (docs/bridge.md, "The wire's latency and the array's"). None for runs
    from before the reader's latency log."""
    seen = {k: md.get(f"{k}.reader_clat_p95_s") for k in KINDS}
    if not any(seen.values()):
        return None
    ms = ", ".join(f"{k} {v[0] * 1e3:.2f} ms" for k, v in seen.items() if v)
    wire = md.get("bridge.sensor_p95_s")
    return f"  the initiator's p95 (fio, median): {ms}" + (
        f"; the bridge's wire {wire[0] * 1e3:.2f} ms" if wire else ""
    )


def lines(sm: dict) -> list[str]:
    """The report: the verdict first, the plant's choice, then one row per phase."""
    ch = sm["light"]
    p95 = ch["uncontrolled_p95_s"] * 1e3
    if ch["threshold"] is None:
        wanted = ", ".join(ch["wanted"])
        return [
            f"WORK CONSERVATION NOT MEASURED: the uncontrolled p95 {p95:.2f} ms is over "
            f"{ch['light_x']:g} T at every threshold wanted ({wanted}); no slope tried made "
            "this host's plant light",
            *plant_lines(ch),
        ]
    md = sm["medians"]
    n = len(sm["repetitions"])
    verdict = {True: "HOLDS", False: "DOES NOT HOLD", None: "no figure"}[sm["conserved"]]
    out = [
        f"WORK CONSERVATION {verdict} (>= {regime.CONSERVE_AT_LEAST:.0%}; docs/lab.md): T "
        f"{ch['threshold']}, the smallest threshold the chosen plant's uncontrolled p95 "
        f"({p95:.2f} ms) stays under with room (<= {ch['light_x']:g} T); over {n} "
        "repetitions the controlled writers moved "
        f"{pct(md.get('controlled.vs_uncontrolled_writes'))} of the uncontrolled phase's "
        "beside them on the target host, "
        f"{pct(md.get('bridge.vs_uncontrolled_writes'))} through the bridge (median, min-max)"
    ]
    if "observed.vs_uncontrolled_writes" in md:
        out.append(
            "  the daemon with no threshold (observed) moved "
            f"{pct(md.get('observed.vs_uncontrolled_writes'))} of the uncontrolled phase's; "
            f"the controlled writers {pct(md.get('controlled.vs_observed_writes'))} of the "
            "observed phase's: the daemon's presence and the lab's status probe against "
            "what control costs"
        )
    if "bridge-observed.vs_uncontrolled_writes" in md:
        out.append(
            "  the bridge's daemon with no threshold (bridge-observed) moved "
            f"{pct(md.get('bridge-observed.vs_uncontrolled_writes'))} of the uncontrolled "
            f"phase's; the bridge controlled {pct(md.get('bridge.vs_observed_writes'))} of "
            "the bridge-observed phase's: the wire sensor's and the bridge's cost against "
            "what control costs there"
        )
    cpu = [
        f"{what} {pct(md.get(key))}"
        for what, key in (
            ("the daemon", "controlled.daemon_cpu_share"),
            ("its tick", "controlled.daemon_tick_cpu_share"),
            ("the lab's status probe (client side)", "controlled.status_probe_cpu_share"),
            ("idle controlled", "controlled.guest_idle_share"),
            ("idle uncontrolled", "uncontrolled.guest_idle_share"),
        )
        if md.get(key) is not None
    ]
    if cpu:
        out.append("  of the guest's CPU: " + ", ".join(cpu))
    out += plant_lines(ch)
    seen = initiator_line(md)
    if seen:
        out.append(seen)
    if not sm["uncontrolled_under_t"]:
        out.append(
            "  an uncontrolled phase went over T: that repetition is not the light plant "
            "(the controller had something to hold)"
        )
    out.append(
        f"  {'rep':>3} {'phase':<15} {'p95 ms':>7} {'p99 ms':>7} {'above%':>6} {'wr MB/s':>7} "
        f"{'vs unc':>7} {'delayed':>7} {'max cl':>6} {'daemon':>6} {'retrans':>7}"
    )
    for r in sm["repetitions"]:
        for kind in KINDS:
            s = r.get(kind)
            if s is None:
                continue
            vs, dl, cpu = (
                s.get("vs_uncontrolled_writes"),
                s.get("delayed_share"),
                s.get("daemon_cpu_share"),
            )
            out.append(
                f"  {r['rep']:>3} {kind:<15} {s['read_latency_p95_s'] * 1e3:>7.2f} "
                f"{s['read_latency_p99_s'] * 1e3:>7.2f} {s['time_above_threshold_pct']:>6.1f} "
                f"{s['write_bytes_per_s'] / 1e6:>7.2f} {'-' if vs is None else f'{vs:.1%}':>7} "
                f"{'-' if dl is None else f'{dl:.0%}':>7} "
                f"{s.get('max_delay_class', 0) if kind != 'uncontrolled' else '-':>6} "
                f"{'-' if cpu is None else f'{cpu:.1%}':>6} {s['target_retrans_segs']:>7}"
            )
    return out
