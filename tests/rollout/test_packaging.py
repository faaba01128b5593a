"""What the build generates (buildsys/santhrottle_build.py), checked where it is made.

- The parsers and the config schema import with the standard library alone (the
  build environment has only the build requirements: no pyroute2, no prometheus_client).
- The example config is every key of the schema at its default: as shipped, and with
  every `#key = value` line uncommented.
- The man pages: groff formats them without a warning; santhrottle(8) has every verb,
  its options and its examples (the epilogs), santhrottled(8) and santhrottle-simulate(1)
  every option; each page the others name in SEE ALSO exists.
- The bash completions complete verbs, sub-verbs, options and choices (bash-completion
  style, no bash-completion needed); bash -n and zsh -n accept the scripts.

The wheel's contents (these files under share/) are tests/rollout/test_rollout.py's.
A missing tool is a skip that names it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from santhrottle.appliance.config import KEYS, parse_config

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "buildsys" / "santhrottle_build.py"


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    for mod in ("shtab", "setuptools"):  # the man pages: buildsys/manpage.py, stdlib
        pytest.importorskip(mod, reason=f"{mod} is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("generated")
    p = _run([sys.executable, BUILD, out], env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"})
    assert p.returncode == 0, p.stderr
    return out


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from santhrottle.appliance.cli.main import build_parser as cli
    from santhrottle.appliance.daemon.main import build_parser as daemon
    from santhrottle.sim.cli import build_parser as simulator

    return {"santhrottle": cli(), "santhrottled": daemon(), "santhrottle-simulate": simulator()}


def _verbs(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) of every subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub
                yield from _verbs(sub, f"{path} {name}")


# ------------------------------------------------------------ build env
def test_parsers_and_schema_import_with_the_standard_library_alone():
    """What the build imports, with no site-packages at all (python -S)."""
    code = f"""
