"""The systemd guests boot beside the rest of the session.

Each boot of this folder (guest.BOOTS) is minutes of QEMU/TCG that waits on nothing of
the host's tests, and the host has two cores: when a session collects tests of this
folder, their boots start as soon as collection ends, on a thread of their own, one
after another, and this folder's tests run last, each module's fixture waiting for its
boot.  A full-only boot (the fleet pair) starts with SANTHROTTLE_LAB_FULL=1 only; without,
its tests skip.  A session that ends first (-x, ^C) ends the boots under way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .guest import BESIDE, BOOTS, Beside

HERE = Path(__file__).resolve().parent


def _module(item: pytest.Item) -> str | None:
    path = Path(str(item.fspath)).resolve()
    return path.stem if path.parent == HERE and path.stem in BOOTS else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _module(item) is not None)  # stable: the others first


def pytest_collection_finish(session: pytest.Session) -> None:
    opt = session.config.option
    if opt.collectonly or getattr(opt, "setupplan", False) or BESIDE:
        return
    wanted = {_module(item) for item in session.items} - {None}
    modules = [m for m in BOOTS if m in wanted and BOOTS[m].wanted()]
    if modules:
        BESIDE.append(Beside(modules))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for beside in BESIDE:
        beside.stop()
    BESIDE.clear()
