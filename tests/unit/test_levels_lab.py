"""The lab's levels experiment's host side (vagrant/experiments/levels_compare.py) on a
made-up run: the scenario it writes, the calibration, the comparisons."""

import importlib.util
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from santhrottle.controller.ladder import Ladder
from santhrottle.sim.loop import run
from santhrottle.sim.plant import Closed, Device, closed_latency
from santhrottle.sim.scenario import parse_scenario
from santhrottle.sim.usage import Tenancy

COMPARE_PY = Path(__file__).parents[2] / "vagrant" / "experiments" / "levels_compare.py"
LAB_PY = COMPARE_PY.with_name("levels_lab.py")
IOSTAT = Path(__file__).parents[1] / "fixtures" / "levels" / "iostat-x-y-t.json"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def lc():
    return _load("santhrottle_levels_compare", COMPARE_PY)


@pytest.fixture(scope="module")
def ll():
    return _load("santhrottle_levels_lab", LAB_PY)


LAB = {
    "args": {
        "levels": [5.0, 10.0, 20.0, 40.0],
        "schedule_a": [[3, "rate", 2], [4, "qd", 4]],
        "schedule_b": [[5, "rate", 2]],
        "burst_qd": 4,
    },
    "array": {"c_ms": 10.0, "m_ms": 10.0},
    "initiators": ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
    "levels": {
        "start_epoch": 100.0,
        "rows": [
            {
                "epoch": 100.0 + t,
                "daemon": {"levels": {"tenant-a": {"level": lv}, "tenant-b": {"level": 0}}},
            }
            for t, lv in enumerate([0, 0, 0, 1, 2, 3, 3])
        ]
        + [{"epoch": 107.0, "daemon_error": "timed out"}],
        "target_retrans": {"TcpRetransSegs": 0},
    },
    "utilization": [
        {
            "load": "rate=5",
            "iostat_util_pct": [0, 0, 10.0, 12.0],
            "daemon": [{"daemon": {"utilization": {"array": u}}} for u in (0.0, 0.0, 0.11, 0.13)]
            + [{"daemon_error": "timed out"}],
        },
    ],
}


def test_the_scenario_has_the_plant_the_schedules_and_the_levels(lc):
    sc = parse_scenario(lc.scenario(LAB, 0.002))
    assert sc.resources[0].intercept_s == 0.010 and sc.resources[0].slope_s_per_io == 0.010
    a = [s for s in sc.streams if s.initiator == "10.0.0.2"]
    assert [(s.depth, round(s.rate_iops, 6), s.schedule.start_s) for s in a] == [
        (1, 2.0, 0.0),
        (4, 0.0, 3.0),
    ]
    assert sc.groups[0].group.levels[0].caps == (5.0, 10.0, 20.0, 40.0)
    assert not sc.groups[0].group.targeted  # levels alone: the PID keeps the resource


def test_the_path_is_calibrated_to_what_the_lab_moved(lc):
    path = lc.overhead_s(0.010, 0.010, 4, 30.0)
    _, rates = closed_latency(Device(0.010, 0.010), 0.0, [Closed(4, path), Closed(4, path)])
    assert rates[0] == pytest.approx(30.0, rel=1e-6)


def test_levels_and_utilization_are_compared_second_by_second(lc):
    sim = {
        "tenant-a": [(float(t), lv) for t, lv in enumerate([0, 0, 0, 1, 1, 2, 3])],
        "tenant-b": [(float(t), 0) for t in range(7)],
    }
    got = lc.compare_levels(LAB, sim)["tenant-a"]
    assert got["max_level_difference"] == 1 and got["within_one_level"] == 1.0
    assert got["seconds_lab"] == {"5": 3.0, "10": 1.0, "20": 1.0, "40": 2.0}
    assert got["promotions_lab"] == 3 and got["promotions_sim"] == 3
    (u,) = lc.compare_utilization(LAB)
    assert u["daemon_pct"] == pytest.approx(12.0) and u["points"] == pytest.approx(1.0)
    assert u["daemon_spread"]["median"] == pytest.approx(12.0)
    assert u["iostat_spread"]["n"] == 2


RUN1 = Path(__file__).parents[1] / "fixtures" / "levels" / "run1-utilization.json"


def test_a_run_without_stamps_is_compared_as_it_was(lc):
    """Lab run 1's recorded utilization phase (no fio report, iostat unstamped): the
    samples after the first two, the figures docs/levels.md had from it."""
    lab = json.loads(RUN1.read_text())
    got = {u["load"]: round(u["points"], 1) for u in lc.compare_utilization(lab)}
    assert got == {"rate=5": 4.9, "rate=20": 10.9, "rate=40": 17.8, "qd=2": 16.5}


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")


