"""The daemon as its unit runs it, and the campaign's six faults (vagrant/experiments/faults.py).

What it owns
    `Unit`: santhrottled started, killed and restarted the way
    systemd/santhrottled.service does it (Nice= of the unit, the guest's
    RLIMIT_NOFILE 1024 soft as systemd's default; after a crash
    ExecStopPost's `santhrottle cleanup --delays-only`, RestartSec, then
    ExecStartPre's `santhrottled --check`), one log file per start.
    `FAULTS`: name -> function(ctx, rep) -> dict with `start` and `end`
    (time.monotonic(): the fault's end is where "time to hold again" is
    counted from) and what the fault itself saw.

    baseline  nothing (the noise floor of every measurement)
    kill9     SIGKILL, then what systemd does until the new daemon answers
    hup       a broken config (five kinds, one per repetition), SIGHUP,
              restore the good file, SIGHUP; the end is the good reload
    link      the target's veth end (lab-tgt in netns tgt) down 5 s, up
    stall     every LV of the array's VG suspended (dmsetup) 10 s, resumed
    cli       1,000 `santhrottle status` in 10 waves of 100 (faults_clients.py)
    flood     5,000 idle connections on the control socket held 10 s (faults_clients.py)

Worked example
    ctx = Ctx(unit, topology, ...); r = FAULTS["link"](ctx, 0)
    -> {"start": 812.4, "end": 817.6, "down_s": 5.0, "tc_tree_after": True}
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faults_measure as m
from labkit.daemon import BIN, Daemon
from labkit.speed import budget

HERE = Path(__file__).resolve().parent
CLIENTS = HERE / "faults_clients.py"
RESTART_SEC_S = 2.0  # systemd/santhrottled.service RestartSec=
# The limits below are an idle host's guest's, stretched by how much slower the guest
# runs now (labkit.speed.budget): a kill9's cleanup takes ~12 s there, 86 s in a
# guest three times slower with the host's other core busy
READY_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
LINK_DOWN_S = 5.0
STALL_S = 10.0
CLI_WAVES, CLI_PER_WAVE = 10, 100
FLOOD_CONNECTIONS, FLOOD_HOLD_S = 5000, 10.0
FLOOD_TIMEOUT_S = 180.0
HUP_WAIT_S = 10.0  # for the daemon to say what it made of a reload
DM_ENV = {"DM_DISABLE_UDEV": "1"}  # no udev in the guest (labkit.topology)


class Unit(Daemon):
    """santhrottled under the campaign's hand, as systemd would run it: the kit's daemon
    (labkit.daemon) with one file (`conf`, which hup overwrites) and one log per start
    (santhrottled-N.log, followed by the campaign's LogTail)."""

    def __init__(self, config: dict, conf: Path, logdir: Path, env: dict, nice: int, tail) -> None:
        super().__init__("unit", config, logdir, nice=nice, env=env)
        self.conf, self.tail = conf, tail
        self.starts = 0

    def start(self, start_s: float | None = None) -> float:
        """Start and wait until the control socket answers; returns the seconds that took."""
        start_s = budget(READY_TIMEOUT_S) if start_s is None else start_s
        self.starts += 1
        self.log = self.workdir / f"santhrottled-{self.starts}.log"
        t0 = time.monotonic()
        self.launch()
        self.tail.follow(self.log)
        self.wait_up(start_s, start_s)
        return round(time.monotonic() - t0, 2)

    def tool(self, *args: str, daemon: bool = False, timeout: float | None = None):
        exe = BIN / ("santhrottled" if daemon else "santhrottle")
        limit = budget(TOOL_TIMEOUT_S) if timeout is None else timeout
        return m.run([str(exe), *args], timeout=limit, env=self.env)

    def stop(self, cleanup: str | None = "delays", timeout_s: float | None = None) -> dict:
        """SIGTERM (our own child, by PID), then the unit's ExecStopPost."""
        out: dict[str, Any] = {}
        if self.alive():
            limit = budget(STOP_TIMEOUT_S) if timeout_s is None else timeout_s
            out["exit"] = super().stop(cleanup=None, timeout_s=limit)
        p = self.tool("cleanup", "--delays-only", "--config", str(self.conf))
        out["cleanup"] = p.returncode
        return out


@dataclass
class Ctx:
    unit: Unit
    topology: dict
    topo_mod: Any
    good_config: str
    out: Path
    extra: dict = field(default_factory=dict)


def _now() -> float:
    return time.monotonic()


def baseline(c: Ctx, rep: int) -> dict:
    t = _now()
    return {"start": t, "end": t}


def kill9(c: Ctx, rep: int) -> dict:
    u = c.unit
    t0 = _now()
    os.kill(u.pid, signal.SIGKILL)  # our own child, by PID
    assert u.proc is not None
    u.proc.wait()
    left = m.kernel_members()
    t_c = _now()
    p = u.tool("cleanup", "--delays-only", "--config", str(c.unit.conf))  # ExecStopPost
    cleanup_s = round(_now() - t_c, 2)
    after = m.kernel_members()
    time.sleep(RESTART_SEC_S)
    t_c = _now()
    chk = u.tool("--check", "--config", str(c.unit.conf), daemon=True)  # ExecStartPre
    check_s = round(_now() - t_c, 2)
    ready_s = u.start()
    t1 = _now()
    return {
        "start": t0,
        "end": t1,
        "restart_s": round(t1 - t0, 2),
        "cleanup_s": cleanup_s,
        "check_s": check_s,
        "ready_s": ready_s,
        "members_left_by_kill": len(left),
        "members_after_cleanup": sorted(after),
        "cleanup_rc": p.returncode,
        "cleanup_err": p.stderr.strip()[-300:],
        "check_rc": chk.returncode,
        "check_err": chk.stderr.strip()[-300:],
    }


def broken_configs(good: str) -> list[tuple[str, bytes]]:
    """Five ways an admin's edit breaks the file, one per repetition."""
    other_sock = good.replace("control.sock", "other.sock")
    return [
        ("toml syntax error", ("[daemon\n" + good).encode()),
        ("bad duration", (good + '\n[resources.bad]\nthreshold = "fast"\n').encode()),
        ("array nested 500 deep", ("x = " + "[" * 500 + "]" * 500 + "\n" + good).encode()),
        ("restart key changed (control_socket)", other_sock.encode()),
        ("not UTF-8", b"\xff\xfe\x00garbage\n" + good.encode()),
    ]


def _counters(c: Ctx) -> dict:
    try:
        return m.ctl(c.unit.sock, timeout_s=5.0)["counters"]
    except Exception:
        return {}


def _wait(pred, timeout_s: float) -> bool:
    t0 = _now()
    while _now() - t0 < timeout_s:
        if pred():
            return True
        time.sleep(0.2)
    return False


def hup(c: Ctx, rep: int) -> dict:
    u = c.unit
    kind, text = broken_configs(c.good_config)[rep % 5]
    c0 = _counters(c)
    t0 = _now()
    u.conf.write_bytes(text)
    os.kill(u.pid, signal.SIGHUP)
    said = _wait(
        lambda: (
            _counters(c).get("reload_failures", 0) > c0.get("reload_failures", 0)
            or any("reload" in x or "Error" in x for x in u.tail.between(t0, _now()))
        ),
        HUP_WAIT_S,
    )
    c1 = _counters(c)
    lines = u.tail.between(t0, _now())
    alive_broken = u.alive()
    u.conf.write_text(c.good_config)
    os.kill(u.pid, signal.SIGHUP)
    good = _wait(lambda: _counters(c).get("reloads", 0) > c1.get("reloads", 0), HUP_WAIT_S)
    t1 = _now()
    return {
        "start": t0,
        "end": t1,
        "kind": kind,
        "daemon_said_something": said,
        "alive_after_broken": alive_broken,
        "alive": u.alive(),
        "reload_failures_counted": c1.get("reload_failures", 0) - c0.get("reload_failures", 0),
        "good_reload_taken": good,
        "log": [x[:200] for x in lines[-4:]],
    }


def link(c: Ctx, rep: int) -> dict:
    ns, dev = c.topology["netns"], c.topology["veth"]["target"]
    t0 = _now()
    m.run(["ip", "-n", ns, "link", "set", dev, "down"])
    t_down = _now()
    time.sleep(LINK_DOWN_S)
    t_up = _now()
    m.run(["ip", "-n", ns, "link", "set", dev, "up"])
    t1 = _now()
    tree = m.run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout
    return {
        "start": t0,
        "end": t1,
        "down_s": round(t_up - t_down, 2),
        "tc_tree_after": "htb 5374:" in tree,
    }


def stall(c: Ctx, rep: int) -> dict:
    names = [f"{c.topology['vg']}-{x['lv']}" for x in c.topology["iscsi"]]
    env = {**os.environ, **DM_ENV}
    t0 = _now()
    sus = [m.run(["dmsetup", "suspend", n], env=env) for n in names]
    t_sus = _now()
    time.sleep(STALL_S)
    res = [m.run(["dmsetup", "resume", "--noudevsync", n], env=env) for n in names]
    t1 = _now()
    errs = [p.stderr.strip() for p in sus + res if p.returncode]
    return {
        "start": t0,
        "end": t1,
        "suspend_s": round(t_sus - t0, 2),
        "stalled_s": round(t1 - t0, 2),
        "dm_errors": errs[:4],
    }


def _clients(c: Ctx, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CLIENTS), *args, "--socket", c.unit.sock],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=c.unit.env,
    )


