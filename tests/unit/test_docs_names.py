"""What the manual names exists: every test function (`test_...`) a page names is a test
of the tree, and every path of the tree it quotes in backticks (`tests/...`,
`appliance/...`, ...) is there.  A renamed test or a moved module fails here, not in a
reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .docs_blocks import PAGES, ROOT

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
