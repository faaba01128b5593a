"""The lab's load: fio jobs, started, stopped and read back. In the guest.

What it owns
    Every fio the experiments run (direct I/O, libaio, JSON output, run in /tmp,
    where fio leaves its state files):

    argv(name, device, *options, runtime=, size=)   one job's command line
    start(argv) -> Job                 in the background; Job.stop() (SIGINT: fio
                                       stops and prints its results), Job.pause() /
                                       resume() (SIGSTOP / SIGCONT to fio and its job
                                       processes: no new IO, then IO at once),
                                       Job.result() (the first job's JSON, or None)
    reader(device, rate, runtime)      the paper's small reader: 4 KiB random reads,
                                       QD1, rate-limited ("sram")
    writers(device, bs, qd, runtime, jobs=1, region_mib=, first_region=)
                                       sequential writers; with jobs > 1 each in its
                                       own region of region_mib (the paper's four
                                       128 KiB QD1 writers per host)
    once(device, rw, bs, qd, size)     move `size` bytes once; the seconds it took
                                       (fio's own clock), or a RuntimeError
    parse(text)                        fio's JSON output, after whatever it printed
                                       before it
    lat_log(path)                      fio's 1 s-averaged latency log

Worked example
    j = start(reader("/dev/sdb", "256k", runtime=300)); ...; j.stop(); j.result()
    -> {"jobname": "j", "read": {"clat_ns": {"mean": 4.1e6, ...}, ...}, ...}
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from labkit.probes import children, parent

STOP_S = 30.0


def argv(
    name: str, device: str, *options: str, runtime: float | None = None, size: str | None = None
) -> list[str]:
    """One job: fio --name=NAME --filename=DEVICE, direct libaio, time-based when runtime."""
    cmd = [
        "fio",
        "--output-format=json",
        f"--name={name}",
        f"--filename={device}",
        "--direct=1",
        "--ioengine=libaio",
    ]
    if runtime is not None:
        cmd += ["--time_based", f"--runtime={runtime:.1f}"]
    if size is not None:
        cmd.append(f"--size={size}")
    return [*cmd, *options]


def reader(
    device: str,
    rate: str,
    runtime: float,
    name: str = "j",
    size: str = "200m",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The paper's small random reader: 4 KiB, QD1, at most `rate` (fio's --rate)."""
    return argv(
        name,
        device,
        "--rw=randread",
        "--bs=4k",
        "--iodepth=1",
        f"--rate={rate}",
        *extra,
        runtime=runtime,
        size=size,
    )


REGION_MIB = 300  # a writer job's own region of a device several jobs share


def writers(
    device: str,
    bs: str,
    qd: int,
    runtime: float,
    jobs: int = 1,
    region_mib: int | None = None,
    first_region: int = 0,
    name: str = "j",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """Sequential writers; jobs > 1 (or a region): each job in its own region_mib region
    from first_region on, reported as one (--group_reporting)."""
    base = ["--rw=write", f"--bs={bs}", f"--iodepth={qd}"]
    if jobs == 1 and region_mib is None:
        return argv(name, device, *base, *extra, runtime=runtime, size="200m")
    region = region_mib or REGION_MIB
    return argv(
        name,
        device,
        *base,
        f"--numjobs={jobs}",
        *([f"--offset={first_region * region}m"] if first_region else []),
        f"--offset_increment={region}m",
        "--group_reporting",
        *extra,
        runtime=runtime,
        size=f"{region}m",
    )


def lat_log(path) -> list[tuple[float, float]]:
    """fio's 1 s-averaged latency log (--write_lat_log with --log_avg_msec=1000 and
    --log_unix_epoch=1): (epoch s at the interval's end, mean s)."""
    out = []
    for line in Path(path).read_text().splitlines():
        p = [x.strip() for x in line.split(",")]
        if len(p) >= 2 and p[0].isdigit():
            out.append((int(p[0]) / 1e3, int(p[1]) / 1e9))
    return out


def parse(text: str) -> dict:
    """fio's JSON output (whatever fio printed before it skipped)."""
    return json.loads(text[text.index("{") :])


class Job:
    """One fio in the background (our own child)."""

    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd="/tmp"
        )
        self.out: str | None = None
        self._tree: list[int] | None = None
        self._paused = False

    def running(self) -> bool:
        return self.proc.poll() is None

    def processes(self, fresh: bool = False) -> list[int]:
        """fio and its job processes (each job calls setsid(): not one process group),
        as last found (`fresh`: found again). A /proc scan takes seconds in a busy
        guest: the writers of a schedule are each found before any is paused, so that
        they pause together, and resumed as found."""
        if fresh or self._tree is None:
            jobs = children(self.proc.pid)  # fio forks each job: its children
            self._tree = [self.proc.pid, *(p for p, _, state in jobs if state != "Z")]
        return self._tree

    def _signal_all(self, sig: int) -> None:
        tree = self.processes()
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):  # it has ended
                if pid == self.proc.pid or parent(pid) in tree:  # not a reused pid
                    os.kill(pid, sig)

    def pause(self) -> None:
        """SIGSTOP to fio and its job processes: no new IO (those in flight complete)."""
        self._paused = True
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: the jobs issue IO again at once."""
        self._paused = False
        self._signal_all(signal.SIGCONT)

    def wait(self, timeout_s: float | None = None) -> str:
        """Until it ends; its output."""
        if self.out is None:
            self.out = self.proc.communicate(timeout=timeout_s)[0] or ""
        return self.out

    def stop(self) -> str:
        """SIGINT (fio stops and prints its results), SIGKILL if it does not within STOP_S."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            if self._paused:  # it handles the signal once continued
                self.resume()
        try:
            return self.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.out = self.proc.communicate()[0] or ""
            return self.out

    def result(self) -> dict | None:
        """The first job's report, or None when fio printed none."""
        try:
            return parse(self.wait())["jobs"][0]
        except (ValueError, KeyError, IndexError):
            return None


def start(cmd: list[str]) -> Job:
    return Job(cmd)


def once(
    device: str, rw: str, bs: str, qd: int, size: int, offset: int = 0, timeout_s: float = 600
) -> float:
    """Move `size` bytes with fio; returns the seconds it took (the job's own clock)."""
    cmd = argv(
        "dp",
        device,
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={qd}",
        f"--size={size}",
        f"--offset={offset}",
        "--verify_state_save=0",
    )
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd="/tmp")
    if p.returncode != 0:
        raise RuntimeError(f"fio {rw} {bs} qd{qd} exited {p.returncode}: {p.stderr.strip()}")
    job = parse(p.stdout)["jobs"][0]
    side = job["read" if rw == "read" else "write"]
    if job["error"] or side["io_bytes"] != size:
        raise RuntimeError(f"fio {rw} {bs} qd{qd}: error {job['error']}, {side['io_bytes']} bytes")
    return side["runtime"] / 1000.0  # ms of the job's own clock
