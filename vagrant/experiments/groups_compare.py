#!/usr/bin/env python3
"""The lab's two reader groups (groups_lab.py) set beside the simulator. On the host.

    .venv/bin/python vagrant/experiments/groups_compare.py [RUN/work/groups/groups-lab.json]
    make lab-groups            # the lab run, then this

(docs/groups.md, "In the lab".)  From the lab run's arguments and plant it
writes the simulator's scenario (the resource's line L = C + m * Q is the
plant's; each reader, as fio's --rate_iops at QD1, a closed stream of depth 1
capped at the lab's rate (a delay that holds it over 1 / rate slows it); each
writer host a closed stream of its block size and depth; the groups, targets and
priorities are the daemon's) and runs it for each of the lab's phases with
groups (controlled, and overload with the bulk group's throughput target).
The lab's emulated target adds a software path the plant does not have (its
LIO, TCP and bridge under TCG: milliseconds, growing with the load), and the
daemon's controller acts on the latency the wire shows, the path included.
Each phase measures it: the gold reader's mean wire latency (gold is never
delayed) over the plant's own mean IO latency (lqarray's counters). So that
the simulator's controller aims where the lab's did, its latency targets are
the lab's less that phase's path; its writers' overhead (`overhead_ms`, time
per IO outside the device and the delay) is calibrated as report.py does for
`make lab`: by bisection, so that its plant with nobody delayed has the
plant's mean latency of the lab's uncontrolled phase. Every figure with groups is then a
prediction. A reader's lab latency is compared at the plant: its wire
latency less the phase's path (the array's, plus its delay).

Per group, over the same steady window (after the lab's --warmup): the mean
latency it sees (readers) and its MB/s (writers), the lab's against the
simulator's, and whether they are within 20 %.

Output: a table on stdout; beside the input, groups-compare.json and the
scenario groups-lab-sim-<phase>.toml.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from santhrottle.appliance.config.kinds import throughput
from santhrottle.sim.groups import group_summary
from santhrottle.sim.loop import run
from santhrottle.sim.plant import Closed, Device, closed_latency
from santhrottle.sim.scenario import Scenario, parse_scenario

TOLERANCE = 0.20  # the "within 20 %"
MIB = 1024.0 * 1024.0
READERS = ("gold", "silver")
WRITER_GROUP = "bulk"


def default_input() -> Path:
    cache = os.environ.get("SANTHROTTLE_LAB_CACHE") or str(Path.home() / ".cache/santhrottle-lab")
    return Path(cache) / "runs" / "last" / "work" / "groups" / "groups-lab.json"


def ms(text: str) -> float:
    t = text.strip().lower()
    return float(t[:-2]) if t.endswith("ms") else float(t.rstrip("s")) * 1e3


def kib(text: str) -> float:
    t = text.strip().lower().rstrip("b")
    mult = {"k": 1.0, "m": 1024.0}.get(t[-1:])
    return float(t[:-1]) * mult if mult else float(t) / 1024.0


def scenario(lab: dict, overhead_ms: float, bulk_target: str | None, path_ms: float = 0.0) -> str:
    """The lab run as a scenario; the readers' latency targets less path_ms."""
    a, arr = lab["args"], lab["array"] or {}
    ini = lab["initiators"]
    dur = a["seconds"]
    lines = [
        f"[run]\nduration_s = {dur}\nsim_step_s = 0.01\nseed = 1\nsettle_s = {a['warmup']}\n",
        f'[[resource]]\nname = "array"\nintercept_ms = {arr.get("c_ms", 2.0)}\n'
        f"slope_ms_per_io = {arr.get('m_ms', 5.0)}\nnoise = {arr.get('noise', 0.0)}\n",
    ]
    for g, ip in zip(READERS, ini[:2], strict=True):
        lines.append(
            f'[[stream]]\nname = "{g}"\nkind = "read"\nloop = "closed"\ndepth = 1\n'
            f"rate_kib_per_s = {a['reader_iops'] * 4}\nsize_kib = 4\n"
            f'resource = "array"\ninitiator = "{ip}"\n'
        )
    for k, ip in enumerate(ini[2:]):
        lines.append(
            f'[[stream]]\nname = "w{k}"\nkind = "write"\nloop = "closed"\n'
            f"depth = {a['writer_qd']}\nsize_kib = {kib(a['writer_bs'])}\n"
            f'overhead_ms = {overhead_ms:.3f}\nresource = "array"\ninitiator = "{ip}"\n'
        )
    for g, ip in zip(READERS, ini[:2], strict=True):
        lines.append(
            f'[[group]]\nname = "{g}"\nmembers = ["{ip}"]\npriority = {a[g + "_priority"]}\n'
            f"latency_target_ms = {ms(a[g + '_target']) - path_ms:.3f}\n"
        )
    bulk = ""
    if bulk_target:
        value, unit = throughput().parse(bulk_target)
        bulk = (
            f"throughput_target_mib_s = {value / MIB}\n"
            if unit == "B/s"
            else f"throughput_target_iops = {value}\n"
        )
    lines.append(
        f'[[group]]\nname = "{WRITER_GROUP}"\nmembers = {json.dumps(ini[2:])}\n'
        f"priority = {a['bulk_priority']}\n{bulk}"
    )
    lines.append("[controller]\nthresholds_ms = [50]\n")
    return "\n".join(lines)


def lab_phase(lab: dict, name: str) -> dict | None:
    return next((p for p in lab["phases"] if p["phase"] == name), None)


