"""The CLI's conventions: one-line errors with their exit code (2 for bad input), --help
with examples and the exit codes on every verb, --version; the data path's spec
validation and its namespace handling (no root)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from santhrottle.appliance.cli import simulate as cli_simulate
from santhrottle.appliance.cli.common import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_HELP,
    EXIT_NO_DAEMON,
    EXIT_OK,
    EXIT_USAGE,
)
from santhrottle.appliance.cli.main import build_parser, main
from santhrottle.appliance.daemon.main import build_parser as daemon_parser
from santhrottle.appliance.datapath import DatapathError, DatapathSpec
from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.version import version
from santhrottle.sim.cli import main as sim_main


def _verbs(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (sub)command path and its parser."""
    for action in p._actions:  # argparse keeps its subparsers here; no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _verbs(sub, (*path, name))


VERBS = [path for path, _ in _verbs(build_parser())]
# `simulate`'s help is the simulator's (test_santhrottle_simulate_runs_the_simulators_own_program)
OWN_HELP = [path for path in VERBS if path != ("simulate",)]


def test_the_verbs_an_admin_guesses_are_there():
    for verb in (("status",), ("threshold", "set"), ("threshold", "show"), ("pin",),
                 ("unpin",), ("cleanup",), ("datapath", "apply"), ("datapath", "show"),
                 ("resources",), ("initiators",), ("top",), ("reload",), ("group", "list"),
                 ("group", "show"), ("group", "set"), ("group", "reset")):  # fmt: skip
        assert verb in VERBS
    # one cleanup verb
    assert ("datapath", "cleanup") not in VERBS


@pytest.mark.parametrize("path", OWN_HELP, ids=" ".join)
def test_every_verb_has_help_with_its_own_examples_and_the_exit_codes(path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*path, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert f"santhrottle {path[0]}" in out.split("examples:")[1]
    assert out.rstrip("\n").endswith(EXIT_HELP.rstrip("\n"))
    parser = dict(_verbs(build_parser()))[path]
    if any("--json" in a.option_strings for a in parser._actions):
        assert '{"protocol": ' in out  # --json's shape is documented where it is


def test_top_level_help_has_the_exit_codes_and_the_json_shape(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for code, meaning in EXIT_CODES.items():
        assert f"  {code:<3}  {meaning}" in out
    assert '{"protocol": N, "data": ...}' in out
    assert {0, 1, 2, 3} <= set(EXIT_CODES)
    assert (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_DAEMON) == (0, 1, 2, 3)


def test_version(capsys):
    for parser, prog in ((build_parser(), "santhrottle"), (daemon_parser(), "santhrottled")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["--version"])
        assert e.value.code == 0
        assert capsys.readouterr().out.startswith(f"{prog} {version()} ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["datapath", "apply", "--device", "eth1", "--max-delay", "0.2ms"],
            "maximum delay 200us is below the step 500us",
        ),
        (
            [
                "datapath",
                "apply",
                "--device",
                "eth1",
                "--step",
                "10us",
                "--max-delay",
                "1s",
                "--ladder-ratio",
                "1",
            ],
            "ladder has more than 5000 classes",
        ),
        (
            ["datapath", "apply", "--device", "eth1", "--step", "1us", "--max-delay", "1ms"],
            "bad step 1 us: must be 10us..100ms",
        ),
        (["threshold", "set", "vg0", "-5ms"], "threshold: '-5ms' is not a duration"),
        (["threshold", "set", "vg0"], "usage: santhrottle threshold set RESOURCE VALUE"),
        # issue 17: a missing value after an option of `threshold set` was a traceback
        (["threshold", "set", "vg0", "15ms", "--config"], "--config needs a value"),
        (["threshold", "set", "vg0", "15ms", "--socket"], "--socket needs a value"),
        (["threshold", "set", "vg0", "15ms", "--timeout", "nan"], "'nan' is not a number"),
        (["threshold", "set", "vg0", "15ms", "--socket="], "--socket must not be empty"),
        (["threshold", "set", "vg0", "١٢ms"], "is not a duration"),
        (["threshold", "reset", "\x1b[2J"], "bad resource name"),
    ],
)
def test_cli_errors_are_one_line_exit_2(argv, message, capsys):
    """Bad input the verb finds (not argparse): one line, exit 2, never a traceback."""
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("santhrottle: ")
    assert message in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["/dev/zero"], "scenario /dev/zero: not a regular file"),
        (["/"], "scenario /: not a regular file"),
        (["x.toml", "--plot", "out.gif"], "--plot 'out.gif': name a png, svg, pdf"),
        (["--sweep", "2", "x.toml"], "give a SCENARIO or --sweep N, not both"),
        (["x.toml", "--seed", "3"], "--seed goes with --sweep N"),
    ],
)
def test_the_simulators_errors_are_one_line_exit_2(argv, message, capsys):
    """santhrottle-simulate keeps the command line's conventions (sim/cli.py)."""
    assert sim_main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("santhrottle-simulate: ")
    assert message in err


