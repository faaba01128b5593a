"""labkit.autofit.level_latency_s: the device's latency within the levels of a given
writer count, from each level's second second, over windows of enough IOs."""

from labkit import autofit
from labkit.analysis import READS, WEIGHTED_MS


def _rows(per_s: list[tuple[int, float]]) -> list[dict]:
    """One sample a second; per second (IOs, L in ms) of the device `loop0`."""
    rows, ios, weighted = [], 0, 0.0
    rows.append({"t": 0.0, "ds": {"loop0": [0] * 11}})
    for i, (n, l_ms) in enumerate(per_s, start=1):
        ios += n
        weighted += n * l_ms
        c = [0] * 11
        c[READS], c[WEIGHTED_MS] = ios, int(weighted)
        rows.append({"t": float(i), "ds": {"loop0": c}})
    return rows


def test_the_reader_alones_latency_is_the_median_of_its_levels_windows():
    # level 0 for 4 s (8, 9, 10 ms after its first second), 3 writers (40 ms), 0 again
    per_s = [(20, 30.0), (20, 8.0), (20, 9.0), (20, 10.0)] + [(50, 40.0)] * 4
    per_s += [(20, 50.0), (20, 11.0), (5, 99.0)]  # the last window has too few IOs
    rows = _rows(per_s)
    schedule = [(0.0, 0), (4.0, 3), (8.0, 0)]
    got = autofit.level_latency_s(rows, "loop0", schedule, 0)
    assert abs(got * 1e3 - 9.5) < 1e-9  # 8, 9, 10, 11: the first second of each left out
    assert abs(autofit.level_latency_s(rows, "loop0", schedule, 3) * 1e3 - 40.0) < 1e-9
    assert autofit.level_latency_s(rows, "loop0", schedule, 6) is None
    assert autofit.level_latency_s(rows, "loop1", schedule, 0) is None
