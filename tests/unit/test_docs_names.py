"""What the manual names exists: every test function (`test_...`) a page names is a test
of the tree; every path of the tree it quotes in backticks (`tests/...`, `appliance/...`,
...) is there; every `make TARGET` is a target of the Makefile (or of what it includes);
every series name (`santhrottle_*`, `process_*`) is one the exporter exports (or one of
the Ansible role's variables).  A renamed test, a moved module, a dropped target or a
renamed series fails here, not in a reader's hands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .docs_blocks import PAGES, ROOT, blocks
from .exported_series import exported_series

HISTOGRAM = ("_bucket", "_sum", "_count")

TREE = ("tests", "appliance", "controller", "sim", "bridge", "vagrant", "ansible",
        "buildsys", "systemd", "docs")  # fmt: skip
PATH = re.compile(rf"`((?:{'|'.join(TREE)})/[A-Za-z0-9_./-]+)`")
TEST = re.compile(r"\b(test_[a-z0-9_]+)\b")
# made at run time, not kept in the tree
RUNTIME = {"vagrant/.vagrant/"}


def _test_functions() -> set[str]:
    out: set[str] = set()
    for f in (ROOT / "tests").rglob("*.py"):
        out |= set(re.findall(r"^\s*def (test_[A-Za-z0-9_]+)", f.read_text(), re.M))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_test_and_path_exists(page: Path):
    text = page.read_text()
    tests = _test_functions()
    missing = [
        n
        for n in sorted(set(TEST.findall(text)))
        if n not in tests and not list((ROOT / "tests").rglob(f"{n}.py"))
    ]
    missing += [
        p
        for p in sorted(set(PATH.findall(text)))
        if p not in RUNTIME and not (ROOT / p.split("::")[0]).exists()
    ]
    assert not missing, missing


# `make TARGET` in backticks, or a code block's line that runs make
MAKE = re.compile(r"`make ([a-z][a-z0-9-]*)")
MAKE_LINE = re.compile(r"^(?:\$ )?make ([a-z][a-z0-9-]*)")
SERIES = re.compile(r"\b((?:santhrottle|process)_[a-z][a-z0-9_]*[a-z0-9])\b(?!_)")


def _make_targets() -> set[str]:
    """The targets `make` knows here: the Makefile and what it includes."""
    db = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile", ":"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    return set(re.findall(r"^([a-z][a-z0-9_.-]*):(?!=)", db, re.M))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_named_is_a_target(page: Path):
    targets = _make_targets()
    assert {"setup", "test", "lint", "bench"} <= targets
    named = set(MAKE.findall(page.read_text()))
    named |= {m[1] for b in blocks(page) for ln in b.lines if (m := MAKE_LINE.match(ln))}
    assert not named - targets, sorted(named - targets)


def _role_names() -> set[str]:
    """The Ansible role's variables and tags (santhrottle_*): not series."""
    out: set[str] = set()
    for f in (ROOT / "ansible").rglob("*.yml"):
        out |= set(re.findall(r"\bsanthrottle_[a-z0-9_]+", f.read_text()))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_series_named_is_exported(page: Path):
    """A santhrottle_* or process_* name in the manual is a series the exporter exports
    (a histogram by its family name too), or one of the role's variables."""
    exported = set(exported_series())
    exported |= {n[: -len(s)] for n in exported for s in HISTOGRAM if n.endswith(s)}
    named = {n for n in SERIES.findall(page.read_text()) if not n[-1].isdigit()}
    unknown = named - exported - _role_names()
    assert not unknown, sorted(unknown)
