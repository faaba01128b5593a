"""labkit.analysis: a phase's windows, writes, fits and summary; on made-up phases (each rule
alone) and on a recorded run (the figures report.py printed for it, before the kit)."""

import gzip
import json
from pathlib import Path

import pytest
from labkit import analysis as report

SECTOR_B = 512
TICK_S = 0.1


def _phase(start_after_mark_s: float, rate_bps: float) -> dict:
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


def test_writes_count_from_the_first_write_not_from_the_mark():
    rate = 4e6
    late = report.summarize(_phase(12.0, rate), 0.015, None)
    at_once = report.summarize(_phase(0.0, rate), 0.015, None)
    # the same writers, started 12 s late: the same throughput while they write
    assert late["write_bytes_per_s"] == pytest.approx(rate, rel=0.03)
    assert at_once["write_bytes_per_s"] == pytest.approx(rate, rel=0.03)
    assert late["writers_start_s"] == pytest.approx([12.0, 12.0], abs=0.15)
    assert at_once["writers_start_s"] == pytest.approx([0.0, 0.0], abs=0.15)


def test_an_on_period_without_writes_counts_nothing():
    never = report.summarize(_phase(30.0, 4e6), 0.015, None)
    assert never["write_bytes_per_s"] == 0.0
    assert never["writers_start_s"] == [20.0, 20.0]  # to the writers' end


def test_a_window_spans_at_least_a_second_whatever_the_samples_spacing():
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
    w = {x.t: x.read_latency_s for x in report.phase_windows(ph)}
    assert sorted(w) == [5.0, 5.01, 5.02, 5.03, 5.04, 5.5, 6.0, 6.5]
    assert w[5.0] == pytest.approx(0.004)  # back to 0.03: the stall's 5 s at 4 ms
    assert w[6.0] == pytest.approx(0.008)  # back to 5.0: 1 s at 8 ms
    assert w[6.5] == pytest.approx(0.008)  # back to 5.5


def test_the_lq_fit_finds_a_line_and_says_how_well():
    pts = [(q, 0.002 + 0.005 * q) for q in (0.2, 1.0, 3.0, 6.0, 10.5)]
    f = report.fit_line(pts)
    assert (f.c_s, f.m_s, f.r2, f.points) == pytest.approx((0.002, 0.005, 1.0, 5))
    noisy = report.fit_line([(0, 0.002), (1, 0.009), (2, 0.010), (3, None)])
    assert noisy.points == 3 and 0.8 < noisy.r2 < 1.0  # None: a window without reads
    assert report.fit_line([(1.0, 0.003)]) is None


def test_a_devices_and_the_plants_deltas_are_littles_law():
    d0 = [100, 0, 800, 400, 50, 0, 12800, 1000, 0, 900, 1500]
    d1 = [200, 0, 1600, 900, 150, 0, 38400, 3000, 0, 1800, 4000]
    d = report.device_delta(d0, d1, 2.0)
    assert d["ios"] == 200 and d["read_l_s"] == pytest.approx(0.005)
    assert d["q"] == pytest.approx(2.5 / 2.0)  # 2,500 ms of IO time in 2 s
    assert d["l_s"] == pytest.approx(2.5 / 200)
    assert d["write_mb_s"] == pytest.approx(25600 * 512 / 2.0 / 1e6)
    s0 = {"t": 10.0, "ios": 100, "inflight_s": 5.0, "lat_sum_s": 1.0, "n_arrival_sum": 50}
    s1 = {"t": 12.0, "ios": 300, "inflight_s": 9.0, "lat_sum_s": 5.0, "n_arrival_sum": 450}
    p = report.plant_delta(s0, s1)
    assert (p["q"], p["l_s"], p["iops"]) == pytest.approx((2.0, 0.02, 100.0))
    assert report.plant_delta(s1, s0) is None


FIXTURES = Path(__file__).parents[1] / "fixtures" / "lab"


def _close(a, b, path=""):
    """Every figure of `a` in `b`, floats within a relative 1e-9."""
    if isinstance(a, dict):
        for k, v in a.items():
            assert k in b, f"{path}.{k} missing"
            _close(v, b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, nan_ok=True), path
    else:
        assert a == b, path