def cli(c: Ctx, rep: int) -> dict:
    t0 = _now()
    p = _clients(c, "cli", "--waves", str(CLI_WAVES), "--per-wave", str(CLI_PER_WAVE))
    out, err = p.communicate(timeout=budget(CLI_WAVES * 130))
    t1 = _now()
    res = json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"error": err[-500:]}
    return {"start": t0, "end": t1, **res}


def flood(c: Ctx, rep: int) -> dict:
    before = m.proc_status(c.unit.pid)
    t0 = _now()
    p = _clients(c, "flood", "--n", str(FLOOD_CONNECTIONS), "--hold", str(FLOOD_HOLD_S))
    assert p.stdout is not None
    opened = json.loads(p.stdout.readline() or "{}")
    time.sleep(FLOOD_HOLD_S / 2)
    during = m.proc_status(c.unit.pid)
    try:
        probe_s: float | str = _now()
        m.ctl(c.unit.sock, timeout_s=10.0)
        probe_s = round(_now() - float(probe_s), 2)
    except Exception as e:
        probe_s = f"{type(e).__name__}: {e}"[:120]
    out, err = p.communicate(timeout=budget(FLOOD_TIMEOUT_S))
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    rel = lines[-1] if lines else {"error": err[-500:]}
    t1 = rel.get("released_t", _now())
    time.sleep(2.0)
    return {
        "start": t0,
        "end": t1,
        "opened": opened.get("opened"),
        "open_s": opened.get("open_s"),
        "eagain": opened.get("eagain"),
        "other_errors": opened.get("other_errors"),
        "closed_by_daemon": rel.get("closed_by_daemon"),
        "daemon_before": before,
        "daemon_during": during,
        "daemon_after": m.proc_status(c.unit.pid),
        "status_during_flood": probe_s,
    }


FAULTS = {
    "baseline": baseline,
    "kill9": kill9,
    "hup": hup,
    "link": link,
    "stall": stall,
    "cli": cli,
    "flood": flood,
}
