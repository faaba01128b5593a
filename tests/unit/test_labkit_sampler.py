"""labkit.sampler: one row per sample, probes on their cadence, no burst after a stall; the
diskstats probe reads the product's parser over captured /proc/diskstats files, children
reads /proc/*/stat; labkit.speed: the guest's pace, which stretches the lab's time limits."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from labkit import probes
from labkit.sampler import Probe, Sampler

PROC = Path(__file__).parents[1] / "fixtures" / "lab" / "proc"


class Clock:
    """Virtual time: the sampler's wait advances it, and stops the sampler at `until`; a
    probe can stall it."""

    def __init__(self, until: float = 1e9) -> None:
        self.now, self.until = 100.0, 100.0 + until
        self.sampler: Sampler | None = None

    def __call__(self) -> float:
        return self.now

    def wait(self, s: float) -> bool:
        self.now += s
        if self.now >= self.until - 1e-9 and self.sampler is not None:
            self.sampler.stop_ev.set()
        return False


def drive(probes_: list[Probe], clock: Clock, period_s: float = 0.1) -> Sampler:
    """The sampler's own loop (Sampler.run), in this thread, in virtual time."""
    s = Sampler(probes_, period_s, clock=clock, wait=clock.wait)
    clock.sampler = s
    s.run()
    return s


def test_probes_read_on_their_cadence_and_a_failure_is_recorded():
    calls = {"fast": 0, "slow": 0}

    def fast() -> int:
        calls["fast"] += 1
        return calls["fast"]

    def slow() -> dict:
        calls["slow"] += 1
        if calls["slow"] == 2:
            raise OSError("daemon not answering")
        return {"n": calls["slow"]}

    s = drive([Probe("ds", fast), Probe("status", slow, every=5)], Clock(until=1.5))
    assert len(s.rows) == 15
    assert [r["ds"] for r in s.rows] == list(range(1, 16))
    assert [i for i, r in enumerate(s.rows) if "status" in r] == [0, 10]
    assert s.rows[5]["status_error"] == "daemon not answering"
    assert [r["t"] for r in s.rows[:3]] == [0.0, 0.1, 0.2]


def test_after_a_stall_the_next_sample_is_on_time_not_a_burst():
    clock = Clock(until=5.0)
    n = {"k": 0}

    def stalls() -> int:
        n["k"] += 1
        if n["k"] == 5:
            clock.now += 3.0  # the guest stalls for 3 s inside this sample
        return n["k"]

    s = drive([Probe("x", stalls)], clock)
    ts = [r["t"] for r in s.rows]
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(ts)]
    # the 3 s stall shows as one gap; after it one sample at once, then the 100 ms pace:
    # never the 30 samples the stall missed
    assert gaps.count(3.0) == 1
    assert sum(1 for g in gaps if g < 0.05) <= 1
    assert len(ts) < 5.0 / 0.1 - 25


def test_a_stamped_probe_keeps_when_its_read_ended():
    """`ss` and the daemon's status take seconds under TCG: the row keeps the time each
    stamped read ended, so what it saw is placed between the row's t and that time."""
    clock = Clock(until=3.0)

    def slow() -> int:
        clock.now += 1.7  # the read takes 1.7 s
        return 1

    s = drive([Probe("ds", lambda: 0), Probe("status", slow, every=5, stamped=True)], clock)
    first = s.rows[0]
    assert first["status_t"] == pytest.approx(first["t"] + 1.7)
    assert "ds_t" not in first and "status_t" not in s.rows[1]


def test_marks_are_on_the_rows_clock():
    clock = Clock()
    s = Sampler([], 0.1, clock=clock, wait=clock.wait)
    clock.now += 2.5
    s.mark("writers on")
    assert s.events == [(2.5, "writers on")]


def test_diskstats_probe_reads_captured_files_with_the_products_parser(tmp_path):
    for k, name in enumerate(("diskstats.0", "diskstats.1")):
        root = tmp_path / str(k)
        root.mkdir()
        shutil.copy(PROC / name, root / "diskstats")
    first = probes.diskstats(["dm-0", "nope"], tmp_path / "0")()
    second = probes.diskstats(["dm-0"], tmp_path / "1")()
    assert set(first) == {"dm-0"}  # a device that is not there is left out
    # the counters from `reads` on: reads, merged, sectors, ticks, ..., weighted (11)
    line = (PROC / "diskstats.0").read_text().split("dm-0")[1].split()
    assert first["dm-0"] == [int(x) for x in line[:11]]
    assert second["dm-0"][0] >= first["dm-0"][0]


