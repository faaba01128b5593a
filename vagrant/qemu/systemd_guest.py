#!/usr/bin/env python3
"""A lab guest booted with systemd as PID 1: a Debian 12 root file system under QEMU/TCG.

Why
    The lab's own guest (labkit.qemu) shares the host's /usr and runs a script as
    PID 1: right for the data path, but no systemd, no dpkg database, no apt.  The
    Debian package and the Ansible role's systemd path need all three: this guest
    is a real Debian 12 system that boots Debian's kernel (the lab's, labkit.images)
    into systemd, where `apt install ./santhrottle_*.deb` and `systemctl` run as on
    a target.

The image (cached under the lab's cache, systemd-guest/<key>/, like the kernel)
    debootstrap --variant=minbase of the host's Debian suite from the host's own apt
    sources, then, in a chroot: the host's Debian sources (so the guest's packages
    are the host's versions), systemd as init, the tools the tests use
    (ROOT_PACKAGES: ansible-core for the role's tests, python3-pytest, ...), and,
    downloaded but not installed, everything the package and the role will ask apt
    for (CACHED_PACKAGES and the .deb's own Depends and Recommends): in the guest, with
    no network at all, apt resolves `apt install ./santhrottle_*.deb` from the apt
    cache the image carries.  Services that only slow a boot under TCG are masked
    (timers, the serial getty).  lab-run.service (systemd-guest/lab-run) runs the
    host's command once the system is up and powers the guest off.  The tree becomes
    an ext4 image (mke2fs -d, no loop device).  The key is the hash of what went in:
    the code that builds it (image(), _configure()), systemd-guest/'s runner, the
    package lists, the .deb's dependency fields and the host's apt sources; a new key
    builds a new image, the old one is removed.

A boot (run())
    The image read-only under QEMU's snapshot (the run's writes are thrown away: every
    boot starts from the same clean system), the lab's kernel with an initramfs of the
    lab's builder (systemd-guest/systemd-init: virtio, ext4, 9p), the kernel's modules, the
    checkout (read-only, at its own path) and the run's work folder (/shared/work) over
    9p, no network device.  The command's status, output and console come back as the
    lab's RunResult; the limit is stretched by the guest's own measure of its speed
    (labkit.speed, as labkit.qemu does).

A pair of boots (run_pair())
    Two such guests at once, one vCPU each, joined by a link of their own: a
    virtio-net card each, the two QEMU processes' stream netdevs on a unix socket in
    the first run dir (no host interface, no host address); each guest sets its own
    address (10.77.0.1 and .2/24, from pair_env()).  Both share a third 9p folder,
    /shared/pair, for what they tell each other (barriers) and the host.

    python3 vagrant/qemu/systemd_guest.py image --deb dist-deb/santhrottle_0.1.0_amd64.deb
    python3 vagrant/qemu/systemd_guest.py run --deb ... [--timeout S] SCRIPT [ARGS...]
    python3 vagrant/qemu/systemd_guest.py sh --deb ... 'systemctl is-system-running'

Worked example
    s = Settings.from_env(); res = run(s, Path("dist-deb/santhrottle_0.1.0_amd64.deb"),
    "systemctl is-system-running --wait; ps -p 1 -o comm=", timeout=300)
    -> res.status 0, res.output "running\\nsystemd\\n" (about 45 s on an idle host:
       the image is built once, about 6 minutes, then cached)
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from labkit.host import (
    Apt,
    LabError,
    LabUnavailable,
    Settings,
    cache_lock,
    qemu_binary,
    run_tool,
    sha,
)
from labkit.images import Kernel, initramfs, kernel
from labkit.qemu import (  # the lab boot's command line, wait and result
    RunResult,
    _qemu,
    _result,
    boot_command,
    kernel_args,
    new_rundir,
    virtfs,
)

HERE = Path(__file__).resolve().parent
FILES = HERE / "systemd-guest"
INIT = FILES / "systemd-init"
# The initramfs loads these (and what they need): the root's disk and file system (ext4
# asks the crypto API for crc32c, which no modules.dep entry says), 9p.
INIT_MODULES = ("virtio_pci", "virtio_blk", "crc32c_generic", "ext4", "9pnet_virtio", "9p")
# The host needs these to build and boot the guest.
HOST_PACKAGES = ("debootstrap", "e2fsprogs", "dpkg", "busybox-static", "qemu-system-x86")
# Installed in the image: systemd as init, and what the tests run there.
ROOT_PACKAGES = (
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "iproute2",
    "procps",
    "python3",
    "python3-pytest",
    "python3-apt",  # ansible's apt module
    "ansible-core",  # the role's tests run inside (ansible-playbook -c local)
)
# Downloaded into the image's apt cache, not installed: what the role asks apt for
# (its package lists, Debian's, ansible/roles/santhrottle/vars/Debian.yml), besides the
# .deb's own dependencies.
CACHED_PACKAGES = (
    "targetcli-fb",
    "python3-venv",
    "python3-pip",
    "python3-rtslib-fb",
    "nftables",
    "ipset",
    "iptables",
    # the fleet of two (tests/systemd_guest/test_fleet_systemd.py): the etcd role's
    # member, etcdctl, and the client the role installs on a fleet appliance
    "etcd-server",
    "etcd-client",
    "python3-etcd3gw",
)
# Services that do nothing in a throwaway guest but cost seconds of TCG at boot.
MASKED = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "systemd-tmpfiles-clean.timer",
    "serial-getty@ttyS0.service",
    "getty@tty1.service",
    "systemd-timesyncd.service",
    "e2scrub_reap.service",
)
IMAGE_GIB = 4
DEFAULT_TIMEOUT_S = 900
DEFAULT_MEM_MIB = 2048
# A pair's link (run_pair): guest N's card and address.
PAIR_MAC = "52:54:00:77:00:{:02x}"
PAIR_NET = "10.77.0"
SUN_PATH_MAX = 108  # a unix socket's path, with its NUL (sockaddr_un)
LISTEN_WAIT_S = 60  # the first guest's QEMU opens the socket at its start


# ----------------------------------------------------------------- the host's apt
def host_suite() -> str:
    """The host's Debian codename (bookworm)."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    raise LabUnavailable("systemd guest: /etc/os-release names no VERSION_CODENAME")


