#!/usr/bin/env python3
"""The lab's levels (levels_lab.py) beside the simulator's; its utilization, meter. On the host.

    .venv/bin/python vagrant/experiments/levels_compare.py [RUN/work/levels/levels-lab.json]
    make lab-levels            # the lab run, then this

(docs/levels.md, "In the lab".)  From the lab run's arguments and plant it
writes the simulator's scenario: the resource's line L = C + m * Q is the
plant's; each segment of a tenant's schedule a closed stream of 4 KiB reads
(at a rate: depth 1 capped at it; at a depth: that depth), on from the
segment's start for its length; the groups and levels are the daemon's. The
lab adds a path of its own to each IO (its LIO, TCP and bridge under TCG);
the streams' overhead_ms is calibrated by bisection so that the simulator's
tenants, both at the burst's depth and undelayed, move what the lab's did in
its calibrate phase.

Figures
    levels       per tenant, the level every second, the lab's (the daemon's
                 status) against the simulator's (its convergences), from the
                 lab's first second at level 0 (compare_levels()): the largest
                 difference and the share of seconds within one level (and the
                 same with the simulator 1-3 s earlier: a late lab, or a different
                 control); the seconds at each level and the level-seconds billed
                 (cap x seconds), the lab's over the simulator's (the issue: within
                 20 %); the target's TCP retransmissions over the phase (the issue:
                 0); the largest delay the run's levels need held (levels_lab.py).
    utilization  per load, over the load's steady seconds (fio's start plus two
                 to its end; compare_utilization()): the bridge daemon's
                 utilization of the resource (the wire) against iostat -x's %util
                 of the LV and of the initiator's disk (the time a command was out,
                 as the initiator saw it: the wire's quantity), and the target-host
                 daemon's (its VG's PV's io_ticks) against the PV's; the means of
                 the 1 s values and their difference in points (the issue: within 5).
    kill9        the meter's level-seconds at the kill (on disk), the last sample
                 before it, and after the restart: nothing lost but the
                 convergence in flight, and the restart continued from the file.

Output: a table on stdout; beside the input, levels-compare.json and the scenario
levels-lab-sim.toml.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from datetime import datetime
from pathlib import Path

from santhrottle.sim.loop import run
from santhrottle.sim.plant import Closed, Device, closed_latency
from santhrottle.sim.scenario import parse_scenario
from santhrottle.sim.usage import Tenancy

TOLERANCE = 0.20  # the "within 20 %" of the level-seconds
UTIL_POINTS = 5.0  # the "within 5 points" of iostat
TENANTS = ("tenant-a", "tenant-b")
SKIP_S = 2  # each load's first seconds: fio starting


def default_input() -> Path:
    cache = os.environ.get("SANTHROTTLE_LAB_CACHE") or str(Path.home() / ".cache/santhrottle-lab")
    return Path(cache) / "runs" / "last" / "work" / "levels" / "levels-lab.json"


def overhead_s(c_s: float, m_s: float, qd: int, iops: float) -> float:
    """The path per IO that has two tenants at depth qd, undelayed, move `iops` each."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        _, rates = closed_latency(Device(c_s, m_s), 0.0, [Closed(qd, mid), Closed(qd, mid)])
        lo, hi = (mid, hi) if rates[0] > iops else (lo, mid)
    return (lo + hi) / 2


def segments(run_dir: Path, lab: dict) -> dict[str, list[tuple[float, float]]]:
    """Per tenant, each schedule segment's (start, length) in seconds from the levels
    phase's start, as fio ran it (its report's end less its runtime): under TCG each
    fio takes seconds to start, and a schedule's segments drift behind their nominal
    starts. A segment without its report: the nominal one, after the one before."""
    t0 = lab["levels"]["start_epoch"]
    out = {}
    for g, key in zip(TENANTS, ("schedule_a", "schedule_b"), strict=False):
        got, start = [], 0.0
        for k, (secs, _, _) in enumerate(lab["args"][key]):
            seg = (start, float(secs))
            try:
                r = json.loads((run_dir / f"fio-levels-{g}-{k}.json").read_text())
                on = r["jobs"][0]["job_runtime"] / 1e3
                seg = (r["timestamp_ms"] / 1e3 - on - t0, on)
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                pass
            got.append(seg)
            start = seg[0] + seg[1]
        out[g] = got
    return out


