"""The Ansible role applied for real, inside the lab guest, to the live LIO target.

`ansible-playbook -c local -i localhost, ansible/tests/lab.yml` (Debian's
ansible-core, the host's, seen through the guest's /usr) installs santhrottle
from the wheel in dist/ (`make wheel`; the guest has no network, so the
dependencies come from dist/wheelhouse) into /opt/santhrottle/venv, loads the
modules, writes santhrottle.toml with a threshold for the lab's VG and starts
santhrottled.  Then:

1. the daemon runs from the role's venv and `santhrottle status --json` (the
   role's CLI) shows the VG, in control, and the target's initiators;
2. a second run with a new threshold in the inventory changes nothing but the
   file, and reloads the daemon: same PID, the new threshold in `status`, one
   reload counted, no restart handler (every other task found as the first run
   left it: the role is idempotent).

What differs from a production target, and why: the guest runs no systemd
(PID 1 is a script), so `santhrottle_service_manager: direct` (the role's
santhrottle-service does what the unit does); its /var is an empty tmpfs, so
there is no dpkg database and `santhrottle_manage_packages: false` (the
packages are the host's, shared read-only; the unit tier checks the role's
package task against Debian's apt in check mode).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from labkit import speed

pytestmark = pytest.mark.lab
# two role runs take minutes under TCG: a guest of their own (tests/lab/conftest.py), in
# a full run only (make lab-test): 18-26 minutes of a 2-vCPU guest that CI's make test has
# no time for (the role's production path, the Debian package under systemd, stays in it:
# tests/systemd_guest/test_role_systemd.py)
LAB_GUEST = "rollout"
LAB_FULL_ONLY = True
# each test's time limit on an idle host (lab_guest_report.py): the first one's setup
# brings the topology up and runs the first playbook (up to 233 s there)
LAB_TEST_S = 900.0

CHECKOUT = Path(__file__).resolve().parents[2]
PLAYBOOK = CHECKOUT / "ansible" / "tests" / "lab.yml"
DIST = CHECKOUT / "dist"
ROLE_BIN = Path("/opt/santhrottle/venv/bin")
CONF = "/etc/santhrottle/santhrottle.toml"
SOCK = "/run/santhrottle/control.sock"
PIDFILE = Path("/run/santhrottle-service/santhrottled.pid")
# one ansible-playbook run on an idle host takes 60-120 s under TCG (the first, which
# installs, up to 233 s on a slow one); the limit grows with the guest's slowness now
PLAYBOOK_S = 600
ANSIBLE_PLAYBOOK = "/usr/bin/ansible-playbook"
# The wheel's packages and where their sources live in the checkout.
PACKAGE_DIRS = {
    "santhrottle/controller/": "controller/",
    "santhrottle/sim/": "sim/",
    "santhrottle/appliance/": "appliance/",
    "santhrottle/bridge/": "bridge/",
}
RECAP = re.compile(
    r"^localhost\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.M,
)


def _wheel_is_current() -> Path:
    """dist/'s wheel, built from the checkout as it is (else: run `make wheel`)."""
    wheels = sorted(DIST.glob("santhrottle-*.whl"))
    if len(wheels) != 1 or not (DIST / "santhrottle-wheelhouse.tar").is_file():
        pytest.fail(f"{DIST}: need one wheel and santhrottle-wheelhouse.tar: run `make wheel`")
    stale = []
    with zipfile.ZipFile(wheels[0]) as z:
        for name in z.namelist():
            for prefix, folder in PACKAGE_DIRS.items():
                if name.startswith(prefix):
                    src = CHECKOUT / folder / name[len(prefix) :]
                    if not src.is_file() or src.read_bytes() != z.read(name):
                        stale.append(name)
    if stale:
        pytest.fail(f"{wheels[0].name} is older than the checkout ({stale[:3]}): run `make wheel`")
    return wheels[0]