def debian_sources(suite: str) -> tuple[str, str]:
    """(mirror, sources text): the host's Debian apt sources (deb822 .sources files and
    one-line entries) whose suites are this codename's, and the main mirror among them."""
    stanzas: list[dict[str, str]] = []
    d = Path("/etc/apt/sources.list.d")
    for f in sorted(d.glob("*.sources")) if d.is_dir() else []:
        for block in f.read_text().split("\n\n"):
            fields = dict(
                (k.strip(), v.strip())
                for k, _, v in (line.partition(":") for line in block.splitlines())
                if k and not k.startswith("#") and v
            )
            if fields:
                stanzas.append(fields)
    one_line = Path("/etc/apt/sources.list")
    if one_line.is_file():
        for line in one_line.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)$", line.strip())
            if m:
                stanzas.append({"Types": "deb", "URIs": m[1], "Suites": m[2], "Components": m[3]})
    ours = []
    for st in stanzas:
        suites = st.get("Suites", "").split()
        if "deb" in st.get("Types", "").split() and any(x.startswith(suite) for x in suites):
            ours.append(st)
    mirror = next((st["URIs"].split()[0] for st in ours if suite in st["Suites"].split()), None)
    if not mirror:
        raise LabUnavailable(f"systemd guest: no apt source of the host names suite {suite}")
    text = "\n".join(
        f"Types: deb\nURIs: {st['URIs']}\nSuites: {st['Suites']}\n"
        f"Components: {st.get('Components', 'main')}\n"
        + (f"Signed-By: {st['Signed-By']}\n" if "Signed-By" in st else "")
        for st in ours
    )
    return mirror, text


def deb_dependencies(deb: Path) -> list[str]:
    """The package names of the .deb's Depends and Recommends (first alternatives)."""
    p = run_tool(["dpkg-deb", "-f", str(deb), "Depends", "Recommends"])
    names = []
    for part in re.split(r"[,\n]", re.sub(r"^\w+: ", "", p.stdout, flags=re.M)):
        first = part.split("|")[0].strip()
        if first:
            names.append(re.split(r"[\s(:]", first)[0])
    return sorted(set(names))


# ------------------------------------------------------------------------ the image
def _chroot(root: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "DEBIAN_FRONTEND": "noninteractive",
        "LANG": "C.UTF-8",
        "HOME": "/root",
    }
    return run_tool(["chroot", str(root), *cmd], check=check, env=env)


