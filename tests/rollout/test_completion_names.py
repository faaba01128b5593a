"""The shell completions offer the running daemon's names (appliance/cli/completion.py).

The generated bash and zsh scripts (buildsys/santhrottle_build.py, as the packages ship
them) against a daemon on the fakes of tests/unit/test_daemon.py, over a real Unix
socket, through the real `santhrottle names` on PATH: bash through shtab's own
completion function, as bash-completion calls it; zsh through the preamble's
functions (compadd captured: driving zsh's completion widget needs a terminal).
No daemon, or no answer: nothing offered, no error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from santhrottle.appliance.cli.main import main
from tests.unit.test_control_cli import live  # noqa: F401  (the fixture: a daemon with a socket)
from tests.unit.test_daemon import CONF

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "buildsys" / "santhrottle_build.py"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=120, env=ENV, **kw
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    pytest.importorskip("shtab", reason="shtab is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("generated")
    p = _run([sys.executable, BUILD, out])
    assert p.returncode == 0, p.stderr
    return out


BASH = r"""
source "$1"
shift
COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
"_shtab_${COMP_WORDS[0]}" "${COMP_WORDS[0]}" "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


def bash(generated: Path, *words: str) -> set[str]:
    binary = shutil.which("bash")
    if binary is None:
        pytest.skip("bash is not installed")
    p = _run([binary, "-c", BASH, "complete", generated / "bash" / "santhrottle", *words])
    assert p.returncode == 0 and not p.stderr, p.stderr
    return set(p.stdout.split())


ZSH = r"""
compdef() { : }
compadd() { [[ $1 == -a ]] && print -rl -- "${(@P)2}" }
eval "$(<$1)"  # as compinit's autoload would: the functions, registered with compdef
shift
words=("$@"); CURRENT=${#words}
"$FUNCTION"
"""


def zsh(generated: Path, function: str, *words: str) -> set[str]:
    binary = shutil.which("zsh")
    if binary is None:
        pytest.skip("zsh is not installed (apt-get install zsh)")
    script = generated / "zsh" / "_santhrottle"
    p = subprocess.run(
        [binary, "-f", "-c", f"FUNCTION={function}\n{ZSH}", "complete", str(script), *words],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert not p.stderr, p.stderr
    return set(p.stdout.split())


CONF_GROUPS = (
    CONF
    + """
[groups.db]
members = ["10.0.0.3"]
latency_target = "5ms"
"""
)


def test_names_prints_what_the_daemon_knows(live, capsys):  # noqa: F811
    _d, _act, sock = live
    assert main(["names", "resources", *sock]) == 0
    assert capsys.readouterr().out.split() == ["vg0", "vg1"]
    assert main(["names", "initiators", "--json", *sock]) == 0
    inis = json.loads(capsys.readouterr().out)["data"]
    assert "10.0.0.3" in inis and inis == sorted(inis, key=lambda a: (":" in a, a))
    assert main(["names", "groups", "--json", *sock]) == 0
    assert isinstance(json.loads(capsys.readouterr().out)["data"], list)


def test_bash_completes_resources_groups_and_initiators_from_the_daemon(generated, live):  # noqa: F811
    _d, _act, sock = live
    assert bash(generated, "santhrottle", "threshold", "reset", *sock, "") == {"vg0", "vg1"}
    assert bash(generated, "santhrottle", "threshold", "reset", *sock, "vg1") == {"vg1"}
    assert bash(generated, "santhrottle", "threshold", "set", *sock, "") == {"vg0", "vg1"}
    assert bash(generated, "santhrottle", "threshold", "set", *sock, "vg0", "") == set()
    assert "10.0.0.3" in bash(generated, "santhrottle", "why", *sock, "")
    assert bash(generated, "santhrottle", "pin", *sock, "10.0.0.") >= {"10.0.0.3"}
    assert "10.0.0.3" in bash(generated, "santhrottle", "unpin", *sock, "")


def test_completion_of_groups(generated, tmp_path):
    from santhrottle.appliance.daemon.control.commands import Commands
    from santhrottle.appliance.daemon.control.server import ControlServer
    from tests.unit.test_daemon import make, run_for

    d, vt, _sensors, _act = make(CONF_GROUPS)
    run_for(d, vt, 2.0)
    path = str(tmp_path / "control.sock")
    srv = ControlServer(path, Commands(d).handle, 0o600)
    srv.start()
    try:
        sock = ("--socket", path)
        assert "db" in bash(generated, "santhrottle", "group", "show", *sock, "")
        assert bash(generated, "santhrottle", "group", "reset", *sock, "d") == {"db"}
        assert "db" in zsh(generated, "_santhrottle_groups", "group", "set", *sock, "")
    finally:
        srv.close()


def test_zsh_completes_from_the_daemon(generated, live):  # noqa: F811
    _d, _act, sock = live
    assert zsh(generated, "_santhrottle_resources", "threshold", "reset", *sock, "") == {
        "vg0",
        "vg1",
    }
    assert "10.0.0.3" in zsh(generated, "_santhrottle_initiators", "pin", *sock, "")
    assert zsh(generated, "_santhrottle_threshold_resource", "set", *sock, "vg0", "") == set()
    text = (generated / "zsh" / "_santhrottle").read_text()
    for spec in (":initiator IPv4 or IPv6 address:_santhrottle_initiators",
                 ":the resource, as status names it:_santhrottle_resources",
                 "_santhrottle_threshold_resource"):  # fmt: skip
        assert spec in text, spec


def test_without_a_daemon_nothing_is_offered_and_nothing_is_said(generated, tmp_path):
    sock = ("--socket", str(tmp_path / "nobody.sock"))
    assert bash(generated, "santhrottle", "threshold", "reset", *sock, "") == set()
    assert zsh(generated, "_santhrottle_resources", "threshold", "reset", *sock, "") == set()


def test_threshold_set_completes_its_first_operand_only(generated, live):  # noqa: F811
    _d, _act, sock = live
    for words in (("set", *sock, ""), ("set", "--json", ""), ("set", "--timeout", "5", *sock, "")):
        assert bash(generated, "santhrottle", "threshold", *words[:-1], *sock, "") == {"vg0", "vg1"}
        assert zsh(generated, "_santhrottle_threshold_resource", "threshold", *words[:-1],
                   *sock, "") == {"vg0", "vg1"}  # fmt: skip
    assert bash(generated, "santhrottle", "threshold", "set", *sock, "vg0", "") == set()
    assert bash(generated, "santhrottle", "threshold", "set", "vg0", *sock, "") == set()
    assert zsh(generated, "_santhrottle_threshold_resource", "threshold", "set", "vg0",
               *sock, "") == set()  # fmt: skip
