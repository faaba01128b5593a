#!/usr/bin/env python3
"""In the systemd guest: the Ansible role's tests (ansible/roles/santhrottle/tests/tests_*.yml).

Run by tests/systemd_guest/test_role_systemd.py as the guest's command.  Each test
playbook runs with the guest's ansible-core (Debian's) against the guest itself
(`-c local`), with the Debian package of the checkout (santhrottle_deb); RUNS says
which, in which order, how often and with which options.  What each run printed and
its recap go to /shared/work/role.json (written after every run); the host's tests
judge them.  Each run's limit is an idle host's stretched by the guest's measured
speed (labkit.speed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(os.environ.get("SANTHROTTLE_LAB_CHECKOUT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(CHECKOUT / "vagrant"))
from labkit import speed  # noqa: E402  (the lab kit, from the checkout)

WORK = Path(os.environ.get("SANTHROTTLE_LAB_WORK", "/shared/work"))
OUT = WORK / "role.json"
ANSIBLE = CHECKOUT / "ansible"
TESTS = ANSIBLE / "roles" / "santhrottle" / "tests"
# (label, playbook, extra options): in this order, on the same guest.
RUNS = (
    ("default", "tests_default.yml", ()),
    ("control", "tests_control.yml", ()),
    ("control-again", "tests_control.yml", ()),
    ("check-mode", "tests_check_mode.yml", ("--check", "--diff")),
    ("negative", "tests_negative.yml", ()),
)
# with --full (make lab-systemd: labkit.host's FULL_RUN), after RUNS
FULL_RUNS = (("reload", "tests_reload.yml", ()), ("restart", "tests_restart.yml", ()))
RUN_BUDGET_S = 400  # one run on an idle host: 60-120 s
RECAP = re.compile(
    r"^[\w.-]+\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)",
    re.M,
)


def run(
    label: str,
    playbook: str,
    options: tuple[str, ...],
    inventory: str = "localhost,",
    extra: dict | None = None,
    budget_s: float = RUN_BUDGET_S,
) -> dict:
    """One run of a test playbook against the guest itself; extra: more -e variables."""
    tmp = Path("/tmp/ansible") / label
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp / "remote"),
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
    }
    more = ["-e", json.dumps(extra)] if extra else []
    deb = os.environ["SANTHROTTLE_DEB"]
    cmd = ["ansible-playbook", "-c", "local", "-i", inventory,
           "-e", "ansible_python_interpreter=/usr/bin/python3",
           "-e", f"santhrottle_deb={deb}", *more, *options, str(TESTS / playbook)]  # fmt: skip
    t0 = time.monotonic()
    limit_s = budget_s * speed.factor(fresh=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp),
                           timeout=limit_s, check=False)  # fmt: skip
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = None, f"{e.stdout or ''}\ntimed out"
    wall = round(time.monotonic() - t0, 1)
    m = RECAP.search(out)
    recap = {k: int(v) for k, v in m.groupdict().items()} if m else None
    results = task_results(out)
    print(f"{label}: rc {rc}, {wall} s, {recap}", flush=True)
    # what the daemon said (a failed start's reason is there, not in the play's output)
    journal = subprocess.run(["journalctl", "-u", "santhrottled", "-n", "40", "--no-pager"],
                             capture_output=True, text=True, check=False).stdout  # fmt: skip
    return {"playbook": playbook, "options": list(options), "rc": rc, "wall_s": wall,
            "recap": recap, "results": results, "out": out[-12000:],
            "journal": journal}  # fmt: skip


def task_results(out: str) -> list[list[str]]:
    """[kind, name, first result word] of every task and handler, in order: kind TASK or
    HANDLER, the result ok, changed, skipping, failed, fatal, included..."""
    found = []
    for m in re.finditer(r"^(TASK|RUNNING HANDLER) \[([^\]]*)\] \**\n((?:(?!TASK \[|RUNNING "
                         r"HANDLER \[|PLAY ).*\n?)*)", out, re.M):  # fmt: skip
        kind = "HANDLER" if m[1] == "RUNNING HANDLER" else "TASK"
        words = re.findall(r"^(ok|changed|skipping|failed|fatal|included|rescued)\b", m[3], re.M)
        found.append([kind, m[2], words[0] if words else ""])
    return found


def main(args: list[str]) -> int:
    """args: --full (FULL_RUNS too), and the labels to run, none for all (by hand:
    systemd_guest.py run guest_role.py default control)."""
    full = "--full" in args
    only = [a for a in args if a != "--full"]
    obs: dict = {"factor": round(speed.factor(), 2), "runs": {}}
    for label, playbook, options in RUNS + (FULL_RUNS if full else ()):
        if only and label not in only:
            continue
        obs["runs"][label] = run(label, playbook, options)
        tmp = OUT.with_suffix(".tmp")
        tmp.write_text(json.dumps(obs, indent=1))
        tmp.rename(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