def test_santhrottle_simulate_runs_the_simulators_own_program(monkeypatch):
    """Every argument after `santhrottle simulate`, --help too, goes to santhrottle-simulate
    (`python3 -m santhrottle.sim`, a child process: the command line imports nothing of
    sim/), whose exit status is the verb's; a signal's death is 128 + N. The real child:
    test_import_contracts.py's probe and the sim tier."""
    ran, exits = [], [0, 2, -9]  # the child's exit statuses, in turn

    def run(cmd, check):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, exits.pop(0))

    monkeypatch.setattr(cli_simulate.subprocess, "run", run)
    for want in (EXIT_OK, EXIT_USAGE, 128 + 9):
        assert main(["simulate", "--help", "paper.toml", "--json"]) == want
    assert ran == 3 * [[sys.executable, "-m", "santhrottle.sim", "--help", "paper.toml", "--json"]]


ARGPARSE_ERRORS = [
    # issue 17, each was a traceback or a silent exit 0
    (["top", "nan"], "argument interval: 'nan' is not a number"),
    (["top", "inf"], "argument interval: 'inf' is not a number"),
    (["top", "1e308"], "argument interval: '1e308' is not a number"),
    (["top", "1", "-5"], "argument count: '-5' is not a whole number"),
    (["top", "1", "0"], "argument count: count must be above 0"),
    (["top", "0"], "argument interval: interval must be above 0"),
    (["top", "١٢"], "argument interval: '١٢' is not a number"),
    (["top", "１２"], "argument interval: '１２' is not a number"),
    (["top", "1", "1.5"], "argument count: '1.5' is not a whole number"),
    (["top", "0x10"], "argument interval: '0x10' is not a number"),
    (["resources", "--interval", "nan"], "argument --interval: 'nan' is not a number"),
    (["resources", "--interval", "61"], "argument --interval: --interval must be within"),
    (["initiators", "--interval", "-1"], "argument --interval: '-1' is not a number"),
    (["pin", "10.0.0.3", "--delay", "1" * 5000 + "ms"], "more than 30 digits"),
    (["pin", "10.0.0.3", "--delay", "5"], "argument --delay: '5' is not a duration"),
    (["pin", "10.0.0.3", "--delay", "0"], "--delay must be above 0"),
    (["pin", "10.0.0.x", "--delay", "5ms"], "bad initiator address '10.0.0.x'"),
    (["unpin", "10.0.0"], "bad initiator address"),
    (["datapath", "apply", "--device", "eth1", "--link-speed", "9" * 400 + "tbit"], "digits"),
    (["datapath", "apply", "--device", "eth1", "--link-speed", "fast"], "is not a link speed"),
    (["datapath", "apply", "--device", "eth1", "--step", "0"], "--step must be above 0"),
    (["datapath", "apply", "--device", "eth1", "--ports", "3260,x"], "bad port 'x'"),
    (["datapath", "apply", "--device", "eth1", "--ports", "3260,3260"], "port 3260 given twice"),
    (
        ["datapath", "apply", "--device", "eth1", "--ports", ",".join(map(str, range(1, 17)))],
        "16 storage ports: iptables multiport takes at most 15",
    ),
    (["datapath", "apply", "--device", "eth1", "--glide-leaves", "٣"], "not a whole number"),
    (["datapath", "apply", "--device", ""], "--device '' must be a non-empty printable name"),
    (["status", "--socket", "/" + "s" * 200], "a Unix socket path holds at most 107"),
    (["status", "--timeout", "0"], "--timeout must be above 0"),
]


@pytest.mark.parametrize(("argv", "message"), ARGPARSE_ERRORS)
def test_bad_values_are_argparse_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith(f"santhrottle {argv[0]}") and ": error: " in last
    assert message in last and len(last) < 300  # a 5000-digit value is cut
    assert "Traceback" not in err


def test_the_apply_defaults_are_the_configs(capsys):
    with pytest.raises(SystemExit):
        main(["datapath", "apply", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for want in ("(default 3260,4420)", "(default 500us)", "(default 250ms)", "(default 25gbit)",
                 "(default all)", "(default 8, 0 = none)"):  # fmt: skip
        assert want in out


def test_spec_validates_against_the_schemas_bounds():
    with pytest.raises(DatapathError, match="more than 5000 classes"):
        DatapathSpec(("eth1",), step_us=10, max_delay_us=1_000_000, ladder_ratio=1.0)
    with pytest.raises(DatapathError, match="bad write mode 'read'"):
        DatapathSpec(("eth1",), write_mode="read")
    with pytest.raises(DatapathError, match="at most 15"):
        DatapathSpec(("eth1",), ports=tuple(range(1000, 1016)))
    with pytest.raises(DatapathError, match="given twice"):
        DatapathSpec(("eth1",), ports=(3260, 3260))
    with pytest.raises(DatapathError, match="bad leaf"):
        DatapathSpec(("eth1",), leaf="fq")
    s = DatapathSpec(("eth1",))
    assert (s.step_us, s.max_class, s.write_mode, s.ports) == (500, 88, "all", (3260, 4420))
    assert s.link_bits_s == 25 * 10**9 and s.max_delay_us == 250_000


def test_netns_path_missing_is_one_line(tmp_path):
    host = Host("nope", Tools(netns_dir=str(tmp_path)))
    with pytest.raises(DatapathError, match=r"no network namespace nope"):
        host.command(["tc"])
    (tmp_path / "there").touch()
    host = Host("there", Tools(netns_dir=str(tmp_path)))
    assert host.command(["tc", "-batch", "-"]) == [
        "nsenter", f"--net={tmp_path}/there", "tc", "-batch", "-"
    ]  # fmt: skip
