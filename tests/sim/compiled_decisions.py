"""The controller's decisions as JSON on stdout, from whichever santhrottle.controller
imports (pure, or compiled with PYTHONPATH; tests/sim/test_compiled.py runs both).

Covers the tick's whole path: the paper scenario (three thresholds, the
best constant delays), a grouped one (Maestro's arbiter beside the PID),
generated plants through the sweep's judge (both laws), threshold "auto"
(the LQ fit), and a wide decide() of 200 resources x 2,000 initiators whose
classes move every tick (the bench's open loop, smaller).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from pathlib import Path

from santhrottle.controller import decide as decide_module
from santhrottle.controller import state as state_module
from santhrottle.controller.domain import (
    ControllerConfig,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)
from santhrottle.sim import experiment, loop, measure, plantgen, sweep
from santhrottle.sim.scenario import parse_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "sim" / "scenarios"


def wide_step(n_resources: int = 200, n_initiators: int = 2000, ticks: int = 100) -> str:
    """A digest of every tick's Decisions (resource and initiator classes, joins, leaves)."""
    rng = random.Random(5)
    cfg = ControllerConfig(class_hysteresis=0.0)
    names = [f"vg{i}" for i in range(n_resources)]
    st = state_module.new_state(cfg, [Resource(n, 0.010) for n in names])
    pairs = [(names[i % n_resources], f"10.0.{i >> 8}.{i & 255}") for i in range(n_initiators)]
    pairs += [(names[rng.randrange(n_resources)], ini) for _, ini in pairs[::10]]
    h = hashlib.sha256()
    for k in range(ticks + 1):
        t = round(k * cfg.tick_s, 6)
        writes = [WriteSample(r, i, rng.uniform(0.0, 4.0) * 2**20) for r, i in pairs]
        reads = [ReadSample(n, 6, 0.004 + 0.010 * rng.random(), 2.0 * 2**20) for n in names]
        st, d = decide_module.decide(st, Samples(reads, writes if k % 10 == 0 else ()), t)
        h.update(
            repr(
                (
                    sorted(d.resource_classes.items()),
                    sorted(d.initiator_classes.items()),
                    sorted((r, sorted(s)) for r, s in d.joined.items()),
                    sorted((r, sorted(s)) for r, s in d.left.items()),
                )
            ).encode()
        )
    return h.hexdigest()


def main() -> int:
    out: dict[str, object] = {"decide_from": decide_module.__file__}
    paper = parse_scenario((SCENARIOS / "paper.toml").read_text())
    out["paper"] = experiment.simulate(paper, baseline=False)
    out["groups"] = experiment.simulate(
        parse_scenario((SCENARIOS / "groups.toml").read_text()), False
    )
    out["plants"] = [sweep.judge(i, 1, sweep.VARIANTS) for i in range(2)]
    auto = parse_scenario(plantgen.generate(2, 0))
    out["auto"] = measure.summarize(auto, loop.run(auto, threshold_s=math.inf, auto=True))
    out["wide_step"] = wide_step()
    json.dump(out, sys.stdout, default=repr, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