def test_a_recorded_run_gives_the_figures_the_report_gave_before_the_kit():
    """closed-loop-run.json.gz: four phases of `make lab` at f48b548 (uncontrolled, 10 ms
    controlled, a static probe, the bridge); .expected.json: what report.py of that commit
    computed for them.  The kit's analysis must say the same, figure for figure."""
    raw = json.loads(gzip.decompress((FIXTURES / "closed-loop-run.json.gz").read_bytes()))
    want = json.loads((FIXTURES / "closed-loop-run.expected.json").read_text())
    unc_ph, ctl_ph, static_ph, bridge_ph = raw["phases"]
    unc = report.summarize(unc_ph, None, None)
    _close(want["uncontrolled"], unc)
    wr = unc["write_bytes_per_s"]
    _close(want["controlled"], report.summarize(ctl_ph, 0.010, wr))
    _close(want["static"], report.summarize(static_ph, 0.010, None))
    _close(want["bridge"], report.summarize(bridge_ph, 0.010, wr))
    fit = report.fit_lq(unc_ph)
    lq = want["lq_fit"]
    assert (fit.c_s, fit.m_s, fit.r2, fit.points) == pytest.approx(
        (lq["c_s"], lq["m_s"], lq["r2"], lq["windows"]), rel=1e-9
    )
    assert len(report.phase_windows(unc_ph)) == want["windows_uncontrolled"]
    # and the figures a reader of the report sees: the controlled p95 over T at 10 ms
    assert want["controlled"]["read_latency_p95_s"] == pytest.approx(0.01118, abs=1e-5)


def test_the_time_over_the_threshold_is_said_where_it_was():
    """Reads at 30 ms from 12 s to 14 s (7 s into the first burst) and from 52 s (a
    pause), 4 ms otherwise, one a tick: two runs of windows over 15 ms, each with its
    peak and its place. A 1 s window is over 15 ms once half its ten reads are slow."""
    ph = _phase(0.0, 1e6)
    total = 0
    for r in ph["rows"]:
        slow = 12.0 <= r["t"] < 14.0 or r["t"] >= 52.0
        total += 30 if slow else 4
        r["ds"]["dm-0"][report.READ_TICKS] = total
    spans = report.summarize(ph, 0.015, None)["over_threshold"]
    assert [round(x["from_s"], 1) for x in spans] == [12.4, 52.4]
    assert spans[0]["to_s"] == pytest.approx(14.4)
    assert spans[0]["peak_s"] == pytest.approx(0.030)
    # from the first window with writes, which ends at 5.1 s
    assert spans[0]["into_burst_s"] == pytest.approx(7.3)
    assert spans[1]["into_burst_s"] is None  # the writers stopped at 50 s
    assert spans[0]["classes"] is None  # no daemon status in this phase
    assert spans[0]["futile"] is None
    assert report.summarize(_phase(0.0, 1e6), 0.015, None)["over_threshold"] == []


def test_a_futile_release_before_the_time_over_the_threshold_is_said_with_it():
    """The same reads, and the daemon's status every 0.5 s: a futile release counted at
    45 s (its class comes down a class a tick, the reader is over T from 52 s) is said
    with the second run of windows over T, not with the first; the class is the highest
    an initiator had."""
    ph = _phase(0.0, 1e6)
    total = 0
    for i, r in enumerate(ph["rows"]):
        slow = 12.0 <= r["t"] < 14.0 or r["t"] >= 52.0
        total += 30 if slow else 4
        r["ds"]["dm-0"][report.READ_TICKS] = total
        if i % 5 == 0:
            n = 1 if r["t"] >= 45.0 else 0
            k = 0 if r["t"] >= 45.0 else 60
            r["status"] = {
                "resources": [{"resource": "vg", "delay_class": k, "futile_releases": n}],
                "initiators": {"10.0.0.3": k} if k else {},
            }
    spans = report.summarize(ph, 0.015, None)["over_threshold"]
    assert [x["futile"] for x in spans] == [0, 1]
    assert spans[0]["classes"] == [60, 60] and spans[1]["classes"] == [0, 0]


def test_the_static_search_starts_where_the_writers_wrote():
    """The controller's median class over each on-period from its first write (as the
    writes count), on the recorded 10 ms phase: a class of the ladder, above 1."""
    raw = json.loads(gzip.decompress((FIXTURES / "closed-loop-run.json.gz").read_bytes()))
    k = report.writing_class(raw["phases"][1])
    classes = [c for _, c in report.classes(raw["phases"][1])]
    assert 1 < k <= max(classes)


