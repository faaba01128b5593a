"""The controller's decisions over the shipped scenarios, as a trace to compare two trees.

    .venv/bin/python tests/sim/decisions_trace.py --out trace.json [--lines trace.txt]
    PYTHONPATH=/tmp/shim .venv/bin/python tests/sim/decisions_trace.py --out before.json

Every call of the controller in every run below is recorded: its time, the
resource and initiator classes it changed, who joined and left the
write-heavy sets, whether it ticked or converged and the late ticks.  Each
run's calls are hashed; the trace holds, per run, the number of calls, the
hash and the run's summary figures.  Two trees decide alike iff their
traces are equal (`--compare A B` says which runs differ).

The runs: every shipped scenario uncontrolled and at each of its
thresholds; the paper's best constant delays; generated plants 0-3 of
seed 1 through the sweep's judge (both variants and their oracles);
threshold "auto" on plant (2, 0); the fleet simulator on the paper and
fleet-deep scenarios (single, fleet, independent, a failover); and a wide
call of 200 resources x 2,000 initiators.  Each tree is traced with its
own scenario files and plant generator (the format may differ between
trees; the plants and settings do not).

The tree is whichever santhrottle imports (PYTHONPATH first); the module
names of either layout (the simulator in controller/ or in sim/) are found.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (module, attribute) of the controller's call, newest layout first
CONTROLLER_CALLS = (
    ("santhrottle.controller.decide", "decide"),
    ("santhrottle.controller.step", "step"),
)
# the simulator's modules, newest layout first (the simulator in sim/, or in controller/)
LAYOUT = {
    "engine": ("santhrottle.sim.loop", "santhrottle.controller.sim"),
    "measure": ("santhrottle.sim.measure", "santhrottle.controller.sim"),
    "baseline": ("santhrottle.sim.experiment", "santhrottle.controller.sim"),
    "scenario": ("santhrottle.sim.scenario", "santhrottle.controller.scenario"),
    "plantgen": ("santhrottle.sim.plantgen", "santhrottle.controller.plantgen"),
    "sweep": ("santhrottle.sim.sweep", "santhrottle.controller.sweep"),
    "fleetsim": ("santhrottle.sim.fleet", "santhrottle.controller.fleetsim"),
    "state": ("santhrottle.controller.state", "santhrottle.controller.step"),
    "domain": ("santhrottle.controller.domain",),
}


def _old_layout() -> bool:
    """The simulator still in controller/ (its sim.py beside the law). Decided from
    the controller that imports: a tree without sim/ must not pick up another
    tree's (an editable install's finder would serve it)."""
    import santhrottle.controller as ctl

    return (Path(ctl.__file__).parent / "sim.py").exists()


def _candidates(role: str) -> tuple[str, ...]:
    names = LAYOUT[role]
    if _old_layout():
        return tuple(n for n in names if not n.startswith("santhrottle.sim."))
    return tuple(n for n in names if not n.startswith("santhrottle.controller.sim"))


def _mod(role: str) -> Any:
    for name in _candidates(role):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(f"none of {_candidates(role)}")


def _attr(role: str, *names: str) -> Any:
    """The first of names in role's first module that has one (names and modules may
    differ between the layouts)."""
    for mod in _candidates(role):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError:
            continue
        for n in names:
            if hasattr(m, n):
                return getattr(m, n)
    raise AttributeError(f"none of {LAYOUT[role]} has any of {names}")


class Recorder:
    """Wraps the controller's call wherever a module holds it; hashes each run's calls."""

    def __init__(self, lines: list[str] | None) -> None:
        self.lines = lines
        self.run = ""
        self.h = hashlib.sha256()
        self.calls = 0
        self.original: Callable[..., Any] | None = None
        for mod, attr in CONTROLLER_CALLS:
            try:
                self.original = getattr(importlib.import_module(mod), attr)
                break
            except (ModuleNotFoundError, AttributeError):
                continue
        assert self.original is not None, "no controller call found"

    def begin(self, run: str) -> None:
        self.run, self.h, self.calls = run, hashlib.sha256(), 0

    def end(self) -> dict[str, Any]:
        return {"calls": self.calls, "sha256": self.h.hexdigest()}

    def patch(self) -> None:
        """Replace the controller's call in every loaded santhrottle module that holds it."""
        original = self.original

        def recorded(state: Any, samples: Any, now_s: float) -> Any:
            state, d = original(state, samples, now_s)  # type: ignore[misc]
            line = repr(
                (
                    round(now_s, 9),
                    d.ticked,
                    d.converged,
                    d.late_ticks,
                    sorted(d.resource_classes.items()),
                    sorted(d.initiator_classes.items()),
                    sorted((r, sorted(s)) for r, s in d.joined.items() if s),
                    sorted((r, sorted(s)) for r, s in d.left.items() if s),
                )
            )
            self.h.update(line.encode())
            self.calls += 1
            if self.lines is not None:
                self.lines.append(f"{self.run} {line}")
            return state, d

        for name, m in list(sys.modules.items()):
            if not name.startswith("santhrottle.") or m is None:
                continue
            for attr, v in list(vars(m).items()):
                if v is original:
                    setattr(m, attr, recorded)


