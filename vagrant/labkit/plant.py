"""The lab's array as a known plant, on the host: nbdkit serving vagrant/qemu/lqarray.py.

What it owns
    The plant's spec (`--array nbd[:model=lq,c_ms=2,m_ms=5,tau_ms=50,noise=0]`,
    SANTHROTTLE_LAB_ARRAY: parse_array), the one nbdkit command line that
    serves it (nbdkit_argv), and its two ways onto a block layer:

    NbdServer  for a QEMU guest: nbdkit on a unix socket in the run dir, which
               QEMU's NBD client attaches as the virtio disk `lab-array`
               (labkit.qemu); the plugin writes its counters to the guest's
               /shared/work/array-stats.json and reads the guest's
               /shared/work/array-control.json (set_plant: a new C or m for the
               IOs from then on);
    HostArray  for this host's own kernel: nbdkit, then nbdfuse (a file in a
               FUSE mount), then `losetup --direct-io=on` -> /dev/loopN, so
               /proc/diskstats counts its IOs through native code only
               (docs/lab.md, "The daemon's fit on this host's kernel").

    Everything started here is ended by its PID (end()), and everything made
    is removed, also when starting fails half-way.

Worked example
    parse_array("nbd:c_ms=2,m_ms=10") -> {"model": "lq", "c_ms": 2.0, "m_ms": 10.0,
    "tau_ms": 50.0, "noise": 0.0, "bw_mbps": 0.0}; nbdkit_argv(...) -> ["nbdkit", "-f",
    "--exit-with-parent", "--unix", SOCK, "--threads", "64", "python", ".../lqarray.py",
    "file=IMG", "size=8G", "model=lq", "c_ms=2", "m_ms=10", ..., "stats=STATS",
    "control=CONTROL"].
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "qemu" / "lqarray.py"
ARRAY_PACKAGES = ["nbdkit", "nbdkit-plugin-python"]
ARRAY_GIB = 8  # the guest's lab-array disk
HOST_ARRAY_GIB = 2
ARRAY_DEFAULTS = {
    "model": "lq",
    "c_ms": 2.0,
    "m_ms": 5.0,
    "tau_ms": 50.0,
    "noise": 0.0,
    "bw_mbps": 0.0,
}
ARRAY_MODELS = ("lq", "lqnow", "fifo")  # lqarray.py
# More than any client keeps in flight: QEMU's NBD client 16, nbdfuse about 10 (its FUSE
# threads).
ARRAY_THREADS = 64
NBDFUSE_CONNECTIONS = 16
START_TIMEOUT_S = 30.0
SUN_PATH_MAX = 100  # sun_path is 108 bytes
HOST_TOOLS = ("nbdkit", "nbdfuse", "fusermount3", "losetup")
# The files the plugin shares with the guest (in the run's work/, the guest's /shared/work)
STATS_NAME = "array-stats.json"
CONTROL_NAME = "array-control.json"
# What a guest may change while it runs (set_plant): the line's two parameters
LIVE_KEYS = ("c_ms", "m_ms")


class PlantError(RuntimeError):
    pass


def parse_array(spec: str | None) -> dict | None:
    """``nbd[:key=val,...]`` -> the plant's parameters; None/''/'none' -> None."""
    if not spec or spec == "none":
        return None
    kind, _, rest = spec.partition(":")
    if kind != "nbd":
        raise PlantError(f"unknown array {kind!r} (only 'nbd')")
    out = dict(ARRAY_DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq or key not in out:
            raise PlantError(f"array parameter {item!r}: one of {', '.join(out)} with =value")
        if key == "model":
            if val not in ARRAY_MODELS:
                raise PlantError(f"array model {val!r}: one of {', '.join(ARRAY_MODELS)}")
            out[key] = val
        else:
            try:
                out[key] = float(val)
            except ValueError:
                raise PlantError(f"array parameter {item!r}: not a number") from None
            if out[key] < 0:
                raise PlantError(f"array parameter {item!r}: negative")
    return out


def nbdkit_argv(
    nbdkit: str,
    array: dict,
    sock: Path,
    img: Path,
    size_gib: int,
    stats: Path,
    control: Path | None = None,
) -> list[str]:
    """The plant's nbdkit command line (the guest's and the host's)."""
    return [
        nbdkit,
        "-f",
        "--exit-with-parent",
        "--unix",
        str(sock),
        "--threads",
        str(ARRAY_THREADS),
        "python",
        str(PLUGIN),
        f"file={img}",
        f"size={size_gib}G",
        f"model={array['model']}",
        *(f"{k}={v:g}" for k, v in array.items() if k != "model"),
        f"stats={stats}",
        *([f"control={control}"] if control else []),
    ]


def end(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Our own child, by PID: SIGTERM, then SIGKILL after timeout_s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# The plant runs ahead of whatever else loads the host: its IOs' time on the way (the
# plugin's threads, nbdfuse's FUSE threads) would otherwise grow with the host's load and
# lift the line the daemon fits (a host at load 7: C +23 to +29 % where an idle one gave
# +8 %; docs/lab.md).  Both plants: nbdkit for a QEMU guest, nbdkit and nbdfuse here.
PLANT_NICE = -15


def _spawn(argv: list[str], logdir: Path, what: str, nice: int = 0) -> subprocess.Popen:
    """argv in the background, its command line in logdir/WHAT.cmd, its output in WHAT.log;
    nice: its niceness (below 0 needs root; without, the default)."""
    (logdir / f"{what}.cmd").write_text(shlex.join(argv) + "\n")
    with open(logdir / f"{what}.log", "w") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=(lambda: _renice(nice)) if nice else None,
        )


def _renice(nice: int) -> None:
    """os.nice in the child; a user who may not raise priority keeps the default."""
    with contextlib.suppress(PermissionError):
        os.nice(nice)


def _wait(ok, proc: subprocess.Popen, logdir: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ok():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (logdir / f"{what}.log").read_text(errors="replace").strip()
            raise PlantError(f"{what} did not come up (exit {proc.poll()}): {log}")
        time.sleep(0.05)


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds (0 once it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class NbdServer:
    """The plant for a QEMU guest: nbdkit on a unix socket in the run dir."""

    def __init__(self, array: dict, rundir: Path, work: Path) -> None:
        self.array, self.rundir, self.work = array, rundir, work
        sock = rundir / "array.sock"
        self.tmp: Path | None = None
        if len(str(sock)) > SUN_PATH_MAX:
            self.tmp = Path(tempfile.mkdtemp(prefix="lab-array-"))
            sock = self.tmp / "array.sock"
        self.sock = sock
        self.img = rundir / "array.img"
        self.proc: subprocess.Popen | None = None

    def start(self) -> NbdServer:
        nbdkit = shutil.which("nbdkit")
        if not nbdkit:
            raise PlantError("nbdkit not found (packages nbdkit nbdkit-plugin-python)")
        argv = nbdkit_argv(
            nbdkit,
            self.array,
            self.sock,
            self.img,
            ARRAY_GIB,
            self.work / STATS_NAME,
            self.work / CONTROL_NAME,
        )
        self.proc = _spawn(argv, self.rundir, "nbdkit", PLANT_NICE)
        try:
            _wait(self.sock.exists, self.proc, self.rundir, "nbdkit")
        except BaseException:
            self.stop()
            raise
        return self

    def qemu_args(self) -> list[str]:
        return [
            "-blockdev",
            f"driver=nbd,node-name=array,server.type=unix,server.path={self.sock}",
            "-device",
            "virtio-blk-pci,drive=array,serial=lab-array",
        ]

    def stop(self, cpu: dict | None = None) -> None:
        """End the server and remove its socket and image; cpu (QEMU's, wall): with the
        server's CPU seconds, written to the run dir's host-cpu.json."""
        if cpu is not None and self.proc is not None and self.proc.poll() is None:
            cpu = {**cpu, "nbdkit_cpu_s": round(cpu_s(self.proc.pid), 2)}
            (self.rundir / "host-cpu.json").write_text(json.dumps(cpu) + "\n")
        end(self.proc)
        self.sock.unlink(missing_ok=True)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.img.unlink(missing_ok=True)


# ------------------------------------------------------------------ the host's own
def host_missing() -> str | None:
    """Why a HostArray cannot run on this host, or None."""
    if os.geteuid() != 0:
        return "needs root (losetup, a FUSE mount)"
    for tool in HOST_TOOLS:
        if not shutil.which(tool):
            return f"{tool} is not installed (make setup)"
    for dev in ("/dev/fuse", "/dev/loop-control"):
        if not os.path.exists(dev):
            return f"{dev} is missing"
    probe = subprocess.run(
        ["nbdkit", "python", "--dump-plugin"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return "nbdkit's python plugin is not installed (nbdkit-plugin-python)"
    return None


class HostArray:
    """The plant as /dev/loopN of this host's kernel (nbdkit -> nbdfuse -> losetup), its
    server and FUSE daemon at PLANT_NICE.

    with HostArray(parse_array("nbd:c_ms=2,m_ms=5"), Path("/tmp/x")) as arr:
        arr.device          # "loop3"
        arr.server_stats()  # the plugin's own counters (lqarray.py), or None
    """

    def __init__(self, array: dict, workdir: Path, size_gib: int = HOST_ARRAY_GIB) -> None:
        self.array, self.workdir, self.size_gib = array, Path(workdir), size_gib
        self.sock = self.workdir / "array.sock"
        self.img = self.workdir / "array.img"
        self.mnt = self.workdir / "mnt"
        self.stats = self.workdir / STATS_NAME
        self.nbdkit: subprocess.Popen | None = None
        self.fuse: subprocess.Popen | None = None
        self.mounted = False
        self.loop: str | None = None  # /dev/loopN

    @property
    def device(self) -> str:
        assert self.loop, "not started"
        return Path(self.loop).name

    def __enter__(self) -> HostArray:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        if len(str(self.sock)) > SUN_PATH_MAX:
            raise PlantError(f"{self.workdir}: too long a path for the socket")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        argv = nbdkit_argv(
            shutil.which("nbdkit") or "nbdkit",
            self.array,
            self.sock,
            self.img,
            self.size_gib,
            self.stats,
        )
        self.nbdkit = _spawn(argv, self.workdir, "nbdkit", PLANT_NICE)
        _wait(self.sock.exists, self.nbdkit, self.workdir, "nbdkit")
        disk = self.mnt / "disk"
        self.fuse = _spawn(
            [
                "nbdfuse",
                "-C",
                str(NBDFUSE_CONNECTIONS),
                str(disk),
                f"nbd+unix:///?socket={self.sock}",
            ],
            self.workdir,
            "nbdfuse",
            PLANT_NICE,
        )
        self.mounted = True
        _wait(disk.exists, self.fuse, self.workdir, "nbdfuse")
        out = subprocess.run(
            ["losetup", "--direct-io=on", "-f", "--show", str(disk)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise PlantError(f"losetup: {out.stderr.strip()}")
        self.loop = out.stdout.strip()

    def server_stats(self) -> dict | None:
        """The plugin's cumulative counters (lqarray.py writes them every 0.5 s)."""
        return read_stats(self.stats)

    def close(self) -> None:
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True, check=False)
            self.loop = None
        if self.mounted:
            for _ in range(50):  # the loop device lets go of the file asynchronously
                if (
                    subprocess.run(
                        ["fusermount3", "-u", str(self.mnt)], capture_output=True, check=False
                    ).returncode
                    == 0
                ):
                    break
                if not os.path.ismount(self.mnt):
                    break
                time.sleep(0.1)
            self.mounted = False
        end(self.fuse)
        end(self.nbdkit)
        self.fuse = self.nbdkit = None
        for p in (self.sock, self.img):
            p.unlink(missing_ok=True)


def read_stats(path: Path) -> dict | None:
    """The plugin's cumulative counters (lqarray.py's stats=), or None."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------- from the guest
GUEST_WORK = Path("/shared/work")
APPLY_S = 10.0  # the plugin reads the control file every 0.5 s


def guest_set(work: Path = GUEST_WORK, **live: float) -> dict:
    """From the guest: a new C and/or m for the plant (the plugin's control file), and
    once the plugin's counters say they are in force, its config.  A PlantError when the
    guest has no plant or the plugin did not take them within APPLY_S."""
    bad = set(live) - set(LIVE_KEYS)
    if bad:
        raise PlantError(f"the plant's {', '.join(sorted(bad))} cannot change while it runs")
    tmp = work / (CONTROL_NAME + ".tmp")
    tmp.write_text(json.dumps(live))
    os.replace(tmp, work / CONTROL_NAME)
    deadline = time.monotonic() + APPLY_S
    while time.monotonic() < deadline:
        cfg = (read_stats(work / STATS_NAME) or {}).get("config") or {}
        if all(cfg.get(k) == float(v) for k, v in live.items()):
            return cfg
        time.sleep(0.2)
    raise PlantError(f"the plant did not take {live} within {APPLY_S:g} s")
