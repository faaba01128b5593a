"""make lab-light's report (vagrant/experiments/report_light.py) on a recorded run: the
writers' throughput of each controlled and bridged phase against the uncontrolled phase of
its repetition, how long the writers were delayed, the medians and the verdict; and the
light plant's threshold (labkit.regime.light_threshold)."""

import copy
import gzip
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from labkit import analysis, regime

ROOT = Path(__file__).parents[2]
LIGHT_PY = ROOT / "vagrant" / "experiments" / "report_light.py"
RUN = ROOT / "tests" / "fixtures" / "lab" / "closed-loop-run.json.gz"


@pytest.fixture(scope="module")
def rl():
    spec = importlib.util.spec_from_file_location("santhrottle_report_light", LIGHT_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def recorded():
    return json.loads(gzip.open(RUN).read())


def light_run(recorded: dict, threshold: str, reps: int = 2) -> dict:
    """The recorded phases as a --light run: each repetition the uncontrolled, controlled
    and bridged phase of the recording."""
    by_kind = {ph["kind"]: ph for ph in recorded["phases"]}
    phases = []
    for rep in range(reps):
        for kind in ("uncontrolled", "controlled", "bridge"):
            ph = copy.copy(by_kind[kind])
            ph["rep"] = rep
            phases.append(ph)
    unc = analysis.summarize(by_kind["uncontrolled"], None, None)
    p95 = unc["read_latency_p95_s"]
    light = {
        "wanted": ["10ms", "15ms", "20ms"],
        "tries": [
            {"m_ms": 5.0, "c_ms": 2.0, "p95_s": p95, "q": 8.0, "iops": 190, "next_m_ms": 1.0},
            {"m_ms": 1.0, "c_ms": 2.0, "p95_s": p95, "q": 9.0, "iops": 230, "next_m_ms": None},
        ],
        "m_ms": 1.0,
        "c_ms": 2.0,
        "uncontrolled_p95_s": p95,
        "light_x": regime.LIGHT_X,
        "aim_x": regime.LIGHT_AIM_X,
        "threshold": threshold,
    }
    return {"args": recorded["args"], "light": light, "phases": phases}


def test_the_light_threshold_is_the_smallest_the_uncontrolled_p95_stays_under():
    paper = [0.010, 0.015, 0.020]
    assert regime.light_threshold(0.00643, paper) == 0.010  # issue's quiet host: 0.64 T
    assert regime.light_threshold(0.008, paper) == 0.010  # exactly 0.8 T
    assert regime.light_threshold(0.009, paper) == 0.015
    assert regime.light_threshold(0.017, paper) is None  # over 0.8 x 20 ms: not light


def test_the_light_plants_slope_moves_toward_six_tenths_of_t():
    # a fast host's writers load the m = 5 plant hard: 55 ms uncontrolled (12 writers,
    # 199 IOPS at Q 8.6): the slope goes down to where the model puts p95 at <= 0.6 x 10 ms
    hard = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.055, q=8.6, iops=199)
    m = regime.light_slope(hard, 0.010)
    assert m == 1.0
    assert regime.predicted_p95_s(hard, m) <= regime.LIGHT_AIM_X * 0.010
    assert regime.predicted_p95_s(hard, m + regime.LIGHT_STEP_MS) > regime.LIGHT_AIM_X * 0.010
    # the quiet host: 6.43 ms at T = 10 ms is within 0.4-0.8 T: kept as it is
    kept = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.00643, q=0.6, iops=53)
    assert regime.light_slope(kept, 0.010) is None
    # writers that hardly load the array (3 ms): the slope goes up toward 6 ms
    idle = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.003, q=0.2, iops=40)
    up = regime.light_slope(idle, 0.010)
    assert up is not None and up > 5
    assert regime.predicted_p95_s(idle, up) <= regime.LIGHT_AIM_X * 0.010
    # no writes measured: nothing to model
    none = regime.Uncontrolled(m_ms=5, c_ms=2, writers=12, p95_s=0.055, q=0.0, iops=0.0)
    assert regime.light_slope(none, 0.010) is None


