"""sim/sweep.py and `santhrottle-simulate --sweep`: a small sweep, its summary, the CLI."""

import json

import pytest

from santhrottle.sim import plantgen
from santhrottle.sim.cli import main
from santhrottle.sim.scenario import ScenarioError, parse_scenario
from santhrottle.sim.sweep import (
    ORACLE,
    P95_BOUND,
    THROUGHPUT_BOUND,
    VARIANTS,
    WORST_CASES,
    check_variants,
    parse_variant,
    sweep,
)

pytestmark = pytest.mark.sim

N = 4


@pytest.fixture(scope="module")
def result():
    return sweep(N, 1, VARIANTS)


def test_summary_is_consistent_with_the_plants(result):
    plants, s = result["plants"], result["summary"]
    assert [p["index"] for p in plants] == list(range(N))
    feasible = [p for p in plants if p["feasible"]]
    assert s["plants"] == N and s["feasible"] == len(feasible) >= 1
    for name in VARIANTS:
        v = s["variants"][name]
        rows = [p["variants"][name] for p in feasible]
        assert v["feasible"] == len(rows)
        assert v["pass_all"] == sum(r["pass_all"] for r in rows)
        assert v["share_all"] == v["pass_all"] / v["feasible"]
        assert v["pass_all"] <= min(v["pass"].values())
        assert sum(b for _, b in v["by_family"].values()) == v["feasible"]
        for r in rows:
            assert r["passes"]["p95"] == (r["p95_x_threshold"] <= P95_BOUND)
            assert r["passes"]["throughput"] == (
                r["throughput_x_best_constant"] >= THROUGHPUT_BOUND
            )
            assert r["pass_all"] == (r["margin"] <= 1.0)
        worst = s["worst"][name]
        assert len(worst) == min(WORST_CASES, len(feasible))
        margins = [w["figures"][name]["margin"] for w in worst]
        assert margins == sorted(margins, reverse=True)
        assert all(set(w["figures"]) == set(w[ORACLE]) == set(VARIANTS) for w in worst)
        o = s[ORACLE][name]
        assert o["feasible"] == len(feasible)
        assert o["pass_all"] == sum(p[ORACLE][name]["pass_all"] for p in feasible)
    for p in feasible:
        assert p["best_delay_s"] >= 0.0 and p["best_write_bps"] > 0.0
        assert p["params"]["threshold_x_idle"] >= 1.5


def test_the_oracle_holds_every_resource_at_its_class():
    """sim.run's oracle_class: the class never leaves it, members reach it through
    the ramp, and a write-heavy plant's oracle holds T (plant 1/0 needs a delay)."""
    from santhrottle.sim.experiment import best_constant_class
    from santhrottle.sim.loop import run
    from santhrottle.sim.measure import summarize

    sc = parse_scenario(plantgen.generate(1, 0))
    thr = sc.thresholds_s[0]
    cls, _ = best_constant_class(sc, thr)
    assert cls > 0
    r = run(sc, threshold_s=thr, oracle_class=cls)
    settled = [k for t, k in zip(r.series.t_s, r.series.delay_class, strict=True) if t > 1.0]
    assert set(settled) == {cls}
    assert summarize(sc, r, thr)["read_latency_p95_s"] <= P95_BOUND * thr
    with pytest.raises(ValueError, match="needs threshold_s"):
        run(sc, oracle_class=cls)
    with pytest.raises(ScenarioError, match="'oracle'"):
        check_variants({ORACLE: {}})


def test_overrides_reach_the_controller_and_the_ladder():
    text = plantgen.generate(1, 0)
    sc = parse_scenario(text, {"setpoint_fraction": 0.8, "law": "paper", "ti": "1s"})
    assert sc.controller.setpoint_fraction == 0.8 and sc.controller.law == "paper"
    assert sc.controller.gains.ti_s == 1.0
    sc = parse_scenario(text, VARIANTS["paper"])  # the ladder's keys are [datapath]'s
    assert sc.controller.ladder.max_class == 100 and sc.controller.ladder.ratio == 1.0
    with pytest.raises(ScenarioError, match=r"variant 'bad': controller\.no_such_key"):
        check_variants({"bad": {"no_such_key": 1}})


