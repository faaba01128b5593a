"""Test tiers by folder: tests/unit -> unit, tests/privileged -> privileged, tests/lab -> lab."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "privileged", "lab")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts and tier not in item.keywords:
                item.add_marker(getattr(pytest.mark, tier))
