"""threshold = "auto" measured: the daemon's LQ fit of the known plant under stepped load.

What it owns
    The load and the record of vagrant/experiments/auto_fit_lab.py (the lab guest) and
    auto_fit_host.py (this host's kernel, the plant as a loop device), the same in both:

    levels     the reader (the paper's 4 KiB QD1, rate-limited) throughout; the
               writers (sequential, QD1, each in its own region) through `--levels`
               (0, 1, 2, 3, 6, 9, 12), `--step` s each, `--rounds` times
               (run_levels); the caller says how n writers start
    watch      every second (labkit.sampler, 1 s): the daemon's status for the
               resource (its `threshold`: `fit` with C, m, R^2, windows, Q range, confident,
               and `in_force_s`; the writers' classes), the device's
               diskstats and the plant's own counters
    result     at a repetition's end: the daemon's last fit and threshold against the
               configured C, m and C / (1 - alpha); the first confident second; a
               plain least-squares fit of the device's 1 s windows (IO-weighted L
               against Q, as the daemon folds them; windows of at least MIN_IOS IOs);
               the device's median L with the reader alone (level_latency_s)
    summary    the daemon's fit over the repetitions: median (range)

Worked example
    one repetition on C 2 ms, m 5 ms: result(...) prints "rep 0: daemon C 2.26 ms
    (+13 %), m 4.88 ms (-2 %), R^2 1.000, 99 windows, Q 0.21..13.1, confident True
    (first at 25.0 s); in force 22.61 ms (configured plant: 20.0 ms) | plain fit of the
    1 s windows: C 2.10, m 5.04"
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

from labkit import analysis, fio, probes
from labkit.daemon import Daemon
from labkit.sampler import Probe, Sampler

ALPHA = 0.9  # controller.auto_alpha's default
WATCH_S = 1.0
MIN_IOS = 10  # a window with fewer IOs says little about L


def add_load_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--levels", default="0,1,2,3,6,9,12", help="writer counts, in order")
    ap.add_argument("--step", type=float, default=8.0, help="s per level")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--writer-bs", default="128k")


def writers(a: argparse.Namespace, dev: str, jobs: int, first_region: int) -> list[str]:
    """`jobs` sequential QD1 writers on dev for one level, each in its own region."""
    return fio.writers(
        dev,
        a.writer_bs,
        1,
        a.step,
        jobs=jobs,
        region_mib=fio.REGION_MIB,
        first_region=first_region,
        name="w",
    )


def watcher(
    d: Daemon,
    resource: str,
    device: str,
    writer_ips: list[str],
    plant_stats: Callable[[], dict | None] = probes.plant_stats,
) -> Sampler:
    """The 1 s sampler of a repetition (module header)."""

    def fit() -> dict:
        st = d.status()
        r = next((x for x in st["resources"] if x["resource"] == resource), None) or {}
        return {
            "fit": (r.get("threshold") or {}).get("fit"),  # status' ThresholdView
            "in_force_s": (r.get("threshold") or {}).get("in_force_s"),
            "devices": r.get("devices"),
            "mode": r.get("mode"),
            "classes": [i["class"] for i in st["initiators"] if i["initiator"] in writer_ips],
        }

    return Sampler(
        [
            Probe("ds", probes.diskstats([device])),
            Probe("server", plant_stats),
            Probe("daemon", fit),
        ],
        period_s=WATCH_S,
    )


def run_levels(
    a: argparse.Namespace,
    w: Sampler,
    reader_dev: str,
    start_writers: Callable[[int], list[list[str]]],
) -> list[tuple[float, int]]:
    """The reader throughout; the writers through a.levels, a.step s each, a.rounds times
    (start_writers(n): the fio command lines of n writers, [] for none).  Returns the
    schedule (the sampler's time, writers) and stops the sampler."""
    levels = [int(x) for x in a.levels.split(",")]
    schedule: list[tuple[float, int]] = []
    w.start()
    rd = fio.start(
        fio.reader(
            reader_dev,
            a.reader_rate,
            a.rounds * len(levels) * a.step + 2,
            name="sram",
            extra=("--offset=0",),
        )
    )
    for _ in range(a.rounds):
        for n in levels:
            schedule.append((round(w.now(), 3), n))
            ws = [fio.start(cmd) for cmd in start_writers(n)]
            for j in ws:
                j.wait()
            if not ws:
                time.sleep(a.step)
    rd.wait()
    w.stop()
    return schedule


def window_fit(rows: list[dict], device: str) -> dict | None:
    """The device's windows between consecutive samples (IO-weighted: L = weighted IO
    time / IOs, Q = weighted IO time / interval), least squares over those of >= MIN_IOS."""
    pts = []
    for a, b in itertools.pairwise(rows):
        if device not in a.get("ds", {}) or device not in b.get("ds", {}):
            continue
        d = analysis.device_delta(a["ds"][device], b["ds"][device], b["t"] - a["t"])
        if d["ios"] >= MIN_IOS:
            pts.append((d["q"], d["l_s"]))
    f = analysis.fit_line(pts)
    return None if f is None else {"c_s": f.c_s, "m_s": f.m_s, "r2": f.r2, "points": f.points}


def level_latency_s(
    rows: list[dict], device: str, schedule: list[tuple[float, int]], writers: int = 0
) -> float | None:
    """The device's median L (weighted IO time / IOs) over its windows of >= MIN_IOS IOs
    wholly inside the levels with `writers` writers, from each level's second second
    (None without one): with 0, the reader alone, the plant's latency at its lowest
    load, which no intercept of its line can exceed."""
    ends = [t for t, _ in schedule[1:]] + [rows[-1]["t"] if rows else 0.0]
    spans = [(t0 + WATCH_S, t1) for (t0, n), t1 in zip(schedule, ends, strict=True) if n == writers]
    ls = []
    for a, b in itertools.pairwise(rows):
        if device not in a.get("ds", {}) or device not in b.get("ds", {}):
            continue
        if not any(lo <= a["t"] and b["t"] <= hi for lo, hi in spans):
            continue
        d = analysis.device_delta(a["ds"][device], b["ds"][device], b["t"] - a["t"])
        if d["ios"] >= MIN_IOS:
            ls.append(d["l_s"])
    return statistics.median(ls) if ls else None


def result(rep: int, w: Sampler, device: str, schedule: list[tuple[float, int]], cfg: dict) -> dict:
    """One repetition (module header); printed, and stored in auto-fit.json."""
    rows = w.rows
    seen = [r for r in rows if (r.get("daemon") or {}).get("fit")]
    last = seen[-1]["daemon"] if seen else {}
    fit = last.get("fit") or {}
    first_conf = next((r["t"] for r in seen if r["daemon"]["fit"].get("fitted")), None)
    configured = {
        "c_s": cfg["c_ms"] / 1e3,
        "m_s": cfg["m_ms"] / 1e3,
        "threshold_s": cfg["c_ms"] / 1e3 / (1 - ALPHA),
    }
    res = {
        "rep": rep,
        "schedule": schedule,
        "rows": rows,
        "daemon_fit": fit,
        "in_force_s": last.get("in_force_s"),
        "devices": last.get("devices"),
        "first_confident_s": first_conf,
        "window_fit": window_fit(rows, device),
        "reader_alone_l_s": level_latency_s(rows, device, schedule, 0),
        "configured": configured,
    }
    show(res)
    return res


def rel(x: float | None, ref: float) -> str:
    return "-" if x is None else f"{(x / ref - 1) * 100:+.0f} %"


def show(r: dict) -> None:
    f, c, wf = r["daemon_fit"], r["configured"], r["window_fit"] or {}
    if not f or f.get("intercept_s") is None:
        print(f"rep {r['rep']}: the daemon has no fit", flush=True)
        return
    force = r["in_force_s"]
    c_fit = f["intercept_s"]
    print(
        f"rep {r['rep']}: daemon C {c_fit * 1e3:.2f} ms ({rel(c_fit, c['c_s'])})"
        f", m {f['slope_s_per_io'] * 1e3:.2f} ms ({rel(f['slope_s_per_io'], c['m_s'])}), R^2 "
        f"{f['r_squared']:.3f}, {f['windows']:.0f} windows, Q {f['q_lo']:.2f}..{f['q_hi']:.2f}, "
        f"confident {f.get('fitted')} (first at {r['first_confident_s']} s); in force "
        f"{'-' if force is None else f'{force * 1e3:.2f} ms'} (configured plant: "
        f"{c['threshold_s'] * 1e3:.1f} ms) | plain fit of the 1 s windows: C "
        f"{wf.get('c_s', float('nan')) * 1e3:.2f}, m {wf.get('m_s', float('nan')) * 1e3:.2f}, "
        f"R^2 {wf.get('r2', float('nan')):.3f} | devices {r['devices']}",
        flush=True,
    )


def summary(reps: list[dict], cfg: dict) -> None:
    """The daemon's fit over the repetitions: median (range)."""
    got = [r for r in reps if r["daemon_fit"].get("intercept_s") is not None]
    if not got:
        return

    def med(key, scale=1e3):
        v = [r["daemon_fit"][key] * scale for r in got]
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

    forces = [r["in_force_s"] * 1e3 for r in got if r["in_force_s"] is not None]
    force = (
        f"{statistics.median(forces):.2f} ({min(forces):.2f}-{max(forces):.2f})" if forces else "-"
    )
    print(
        f"\ndaemon's fit over {len(got)} reps, median (range): C {med('intercept_s')} ms, "
        f"m {med('slope_s_per_io')} ms/IO, R^2 {med('r_squared', 1)}, windows "
        f"{med('windows', 1)}; in force {force} ms; configured C {cfg['c_ms']} ms, m "
        f"{cfg['m_ms']} ms/IO, C/(1-{ALPHA}) {cfg['c_ms'] / (1 - ALPHA):.1f} ms"
    )