def _figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's scalar figures, rounded to 12 significant digits (repr of floats
    may differ in the last digit between a sum in another order; decisions may not)."""
    out: dict[str, Any] = {}
    for k, v in sorted(summary.items()):
        if isinstance(v, float):
            out[k] = None if math.isnan(v) else float(f"{v:.12g}")
        elif isinstance(v, int | str | bool) or v is None:
            out[k] = v
    return out


def scenarios_dir() -> Path:
    """The tree's shipped scenarios: beside its scenario parser's package."""
    pkg = Path(_mod("scenario").__file__).parent
    return pkg / "scenarios"


def wide_call(rec: Recorder) -> None:
    """200 resources x 2,000 initiators whose classes move every tick (the bench's open
    loop, smaller), straight through the controller."""
    dom = _mod("domain")
    rng = random.Random(5)
    cfg = dom.ControllerConfig(class_hysteresis=0.0)
    names = [f"vg{i}" for i in range(200)]
    new_state = _attr("state", "new_state")
    st = new_state(cfg, [dom.Resource(n, 0.010) for n in names])
    pairs = [(names[i % 200], f"10.0.{i >> 8}.{i & 255}") for i in range(2000)]
    pairs += [(names[rng.randrange(200)], ini) for _, ini in pairs[::10]]
    call = rec.original
    assert call is not None
    rec.begin("wide")
    for k in range(101):
        t = round(k * cfg.tick_s, 6)
        writes = [dom.WriteSample(r, i, rng.uniform(0.0, 4.0) * 2**20) for r, i in pairs]
        reads = [dom.ReadSample(n, 6, 0.004 + 0.010 * rng.random(), 2.0 * 2**20) for n in names]
        samples = dom.Samples(reads, writes if k % 10 == 0 else ())
        st, d = call(st, samples, t)
        rec.h.update(
            repr((sorted(d.resource_classes.items()), sorted(d.initiator_classes.items()))).encode()
        )
        rec.calls += 1


def trace(lines: list[str] | None) -> dict[str, Any]:
    rec = Recorder(lines)
    parse = _attr("scenario", "parse_scenario")
    run = _attr("engine", "run")
    summarize = _attr("measure", "summarize")
    best = _attr("baseline", "best_constant_class")
    plantgen, sweep, fleetsim = _mod("plantgen"), _mod("sweep"), _mod("fleetsim")
    rec.patch()
    out: dict[str, Any] = {}

    def one(label: str, go: Callable[[], Any], sc: Any, thr: float | None) -> Any:
        rec.begin(label)
        r = go()
        res = getattr(r, "result", r)  # a fleet run holds its RunResult
        out[label] = {**rec.end(), "figures": _figures(summarize(sc, res, thr))}
        return r

    d = scenarios_dir()
    for path in sorted(d.glob("*.toml")):
        sc = parse(path.read_text())
        name = path.stem
        one(f"{name}/uncontrolled", lambda sc=sc: run(sc), sc, None)
        for thr in sc.thresholds_s:
            one(f"{name}/T={thr * 1000:g}ms", lambda sc=sc, t=thr: run(sc, threshold_s=t), sc, thr)
    paper = parse((d / "paper.toml").read_text())
    for thr in paper.thresholds_s:
        rec.begin(f"paper/best-constant/T={thr * 1000:g}ms")
        found = best(paper, thr)
        out[f"paper/best-constant/T={thr * 1000:g}ms"] = {
            **rec.end(),
            "class": None if found is None else found[0],
        }
    for i in range(4):
        rec.begin(f"plant-1-{i}")
        judged = sweep.judge(i, 1, sweep.VARIANTS)
        out[f"plant-1-{i}"] = {**rec.end(), "judged": json.loads(json.dumps(judged, default=repr))}
    auto = parse(plantgen.generate(2, 0))
    one("plant-2-0/auto", lambda: run(auto, threshold_s=math.inf, auto=True), auto, None)
    case = fleetsim.FleetCase
    deep = parse((d / "fleet-deep.toml").read_text())
    for sc_name, sc in (("paper", paper), ("fleet-deep", deep)):
        for c in (
            case(),
            case((0.7, 0.3), "round-robin", "fleet"),
            case((0.85, 0.05, 0.05, 0.05), "service-time", "independent"),
            case((0.5, 0.5), "round-robin", "fleet", failover_at_s=60.0),
            case((0.5, 0.5), "service-time", "fleet", failover_at_s=60.0, handover=False),
        ):
            lab = f"fleet/{sc_name}/{c.label}/failover={c.failover_at_s}/handover={c.handover}"
            one(lab, lambda sc=sc, c=c: fleetsim.run_fleet(sc, c, 0.015), sc, 0.015)
    wide_call(rec)
    out["wide"] = rec.end()
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The runs whose calls or figures differ (or that only one trace has)."""
    diff = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            diff.append(k)
    return diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the trace (JSON) here")
    ap.add_argument("--lines", help="also write every call, one line each, here")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two traces")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diff = compare(a, b)
        for k in diff:
            print(f"differs: {k}")
        print(f"{len(set(a) | set(b)) - len(diff)} runs identical, {len(diff)} differ")
        return 1 if diff else 0
    lines: list[str] | None = [] if args.lines else None
    out = trace(lines)
    out_meta = {"calls": sum(v["calls"] for v in out.values()), "runs": len(out)}
    text = json.dumps({"meta": out_meta, **out}, sort_keys=True, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    if args.lines and lines is not None:
        Path(args.lines).write_text("\n".join(lines) + "\n")
    print(f"{out_meta['runs']} runs, {out_meta['calls']} controller calls", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
