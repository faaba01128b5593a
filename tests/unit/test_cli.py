"""The CLI's conventions: one-line errors with exit 2, --help with examples on every verb,
--version; the data path's spec validation and its namespace handling (no root)."""

from __future__ import annotations

import argparse

import pytest

from santhrottle.appliance.cli.main import build_parser, main
from santhrottle.appliance.daemon.main import build_parser as daemon_parser
from santhrottle.appliance.datapath import DatapathError, DatapathSpec
from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.version import version


def _verbs(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (sub)command path and its parser."""
    for action in p._actions:  # argparse keeps its subparsers here; no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _verbs(sub, (*path, name))


VERBS = [path for path, _ in _verbs(build_parser())]


def test_the_verbs_an_admin_guesses_are_there():
    for verb in (("status",), ("threshold", "set"), ("threshold", "show"), ("pin",),
                 ("unpin",), ("cleanup",), ("datapath", "apply"), ("datapath", "show"),
                 ("resources",), ("initiators",), ("top",), ("reload",)):  # fmt: skip
        assert verb in VERBS
    # one cleanup verb
    assert ("datapath", "cleanup") not in VERBS


@pytest.mark.parametrize("path", VERBS, ids=" ".join)
def test_every_verb_has_help_with_its_own_examples(path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*path, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert f"santhrottle {path[0]}" in out.split("examples:")[1]


def test_version(capsys):
    for parser, prog in ((build_parser(), "santhrottle"), (daemon_parser(), "santhrottled")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["--version"])
        assert e.value.code == 0
        assert capsys.readouterr().out.startswith(f"{prog} {version()} ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pin", "10.0.0.x", "--delay", "5ms"], "bad initiator address '10.0.0.x'"),
        (["pin", "10.0.0.3", "--delay", "5"], "bad delay: '5' is not a duration"),
        (["pin", "10.0.0.3", "--delay", "0"], "delay 0 throttles nothing"),
        (["unpin", "10.0.0"], "bad initiator address"),
        (
            ["datapath", "apply", "--device", "eth1", "--max-delay", "1.2ms"],
            "maximum delay 1.2ms is not a positive multiple of the step 500us",
        ),
        (["datapath", "apply", "--device", "eth1", "--step", "0"], "bad step '0'"),
        (["datapath", "apply", "--device", "eth1", "--ports", "3260,x"], "bad port 'x'"),
        (
            ["datapath", "apply", "--device", "eth1", "--ports", "3260,3260"],
            "port 3260 given twice",
        ),
        (
            ["datapath", "apply", "--device", "eth1", "--ports", ",".join(map(str, range(1, 17)))],
            "16 storage ports: iptables multiport takes at most 15",
        ),
        (["datapath", "apply", "--device", "eth1", "--link-speed", "fast"], "is not a link speed"),
        (
            ["datapath", "apply", "--device", "eth1", "--step", "1us", "--max-delay", "1s"],
            "needs 1000000 classes of 1us: at most 5000",
        ),
        (
            ["datapath", "apply", "--device", "eth1", "--step", "1us", "--max-delay", "1ms"],
            "bad step 1 us: must be 10us..100ms",
        ),
        (["threshold", "set", "vg0", "-5ms"], "threshold: '-5ms' is not a duration"),
        (["threshold", "set", "vg0"], "usage: santhrottle threshold set RESOURCE VALUE"),
    ],
)
def test_cli_errors_are_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("santhrottle: ")
    assert message in err


def test_the_apply_defaults_are_the_configs(capsys):
    with pytest.raises(SystemExit):
        main(["datapath", "apply", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for want in ("(default 3260,4420)", "(default 500us)", "(default 50ms)", "(default 25gbit)",
                 "(default all)", "(default 8, 0 = none)"):  # fmt: skip
        assert want in out


def test_spec_validates_against_the_schemas_bounds():
    with pytest.raises(DatapathError, match="bad maximum class 5001"):
        DatapathSpec(("eth1",), max_class=5001)
    with pytest.raises(DatapathError, match="bad write mode 'read'"):
        DatapathSpec(("eth1",), write_mode="read")
    with pytest.raises(DatapathError, match="at most 15"):
        DatapathSpec(("eth1",), ports=tuple(range(1000, 1016)))
    with pytest.raises(DatapathError, match="given twice"):
        DatapathSpec(("eth1",), ports=(3260, 3260))
    with pytest.raises(DatapathError, match="bad leaf"):
        DatapathSpec(("eth1",), leaf="fq")
    s = DatapathSpec(("eth1",))
    assert (s.step_us, s.max_class, s.write_mode, s.ports) == (500, 100, "all", (3260, 4420))
    assert s.link_bits_s == 25 * 10**9 and s.max_delay_us == 50_000


def test_netns_path_missing_is_one_line(tmp_path):
    host = Host("nope", Tools(netns_dir=str(tmp_path)))
    with pytest.raises(DatapathError, match=r"no network namespace nope"):
        host.command(["tc"])
    (tmp_path / "there").touch()
    host = Host("there", Tools(netns_dir=str(tmp_path)))
    assert host.command(["tc", "-batch", "-"]) == [
        "nsenter", f"--net={tmp_path}/there", "tc", "-batch", "-"
    ]  # fmt: skip