def software_path_ms(ph: dict) -> float:
    """The phase's path outside the plant: gold's mean wire latency (never delayed) over
    the plant's mean IO latency."""
    return (ph["groups"]["gold"]["wire_latency_s"]["mean"] - ph["array"]["latency_s"]) * 1e3


CALIBRATION_MAX_OVERHEAD_MS = 1000.0
CALIBRATION_STEPS = 18


def uncontrolled_latency_s(sc: Scenario) -> float:
    """The simulator's plant latency with nobody delayed, every stream on: its fixed
    point (controller/sim.py's, without noise)."""
    r = sc.resources[0]
    closed = [Closed(s.depth, s.overhead_s, s.rate_iops) for s in sc.streams if s.loop == "closed"]
    open_iops = sum(s.rate_iops for s in sc.streams if s.loop == "open")
    return closed_latency(Device(r.intercept_s, r.slope_s_per_io), open_iops, closed)[0]


def calibrate_overhead_ms(lab: dict) -> float:
    """The writers' overhead with which the simulator's uncontrolled run has the plant's
    mean latency in the lab's uncontrolled phase (more overhead, less queue); bisection."""
    want_s = lab_phase(lab, "uncontrolled")["array"]["latency_s"]
    lo, hi = 0.0, CALIBRATION_MAX_OVERHEAD_MS
    for _ in range(CALIBRATION_STEPS):
        mid = (lo + hi) / 2
        if uncontrolled_latency_s(parse_scenario(scenario(lab, mid, None))) > want_s:
            lo = mid
        else:
            hi = mid
    return hi


def compare(lab: dict, name: str, overhead_ms: float, out_dir: Path) -> dict:
    ph = lab_phase(lab, name)
    a = lab["args"]
    sw_ms = software_path_ms(ph)
    text = scenario(lab, overhead_ms, a["bulk_target"] if name == "overload" else None, sw_ms)
    (out_dir / f"groups-lab-sim-{name}.toml").write_text(text)
    sc = parse_scenario(text)
    r = run(sc, threshold_s=0.05)
    specs = {g.group.name: g.group for g in sc.groups}
    rows: dict = {"software_path_ms": sw_ms, "array_latency_ms": ph["array"]["latency_s"] * 1e3}
    for g in (*READERS, WRITER_GROUP):
        s = group_summary(r.groups[g], specs[g], a["warmup"], a["seconds"])
        lg = ph["groups"][g]
        if g in READERS:
            lab_v = lg["wire_latency_s"]["mean"] * 1e3 - sw_ms  # at the plant, its delay in
            sim_v, unit = s["latency_mean_s"] * 1e3, "ms"
        else:
            lab_v = (lg.get("disk_write_bps") or 0.0) / 1e6
            sim_v, unit = s["throughput_bps"] / 1e6, "MB/s"
        ratio = lab_v / sim_v if sim_v else math.nan
        rows[g] = {
            "lab": lab_v,
            "sim": sim_v,
            "unit": unit,
            "ratio": ratio,
            "within": abs(ratio - 1.0) <= TOLERANCE,
            "lab_fio_ms": ((lg.get("fio_latency_s") or {}).get("mean") or 0) * 1e3,
            "lab_pwfte": (lg.get("pwfte") or {}).get("mean"),
            "sim_pwfte": s["pwfte"],
            "lab_y": (lg.get("y") or {}).get("mean"),
            "sim_y": s["y_mean"],
            "lab_class": (lg.get("delay_class") or {}).get("mean"),
            "sim_class": s["delay_class"],
        }
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", nargs="?", type=Path, default=default_input())
    a = ap.parse_args()
    lab = json.loads(a.input.read_text())
    overhead_ms = calibrate_overhead_ms(lab)
    sim_unc_ms = uncontrolled_latency_s(parse_scenario(scenario(lab, overhead_ms, None))) * 1e3
    lab_unc_ms = lab_phase(lab, "uncontrolled")["array"]["latency_s"] * 1e3
    out: dict = {
        "input": str(a.input),
        "writer_overhead_ms": overhead_ms,
        "phases": {},
        "uncontrolled_ms": {"lab": lab_unc_ms, "sim": sim_unc_ms},
    }
    print(
        f"the writers' overhead, calibrated on the uncontrolled phase: {overhead_ms:.2f} ms "
        f"(the plant uncontrolled: lab {lab_unc_ms:.2f} ms, sim {sim_unc_ms:.2f} ms)"
    )
    for name in ("controlled", "overload"):
        if lab_phase(lab, name) is None:
            continue
        rows = compare(lab, name, overhead_ms, a.input.parent)
        out["phases"][name] = rows
        print(
            f"{name}: the plant {rows['array_latency_ms']:.2f} ms, the path outside it "
            f"{rows['software_path_ms']:.2f} ms"
        )
        for g in (*READERS, WRITER_GROUP):
            v = rows[g]
            print(
                f"  {g:<7} lab {v['lab']:7.2f} {v['unit']:<4} sim {v['sim']:7.2f}  "
                f"lab/sim {v['ratio']:5.2f} {'ok' if v['within'] else 'OFF'}   "
                f"PWFTE lab {v['lab_pwfte'] or 0:5.2f} sim {v['sim_pwfte']:5.2f}   "
                f"class lab {v['lab_class'] or 0:5.1f} sim {v['sim_class']:5.1f}"
            )
    (a.input.parent / "groups-compare.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
