"""`santhrottle cleanup [--delays-only]`: the way out that cannot fail for want of a config.

What it owns
    cmd_cleanup: the unit's ExecStopPost (`cleanup --delays-only`) after a
    crash, and the admin's full removal.  santhrottle's kernel objects are
    found by their names (the santhrottle-* sets, the SANTHROTTLE chain,
    the root qdiscs with santhrottle's handle), so the configuration is
    needed only for one fact: which network namespace.  That comes from
    --netns, else the file; a file that does not load still names it when
    its `netns = "..."` line can be read; when nothing names it, every
    namespace (the initial one and each under /run/netns) is cleaned.
    An invalid file is reported (one line on stderr), never a reason to
    leave a delay: the exit status is 0 once the delays are gone.

    A daemon that answers on its control socket owns the kernel state: a
    cleanup under it would leave it reporting pins nobody applies (it repairs
    what it finds missing, core/drift.py, so the cleanup would not even last).
    The cleanup refuses then (exit 1, one line), unless --force: the daemon is
    stopped first (SIGTERM to the process the socket's peer credentials name,
    what `systemctl stop` sends; it removes its delays on the way out), then
    the cleanup runs.  The socket is --socket, else the file's
    daemon.control_socket, else the default one; and the socket of every other
    santhrottled running on this host (/proc: its command line, the Unix
    socket it listens on) whose namespace (its --config's daemon.netns) is
    one this cleanup would clean, or, when this cleanup cleans every one, any
    santhrottled: a typo in --config, or a daemon started with a file of its
    own, is still seen.
    After a crash nobody listens on the socket any more: the unit's
    ExecStopPost runs as before, and a daemon of another namespace is left be.

Worked example
    The daemon was killed and the file since edited into an invalid one
    (`ports = [3260, 3260]`) with `netns = "tgt"`: `santhrottle cleanup
    --delays-only` prints "santhrottle: /etc/...: datapath.ports: port 3260
    given twice; cleaning up in netns tgt, as the file names it" on stderr,
    empties the sets in tgt, removes the jumps, and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from santhrottle.appliance.cli.common import Failed, emit
from santhrottle.appliance.config import DEFAULT_PATH, ConfigError, defaults, load_config
from santhrottle.appliance.config.parse import MAX_CONFIG_BYTES
from santhrottle.appliance.daemon.control import (
    DaemonUnavailable,
    RemoteError,
    request,
    socket_in_use,
)
from santhrottle.appliance.textfile import read_text_file

# `netns = "tgt"` as written in a file that may not parse as a whole.
_NETNS_LINE = re.compile(r'^\s*netns\s*=\s*"([A-Za-z0-9][A-Za-z0-9_.+-]*)"\s*(?:#.*)?$', re.M)
NETNS_DIR = "/run/netns"
# Removing the delays in order: how often the glide leaves are settled, and the
# time allowed beyond twice the largest delay before the rest leave unordered.
SETTLE_EVERY_S = 0.02
SETTLE_MARGIN_S = 0.2
EVERY = object()  # no namespace is named: clean them all
# --force: how long a daemon has to stop (seconds: 5 s in a lab guest nine times slower
# than the reference), how often it is asked.
STOP_WAIT_S = 30.0
STOP_POLL_S = 0.1
CONNECT_TIMEOUT_S = 2.0
UCRED = struct.Struct("3i")  # pid, uid, gid (SO_PEERCRED)
UNIX_LISTENING = 0x10000  # __SO_ACCEPTCON in /proc/PID/net/unix's Flags


def cleanup_namespaces(args: argparse.Namespace) -> tuple[list[str | None], str | None]:
    """The namespaces to clean (None: the initial one) and a warning line."""
    if args.netns:
        return [str(args.netns)], None
    if not os.path.exists(args.config):
        return [None], None
    try:
        return [load_config(args.config).netns], None
    except ConfigError as e:
        named = _netns_named_in(Path(args.config))
        if named is EVERY:
            every = [None, *sorted(_named_namespaces())]
            return every, f"{e}; cleaning up in every network namespace"
        where = f"netns {named}" if named else "the initial network namespace"
        return [named if isinstance(named, str) else None], (
            f"{e}; cleaning up in {where}, as the file names it"
        )


def _netns_named_in(path: Path) -> str | object | None:
    try:
        text = read_text_file(path, MAX_CONFIG_BYTES, ConfigError)
    except ConfigError:
        return EVERY
    found = set(_NETNS_LINE.findall(text))
    if len(found) > 1:
        return EVERY
    if found:
        return found.pop()
    return None if "netns" not in text else EVERY


def _named_namespaces() -> list[str]:
    try:
        return [p.name for p in Path(NETNS_DIR).iterdir()]
    except OSError:
        return []


def remove_delays(d: Any, clock: Any = time.monotonic, sleep: Any = time.sleep) -> None:
    """Every member to class 0, in order: through the glide leaves, as the daemon
    lowers a delay, settled for up to about twice the largest delay; what is still
    in a leaf then (its delay already 0, or no free leaf) leaves unordered."""
    members = d.current()
    if not members:
        return
    d.set_classes(dict.fromkeys(members, 0))
    deadline = clock() + 2 * d.spec.max_delay_us / 1e6 + SETTLE_MARGIN_S
    while clock() < deadline and d.current():
        sleep(SETTLE_EVERY_S)
        d.advance_glides()
    left = d.current()
    if left:  # class 0 takes a member out of whichever set holds it
        d.set_classes(dict.fromkeys(left, 0), ordered=False)


def _installed(dp: Any, netns: str | None) -> Any:
    """The data path as installed (its classes and glide leaves: an ordered removal
    needs them); santhrottle's names alone when no tree is there."""
    try:
        return dp.discover(netns)
    except dp.NotApplied:
        return dp.Datapath(dp.DatapathSpec(), netns=netns)


