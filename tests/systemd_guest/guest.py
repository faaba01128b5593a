"""One boot of the systemd guest for a test module: the script runs there, its record back.

guest_record(script, record, budget_s): boots vagrant/qemu/systemd_guest.py's guest with
dist-deb/'s package (`make deb`), runs `python3 SCRIPT` (a file of this folder) as its
command, and returns the JSON the script left in the run's work folder as `record`;
pair_record: the same in both guests of a pair booted at once (run_pair).
A host without QEMU or Debian's kernel package skips with the reason; a guest that left
no record fails with its console's tail.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
DEB_DIST = CHECKOUT / "dist-deb"
GUEST_MODULE = CHECKOUT / "vagrant" / "qemu" / "systemd_guest.py"


def _guest_module() -> ModuleType:
    """vagrant/qemu/systemd_guest.py, loaded by its path: `import systemd_guest` finds
    this test folder (pytest puts tests/ on sys.path), which has the same name."""
    name = "santhrottle_lab_systemd_guest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, GUEST_MODULE)
        assert spec and spec.loader, GUEST_MODULE
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _deb() -> Path:
    debs = sorted(DEB_DIST.glob("santhrottle_*_*.deb"))
    if len(debs) != 1:
        pytest.fail(f"{DEB_DIST}: need one santhrottle_*.deb, found {debs}: run `make deb`")
    return debs[0]


def _record(res, script: str, record: str) -> dict:
    out = res.work / record
    if not out.is_file():
        pytest.fail(f"the guest recorded nothing ({res.reason or res.status}); console:\n"
                    f"{res.console_tail()}")  # fmt: skip
    obs: dict = json.loads(out.read_text())
    print(f"systemd guest {script}: {res.wall_s:.0f} s of {res.limit_s:.0f}, speed factor "
          f"{obs.get('factor')}")  # fmt: skip
    return obs


def guest_record(script: str, record: str, budget_s: float) -> dict:
    from labkit.host import LabUnavailable, Settings

    systemd_guest = _guest_module()
    deb = _deb()
    line = shlex.join(["python3", str(Path(__file__).parent / script)])
    try:
        res = systemd_guest.run(Settings.from_env(), deb, line, timeout=budget_s)
    except LabUnavailable as e:
        pytest.skip(f"systemd guest unavailable: {e}")
    return _record(res, script, record)


def pair_record(script: str, record: str, budget_s: float) -> list[dict]:
    """The same for a pair of guests (systemd_guest.run_pair): both run SCRIPT; the
    records of guest 1 and guest 2."""
    from labkit.host import LabUnavailable, Settings

    systemd_guest = _guest_module()
    deb = _deb()
    line = shlex.join(["python3", str(Path(__file__).parent / script)])
    try:
        res = systemd_guest.run_pair(Settings.from_env(), deb, (line, line), timeout=budget_s)
    except LabUnavailable as e:
        pytest.skip(f"systemd guest unavailable: {e}")
    return [_record(r, script, record) for r in res.runs]
