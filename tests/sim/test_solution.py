"""The plant held between its changes (sim/solution.py) against the plant solved every dt:
the same runs, bit for bit (series, figures, the fleet's per-path counts, the tenants'
accounts), over shipped scenarios that use each of its branches: one path, N paths of
either policy with a failover, a constant class, the array's stalls, the group meter,
bursty streams and IO costs."""

from pathlib import Path

import pytest

from santhrottle.sim import loop
from santhrottle.sim.fleet import FleetCase, run_fleet
from santhrottle.sim.scenario import parse_scenario
from santhrottle.sim.solution import Solution, Solver
from santhrottle.sim.usage import Tenancy

pytestmark = pytest.mark.sim
SCENARIOS = Path(__file__).parents[2] / "sim" / "scenarios"


class EveryDt(Solver):
    """Solves every dt, as if nothing held."""

    def solution(self, name, t, on, applied, stalled, last_lat, version) -> Solution:
        return self.solve(name, t, on, applied, stalled, last_lat)


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the solves of the held solver."""
    solves = [0]
    solve = Solver.solve

    def counted(self, *args):
        solves[0] += 1
        return solve(self, *args)

    monkeypatch.setattr(Solver, "solve", counted)
    return solves


def _single(name: str, **kw):
    sc = parse_scenario((SCENARIOS / f"{name}.toml").read_text())
    ten = Tenancy(sc)
    result = loop.run(sc, tenancy=ten, **kw)
    return repr(result), repr(
        (ten.util_sum, ten.disk, ten.busy, ten.on_s, ten.records.t_s, ten.records.levels)
    ) + repr(sorted(ten.records.member_class.items())) + repr(
        [(b.queued, b.ios, b.served, sorted(b.bins.items())) for b in ten.backlog.values()]
    )


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("paper", {}),
        ("paper", {"threshold_s": 0.010}),
        ("paper", {"constant_class": 20}),
        ("stalls", {"threshold_s": 0.010}),
        ("groups", {"threshold_s": 0.050}),
        ("paper-groups", {"threshold_s": 0.010}),
        ("fahrrad", {"threshold_s": 0.100}),
        ("iotune", {"threshold_s": 0.002}),
    ],
)
def test_one_appliance_the_same_bit_for_bit(monkeypatch, name, kw):
    solves = _counted(monkeypatch)
    held = _single(name, **kw)
    held_solves = solves[0]
    monkeypatch.setattr(loop, "Solver", EveryDt)
    every = _single(name, **kw)
    assert held == every
    if name == "paper":  # the point of holding: far fewer solves than dt (13,000)
        assert held_solves < 13_000 / 10


@pytest.mark.parametrize(
    "case",
    [
        FleetCase((0.7, 0.3), "round-robin", "fleet"),
        FleetCase((0.85, 0.05, 0.05, 0.05), "service-time", "independent"),
        FleetCase((0.5, 0.5), "service-time", "fleet", failover_at_s=60.0, handover=False),
    ],
)
def test_a_fleet_the_same_bit_for_bit(monkeypatch, case):
    sc = parse_scenario((SCENARIOS / "fleet-deep.toml").read_text())
    held = run_fleet(sc, case, 0.015)
    monkeypatch.setattr(loop, "Solver", EveryDt)
    every = run_fleet(sc, case, 0.015)
    assert repr(held) == repr(every)
