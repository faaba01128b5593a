"""Issue 22: a fleet of appliances holds the threshold like one appliance seeing all traffic."""

from pathlib import Path

import pytest

from santhrottle.sim.fleet import FleetCase, fleet_summary, run_fleet
from santhrottle.sim.loop import run
from santhrottle.sim.measure import summarize
from santhrottle.sim.paths import flows
from santhrottle.sim.plant import Device, closed_latency
from santhrottle.sim.scenario import parse_scenario

SCENARIOS = Path(__file__).parents[2] / "sim" / "scenarios"
T_S = 0.015


@pytest.fixture(scope="module")
def paper():
    return parse_scenario((SCENARIOS / "paper.toml").read_text())


@pytest.fixture(scope="module")
def deep():
    return parse_scenario((SCENARIOS / "fleet-deep.toml").read_text())


@pytest.fixture(scope="module")
def single(paper):
    return run_fleet(paper, FleetCase(), T_S)


def test_single_appliance_is_the_simulator(paper, single):
    ref = run(paper, threshold_s=T_S)
    assert single.result.write_bytes_after_settle == pytest.approx(ref.write_bytes_after_settle)
    assert single.result.series.read_latency_s == ref.series.read_latency_s
    assert single.result.series.delay_class == ref.series.delay_class


@pytest.mark.parametrize("split", [(0.7, 0.3), (0.4, 0.3, 0.2, 0.1)], ids=["70-30", "40-30-20-10"])
def test_fleet_holds_the_threshold_like_one_appliance(paper, single, split):
    one = summarize(paper, single.result)
    fr = run_fleet(paper, FleetCase(split, "round-robin", "fleet"), T_S)
    s = summarize(paper, fr.result)
    assert s["read_latency_p95_s"] <= T_S
    assert s["time_above_threshold_pct"] <= one["time_above_threshold_pct"] + 1.0
    assert s["write_throughput_bps"] >= 0.97 * one["write_throughput_bps"]
    assert fr.refused == 0  # one leader, one epoch: its seqs only grow


def test_same_delay_on_every_path_is_one_appliances_plant(paper):
    """A constant class on every path: any split, either policy, the same writes as one."""
    ref = run(paper, constant_class=25)
    for case in (
        FleetCase((0.9, 0.1), "round-robin", "fleet"),
        FleetCase((0.85, 0.05, 0.05, 0.05), "service-time", "independent"),
    ):
        fr = run_fleet(paper, case, T_S, constant_class=25)
        assert fr.result.write_bytes_after_settle == pytest.approx(ref.write_bytes_after_settle)


def test_service_time_sends_the_ios_to_the_undelayed_path():
    f = (0.9, 0.1)
    closed = [(_Stream(), f, [0.010, 0.0])]
    dev = Device(0.002, 0.003)
    rr, _ = flows(closed, "round-robin")
    st, owner = flows(closed, "service-time")
    assert [c.outside_s for c in rr] == [pytest.approx(0.009)]
    _lat, rates = closed_latency(dev, 0.0, st)
    assert owner == [(0, 0), (0, 1)]
    assert rates[1] / sum(rates) > 0.18  # 10 % of the outstanding IOs, 20 % of the IOs
    _, rr_rates = closed_latency(dev, 0.0, rr)
    assert sum(rates) > sum(rr_rates)  # and the writer gets more through in all


class _Stream:
    depth = 4.0
    rate_iops = 0.0


def test_independent_appliances_lose_the_threshold_where_the_fleet_holds_it(deep):
    """QD16 writers of 4 KiB, 85/5/5/5 service-time: an appliance seeing 5 % of a host does
    not judge it write-heavy, its path stays undelayed, and the queue-length policy sends
    the IOs there; the fleet, judging the summed rate, throttles every path."""
    split = (0.85, 0.05, 0.05, 0.05)
    ind = run_fleet(deep, FleetCase(split, "service-time", "independent"), T_S)
    fleet = run_fleet(deep, FleetCase(split, "service-time", "fleet"), T_S)
    si, sf = fleet_summary(deep, ind, None), fleet_summary(deep, fleet, None)
    assert sf["p95_over_T"] <= 1.0
    assert sf["above_T_pct"] <= 1.0
    assert si["p95_over_T"] > 1.5
    # the appliance on the reader's 85 % path sees every writer at 5 % only: none throttled
    assert all(v > 90.0 for v in si["unthrottled_pct"][0].values())
    assert all(v == 0.0 for u in sf["unthrottled_pct"] for v in u.values())


def test_fleet_without_lag_is_one_appliance(paper, single):
    """The merge loses nothing: without the publish lag the fleet decides as one appliance."""
    fr = run_fleet(
        paper, FleetCase((0.4, 0.3, 0.2, 0.1), "service-time", "fleet", lag_ticks=0), T_S
    )
    assert fr.result.series.delay_class == single.result.series.delay_class
    assert fr.result.write_bytes_after_settle == pytest.approx(
        single.result.write_bytes_after_settle
    )


def _peak_over_t(fr, start_s, end_s):
    s = fr.result.series
    return (
        max(v for t, v in zip(s.t_s, s.read_latency_s, strict=True) if start_s <= t < end_s) / T_S
    )


def test_failover_with_handover_holds_and_fences_the_old_leader(paper):
    """The leader dies at 62 s (mid-burst); none decides for ELECTION_S; the appliances keep
    the last classes; the new leader (epoch 2) starts from them. The old leader's last
    decision, delivered late, is refused. Without the handover the new leader starts at 0."""
    case = FleetCase((0.7, 0.3), "round-robin", "fleet", failover_at_s=62.0)
    fr = run_fleet(paper, case, T_S)
    assert fr.refused >= 1
    assert _peak_over_t(fr, 60.0, 75.0) <= 1.0
    cold = run_fleet(
        paper,
        FleetCase((0.7, 0.3), "round-robin", "fleet", failover_at_s=62.0, handover=False),
        T_S,
    )
    assert _peak_over_t(cold, 60.0, 75.0) > 1.5
