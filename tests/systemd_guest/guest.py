"""One boot of the systemd guest for a test module: the script runs there, its record back.

guest_record(script, record, budget_s): boots vagrant/qemu/systemd_guest.py's guest with
dist-deb/'s package (`make deb`), runs `python3 SCRIPT` (a file of this folder) as its
command, and returns the JSON the script left in the run's work folder as `record`;
pair_record: the same in both guests of a pair booted at once (run_pair).
A host without QEMU or Debian's kernel package skips with the reason; a guest that left
no record fails with its console's tail.

BOOTS: the boot each test module of this folder judges.  When a session collects them,
conftest.py starts them at once, one after another, on a thread beside the rest of the
session (each boot is a QEMU process the thread waits for); a module's fixture takes its
record with booted(module), which waits for that boot, or boots it there when no thread
runs it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from labkit.host import FULL_RUN, full_run

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
    obs["boot"] = (f"systemd guest {script}: {res.wall_s:.0f} s of {res.limit_s:.0f}, "
                   f"speed factor {obs.get('factor')}")  # fmt: skip
    return obs


def guest_record(script: str, record: str, budget_s: float, args: tuple[str, ...] = ()) -> dict:
    from labkit.host import LabUnavailable, Settings

    systemd_guest = _guest_module()
    deb = _deb()
    line = shlex.join(["python3", str(Path(__file__).parent / script), *args])
    try:
        res = systemd_guest.run(Settings.from_env(), deb, line, timeout=budget_s)
    except LabUnavailable as e:
        pytest.skip(f"systemd guest unavailable: {e}")
    return _record(res, script, record)


def pair_record(
    script: str, record: str, budget_s: float, args: tuple[str, ...] = ()
) -> list[dict]:
    """The same for a pair of guests (systemd_guest.run_pair): both run SCRIPT; the
    records of guest 1 and guest 2."""
    from labkit.host import LabUnavailable, Settings

    systemd_guest = _guest_module()
    deb = _deb()
    line = shlex.join(["python3", str(Path(__file__).parent / script), *args])
    try:
        res = systemd_guest.run_pair(Settings.from_env(), deb, (line, line), timeout=budget_s)
    except LabUnavailable as e:
        pytest.skip(f"systemd guest unavailable: {e}")
    return [_record(r, script, record) for r in res.runs]


@dataclass(frozen=True)
class Boot:
    script: str  # a file of this folder, the guest's command
    record: str  # the JSON it leaves in the run's work folder
    budget_s: float  # the limit on an idle host, stretched by the guest's measured speed
    pair: bool = False  # two guests at once (pair_record)
    full: tuple[str, ...] = ()  # the script's arguments for a full run (FULL_RUN), none else
    full_only: bool = False  # booted by a full run only (FULL_RUN); its tests skip without

    def wanted(self) -> bool:
        """Whether this session boots it: always, or in a full run for a full-only boot."""
        return not self.full_only or full_run()

    def run(self) -> dict | list[dict]:
        if not self.wanted():
            pytest.skip(f"{self.script}'s boot is the full run's ({FULL_RUN}=1, make lab-systemd)")
        args = self.full if full_run() else ()
        if self.pair:
            return pair_record(self.script, self.record, self.budget_s, args)
        return guest_record(self.script, self.record, self.budget_s, args)


# A full run (labkit.host.full_run(): `make lab-systemd`) adds the runs make test leaves
# out for CI's time limit: the role's reload and restart keys (each its own test, skipped
# without) and the fleet pair's whole boot (whose tests all skip without).
# by test module, in the order the thread boots them (the pair, two guests at once, last)
BOOTS = {
    # boot, install and the steps: 6-8 minutes on an idle host
    "test_package_systemd": Boot("guest_package.py", "package.json", 1200),
    # 5 role runs (7: FULL_RUN) of 60-120 s on an idle host, and the boot
    "test_role_systemd": Boot("guest_role.py", "role.json", 1800, full=("--full",)),
    # the boot, the first run, the views, the failover, and the second run (guest_fleet.py's
    # budgets): a full run's only.  Two guests at once, one vCPU each, take both of the
    # host's cores for 25-40 minutes; beside make test's other guests it took CI past its
    # 90 minutes (the fleet's engine is checked against a real etcd in namespaces, the
    # role's fleet rendering by the rollout tier)
    "test_fleet_systemd": Boot(
        "guest_fleet.py", "fleet.json", 1800, pair=True, full=("--full",), full_only=True
    ),
}


class Beside:
    """BOOTS' boots on a thread of their own, one after another, while the session runs
    the other tests; result(module) waits for one."""

    def __init__(self, modules: list[str]) -> None:
        self.modules = modules
        self._done = {m: threading.Event() for m in modules}
        self._results: dict[str, tuple[bool, object]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="systemd-guests", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for m in self.modules:
            try:
                if self._stopping:
                    raise RuntimeError("the session ended before this boot")
                self._results[m] = (True, BOOTS[m].run())
            except BaseException as e:  # pytest.skip and .fail too: re-raised in the fixture
                self._results[m] = (False, e)
            self._done[m].set()

    def result(self, module: str) -> dict | list[dict]:
        self._done[module].wait()
        ok, value = self._results[module]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value  # type: ignore[return-value]

    def stop(self, timeout_s: float = 60) -> None:
        """The session is over: the boots not yet begun never begin, QEMU processes of
        this process still running (a boot under way) end, and the thread with them."""
        self._stopping = True
        if self._thread.is_alive():
            for pid in _our_qemus():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            self._thread.join(timeout_s)


def _our_qemus() -> list[int]:
    """This process' children that are QEMU (a boot's, started by labkit's runner)."""
    from labkit.probes import children

    return [pid for pid, comm, _state in children(os.getpid()) if comm.startswith("qemu-system")]


BESIDE: list[Beside] = []  # the session's, when conftest.py started one


def booted(module: str) -> dict | list[dict]:
    """module's record: from the session's thread when it boots that module, else booted
    here."""
    for b in BESIDE:
        if module in b.modules:
            return b.result(module)
    return BOOTS[module].run()
