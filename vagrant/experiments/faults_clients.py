#!/usr/bin/env python3
"""Many clients of the control socket at once: the fault campaign's CLI burst and connection flood.

What it owns
    Two loads on santhrottled's control socket, each run as a process of its
    own (started by vagrant/experiments/faults_inject.py in the lab guest) so
    that its file descriptors and children end with it; each prints one JSON
    object per line on stdout.

    cli    WAVES waves of PER_WAVE `santhrottle status` calls released at
           once: the real CLI's main() (argument parsing, the request, the
           table, the exit code), each in a process forked from one that
           imported the CLI once, held at a pipe until the whole wave is
           forked.  The interpreter's start is left out on purpose: under
           TCG it costs about 0.6 s of CPU per call, so 1,000 real starts
           would take minutes and measure the emulator, not the socket.
           Failures are counted by exit code, with each failing call's last
           line of stderr.
    flood  N connections opened without sending anything (non-blocking
           connects; EAGAIN, a full listen backlog, is retried until
           OPEN_DEADLINE_S), held HOLD_S, then closed.  Reports how many
           opened, how many EAGAINs, and how many the daemon closed by itself
           while they were held (an idle timeout would).

Worked example
    faults_clients.py cli --socket /run/santhrottle-faults/control.sock --waves 10 --per-wave 100
      -> {"calls": 1000, "by_rc": {"0": 997, "1": 3}, "errors": {"...EAGAIN...": 3}, ...}
    faults_clients.py flood --socket ... --n 5000 --hold 10
      -> {"opened": 5000, ...}  then  {"released_t": ..., "closed_by_daemon": 0, ...}
"""

from __future__ import annotations

import argparse
import collections
import errno
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

WAVE_DEADLINE_S = 120.0
OPEN_DEADLINE_S = 60.0
EXIT_TRACEBACK = 99  # a call that ended in an uncaught exception (not a CLI exit code)


def _child(main, argv: list[str], gate: int, err_path: str) -> None:
    """A forked CLI call: wait at the gate, run main(argv), exit with its code."""
    os.read(gate, 1)  # EOF once the parent closes the write end: the wave starts
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    try:
        rc = main(argv)
        rc = 0 if rc is None else int(rc)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = EXIT_TRACEBACK
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc)


def cli(sock: str, waves: int, per_wave: int) -> dict:
    from santhrottle.appliance.cli.main import main

    gc.collect()
    gc.freeze()  # fewer copy-on-write pages in the children
    tmp = tempfile.mkdtemp(prefix="faults-cli-")
    by_rc: collections.Counter[int] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    wave_s, hung = [], 0
    for w in range(waves):
        gate, release = os.pipe()
        pids: dict[int, str] = {}
        for i in range(per_wave):
            err = f"{tmp}/{w}-{i}.err"
            pid = os.fork()
            if pid == 0:
                os.close(release)
                _child(main, ["status", "--socket", sock], gate, err)
            pids[pid] = err
        os.close(gate)
        t0 = time.monotonic()
        os.close(release)  # every child of the wave reads EOF: all start at once
        while pids and time.monotonic() - t0 < WAVE_DEADLINE_S:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                time.sleep(0.02)
                continue
            rc = os.waitstatus_to_exitcode(status)
            by_rc[rc] += 1
            err = pids.pop(pid)
            if rc != 0:
                text = Path(err).read_text(errors="replace")
                lines = [x for x in text.splitlines() if x.strip()]
                errors[(lines[-1] if lines else "(no stderr)")[:160]] += 1
        for pid in pids:  # still running at the deadline: our own children, by PID
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hung += 1
        wave_s.append(round(time.monotonic() - t0, 2))
    return {
        "calls": waves * per_wave,
        "by_rc": {str(k): v for k, v in sorted(by_rc.items())},
        "failed": sum(v for k, v in by_rc.items() if k != 0) + hung,
        "hung": hung,
        "tracebacks": by_rc.get(EXIT_TRACEBACK, 0),
        "errors": dict(errors.most_common(8)),
        "wave_s": wave_s,
    }


def flood(sock: str, n: int, hold_s: float) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, n + 256))
    conns: list[socket.socket] = []
    eagain, other = 0, collections.Counter()
    t0 = time.monotonic()
    while len(conns) < n and time.monotonic() - t0 < OPEN_DEADLINE_S:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(sock)
            conns.append(s)
        except BlockingIOError:  # the listen backlog is full
            eagain += 1
            s.close()
            time.sleep(0.005)
        except OSError as e:
            other[errno.errorcode.get(e.errno or 0, str(e))] += 1
            s.close()
            time.sleep(0.05)
    t_open = time.monotonic()
    print(
        json.dumps(
            {
                "opened": len(conns),
                "open_s": round(t_open - t0, 2),
                "eagain": eagain,
                "other_errors": dict(other),
                "opened_t": t_open,
            }
        ),
        flush=True,
    )
    time.sleep(hold_s)
    closed = 0
    p = select.poll()
    for s in conns:
        p.register(s, select.POLLIN | select.POLLHUP)
    for fd, _ev in p.poll(0):
        try:
            if os.read(fd, 1) == b"":
                closed += 1
        except OSError:
            closed += 1
    for s in conns:
        s.close()
    print(
        json.dumps(
            {"released_t": time.monotonic(), "held": len(conns), "closed_by_daemon": closed}
        ),
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cli")
    c.add_argument("--socket", required=True)
    c.add_argument("--waves", type=int, default=10)
    c.add_argument("--per-wave", type=int, default=100)
    f = sub.add_parser("flood")
    f.add_argument("--socket", required=True)
    f.add_argument("--n", type=int, default=5000)
    f.add_argument("--hold", type=float, default=10.0)
    a = ap.parse_args()
    if a.what == "cli":
        print(json.dumps(cli(a.socket, a.waves, a.per_wave)), flush=True)
    else:
        flood(a.socket, a.n, a.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
