"""One guest boot, on the host: Debian's kernel under QEMU/TCG runs one command as root.

What it owns
    run(settings, command): a fresh run dir under the cache's runs/ (the newest
    RUNS_KEPT are kept; one still in use is never pruned), the command and its
    environment written to its work/ folder, two sparse virtio disks (`lab-slow`,
    throttled by QEMU to play a shared array, and `lab-fast`), the known plant as
    a third (`lab-array`, labkit.plant.NbdServer) when the settings have one, 9p
    shares (the host's /usr and /etc read-only, the kernel's modules, the checkout
    read-write at its own path, the run's work/ at /shared/work, the guest venv
    read-only at its own path), `-nic none`; then QEMU until the guest powers off
    or the timeout, and a RunResult: the command's exit status (or EXIT_TIMEOUT,
    EXIT_NO_STATUS with the reason), its output and the console.  The timeout is what
    the command needs on an idle host: a guest that measures itself slower
    (labkit.speed, work/lab-speed.json) gets as much more.

    What the guest does with it: vagrant/qemu/initramfs/init (stage 1) and
    vagrant/qemu/guest/stage2.sh (stage 2); how: vagrant/qemu/README.md.

Worked example
    s = Settings.from_env(smp=1); res = run(s, "uname -r", timeout=120)
    -> RunResult(status=0, rundir=~/.cache/santhrottle-lab/runs/20261128-101500-ab12cd,
       wall_s=10.4); res.output == "6.1.0-56-amd64\\n"
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from labkit.host import VAGRANT, LabError, Settings
from labkit.images import Prepared, prepare, venv_in_use
from labkit.plant import NbdServer, PlantError
from labkit.speed import REFERENCE_ENV

STAGE2 = VAGRANT / "qemu" / "guest" / "stage2.sh"
# The slow disk plays a shared array: QEMU throttles it (docs/lab.md).
SLOW_DISK_GIB = 8
FAST_DISK_GIB = 4
SLOW_IOPS = 1000
SLOW_BPS = 40_000_000
DEFAULT_TIMEOUT_S = 900
RUNS_KEPT = 5
STOP_GRACE_S = 10  # SIGTERM, then SIGKILL
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
POLL_S = 2.0  # how often the runner looks at the guest's limit
SPEED_NAME = "lab-speed.json"  # labkit.speed, in the run's work/
SPEED_REFERENCE = "speed-reference.json"  # in the cache: the fastest calibration seen

EXIT_TIMEOUT = 124
EXIT_NO_STATUS = 125
EXIT_UNAVAILABLE = 3


class RunResult:
    """What a guest run left behind.  ``status``: the command's exit status,
    or EXIT_TIMEOUT / EXIT_NO_STATUS; ``reason`` explains the latter two."""

    def __init__(
        self, status: int, rundir: Path, wall_s: float, reason: str, limit_s: float = 0.0
    ) -> None:
        self.status = status
        self.limit_s = limit_s  # the timeout, stretched by the guest's speed
        self.rundir = rundir
        self.work = rundir / "work"
        self.console_path = rundir / "console.log"
        self.wall_s = wall_s
        self.reason = reason

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def output(self) -> str:
        p = self.work / "output.log"
        return p.read_text(errors="replace") if p.is_file() else ""

    @property
    def console(self) -> str:
        p = self.console_path
        return p.read_text(errors="replace") if p.is_file() else ""

    def console_tail(self, lines: int = 60) -> str:
        return "\n".join(self.console.splitlines()[-lines:])


def guest_env(s: Settings, prep: Prepared, env: dict | None) -> dict[str, str]:
    """The command's environment in the guest (stage2.sh loads work/env)."""
    genv = {
        "SANTHROTTLE_LAB_CHECKOUT": str(s.checkout),
        "SANTHROTTLE_LAB_CACHE": str(s.cache),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if prep.venv:
        genv["SANTHROTTLE_LAB_VENV"] = str(prep.venv)
        genv["VIRTUAL_ENV"] = str(prep.venv)
        genv["PATH"] = f"{prep.venv}/bin:{GUEST_PATH}"
    if s.array:
        genv["SANTHROTTLE_LAB_ARRAY"] = json.dumps(s.array, separators=(",", ":"))
    ref = speed_reference(s)
    if ref is not None:
        genv[REFERENCE_ENV] = f"{ref:.4f}"
    genv.update(env or {})
    return genv


def speed_reference(s: Settings) -> float | None:
    """The fastest calibration this host's guests have made (labkit.speed), or None."""
    try:
        return float(json.loads((s.cache / SPEED_REFERENCE).read_text())["fastest_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_speed_reference(s: Settings, work: Path) -> None:
    """A guest's fastest calibration, kept as the cache's reference when it is faster."""
    try:
        got = float(json.loads((work / SPEED_NAME).read_text())["fastest_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    old = speed_reference(s)
    if got > 0 and (old is None or got < old):
        tmp = s.cache / (SPEED_REFERENCE + ".tmp")
        tmp.write_text(json.dumps({"fastest_s": got, "t": time.time()}) + "\n")
        os.replace(tmp, s.cache / SPEED_REFERENCE)


def kernel_args(s: Settings, *extra: str) -> str:
    """The kernel command line every lab boot shares, then ``extra``: the serial console,
    no mitigations (TCG is slow enough), the admin's SANTHROTTLE_LAB_KERNEL_ARGS and where
    the checkout is."""
    return " ".join(
        [
            "console=ttyS0",
            "quiet",
            "panic=-1",
            "mitigations=off",
            "tsc=reliable",
            *extra,
            *os.environ.get("SANTHROTTLE_LAB_KERNEL_ARGS", "").split(),
            f"lab_checkout={s.checkout}",
        ]
    )


def virtfs(path: Path | str, tag: str, ro: bool) -> list[str]:
    """A 9p share of ``path`` as ``tag`` (read-only when ``ro``)."""
    opts = f"local,path={path},mount_tag={tag},security_model=none"
    return ["-virtfs", opts + (",readonly=on" if ro else "")]


def boot_command(
    qemu: str,
    smp: int,
    mem_mib: int,
    rundir: Path,
    vmlinuz: Path,
    initrd: Path,
    append: str,
) -> list[str]:
    """The part of a QEMU command line every lab boot shares: TCG with ``smp`` vCPUs and
    ``mem_mib`` MiB, no display, no network card, no reboot, the console in the run dir's
    console.log, Debian's kernel and ``initrd`` with ``append``. Each boot adds its disks
    and shares."""
    return [
        qemu,
        "-nodefaults",
        "-no-user-config",
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-smp",
        str(smp),
        "-m",
        str(mem_mib),
        "-display",
        "none",
        "-vga",
        "none",
        "-no-reboot",
        "-nic",
        "none",
        "-chardev",
        f"file,id=con,path={rundir / 'console.log'}",
        "-serial",
        "chardev:con",
        "-kernel",
        str(vmlinuz),
        "-initrd",
        str(initrd),
        "-append",
        append,
    ]


def qemu_command(
    s: Settings, prep: Prepared, rundir: Path, slow_iops: int, slow_bps: int
) -> list[str]:
    """The QEMU command line of one boot (without the plant's disk)."""
    work = rundir / "work"
    stage2 = STAGE2 if STAGE2.is_relative_to(s.checkout) else ""
    extra = [f"lab_stage2={stage2}"] + ([f"lab_venv={prep.venv}"] if prep.venv else [])
    append = kernel_args(s) + " " + " ".join(extra)
    drive = "format=raw,if=none,cache=none,aio=threads"
    return [
        *boot_command(
            prep.qemu,
            s.smp,
            s.mem_mib,
            rundir,
            prep.kernel.vmlinuz,
            prep.initramfs,
            append,
        ),
        *virtfs("/usr", "hostusr", True),
        *virtfs("/etc", "hostetc", True),
        *virtfs(prep.kernel.modules, "kmods", True),
        *virtfs(s.checkout, "checkout", False),
        *virtfs(work, "work", False),
        *(virtfs(prep.venv, "venv", True) if prep.venv else []),
        "-drive",
        f"file={rundir / 'slow.img'},id=slow,{drive},"
        f"throttling.iops-total={slow_iops},throttling.bps-total={slow_bps}",
        "-device",
        "virtio-blk-pci,drive=slow,serial=lab-slow",
        "-drive",
        f"file={rundir / 'fast.img'},id=fast,{drive}",
        "-device",
        "virtio-blk-pci,drive=fast,serial=lab-fast",
    ]


def run(
    s: Settings,
    command: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict | None = None,
    venv: bool = True,
    slow_iops: int = SLOW_IOPS,
    slow_bps: int = SLOW_BPS,
    echo_console: bool = False,
    prepared: Prepared | None = None,
) -> RunResult:
    """Boot the guest, run ``command`` (a /bin/sh script text) as root, power off.
    Never raises for guest-side failures: see RunResult."""
    prep = prepared or prepare(s, venv=venv)
    for path in (s.checkout, prep.venv, s.cache):
        if path and any(c.isspace() or c == "," for c in str(path)):
            # kernel command line and QEMU option syntax
            raise LabError(f"paths with white space or commas are not supported: {path!r}")
    rundir, lock = new_rundir(s)
    try:
        with venv_in_use(prep.venv):
            return _boot(s, prep, rundir, command, timeout, env, slow_iops, slow_bps, echo_console)
    finally:
        lock.close()


def _boot(s, prep, rundir, command, timeout, env, slow_iops, slow_bps, echo) -> RunResult:
    work = rundir / "work"
    work.mkdir(parents=True)
    (work / "cmd").write_text(command if command.endswith("\n") else command + "\n")
    genv = guest_env(s, prep, env)
    (work / "env").write_text("".join(f"{k}={shlex.quote(str(v))}\n" for k, v in genv.items()))
    disks = [(rundir / "slow.img", SLOW_DISK_GIB), (rundir / "fast.img", FAST_DISK_GIB)]
    for img, gib in disks:
        with open(img, "wb") as f:
            f.truncate(gib << 30)  # sparse, fresh per run: no leftovers
    cmd = qemu_command(s, prep, rundir, slow_iops, slow_bps)
    plant = None
    try:
        if s.array:
            plant = NbdServer(s.array, rundir, work).start()
            s.log(f"array: nbdkit pid {plant.proc.pid}, {plant.sock}, {s.array}")
            cmd += plant.qemu_args()
        (rundir / "qemu.cmd").write_text(shlex.join(map(str, cmd)) + "\n")
        t0 = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        code, limit = _qemu(cmd, rundir, timeout, echo)
        wall = time.monotonic() - t0
        if plant is not None:
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
            plant.stop({"wall_s": round(wall, 2), "qemu_cpu_s": round(cpu, 2)})
    except PlantError as e:
        raise LabError(str(e)) from None
    finally:
        if plant is not None:
            plant.stop()
        for img, _ in disks:
            img.unlink(missing_ok=True)
    keep_speed_reference(s, work)
    return _result(rundir, code, limit, wall)


def guest_factor(work: Path) -> float:
    """How much slower than an idle host the guest said it runs (labkit.speed), 1 before
    it says anything."""
    try:
        return max(1.0, float(json.loads((work / SPEED_NAME).read_text())["factor"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 1.0


def _qemu(cmd: list[str], rundir: Path, timeout: float, echo: bool) -> tuple[int | None, float]:
    """QEMU until it exits (its return code) or its limit (None): `timeout` stretched by
    the guest's own measure of its speed (labkit.speed); returns the code and the limit."""
    stop_echo = threading.Event()
    echo_thread = None
    t0 = time.monotonic()
    limit = timeout
    with open(rundir / "qemu.log", "w") as qlog:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=qlog, stderr=subprocess.STDOUT
        )
        if echo:
            echo_thread = threading.Thread(
                target=_follow, args=(rundir / "console.log", stop_echo), daemon=True
            )
            echo_thread.start()
        try:
            while True:
                try:
                    return proc.wait(timeout=POLL_S), limit
                except subprocess.TimeoutExpired:
                    limit = timeout * guest_factor(rundir / "work")
                    if time.monotonic() - t0 < limit:
                        continue
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                return None, limit
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            stop_echo.set()
            if echo_thread:
                echo_thread.join(timeout=2)


def _result(rundir: Path, qemu_code: int | None, limit: float, wall: float) -> RunResult:
    status_file = rundir / "work" / "status"
    status = None
    if status_file.is_file():
        try:
            status = int(status_file.read_text().strip())
        except ValueError:
            status = None
    if qemu_code is None:
        return RunResult(EXIT_TIMEOUT, rundir, wall, f"guest timed out after {limit:.0f} s", limit)
    if status is None:
        qout = (rundir / "qemu.log").read_text(errors="replace").strip()
        reason = f"guest ended without a status (QEMU exit {qemu_code})"
        if qout:
            reason += f": {qout.splitlines()[-1]}"
        return RunResult(EXIT_NO_STATUS, rundir, wall, reason, limit)
    return RunResult(status, rundir, wall, "", limit)


def new_rundir(s: Settings):
    """A fresh run dir (the oldest beyond RUNS_KEPT pruned, unless still in use) and its
    lock, held until the run ends; runs/last points to it."""
    runs = s.cache / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    old = sorted(d for d in runs.iterdir() if d.is_dir() and not d.is_symlink())
    for d in old[: max(0, len(old) - RUNS_KEPT + 1)]:
        try:  # a run still in progress (another session) holds its lock
            with open(d / ".running", "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue
    d = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=runs))
    d.chmod(0o755)
    lock = open(d / ".running", "w")  # noqa: SIM115 - held until the run ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    last = runs / "last"
    try:
        if last.is_symlink() or last.exists():
            last.unlink()
        last.symlink_to(d.name)
    except OSError:
        pass
    return d, lock


def _follow(path: Path, stop: threading.Event) -> None:
    pos = 0
    while True:
        done = stop.is_set()
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            sys.stderr.write(chunk.decode(errors="replace"))
            sys.stderr.flush()
        if done:
            return
        time.sleep(0.2)