def scenario(
    lab: dict, path_s: float, starts: dict[str, list[tuple[float, float]]] | None = None
) -> str:
    """The simulator's scenario of the lab's run; starts: each tenant's segments as
    they ran (segments()), else their nominal starts and lengths."""
    a, arr = lab["args"], lab["array"]
    if starts is None:
        starts = {}
        for g, key in zip(TENANTS, ("schedule_a", "schedule_b"), strict=False):
            ends = list(itertools.accumulate(float(x[0]) for x in a[key]))
            starts[g] = [(e - float(x[0]), float(x[0])) for e, x in zip(ends, a[key], strict=True)]
    dur = max(st + on for segs in starts.values() for st, on in segs)
    out = [
        "[run]",
        f"duration_s = {dur + 1:.1f}",
        "thresholds_ms = [1000]",
        "settle_s = 0.0",
        "[[resource]]",
        'name = "array"',
        f"intercept_ms = {arr['c_ms']}",
        f"slope_ms_per_io = {arr['m_ms']}",
        "[controller]",
        "promote_below_utilization = 1.0",
    ]
    for g, key, ini in zip(TENANTS, ("schedule_a", "schedule_b"), lab["initiators"], strict=False):
        for k, ((_, kind, n), (start, secs)) in enumerate(zip(a[key], starts[g], strict=True)):
            depth = 1 if kind == "rate" else n
            cap = f"rate_kib_per_s = {n * 4}\n" if kind == "rate" else ""
            out.append(
                f'[[stream]]\nname = "{g}-{k}"\nkind = "read"\nloop = "closed"\n'
                f"depth = {depth}\n{cap}overhead_ms = {path_s * 1e3:.3f}\nsize_kib = 4\n"
                f'resource = "array"\ninitiator = "{ini}"\n'
                f"schedule = {{ start_s = {start:.1f}, on_s = {secs:.1f}, cycles = 1 }}"
            )
        out.append(f'[[group]]\nname = "{g}"\nmembers = ["{ini}"]\niops_levels = {a["levels"]}')
    return "\n".join(out) + "\n"


def lab_levels(lab: dict) -> dict[str, list[tuple[float, int]]]:
    """Per tenant, (seconds from the phase's start, level) of each status read. A read
    is stamped at its middle when the row says when it ended ("daemon_t", on the rows'
    clock "t"): under emulation a status takes up to a second, and the level is of some
    instant in between. A row without it: when the read began."""
    ph = lab["levels"]
    t0 = ph["start_epoch"]
    out: dict[str, list[tuple[float, int]]] = {g: [] for g in TENANTS}
    for r in ph["rows"]:
        took = r["daemon_t"] - r["t"] if "daemon_t" in r and "t" in r else 0.0
        for g in TENANTS:
            x = r.get("daemon", {}).get("levels", {}).get(g)
            if x is not None:
                out[g].append((r["epoch"] + took / 2 - t0, x["level"]))
    return out


