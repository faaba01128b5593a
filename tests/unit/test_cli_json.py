"""--json on every verb: each leaf command of `santhrottle` has it, and prints
{"protocol": N, "data": ...}; pin and unpin through a running daemon (the kernel
paths, datapath apply and cleanup: tests/privileged/test_datapath_netns.py)."""

from __future__ import annotations

import argparse
import json

import pytest

from santhrottle.appliance.cli.main import build_parser, main
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION
from santhrottle.controller.ladder import Ladder
from santhrottle.sim.cli import build_parser as sim_parser

from .test_control_cli import live  # noqa: F401  (the fixture: a daemon with a socket)


def _leaves(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, p
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


# `santhrottle simulate ARGS` runs santhrottle-simulate ARGS: its options are the simulator's
LEAVES = [
    (path, sim_parser() if path == ("simulate",) else p) for path, p in _leaves(build_parser())
]


@pytest.mark.parametrize("path,parser", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_verb_has_json(path, parser):
    options = {o for a in parser._actions for o in a.option_strings}
    assert "--json" in options, " ".join(path)


def test_the_verbs_the_admin_named_are_among_them():
    paths = {p for p, _ in LEAVES}
    assert {("pin",), ("unpin",), ("cleanup",), ("datapath", "apply")} <= paths


def _json(capsys):
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"protocol", "data"} and doc["protocol"] == PROTOCOL_VERSION
    return doc["data"]


def test_pin_and_unpin_json_through_the_daemon(live, capsys):  # noqa: F811
    d, _act, sock = live
    assert main(["pin", "10.0.0.9", "--delay", "5ms", "--mode", "read", "--json", *sock]) == 0
    data = _json(capsys)
    assert data == {
        "initiator": "10.0.0.9",
        "class": 10,
        "delay_s": pytest.approx(Ladder().delay_s(10)),
        "mode": "read",
        "through": "santhrottled",
    }
    assert d.runtime.pins["10.0.0.9"] == (10, "read")
    assert main(["unpin", "10.0.0.9", "--json", *sock]) == 0
    assert _json(capsys) == {"initiator": "10.0.0.9", "unpinned": True, "through": "santhrottled"}
    assert "10.0.0.9" not in d.runtime.pins


def test_a_refusal_under_json_is_still_one_line_on_stderr_and_nothing_on_stdout(live, capsys):  # noqa: F811
    _d, _act, sock = live
    assert main(["pin", "10.0.0.9", "--delay", "1.2ms", "--json", *sock]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "1.2ms" in err
    assert main(["cleanup", "--json", *sock]) == 1  # the daemon answers: refused
    out, err = capsys.readouterr()
    assert out == "" and "owns the data path" in err and err.count("\n") == 1