def test_each_phases_writes_against_its_repetitions_uncontrolled_phase(rl, recorded):
    sm = rl.summary(light_run(recorded, "10ms"))
    by_kind = {ph["kind"]: ph for ph in recorded["phases"]}
    unc = analysis.summarize(by_kind["uncontrolled"], 0.010, None)["write_bytes_per_s"]
    ctl = analysis.summarize(by_kind["controlled"], 0.010, None)["write_bytes_per_s"]
    br = analysis.summarize(by_kind["bridge"], 0.010, None)["write_bytes_per_s"]
    assert [r["rep"] for r in sm["repetitions"]] == [0, 1]
    for r in sm["repetitions"]:
        assert r["controlled"]["vs_uncontrolled_writes"] == pytest.approx(ctl / unc)
        assert r["bridge"]["vs_uncontrolled_writes"] == pytest.approx(br / unc)
        # the recording is the paper's regime: the controller delayed the writers
        assert 0.0 < r["controlled"]["delayed_share"] <= 1.0
        assert "delayed_share" not in r["uncontrolled"]
    med, lo, hi = sm["medians"]["controlled.vs_uncontrolled_writes"]
    assert med == lo == hi == pytest.approx(ctl / unc)
    assert sm["conserved"] is (ctl / unc >= regime.CONSERVE_AT_LEAST)
    # its uncontrolled p95 (59 ms) is over T: not the light plant, and the report says so
    assert sm["uncontrolled_under_t"] is False
    text = rl.lines(sm)
    assert text[0].startswith("WORK CONSERVATION ")
    assert any("went over T" in x for x in text)
    assert any("m 5 ms/IO" in x for x in text) and any("chosen: m 1 ms/IO" in x for x in text)
    assert sum(1 for x in text if re.match(r"\s+\d+ controlled ", x)) == 2


def test_a_run_without_a_light_threshold_says_so(rl, recorded):
    raw = light_run(recorded, None, reps=1)
    raw["phases"] = raw["phases"][:1]  # closed_loop.py --light stops after the first
    sm = rl.summary(raw)
    line, *tries = rl.lines(sm)
    assert line.startswith("WORK CONSERVATION NOT MEASURED")
    assert len(tries) == 3  # the two slopes tried and the one kept
    assert sm["conserved"] is None


def test_what_the_initiator_saw_is_reported_beside_the_array(rl, recorded):
    """A run whose phases logged the reader's fio latency: the report gives the
    initiator's p95 per kind of phase and the bridge's wire; a run from before, none."""
    assert not any(
        "initiator's p95" in x for x in rl.lines(rl.summary(light_run(recorded, "10ms")))
    )
    raw = light_run(recorded, "10ms")
    for i, ph in enumerate(raw["phases"]):
        ph = raw["phases"][i] = copy.copy(ph)
        ph["reader_clat"] = [(float(t), 0.004 + 0.001 * (i % 3)) for t in range(0, 200)]
    sm = rl.summary(raw)
    assert sm["medians"]["bridge.reader_clat_p95_s"][0] == pytest.approx(0.006)
    line = next(x for x in rl.lines(sm) if "initiator's p95" in x)
    assert "uncontrolled 4.00 ms" in line and "bridge 6.00 ms" in line


def test_an_observed_phase_splits_the_loss_into_presence_and_control(rl, recorded):
    """--observed: the daemon with no threshold beside the controlled phase; its writes
    against the uncontrolled phase (the daemon's presence and the lab's probe) and the
    controlled writes against it (control), both reported, the verdict still the
    controlled writers' against the uncontrolled ones."""
    raw = light_run(recorded, "10ms")
    by_kind = {ph["kind"]: ph for ph in recorded["phases"]}
    for rep in range(2):  # the recorded bridge phase stands in for an observed one
        ph = copy.copy(by_kind["bridge"])
        ph.update(kind="observed", rep=rep, cpu={**ph["cpu"], "probes_cpu_s": {"status": 1.5}})
        raw["phases"].append(ph)
    sm = rl.summary(raw)
    unc = analysis.summarize(by_kind["uncontrolled"], 0.010, None)["write_bytes_per_s"]
    ctl = analysis.summarize(by_kind["controlled"], 0.010, None)["write_bytes_per_s"]
    obs = analysis.summarize(by_kind["bridge"], 0.010, None)["write_bytes_per_s"]
    for r in sm["repetitions"]:
        assert r["observed"]["vs_uncontrolled_writes"] == pytest.approx(obs / unc)
        assert r["controlled"]["vs_observed_writes"] == pytest.approx(ctl / obs)
        assert r["observed"]["status_probe_cpu_share"] > 0.0
    assert sm["conserved"] is (ctl / unc >= regime.CONSERVE_AT_LEAST)
    text = "\n".join(rl.lines(sm))
    assert "the daemon with no threshold (observed) moved" in text
    assert sum(1 for x in text.splitlines() if re.match(r"\s+\d+ observed ", x)) == 2


