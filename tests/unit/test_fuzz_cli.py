"""The CLI corpus (issue 17): every verb of build_parser(), found by walking its
subparsers (a new verb is covered without touching this file), gets a corpus of bad
values for each of its options and positionals, through main(argv) in-process.

Asserted for every invocation: no exception escapes main() but argparse's
SystemExit, whose code is 2 and whose last stderr line is "santhrottle ...: error:
..."; otherwise the exit code is 0, 1, 2 or 3 and a failure's stderr is exactly one
line starting with "santhrottle: ".  Nothing reaches a daemon or the kernel: the
control socket is a path in tmp_path that does not exist (the configuration's
default socket too), the data path package's Datapath and discover are stubs that
refuse (as a kernel without the data path would: DatapathError, exit 1), and
resources/initiators read the captured lab trees of tests/fixtures/lab.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance import datapath as dp
from santhrottle.appliance.cli import daemon as cli_daemon
from santhrottle.appliance.cli import datapath as cli_datapath
from santhrottle.appliance.cli import main as cli_main
from santhrottle.appliance.cli.common import number
from santhrottle.appliance.cli.main import build_parser, main
from santhrottle.sim import cli as sim_cli

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
PAPER = Path(__file__).parents[2] / "sim" / "scenarios" / "paper.toml"
ARGPARSE_ERROR = re.compile(r"^santhrottle(-simulate)?( [\w-]+)*: error: .+")
# `santhrottle simulate ARGS` runs santhrottle-simulate ARGS (a child process): the corpus
# goes to the simulator's own parser and main(), in this process.
SIMULATE = ("simulate",)


def leaves(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable verb (a parser without subcommands) and its path."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, p)]
    out = []
    for action in subs:
        for name, sub in action.choices.items():
            out += leaves(sub, (*path, name))
    return out


VERBS = [(p, s) for p, s in leaves(build_parser()) if p != SIMULATE]
VERBS.append((SIMULATE, sim_cli.build_parser()))


def corpus(tmp: Path) -> list[str]:
    """Bad values: empty, not finite, negative, huge, 5000 digits, Unicode digits, hex,
    blank, control characters, a directory, /dev/zero and a FIFO where a file is
    expected, a missing file, a surrogate (undecodable argv byte)."""
    fifo = tmp / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    return [
        "",
        "nan",
        "inf",
        "-1",
        "1e308",
        "9" * 5000,
        "9" * 400 + "ms",
        "١٢",
        "１２",
        "١٢ms",
        "0x10",
        " ",
        "\x01\x1b[2J\x7f",
        "a\nb",
        "\x00",
        "\udcff",
        str(tmp),
        "/dev/zero",
        str(fifo),
        str(tmp / "missing.toml"),
    ]


def baseline(path: tuple[str, ...], tmp: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Valid values for what a verb requires, and for the options that would otherwise
    reach the host: (options, positionals by dest)."""
    opts: dict[str, str] = {
        "--socket": str(tmp / "none.sock"),
        "--config": str(tmp / "none.toml"),
        "--timeout": "0.5",
        "--interval": "0.001",
        "--proc-root": str(tmp / "proc"),
        "--sys-root": str(LAB / "sys"),
        "--configfs-root": str(LAB / "configfs"),
        "--netns": "st-fuzz-none",
    }
    pos: dict[str, list[str]] = {
        "initiator": ["10.0.0.3"],
        "resource": ["vg0"],
        "group": ["db"],
        "operands": ["vg0", "15ms"],
        "scenario": [str(PAPER)],
        "interval": ["0.01"],
        "count": ["1"],
    }
    if path in (("pin",), ("unpin",)):  # no daemon: straight to the (stub) kernel
        del opts["--socket"]
    if path == ("pin",):
        opts["--delay"] = "5ms"
    if path[0] == "datapath":
        opts["--device"] = "st-fuzz0"
    return opts, pos


def argv_for(
    path: tuple[str, ...],
    parser: argparse.ArgumentParser,
    tmp: Path,
    fuzz: argparse.Action,
    value: str | None,
    index: int = 0,
) -> list[str]:
    """The verb's argv with `fuzz` given `value` (None: the option without its value;
    index: which of a positional's values) and every other option or positional the
    verb has at its baseline.  Fuzzing --config leaves --socket out (the socket's path
    is then read from the configuration)."""
    opts, pos = baseline(path, tmp)
    if "--config" in fuzz.option_strings:
        opts.pop("--socket", None)
    argv = [*path]
    positionals: list[str] = []
    options: list[str] = []
    for a in parser._actions:
        if a.option_strings:
            name = a.option_strings[-1]
            if a is fuzz:
                options += [name] if value is None else [name, value]
            elif name in opts and a.nargs != 0:
                options += [name, opts[name]]
        elif not isinstance(a, argparse._SubParsersAction):
            if a is fuzz:
                vals = list(pos.get(a.dest, ["x"]))
                vals[index] = value if value is not None else vals[index]
                positionals += vals
            else:
                positionals += pos.get(a.dest, ["x"])
    if any(a.nargs == argparse.REMAINDER for a in parser._actions):  # threshold set
        return [*argv, *options, *positionals]
    return [*argv, *options, "--", *positionals] if positionals else [*argv, *options]


