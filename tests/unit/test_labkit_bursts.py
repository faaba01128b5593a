"""labkit.bursts and labkit.fio's pause: the paper's schedule with the writers paused between
on-periods (one fio per host, SIGSTOP / SIGCONT), so that a pause is off_s at the array
whatever the emulation's speed.  The schedule on a clock and fio jobs made up here; the
pause on real processes of this host."""

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from labkit import bursts, fio, probes

pytestmark = pytest.mark.unit


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat's third field)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _below(pid: int) -> list[int]:
    """The job's processes under fio: its children."""
    return [p for p, _, state in probes.children(pid) if state != "Z"]


def _until(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_a_paused_job_stops_with_its_children_and_goes_on():
    """fio runs each job in a child process of its own session (setsid): the pause
    stops the parent and every process below it, and a paused job still stops."""
    job = fio.Job(["sh", "-c", "setsid sh -c 'exec sleep 60' >/dev/null & exec sleep 60"])
    try:
        assert _until(lambda: len(_below(job.proc.pid)) == 1)
        pids = [job.proc.pid, *_below(job.proc.pid)]
        # not one session, not one group (once the child has called setsid)
        assert _until(lambda: len({os.getsid(p) for p in pids}) == 2)
        job.pause()
        assert _until(lambda: all(_state(p) == "T" for p in pids)), [_state(p) for p in pids]
        job.resume()
        assert _until(lambda: all(_state(p) == "S" for p in pids)), [_state(p) for p in pids]
        job.pause()
        assert _until(lambda: _state(job.proc.pid) == "T")
        job.stop()  # SIGINT, then continued: a paused job still ends
        assert not job.running()
    finally:
        for p in [job.proc.pid, *_below(job.proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        job.proc.wait()


def test_a_pause_signals_only_the_processes_it_found_under_fio():
    """The job's processes are found once; a pid among them that the kernel gave to a
    process outside the job (its parent is not the job's) is not stopped."""
    job = fio.Job(["sh", "-c", "sleep 60 >/dev/null & exec sleep 60"])
    outsider = None
    try:
        assert _until(lambda: len(_below(job.proc.pid)) == 1)
        (child,) = _below(job.proc.pid)
        assert job.processes() == [job.proc.pid, child]
        outsider = fio.Job(["sleep", "60"])
        assert _until(lambda: _state(outsider.proc.pid) == "S")  # started, asleep
        job._tree = [job.proc.pid, outsider.proc.pid]  # as if the child's pid were reused
        job.pause()
        assert _until(lambda: _state(job.proc.pid) == "T")
        assert _state(outsider.proc.pid) != "T"
        job.resume()
    finally:
        for j in (job, outsider):
            if j is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(j.proc.pid, signal.SIGKILL)
                j.proc.wait()


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def sleep(self, s: float) -> None:
        self.t += s


class _Sampler:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.events: list[tuple[float, str]] = []

    def mark(self, what: str) -> None:
        self.events.append((self.clock.t, what))


class _Job:
    """A fio job's interface (fio.Job), recording what was done to it on the clock."""

    def __init__(self, cmd: list[str], clock: _Clock, log: list) -> None:
        self.cmd, self.clock, self.log = cmd, clock, log
        log.append((clock.t, "start", cmd[0]))

    def processes(self, fresh: bool = False) -> list[int]:
        self.log.append((self.clock.t, "found" if fresh else "processes", self.cmd[0]))
        return []

    def pause(self) -> None:
        self.log.append((self.clock.t, "pause", self.cmd[0]))

    def resume(self) -> None:
        self.log.append((self.clock.t, "resume", self.cmd[0]))

    def stop(self) -> str:
        self.log.append((self.clock.t, "stop", self.cmd[0]))
        return ""

    def wait(self, timeout_s: float | None = None) -> str:
        self.clock.t += 7.0  # a restarted writer: its fio ends on_s after its first IO
        return ""


@pytest.fixture
def lab(monkeypatch):
    clock, log = _Clock(), []
    monkeypatch.setattr(bursts.time, "sleep", clock.sleep)
    monkeypatch.setattr(bursts.fio, "start", lambda cmd: _Job(cmd, clock, log))
    written = {"n": 0}

    def diskstats():  # every look sees one more write on each writer's device
        written["n"] += 1
        row = [0] * 11
        row[bursts.WRITE_SECTORS] = written["n"]
        return {"dm-1": row, "dm-2": row}

    monkeypatch.setattr(bursts, "all_diskstats", diskstats)
    return clock, log


def _writers(runtime: float) -> list[list[str]]:
    return [[f"w1:{runtime:g}"], [f"w2:{runtime:g}"]]


def test_a_paused_schedule_starts_each_writer_once_and_pauses_it_for_off_s(lab):
    clock, log = lab
    s = _Sampler(clock)
    sched = bursts.Schedule(4.0, 20.0, 5.0, 3)
    jobs = bursts.run(s, lambda rt: ["reader"], _writers, sched, True, ["dm-1"], ["dm-1"])
    starts = [x for x in log if x[1] == "start"]
    # the reader, and each writer once, for three times the schedule (79 s; stopped at its end)
    assert [x[2] for x in starts] == ["reader", "w1:237", "w2:237"]
    assert len(jobs) == 3
    marks = [(round(t, 1), e) for t, e in s.events]
    assert marks == [
        (0.0, "reader on"),
        (4.0, "writers on"),
        (24.0, "writers off"),
        (29.0, "writers on"),  # off_s after the pause began
        (49.0, "writers off"),
        (54.0, "writers on"),
        (64.0, "reader off"),  # halfway through the last on-period
        (74.0, "writers off"),
    ]
    w1 = [(round(t, 1), what) for t, what, name in log if name.startswith("w1")]
    assert w1 == [
        (4.0, "start"),
        (24.0, "found"),  # its processes found again before each pause
        (24.0, "pause"),
        (29.0, "resume"),
        (49.0, "found"),
        (49.0, "pause"),
        (54.0, "resume"),
        (74.0, "found"),
        (74.0, "pause"),
        (79.0, "stop"),
    ]
    # every writer found before any is paused: they pause together
    at_24 = [(what, name[:2]) for t, what, name in log if t == 24.0 and name != "reader"]
    assert at_24 == [("found", "w1"), ("found", "w2"), ("pause", "w1"), ("pause", "w2")]
    assert [(round(t, 1), what) for t, what, name in log if name == "reader"][-1] == (
        79.0,
        "stop",
    )


def test_without_the_writers_devices_each_on_period_is_a_new_fio(lab):
    clock, log = lab
    s = _Sampler(clock)
    bursts.run(s, lambda rt: ["reader"], _writers, bursts.Schedule(4.0, 20.0, 5.0, 2))
    assert [name for _, what, name in log if what == "start"] == [
        "reader",
        "w1:20",
        "w2:20",
        "w1:20",
        "w2:20",
    ]
    assert not [x for x in log if x[1] in ("pause", "resume")]
    # each pause from the last writer's end, off_s; the writers' start under TCG comes on top
    assert [e for _, e in s.events].count("writers on") == 2
