import json
from pathlib import Path

import pytest

from santhrottle.sim.cli import main

PAPER = Path(__file__).parents[2] / "sim" / "scenarios" / "paper.toml"


def test_json_is_real_json_with_summary_and_series(capsys):
    assert main([str(PAPER), "--json", "--no-baseline"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)["data"]  # strict: NaN would fail parse_constant below
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    c = data["controlled"][0]
    for key in (
        "read_latency_p50_s",
        "read_latency_p95_s",
        "read_latency_p99_s",
        "peak_overshoot_s",
        "overshoot_duration_s",
        "time_above_threshold_pct",
        "write_throughput_bps",
        "class_changes_per_min",
    ):
        assert isinstance(c[key], float), key
    assert set(data["series"]) == {"uncontrolled", "T=10ms", "T=15ms", "T=20ms"}


def test_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra")
    png = tmp_path / "fig16.png"
    assert main([str(PAPER), "--no-baseline", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "threshold" in out and "uncontrolled" in out


def test_groups_table_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra")
    scenario = PAPER.with_name("groups.toml")
    png = tmp_path / "g.png"
    assert main([str(scenario), "--no-baseline", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "groups, T=50ms" in out and "tenant-a" in out and "pwfte" in out
    assert (tmp_path / "g-groups.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(scenario), "--no-baseline", "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["data"]["groups"]["T=50ms"]
    assert set(groups) == {"tenant-a", "tenant-b"}
    assert groups["tenant-a"]["summary"]["shortfall"] > 0.0
    assert len(groups["tenant-b"]["series"]["pwfte"]) == len(groups["tenant-b"]["series"]["t_s"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[run\n", "not valid TOML"),
        ("[run]\nduration_s = 5\nthresholds_ms = [5]\n", "resource: needs at least one"),
        (
            PAPER.read_text() + '[controller]\nti_log = "0s"\n',
            "controller.ti_log: '0s' must be above 0 (line 67)",
        ),
        (PAPER.read_text().replace("size_kib = 128", "size_kib = -5", 1), "stream[1].size_kib"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_scenario_one_line_exit_2(tmp_path, capsys, content, message):
    f = tmp_path / "bad.toml"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    assert main([str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_and_bad_arguments(tmp_path, capsys):
    assert main([str(tmp_path / "none.toml")]) == 2
    assert "scenario" in (err := capsys.readouterr().err) and "no such file" in err
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