def test_all_diskstats_leaves_no_descriptor_open(tmp_path):
    """A phase's wait for the writers reads every device in a loop: each read closes its
    file (the product's reader keeps it open; a lab run of 15 phases once ran out of
    descriptors)."""
    shutil.copy(PROC / "diskstats.0", tmp_path / "diskstats")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        got = probes.all_diskstats(tmp_path)
    assert "dm-0" in got
    assert len(os.listdir("/proc/self/fd")) <= before


def test_the_guests_speed_factor_and_the_runners_reference(tmp_path, monkeypatch):
    """labkit.speed: a calibration slower than the reference stretches every budget; the
    largest factor and the fastest calibration go to the runner, which keeps the fastest
    as the cache's reference (labkit.qemu)."""
    from labkit import qemu, speed
    from labkit.host import Settings

    monkeypatch.setattr(speed, "_factor", None)
    monkeypatch.setattr(speed, "_fastest", None)
    monkeypatch.setenv("SANTHROTTLE_IN_GUEST", "1")
    monkeypatch.setenv(speed.REFERENCE_ENV, "0.1")
    seconds = iter([0.26, 0.12])
    monkeypatch.setattr(speed, "calibrate", lambda runs=3: next(seconds))
    record = tmp_path / "work" / "lab-speed.json"
    record.parent.mkdir()
    assert speed.factor(record=record) == pytest.approx(2.6)
    assert speed.budget(600) == pytest.approx(1560)
    assert speed.factor(fresh=True, record=record) == pytest.approx(2.6)  # the largest seen
    rec = json.loads(record.read_text())
    assert rec["factor"] == pytest.approx(2.6) and rec["fastest_s"] == pytest.approx(0.12)
    # the runner: the guest's limit stretched, the faster calibration kept
    assert qemu.guest_factor(record.parent) == pytest.approx(2.6)
    assert qemu.guest_factor(tmp_path) == 1.0  # nothing said yet
    s = Settings(cache=tmp_path / "cache")
    s.cache.mkdir()
    assert qemu.speed_reference(s) is None
    qemu.keep_speed_reference(s, record.parent)
    assert qemu.speed_reference(s) == pytest.approx(0.12)
    record.write_text(json.dumps({"factor": 1.0, "fastest_s": 0.5}))
    qemu.keep_speed_reference(s, record.parent)  # slower: the reference stays
    assert qemu.speed_reference(s) == pytest.approx(0.12)
    # a cache whose first reference came from a loaded host: never above REFERENCE_S
    monkeypatch.setenv(speed.REFERENCE_ENV, "0.398")
    assert speed.reference() == speed.REFERENCE_S


def test_each_probes_own_cpu_is_added_up():
    """The sampler's CPU per probe (its thread_time around each read): the lab's status
    probe is the measurement's cost, not the daemon's (closed_loop.py)."""
    cpu = {"t": 0.0}

    def status() -> dict:
        cpu["t"] += 0.003  # a status costs the sampler 3 ms of CPU
        return {}

    def ds() -> int:
        cpu["t"] += 0.001
        return 0

    clock = Clock(until=1.0)
    s = Sampler(
        [Probe("ds", ds), Probe("status", status, every=5)],
        0.1,
        clock=clock,
        wait=clock.wait,
        cpu=lambda: cpu["t"],
    )
    clock.sampler = s
    s.run()
    assert len(s.rows) == 10
    assert s.cpu_s["ds"] == pytest.approx(0.010)
    assert s.cpu_s["status"] == pytest.approx(0.006)


def test_children_names_each_child_of_a_pid_with_its_state(tmp_path):
    """labkit.probes.children over a made-up /proc: a comm with ") " in it, a zombie, a
    grandchild and a process that ended between the listing and its read."""

    def proc(pid: int, comm: str, state: str, ppid: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194304 0\n")

    proc(100, "pytest", "S", 1)
    proc(101, "qemu-system-x86_64", "R", 100)
    proc(102, "odd) name (x", "Z", 100)
    proc(103, "tc", "S", 101)  # a grandchild: not 100's
    (tmp_path / "104").mkdir()  # ended: no stat to read
    (tmp_path / "self").mkdir()
    assert probes.children(100, tmp_path) == [
        (101, "qemu-system-x86_64", "R"),
        (102, "odd) name (x", "Z"),
    ]
    assert probes.children(103, tmp_path) == []


def test_children_of_this_process_on_the_real_proc():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = [(pid, state) for pid, _comm, state in probes.children(os.getpid())]
        assert (p.pid, "S") in mine or (p.pid, "R") in mine
    finally:
        p.kill()
        p.wait()
    assert p.pid not in [pid for pid, *_ in probes.children(os.getpid())]
