"""The `lab` tier: tests that need the real Debian kernel, run under QEMU/TCG.

Two halves, chosen by SANTHROTTLE_IN_GUEST:

On the host (the default) lab-marked items are never run locally.  The first
item of a guest group boots ONE guest for the group (the lab kit's runner, labkit.qemu:
installs the host packages if missing, fetches Debian's kernel, builds
initramfs and venv, all cached) that runs ``pytest -m lab <the group's
selected node ids>`` in the same checkout at the
same path; a small plugin there (lab_guest_report.py) streams every test
report back as JSON.  Each host item then replays the guest's reports for its
node id, so pass / fail (with the guest's traceback) / skip (with the guest's
reason) appear exactly as if it ran here; failures also get the tail of the
guest's serial console.  If QEMU or the kernel package is unavailable, every
lab item is skipped with one line saying what is missing; any other failure
(guest crash, timeout, broken setup) fails every item that has no report,
with the console tail attached.

Guest groups: a test module's LAB_GUEST (default "main") names its group;
the Ansible role's tests ("rollout": two role runs, minutes under TCG)
get a guest of their own, so that each boot keeps minutes of margin to its
timeout on a busy machine.  The boot's wall time and that margin are
printed.  A module with LAB_FULL_ONLY = True (the role's) runs in a full run only
(SANTHROTTLE_LAB_FULL=1: `make lab-test`); without, its items skip on the host,
naming it, and its guest never boots: CI's `make test` has no time for it.

In the guest (SANTHROTTLE_IN_GUEST=1) the tests just run, with the fixtures
below bringing the storage topology up (labkit.topology).

Environment: SANTHROTTLE_LAB_TIMEOUT (each guest run's limit, s, default 1800), and
everything the lab runner reads (SANTHROTTLE_LAB_CACHE, _QEMU, ...: vagrant/qemu/README.md).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labkit.host import FULL_RUN, full_run

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent.parent
IN_GUEST = os.environ.get("SANTHROTTLE_IN_GUEST") == "1"
REPORT_PLUGIN = "lab_guest_report"  # tests/lab/lab_guest_report.py
CONSOLE_TAIL_LINES = 60
# each guest's limit on an idle host (it needs 4-6 min there), stretched by the guest's
# own measure of how much slower it runs (labkit.speed); SANTHROTTLE_LAB_TIMEOUT overrides
DEFAULT_TIMEOUT_S = 1800

# The topology the session fixture builds (tests parametrize over it).
LUNS = 4
NVME_NAMESPACES = 1


def _group(item) -> str:
    """The guest group of a lab item: its module's LAB_GUEST, else "main"."""
    return str(getattr(item.module, "LAB_GUEST", "main"))


def _is_lab(item) -> bool:
    return item.get_closest_marker("lab") is not None


def _in_guest_session(item) -> bool:
    """A test this conftest runs in its guest: lab-marked and under tests/lab.

    pytest calls pytest_runtest_protocol through config.hook, for every item of
    the session, not only this folder's: a lab-marked test elsewhere (the
    closed-loop experiment, which boots its own guest) must run on the host.
    """
    # a full-only module's items outside a full run skip here: no guest boots for them
    skipped = item.get_closest_marker("skip") is not None
    return _is_lab(item) and HERE in Path(str(item.path)).parents and not skipped


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Everything under tests/lab is lab, marked or not (before -m deselects).
    for item in items:
        if HERE in Path(str(item.path)).parents and not _is_lab(item):
            item.add_marker(pytest.mark.lab)
        full_only = getattr(getattr(item, "module", None), "LAB_FULL_ONLY", False)
        if full_only and not IN_GUEST and not full_run():
            reason = f"the full run's ({FULL_RUN}=1, make lab-test)"
            item.add_marker(pytest.mark.skip(reason=reason))