@pytest.fixture
def no_host(tmp_path, monkeypatch):
    """No daemon, no kernel: the default socket is in tmp_path, the data path refuses."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "diskstats").write_bytes((LAB / "proc" / "diskstats.1").read_bytes())
    none = types.SimpleNamespace(control_socket=str(tmp_path / "default.sock"))
    monkeypatch.setattr(cli_daemon, "defaults", lambda: none)
    monkeypatch.setattr(cli_datapath, "config_defaults", lambda: none)

    class Refused:
        def __init__(self, *_a: Any, **_k: Any) -> None:
            raise dp.DatapathError("stub kernel: the data path refuses (test)")

    def not_applied(*_a: Any, **_k: Any) -> Any:
        raise dp.NotApplied("stub kernel: the data path is not applied (test)")

    monkeypatch.setattr(dp, "Datapath", Refused)
    monkeypatch.setattr(dp, "discover", not_applied)
    monkeypatch.setattr(dp, "status", not_applied)
    monkeypatch.setattr(dp, "with_gate", lambda spec, *_a, **_k: spec)
    parser = build_parser()  # one parser for the corpus (7 ms each; parse_args keeps no state)
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    return tmp_path


def run(argv: list[str]) -> tuple[int, str, str]:
    """main(argv): (exit code, stdout, stderr); SystemExit's code for argparse."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = sim_cli.main(argv[1:]) if tuple(argv[:1]) == SIMULATE else main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else -1
            return rc, out.getvalue(), "SystemExit\n" + err.getvalue()
    return rc, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> str | None:
    """None if the invocation behaved; else what went wrong."""
    try:
        rc, _out, err = run(argv)
    except Exception as e:  # the traceback the corpus exists to find
        return f"{argv!r:.200}: {type(e).__name__}: {e!s:.200}"
    if err.startswith("SystemExit\n"):
        lines = err.removeprefix("SystemExit\n").rstrip("\n").split("\n")
        if rc != 2 or not ARGPARSE_ERROR.match(lines[-1]):
            return f"{argv!r:.200}: argparse exit {rc}: {lines[-1]!r:.200}"
        return None
    if rc not in (0, 1, 2, 3):
        return f"{argv!r:.200}: exit {rc}"
    prog = "santhrottle-simulate" if tuple(argv[:1]) == SIMULATE else "santhrottle"
    if rc and (err.count("\n") != 1 or not err.startswith(f"{prog}: ")):
        return f"{argv!r:.200}: exit {rc} with stderr {err!r:.300}"
    return None


def invocations(path, parser, tmp):
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction | argparse._VersionAction) or a.nargs == 0:
            continue
        _opts, pos = baseline(path, tmp)
        for index in range(1 if a.option_strings else len(pos.get(a.dest, ["x"]))):
            for value in corpus(tmp):
                yield argv_for(path, parser, tmp, a, value, index)
        if a.option_strings:
            yield argv_for(path, parser, tmp, a, None)  # the option without its value


@pytest.mark.fuzz
@pytest.mark.parametrize(("path", "parser"), VERBS, ids=[" ".join(p) for p, _ in VERBS])
def test_every_verb_survives_the_corpus(path, parser, no_host):
    cases = list(invocations(path, parser, no_host))
    problems = [p for p in map(check, cases) if p]
    assert not problems, "\n".join(problems)


def test_the_walk_finds_every_verb_and_the_corpus_is_large(tmp_path):
    names = {" ".join(p) for p, _ in VERBS}
    assert {"status", "threshold show", "threshold set", "threshold reset", "top", "pin",
            "unpin", "cleanup", "datapath apply", "datapath show", "resources",
            "initiators", "simulate", "group list", "group show", "group set",
            "group reset"} <= names  # fmt: skip
    n = sum(len(list(invocations(path, parser, tmp_path))) for path, parser in VERBS)
    assert n >= 1000, n


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_fuzz_number_arguments_are_finite_in_range_or_one_argparse_error(text):
    """top's interval, --interval, --timeout, --glide-leaves: one type for them all."""
    for parse, lo, hi in (
        (number("interval", hi=86_400.0, positive=True), 0.0, 86_400.0),
        (number("count", positive=True, integer=True), 1, math.inf),
        (number("--glide-leaves", lo=0, hi=256, integer=True), 0, 256),
    ):
        try:
            v = parse(text)
        except argparse.ArgumentTypeError as e:
            assert "\n" not in str(e) and len(str(e)) < 200
            continue
        assert math.isfinite(v) and lo <= v <= hi and re.fullmatch(r"[0-9.]+", text)