def image_key(s: Settings, deb: Path) -> tuple[str, list[str], str, str]:
    suite = host_suite()
    mirror, sources = debian_sources(suite)
    deps = deb_dependencies(deb)
    # what the image is made of: the code that builds it (not the rest of this module,
    # so that an edit to the boot does not rebuild it), its lists, the host's sources
    code = inspect.getsource(image) + inspect.getsource(_configure)
    parts = [
        code,
        " ".join(ROOT_PACKAGES),
        " ".join(CACHED_PACKAGES),
        " ".join(deps),
        " ".join(MASKED),
        sources,
        suite,
        str(IMAGE_GIB),
    ]
    parts += [f.read_bytes() for f in sorted(FILES.iterdir()) if f.name != "systemd-init"]
    return sha(*parts)[:16], deps, mirror, sources


def image(s: Settings, apt: Apt, deb: Path) -> Path:
    """The guest's root file system as an ext4 image (cached; built when its key is new)."""
    key, deps, mirror, sources = image_key(s, deb)
    base = s.cache / "systemd-guest"
    img = base / key / "root.img"
    if img.is_file():
        return img
    apt.ensure(HOST_PACKAGES)
    if os.geteuid() != 0:
        raise LabUnavailable("systemd guest: building its image needs root (debootstrap, chroot)")
    t0 = time.monotonic()
    work = base / f"{key}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    root.mkdir(parents=True)
    suite = host_suite()
    s.log(f"systemd guest: debootstrap {suite} from {mirror}")
    run_tool(["debootstrap", "--variant=minbase", "--merged-usr", suite, str(root), mirror])
    (root / "etc/apt/sources.list").write_text("")
    (root / "etc/apt/sources.list.d/debian.sources").write_text(sources)
    for keyring in Path("/usr/share/keyrings").glob("debian-archive-*.gpg"):
        dest = root / keyring.relative_to("/")
        if not dest.exists():
            shutil.copy2(keyring, dest)
    # no service may start inside the chroot while packages install
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    _chroot(root, "apt-get", "update", "-q")
    _chroot(root, "apt-get", "dist-upgrade", "-y", "-q")
    s.log(f"systemd guest: apt-get install {' '.join(ROOT_PACKAGES)}")
    _chroot(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", *ROOT_PACKAGES)
    cached = sorted(set(CACHED_PACKAGES) | set(deps))
    s.log(f"systemd guest: apt-get install --download-only {' '.join(cached)}")
    _chroot(root, "apt-get", "install", "-y", "-q", "--download-only", *cached)
    policy.unlink()
    _configure(root)
    img.parent.mkdir(parents=True, exist_ok=True)
    tmp = img.with_suffix(".tmp")
    run_tool(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "root", "-d", str(root), str(tmp),
              f"{IMAGE_GIB}G"])  # fmt: skip
    tmp.rename(img)
    shutil.rmtree(work, ignore_errors=True)
    for old in base.iterdir():  # one image is ~1 GB: keep the current one
        if old.is_dir() and old.name != key and not old.name.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)
    s.log(f"systemd guest: image {img} in {time.monotonic() - t0:.0f} s")
    return img


def _configure(root: Path) -> None:
    """The guest's identity, its runner, and no waiting for what it does not have."""
    (root / "etc/hostname").write_text("systemd-guest\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n127.0.1.1 systemd-guest\n")
    (root / "etc/fstab").write_text("# the root and the shares are mounted by the initramfs\n")
    (root / "etc/machine-id").write_text("")  # systemd makes one at each boot
    runner = root / "usr/local/sbin/lab-run"
    runner.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(FILES / "lab-run", runner)
    runner.chmod(0o755)
    unit = root / "etc/systemd/system/lab-run.service"
    shutil.copy2(FILES / "lab-run.service", unit)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "lab-run.service").symlink_to("/etc/systemd/system/lab-run.service")
    for name in MASKED:
        link = root / "etc/systemd/system" / name
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    journald = root / "etc/systemd/journald.conf.d/lab.conf"
    journald.parent.mkdir(parents=True, exist_ok=True)
    journald.write_text("[Journal]\nStorage=volatile\nForwardToConsole=no\n")


# --------------------------------------------------------------------------- a boot
def prepare(s: Settings, deb: Path) -> tuple[str, Kernel, Path, Path]:
    """(qemu, kernel, initramfs, image): everything a boot needs, under the cache's lock."""
    if not deb.is_file():
        raise LabError(f"systemd guest: {deb} is not a file (make deb)")
    with cache_lock(s):
        apt = Apt(s)
        apt.ensure(HOST_PACKAGES)
        qemu = qemu_binary(s)
        k = kernel(s, apt)
        initrd = initramfs(s, k, init=INIT, modules=INIT_MODULES)
        img = image(s, apt, deb)
    return qemu, k, initrd, img