def test_the_initiators_and_the_sensors_view_are_summarized_beside_the_arrays():
    """A bridge phase: the array reads 4 ms throughout; fio's 1 s means say 12 ms in one
    second of five and 5 ms otherwise; the daemon's wire totals, 6 ms a read, then 30 ms
    for one second. Each is its own p95 and time above T over the same span."""
    ph = _phase(0.0, 1e6)
    ph["reader_clat"] = [(float(t), 0.012 if t % 5 == 0 else 0.005) for t in range(1, 55)]
    n, s = 0, 0.0
    for r in ph["rows"][::5]:  # a status every 0.5 s, 50 reads a second
        slow = 20.0 <= r["t"] < 21.0
        n, s = n + 25, s + 25 * (0.030 if slow else 0.006)
        r["status"] = {"resources": [{"reads_completed": n, "read_time_s": s}], "initiators": {}}
    out = report.summarize(ph, 0.010, None)
    assert out["read_latency_p95_s"] == pytest.approx(0.004)
    assert out["reader_clat_windows"] == 54
    assert out["reader_clat_p50_s"] == pytest.approx(0.005)
    assert out["reader_clat_above_threshold_pct"] == pytest.approx(100 * 10 / 54)
    assert out["sensor_p50_s"] == pytest.approx(0.006)
    assert out["sensor_above_threshold_pct"] > 0
    assert max(v for _, v in report.sensor_windows(ph)) == pytest.approx(0.030)
    assert "reader_clat_p95_s" not in report.summarize(_phase(0.0, 1e6), 0.010, None)


def test_a_writer_retransmission_names_the_interval_it_happened_in_and_the_classes_then():
    """The status and ss probes take seconds under TCG (make lab 2026-11-28: a status
    sample every 2.9 s at 15 ms), so the samples before one that saw a retransmission
    span several seconds, not one: the event says between which two samples it
    happened and the writer's class at the daemon's samples from the one before."""
    rows, n = [], 0
    for i in range(40):
        t = 100.0 + i * 0.5
        row: dict = {"t": t}
        if i % 6 == 0:  # ss and the daemon's status, every 3 s
            n += 1 if t == 115.0 else 0
            row["retrans"] = {"10.0.0.5": n, "10.0.0.3": 0}
            row["status"] = {"initiators": {"10.0.0.5": 4 + i // 3, "10.0.0.3": 4 + i // 3}}
        rows.append(row)
    ph = {
        "rows": rows,
        "writer_ips": ["10.0.0.3", "10.0.0.5"],
        "tcp_conns_start": [{"peer": "10.0.0.5:4000", "retrans": "0/0"}],
        "tcp_conns": [{"peer": "10.0.0.5:4000", "retrans": "0/1"}],
    }
    per_ip, found = report.retrans_split(ph)
    assert per_ip == {"10.0.0.5": 1}
    [e] = found
    assert (e["initiator"], e["n"], e["after_s"], e["t"]) == ("10.0.0.5", 1, 112.0, 115.0)
    assert e["classes"] == [[112.0, 12], [115.0, 14]]
    assert e["classes_before"] == [10, 12, 14]  # the 16 samples up to it: 7.5 s here


def test_timers_that_found_their_segment_in_the_qdisc_are_summarized_when_counted():
    """TcpExtTCPSpuriousRtxHostQueues: a probe or retransmission timer of the target that
    found its segment still in santhrottle's qdisc and sent nothing.  A run before the
    counter was read says nothing (None), not 0."""
    ph = _phase(0.0, 1e6)
    ph["nstat"] = {"TcpRetransSegs": 1, "TcpExtTCPSpuriousRtxHostQueues": 3}
    assert report.summarize(ph, 0.010, None)["target_held_in_qdisc"] == 3
    assert report.summarize(_phase(0.0, 1e6), 0.010, None)["target_held_in_qdisc"] is None


def test_a_retransmission_counts_until_the_read_that_saw_it_ended_and_classes_when_read():
    """Under TCG `ss` ends about a second after its row's t and the daemon's status
    seconds after (make lab 2026-11-28, 10 ms: the status of the row at 104.0 s was read
    at about 108 s, after 10 more skipped ticks).  With the reads stamped, the event runs
    until the ss read that saw it ended, and each class is placed when it was read."""
    rows = []
    for i, (t, n, k) in enumerate([(100.0, 0, 66), (103.0, 0, 66), (106.0, 1, 68)]):
        rows.append(
            {
                "t": t,
                "retrans": {"10.0.0.4": n},
                "retrans_t": t + 1.2,
                "status": {"initiators": {"10.0.0.4": k}},
                "status_t": t + 2.5 + i,
            }
        )
        rows.append({"t": t + 2.6 + i})  # the next sample, once the reads are done
    ph = {
        "rows": rows,
        "writer_ips": ["10.0.0.4"],
        "tcp_conns_start": [{"peer": "10.0.0.4:4000", "retrans": "0/0"}],
        "tcp_conns": [{"peer": "10.0.0.4:4000", "retrans": "0/1"}],
    }
    [e] = report.retrans_split(ph)[1]
    assert (e["after_s"], e["t"], e["until_s"]) == (103.0, 106.0, 107.2)
    assert e["classes"] == [[106.5, 66], [110.5, 68]]