def test_a_bridge_observed_phase_splits_the_bridges_loss(rl, recorded):
    """--observed with --bridge: the bridge's daemon with no threshold; its writes against
    the uncontrolled phase (forwarding and the wire sensor) and the bridge's controlled
    writes against it (control there), reported apart from the target host's split."""
    raw = light_run(recorded, "10ms")
    by_kind = {ph["kind"]: ph for ph in recorded["phases"]}
    for rep in range(2):  # the recorded controlled phase stands in for a bridge-observed one
        ph = copy.copy(by_kind["controlled"])
        ph.update(kind="bridge-observed", rep=rep)
        raw["phases"].append(ph)
    sm = rl.summary(raw)
    unc = analysis.summarize(by_kind["uncontrolled"], 0.010, None)["write_bytes_per_s"]
    ctl = analysis.summarize(by_kind["controlled"], 0.010, None)["write_bytes_per_s"]
    br = analysis.summarize(by_kind["bridge"], 0.010, None)["write_bytes_per_s"]
    for r in sm["repetitions"]:
        assert r["bridge-observed"]["vs_uncontrolled_writes"] == pytest.approx(ctl / unc)
        assert r["bridge"]["vs_observed_writes"] == pytest.approx(br / ctl)
        assert "vs_observed_writes" not in r["controlled"]  # no observed phase on the target
    md = sm["medians"]
    assert md["bridge.vs_observed_writes"][0] == pytest.approx(br / ctl)
    text = "\n".join(rl.lines(sm))
    assert "the bridge's daemon with no threshold (bridge-observed) moved" in text
    assert f"{br / ctl:.1%}" in text
    assert sum(1 for x in text.splitlines() if re.match(r"\s+\d+ bridge-observed ", x)) == 2


def test_make_lab_light_runs_the_array_bound_plant_and_the_admins_args_win(monkeypatch):
    """report.py --light: one writer job per host on C 2 / m 3 at T 20 ms with the observed
    phase (the plant of docs/lab.md's figure); what ARGS adds comes after, so it wins."""
    spec = importlib.util.spec_from_file_location(
        "santhrottle_report", ROOT / "vagrant" / "experiments" / "report.py"
    )
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(LIGHT_PY.parent))  # its siblings, as when run
    spec.loader.exec_module(mod)
    ran = []

    class Done:
        returncode = 0

    monkeypatch.setattr(mod.subprocess, "run", lambda argv, **kw: ran.append(argv) or Done())
    monkeypatch.setattr(mod, "report", lambda out: 0)
    out = mod.CHECKOUT / "results" / "test-light-argv"
    monkeypatch.setattr(
        "sys.argv", ["report.py", "--light", "--out", str(out), "--thresholds", "15ms"]
    )
    try:
        assert mod.main() == 0
    finally:
        out.rmdir()
    (argv,) = ran  # one guest, no curves
    assert argv[argv.index("--array") + 1] == "nbd:c_ms=2,m_ms=3"
    guest = argv[argv.index(str(mod.GUEST)) + 1 :]
    assert guest[guest.index("--writer-jobs") + 1] == "1"
    assert "--observed" in guest and "--light" in guest
    thresholds = [guest[i + 1] for i, x in enumerate(guest) if x == "--thresholds"]
    assert thresholds == ["20ms", "15ms"]  # closed_loop's argparse keeps the last


def test_bridge_only_goes_with_light_and_runs_the_bridge(monkeypatch):
    """closed_loop.py --light --bridge-only: the bridge's phases alone (the harness's
    argument check; light() then queues only the bridge at T per repetition)."""
    spec = importlib.util.spec_from_file_location(
        "santhrottle_closed_loop", ROOT / "vagrant" / "experiments" / "closed_loop.py"
    )
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(LIGHT_PY.parent))
    monkeypatch.setitem(sys.modules, "santhrottle_closed_loop", mod)  # its dataclasses
    spec.loader.exec_module(mod)
    monkeypatch.setattr("sys.argv", ["closed_loop.py", "--out", "x", "--light", "--bridge-only"])
    a = mod.arguments()
    assert a.bridge_only and a.bridge
    monkeypatch.setattr("sys.argv", ["closed_loop.py", "--out", "x", "--bridge-only"])
    with pytest.raises(SystemExit):
        mod.arguments()


def test_report_reads_a_bridge_check_run_with_its_own_table(
    monkeypatch, recorded, tmp_path, capsys
):
    """report.py on a closed_loop.py --bridge-check run (its uncontrolled phase, then the
    bridge's, no paper phases): the bridge check's table and bridge-check.json, not the
    paper's report (which has no controlled phase to read there)."""
    spec = importlib.util.spec_from_file_location(
        "santhrottle_report", ROOT / "vagrant" / "experiments" / "report.py"
    )
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(LIGHT_PY.parent))
    spec.loader.exec_module(mod)
    by_kind = {ph["kind"]: ph for ph in recorded["phases"]}
    raw = {
        **recorded,
        "args": {**recorded["args"], "bridge_check": True, "thresholds": "10ms"},
        "phases": [by_kind["uncontrolled"], {**by_kind["bridge"], "rep": 0}],
    }
    raw["phases"][0]["rep"] = 0
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    assert mod.report(tmp_path) == 0
    table = json.loads((tmp_path / "bridge-check.json").read_text())
    assert [p["label"] for p in table["phases"]] == ["uncontrolled", "bridge"]
    assert "array p95" in capsys.readouterr().out
    assert not (tmp_path / "summary.json").exists()