def qemu_command(
    s: Settings,
    qemu: str,
    k: Kernel,
    initrd: Path,
    img: Path,
    rundir: Path,
    mem_mib: int,
    pair: Path | None = None,
    link: Sequence[str] = (),
) -> list[str]:
    """The boot's QEMU command line; a guest of a pair (run_pair) also shares ``pair``
    (mounted at /shared/pair: systemd-init sees lab_pair=1) and has the ``link`` card."""
    append = kernel_args(s, "systemd.show_status=false", *(["lab_pair=1"] if pair else []))
    return [
        *boot_command(qemu, s.smp, mem_mib, rundir, k.vmlinuz, initrd, append),
        *link,
        *(virtfs(pair, "pair", False) if pair else []),
        # the image stays as built: the run's writes go to QEMU's temporary snapshot
        "-drive",
        f"file={img},format=raw,if=none,id=root,snapshot=on,cache=unsafe",
        "-device",
        "virtio-blk-pci,drive=root",
        *virtfs(k.modules, "kmods", True),
        *virtfs(rundir / "work", "work", False),
        *virtfs(s.checkout, "checkout", True),
    ]


def run(
    s: Settings,
    deb: Path,
    command: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    echo_console: bool = False,
    mem_mib: int = DEFAULT_MEM_MIB,
) -> RunResult:
    """Boot the systemd guest, run ``command`` (a /bin/sh script text) as root once the
    system is up, power off.  Never raises for guest-side failures: see RunResult."""
    _check_paths(s)
    qemu, k, initrd, img = prepare(s, deb)
    rundir, lock = new_rundir(s)
    try:
        _write_work(s, rundir, deb, command, env)
        cmd = qemu_command(s, qemu, k, initrd, img, rundir, mem_mib)
        (rundir / "qemu.cmd").write_text(shlex.join(map(str, cmd)) + "\n")
        t0 = time.monotonic()
        code, limit = _qemu(cmd, rundir, timeout, echo_console)
        return _result(rundir, code, limit, time.monotonic() - t0)
    finally:
        lock.close()


def _check_paths(s: Settings) -> None:
    for path in (s.checkout, s.cache):
        if any(c.isspace() or c == "," for c in str(path)):
            raise LabError(f"paths with white space or commas are not supported: {path!r}")