class Rollout:
    """ansible-playbook runs of the role against this guest."""

    def __init__(self, topology, work: Path) -> None:
        self.topology = topology
        self.work = work
        self.runs: list[tuple[str, float, dict]] = []

    def variables(self, threshold: str) -> dict:
        t = self.topology
        return {
            "santhrottle_enabled": True,
            "santhrottle_mode": "control",
            "santhrottle_service_manager": "direct",  # no systemd in the guest
            "santhrottle_manage_packages": False,  # no dpkg database in the guest
            "santhrottle_dist_dir": str(DIST),
            "santhrottle_netns": t["netns"],
            "santhrottle_datapath_devices": ["lab-tgt"],
            "santhrottle_link_speed": "10gbit",
            "santhrottle_resources": {t["vg"]: {"threshold": threshold}},
        }

    def apply(self, label: str, threshold: str) -> tuple[dict, str]:
        vf = self.work / f"{label}.json"
        vf.write_text(json.dumps(self.variables(threshold)))
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "ANSIBLE_CONFIG": str(CHECKOUT / "ansible" / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(self.work / "local"),
            "ANSIBLE_REMOTE_TEMP": str(self.work / "remote"),
            # gather the role's facts once, not on every run (TCG is slow)
            "ANSIBLE_CACHE_PLUGIN": "jsonfile",
            "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(self.work / "facts"),
            "ANSIBLE_LOG_PATH": str(self.work / "ansible.log"),
        }
        cmd = [
            ANSIBLE_PLAYBOOK,
            "-c",
            "local",
            "-i",
            "localhost,",
            "-e",
            "ansible_python_interpreter=/usr/bin/python3",
            "-e",
            f"@{vf}",
            str(PLAYBOOK),
        ]
        limit = speed.budget(PLAYBOOK_S)
        t0 = time.monotonic()
        p = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=limit,
            env=env,
            cwd=self.work,
        )
        wall = time.monotonic() - t0
        (self.work / f"{label}.log").write_text(p.stdout)
        m = RECAP.search(p.stdout)
        if p.returncode != 0 or m is None:
            pytest.fail(f"ansible-playbook ({label}) exited {p.returncode}:\n{p.stdout[-6000:]}")
        recap = {k: int(v) for k, v in m.groupdict().items()}
        self.runs.append((label, wall, recap))
        print(
            f"ansible-playbook {label}: {wall:.1f} s of its {limit:.0f} s limit "
            f"(margin {limit - wall:.0f} s), {recap}"
        )
        return recap, p.stdout


def _pid() -> int:
    return int(PIDFILE.read_text())


