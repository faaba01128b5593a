"""Test tiers by folder: tests/unit -> unit, tests/sim -> sim, tests/rollout -> rollout,
tests/privileged -> privileged, tests/lab -> lab (tests/closed_loop marks itself lab).

Also recreates the empty directories of the captured lab trees (tests/fixtures/lab,
listed in its empty_dirs.json): git keeps no empty directory, and an empty
configfs `acls/` is what a target with generated ACLs has.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TIERS = ("unit", "sim", "rollout", "privileged", "lab")
TESTS = Path(__file__).resolve().parent
LAB_FIXTURES = TESTS / "fixtures" / "lab"


def pytest_configure(config: pytest.Config) -> None:
    for rel in json.loads((LAB_FIXTURES / "empty_dirs.json").read_text()):
        (LAB_FIXTURES / rel).mkdir(parents=True, exist_ok=True)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # the folders under tests/ only: the checkout's own path may hold a tier's name
        # (a worktree named sim/ would mark every test sim)
        path = Path(str(item.fspath)).resolve()
        parts = path.relative_to(TESTS).parts if TESTS in path.parents else ()
        for tier in TIERS:
            if tier in parts and item.get_closest_marker(tier) is None:
                item.add_marker(getattr(pytest.mark, tier))
