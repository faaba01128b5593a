"""The lab's host side: its settings, the host packages it needs, QEMU, the shared cache.

What it owns
    Settings: one lab installation (the cache directory, the checkout shared with the
    guest, QEMU, the kernel package, whether apt may install, the guest's vCPUs and
    memory, the known plant), each from its option, else its environment variable
    (vagrant/qemu/README.md), else the default.  The host packages the lab needs (the
    guest's /usr *is* the host's, so everything the guest runs) and Apt, which installs
    the missing ones with at most one `apt-get update`, or says why it cannot.  The
    cache's build lock.  The two errors: LabUnavailable (QEMU or the kernel cannot be
    had: the lab tier skips) and LabError (anything else: a failure).

Worked example
    s = Settings.from_env(smp=1, array="nbd:m_ms=10"); Apt(s).ensure(required_packages(s))
    -> [] when everything is there; as a user without root and nbdkit missing:
    LabError("missing host packages: nbdkit (not root; run `make lab-deps` as root)")
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from labkit.plant import ARRAY_PACKAGES, PlantError, parse_array

KIT = Path(__file__).resolve().parent
VAGRANT = KIT.parent
CHECKOUT = VAGRANT.parent
DEFAULT_SMP = 2
DEFAULT_MEM_MIB = 3072

# Host packages: QEMU and the initramfs pieces, plus everything the guest runs (the
# guest's /usr *is* the host's /usr).
HOST_PACKAGES = (
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "open-iscsi",
    "targetcli-fb",
    "python3-rtslib-fb",
    "python3-venv",
    "fio",
    "lvm2",
    "ipset",
    "iptables",
    "nftables",  # bridge mode's gate
    "libbpf1",  # bridge mode's in-kernel wire sensor (libbpf.so.1)
    "tcpdump",  # bridge_lab.py --capture: lab traffic for make bench
    "ethtool",  # bridge_lab.py: segmentation offloads off for the per-packet cost
    "iproute2",
    "nvme-cli",
    "procps",
    "sysstat",  # levels_lab.py: iostat -x, the reference of the utilization
)
QEMU_PACKAGE = "qemu-system-x86"
# A full run (make lab-test, make lab-systemd) sets it: the runs make test leaves out
# (a rollout guest, the systemd fleet pair) run too.
FULL_RUN = "SANTHROTTLE_LAB_FULL"


def full_run() -> bool:
    return bool(os.environ.get(FULL_RUN))


class LabUnavailable(Exception):
    """The lab cannot run on this machine (QEMU or the kernel is missing).

    The message is one line saying exactly what is missing; the pytest tier
    turns it into a skip reason."""


class LabError(Exception):
    """Any other failure of the lab machinery (a bug or a broken setup)."""


def _log_default(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def default_cache() -> Path:
    env = os.environ.get("SANTHROTTLE_LAB_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".cache" / "santhrottle-lab").resolve()


@dataclass
class Settings:
    """One lab installation: a cache directory, a checkout, a QEMU binary, the guest's
    size and the known plant (labkit.plant) if any.  from_env(): each from its option,
    else its environment variable (vagrant/qemu/README.md), else the default."""

    cache: Path
    checkout: Path = CHECKOUT
    qemu: str | None = None
    kernel_pkg: str | None = None
    kernel_deb: str | None = None
    install: bool = True
    smp: int = DEFAULT_SMP
    mem_mib: int = DEFAULT_MEM_MIB
    array: dict | None = None
    log: Callable[[str], None] = field(default=_log_default, repr=False)

    @classmethod
    def from_env(
        cls,
        cache: Path | None = None,
        checkout: Path = CHECKOUT,
        qemu: str | None = None,
        kernel_pkg: str | None = None,
        kernel_deb: str | None = None,
        install: bool | None = None,
        smp: int | None = None,
        mem_mib: int | None = None,
        array: str | None = None,
        log: Callable[[str], None] = _log_default,
    ) -> Settings:
        env = os.environ.get
        if install is None:
            install = env("SANTHROTTLE_LAB_NO_INSTALL", "") in ("", "0")
        try:
            plant = parse_array(array if array is not None else env("SANTHROTTLE_LAB_ARRAY"))
        except PlantError as e:
            raise LabError(str(e)) from None
        return cls(
            cache=Path(cache) if cache else default_cache(),
            checkout=Path(checkout).resolve(),
            qemu=qemu or env("SANTHROTTLE_LAB_QEMU") or None,
            kernel_pkg=kernel_pkg or env("SANTHROTTLE_LAB_KERNEL_PKG") or None,
            kernel_deb=kernel_deb or env("SANTHROTTLE_LAB_KERNEL_DEB") or None,
            install=install,
            smp=smp or int(env("SANTHROTTLE_LAB_SMP") or DEFAULT_SMP),
            mem_mib=mem_mib or int(env("SANTHROTTLE_LAB_MEM") or DEFAULT_MEM_MIB),
            array=plant,
            log=log,
        )


def sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def run_tool(cmd, check=True, **kw) -> subprocess.CompletedProcess:
    """subprocess.run with the output captured as text; check: a LabError with it."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.STDOUT)
    kw.setdefault("text", True)
    p = subprocess.run(cmd, **kw)
    if check and p.returncode != 0:
        out = (p.stdout or "").strip()
        raise LabError(f"{shlex.join(map(str, cmd))} exited {p.returncode}:\n{out}")
    return p


