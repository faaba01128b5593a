"""vagrant/experiments/report.py: a phase's writer throughput counts each on-period from
its first write (the emulated writers' fio starts seconds after the mark)."""

import importlib.util
from pathlib import Path

import pytest

REPORT_PY = Path(__file__).resolve().parents[2] / "vagrant" / "experiments" / "report.py"
SECTOR_B = 512
TICK_S = 0.1


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("santhrottle_lab_report_unit", REPORT_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _phase(report, start_after_mark_s: float, rate_bps: float) -> dict:
    """A static phase of two on-periods of 20 s (marks at 5 s and 30 s, writers off at
    25 s and 50 s) whose writer starts writing `start_after_mark_s` after each mark, at
    rate_bps; a reader at 4 ms throughout."""
    marks = [(5.0, 25.0), (30.0, 50.0)]
    rows, sectors = [], 0.0
    for i in range(int(55.0 / TICK_S)):
        t = i * TICK_S
        if any(a + start_after_mark_s <= t < b for a, b in marks):
            sectors += rate_bps * TICK_S / SECTOR_B
        row = [0] * 11
        row[report.READS], row[report.READ_TICKS] = i + 1, 4 * (i + 1)  # 4 ms a read
        wrow = [0] * 11
        wrow[report.WRITE_SECTORS] = int(sectors)
        rows.append({"t": t, "ds": {"dm-0": row, "dm-1": wrow, "vdc": [0] * 11}})
    events = [[0.0, "reader on"], [0.0, "settle"]]
    for a, b in marks:
        events += [[a, "writers on"], [b, "writers off"]]
    return {
        "rows": rows,
        "events": events,
        "reader_dm": "dm-0",
        "writer_dms": ["dm-1"],
        "array": "vdc",
        "nstat": {},
        "sets_left_after_stop": [],
        "writer_ips": [],
    }


def test_writes_count_from_the_first_write_not_from_the_mark(report):
    rate = 4e6
    late = report.summarize(_phase(report, 12.0, rate), 0.015, None)
    at_once = report.summarize(_phase(report, 0.0, rate), 0.015, None)
    # the same writers, started 12 s late: the same throughput while they write
    assert late["write_bytes_per_s"] == pytest.approx(rate, rel=0.03)
    assert at_once["write_bytes_per_s"] == pytest.approx(rate, rel=0.03)
    assert late["writers_start_s"] == pytest.approx([12.0, 12.0], abs=0.15)
    assert at_once["writers_start_s"] == pytest.approx([0.0, 0.0], abs=0.15)


def test_an_on_period_without_writes_counts_nothing(report):
    never = report.summarize(_phase(report, 30.0, 4e6), 0.015, None)
    assert never["write_bytes_per_s"] == 0.0
    assert never["writers_start_s"] == [20.0, 20.0]  # to the writers' end


def test_a_window_spans_at_least_a_second_whatever_the_samples_spacing(report):
    """Samples bunch after a stall of the guest's sampler (it catches up): a window of ten
    samples would span 0.1 s here and 5 s there; a window reaches back >= 1 s."""
    ts = [0.0, 0.01, 0.02, 0.03, 5.0, 5.01, 5.02, 5.03, 5.04, 5.5, 6.0, 6.5]
    rows = []
    for t in ts:
        # 100 reads a second, 4 ms each until 5 s, then 8 ms (read time in ms, cumulative)
        ms = 400 * t if t <= 5.0 else 2000 + 800 * (t - 5.0)
        row = [0] * 11
        row[report.READS], row[report.READ_TICKS] = round(100 * t), round(ms)
        rows.append({"t": t, "ds": {"dm-0": row, "dm-1": [0] * 11, "vdc": [0] * 11}})
    ph = {"rows": rows, "reader_dm": "dm-0", "writer_dms": ["dm-1"], "array": "vdc"}
    w = {t: lat for t, lat, _, _ in report.windows(ph)}
    assert sorted(w) == [5.0, 5.01, 5.02, 5.03, 5.04, 5.5, 6.0, 6.5]
    assert w[5.0] == pytest.approx(0.004)  # back to 0.03: the stall's 5 s at 4 ms
    assert w[6.0] == pytest.approx(0.008)  # back to 5.0: 1 s at 8 ms
    assert w[6.5] == pytest.approx(0.008)  # back to 5.5