def control_sockets(
    args: argparse.Namespace, namespaces: list[str | None] | None = None, every: bool = False
) -> list[str]:
    """Where a daemon that owns one of the namespaces may answer: --socket, else the
    file's and the default one, and those of the santhrottled processes running in
    one of them (daemon_processes(); one whose file does not load, in none of them
    unless the cleanup cleans `every` namespace)."""
    if args.socket:
        return [str(args.socket)]
    out = [defaults().control_socket]
    with contextlib.suppress(ConfigError):  # reported by cleanup_namespaces; the default stays
        out.insert(0, load_config(args.config).control_socket)
    for pid, config in daemon_processes():
        try:
            theirs: str | object | None = load_config(config).netns
        except ConfigError:
            theirs = EVERY  # its namespace is not known
        if namespaces is None or (every if theirs is EVERY else theirs in namespaces):
            out += listening_sockets(pid)
    return list(dict.fromkeys(out))


def daemon_processes(proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, its --config) of each santhrottled running on this host (its command
    line: `santhrottled ...`, the console script under a python, or `python -m
    santhrottle.appliance.daemon.main`; not --check, --version, --help)."""
    out = []
    for p in proc.iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (p / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        rest = _daemon_args(argv)
        if rest is None or {"--check", "--version", "-h", "--help"} & set(rest):
            continue
        config = DEFAULT_PATH
        for i, a in enumerate(rest):
            if a == "--config" and i + 1 < len(rest):
                config = rest[i + 1]
            elif a.startswith("--config="):
                config = a.split("=", 1)[1]
        if not os.path.isabs(config):
            with contextlib.suppress(OSError):
                config = os.path.join(os.readlink(p / "cwd"), config)
        out.append((int(p.name), config))
    return out


def _daemon_args(argv: list[str]) -> list[str] | None:
    """santhrottled's arguments in a command line, or None when it is not one."""
    prog = os.path.basename(argv[0])
    if prog == "santhrottled":
        return argv[1:]
    if not prog.startswith("python"):
        return None
    if len(argv) > 1 and os.path.basename(argv[1]) == "santhrottled":  # the console script
        return argv[2:]
    if "-m" in argv:
        i = argv.index("-m")
        if argv[i + 1 : i + 2] == ["santhrottle.appliance.daemon.main"]:
            return argv[i + 2 :]
    return None


