"""`vagrant/qemu/lab.py`: the lab runner's command line (labkit.images, labkit.qemu).

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
``~/.cache/santhrottle-lab``); the environment variables and options are in
vagrant/qemu/README.md.  Exit statuses of ``run``: the command's own, 124 when
the guest timed out, 125 when the guest ended without reporting a status
(crash, panic), 3 when the lab is unavailable on this machine (QEMU or the
kernel package missing), 1 for any other failure of the lab itself.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from labkit import images, qemu
from labkit.host import CHECKOUT, LabError, LabUnavailable, Settings

EXAMPLES = (
    "examples:\n"
    "  .venv/bin/python vagrant/qemu/lab.py up\n"
    "  .venv/bin/python vagrant/qemu/lab.py sh 'uname -r; lsmod | head'\n"
    "  .venv/bin/python vagrant/qemu/lab.py run -v vagrant/experiments/ipv6_lab.py --out x.json\n"
)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="lab.py",
        description="santhrottle lab runner: Debian's real kernel under QEMU/TCG",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES,
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
        sp.add_argument("--timeout", type=float, default=qemu.DEFAULT_TIMEOUT_S)
        sp.add_argument("-v", "--console", action="store_true", help="echo the serial console")
        sp.add_argument("--no-venv", action="store_true", help="do not build/share the venv")
        sp.add_argument("--slow-iops", type=int, default=qemu.SLOW_IOPS)
        sp.add_argument("--slow-bps", type=int, default=qemu.SLOW_BPS)
        if name == "run":
            sp.add_argument("script", help="executable file (run in the guest at the same path)")
            sp.add_argument("args", nargs=argparse.REMAINDER)
        else:
            sp.add_argument("line", help="shell command line")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    try:
        s = Settings.from_env(
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
    except LabError as e:
        ap.error(str(e))
    # SIGTERM (a CI job's timeout, kill PID) unwinds like ^C: the guest and the array
    # server are stopped, never left running
    signal.signal(signal.SIGTERM, _interrupted)
    t0 = time.monotonic()
    try:
        if a.cmd == "run":
            script = Path(a.script).resolve()
            if not script.is_relative_to(s.checkout):
                ap.error(f"{a.script}: the script must live in the checkout {s.checkout}")
            return _run(a, s, shlex.join(_script_argv(script, a.args)), t0)
        if a.cmd == "sh":
            return _run(a, s, a.line, t0)
        _prepare(a.cmd, s, t0)
    except LabUnavailable as e:
        print(f"lab unavailable: {e}", file=sys.stderr)
        return qemu.EXIT_UNAVAILABLE
    except LabError as e:
        print(f"lab error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"lab: interrupted ({e or 'SIGINT'}); guest and array stopped", file=sys.stderr)
        return 130
    return 0


def _script_argv(script: Path, args: list[str]) -> list[str]:
    """How the guest runs a script of the checkout: a Python file with the guest venv's
    python (it has the product and the kit), an executable as itself, else with sh."""
    if script.suffix == ".py":
        return ["python3", str(script), *args]
    if os.access(script, os.X_OK):
        return [str(script), *args]
    return ["/bin/sh", str(script), *args]


def _prepare(cmd: str, s: Settings, t0: float) -> None:
    if cmd == "deps":
        images.Apt(s).ensure(images.required_packages(s))
        images.qemu_binary(s)
    elif cmd == "kernel":
        k = images.kernel(s, images.Apt(s))
        print(f"{k.kv} {k.root}")
    elif cmd == "initramfs":
        print(images.initramfs(s, images.kernel(s, images.Apt(s))))
    elif cmd == "venv":
        print(images.guest_venv(s))
    elif cmd == "up":
        prep = images.prepare(s)
        print(
            f"lab ready in {time.monotonic() - t0:.1f} s: kernel {prep.kernel.kv}, "
            f"initramfs {prep.initramfs.name}, venv {prep.venv}"
        )
    elif cmd == "clean":
        shutil.rmtree(s.cache, ignore_errors=True)


def _run(a: argparse.Namespace, s: Settings, line: str, t0: float) -> int:
    res = qemu.run(
        s,
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
