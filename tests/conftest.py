"""Test tiers by folder: tests/unit -> unit, tests/sim -> sim, tests/rollout -> rollout,
tests/privileged -> privileged, tests/lab -> lab (tests/closed_loop marks itself lab).

The fuzz tier: a randomized test (hypothesis's @given) or a corpus run (marked
`@pytest.mark.fuzz`) is fuzz, not unit, wherever it lives; `make test-unit` is the fast
loop, `make test-fuzz` these (`make test` runs both, with the same seeds and cases).

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
        fuzz = _is_fuzz(item)
        if fuzz and item.get_closest_marker("unit") is not None:
            # a module's `pytestmark = pytest.mark.unit` would put it back in the fast loop
            raise pytest.UsageError(
                f"{item.nodeid} is a fuzz test (hypothesis or corpus) marked unit: "
                "drop the unit mark (tests/unit marks its tests; fuzz ones go to -m fuzz)"
            )
        if fuzz and item.get_closest_marker("fuzz") is None:
            item.add_marker(pytest.mark.fuzz)
        for tier in TIERS:
            if tier == "unit" and fuzz:
                continue
            if tier in parts and item.get_closest_marker(tier) is None:
                item.add_marker(getattr(pytest.mark, tier))


def _is_fuzz(item: pytest.Item) -> bool:
    """Marked fuzz, or a hypothesis test (its @given draws the cases)."""
    if item.get_closest_marker("fuzz") is not None:
        return True
    fn = getattr(item, "function", None)
    return bool(getattr(fn, "is_hypothesis_test", False))
