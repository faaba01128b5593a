#!/usr/bin/env python3
"""santhrottle lab runner: Debian's real kernel under QEMU/TCG.

The development and CI machines run a kernel without sch_netem, LIO or
loadable modules.  This runner boots Debian's own kernel (the version behind
the ``linux-image-amd64`` metapackage) under QEMU with TCG, with the host's
/usr and /etc shared in read-only over 9p (each under a tmpfs overlay), the
project checkout and the lab venv shared at the same absolute paths as on the
host, a read-write work folder at /shared/work and two virtio disks: ``slow``
(throttled by QEMU, the "shared array") and ``fast``.  It runs one command
inside as root and hands its exit status and output back.

Stdlib only; runs with any python3 >= 3.9.  Subcommands::

    lab.py deps                 install the host packages (apt, idempotent)
    lab.py kernel               fetch + unpack + depmod Debian's kernel (cached)
    lab.py initramfs            build the busybox initramfs (cached)
    lab.py venv                 build the guest's Python venv (cached)
    lab.py up                   all of the above (``make lab-up``)
    lab.py run [--timeout S] SCRIPT [ARGS...]
                                boot, run SCRIPT inside, print its output,
                                exit with its status
    lab.py sh 'shell command'   same, for a one-line shell command
    lab.py clean                remove the cache

Everything is cached under ``$SANTHROTTLE_LAB_CACHE`` (default
``~/.cache/santhrottle-lab``).  Environment overrides (each also an option):

    SANTHROTTLE_LAB_CACHE       cache directory
    SANTHROTTLE_LAB_QEMU        qemu-system-x86_64 binary
    SANTHROTTLE_LAB_KERNEL_PKG  kernel package name instead of resolving it
    SANTHROTTLE_LAB_KERNEL_DEB  a local kernel .deb (offline use)
    SANTHROTTLE_LAB_NO_INSTALL  =1: never run apt-get install (report instead)
    SANTHROTTLE_LAB_SMP / _MEM  guest vCPUs (2) / memory in MiB (3072)
    SANTHROTTLE_LAB_KERNEL_ARGS extra kernel command line (e.g. loglevel=7)
    SANTHROTTLE_LAB_ARRAY       a third disk, the array as a known plant
                                (``--array nbd[:model=lq,c_ms=2,m_ms=5]``)

Exit statuses of ``run``: the command's own, 124 when the guest timed out,
125 when the guest ended without reporting a status (crash, panic), 3 when the
lab is unavailable on this machine (QEMU or the kernel package missing).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import json
import lzma
import os
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from hostarray import end, nbdkit_argv  # noqa: E402  (the plant's nbdkit, shared with the host's)

CHECKOUT = HERE.parent.parent
INIT_SCRIPT = HERE / "initramfs" / "init"
STAGE2 = HERE / "guest" / "stage2.sh"

# Host packages: QEMU and the initramfs pieces, plus everything the guest runs
# (the guest's /usr *is* the host's /usr).
HOST_PACKAGES = [
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
]

# Modules the initramfs loads (in dependency order, resolved from modules.dep).
INITRAMFS_MODULES = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "overlay",
]

# ``--array nbd``: the known plant, an nbdkit server on the host (lqarray.py,
# docs/lab.md "The array as a known plant"), attached as a third virtio disk
# (serial lab-array) over QEMU's NBD client on a unix socket.
ARRAY_PACKAGES = ["nbdkit", "nbdkit-plugin-python"]
ARRAY_GIB = 8
ARRAY_DEFAULTS = {
    "model": "lq",
    "c_ms": 2.0,
    "m_ms": 5.0,
    "tau_ms": 50.0,
    "noise": 0.0,
    "bw_mbps": 0.0,
}
ARRAY_MODELS = ("lq", "lqnow", "fifo")  # lqarray.py


def parse_array(spec: str | None) -> dict | None:
    """``nbd[:key=val,...]`` -> the plant's parameters; None/''/'none' -> None."""
    if not spec or spec == "none":
        return None
    kind, _, rest = spec.partition(":")
    if kind != "nbd":
        raise LabError(f"unknown array {kind!r} (only 'nbd')")
    out = dict(ARRAY_DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq or key not in out:
            raise LabError(f"array parameter {item!r}: one of {', '.join(out)} with =value")
        if key == "model":
            if val not in ARRAY_MODELS:
                raise LabError(f"array model {val!r}: one of {', '.join(ARRAY_MODELS)}")
            out[key] = val
        else:
            try:
                out[key] = float(val)
            except ValueError:
                raise LabError(f"array parameter {item!r}: not a number") from None
            if out[key] < 0:
                raise LabError(f"array parameter {item!r}: negative")
    return out


# What the guest's venv gets from PyPI besides the project itself.
VENV_REQUIREMENTS = ["pytest>=8", "pyroute2>=0.9,<0.10"]

DEFAULT_SMP = 2
DEFAULT_MEM_MIB = 3072
# The slow disk plays a shared array: QEMU throttles it (docs/lab.md).
SLOW_DISK_GIB = 8
FAST_DISK_GIB = 4
SLOW_IOPS = 1000
SLOW_BPS = 40_000_000
DEFAULT_TIMEOUT_S = 900
RUNS_KEPT = 5

EXIT_TIMEOUT = 124
EXIT_NO_STATUS = 125
EXIT_UNAVAILABLE = 3
GUEST_TMPFS = ("/tmp", "/run", "/dev/shm")  # guest/stage2.sh


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


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _run(cmd, log=None, check=True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.STDOUT)
    kw.setdefault("text", True)
    p = subprocess.run(cmd, **kw)
    if check and p.returncode != 0:
        out = (p.stdout or "").strip()
        raise LabError(f"{shlex.join(map(str, cmd))} exited {p.returncode}:\n{out}")
    return p


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    errs = [x for x in lines if x.startswith(("E:", "Err:", "error", "Error"))]
    return (errs or lines or ["(no output)"])[-1]


class Lab:
    """One lab installation: a cache directory, a checkout, a QEMU binary."""

    def __init__(
        self,
        cache: Path | None = None,
        checkout: Path = CHECKOUT,
        qemu: str | None = None,
        kernel_pkg: str | None = None,
        kernel_deb: str | None = None,
        install: bool | None = None,
        smp: int | None = None,
        mem_mib: int | None = None,
        array: str | None = None,
        log=_log_default,
    ) -> None:
        self.cache = Path(cache) if cache else default_cache()
        self.checkout = Path(checkout).resolve()
        self.qemu_override = qemu or os.environ.get("SANTHROTTLE_LAB_QEMU") or None
        self.kernel_pkg = kernel_pkg or os.environ.get("SANTHROTTLE_LAB_KERNEL_PKG") or None
        self.kernel_deb = kernel_deb or os.environ.get("SANTHROTTLE_LAB_KERNEL_DEB") or None
        if install is None:
            install = os.environ.get("SANTHROTTLE_LAB_NO_INSTALL", "") in ("", "0")
        self.install = install
        self.smp = smp or int(os.environ.get("SANTHROTTLE_LAB_SMP", DEFAULT_SMP))
        self.mem_mib = mem_mib or int(os.environ.get("SANTHROTTLE_LAB_MEM", DEFAULT_MEM_MIB))
        self.array = parse_array(
            array if array is not None else os.environ.get("SANTHROTTLE_LAB_ARRAY")
        )
        self.log = log
        self._apt_updated = False

    # ------------------------------------------------------------------ deps
    @staticmethod
    def missing_packages(packages=HOST_PACKAGES) -> list[str]:
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

    def _apt_update(self) -> None:
        if self._apt_updated:
            return
        self.log("apt-get update")
        p = _run(["apt-get", "update", "-q"], check=False)
        self._apt_updated = True
        if p.returncode != 0:
            self.log(f"apt-get update failed: {_last_line(p.stdout)}")

    def required_packages(self) -> list[str]:
        pkgs = list(HOST_PACKAGES)
        if self.qemu_override:  # a QEMU of one's own: the package is not needed
            pkgs.remove("qemu-system-x86")
        if self.array:
            pkgs += ARRAY_PACKAGES
        return pkgs

    @staticmethod
    def _missing(missing: list[str], why: str) -> Exception:
        """Missing QEMU makes the lab unavailable (a skip); any other missing
        package is a broken setup (a failure)."""
        msg = f"missing host packages: {' '.join(missing)} ({why})"
        if "qemu-system-x86" in missing:
            return LabUnavailable(f"QEMU unavailable: {msg}")
        return LabError(msg)

    def deps(self) -> list[str]:
        """Install the missing host packages. Returns what was installed."""
        missing = self.missing_packages(self.required_packages())
        if not missing:
            return []
        why = None
        if not self.install:
            why = "SANTHROTTLE_LAB_NO_INSTALL is set"
        elif os.geteuid() != 0:
            why = "not root"
        elif not shutil.which("apt-get"):
            why = "no apt-get on this machine"
        if why:
            raise self._missing(missing, f"{why}; run `make lab-deps` as root")
        t0 = time.monotonic()
        self._apt_update()
        self.log(f"apt-get install {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        p = _run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
            check=False,
            env=env,
        )
        still = self.missing_packages(missing)
        if p.returncode != 0 or still:
            raise self._missing(still or missing, f"apt-get install failed: {_last_line(p.stdout)}")
        self.log(f"installed {len(missing)} packages in {time.monotonic() - t0:.1f} s")
        return missing

    def qemu(self) -> str:
        if self.qemu_override:
            q = self.qemu_override
            path = shutil.which(q)
            if not path:
                raise LabUnavailable(
                    f"QEMU not found: SANTHROTTLE_LAB_QEMU={q} is not an executable"
                )
            return path
        path = shutil.which("qemu-system-x86_64")
        if not path:
            raise LabUnavailable(
                "QEMU not found: no qemu-system-x86_64 on PATH "
                "(package qemu-system-x86; run `make lab-deps` as root)"
            )
        return path

    # ---------------------------------------------------------------- kernel
    def resolve_kernel_package(self) -> str:
        if self.kernel_pkg:
            return self.kernel_pkg
        for attempt in (0, 1):
            p = _run(["apt-cache", "depends", "linux-image-amd64"], check=False)
            for line in p.stdout.splitlines():
                line = line.strip()
                if line.startswith("Depends:"):
                    name = line.split(":", 1)[1].strip().strip("<>")
                    if name.startswith("linux-image-"):
                        return name
            if attempt == 0 and os.geteuid() == 0 and self.install:
                self._apt_update()
        raise LabUnavailable(
            "kernel package unavailable: `apt-cache depends linux-image-amd64` names no "
            "linux-image-* package (no Debian apt source?); set SANTHROTTLE_LAB_KERNEL_DEB"
        )

    def _kernel_dirs(self) -> list[Path]:
        base = self.cache / "kernel"
        if not base.is_dir():
            return []
        return sorted(
            (d for d in base.iterdir() if (d / "ok").is_file()),
            key=lambda d: (d / "ok").stat().st_mtime,
        )

    def kernel(self) -> dict:
        """Fetch, unpack and depmod Debian's kernel; returns its description."""
        t0 = time.monotonic()
        if self.kernel_deb:
            deb = Path(self.kernel_deb)
            if not deb.is_file():
                raise LabUnavailable(f"kernel package unavailable: {deb} does not exist")
            key = deb.name[: -len(".deb")] if deb.name.endswith(".deb") else deb.name
            kdir = self.cache / "kernel" / key
            if not (kdir / "ok").is_file():
                self._unpack_kernel(deb, kdir)
            return self._kernel_info(kdir)

        # Resolve, then download; if the download fails on stale apt lists,
        # update them and resolve again (the metapackage may have moved on).
        for attempt in (0, 1):
            try:
                pkg = self.resolve_kernel_package()
            except LabUnavailable:
                cached = self._kernel_dirs()
                if cached:
                    self.log(f"cannot resolve the kernel package; using cached {cached[-1].name}")
                    return self._kernel_info(cached[-1])
                raise
            version = ""
            p = _run(["apt-cache", "show", "--no-all-versions", pkg], check=False)
            for line in p.stdout.splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                    break
            key = f"{pkg}_{version}".replace(":", "%3a") if version else pkg
            kdir = self.cache / "kernel" / key
            if (kdir / "ok").is_file():
                return self._kernel_info(kdir)
            dl = self.cache / "downloads"
            dl.mkdir(parents=True, exist_ok=True)
            for old in dl.glob(f"{pkg}_*.deb"):
                old.unlink()
            self.log(f"apt-get download {pkg} {version}")
            p = _run(["apt-get", "download", "-q", pkg], cwd=dl, check=False)
            debs = sorted(dl.glob(f"{pkg}_*.deb"))
            if p.returncode == 0 and debs:
                break
            can_update = os.geteuid() == 0 and self.install and not self._apt_updated
            if attempt == 0 and can_update:
                self._apt_update()
                continue
            cached = [] if self.kernel_pkg else self._kernel_dirs()
            if cached:
                self.log(
                    f"download failed ({_last_line(p.stdout)}); using cached {cached[-1].name}"
                )
                return self._kernel_info(cached[-1])
            raise LabUnavailable(
                f"kernel package unavailable: `apt-get download {pkg}` failed: "
                f"{_last_line(p.stdout)}"
            )
        self._unpack_kernel(debs[-1], kdir)
        debs[-1].unlink()  # the unpacked tree is the cache; the .deb is 100 MB more
        for other in self._kernel_dirs():  # one kernel tree is ~400 MB: keep the current one
            if other != kdir:
                shutil.rmtree(other, ignore_errors=True)
        self.log(f"kernel {kdir.name} ready in {time.monotonic() - t0:.1f} s")
        return self._kernel_info(kdir)

    def _unpack_kernel(self, deb: Path, kdir: Path) -> None:
        for tool in ("dpkg", "depmod"):
            if not shutil.which(tool):
                raise LabError(f"{tool} not found (packages dpkg, kmod)")
        tmp = kdir.with_name(kdir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(kdir, ignore_errors=True)
        root = tmp / "root"
        root.mkdir(parents=True)
        self.log(f"dpkg -x {deb.name}")
        _run(["dpkg", "-x", str(deb), str(root)])
        # Debian 12 ships modules in /lib/modules, later releases in /usr/lib.
        for mods in (root / "lib" / "modules", root / "usr" / "lib" / "modules"):
            if mods.is_dir():
                break
        else:
            raise LabError(f"{deb.name}: no lib/modules inside")
        kvs = [d.name for d in mods.iterdir() if d.is_dir()]
        if len(kvs) != 1:
            raise LabError(f"{deb.name}: expected one module tree, found {kvs}")
        kv = kvs[0]
        if mods != root / "lib" / "modules":
            (root / "lib").mkdir(exist_ok=True)
            mods.rename(root / "lib" / "modules")
        sysmap = root / "boot" / f"System.map-{kv}"
        cmd = ["depmod", "-b", str(root)]
        if sysmap.is_file():
            cmd += ["-F", str(sysmap)]
        _run([*cmd, kv])
        vmlinuz = root / "boot" / f"vmlinuz-{kv}"
        if not vmlinuz.is_file():
            raise LabError(f"{deb.name}: no boot/vmlinuz-{kv}")
        (tmp / "ok").write_text(json.dumps({"kv": kv, "deb": deb.name}) + "\n")
        tmp.rename(kdir)

    @staticmethod
    def _kernel_info(kdir: Path) -> dict:
        meta = json.loads((kdir / "ok").read_text())
        kv = meta["kv"]
        root = kdir / "root"
        return {
            "key": kdir.name,
            "kv": kv,
            "root": root,
            "vmlinuz": root / "boot" / f"vmlinuz-{kv}",
            "modules": root / "lib" / "modules",
        }

    # ------------------------------------------------------------- initramfs
    @staticmethod
    def _busybox() -> Path:
        for cand in ("/bin/busybox", "/usr/bin/busybox"):
            p = Path(cand)
            if p.is_file():
                if not _elf_is_static(p):
                    raise LabError(f"{p} is not statically linked (install busybox-static)")
                return p
        raise LabError("busybox not found (install busybox-static)")

    def initramfs(self, kernel: dict | None = None) -> Path:
        kernel = kernel or self.kernel()
        kv = kernel["kv"]
        moddir = Path(kernel["modules"]) / kv
        busybox = self._busybox()
        init = INIT_SCRIPT.read_bytes()
        bb = busybox.read_bytes()
        key = _sha(kernel["key"], init, bb, " ".join(INITRAMFS_MODULES))[:16]
        out = self.cache / "initramfs" / f"initramfs-{kv}-{key}.cpio.gz"
        if out.is_file():
            return out
        t0 = time.monotonic()
        order = _module_load_order(moddir, INITRAMFS_MODULES)
        files: list[tuple[str, int, bytes]] = []  # (path, mode, data); data None = dir
        for d in ("bin", "dev", "proc", "sys", "newroot", "modules", "root", "tmp"):
            files.append((d, 0o40755, b""))
        files.append(("bin/busybox", 0o100755, bb))
        files.append(("init", 0o100755, init))
        names = []
        for rel in order:
            data = (moddir / rel).read_bytes()
            name = Path(rel).name
            if name.endswith(".xz"):
                data, name = lzma.decompress(data), name[:-3]
            elif name.endswith(".zst"):
                if not shutil.which("zstd"):
                    raise LabError(f"{rel} is zstd-compressed and zstd is not installed")
                data = _run(["zstd", "-dc", str(moddir / rel)], text=False).stdout
                name = name[:-4]
            elif name.endswith(".gz"):
                data, name = gzip.decompress(data), name[:-3]
            files.append((f"modules/{name}", 0o100644, data))
            names.append(name)
        files.append(("modules.order", 0o100644, ("\n".join(names) + "\n").encode()))
        out.parent.mkdir(parents=True, exist_ok=True)
        for old in out.parent.glob("initramfs-*.cpio.gz"):
            old.unlink()
        tmp = out.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(gzip.compress(_cpio_newc(files), compresslevel=6))
        tmp.rename(out)
        self.log(f"initramfs {out.name} ({len(names)} modules) in {time.monotonic() - t0:.1f} s")
        return out

    # ------------------------------------------------------------------ venv
    VENVS_KEPT = 3

    def venv(self) -> Path:
        """The guest's Python: /usr/bin/python3 venv with system site packages
        (Debian's python3-rtslib-fb), pytest, pyroute2 and the project installed
        editable from the checkout (same path in the guest).  Rebuilt only when
        pyproject.toml, the requirements, the checkout path or the system
        python change.  Each build gets its own directory (named by that
        stamp), so a guest still running on the previous one is not pulled
        from under; the newest VENVS_KEPT are kept."""
        pyproject = self.checkout / "pyproject.toml"
        sys_py = Path("/usr/bin/python3")
        if not sys_py.exists():
            raise LabError("/usr/bin/python3 not found (Debian's python3)")
        stamp = _sha(
            pyproject.read_bytes() if pyproject.is_file() else b"",
            " ".join(VENV_REQUIREMENTS),
            str(self.checkout),
            str(sys_py.resolve()),
            str(sys_py.resolve().stat().st_size),
        )
        vdir = self.cache / f"venv-{stamp[:12]}"
        stamp_file = vdir / ".lab-stamp"
        if stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
            os.utime(vdir)  # most recently used
            return vdir
        t0 = time.monotonic()
        self.log(f"building the guest venv {vdir}")
        shutil.rmtree(vdir, ignore_errors=True)
        _run([str(sys_py), "-m", "venv", "--system-site-packages", str(vdir)])
        pip = [str(vdir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        reqs = list(VENV_REQUIREMENTS)
        if pyproject.is_file():
            reqs += ["-e", str(self.checkout)]
        p = _run([*pip, "install", *reqs], check=False)
        if p.returncode != 0:
            raise LabError(f"pip install into the guest venv failed:\n{p.stdout}")
        stamp_file.write_text(stamp + "\n")
        venvs = sorted(self.cache.glob("venv-*"), key=lambda d: d.stat().st_mtime)
        for old in venvs[: -self.VENVS_KEPT]:
            shutil.rmtree(old, ignore_errors=True)
        self.log(f"guest venv ready in {time.monotonic() - t0:.1f} s")
        return vdir

    # -------------------------------------------------------------------- up
    def up(self, venv: bool = True) -> dict:
        """deps + kernel + initramfs (+ venv): everything a run needs.
        Serialized by a lock in the cache: concurrent sessions share it."""
        if os.environ.get("SANTHROTTLE_IN_GUEST") == "1":
            raise LabError(
                "lab.py boots guests from the host; this is the lab guest already "
                "(SANTHROTTLE_IN_GUEST=1)"
            )
        for hidden in GUEST_TMPFS:  # stage2.sh mounts fresh tmpfs there
            if self.checkout == Path(hidden) or Path(hidden) in self.checkout.parents:
                raise LabError(
                    f"the checkout {self.checkout} is under {hidden}, which the guest "
                    "mounts as an empty tmpfs: it would not see it; clone it elsewhere"
                )
        if self.qemu_override:
            self.qemu()  # an explicit override that does not exist: stop here
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.deps()
            qemu = self.qemu()
            kernel = self.kernel()
            initrd = self.initramfs(kernel)
            vdir = self.venv() if venv else None
        return {"qemu": qemu, "kernel": kernel, "initramfs": initrd, "venv": vdir}

    # ------------------------------------------------------------------- run
    def run(
        self,
        command: str,
        timeout: float = DEFAULT_TIMEOUT_S,
        env: dict | None = None,
        venv: bool = True,
        slow_iops: int = SLOW_IOPS,
        slow_bps: int = SLOW_BPS,
        echo_console: bool = False,
        prepared: dict | None = None,
    ) -> RunResult:
        """Boot the guest, run ``command`` (a /bin/sh script text) as root,
        power off.  Never raises for guest-side failures: see RunResult."""
        prep = prepared or self.up(venv=venv)
        kernel = prep["kernel"]
        for path in (self.checkout, prep.get("venv"), self.cache):
            if path and any(c.isspace() or c == "," for c in str(path)):
                # kernel command line and QEMU option syntax
                raise LabError(f"paths with white space or commas are not supported: {path!r}")
        rundir = self._new_rundir()
        work = rundir / "work"
        work.mkdir(parents=True)
        console = rundir / "console.log"
        (work / "cmd").write_text(command if command.endswith("\n") else command + "\n")
        genv = {
            "SANTHROTTLE_LAB_CHECKOUT": str(self.checkout),
            "SANTHROTTLE_LAB_CACHE": str(self.cache),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if prep.get("venv"):
            genv["SANTHROTTLE_LAB_VENV"] = str(prep["venv"])
            genv["VIRTUAL_ENV"] = str(prep["venv"])
            genv["PATH"] = (
                f"{prep['venv']}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            )
        if self.array:
            genv["SANTHROTTLE_LAB_ARRAY"] = json.dumps(self.array, separators=(",", ":"))
        genv.update(env or {})
        (work / "env").write_text("".join(f"{k}={shlex.quote(str(v))}\n" for k, v in genv.items()))

        slow = rundir / "slow.img"
        fast = rundir / "fast.img"
        for img, gib in ((slow, SLOW_DISK_GIB), (fast, FAST_DISK_GIB)):
            with open(img, "wb") as f:
                f.truncate(gib << 30)  # sparse, fresh per run: no leftovers

        append = " ".join(
            [
                "console=ttyS0",
                "quiet",
                "panic=-1",
                "mitigations=off",
                "tsc=reliable",
                *os.environ.get("SANTHROTTLE_LAB_KERNEL_ARGS", "").split(),
                f"lab_checkout={self.checkout}",
                f"lab_stage2={STAGE2 if STAGE2.is_relative_to(self.checkout) else ''}",
            ]
            + ([f"lab_venv={prep['venv']}"] if prep.get("venv") else [])
        )

        def virtfs(path, tag, ro):
            return [
                "-virtfs",
                f"local,path={path},mount_tag={tag},security_model=none"
                + (",readonly=on" if ro else ""),
            ]

        drive_opts = "format=raw,if=none,cache=none,aio=threads"
        cmd = [
            prep["qemu"],
            "-nodefaults",
            "-no-user-config",
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "max",
            "-smp",
            str(self.smp),
            "-m",
            str(self.mem_mib),
            "-display",
            "none",
            "-vga",
            "none",
            "-no-reboot",
            "-nic",
            "none",
            "-chardev",
            f"file,id=con,path={console}",
            "-serial",
            "chardev:con",
            "-kernel",
            str(kernel["vmlinuz"]),
            "-initrd",
            str(prep["initramfs"]),
            "-append",
            append,
            *virtfs("/usr", "hostusr", True),
            *virtfs("/etc", "hostetc", True),
            *virtfs(kernel["modules"], "kmods", True),
            *virtfs(self.checkout, "checkout", False),
            *virtfs(work, "work", False),
            *(virtfs(prep["venv"], "venv", True) if prep.get("venv") else []),
            "-drive",
            f"file={slow},id=slow,{drive_opts},"
            f"throttling.iops-total={slow_iops},throttling.bps-total={slow_bps}",
            "-device",
            "virtio-blk-pci,drive=slow,serial=lab-slow",
            "-drive",
            f"file={fast},id=fast,{drive_opts}",
            "-device",
            "virtio-blk-pci,drive=fast,serial=lab-fast",
        ]
        array = self._start_array(rundir, work) if self.array else None
        if array:
            cmd += [
                "-blockdev",
                f"driver=nbd,node-name=array,server.type=unix,server.path={array['sock']}",
                "-device",
                "virtio-blk-pci,drive=array,serial=lab-array",
            ]
        (rundir / "qemu.cmd").write_text(shlex.join(map(str, cmd)) + "\n")
        t0 = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        stop_echo = threading.Event()
        echo_thread = None
        with open(rundir / "qemu.log", "w") as qlog:
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=qlog, stderr=subprocess.STDOUT
                )
            except BaseException:
                self._stop_array(array)
                raise
            if echo_console:
                echo_thread = threading.Thread(
                    target=_follow, args=(console, stop_echo), daemon=True
                )
                echo_thread.start()
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                self._stop_array(array)
                raise
            finally:
                stop_echo.set()
                if echo_thread:
                    echo_thread.join(timeout=2)
        wall = time.monotonic() - t0
        if array:
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            array["qemu_cpu_s"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
            array["wall_s"] = wall
        self._stop_array(array, rundir)
        for img in (slow, fast):
            img.unlink(missing_ok=True)
        self._run_lock.close()
        status_file = work / "status"
        status = None
        if status_file.is_file():
            try:
                status = int(status_file.read_text().strip())
            except ValueError:
                status = None
        if timed_out:
            reason = f"guest timed out after {timeout:.0f} s"
            code = EXIT_TIMEOUT
        elif status is None:
            qout = (rundir / "qemu.log").read_text(errors="replace").strip()
            reason = f"guest ended without a status (QEMU exit {proc.returncode})"
            if qout:
                reason += f": {qout.splitlines()[-1]}"
            code = EXIT_NO_STATUS
        else:
            reason = ""
            code = status
        return RunResult(code, rundir, wall, reason)

    def _start_array(self, rundir: Path, work: Path) -> dict:
        """Start the plant's nbdkit on a unix socket in the run dir (its own
        process, ended by PID in _stop_array; --exit-with-parent if lab.py dies)."""
        nbdkit = shutil.which("nbdkit")
        if not nbdkit:
            raise LabError("nbdkit not found (packages nbdkit nbdkit-plugin-python)")
        sock = rundir / "array.sock"
        if len(str(sock)) > 100:  # sun_path is 108 bytes
            sock = Path(tempfile.mkdtemp(prefix="lab-array-")) / "array.sock"
        img = rundir / "array.img"
        a = self.array
        argv = nbdkit_argv(nbdkit, a, sock, img, ARRAY_GIB, work / "array-stats.json")
        (rundir / "nbdkit.cmd").write_text(shlex.join(argv) + "\n")
        log = open(rundir / "nbdkit.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        out = {"proc": proc, "sock": sock, "img": img}
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                self._stop_array(out)
                tail = (rundir / "nbdkit.log").read_text(errors="replace").strip()
                raise LabError(f"nbdkit did not come up (exit {proc.returncode}): {tail}")
            time.sleep(0.05)
        self.log(f"array: nbdkit pid {proc.pid}, {sock}, {a}")
        return out

    def _stop_array(self, array: dict | None, rundir: Path | None = None) -> None:
        if not array:
            return
        proc = array["proc"]
        if rundir and proc.poll() is None:  # host CPU: QEMU's and the server's
            try:
                f = (Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1]).split()
                tck = os.sysconf("SC_CLK_TCK")
                cpu = {
                    "wall_s": round(array.get("wall_s", 0.0), 2),
                    "qemu_cpu_s": round(array.get("qemu_cpu_s", 0.0), 2),
                    "nbdkit_cpu_s": round((int(f[11]) + int(f[12])) / tck, 2),
                }
                (rundir / "host-cpu.json").write_text(json.dumps(cpu) + "\n")
                self.log(f"array: host CPU {cpu}")
            except (OSError, ValueError, IndexError):
                pass
        end(proc)
        sock = Path(array["sock"])
        sock.unlink(missing_ok=True)
        if sock.parent.name.startswith("lab-array-"):
            shutil.rmtree(sock.parent, ignore_errors=True)
        Path(array["img"]).unlink(missing_ok=True)

    def _new_rundir(self) -> Path:
        runs = self.cache / "runs"
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
        # held (flock) until run() returns; pruning skips locked run dirs
        self._run_lock = open(d / ".running", "w")  # noqa: SIM115
        fcntl.flock(self._run_lock, fcntl.LOCK_EX)
        last = runs / "last"
        try:
            if last.is_symlink() or last.exists():
                last.unlink()
            last.symlink_to(d.name)
        except OSError:
            pass
        return d


class RunResult:
    """What a guest run left behind.  ``status``: the command's exit status,
    or EXIT_TIMEOUT / EXIT_NO_STATUS; ``reason`` explains the latter two."""

    def __init__(self, status: int, rundir: Path, wall_s: float, reason: str) -> None:
        self.status = status
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


# ---------------------------------------------------------------- helpers
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


def _elf_is_static(path: Path) -> bool:
    """True when the ELF file has no PT_INTERP program header."""
    with open(path, "rb") as f:
        hdr = f.read(64)
        if hdr[:4] != b"\x7fELF" or hdr[4] != 2:  # 64-bit only
            return False
        (phoff,) = struct.unpack_from("<Q", hdr, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", hdr, 0x36)
        f.seek(phoff)
        for _ in range(phnum):
            ph = f.read(phentsize)
            if struct.unpack_from("<I", ph, 0)[0] == 3:  # PT_INTERP
                return False
    return True


def _module_load_order(moddir: Path, wanted: list[str]) -> list[str]:
    """Paths (relative to moddir) of ``wanted`` and their dependencies in load
    order; built-in modules are skipped."""
    deps: dict[str, list[str]] = {}
    byname: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        mod, rest = line.split(":", 1)
        deps[mod] = rest.split()
        byname[_modname(mod)] = mod
    builtin = set()
    bfile = moddir / "modules.builtin"
    if bfile.is_file():
        builtin = {_modname(x) for x in bfile.read_text().split()}
    order: list[str] = []

    def visit(mod: str) -> None:
        if mod in order:
            return
        for d in deps.get(mod, []):
            visit(d)
        order.append(mod)

    for name in wanted:
        n = name.replace("-", "_")
        if n in byname:
            visit(byname[n])
        elif n not in builtin:
            raise LabError(f"module {name} is neither a module nor built in ({moddir})")
    return order


def _modname(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    for ext in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return base.replace("-", "_")


def _cpio_newc(files: list[tuple[str, int, bytes]]) -> bytes:
    out = io.BytesIO()
    ino = 1

    def entry(name: str, mode: int, data: bytes) -> None:
        nonlocal ino
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(
            f"{v:08x}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0)
        )
        ino += 1
        out.write(hdr.encode() + nb)
        out.write(b"\0" * ((4 - (110 + len(nb)) % 4) % 4))
        out.write(data)
        out.write(b"\0" * ((4 - len(data) % 4) % 4))

    for name, mode, data in files:
        entry(name, mode, data)
    entry("TRAILER!!!", 0, b"")
    return out.getvalue()


# -------------------------------------------------------------------- CLI
def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python3 vagrant/qemu/lab.py up\n"
        "  python3 vagrant/qemu/lab.py sh 'uname -r; lsmod | head'\n"
        "  python3 vagrant/qemu/lab.py run -v vagrant/qemu/guest/topology.py up\n",
    )
    ap.add_argument("--cache", type=Path, default=None, help="cache dir (SANTHROTTLE_LAB_CACHE)")
    ap.add_argument("--checkout", type=Path, default=CHECKOUT, help="project checkout to share")
    ap.add_argument("--qemu", default=None, help="QEMU binary (SANTHROTTLE_LAB_QEMU)")
    ap.add_argument("--kernel-pkg", default=None, help="kernel package name")
    ap.add_argument("--kernel-deb", default=None, help="local kernel .deb")
    ap.add_argument("--no-install", action="store_true", help="never run apt-get install")
    ap.add_argument("--smp", type=int, default=None)
    ap.add_argument("--mem", type=int, default=None, help="guest memory, MiB")
    ap.add_argument(
        "--array",
        default=None,
        metavar="nbd[:model=lq,c_ms=2,m_ms=5,tau_ms=50,noise=0]",
        help="a third disk (serial lab-array): the array as a known plant, nbdkit on the "
        "host (lqarray.py; SANTHROTTLE_LAB_ARRAY; docs/lab.md)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("deps", help="install the host packages (root)")
    sub.add_parser("kernel", help="fetch and unpack Debian's kernel")
    sub.add_parser("initramfs", help="build the initramfs")
    sub.add_parser("venv", help="build the guest's Python venv")
    sub.add_parser("up", help="deps + kernel + initramfs + venv")
    sub.add_parser("clean", help="remove the cache directory")
    for name in ("run", "sh"):
        sp = sub.add_parser(
            name,
            help="boot and run a script inside" if name == "run" else "boot and run a shell line",
        )
        sp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
        sp.add_argument("-v", "--console", action="store_true", help="echo the serial console")
        sp.add_argument("--no-venv", action="store_true", help="do not build/share the venv")
        sp.add_argument("--slow-iops", type=int, default=SLOW_IOPS)
        sp.add_argument("--slow-bps", type=int, default=SLOW_BPS)
        if name == "run":
            sp.add_argument("script", help="executable file (run in the guest at the same path)")
            sp.add_argument("args", nargs=argparse.REMAINDER)
        else:
            sp.add_argument("line", help="shell command line")
    a = ap.parse_args(argv)
    try:
        parse_array(a.array)
    except LabError as e:
        ap.error(str(e))
    lab = Lab(
        cache=a.cache,
        checkout=a.checkout,
        qemu=a.qemu,
        kernel_pkg=a.kernel_pkg,
        kernel_deb=a.kernel_deb,
        install=False if a.no_install else None,
        smp=a.smp,
        mem_mib=a.mem,
        array=a.array,
    )
    # SIGTERM (a CI job's timeout, kill PID) unwinds like ^C: the guest and the array
    # server are stopped, never left running
    signal.signal(signal.SIGTERM, _interrupted)
    t0 = time.monotonic()
    try:
        if a.cmd == "deps":
            lab.deps()
            lab.qemu()
        elif a.cmd == "kernel":
            k = lab.kernel()
            print(f"{k['kv']} {k['root']}")
        elif a.cmd == "initramfs":
            print(lab.initramfs())
        elif a.cmd == "venv":
            print(lab.venv())
        elif a.cmd == "up":
            prep = lab.up()
            print(
                f"lab ready in {time.monotonic() - t0:.1f} s: kernel {prep['kernel']['kv']}, "
                f"initramfs {prep['initramfs'].name}, venv {prep['venv']}"
            )
        elif a.cmd == "clean":
            shutil.rmtree(lab.cache, ignore_errors=True)
        else:
            if a.cmd == "run":
                script = Path(a.script).resolve()
                if not script.is_relative_to(lab.checkout):
                    ap.error(f"{a.script}: the script must live in the checkout {lab.checkout}")
                if os.access(script, os.X_OK):
                    line = shlex.join([str(script), *a.args])
                else:
                    line = shlex.join(["/bin/sh", str(script), *a.args])
            else:
                line = a.line
            res = lab.run(
                line,
                timeout=a.timeout,
                venv=not a.no_venv,
                slow_iops=a.slow_iops,
                slow_bps=a.slow_bps,
                echo_console=a.console,
            )
            if not a.console:
                sys.stdout.write(res.output)
            sys.stdout.flush()
            if res.reason:
                print(f"lab: {res.reason}; console tail ({res.console_path}):", file=sys.stderr)
                print(res.console_tail(), file=sys.stderr)
            print(
                f"lab: exit status {res.status}, guest {res.wall_s:.1f} s, "
                f"total {time.monotonic() - t0:.1f} s, run dir {res.rundir}",
                file=sys.stderr,
            )
            return res.status
    except LabUnavailable as e:
        print(f"lab unavailable: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except LabError as e:
        print(f"lab error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"lab: interrupted ({e or 'SIGINT'}); guest and array stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