import sys, types
pkg = types.ModuleType("santhrottle")
pkg.__path__ = [{str(ROOT)!r}]
sys.modules["santhrottle"] = pkg
from santhrottle.appliance.cli.main import build_parser as a
from santhrottle.appliance.daemon.main import build_parser as b
from santhrottle.sim.cli import build_parser as c
from santhrottle.appliance.config.schema import KEYS
a(), b(), c()
print(sorted({{m.split(".")[0] for m in sys.modules}}))
"""
    p = _run([sys.executable, "-S", "-c", code], cwd="/")
    assert p.returncode == 0, p.stderr
    for heavy in ("pyroute2", "prometheus_client", "rtslib_fb", "matplotlib"):
        assert f"'{heavy}'" not in p.stdout


# -------------------------------------------------------- example config
def test_example_config_is_every_default(generated):
    text = (generated / "santhrottle.toml.example").read_text()
    assert parse_config(text, "x") == parse_config("", "x")
    # every `#key = value` line is the key at its default: uncommented, nothing changes
    lines = re.findall(r"^#(\w+) = ", text, flags=re.M)
    uncommented = re.sub(r"^#(\w+ = )", r"\1", text, flags=re.M)
    assert parse_config(uncommented, "x") == parse_config("", "x")
    table = None
    seen = {}
    for line in uncommented.splitlines():
        if m := re.match(r"^\[(\w+)\]$", line):
            table = m.group(1)
        elif m := re.match(r"^(\w+) = ", line):
            seen[f"{table}.{m.group(1)}"] = line
    assert len(seen) == len(lines)
    for k in KEYS:
        if k.table.endswith(".NAME"):  # described, in a comment
            assert f"\n#   {k.name}: " in text, k.dotted
        elif k.default is None:  # unset: said so, no line to uncomment
            assert k.dotted not in seen and f"unset by default, e.g. {k.name} = " in text
        else:
            assert k.dotted in seen, k.dotted


# ------------------------------------------------------------ man pages
def _render(page: Path) -> str:
    """The page as plain text on a very wide line (nothing wrapped or hyphenated)."""
    p = _run(
        ["groff", "-man", "-Tascii", "-ww", "-P-cbou", "-rLL=400n", page],
        env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0 and not p.stderr, p.stderr
    return re.sub(r"[ \t]+", " ", p.stdout)


@pytest.fixture(scope="module")
def pages(generated) -> dict[str, str]:
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed (Debian: groff-base)")
    return {p.name: _render(p) for p in (generated / "man").iterdir()}


def test_man_pages_exist_and_format_cleanly(pages):
    assert sorted(pages) == [
        "santhrottle-simulate.1",
        "santhrottle.8",
        "santhrottle.toml.5",
        "santhrottled.8",
    ]
    for name, text in pages.items():
        assert re.search(r"^NAME$", text, flags=re.M), name
        # every page named in SEE ALSO is one of the project's or a system one
        for ref, sec in re.findall(r"(santhrottle[\w.]*)\((\d)\)", text):
            assert f"{ref}.{sec}" in pages, (name, ref)


def _examples(epilog: str) -> list[str]:
    """The indented lines of an epilog, its exit-status block (EXIT STATUS's) left out."""
    examples = epilog.split("exit status:\n")[0]
    return [" ".join(line.split()) for line in examples.splitlines() if line.startswith("  ")]


def test_santhrottle_8_has_every_verb_its_options_and_examples(pages):
    text = pages["santhrottle.8"]
    parser = _parsers()["santhrottle"]
    verbs = list(_verbs(parser, "santhrottle"))
    assert len(verbs) >= 13
    for path, sub in verbs:
        assert f"COMMAND '{path}'" in text, path
        for action in sub._actions:
            if action.help != argparse.SUPPRESS:
                for opt in action.option_strings:
                    if opt not in ("-h", "--help"):
                        assert opt in text, (path, opt)
        for example in _examples(sub.epilog or ""):
            assert example in text, (path, example)
    for example in _examples(parser.epilog or ""):
        assert example in text, example
    for section in ("EXAMPLES", "EXIT STATUS", "FILES", "SEE ALSO"):
        assert re.search(rf"^{section}$", text, flags=re.M), section


PROGRAM_PAGES = [
    ("santhrottled", "santhrottled.8"),
    ("santhrottle-simulate", "santhrottle-simulate.1"),
]


@pytest.mark.parametrize("prog,page", PROGRAM_PAGES)
def test_the_programs_page_has_every_option_and_example(pages, prog, page):
    text = pages[page]
    parser = _parsers()[prog]
    for action in parser._actions:
        for opt in action.option_strings:
            if opt not in ("-h", "--help"):
                assert opt in text, opt
    for example in _examples(parser.epilog or ""):
        assert example in text, example


def test_santhrottle_toml_5_has_every_key(pages):
    text = pages["santhrottle.toml.5"]
    for k in KEYS:
        assert re.search(rf"^ *{k.name} = ", text, flags=re.M), k.dotted
        assert k.doc.split(";")[0][:40] in " ".join(text.split()), k.dotted


# ----------------------------------------------------------- completions
COMPLETE = r"""
source "$1"
shift
comp() {  # comp WORD... : the completions of the last word, as bash-completion asks
    COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
    "_shtab_${COMP_WORDS[0]//-/_}" "${COMP_WORDS[0]}" "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
    printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' '
}
comp "$@"
"""


def _complete(generated: Path, *words: str) -> set[str]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    script = generated / "bash" / words[0]
    p = _run([bash, "-c", COMPLETE, "complete", script, *words], cwd=generated)
    assert p.returncode == 0 and not p.stderr, p.stderr
    return set(p.stdout.split())


def test_bash_completion_completes_verbs_options_and_choices(generated):
    parser = _parsers()["santhrottle"]
    top = {path.split()[1] for path, _ in _verbs(parser, "santhrottle")}
    assert _complete(generated, "santhrottle", "") >= top
    assert _complete(generated, "santhrottle", "thr") == {"threshold"}
    assert _complete(generated, "santhrottle", "threshold", "") == {"show", "set", "reset"}
    assert "--write-mode" in _complete(generated, "santhrottle", "datapath", "apply", "--")
    assert _complete(generated, "santhrottle", "pin", "10.0.0.3", "--mode", "") == {
        "all",
        "ack",
        "read",
    }
    # file names for the files (here: the generated directory's)
    assert "santhrottle.toml.example" in _complete(generated, "santhrottle", "cleanup",
                                                   "--config", "santhrottle.t")  # fmt: skip
    # the simulator's own options; after `santhrottle simulate`, its words: file names
    assert "--no-baseline" in _complete(generated, "santhrottle-simulate", "--no")
    words = ("santhrottle", "simulate", "santhrottle.t")
    assert "santhrottle.toml.example" in _complete(generated, *words)
    assert _complete(generated, "santhrottled", "--log-level", "") == {
        "DEBUG",
        "INFO",
        "WARNING",
        "ERROR",
    }


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_parse(generated, shell):
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip(f"{shell} is not installed (apt-get install {shell})")
    for script in (generated / shell).iterdir():
        p = _run([binary, "-n", script])
        assert p.returncode == 0 and not p.stderr, (script.name, p.stderr)
    if shell == "zsh":
        for prog in ("santhrottle", "santhrottled", "santhrottle-simulate"):
            head = (generated / "zsh" / f"_{prog}").read_text().splitlines()[0]
            assert head == f"#compdef {prog}"
