"""The lab's run in the simulator: report.py's prediction of each phase (docs/lab.md).

What it owns
    From the uncontrolled phase of a closed-loop run (closed_loop.py's raw.json): the
    array's LQ line (labkit.analysis.fit_lq), the writers' time per IO outside the
    device and the reader's per-read noise (fit_streams), the writers' overhead that
    gives the simulator the lab's uncontrolled median (calibrate_overhead,
    bisection), and the same experiment as a simulator scenario (lab_scenario) run
    with the real controller at each threshold the lab ran (simulate_lab).  The
    simulator's uncontrolled p95 and every controlled figure are predictions.

Worked example
    c, m = 2.0e-3, 5.0e-3; overhead, noise = fit_streams(raw, c, m)
    -> (0.0494, 0.31); simulate_lab(raw, c, m, noise, overhead)["controlled"][0]
    ["read_latency_p95_s"] -> 0.00905 (the lab: 0.00926)
"""

from __future__ import annotations

import itertools
import math

from labkit.analysis import READ_TICKS, READS, phase_windows

# Bisection of the simulated writers' overhead (calibrate_overhead): 1 s
# halved 18 times is 4 us, far below what moves the median.
CALIBRATION_MAX_OVERHEAD_S = 1.0
CALIBRATION_STEPS = 18


def parse_ms(text: str) -> float:
    from santhrottle.appliance.units import parse_duration_s

    return parse_duration_s(text)


def is_controlled(ph: dict) -> bool:
    """A phase the controller ran (older runs have no "kind": threshold set)."""
    return ph.get("kind", "controlled" if ph["threshold"] else "uncontrolled") == "controlled"


def fit_streams(raw: dict, c: float, m: float) -> tuple[float, float]:
    """From the uncontrolled run: the writers' time per IO outside the device
    (overhead: network, iSCSI, here mostly TCG's slow CPU) and the per-read
    relative noise of the reader's latency.

    overhead = depth / (per-writer IOPS) - L, L from the LQ line at the mean
    queue; noise = sd of (100 ms mean / 1 s mean - 1) * sqrt(reads in 100 ms)."""
    a = raw["args"]
    ph = raw["phases"][0]
    ws = phase_windows(ph)
    top = max(x.write_bps for x in ws)
    w = [x for x in ws if x.write_bps > 0.5 * top]
    bs = int(a["writer_bs"].rstrip("kK")) * 1024
    iops = sum(x.write_bps for x in w) / len(w) / bs / (a["writers"] * a.get("writer_jobs", 1))
    q = sum(x.array_q for x in w) / len(w)
    overhead = max(0.0, a["writer_qd"] / iops - (c + m * q))
    rows, rd = ph["rows"], ph["reader_dm"]
    tick = [
        (
            b["ds"][rd][READS] - a_["ds"][rd][READS],
            b["ds"][rd][READ_TICKS] - a_["ds"][rd][READ_TICKS],
        )
        for a_, b in itertools.pairwise(rows)
    ]
    devs = []
    for i in range(5, len(tick) - 5):
        n, ms = tick[i]
        nb = tick[i - 5 : i + 5]
        tot = sum(x for x, _ in nb)
        if n and tot:
            mean = sum(y for _, y in nb) / tot
            if mean > 0.5:  # writers on: the interference is the noise we care about
                devs.append((ms / n / mean - 1) * math.sqrt(n))
    noise = math.sqrt(sum(d * d for d in devs) / len(devs)) if devs else 0.3
    return overhead, noise


def calibrate_overhead(raw: dict, c: float, m: float, noise: float, p50_s: float) -> float:
    """The writers' overhead with which the simulator's uncontrolled run has
    the lab's median read latency (bisection; more overhead, less queue).

    Little's law alone (fit_streams) puts the simulated array near
    saturation, where the uncontrolled latency swings with a few percent of
    overhead: its uncontrolled p95 came out 0.3x to 9x the lab's in the
    session-6 runs.  Calibrated on the uncontrolled median, the simulator
    reproduces that run; its uncontrolled p95 and every controlled figure
    are then predictions."""
    from santhrottle.sim.loop import run
    from santhrottle.sim.measure import summarize
    from santhrottle.sim.scenario import parse_scenario

    lo, hi = 0.0, CALIBRATION_MAX_OVERHEAD_S
    for _ in range(CALIBRATION_STEPS):
        mid = (lo + hi) / 2
        sc = parse_scenario(lab_scenario(raw, c, m, noise, mid))
        if summarize(sc, run(sc))["read_latency_p50_s"] > p50_s:  # the uncontrolled run only
            lo = mid
        else:
            hi = mid
    return hi


def simulate_lab(raw: dict, c: float, m: float, noise: float, overhead_s: float = 0.0) -> dict:
    """The same experiment in the simulator, with the lab's fitted device (and, when the
    lab searched for the best static delay, the simulator's best constant class)."""
    from santhrottle.sim.experiment import simulate
    from santhrottle.sim.scenario import parse_scenario

    text = lab_scenario(raw, c, m, noise, overhead_s)
    baseline = any(ph.get("kind") == "static" for ph in raw["phases"])
    res = simulate(parse_scenario(text), baseline=baseline)
    return {"scenario": text, "controlled": res["controlled"], "uncontrolled": res["uncontrolled"]}


def lab_scenario(raw: dict, c: float, m: float, noise: float, overhead_s: float) -> str:
    """The lab's experiment as a simulator scenario (TOML), with its fitted device."""
    a = raw["args"]
    dur = a["lead"] + a["cycles"] * (a["on"] + a["off"])
    bs_kib = int(a["writer_bs"].rstrip("kK"))
    rate_kib = int(a["reader_rate"].rstrip("kK"))
    writers = "".join(
        f'[[stream]]\nname = "w{k}"\nkind = "write"\nloop = "closed"\ndepth = {a["writer_qd"]}\n'
        f"count = {a.get('writer_jobs', 1)}\n"
        f"overhead_ms = {overhead_s * 1000:.3f}\n"
        f'size_kib = {bs_kib}\nresource = "vg"\ninitiator = "10.0.0.{3 + k}"\n'
        f"schedule = {{ start_s = {a['lead']}, on_s = {a['on']}, off_s = {a['off']}, "
        f"cycles = {a['cycles']} }}\n"
        for k in range(a["writers"])
    )
    # the thresholds the phases ran (--thresholds auto: the one the guest picked)
    ran = [ph["threshold"] for ph in raw["phases"] if ph["threshold"] and is_controlled(ph)]
    thr = ", ".join(f"{parse_ms(x) * 1000:g}" for x in ran)
    text = (
        f"[run]\nduration_s = {dur}\nseed = 1\nthresholds_ms = [{thr}]\n"
        f'[[resource]]\nname = "vg"\nintercept_ms = {c * 1000:.4f}\n'
        f"slope_ms_per_io = {m * 1000:.4f}\nnoise = {noise:.3f}\n"
        f'[[stream]]\nname = "reader"\nkind = "read"\nloop = "open"\n'
        f'rate_kib_per_s = {rate_kib}\nsize_kib = 4\nresource = "vg"\ninitiator = "10.0.0.2"\n'
        + writers
        # the daemon's ladder and setpoint: what the run gave it, else the product's
        # defaults (a scenario's [controller] and [datapath] are the daemon's keys)
        + "[controller]\n"
        + (f"setpoint_fraction = {a['setpoint']}\n" if a.get("setpoint") is not None else "")
        + "[datapath]\n"
        + (f'max_delay = "{parse_ms(a["max_delay"]) * 1000:g}ms"\n' if a.get("max_delay") else "")
    )
    return text
