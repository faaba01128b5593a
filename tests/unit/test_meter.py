"""Metering (daemon/core/meter.py, meterstore.py, metering.py) and `santhrottle meter`
(cli/meter.py): the usage per group and period, kept across restarts and a kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santhrottle.appliance.cli.main import main
from santhrottle.appliance.daemon.core.meter import Meter, Period, Usage
from santhrottle.appliance.daemon.core.meterstore import MeterKeeper, MeterStore
from santhrottle.controller.domain import ControllerConfig, IoSample, Resource
from santhrottle.controller.groups import Group
from santhrottle.controller.levels import LadderState, Levels, LevelState
from santhrottle.controller.restate import configure_groups
from santhrottle.controller.state import new_state

HOUR = 3600.0
T0 = 1_764_320_400.0  # 2025-11-28 09:00 UTC, a period's start


def _ctl():
    st = new_state(ControllerConfig(), [Resource("vg0", 0.01)])
    configure_groups(st, [Group("gold", levels=(Levels((600.0, 1200.0)),))], {"a": "gold"}, [])
    return st


def test_the_worked_example():
    """Samples at 0..4 s; promoted between the samples at 2 and 3; class 4 at 1 and 2."""
    st, m = _ctl(), Meter(HOUR)
    for t in range(5):
        if t == 1:
            st.effective["a"] = 4
        if t == 3:  # back at class 0; the controller promoted it
            del st.effective["a"]
            st.levels.groups["gold"] = LevelState([LadderState(level=1)])
        m.sample(st, [], float(t), T0 + t, False)
    u = m.totals["gold"]
    assert u.level_s == {"iops": {"600": 3.0, "1200": 1.0}}
    assert u.delay_s == {4: 2.0}
    assert m.current is not None and m.current.groups["gold"].level_s == u.level_s


def test_ios_and_bytes_go_to_the_members_group_and_a_pause_delays_nobody():
    st, m = _ctl(), Meter(HOUR)
    st.effective["a"] = 7
    m.sample(
        st,
        [IoSample("vg0", "a", 100.0, 409600.0, 60.0), IoSample("vg0", "x", 5.0, 1.0, 0.0)],
        0.0,
        T0,
        True,
    )
    m.sample(st, [], 1.0, T0 + 1, True)  # paused: no delay applied
    assert m.totals["gold"].ios == 100.0 and m.totals["gold"].bytes == 409600.0
    assert m.totals["gold"].delay_s == {}
    m.sample(st, [], 2.0, T0 + 2, False)
    m.sample(st, [], 3.0, T0 + 3, False)
    assert m.totals["gold"].delay_s == {7: 1.0}


def test_a_new_period_closes_the_last_and_the_store_logs_it(tmp_path):
    st, m = _ctl(), Meter(HOUR)
    store = MeterStore(tmp_path, clock=lambda: T0 + HOUR + 10)
    m.sample(st, [], 0.0, T0 + HOUR - 3, False)
    m.sample(st, [], 2.0, T0 + HOUR - 1, False)
    m.sample(st, [], 4.0, T0 + HOUR + 1, False)  # the first sample of the next hour
    totals, cur, closed = m.snapshot()
    assert [p.start for p in closed] == [T0] and cur is not None and cur.start == T0 + HOUR
    store.save(totals, cur, closed)
    lines = (tmp_path / "meter" / "2025-11.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["group"] == "gold"
    kept = store.load()
    assert kept.totals["gold"].level_s == {"iops": {"600": 4.0}}
    assert kept.current is not None and kept.current.start == T0 + HOUR
    rows = list(store.periods(0.0))
    assert [(r[0], r[2]) for r in rows] == [(T0, "gold"), (T0 + HOUR, "gold")]
    assert list(store.periods(T0 + HOUR + 1)) == [rows[1]]


def test_an_invalid_meter_file_is_set_aside_and_metering_starts_from_zero(tmp_path, caplog):
    (tmp_path / "meter.json").write_text('{"version": 1, "totals": {"gold": {"ios": -5}}}')
    kept = MeterKeeper(MeterStore(tmp_path)).load()
    assert kept.totals == {} and kept.current is None
    assert (tmp_path / "meter.json.invalid").exists()
    assert "ios: -5 is not a count" in caplog.text


def test_a_failed_write_keeps_the_closed_periods_for_the_next(tmp_path):
    where = tmp_path / "state"
    where.write_text("a file where the directory should be")
    keeper = MeterKeeper(MeterStore(where))
    p = Period(T0, T0 + HOUR, {"gold": Usage(ios=1.0)})
    assert not keeper.save(lambda: ({}, None, [p]))
    where.unlink()
    assert keeper.save(lambda: ({}, None, []))
    assert json.loads((where / "meter" / "2025-11.jsonl").read_text())["ios"] == 1.0


def test_prune_deletes_whole_old_months(tmp_path):
    store = MeterStore(tmp_path)
    (tmp_path / "meter").mkdir()
    for month in ("2024-01", "2025-10", "2025-11"):
        (tmp_path / "meter" / f"{month}.jsonl").write_text("")
    gone = store.prune(40 * 86400.0, T0)
    assert [p.name for p in gone] == ["2024-01.jsonl"]


def _meter_files(d: Path) -> None:
    store = MeterStore(d)
    p1 = Period(
        T0,
        T0 + HOUR,
        {"gold": Usage({"iops": {"600": 2950.0, "1200": 650.0}}, 1e6, 4e9, {4: 12.5})},
    )
    p2 = Period(T0 + HOUR, T0 + 2 * HOUR, {"gold": Usage({"iops": {"600": 3600.0}}, 10.0, 40960.0)})
    store.save({"gold": Usage()}, p2, [p1])


def test_meter_prints_the_cost_at_the_configured_prices(tmp_path, capsys):
    _meter_files(tmp_path)
    conf = tmp_path / "s.toml"
    conf.write_text('[datapath]\ndevices = ["eth1"]\n[metering]\nprice_per_iops_hour = 0.0001\n')
    assert main(["meter", "--config", str(conf), "--state-dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    first = data["periods"][0]
    assert first["start"] == "2025-11-28T09:00:00Z" and first["group"] == "gold"
    assert first["cost"] == pytest.approx((2950 * 600 + 650 * 1200) * 0.0001 / 3600)
    assert data["totals"]["gold"]["ios"] == pytest.approx(1e6 + 10)
    assert main(["meter", "--config", str(conf), "--state-dir", str(tmp_path), "--by", "all"]) == 0
    out = capsys.readouterr().out
    assert "iops 600:6550s 1200:650s" in out and "0.1308" in out
    assert main(["meter", "--config", str(conf), "--state-dir", str(tmp_path), "--csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].endswith("cost,iops@600_seconds,iops@1200_seconds")
    assert len(rows) == 3


def test_meter_since_and_bad_input(tmp_path, capsys):
    _meter_files(tmp_path)
    args = ["meter", "--state-dir", str(tmp_path), "--config", str(tmp_path / "none.toml")]
    assert main([*args, "--json"]) == 2  # a config given that does not exist
    capsys.readouterr()
    conf = tmp_path / "s.toml"
    conf.write_text('[datapath]\ndevices = ["eth1"]\n')
    args = ["meter", "--state-dir", str(tmp_path), "--config", str(conf)]
    assert main([*args, "--since", "2025-11-28T10:30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert [p["start"] for p in data["periods"]] == ["2025-11-28T10:00:00Z"]
    (tmp_path / "meter.json").write_text("{")
    assert main(args) == 1
    assert "not valid JSON" in capsys.readouterr().err
    gone = ["meter", "--state-dir", str(tmp_path / "typo"), "--config", str(conf)]
    assert main(gone) == 1
    assert capsys.readouterr().err == (
        f"santhrottle: cannot read the meter in {tmp_path / 'typo'}: no such directory\n"
    )


def _child(state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "meter_child.py"), str(state)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _lines_until(proc: subprocess.Popen, saves: int) -> list[str]:
    out = []
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line.split())
        if line.startswith("saved") and int(line.split()[1]) >= saves:
            break
    return out


def test_the_counters_survive_a_kill_9_losing_at_most_one_convergence(tmp_path):
    """A real process (the daemon's loop with fake sensors, a convergence every 100 ms)
    is killed with SIGKILL between two writes of its meter; what the file holds is a
    convergence the process finished writing, and the one it was in is all that is
    lost; a restart continues from the file, not from zero."""
    levels_saved = []
    for run in range(2):
        proc = _child(tmp_path)
        lines = _lines_until(proc, 5 + 3 * run)
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        lines += [x.split() for x in rest.splitlines()]
        assert lines[0][0] == "restored"
        restored = float(lines[0][1])
        assert restored == pytest.approx(levels_saved[-1] if levels_saved else 0.0)
        written = [float(x[2]) for x in lines if x[0] == "saved"]
        counted = [float(x[2]) for x in lines if x[0] == "before"]
        kept = json.loads((tmp_path / "meter.json").read_text())["totals"]["gold"]
        on_disk = sum(sum(c.values()) for c in kept["level_seconds"].values())
        # the file holds the last convergence written, or the one being written
        assert on_disk == pytest.approx(written[-1]) or on_disk == pytest.approx(counted[-1])
        assert counted.index(counted[-1]) >= len(counted) - 1  # one in flight at most
        assert on_disk >= restored  # continued from what the last run left
        levels_saved.append(on_disk)
    assert levels_saved[1] > levels_saved[0] > 0.0


def test_an_unchanged_meter_is_not_written_again(tmp_path):
    """Before, a daemon without metered groups wrote and fsynced the same meter.json at
    every convergence (a second), in the lab guest's CPU the target's writers needed."""
    store = MeterStore(tmp_path)
    writes = []
    real = store.save
    store.save = lambda *a: (writes.append(a), real(*a))[1]
    keeper = MeterKeeper(store)
    cur = Period(T0, T0 + HOUR, {})
    for _ in range(3):
        assert keeper.save(lambda: ({}, Period(T0, T0 + HOUR, {}), []))
    assert len(writes) == 1 and (tmp_path / "meter.json").exists()
    assert keeper.save(lambda: ({"gold": Usage(ios=1.0)}, cur, []))  # a change: written
    assert keeper.save(lambda: ({"gold": Usage(ios=1.0)}, cur, [cur]))  # a period closed
    assert len(writes) == 3