def test_cli_sweep_on_two_workers_matches_the_library(result, capsys, tmp_path):
    worst = tmp_path / "worst"
    args = ["--sweep", "2", "--seed", "1", "--workers", "2", "--json"]
    assert main([*args, "--save-worst", str(worst)]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    for got, want in zip(data["plants"], result["plants"][:2], strict=True):
        assert got["description"] == want["description"]
        for name in VARIANTS:
            g, w = got["variants"].get(name), want["variants"].get(name)
            assert (g and g["p95_x_threshold"]) == (w and w["p95_x_threshold"])
    saved = sorted(worst.glob("plant-1-*.toml"))
    assert len(saved) == data["summary"]["feasible"]
    assert main([str(saved[0]), "--no-baseline"]) == 0  # replays
    assert "threshold" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sweep", "2", "x.toml"], "not both"),
        (["--sweep", "2", "--plot", "a.png"], "--plot does not go with --sweep"),
        (["--sweep", "2", "--no-baseline"], "--no-baseline does not go with --sweep"),
        (["x.toml", "--workers", "2"], "--workers goes with --sweep"),
        (["x.toml", "--seed", "2"], "--seed goes with --sweep"),
    ],
)
def test_cli_conflicts_one_line_exit_2(capsys, argv, message):
    assert main([*argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_save_worst_on_a_file_fails_before_the_sweep(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    assert main(["--sweep", "1", "--save-worst", str(f)]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--sweep", "0"],
        ["--sweep", "-1"],
        ["--sweep", "nan"],
        ["--sweep", "2", "--workers", "0"],
        ["--sweep", "2", "--seed", "1.5"],
        [],
    ],
)
def test_cli_bad_values_are_argparse_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main([*argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_parse_variant_reads_toml_values():
    assert parse_variant("sp95:setpoint_fraction=0.95") == ("sp95", {"setpoint_fraction": 0.95})
    assert parse_variant('old:law="paper", ladder_ratio=1.0') == (
        "old",
        {"law": "paper", "ladder_ratio": 1.0},
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("setpoint_fraction=0.95", "expected NAME:KEY=VALUE"),
        ("1x:setpoint_fraction=0.95", "expected NAME:KEY=VALUE"),
        ("a:setpoint_fraction", "is not KEY=VALUE"),
        ("a:setpoint_fraction=0.9,setpoint_fraction=0.8", "given twice"),
        ("a:law=paper", "is not a TOML value"),
    ],
)
def test_parse_variant_errors_name_the_problem(text, message):
    with pytest.raises(ScenarioError, match=message):
        parse_variant(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variant", "a:no_such_key=1"], "--variant: variant 'a': controller.no_such_key"),
        (["--variant", 'default:ti="1s"'], "variant 'default' is already defined"),
        (["--variant", "a:setpoint_fraction=7"], "--variant: variant 'a'"),
    ],
)
def test_cli_bad_variant_one_line_exit_2(capsys, argv, message):
    assert main(["--sweep", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_variant_is_judged_beside_the_defaults(result, capsys):
    argv = ["--sweep", "1", "--json", "--variant", "sp80:setpoint_fraction=0.8"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert set(data["summary"]["variants"]) == {*VARIANTS, "sp80"}
    plant = data["plants"][0]
    if plant["feasible"]:  # the defaults' figures are the library's; the lower setpoint's differ
        # (differ, not lower: on one plant a lower setpoint can end a little higher)
        want = result["plants"][0]["variants"]["default"]["p95_x_threshold"]
        assert plant["variants"]["default"]["p95_x_threshold"] == want
        assert plant["variants"]["sp80"]["p95_x_threshold"] != want
    assert main(["x.toml", "--variant", 'a:ti="1s"']) == 2
    assert "--variant goes with --sweep" in capsys.readouterr().err