def listening_sockets(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """The paths of the Unix stream sockets process pid listens on."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in (proc / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    out = []
    with contextlib.suppress(OSError):
        for line in (proc / str(pid) / "net" / "unix").read_text().splitlines()[1:]:
            f = line.split()  # Num RefCount Protocol Flags Type St Inode Path
            listening = len(f) >= 8 and f[6] in inodes and int(f[3], 16) & UNIX_LISTENING
            if listening and f[7].startswith("/"):
                out.append(f[7])
    return out


def stop_daemon(path: str, wait_s: float = STOP_WAIT_S) -> int:
    """SIGTERM to the daemon that answers on path (its pid from SO_PEERCRED), then
    wait until nobody answers there: its pid; Failed when it cannot be stopped."""
    pid = peer_pid(path)
    if pid is None:
        raise Failed(f"santhrottled answers on {path}, but its pid cannot be read: stop it first")
    why_not = not_santhrottled(path, pid)
    if why_not is not None:  # --socket naming another program's socket: never signal it
        raise Failed(f"{path}: {why_not}; nothing stopped, nothing cleaned up")
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as e:
        raise Failed(f"cannot stop santhrottled (pid {pid}): {e.strerror or e}") from None
    deadline = time.monotonic() + wait_s
    while socket_in_use(path):
        if time.monotonic() > deadline:
            raise Failed(f"santhrottled (pid {pid}) did not stop within {wait_s:g} s")
        time.sleep(STOP_POLL_S)
    print(f"stopped santhrottled (pid {pid}) on {path}", file=sys.stderr)
    return pid


def not_santhrottled(path: str, pid: int) -> str | None:
    """Why the process on path is not a santhrottled to stop (None: it is one): it
    answers the control protocol's ping (any version: an older daemon says which it
    speaks) and its command line is santhrottle's."""
    try:
        request(path, "ping", timeout_s=CONNECT_TIMEOUT_S)
    except RemoteError as e:
        if "speaks" not in str(e):  # a daemon of another protocol is one still
            return f"pid {pid} refused a ping: {e}"
    except DaemonUnavailable as e:
        return f"pid {pid} does not answer as santhrottled ({e})"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid} is gone"
    if b"santhrottle" not in cmdline:
        program = cmdline.split(b"\0")[0].decode(errors="replace")
        return f"pid {pid} is not santhrottled ({program})"
    return None


def peer_pid(path: str) -> int | None:
    """The pid of the process listening on a Unix socket (its peer credentials)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect(path)
            pid, _uid, _gid = UCRED.unpack(
                s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
            )
        except OSError:
            return None
    return pid if pid > 0 else None


def cmd_cleanup(args: argparse.Namespace) -> int:
    from santhrottle.appliance import datapath as dp

    stopped: list[dict[str, Any]] = []
    namespaces, warning = cleanup_namespaces(args)
    every = len(namespaces) > 1  # no file named one: each is cleaned
    for path in control_sockets(args, namespaces, every):
        if not socket_in_use(path):
            continue
        if not args.force:
            raise Failed(
                f"santhrottled answers on {path} and owns the data path: stop it first "
                "(systemctl stop santhrottled; it removes its delays), or --force"
            )
        stopped.append({"socket": path, "pid": stop_daemon(path)})
    if warning:
        print(f"santhrottle: {warning}", file=sys.stderr)
    done: list[dict[str, Any]] = []
    lines: list[str] = []
    failed: list[str] = []
    for netns in namespaces:
        where = f" (netns {netns})" if netns else ""
        try:
            if args.delays_only:
                with _installed(dp, netns) as d:
                    remove_delays(d)
                    d.mangle.set_jumps((), active=False)  # also what a crash left with no member
                done.append({"netns": netns, "delays_removed": True})
                lines.append(
                    f"no initiator is delayed any more{where}; the tc tree, sets and chain stay"
                )
            else:
                with dp.Datapath(dp.DatapathSpec(), netns=netns) as d:
                    rep = d.cleanup()
                done.append({"netns": netns, "removed": dataclasses.asdict(rep)})
                lines.append(rep.summary() + where)
        except dp.DatapathError as e:
            failed.append(f"{e}{where}")
            done.append({"netns": netns, "error": str(e)})
    data = {
        "delays_only": args.delays_only,
        "stopped": stopped,
        "warning": warning,
        "namespaces": done,
    }
    emit(args, data, lambda _d: print("\n".join(lines)) if lines else None)
    if failed:
        raise Failed("; ".join(failed))
    return 0