def _request(cmd: str) -> dict:
    """One control-socket request (what the CLI sends), without a new process."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(SOCK)
        s.sendall(json.dumps({"cmd": cmd, "args": {}}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply = json.loads(buf)
    assert reply["ok"], reply
    return reply["data"]


@pytest.fixture(scope="module")
def rollout(topology, tmp_path_factory):
    for need, pkg in (
        (ANSIBLE_PLAYBOOK, "ansible-core"),
        ("/usr/lib/python3/dist-packages/pip", "python3-pip"),
    ):
        if not Path(need).exists():
            pytest.fail(f"{need} missing: apt-get install {pkg} on the host (the guest's /usr)")
    _wheel_is_current()
    # the runs' logs (with timestamps) outlive the guest in the lab's work folder
    lab_work = os.environ.get("SANTHROTTLE_LAB_WORK")
    work = Path(lab_work) / "ansible" if lab_work else tmp_path_factory.mktemp("ansible")
    work.mkdir(parents=True, exist_ok=True)
    r = Rollout(topology, work)
    try:
        yield r
    finally:
        # stop as the unit would (ExecStopPost included), then take the data path away
        subprocess.run(
            [str(ROLE_BIN / "santhrottle-service"), "stop"],
            capture_output=True,
            timeout=speed.budget(120),
        )
        subprocess.run(
            [str(ROLE_BIN / "santhrottle"), "cleanup", "--config", CONF],
            capture_output=True,
            timeout=speed.budget(120),
        )
        for link in ("santhrottle", "santhrottled"):  # keep the other lab tests' PATH as it was
            Path("/usr/local/bin", link).unlink(missing_ok=True)
        total = sum(w for _, w, _ in r.runs)
        print(f"ansible runs: {[(lbl, round(w, 1)) for lbl, w, _ in r.runs]}, total {total:.1f} s")


@pytest.fixture(scope="module")
def first(rollout):
    recap, out = rollout.apply("first", "50ms")
    return recap, out, _pid()


def _handler(out: str, name: str) -> str | None:
    """The result line of a handler that ran (was notified), else None."""
    m = re.search(rf"RUNNING HANDLER \[santhrottle : {name}\] \**\n(\w+):", out)
    return m.group(1) if m else None


def _changed(out: str) -> list[str]:
    """The tasks and handlers a run changed, in order (a loop's once)."""
    names, name = [], None
    for line in out.splitlines():
        m = re.match(r"(?:TASK|RUNNING HANDLER) \[(.*)\] \**$", line)
        if m:
            name = m.group(1)
        elif name is not None and line.startswith("changed:"):
            names.append(name)
            name = None
    return names


def test_first_run_installs_from_the_wheel_and_starts_the_daemon(first, topology):
    recap, out, pid = first
    assert recap["failed"] == 0 and recap["changed"] > 0
    # the new code notified a restart and the new file a reload; both skipped:
    # the daemon was started by this very run
    assert _handler(out, "Restart santhrottled without systemd") == "skipping", out[-3000:]
    assert _handler(out, "Reload santhrottled without systemd") == "skipping", out[-3000:]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert str(ROLE_BIN / "santhrottled").encode() in cmdline, cmdline
    # installed from the wheel, not the checkout's editable install
    where = subprocess.run(
        [str(ROLE_BIN / "python"), "-c", "import santhrottle.appliance as a; print(a.__file__)"],
        capture_output=True,
        text=True,
        timeout=speed.budget(60),
    ).stdout.strip()
    assert where.startswith("/opt/santhrottle/venv/lib/"), where
    # the wheel's man pages and completions, linked where man and the shells look
    for page in ("man/man8/santhrottled.8", "man/man5/santhrottle.toml.5",
                 "bash-completion/completions/santhrottle"):  # fmt: skip
        assert (Path("/usr/local/share") / page).resolve().is_file(), page
    assert Path("/etc/modules-load.d/santhrottle.conf").read_text().count("sch_netem") == 1
    assert Path("/sys/module/sch_netem").is_dir()
    # the data path the daemon built, in the target's netns
    tc = subprocess.run(
        ["ip", "netns", "exec", topology["netns"], "tc", "qdisc", "show", "dev", "lab-tgt"],
        capture_output=True,
        text=True,
        timeout=speed.budget(30),
    ).stdout
    assert "htb" in tc and "netem" in tc, tc

    # the role's own CLI sees the target's resources and initiators
    want_inis = {x["initiator_ip"] for x in topology["iscsi"]}
    deadline = time.monotonic() + speed.budget(30)
    while not want_inis <= {i["initiator"] for i in _request("status")["initiators"]}:
        assert time.monotonic() < deadline, _request("status")
        time.sleep(0.5)
    p = subprocess.run(
        [str(ROLE_BIN / "santhrottle"), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=speed.budget(60),
    )
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)["data"]
    res = {r["resource"]: r for r in st["resources"]}
    vg = res[topology["vg"]]
    assert vg["mode"] == "control" and vg["threshold"]["threshold_s"] == 0.05, vg
    assert want_inis <= {i["initiator"] for i in st["initiators"]}
    assert not st["paused"] and st["counters"]["reloads"] == 0


def test_new_threshold_reloads_without_restart(first, rollout, topology):
    _, _, pid = first
    recap, out = rollout.apply("threshold", "40ms")
    assert recap["failed"] == 0
    # the file and the reload it notifies, nothing else: the venv, the wheels, the
    # links, the modules and the service script as the first run left them
    assert _changed(out) == [
        "santhrottle : Write santhrottle.toml",
        "santhrottle : Reload santhrottled without systemd",
    ], out[-3000:]
    assert _handler(out, "Restart santhrottled without systemd") is None, out[-3000:]
    assert _pid() == pid  # the same process
    deadline = time.monotonic() + speed.budget(10)  # SIGHUP reloads in a thread: wait for it
    while True:
        st = _request("status")
        vg = {r["resource"]: r for r in st["resources"]}[topology["vg"]]
        if vg["threshold"]["threshold_s"] == 0.04 and st["counters"]["reloads"] == 1:
            break
        assert time.monotonic() < deadline, (vg, st["counters"])
        time.sleep(0.2)
    assert st["counters"]["reload_failures"] == 0
    assert Path(f"/proc/{pid}").is_dir()