# ===================================================================== host
class _GuestSession:
    """One guest boot for the lab items of one guest group of this pytest session."""

    def __init__(self, session, group: str) -> None:
        self.session = session
        self.group = group
        self.config = session.config
        self.unavailable: str | None = None  # -> skip, one line
        self.error: str | None = None  # -> fail every item without a report
        self.reports: dict[str, list] = {}
        self.collect_errors: list[str] = []
        self.result = None
        self._run()

    def _say(self, msg: str) -> None:
        tr = self.config.pluginmanager.getplugin("terminalreporter")
        capman = self.config.pluginmanager.getplugin("capturemanager")
        line = f"lab: {msg}"
        if tr is None:
            print(line, file=sys.stderr)
            return
        if capman is not None:
            with capman.global_and_fixture_disabled():
                tr.write_line(line)
        else:
            tr.write_line(line)

    def _run(self) -> None:
        try:  # the lab kit's runner (vagrant/labkit, installed by `make setup`)
            from labkit import images, qemu
        except Exception as e:  # a broken runner is a failure, not a skip
            self.error = f"cannot load the lab runner (labkit): {e!r}"
            return
        items = [i for i in self.session.items if _in_guest_session(i) and _group(i) == self.group]
        t0 = time.monotonic()
        try:
            settings = images.Settings.from_env(log=self._say)
            prep = images.prepare(settings)
        except images.LabUnavailable as e:
            self.unavailable = str(e)
            return
        except Exception as e:
            self.error = f"lab setup failed: {e}"
            return
        t_up = time.monotonic() - t0
        rootdir = str(self.config.rootpath)
        report = "/shared/work/reports.jsonl"
        cmd = shlex.join(
            [
                f"{prep.venv}/bin/python",
                "-m",
                "pytest",
                "-p",
                REPORT_PLUGIN,
                "-p",
                "no:cacheprovider",
                "-v",
                "--durations=8",
                "-m",
                "lab",
                f"--rootdir={rootdir}",
                *[i.nodeid for i in items],
            ]
        )
        cmd = f"cd {shlex.quote(rootdir)} && exec {cmd}"
        timeout = float(os.environ.get("SANTHROTTLE_LAB_TIMEOUT", DEFAULT_TIMEOUT_S))
        self._say(
            f"ready in {t_up:.1f} s (kernel {prep.kernel.kv}); booting the {self.group} "
            f"guest for {len(items)} tests (timeout {timeout:.0f} s)"
        )
        env = {"PYTHONPATH": str(HERE), "SANTHROTTLE_LAB_REPORT": report}
        try:
            res = qemu.run(settings, cmd, timeout=timeout, env=env, prepared=prep)
        except Exception as e:
            self.error = f"lab run failed: {e}"
            return
        self.result = res
        self._say(
            f"{self.group} guest finished in {res.wall_s:.1f} s of its {res.limit_s:.0f} s limit "
            f"({timeout:.0f} s x the guest's speed factor; margin {res.limit_s - res.wall_s:.0f} "
            f"s), exit status {res.status}"
            f"{' (' + res.reason + ')' if res.reason else ''}; run dir {res.rundir}"
        )
        self._load_reports(res.work / "reports.jsonl")
        self._say_margins()
        if not self.reports and not res.reason:
            self.error = f"the guest's pytest exited {res.status} without reporting any test"

    def _say_margins(self) -> None:
        """Each test's time in the guest (setup, call and teardown) against its limit."""
        for nodeid, reps in self.reports.items():
            took = sum(r.duration for r in reps)
            limit = dict(reps[-1].user_properties).get("lab_limit_s")
            if limit is not None:
                self._say(
                    f"  {took:7.1f} s of {limit:6.0f} s (margin {limit - took:6.0f} s) {nodeid}"
                )

    def _load_reports(self, path: Path) -> None:
        if not path.is_file():
            return
        hook = self.config.hook
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if rec.get("kind") == "collect":
                self.collect_errors.append(rec.get("text", ""))
                continue
            rep = hook.pytest_report_from_serializable(config=self.config, data=rec["data"])
            if rep is None:
                continue
            if isinstance(rep.longrepr, list):
                rep.longrepr = tuple(rep.longrepr)
            rep.location = tuple(rep.location)
            if rep.failed:
                self._attach_console(rep)
            self.reports.setdefault(rep.nodeid, []).append(rep)

    def _console_section(self) -> tuple[str, str]:
        res = self.result
        if res is None:
            return ("lab", "(the guest did not boot)")
        return (
            f"lab guest console, last {CONSOLE_TAIL_LINES} lines of {res.console_path}",
            res.console_tail(CONSOLE_TAIL_LINES),
        )

    def _attach_console(self, rep) -> None:
        rep.sections.append(self._console_section())

    # -- per item
    def reports_for(self, item) -> list:
        from _pytest.reports import TestReport

        keywords = {k: 1 for k in item.keywords}

        def mk(when, outcome, longrepr=None, sections=()):
            return TestReport(
                item.nodeid, item.location, keywords, outcome, longrepr, when, list(sections)
            )

        if self.unavailable:
            where = (
                str(Path(__file__)),
                _SKIP_LINE,
                f"Skipped: lab unavailable: {self.unavailable}",
            )
            return [mk("setup", "skipped", where), mk("teardown", "passed")]
        got = self.reports.get(item.nodeid)
        if got and any(r.when == "teardown" for r in got):
            return got
        # No (complete) report from the guest for this item: fail it, loudly.
        if self.error:
            why = self.error
        elif self.result is not None and self.result.reason:
            why = f"{self.result.reason}; the guest did not report this test"
        else:
            why = "the guest did not report this test"
        if self.collect_errors:
            why += "\n\nguest collection errors:\n" + "\n".join(self.collect_errors)
        sections = [self._console_section()]  # the command's output is in it too
        head = list(got or [])
        if not head:
            head = [mk("setup", "passed")]
        return [*head, mk("call", "failed", f"lab: {why}", sections), mk("teardown", "passed")]


