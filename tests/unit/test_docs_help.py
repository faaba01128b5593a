"""Every `--help` and every usage the manual quotes is what the real parsers print
(santhrottle's, santhrottled's and santhrottle-simulate's, on an 80-column terminal):
a `$ santhrottle ... --help` block is the whole help, a quoted `usage: ...` its usage
lines (a "..." line after them stands for the rest)."""

from __future__ import annotations

import argparse
import re

import pytest

from santhrottle.appliance.cli.main import build_parser as cli_parser
from santhrottle.appliance.daemon.main import build_parser as daemon_parser
from santhrottle.sim.cli import build_parser as sim_parser

from .docs_blocks import PAGES, ROOT, Block, blocks, commands

COLUMNS = "80"  # the terminal the manual's help is quoted from


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """prog ("santhrottle threshold set") -> its parser."""
    out = {}

    def walk(p: argparse.ArgumentParser) -> None:
        out[p.prog] = p
        for a in p._actions:  # argparse keeps its subparsers here; no public accessor
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    walk(sub)

    walk(cli_parser())
    walk(daemon_parser())
    walk(sim_parser())
    return out


def _parser_of(usage_line: str, parsers) -> argparse.ArgumentParser:
    rest = usage_line.removeprefix("usage: ")
    found = [p for prog, p in parsers.items() if rest == prog or rest.startswith(prog + " ")]
    assert found, f"no parser prints {usage_line!r}"
    return max(found, key=lambda p: len(p.prog))


def _quotes():
    """(block, index of a `usage:` line) of every usage the manual quotes."""
    for page in PAGES:
        for b in blocks(page):
            for k, line in enumerate(b.lines):
                if line.startswith(
                    ("usage: santhrottle ", "usage: santhrottled ", "usage: santhrottle-simulate ")
                ):
                    yield b, k


QUOTES = list(_quotes())


@pytest.fixture(autouse=True)
def _columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", COLUMNS)


def _help_command(b: Block, k: int):
    """The `$ ... --help` command whose output line k is, if any."""
    for c in commands(b):
        if c.offset < k <= c.offset + len(c.output):
            words = c.argv.split()
            if "--help" in words or "-h" in words:
                return c
    return None


@pytest.mark.parametrize("b,k", QUOTES, ids=[b.where(k) for b, k in QUOTES])
def test_a_quoted_help_or_usage_is_the_parsers(b: Block, k: int):
    parsers = _parsers()
    p = _parser_of(b.lines[k], parsers)
    c = _help_command(b, k)
    if c is not None and c.offset + 1 == k:  # the whole help, as printed
        real = p.format_help().rstrip("\n").split("\n")
        assert c.output == real, "\n".join(real)
        return
    quoted = [b.lines[k]]
    for line in b.lines[k + 1 :]:
        if not line.startswith(" "):
            break
        quoted.append(line)
    real = p.format_usage().rstrip("\n").split("\n")
    following = b.lines[k + len(quoted)] if k + len(quoted) < len(b.lines) else ""
    if following == "...":  # the rest elided
        assert quoted == real[: len(quoted)], "\n".join(real)
    else:
        assert quoted == real, "\n".join(real)


def test_the_manual_quotes_the_usage_of_every_verb():
    """operate.md quotes each verb's usage, santhrottle(8) prints the rest."""
    quoted = {_parser_of(b.lines[k], _parsers()).prog for b, k in QUOTES}
    leaves = _leaves()
    assert leaves <= quoted, sorted(leaves - quoted)


def _leaves() -> set[str]:
    """The progs of santhrottle's leaf verbs ("santhrottle group set", ...)."""
    return {
        prog
        for prog, p in _parsers().items()
        if prog.startswith("santhrottle ")
        and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    }


def test_operates_table_of_commands_has_every_verb():
    """operate.md's table of the commands (which need the daemon, which need root)
    names every leaf verb."""
    text = (ROOT / "docs" / "operate.md").read_text()
    start = text.index("| group | commands |")
    rows = text[start : text.index("\n\n", start)]
    named = set(re.findall(r"`([a-z][a-z ]*[a-z])", rows))
    leaves = {prog.removeprefix("santhrottle ") for prog in _leaves()}
    assert leaves <= named, sorted(leaves - named)


def test_the_control_sockets_table_has_every_command():
    """operate.md's table of the control socket's requests is the daemon's list."""
    from santhrottle.appliance.daemon.control.requests import COMMANDS

    text = (ROOT / "docs" / "operate.md").read_text()
    start = text.index("| `cmd` | `args` | `data` |")
    rows = text[start : text.index("\n\n", start)].splitlines()[2:]
    named = {n for row in rows for n in re.findall(r"`([a-z_]+)`", row.split(" | ")[0])}
    assert named == set(COMMANDS)
