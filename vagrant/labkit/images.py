"""The lab's image builders, on the host: what a guest boots, built once and cached.

What it owns
    Everything `vagrant/qemu/lab.py up` prepares before a boot, each step cached
    under the lab's cache directory (Settings.cache, ~/.cache/santhrottle-lab):

    host packages  the apt packages QEMU, the initramfs and the guest need
                   (the guest's /usr *is* the host's), installed when missing
                   (Apt: `apt-get update` at most once, only when needed);
    kernel         Debian's kernel, the package `linux-image-amd64` depends on
                   (resolved, never hard-coded), `apt-get download`, `dpkg -x`,
                   `depmod -b` with its System.map: kernel/<package>_<version>/;
    initramfs      a static busybox, an init script and the modules it loads,
                   in load order from modules.dep, as a newc cpio (gzip),
                   named by the hash of what went in;
    guest venv     /usr/bin/python3 -m venv --system-site-packages (Debian's
                   python3-rtslib-fb stays visible) with pytest, pyroute2, the
                   product and the lab kit installed editable from the checkout,
                   rebuilt when the pyproject files change; a venv a running
                   guest uses is locked and never pruned under it.

    prepare() runs them all under the cache's lock (concurrent sessions share
    the cache) and returns what a boot needs (labkit.qemu.run).

Public API (the runner's, and any other guest builder's, e.g. a systemd-booted
Debian guest that reuses the kernel and the cache)
    Settings.from_env(**options)         the lab's settings (environment, options)
    Apt(settings).ensure(packages)       install what is missing, or say why not
    kernel(settings, apt) -> Kernel      Debian's kernel, unpacked and depmod'ed
    initramfs(settings, kernel, init=INIT_SCRIPT, modules=INITRAMFS_MODULES) -> Path
    guest_venv(settings) -> Path
    cache_lock(settings)                 the cache's build lock (a context manager)
    module_load_order(moddir, names), cpio_newc(files), elf_is_static(path)
    LabUnavailable (QEMU or the kernel cannot be had: a skip), LabError (any other)

Worked example
    s = Settings.from_env(); k = kernel(s, Apt(s))
    -> Kernel(kv="6.1.0-56-amd64", root=~/.cache/santhrottle-lab/kernel/
       linux-image-6.1.0-56-amd64_6.1.192-2/root, ...); a second call returns the
       cached tree in milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import io
import json
import lzma
import os
import shutil
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from labkit.host import (
    VAGRANT,
    Apt,
    LabError,
    LabUnavailable,
    Settings,
    cache_lock,
    last_line,
    qemu_binary,
    required_packages,
    run_tool,
    sha,
)

__all__ = [  # the public API (module header); Settings, Apt, cache_lock: labkit.host's
    "Apt",
    "Kernel",
    "LabError",
    "LabUnavailable",
    "Prepared",
    "Settings",
    "cache_lock",
    "cpio_newc",
    "elf_is_static",
    "guest_venv",
    "initramfs",
    "kernel",
    "module_load_order",
    "prepare",
]

INIT_SCRIPT = VAGRANT / "qemu" / "initramfs" / "init"

# Modules the lab's initramfs loads (in dependency order, resolved from modules.dep).
INITRAMFS_MODULES = (
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
)

# What the guest's venv gets from PyPI besides the product and the kit.
VENV_REQUIREMENTS = ("pytest>=8", "pyroute2>=0.9,<0.10")
VENVS_KEPT = 3
SYSTEM_PYTHON = Path("/usr/bin/python3")
# The pyproject files whose change rebuilds the guest venv: the product's and the kit's.
PYPROJECTS = ("pyproject.toml", "vagrant/pyproject.toml")


# ------------------------------------------------------------------------ kernel
@dataclass(frozen=True)
class Kernel:
    key: str  # the cache directory's name: <package>_<version>
    kv: str  # the kernel release, 6.1.0-56-amd64
    root: Path  # the unpacked package
    vmlinuz: Path
    modules: Path  # root/lib/modules (holds <kv>/)


def resolve_kernel_package(s: Settings, apt: Apt) -> str:
    if s.kernel_pkg:
        return s.kernel_pkg
    for attempt in (0, 1):
        p = run_tool(["apt-cache", "depends", "linux-image-amd64"], check=False)
        for line in p.stdout.splitlines():
            line = line.strip()
            if line.startswith("Depends:"):
                name = line.split(":", 1)[1].strip().strip("<>")
                if name.startswith("linux-image-"):
                    return name
        if attempt == 0 and os.geteuid() == 0 and s.install:
            apt.update()
    raise LabUnavailable(
        "kernel package unavailable: `apt-cache depends linux-image-amd64` names no "
        "linux-image-* package (no Debian apt source?); set SANTHROTTLE_LAB_KERNEL_DEB"
    )


def _kernel_dirs(s: Settings) -> list[Path]:
    base = s.cache / "kernel"
    if not base.is_dir():
        return []
    return sorted(
        (d for d in base.iterdir() if (d / "ok").is_file()),
        key=lambda d: (d / "ok").stat().st_mtime,
    )


def kernel_info(kdir: Path) -> Kernel:
    kv = json.loads((kdir / "ok").read_text())["kv"]
    root = kdir / "root"
    return Kernel(kdir.name, kv, root, root / "boot" / f"vmlinuz-{kv}", root / "lib" / "modules")


def kernel(s: Settings, apt: Apt) -> Kernel:
    """Fetch, unpack and depmod Debian's kernel (cached); the newest cached one when
    the package cannot be resolved or downloaded (offline)."""
    t0 = time.monotonic()
    if s.kernel_deb:
        deb = Path(s.kernel_deb)
        if not deb.is_file():
            raise LabUnavailable(f"kernel package unavailable: {deb} does not exist")
        key = deb.name[: -len(".deb")] if deb.name.endswith(".deb") else deb.name
        kdir = s.cache / "kernel" / key
        if not (kdir / "ok").is_file():
            unpack_kernel(s, deb, kdir)
        return kernel_info(kdir)

    # Resolve, then download; if the download fails on stale apt lists, update them and
    # resolve again (the metapackage may have moved on).
    for attempt in (0, 1):
        try:
            pkg = resolve_kernel_package(s, apt)
        except LabUnavailable:
            cached = _kernel_dirs(s)
            if cached:
                s.log(f"cannot resolve the kernel package; using cached {cached[-1].name}")
                return kernel_info(cached[-1])
            raise
        version = ""
        p = run_tool(["apt-cache", "show", "--no-all-versions", pkg], check=False)
        for line in p.stdout.splitlines():
            if line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
                break
        key = f"{pkg}_{version}".replace(":", "%3a") if version else pkg
        kdir = s.cache / "kernel" / key
        if (kdir / "ok").is_file():
            return kernel_info(kdir)
        dl = s.cache / "downloads"
        dl.mkdir(parents=True, exist_ok=True)
        for old in dl.glob(f"{pkg}_*.deb"):
            old.unlink()
        s.log(f"apt-get download {pkg} {version}")
        p = run_tool(["apt-get", "download", "-q", pkg], cwd=dl, check=False)
        debs = sorted(dl.glob(f"{pkg}_*.deb"))
        if p.returncode == 0 and debs:
            break
        if attempt == 0 and apt.may_update():
            apt.update()
            continue
        cached = [] if s.kernel_pkg else _kernel_dirs(s)
        if cached:
            s.log(f"download failed ({last_line(p.stdout)}); using cached {cached[-1].name}")
            return kernel_info(cached[-1])
        raise LabUnavailable(
            f"kernel package unavailable: `apt-get download {pkg}` failed: {last_line(p.stdout)}"
        )
    unpack_kernel(s, debs[-1], kdir)
    debs[-1].unlink()  # the unpacked tree is the cache; the .deb is 100 MB more
    for other in _kernel_dirs(s):  # one kernel tree is ~400 MB: keep the current one
        if other != kdir:
            shutil.rmtree(other, ignore_errors=True)
    s.log(f"kernel {kdir.name} ready in {time.monotonic() - t0:.1f} s")
    return kernel_info(kdir)


def unpack_kernel(s: Settings, deb: Path, kdir: Path) -> None:
    for tool in ("dpkg", "depmod"):
        if not shutil.which(tool):
            raise LabError(f"{tool} not found (packages dpkg, kmod)")
    tmp = kdir.with_name(kdir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(kdir, ignore_errors=True)
    root = tmp / "root"
    root.mkdir(parents=True)
    s.log(f"dpkg -x {deb.name}")
    run_tool(["dpkg", "-x", str(deb), str(root)])
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
    run_tool([*cmd, kv])
    if not (root / "boot" / f"vmlinuz-{kv}").is_file():
        raise LabError(f"{deb.name}: no boot/vmlinuz-{kv}")
    (tmp / "ok").write_text(json.dumps({"kv": kv, "deb": deb.name}) + "\n")
    tmp.rename(kdir)


# --------------------------------------------------------------------- initramfs
def busybox() -> Path:
    for cand in ("/bin/busybox", "/usr/bin/busybox"):
        p = Path(cand)
        if p.is_file():
            if not elf_is_static(p):
                raise LabError(f"{p} is not statically linked (install busybox-static)")
            return p
    raise LabError("busybox not found (install busybox-static)")


def initramfs(
    s: Settings,
    k: Kernel,
    init: Path = INIT_SCRIPT,
    modules: tuple[str, ...] = INITRAMFS_MODULES,
) -> Path:
    """A static busybox, `init` and `modules` (with their dependencies, in load order,
    decompressed; /modules.order lists them) as a gzipped newc cpio, cached by the hash
    of its inputs (one per kernel release and flavour: other flavours are kept)."""
    moddir = k.modules / k.kv
    bb_path = busybox()
    init_b, bb = init.read_bytes(), bb_path.read_bytes()
    key = sha(k.key, init_b, bb, " ".join(modules))[:16]
    flavour = "initramfs" if init == INIT_SCRIPT else f"initramfs-{init.stem}"
    out = s.cache / "initramfs" / f"{flavour}-{k.kv}-{key}.cpio.gz"
    if out.is_file():
        return out
    t0 = time.monotonic()
    order = module_load_order(moddir, list(modules))
    files: list[tuple[str, int, bytes]] = []  # (path, mode, data)
    for d in ("bin", "dev", "proc", "sys", "newroot", "modules", "root", "tmp"):
        files.append((d, 0o40755, b""))
    files.append(("bin/busybox", 0o100755, bb))
    files.append(("init", 0o100755, init_b))
    names = []
    for rel in order:
        data = (moddir / rel).read_bytes()
        name = Path(rel).name
        if name.endswith(".xz"):
            data, name = lzma.decompress(data), name[:-3]
        elif name.endswith(".zst"):
            if not shutil.which("zstd"):
                raise LabError(f"{rel} is zstd-compressed and zstd is not installed")
            data = run_tool(["zstd", "-dc", str(moddir / rel)], text=False).stdout
            name = name[:-4]
        elif name.endswith(".gz"):
            data, name = gzip.decompress(data), name[:-3]
        files.append((f"modules/{name}", 0o100644, data))
        names.append(name)
    files.append(("modules.order", 0o100644, ("\n".join(names) + "\n").encode()))
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob(f"{flavour}-*.cpio.gz"):
        old.unlink()
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(gzip.compress(cpio_newc(files), compresslevel=6))
    tmp.rename(out)
    s.log(f"initramfs {out.name} ({len(names)} modules) in {time.monotonic() - t0:.1f} s")
    return out


def elf_is_static(path: Path) -> bool:
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


def _modname(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    for ext in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return base.replace("-", "_")


def module_load_order(moddir: Path, wanted: list[str]) -> list[str]:
    """Paths (relative to moddir) of `wanted` and their dependencies in load order;
    built-in modules are skipped."""
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


def cpio_newc(files: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (path, mode, data) entries, with its trailer."""
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