_SKIP_LINE = 1  # the skip line points at this conftest, so -ra folds it into one line
_GUEST_SESSIONS_KEY = pytest.StashKey[dict[str, _GuestSession]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if IN_GUEST or not _in_guest_session(item):
        return None
    sessions = item.session.stash.setdefault(_GUEST_SESSIONS_KEY, {})
    group = _group(item)
    if group not in sessions:
        sessions[group] = _GuestSession(item.session, group)
    gs = sessions[group]
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for rep in gs.reports_for(item):
        ihook.pytest_runtest_logreport(report=rep)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


# ==================================================================== guest
def pytest_sessionstart(session) -> None:
    """In the guest: how much slower than an idle host it runs now (labkit.speed); every
    step's time limit grows with it, and the host's limit of this guest too."""
    if IN_GUEST:
        from labkit import speed

        f = speed.factor()
        print(
            f"lab speed: {f:.2f} x the fastest this host ran the guest (reference "
            f"{speed.reference():.3f} s)",
            flush=True,
        )


@pytest.fixture(autouse=True, scope="module")
def _lab_speed_per_module():
    """The guest's speed measured again before each test module (the host's load moves)."""
    if IN_GUEST:
        from labkit import speed

        print(f"lab speed: {speed.factor(fresh=True):.2f} x the fastest this host ran the guest")


@pytest.fixture(scope="session")
def topo_mod():
    """The lab's topology (labkit.topology; guest only)."""
    if not IN_GUEST:
        pytest.skip("lab fixtures run inside the lab guest only")
    from labkit import topology

    return topology


@pytest.fixture(scope="session")
def topology(topo_mod):
    """The standard lab topology, up for the whole guest session: LUNS iSCSI
    LVs/targets/initiators logged in, NVME_NAMESPACES NVMe/TCP subsystems
    connected, on the QEMU-throttled disk.  Yields topology.up()'s dict."""
    if topo_mod.status() is not None:
        topo_mod.down()
    t = topo_mod.up(luns=LUNS, nvme=NVME_NAMESPACES)
    print(f"topology up: {t['timings_s']}")
    yield t
    topo_mod.down()


class Guest:
    """Helpers for guest-side tests (the `guest` fixture)."""

    @staticmethod
    def run(cmd, check=True, timeout=120, **kw) -> subprocess.CompletedProcess:
        """subprocess.run with text output; a failure shows the command's output.  timeout:
        what the command needs on an idle host (labkit.speed stretches it)."""
        from labkit import speed

        p = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=speed.budget(timeout),
            **kw,
        )
        if check and p.returncode != 0:
            pytest.fail(f"{shlex.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout}")
        return p

    def fio(self, *args, timeout=120) -> dict:
        """Run fio with --output-format=json; returns the parsed report."""
        # cwd /tmp: fio leaves *.state files in its working directory
        from labkit import fio

        cmd = ["fio", "--output-format=json", "--verify_state_save=0", *args]
        return fio.parse(self.run(cmd, timeout=timeout, cwd="/tmp").stdout)

    def fio_write_verify(self, dev: str, size: int) -> dict:
        """64k random writes of `size` bytes with crc32c, then fio's read-back verify
        pass (a mismatch is fatal); returns fio's job report."""
        r = self.fio(
            "--name=verify",
            f"--filename={dev}",
            "--direct=1",
            "--ioengine=libaio",
            "--rw=randwrite",
            "--bs=64k",
            "--iodepth=4",
            f"--size={size}",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        )
        return r["jobs"][0]

    def nstat(self, netns: str | None = None) -> dict[str, int]:
        """Absolute SNMP/netstat counters (nstat -saz) of a network namespace."""
        cmd = ["nstat", "-saz"]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        out = {}
        for line in self.run(cmd).stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
        return out


@pytest.fixture(scope="session")
def guest() -> Guest:
    """Helpers to run commands, fio and nstat in the guest (guest only)."""
    if not IN_GUEST:
        pytest.skip("lab fixtures run inside the lab guest only")
    return Guest()


def pytest_generate_tests(metafunc):
    """`lun` parametrizes a test over the topology's iSCSI LUNs (0..LUNS-1),
    `nvme_ns` over its NVMe/TCP namespaces."""
    if "lun" in metafunc.fixturenames:
        metafunc.parametrize("lun", range(LUNS), ids=[f"lun{k}" for k in range(LUNS)])
    if "nvme_ns" in metafunc.fixturenames:
        metafunc.parametrize(
            "nvme_ns", range(NVME_NAMESPACES), ids=[f"nvme{k}" for k in range(NVME_NAMESPACES)]
        )