def test_utilization_is_compared_over_the_loads_steady_seconds(lc):
    """fio ran 10 s and ended at 1,000: its steady seconds are 992-1,000. iostat's
    reports before it (fio starting: 0 %) and after, and the daemons' rows whose
    convergence may reach outside it, are left out; the bridge daemon is compared with
    the LV and with the initiator's disk, the target-host daemon with the busiest PV."""
    reports = [
        {"timestamp": _stamp(t), "util": {"dm-2": u, "vda": u + 2.0, "vdb": 1.0, "sdc": u * 1.3}}
        for t, u in zip(range(985, 1004), [0.0] * 7 + [60.0] * 8 + [0.0] * 4, strict=True)
    ]
    reports[9]["timestamp"] = None  # a report without a stamp: left out
    rows = [
        {
            "epoch": t + 0.3,
            "daemon": {"utilization": {"array": 0.8 if 990 <= t <= 1000 else 0.0}},
            "target": {"utilization": {"labvg": 0.61 if 991 <= t <= 1000 else 0.0}},
        }
        for t in range(985, 1004)
    ]
    rows[10] = {"epoch": 995.3, "daemon_error": "timed out", "target_error": "timed out"}
    load = {
        "load": "rate=40",
        "fio": {"end_ms": 1_000_000, "runtime_ms": 10_000},
        "lv": "dm-2",
        "pvs": ["vda", "vdb"],
        "initiator_disk": "sdc",
        "iostat": reports,
        "iostat_util_pct": [r["util"]["dm-2"] for r in reports],
        "daemon": rows,
    }
    (u,) = lc.compare_utilization({"utilization": [load]})
    assert u["window"] == (992.0, 1000.0)
    assert u["iostat_pct"] == pytest.approx(60.0) and u["iostat_spread"]["n"] == 6
    assert u["daemon_pct"] == pytest.approx(80.0) and u["daemon_spread"]["n"] == 5
    assert u["points"] == pytest.approx(20.0)
    t = u["target"]
    assert t["iostat_pct"] == pytest.approx(62.0) and t["daemon_pct"] == pytest.approx(61.0)
    assert t["points"] == pytest.approx(-1.0) and t["lv_iostat_pct"] == pytest.approx(60.0)
    i = u["initiator"]  # the wire against the initiator's own disk, the same window
    assert i["iostat_pct"] == pytest.approx(78.0) and i["points"] == pytest.approx(2.0)


def test_the_simulators_segments_start_when_fio_did(lc, tmp_path):
    """fio took 2.5 s to start each segment: tenant-a's second starts at 5.5 s, not 3;
    a segment without its report follows the one before at its nominal length."""
    lab = {**LAB, "levels": {**LAB["levels"], "start_epoch": 100.0}}
    for k, (end, runtime_ms) in enumerate([(105.5, 3000), (113.0, 4000)]):
        report = {"timestamp_ms": int(end * 1000), "jobs": [{"job_runtime": runtime_ms}]}
        (tmp_path / f"fio-levels-tenant-a-{k}.json").write_text(json.dumps(report))
    got = lc.segments(tmp_path, lab)
    assert got["tenant-a"] == [(2.5, 3.0), (9.0, 4.0)]
    assert got["tenant-b"] == [(0.0, 5.0)]  # no report: nominal
    sc = parse_scenario(lc.scenario(lab, 0.002, got))
    a = [s for s in sc.streams if s.initiator == "10.0.0.2"]
    assert [(s.schedule.start_s, s.schedule.on_s) for s in a] == [(2.5, 3.0), (9.0, 4.0)]


def test_the_labs_iostat_reports_as_sysstat_prints_them(lc, ll):
    """sysstat 12.6's `S_TIME_FORMAT=ISO iostat -x -d -y -t -o JSON vda 1 2` (recorded on
    the host; Debian 12's guest has the same version): each report's stamp and %util,
    read back by the comparison over a window holding the second one only."""
    assert ll.iostat_argv(["dm-2", "vdb"], 26)[1:] == [
        "-x", "-d", "-y", "-t", "-o", "JSON", "dm-2", "vdb", "1", "26"
    ]  # fmt: skip
    assert ll.iostat_env()["S_TIME_FORMAT"] == "ISO"
    reports = ll.iostat_reports(IOSTAT.read_text())
    assert [r["util"]["vda"] for r in reports] == [0.40, 0.00]
    t1 = datetime.fromisoformat(reports[1]["timestamp"]).timestamp()
    assert lc.iostat_in({"iostat": reports}, "vda", (t1 - 1.0, t1 + 1.0)) == [0.0]
    assert ll.iostat_reports("iostat: cannot open") == []  # no JSON: no reports


def _rows(levels_a: list[int], took_s: float | None = None) -> list[dict]:
    out = []
    for t, lv in enumerate(levels_a):
        row = {
            "t": float(t),
            "epoch": 100.0 + t,
            "daemon": {"levels": {"tenant-a": {"level": lv}, "tenant-b": {"level": 0}}},
        }
        if took_s is not None:
            row["daemon_t"] = t + took_s
        out.append(row)
    return out