def last_line(text: str) -> str:
    """The line of a tool's output that says what went wrong (apt's E:, else the last)."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    errs = [x for x in lines if x.startswith(("E:", "Err:", "error", "Error"))]
    return (errs or lines or ["(no output)"])[-1]


@contextlib.contextmanager
def cache_lock(s: Settings) -> Iterator[None]:
    """The cache's build lock: one session builds, the others wait and reuse."""
    s.cache.mkdir(parents=True, exist_ok=True)
    with open(s.cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ------------------------------------------------------------------ host packages
def required_packages(s: Settings) -> list[str]:
    pkgs = list(HOST_PACKAGES)
    if s.qemu:  # a QEMU of one's own: the package is not needed
        pkgs.remove(QEMU_PACKAGE)
    if s.array:
        pkgs += ARRAY_PACKAGES
    return pkgs


def missing_packages(packages) -> list[str]:
    if not shutil.which("dpkg-query"):
        return list(packages)
    p = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n", *packages],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    installed = set()
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("ii"):
            installed.add(parts[0].split(":")[0])
    return [x for x in packages if x not in installed]


class Apt:
    """apt on the host: installs what is missing; `apt-get update` at most once."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.updated = False

    def may_update(self) -> bool:
        return os.geteuid() == 0 and self.s.install and not self.updated

    def update(self) -> None:
        if self.updated:
            return
        self.s.log("apt-get update")
        p = run_tool(["apt-get", "update", "-q"], check=False)
        self.updated = True
        if p.returncode != 0:
            self.s.log(f"apt-get update failed: {last_line(p.stdout)}")

    @staticmethod
    def _missing(missing: list[str], why: str) -> Exception:
        """Missing QEMU makes the lab unavailable (a skip); any other missing package is
        a broken setup (a failure)."""
        msg = f"missing host packages: {' '.join(missing)} ({why})"
        if QEMU_PACKAGE in missing:
            return LabUnavailable(f"QEMU unavailable: {msg}")
        return LabError(msg)

    def ensure(self, packages) -> list[str]:
        """Install the missing packages. Returns what was installed."""
        missing = missing_packages(packages)
        if not missing:
            return []
        why = None
        if not self.s.install:
            why = "SANTHROTTLE_LAB_NO_INSTALL is set"
        elif os.geteuid() != 0:
            why = "not root"
        elif not shutil.which("apt-get"):
            why = "no apt-get on this machine"
        if why:
            raise self._missing(missing, f"{why}; run `make lab-deps` as root")
        t0 = time.monotonic()
        self.update()
        self.s.log(f"apt-get install {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        p = run_tool(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
            check=False,
            env=env,
        )
        still = missing_packages(missing)
        if p.returncode != 0 or still:
            raise self._missing(still or missing, f"apt-get install failed: {last_line(p.stdout)}")
        self.s.log(f"installed {len(missing)} packages in {time.monotonic() - t0:.1f} s")
        return missing


def qemu_binary(s: Settings) -> str:
    if s.qemu:
        path = shutil.which(s.qemu)
        if not path:
            raise LabUnavailable(
                f"QEMU not found: SANTHROTTLE_LAB_QEMU={s.qemu} is not an executable"
            )
        return path
    path = shutil.which("qemu-system-x86_64")
    if not path:
        raise LabUnavailable(
            "QEMU not found: no qemu-system-x86_64 on PATH "
            "(package qemu-system-x86; run `make lab-deps` as root)"
        )
    return path