def _write_work(
    s: Settings, rundir: Path, deb: Path, command: str, env: dict[str, str] | None
) -> None:
    """The run's work folder (/shared/work): the command and its environment."""
    work = rundir / "work"
    work.mkdir(parents=True)
    (work / "cmd").write_text(command if command.endswith("\n") else command + "\n")
    genv = {
        "SANTHROTTLE_LAB_CHECKOUT": str(s.checkout),
        "SANTHROTTLE_DEB": str(deb),
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    (work / "env").write_text("".join(f"{k_}={shlex.quote(v)}\n" for k_, v in genv.items()))


# ------------------------------------------------------------------- a pair of boots
def link_args(sock: Path, listen: bool, mac: str) -> list[str]:
    """A virtio-net card joined to the other guest's through QEMU's stream netdev on the
    unix socket ``sock`` (the first guest listens, the second connects): the two guests'
    frames pass between the two QEMU processes only, on no host interface or address."""
    if len(str(sock)) >= SUN_PATH_MAX:
        raise LabError(f"the pair's link socket path is too long for a unix socket: {sock}")
    mode = "on" if listen else "off"
    return [
        "-netdev",
        f"stream,id=link,server={mode},addr.type=unix,addr.path={sock}",
        "-device",
        f"virtio-net-pci,netdev=link,mac={mac}",
    ]


def pair_env(index: int) -> dict[str, str]:
    """What guest ``index`` (0 or 1) of a pair is told: its number (1, 2), its card's MAC,
    its address and prefix on the link, and the other guest's address."""
    me, other = index + 1, 2 - index
    return {
        "SANTHROTTLE_PAIR_INDEX": str(me),
        "SANTHROTTLE_PAIR_MAC": PAIR_MAC.format(me),
        "SANTHROTTLE_PAIR_ADDRESS": f"{PAIR_NET}.{me}/24",
        "SANTHROTTLE_PAIR_PEER": f"{PAIR_NET}.{other}",
    }


@dataclass
class PairResult:
    """The two boots' results (guest 1 first) and the folder both shared (/shared/pair)."""

    runs: tuple[RunResult, RunResult]
    pair: Path


def run_pair(
    s: Settings,
    deb: Path,
    commands: tuple[str, str],
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    mem_mib: int = DEFAULT_MEM_MIB,
) -> PairResult:
    """Boot two systemd guests at once, each with one vCPU (each takes a host core), joined
    by a link of their own (link_args; guest N at 10.77.0.N/24 once its command sets the
    address: pair_env says which) and sharing a folder (/shared/pair: the first run dir's
    pair/) for what they tell each other and the host; each runs its command as run()
    does.  Each guest's limit is ``timeout`` stretched by its own measured speed."""
    _check_paths(s)
    qemu, k, initrd, img = prepare(s, deb)
    one = replace(s, smp=1)
    held = [new_rundir(s) for _ in commands]
    rundirs = [d for d, _ in held]
    try:
        pair = rundirs[0] / "pair"
        pair.mkdir()
        sock = rundirs[0] / "link.sock"
        cmds = []
        for i, (rundir, command) in enumerate(zip(rundirs, commands, strict=True)):
            _write_work(s, rundir, deb, command, {**(env or {}), **pair_env(i)})
            link = link_args(sock, i == 0, PAIR_MAC.format(i + 1))
            cmd = qemu_command(one, qemu, k, initrd, img, rundir, mem_mib, pair, link)
            (rundir / "qemu.cmd").write_text(shlex.join(map(str, cmd)) + "\n")
            cmds.append(cmd)
        got: list[tuple[int | None, float, float]] = [(None, timeout, 0.0)] * 2
        failed: list[BaseException] = []

        def boot(i: int) -> None:
            t0 = time.monotonic()
            try:
                code, limit = _qemu(cmds[i], rundirs[i], timeout, False)
            except BaseException as e:  # raised again below, in the caller's thread
                failed.append(e)
                return
            got[i] = (code, limit, time.monotonic() - t0)

        first = threading.Thread(target=boot, args=(0,), daemon=True)
        first.start()
        t0 = time.monotonic()  # the second connects once the first listens
        while not sock.exists() and first.is_alive() and time.monotonic() - t0 < LISTEN_WAIT_S:
            time.sleep(0.1)
        second = threading.Thread(target=boot, args=(1,), daemon=True)
        second.start()
        first.join()
        second.join()
        if failed:
            raise failed[0]
        a, b = (_result(d, *g) for d, g in zip(rundirs, got, strict=True))
        return PairResult((a, b), pair)
    finally:
        for _, lock in held:
            lock.close()


# ------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="systemd_guest.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--deb", type=Path, required=True, help="the package (make deb)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("image", help="build (or find) the guest's image")
    for name in ("run", "sh"):
        sp = sub.add_parser(name)
        sp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
        sp.add_argument("-v", "--console", action="store_true", help="echo the serial console")
        if name == "run":
            sp.add_argument("script")
            sp.add_argument("args", nargs=argparse.REMAINDER)
        else:
            sp.add_argument("line")
    a = ap.parse_args(argv)
    s = Settings.from_env()
    deb = a.deb.resolve()
    try:
        if a.cmd == "image":
            print(prepare(s, deb)[3])
            return 0
        if a.cmd == "run":
            script = Path(a.script).resolve()
            if not script.is_relative_to(s.checkout):
                ap.error(f"{a.script}: the script must live in the checkout {s.checkout}")
            run_it = ["python3", str(script)] if script.suffix == ".py" else [str(script)]
            line = shlex.join([*run_it, *a.args])
        else:
            line = a.line
        res = run(s, deb, line, timeout=a.timeout, echo_console=a.console)
    except LabUnavailable as e:
        print(f"systemd guest unavailable: {e}", file=sys.stderr)
        return 3
    except LabError as e:
        print(f"systemd guest error: {e}", file=sys.stderr)
        return 1
    if not a.console:
        sys.stdout.write(res.output)
    if res.reason:
        print(f"systemd guest: {res.reason}; console tail ({res.console_path}):", file=sys.stderr)
        print(res.console_tail(), file=sys.stderr)
    print(
        f"systemd guest: exit status {res.status}, {res.wall_s:.1f} s, run dir {res.rundir}",
        file=sys.stderr,
    )
    return res.status


if __name__ == "__main__":
    sys.exit(main())