def from_level_zero(series: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The series from its first second at level 0: the simulator starts every group
    there, and a lab run whose calibration left a tenant higher (before the run waited
    for level 0) starts with demotions the schedule did not ask for."""
    k = next((i for i, (_, lv) in enumerate(series) if lv == 0), len(series))
    return series[k:]


def difference(
    labl: list[tuple[float, int]], sim: list[tuple[float, int]], lag_s: float = 0.0
) -> list[int]:
    """Per lab second, its level less the simulator's nearest (within 1 s) to lag_s
    before it."""
    out = []
    for t, lv in labl:
        near = min(sim, key=lambda x: abs(x[0] - (t - lag_s))) if sim else None
        if near is not None and abs(near[0] - (t - lag_s)) <= 1.0:
            out.append(lv - near[1])
    return out


def sensor_period_s(lab: dict) -> float | None:
    """Seconds per convergence of the daemon's sensor over the levels phase (the levels
    decide on its IoSamples; the simulator's come every second): from the rows' counts
    of convergences; None for a run whose rows do not have them."""
    got = [
        (r["epoch"], r["daemon"]["converges"])
        for r in lab["levels"]["rows"]
        if r.get("daemon", {}).get("converges") is not None
    ]
    if len(got) < 2 or got[-1][1] == got[0][1]:
        return None
    return (got[-1][0] - got[0][0]) / (got[-1][1] - got[0][1])


def within_one(diffs: list[int]) -> float | None:
    return sum(abs(d) <= 1 for d in diffs) / len(diffs) if diffs else None


def seconds_at(series: list[tuple[float, int]], caps: list[float]) -> dict[str, float]:
    """Seconds at each level (each sample stands for the second after it)."""
    out = {f"{c:g}": 0.0 for c in caps}
    for _, lv in series:
        out[f"{caps[lv]:g}"] += 1.0
    return out


def compare_levels(lab: dict, sim_levels: dict[str, list[tuple[float, int]]]) -> dict:
    """Per tenant, the lab's level each second against the simulator's, from the lab's
    first second at level 0 (from_level_zero(): the seconds before are left out on both
    sides and counted in start_left_out_s). within_one_level_by_lag: the same share
    with the simulator's levels 1, 2 and 3 s earlier, a diagnostic: a lab whose levels
    follow the simulator's late (its sensor's IoSamples arriving every few seconds under
    emulation) agrees better at a lag, one whose control differs does not."""
    caps = lab["args"]["levels"]
    res = {}
    for g, series in lab_levels(lab).items():
        labl = from_level_zero(series)
        sim = sim_levels[g]
        diffs = difference(labl, sim)
        start = labl[0][0] - 0.5 if labl else 0.0
        end = max((t for t, _ in labl), default=0.0)
        sim_in = [x for x in sim if start <= x[0] <= end]
        s_lab, s_sim = seconds_at(labl, caps), seconds_at(sim_in, caps)
        bill_lab = sum(float(c) * s for c, s in s_lab.items())
        bill_sim = sum(float(c) * s for c, s in s_sim.items())
        res[g] = {
            "max_level_difference": max((abs(d) for d in diffs), default=None),
            "within_one_level": within_one(diffs),
            "within_one_level_by_lag": {
                lag: within_one(difference(labl, sim, float(lag))) for lag in range(4)
            },
            "start_level": series[0][1] if series else None,
            "start_left_out_s": float(len(series) - len(labl)),
            "seconds_lab": s_lab,
            "seconds_sim": s_sim,
            "billed_lab_over_sim": bill_lab / bill_sim if bill_sim else None,
            "promotions_lab": _moves(labl)[0],
            "promotions_sim": _moves(sim_in)[0],
            "demotions_lab": _moves(labl)[1],
            "demotions_sim": _moves(sim_in)[1],
        }
    return res


def _moves(series: list[tuple[float, int]]) -> tuple[int, int]:
    up = sum(1 for (_, a), (_, b) in itertools.pairwise(series) if b > a)
    down = sum(1 for (_, a), (_, b) in itertools.pairwise(series) if b < a)
    return up, down


def spread(xs: list[float]) -> dict:
    """The 1 s values' median and 10th-90th percentiles."""
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else xs * 9
    return {"median": statistics.median(xs), "p10": q[0], "p90": q[-1], "n": len(xs)}


def load_window(load: dict) -> tuple[float, float] | None:
    """The load's steady seconds, epoch: from fio's start (its end less its runtime)
    plus SKIP_S to its end; None for a run that kept no fio report."""
    f = load.get("fio") or {}
    if "end_ms" not in f or "runtime_ms" not in f:
        return None
    end = f["end_ms"] / 1e3
    return end - f["runtime_ms"] / 1e3 + SKIP_S, end