# -------------------------------------------------------------------- guest venv
def venv_stamp(s: Settings) -> str:
    """What the guest venv is built from: the pyproject files, the requirements, the
    checkout's path and the system python."""
    sys_py = SYSTEM_PYTHON
    if not sys_py.exists():
        raise LabError(f"{sys_py} not found (Debian's python3)")
    projects = [s.checkout / p for p in PYPROJECTS]
    return sha(
        *(p.read_bytes() if p.is_file() else b"" for p in projects),
        " ".join(VENV_REQUIREMENTS),
        str(s.checkout),
        str(sys_py.resolve()),
        str(sys_py.resolve().stat().st_size),
    )


def guest_venv(s: Settings) -> Path:
    """The guest's Python: a /usr/bin/python3 venv with system site packages (Debian's
    python3-rtslib-fb), pytest, pyroute2, the product and the kit installed editable
    from the checkout (the same path in the guest).  Each build gets its own directory,
    named by venv_stamp(), so that a guest still running on the previous one is not
    pulled from under it: a boot holds a shared lock on its venv (venv_in_use), and
    pruning (the newest VENVS_KEPT are kept) skips a venv so held."""
    stamp = venv_stamp(s)
    vdir = s.cache / f"venv-{stamp[:12]}"
    stamp_file = vdir / ".lab-stamp"
    if stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        os.utime(vdir)  # most recently used
        return vdir
    t0 = time.monotonic()
    s.log(f"building the guest venv {vdir}")
    shutil.rmtree(vdir, ignore_errors=True)
    run_tool([str(SYSTEM_PYTHON), "-m", "venv", "--system-site-packages", str(vdir)])
    pip = [str(vdir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    reqs = list(VENV_REQUIREMENTS)
    for project in PYPROJECTS:
        if (s.checkout / project).is_file():
            reqs += ["-e", str((s.checkout / project).parent)]
    p = run_tool([*pip, "install", *reqs], check=False)
    if p.returncode != 0:
        raise LabError(f"pip install into the guest venv failed:\n{p.stdout}")
    stamp_file.write_text(stamp + "\n")
    venvs = sorted(s.cache.glob("venv-*"), key=lambda d: d.stat().st_mtime)
    for old in venvs[:-VENVS_KEPT]:
        _prune_venv(old)
    s.log(f"guest venv ready in {time.monotonic() - t0:.1f} s")
    return vdir


def _prune_venv(vdir: Path) -> None:
    """Remove a venv unless a running guest holds it (venv_in_use)."""
    try:
        with open(vdir / ".in-use", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(vdir, ignore_errors=True)
    except OSError:
        return  # a guest runs on it


@contextlib.contextmanager
def venv_in_use(vdir: Path | None) -> Iterator[None]:
    """Held while a guest runs on vdir: guest_venv() of another session leaves it."""
    if vdir is None:
        yield
        return
    with open(vdir / ".in-use", "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        yield


# ------------------------------------------------------------------------ all of it
@dataclass(frozen=True)
class Prepared:
    """What a boot needs (labkit.qemu.run)."""

    qemu: str
    kernel: Kernel
    initramfs: Path
    venv: Path | None


def check_checkout(s: Settings) -> None:
    """Refuse what could only fail later in the guest."""
    if os.environ.get("SANTHROTTLE_IN_GUEST") == "1":
        raise LabError(
            "lab.py boots guests from the host; this is the lab guest already "
            "(SANTHROTTLE_IN_GUEST=1)"
        )


def prepare(s: Settings, venv: bool = True) -> Prepared:
    """Host packages + kernel + initramfs (+ guest venv): everything a boot needs,
    under the cache's lock (concurrent sessions share the cache)."""
    check_checkout(s)
    if s.qemu:
        qemu_binary(s)  # an explicit override that does not exist: stop here
    with cache_lock(s):
        apt = Apt(s)
        apt.ensure(required_packages(s))
        qemu = qemu_binary(s)
        k = kernel(s, apt)
        initrd = initramfs(s, k)
        vdir = guest_venv(s) if venv else None
    return Prepared(qemu, k, initrd, vdir)
