"""The manual's sessions with the daemon are what the command line prints.

A block marked `<!-- replayed: SESSION -->` (docs/operate.md, docs/groups.md,
docs/levels.md) is run: its `$ santhrottle ...` commands, in the page's order, through
the real command line and a real control socket, against SESSION's daemon
(tests/unit/docs_daemon.py: the real Daemon on the unit tests' fakes in virtual time, so
every figure is reproducible), one second of the daemon's time after each; what a
command prints (stdout, then stderr) must be the lines under it, where a line "..."
stands for any lines. A command piped elsewhere (`| jq`) is not run. `top` heads each
view with the daemon's time and sleeps in it (the session "top" is an operate daemon of
its own, so that its seconds move no other example).

SANTHROTTLE_DOCS_WRITE=1 writes what the commands print into the pages instead (the
outputs without a "..." line): how the examples are made, then read and committed.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import time
import types
from pathlib import Path

import pytest

from santhrottle.appliance.cli import daemon as cli_daemon
from santhrottle.appliance.cli.main import main
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.control.server import ControlServer

from . import docs_daemon
from .docs_blocks import PAGES, Command, blocks, commands

SESSIONS = {
    "operate": docs_daemon.operate,
    "groups": docs_daemon.groups,
    "hosts": docs_daemon.hosts,
    "fleet": docs_daemon.fleet,
    "levels": docs_daemon.levels,
    "groups-status": docs_daemon.groups,  # operate.md's status with group overrides
    "top": docs_daemon.operate,  # its own, so that top's seconds move no other example
}
KERNEL = "kernel"  # tests/privileged/test_docs_kernel.py's
WRITE = os.environ.get("SANTHROTTLE_DOCS_WRITE") == "1"


READ = {page: blocks(page) for page in PAGES}  # the blocks as the sessions read them


def _sessions():
    for page in PAGES:
        found: dict[str, list[Command]] = {}
        for b in READ[page]:
            if b.mark is not None:
                found.setdefault(b.mark, []).extend(commands(b))
        for name, cmds in found.items():
            if name != KERNEL:
                yield page, name, cmds


RUNS = list(_sessions())


def matches(want: list[str], got: list[str]) -> bool:
    """got line by line, where a "..." line of want stands for any lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and want[0] == got[0] and matches(want[1:], got[1:])


def run_main(argv: list[str]) -> list[str]:
    """What `santhrottle ARGV` prints, stdout then stderr, as lines."""
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        contextlib.suppress(SystemExit),  # argparse's usage errors and --help
    ):
        main(argv)
    return (out.getvalue() + err.getvalue()).splitlines()


@pytest.fixture
def _terminal(monkeypatch):
    """An 80-column terminal in UTC, as the examples were printed."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_manual_has_sessions_and_every_mark_names_one():
    assert {name for _page, name, _c in RUNS} == set(SESSIONS)
    marks = {b.mark for bs in READ.values() for b in bs if b.mark is not None}
    assert marks == {*SESSIONS, KERNEL}


@pytest.mark.parametrize("page,name,cmds", RUNS, ids=[f"{p.name}:{n}" for p, n, _c in RUNS])
def test_a_session_prints_what_the_manual_shows(page, name, cmds, tmp_path, _terminal, monkeypatch):
    d, advance = SESSIONS[name]()
    # `top` heads each view with the daemon's time and sleeps in it
    monkeypatch.setattr(
        cli_daemon,
        "time",
        types.SimpleNamespace(
            strftime=lambda fmt: time.strftime(fmt, time.gmtime(d.clock())),
            sleep=lambda s: [advance() for _ in range(round(s))],
        ),
    )
    socket = str(tmp_path / "control.sock")
    srv = ControlServer(socket, Commands(d).handle, 0o600)
    srv.start()
    wrong, writes = [], []
    try:
        for c in cmds:
            argv = shlex.split(c.argv)
            if argv[0] != "santhrottle" or "|" in argv:
                continue
            got = run_main([*argv[1:], "--socket", socket])
            if not matches(c.output, got):
                wrong.append(f"{c.block.where(c.offset)}: $ {c.argv}\n" + "\n".join(got))
                if "..." not in c.output:
                    writes.append((c, got))
            advance()
    finally:
        srv.close()
    if WRITE and writes:
        _write(page, writes)
        pytest.skip(f"wrote {len(writes)} outputs into {page.name}: read them and commit")
    assert not wrong, "\n\n".join(wrong)


def _write(page: Path, writes) -> None:
    """Each command's output replaced in the page as it is now (another session may
    have written into it since it was read): its block found by its rank, bottom up."""
    ranks = [b.line for b in READ[page]]
    now = blocks(page)
    lines = page.read_text().split("\n")
    for c, got in sorted(writes, key=lambda w: (-w[0].block.line, -w[0].offset)):
        b = now[ranks.index(c.block.line)]
        (cmd,) = [x for x in commands(b) if x.offset == c.offset]
        start = b.line + cmd.offset + 1  # 0-based index of the first output line
        lines[start : start + len(cmd.output)] = got
    page.write_text("\n".join(lines))


def test_the_control_socket_exchange_is_the_daemons(tmp_path):
    """operate.md's exchange on the control socket ("> " a request, "< " its answer),
    sent on one connection to the operate daemon."""
    import socket

    page = next(p for p in PAGES if p.name == "operate.md")
    (exchange,) = [b for b in READ[page] if b.lines and b.lines[0].startswith("> ")]
    asked = [ln[2:] for ln in exchange.lines if ln.startswith("> ")]
    answered = [ln[2:] for ln in exchange.lines if ln.startswith("< ")]
    assert len(asked) == len(answered) >= 10
    d, _advance = SESSIONS["operate"]()
    path = str(tmp_path / "control.sock")
    srv = ControlServer(path, Commands(d).handle, 0o600)
    srv.start()
    try:
        with socket.socket(socket.AF_UNIX) as s, s.makefile("rw") as f:
            s.connect(path)
            got = []
            for line in asked:
                f.write(line + "\n")
                f.flush()
                got.append(f.readline().rstrip("\n"))
    finally:
        srv.close()
    assert got == answered