def iostat_in(load: dict, device: str, window: tuple[float, float]) -> list[float]:
    """iostat's %util of `device` from the reports wholly inside the window: a report
    stamped T (whole seconds) covers the second before it, somewhere in [T - 1, T + 1]."""
    w0, w1 = window
    out = []
    for r in load.get("iostat", []):
        try:
            t = datetime.fromisoformat(r["timestamp"]).timestamp()
        except (KeyError, TypeError, ValueError):
            continue
        u = r.get("util", {}).get(device)
        if u is not None and t - 1.0 >= w0 and t + 1.0 <= w1:
            out.append(float(u))
    return out


def daemon_in(load: dict, key: str, window: tuple[float, float] | None) -> list[float]:
    """The daemon's utilization (%) of its one resource, each 1 s row's (the last
    convergence's: a second that ended at most a second before the row), from the rows
    whose convergence lies inside the window (all after the first SKIP_S without one)."""
    rows = load.get("daemon", [])
    if window is None:
        rows = rows[SKIP_S:]
    out = []
    for r in rows:
        util = (r.get(key) or {}).get("utilization") or {}
        u = next(iter(util.values()), None) if len(util) == 1 else util.get("array")
        if u is None:
            continue
        if window is not None:
            t = r.get("epoch")
            if t is None or t - 2.0 < window[0] or t > window[1]:
                continue
        out.append(u * 100.0)
    return out


def _pair(ours: list[float], theirs: list[float]) -> dict:
    row: dict = {"daemon_pct": None, "iostat_pct": None, "points": None}
    if ours and theirs:
        row["daemon_pct"] = statistics.fmean(ours)
        row["iostat_pct"] = statistics.fmean(theirs)
        row["points"] = row["daemon_pct"] - row["iostat_pct"]
        row["daemon_spread"], row["iostat_spread"] = spread(ours), spread(theirs)
    return row


def compare_utilization(lab: dict) -> list[dict]:
    """Per load: the means of the daemon's and iostat's 1 s utilization (%), their
    difference in points, and each side's spread; over the same window, the load's
    steady seconds (load_window()), as iostat's %util is busy time over time (1 s
    reports: their mean is the window's ratio). The bridge daemon (the wire) against
    the LV's iostat, and against the initiator's disk ("initiator": the time the
    initiator had a command out, which the wire measures; the LV's time is less by the
    target's own path per IO); with a target-host daemon ("target" rows, its VG's PV's
    io_ticks), it against the PV's iostat, the same counter. A run without fio's
    report or stamps: the samples after the first SKIP_S."""
    out = []
    for load in lab.get("utilization", []):
        window = load_window(load)
        lv = load.get("lv")
        if window is None or lv is None:
            theirs = [float(u) for u in load["iostat_util_pct"][SKIP_S:] if u is not None]
        else:
            theirs = iostat_in(load, lv, window)
        row = {
            "load": load["load"],
            "window": window,
            **_pair(daemon_in(load, "daemon", window), theirs),
        }
        pvs = load.get("pvs") or []
        if window is not None and pvs:
            pv_util = [iostat_in(load, pv, window) for pv in pvs]
            busiest = max(pv_util, key=lambda xs: statistics.fmean(xs) if xs else -1.0)
            row["target"] = _pair(daemon_in(load, "target", window), busiest)
            row["target"]["lv_iostat_pct"] = statistics.fmean(theirs) if theirs else None
        disk = load.get("initiator_disk")
        if window is not None and disk:  # the same quantity as the wire's, at the initiator
            row["initiator"] = _pair(
                daemon_in(load, "daemon", window), iostat_in(load, disk, window)
            )
        out.append(row)
    return out


def level_seconds(totals: dict) -> dict[str, float]:
    return {
        g: sum(sum(c.values()) for c in u.get("level_seconds", {}).values())
        for g, u in totals.items()
    }