def test_a_run_that_starts_above_level_zero_is_compared_from_level_zero(lc):
    """The calibration left tenant-a at level 2 (a run before levels_lab waited for level
    0): its first two seconds, demotions the schedule did not ask for, are left out on
    both sides; the rest follows the simulator's levels exactly."""
    lab = {**LAB, "levels": {**LAB["levels"], "rows": _rows([2, 1, 0, 0, 1, 2])}}
    sim = {g: [(float(t), lv) for t, lv in enumerate([0, 0, 0, 0, 1, 2])] for g in lc.TENANTS}
    got = lc.compare_levels(lab, sim)["tenant-a"]
    assert got["start_level"] == 2 and got["start_left_out_s"] == 2.0
    assert got["within_one_level"] == 1.0 and got["max_level_difference"] == 0
    assert got["seconds_lab"] == {"5": 2.0, "10": 1.0, "20": 1.0, "40": 0.0}
    assert got["seconds_sim"] == got["seconds_lab"] and got["billed_lab_over_sim"] == 1.0
    assert (got["promotions_lab"], got["demotions_lab"]) == (2, 0)
    assert lc.compare_levels(lab, sim)["tenant-b"]["start_left_out_s"] == 0.0


def test_a_lab_late_on_the_simulator_shows_at_a_lag(lc):
    """A lab whose levels are the simulator's two seconds late: two levels apart at the
    climb, the same at a lag of 2 s; a status read is stamped at its middle."""
    sim_levels = [0, 0, 1, 2, 3, 3, 3, 3, 2, 2, 1, 1, 0, 0, 0, 0]
    late = [0, 0, *sim_levels[:-2]]
    lab = {**LAB, "levels": {**LAB["levels"], "rows": _rows(late, took_s=0.6)}}
    assert [t for t, _ in lc.lab_levels(lab)["tenant-a"][:2]] == pytest.approx([0.3, 1.3])
    sim = {g: [(float(t), lv) for t, lv in enumerate(sim_levels)] for g in lc.TENANTS}
    got = lc.compare_levels(lab, sim)["tenant-a"]
    assert got["max_level_difference"] == 2 and got["within_one_level"] < 1.0
    assert got["within_one_level_by_lag"][2] == 1.0


def test_the_labs_default_levels_need_delays_under_tcps_horizon(ll):
    """With both gates off a tenant is held only at its top level: the defaults' bursts
    at QD1 need 16.5 ms there alone, 3.5 ms both at once, on C = m = 10 ms (Little's
    law, path 0); the former levels with bursts at QD4 needed 83 ms and are refused."""
    a = ll.parser().parse_args([])
    plant = {"c_ms": 10.0, "m_ms": 10.0}
    got = ll.check_hold_delays(a, plant)
    held = {tuple(x["loads"]): x for x in got if x["held"]}
    assert held[("qd=1", "idle")]["delay_s"] == pytest.approx(1 / 32 - 0.010 / (1 - 0.32))
    assert held[("qd=1", "qd=1")]["delay_s"] == pytest.approx(1 / 32 - 0.010 / (1 - 0.64))
    assert all(x["level"] == 3 for x in held.values())  # each tenant climbs to the top
    assert max(x["delay_s"] for x in got) <= ll.HOLD_DELAY_MAX_S
    assert not any(x["held"] for x in got if "qd=1" not in x["loads"])  # 1/s: level 0
    old = ll.parser().parse_args(
        ["--levels", "5,10,20,40", "--schedule-a", "20:rate=2,30:qd=4", "--burst-qd", "4"]
    )
    with pytest.raises(
        SystemExit, match=r"tenant-a at qd=4 \(tenant-b idle\) is held at 40 IOPS by 83.3 ms"
    ):
        ll.check_hold_delays(old, plant)
    assert ll.check_hold_delays(old, None) == []  # no known plant: nothing to check


def test_the_simulator_holds_the_defaults_under_40_ms(ll, lc):
    """The simulator's run of the default schedules (levels_compare's scenario, path 0):
    each tenant climbs to its top level and back to 0, and the largest delay its level's
    class asks, the knob's start of a hold included, is under 40 ms (and more than 5 ms:
    the top level's cap binds)."""
    a = vars(ll.parser().parse_args([]))
    lab = {"args": a, "array": {"c_ms": 10.0, "m_ms": 10.0}, "initiators": LAB["initiators"]}
    sc = parse_scenario(lc.scenario(lab, 0.0))
    ten = Tenancy(sc)
    run(sc, sc.thresholds_s[0], tenancy=ten)
    lad = Ladder()
    for g in lc.TENANTS:
        levels = [x[0] for x in ten.records.levels[g]]
        assert levels.count(3) >= 20 and 0 in levels[levels.index(3) :]  # up, and back
        delays = [lad.delay_s(k) for k in ten.records.level_class[g]]
        assert 0.005 < max(delays) < 0.040  # the top level's cap binds, under the horizon


def test_the_sensors_period_is_read_from_the_convergences_counted(lc):
    """30 sensor convergences over 90 s of rows: one every 3 s; a run whose rows do not
    count them has none."""
    rows = [
        {"epoch": 100.0 + t, "daemon": {"levels": {}, "converges": 10 + t // 3}} for t in range(91)
    ]
    assert lc.sensor_period_s({"levels": {"rows": rows}}) == pytest.approx(3.0)
    assert lc.sensor_period_s(LAB) is None
