"""The lab's known plant as a block device of this host's own kernel (docs/lab.md,
"The daemon's fit on this host's kernel").

    nbdkit (lqarray.py, the plant)  <-unix socket-  nbdfuse (a file in a FUSE mount)
        <-  losetup --direct-io=on  ->  /dev/loopN

The same nbdkit plugin and parameters as `lab.py --array nbd:...` (parse_array), but
seen through the host's block layer instead of QEMU's NBD client and an emulated
guest: /proc/diskstats counts loopN's IOs from their submission to their completion
in this kernel, so the daemon's sensor reads the plant with a path of tenths of a
millisecond. Needs root, /dev/fuse, /dev/loop-control and the packages nbdkit,
nbdkit-plugin-python, nbdfuse and fuse3 (`make setup` installs them); missing(),
the reason it cannot run here, or None.

    with HostArray(parse_array("nbd:c_ms=2,m_ms=5"), Path("/tmp/x")) as arr:
        arr.device          # "loop3"
        arr.server_stats()  # the plugin's own counters (lqarray.py), or None

Everything it starts it ends by PID, and it detaches, unmounts and deletes what it
made, also when starting fails half-way.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARRAY_PLUGIN = HERE / "lqarray.py"
# More than any client keeps in flight: QEMU's NBD client 16, nbdfuse about 10 (its FUSE threads).
ARRAY_THREADS = 64
HOST_ARRAY_GIB = 2
NBDFUSE_CONNECTIONS = 16
START_TIMEOUT_S = 30.0
TOOLS = ("nbdkit", "nbdfuse", "fusermount3", "losetup")


def nbdkit_argv(nbdkit: str, array: dict, sock: Path, img: Path, size_gib: int,
                stats: Path) -> list[str]:  # fmt: skip
    """The plant's nbdkit command line (lab.py's and this module's)."""
    return [
        nbdkit, "-f", "--exit-with-parent", "--unix", str(sock),
        "--threads", str(ARRAY_THREADS),
        "python", str(ARRAY_PLUGIN),
        f"file={img}", f"size={size_gib}G", f"model={array['model']}",
        *(f"{k}={v:g}" for k, v in array.items() if k != "model"),
        f"stats={stats}",
    ]  # fmt: skip


def missing() -> str | None:
    """Why a HostArray cannot run on this host, or None."""
    if os.geteuid() != 0:
        return "needs root (losetup, a FUSE mount)"
    for tool in TOOLS:
        if not shutil.which(tool):
            return f"{tool} is not installed (make setup)"
    for dev in ("/dev/fuse", "/dev/loop-control"):
        if not os.path.exists(dev):
            return f"{dev} is missing"
    probe = subprocess.run(["nbdkit", "python", "--dump-plugin"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if probe.returncode != 0:
        return "nbdkit's python plugin is not installed (nbdkit-plugin-python)"
    return None


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


class HostArrayError(RuntimeError):
    pass


class HostArray:
    def __init__(self, array: dict, workdir: Path, size_gib: int = HOST_ARRAY_GIB) -> None:
        self.array, self.workdir, self.size_gib = array, Path(workdir), size_gib
        self.sock = self.workdir / "array.sock"
        self.img = self.workdir / "array.img"
        self.mnt = self.workdir / "mnt"
        self.stats = self.workdir / "array-stats.json"
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

    def _wait(self, ok, proc: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ok():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / f"{what}.log").read_text(errors="replace").strip()
                raise HostArrayError(f"{what} did not come up (exit {proc.poll()}): {log}")
            time.sleep(0.05)

    def _spawn(self, argv: list[str], what: str) -> subprocess.Popen:
        (self.workdir / f"{what}.cmd").write_text(shlex.join(argv) + "\n")
        with open(self.workdir / f"{what}.log", "w") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def _start(self) -> None:
        if len(str(self.sock)) > 100:  # sun_path is 108 bytes
            raise HostArrayError(f"{self.workdir}: too long a path for the socket")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        argv = nbdkit_argv(shutil.which("nbdkit") or "nbdkit", self.array, self.sock, self.img,
                           self.size_gib, self.stats)  # fmt: skip
        self.nbdkit = self._spawn(argv, "nbdkit")
        self._wait(self.sock.exists, self.nbdkit, "nbdkit")
        disk = self.mnt / "disk"
        self.fuse = self._spawn(
            ["nbdfuse", "-C", str(NBDFUSE_CONNECTIONS), str(disk),
             f"nbd+unix:///?socket={self.sock}"], "nbdfuse",
        )  # fmt: skip
        self.mounted = True
        self._wait(disk.exists, self.fuse, "nbdfuse")
        out = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(disk)],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if out.returncode != 0:
            raise HostArrayError(f"losetup: {out.stderr.strip()}")
        self.loop = out.stdout.strip()

    def server_stats(self) -> dict | None:
        """The plugin's cumulative counters (lqarray.py writes them every 0.5 s)."""
        try:
            return json.loads(self.stats.read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True, check=False)
            self.loop = None
        if self.mounted:
            for _ in range(50):  # the loop device lets go of the file asynchronously
                if subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True,
                                  check=False).returncode == 0:  # fmt: skip
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