def print_utilization(what: str, u: dict) -> None:
    if u["points"] is None:
        print(f"{what}: no samples")
        return
    ds, io = u["daemon_spread"], u["iostat_spread"]
    print(
        f"{what}: daemon {u['daemon_pct']:.1f} % (1 s: median {ds['median']:.1f}, "
        f"p10-p90 {ds['p10']:.1f}-{ds['p90']:.1f}, n {ds['n']}), iostat -x "
        f"{u['iostat_pct']:.1f} % ({io['median']:.1f}, {io['p10']:.1f}-{io['p90']:.1f}, "
        f"n {io['n']}), points {u['points']:+.1f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", nargs="?", type=Path, default=default_input())
    a = ap.parse_args()
    lab = json.loads(a.input.read_text())
    arr = lab["array"]
    cal = [lab["calibrate"][g]["iops"] for g in TENANTS if g in lab["calibrate"]]
    path_s = overhead_s(
        arr["c_ms"] / 1e3, arr["m_ms"] / 1e3, lab["args"]["burst_qd"], statistics.fmean(cal)
    )
    text = scenario(lab, path_s, segments(a.input.parent, lab))
    (a.input.parent / "levels-lab-sim.toml").write_text(text)
    sc = parse_scenario(text)
    ten = Tenancy(sc)
    run(sc, sc.thresholds_s[0], tenancy=ten)
    sim = {
        g: [(t, lv[0]) for t, lv in zip(ten.records.t_s, ten.records.levels[g], strict=True)]
        for g in TENANTS
    }
    k9 = lab.get("kill9", {})
    res = {
        "path_s": path_s,
        "levels": compare_levels(lab, sim),
        "sensor_period_s": sensor_period_s(lab),
        "target_retrans": lab["levels"]["target_retrans"],
        "utilization": compare_utilization(lab),
        "kill9": {
            **{
                k: level_seconds(k9.get(k, {}))
                for k in ("before_kill", "on_disk_at_kill", "after_restart")
            },
            "down_s": k9["restarted_epoch"] - k9["killed_epoch"]
            if "restarted_epoch" in k9
            else None,
        },
    }
    (a.input.parent / "levels-compare.json").write_text(json.dumps(res, indent=1))
    print(
        f"path per IO (calibrated): {path_s * 1e3:.2f} ms; target retransmissions "
        f"{res['target_retrans']}"
    )
    period = sensor_period_s(lab)
    if period is not None:
        print(f"the daemon's sensor converged every {period:.2f} s over the levels phase")
    held = [x for x in lab.get("hold_delays", []) if x["held"]]
    if held:
        worst = max(held, key=lambda x: x["delay_s"])
        print(
            f"largest delay a level needs held (Little's law, path 0, levels_lab.py): "
            f"{worst['delay_s'] * 1e3:.1f} ms ({worst['tenant']}, loads {worst['loads']})"
        )
    for g, r in res["levels"].items():
        print(
            f"{g}: within one level {r['within_one_level']}, largest difference "
            f"{r['max_level_difference']}, billed lab / sim {r['billed_lab_over_sim']}, "
            f"promotions {r['promotions_lab']} / {r['promotions_sim']}, demotions "
            f"{r['demotions_lab']} / {r['demotions_sim']}"
        )
        print(f"  seconds per level, lab {r['seconds_lab']}, sim {r['seconds_sim']}")
        lags = ", ".join(
            f"{lag} s {share:.3f}" if share is not None else f"{lag} s -"
            for lag, share in r["within_one_level_by_lag"].items()
        )
        print(
            f"  within one level with the simulator's levels earlier by: {lags}; the lab "
            f"started at level {r['start_level']}, {r['start_left_out_s']:g} s left out"
        )
    for u in res["utilization"]:
        print_utilization(f"utilization {u['load']}, bridge (wire) vs the LV", u)
        if "target" in u:
            print_utilization(f"utilization {u['load']}, target host vs the PV", u["target"])
        if "initiator" in u:
            print_utilization(
                f"utilization {u['load']}, bridge (wire) vs the initiator's disk", u["initiator"]
            )
    print(f"kill9 level-seconds: {res['kill9']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
