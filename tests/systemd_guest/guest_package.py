#!/usr/bin/env python3
"""In the systemd guest (vagrant/qemu/systemd_guest.py): the Debian package's life on a target.

Run by tests/systemd_guest/test_package_systemd.py as the guest's command, with
Debian's python3 and the standard library (and the lab kit's speed measure, from
the checkout).  Each step records what it saw in /shared/work/package.json (written
after every step: a step that hangs leaves the ones before it); the host's tests
judge them.  The steps, in order:

    install   apt-get install ./santhrottle_*.deb with no network (its dependencies
              from the image's apt cache); the unit installed, not enabled, not running
    start     the configuration written (a dummy device, one resource), santhrottled
              --check, systemctl enable --now; a pin through the CLI reaches the kernel
    reload    systemctl reload with a good file (same PID, the new threshold), then
              with a broken one (fails; same PID; the good configuration stays)
    kill      kill -9 of the main PID: Restart= brings it back, the pin in the kernel
    faults    the fault campaign's rows under systemd, FAULT_REPS times each: kill -9,
              systemctl restart, systemctl reload with a broken file
    journal   journalctl -u santhrottled -o json: the fields of its entries
    stop      systemctl stop: nothing of santhrottle left in the kernel
    remove    apt-get remove: the daemon stopped, its files gone but the conffile
    purge     apt-get purge: the configuration and the runtime state gone too

Waits are budgets on an idle host stretched by the guest's measured speed (labkit.speed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(os.environ.get("SANTHROTTLE_LAB_CHECKOUT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(CHECKOUT / "vagrant"))
from labkit import speed  # noqa: E402  (the lab kit, from the checkout)

WORK = Path(os.environ.get("SANTHROTTLE_LAB_WORK", "/shared/work"))
OUT = WORK / "package.json"
DEB = Path(os.environ["SANTHROTTLE_DEB"])
CONF = Path("/etc/santhrottle/santhrottle.toml")
SOCKET = "/run/santhrottle/control.sock"
DEV = "st0"
PIN = "10.77.7.7"
# each row once here (make test); make lab-faults repeats them (vagrant/experiments/faults.py)
FAULT_REPS = 1
UNIT = "santhrottled"
TICK_FROM = "import santhrottle.controller.decide as s; print(s.__file__)"

obs: dict[str, object] = {}


def sh(*cmd: str, timeout_s: float = 120.0, input_text: str | None = None) -> dict:
    """One command: its exit status and output (never raises)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, input=input_text,
                           timeout=speed.factor() * timeout_s, check=False)  # fmt: skip
        out = {"rc": p.returncode, "out": p.stdout, "err": p.stderr}
    except subprocess.TimeoutExpired:
        out = {"rc": None, "out": "", "err": f"timed out after {timeout_s} s x factor"}
    except OSError as e:  # no such program
        out = {"rc": None, "out": "", "err": f"{cmd[0]}: {e}"}
    out["s"] = round(time.monotonic() - t0, 2)
    print(f"$ {' '.join(cmd)} -> {out['rc']} ({out['s']} s)", flush=True)
    return out


def save() -> None:
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(obs, indent=1, sort_keys=True))
    tmp.rename(OUT)


def wait_for(pred, base_s: float) -> float | None:
    """Seconds until pred() holds, or None after base_s stretched by the guest's speed."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < base_s * speed.factor():
        if pred():
            return round(time.monotonic() - t0, 2)
        time.sleep(0.2)
    return None


def prop(name: str) -> str:
    return sh("systemctl", "show", "-P", name, UNIT)["out"].strip()


def main_pid() -> int:
    try:
        return int(prop("MainPID"))
    except ValueError:
        return 0


def status() -> dict:
    # by the socket's path: the CLI reads it from the configuration file otherwise, and
    # refuses (exit 2) while a broken file waits to be refused by a reload
    p = sh("santhrottle", "status", "--json", "--socket", SOCKET)
    try:
        return json.loads(p["out"])["data"] if p["rc"] == 0 else {}
    except ValueError:
        return {}


def threshold_s() -> float | None:
    """r0's threshold in force (None: the daemon does not answer)."""
    for r in status().get("resources", []):
        if r.get("resource") == "r0":
            return (r.get("threshold") or {}).get("in_force_s")
    return None


def kernel() -> dict:
    """What santhrottle may have put in the kernel, as the system's tools print it."""
    return {
        "tc": sh("tc", "qdisc", "show", "dev", DEV)["out"],
        "ipset": sh("ipset", "list", "-n")["out"],
        "iptables": sh("iptables-save", "-t", "mangle")["out"],
        "ip6tables": sh("ip6tables-save", "-t", "mangle")["out"],
        "nft": sh("nft", "list", "ruleset")["out"],
    }


def pin_in_kernel() -> bool:
    """The pin is a member of one of santhrottle's sets."""
    for name in sh("ipset", "list", "-n")["out"].split():
        if name.startswith("santhrottle") and sh("ipset", "test", name, PIN)["rc"] == 0:
            return True
    return False


def config(threshold: str) -> str:
    return (
        f'[datapath]\ndevices = ["{DEV}"]\n\n'
        f'[resources.r0]\ndevices = ["vda"]\nthreshold = "{threshold}"\n'
    )


def write_config(text: str) -> None:
    CONF.write_text(text)


def active() -> bool:
    return sh("systemctl", "is-active", UNIT)["out"].strip() == "active"


# ------------------------------------------------------------------------ steps
def step_install() -> None:
    p = sh("apt-get", "install", "-y", "-q", str(DEB), timeout_s=600)
    obs["install"] = {
        "apt": p,
        "status": sh("dpkg-query", "-W", "-f=${Status} ${Version}", "santhrottle")["out"],
        "files": sh("dpkg", "-L", "santhrottle")["out"].split(),
        "conffiles": sh("dpkg-query", "-W", "-f=${Conffiles}", "santhrottle")["out"],
        "enabled": sh("systemctl", "is-enabled", UNIT)["out"].strip(),
        "active": sh("systemctl", "is-active", UNIT)["out"].strip(),
        # --man=no: the guest has no man-db (the pages are checked below)
        "verify": sh("systemd-analyze", "verify", "--man=no", f"{UNIT}.service"),
        "tick_from": sh("python3", "-c", TICK_FROM)["out"].strip(),
        "help": sh("systemctl", "show", "-P", "Documentation", UNIT)["out"].strip(),
        # the guest has no man-db: where the page is
        "man": " ".join(str(f) for f in Path("/usr/share/man/man8").glob("santhrottled.8*")),
    }


def step_start() -> None:
    for cmd in (("ip", "link", "add", DEV, "type", "dummy"), ("ip", "link", "set", DEV, "up"),
                ("ip", "addr", "add", "10.77.0.1/24", "dev", DEV)):  # fmt: skip
        sh(*cmd)
    write_config(config("15ms"))
    check = sh("santhrottled", "--check")
    start = sh("systemctl", "enable", "--now", UNIT, timeout_s=180)
    up = wait_for(lambda: threshold_s() is not None, 60)
    pin = sh("santhrottle", "pin", PIN, "--delay", "5ms")
    obs["start"] = {
        "check": check, "enable": start, "up_s": up, "pid": main_pid(),
        "active": active(), "enabled": sh("systemctl", "is-enabled", UNIT)["out"].strip(),
        "threshold_s": threshold_s(), "pin": pin,
        "pin_in_kernel_s": wait_for(pin_in_kernel, 10), "kernel": kernel(),
        "datapath": sh("santhrottle", "datapath", "show", "--json")["out"],
    }  # fmt: skip


def reload_broken(text: str) -> dict:
    """systemctl reload with a file the daemon must refuse; the good one back after."""
    pid = main_pid()
    good = CONF.read_text()
    write_config(text)
    p = sh("systemctl", "reload", UNIT, timeout_s=60)
    out = {"reload": p, "same_pid": main_pid() == pid, "active": active(),
           "threshold_s": threshold_s(),
           "journal": sh("journalctl", "-u", UNIT, "-n", "20", "--no-pager")["out"]}  # fmt: skip
    write_config(good)
    return out


def step_reload() -> None:
    pid = main_pid()
    write_config(config("20ms"))
    good = sh("systemctl", "reload", UNIT, timeout_s=60)
    seen = wait_for(lambda: threshold_s() == 0.02, 20)
    obs["reload"] = {
        "good": good, "good_seen_s": seen, "good_same_pid": main_pid() == pid,
        "broken": reload_broken("[datapath\ndevices = \n"),
        "empty": reload_broken(""),
        "after": {"threshold_s": threshold_s(), "pid": main_pid(), "pin": pin_in_kernel(),
                  "counters": status().get("counters", {})},
    }  # fmt: skip


def kill9() -> dict:
    pid, restarts = main_pid(), int(prop("NRestarts") or 0)
    sh("kill", "-9", str(pid))
    back = wait_for(lambda: active() and main_pid() not in (0, pid) and threshold_s() is not None,
                    60)  # fmt: skip
    return {"old_pid": pid, "new_pid": main_pid(), "back_s": back,
            "restarts": int(prop("NRestarts") or 0) - restarts,
            "pin_in_kernel_s": wait_for(pin_in_kernel, 10),
            "pins": [i.get("initiator") for i in status().get("initiators", []) if i.get("pinned")],
            "kernel": kernel()}  # fmt: skip


def step_kill() -> None:
    obs["kill"] = kill9()


def step_faults() -> None:
    rows: dict[str, list] = {"kill": [], "restart": [], "reload_broken": []}
    for _ in range(FAULT_REPS):
        rows["kill"].append(kill9())
        pid = main_pid()
        p = sh("systemctl", "restart", UNIT, timeout_s=120)
        back = wait_for(lambda: active() and threshold_s() is not None, 60)
        rows["restart"].append({"restart": p, "old_pid": pid, "new_pid": main_pid(),
                                "back_s": back, "pin_in_kernel_s": wait_for(pin_in_kernel, 10),
                                "kernel": kernel()})  # fmt: skip
        rows["reload_broken"].append(reload_broken("threshold = 15ms\n[resources\n"))
    obs["faults"] = rows


def step_journal() -> None:
    p = sh("journalctl", "-u", UNIT, "-o", "json", "--no-pager")
    entries = []
    for line in p["out"].splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    fields: dict[str, int] = {}
    for e in entries:
        for k in e:
            fields[k] = fields.get(k, 0) + 1
    ours = [{k: v for k, v in e.items() if not k.startswith("__")} for e in entries
            if e.get("SYSLOG_IDENTIFIER") in ("santhrottled", "santhrottle")]  # fmt: skip
    obs["journal"] = {
        "entries": len(entries),
        "fields": fields,
        # every audit record, and the daemon's last other lines
        "daemon": [e for e in ours if "SANTHROTTLE_EVENT" in e]
        + [e for e in ours if "SANTHROTTLE_EVENT" not in e][-100:],
    }


def step_stop() -> None:
    since = f"@{int(time.time()) - 1}"
    p = sh("systemctl", "stop", UNIT, timeout_s=120)
    obs["stop"] = {"stop": p, "active": sh("systemctl", "is-active", UNIT)["out"].strip(),
                   "kernel": kernel(),
                   "processes": sh("pgrep", "-f", "santhrottled")["out"],
                   # how the daemon ended, its ExecStopPost (start and stop times), what they said
                   "result": {k: prop(k) for k in ("Result", "ExecMainCode", "ExecMainStatus",
                                                   "ExecStopPost", "TimeoutStopUSec")},
                   "journal": sh("journalctl", "-u", UNIT, "--since", since,
                                 "-o", "short-monotonic", "--no-pager")["out"][-6000:]}  # fmt: skip


def step_remove() -> None:
    start = sh("systemctl", "start", UNIT, timeout_s=180)
    wait_for(lambda: threshold_s() is not None, 60)
    pinned = sh("santhrottle", "pin", PIN, "--delay", "5ms")
    p = sh("apt-get", "remove", "-y", "-q", "santhrottle", timeout_s=300)
    obs["remove"] = {
        "start": start, "pin": pinned, "apt": p,
        "status": sh("dpkg-query", "-W", "-f=${Status}", "santhrottle")["out"],
        "processes": sh("pgrep", "-f", "santhrottled")["out"],
        "kernel": kernel(),
        "unit": sh("systemctl", "cat", f"{UNIT}.service")["rc"],
        "left": sorted(str(p) for p in (Path("/usr/bin/santhrottled"), Path("/usr/bin/santhrottle"),
                                        Path("/lib/systemd/system/santhrottled.service"),
                                        Path("/usr/lib/python3/dist-packages/santhrottle"),
                                        CONF, Path("/var/lib/santhrottle"))
                       if p.exists()),
    }  # fmt: skip


def step_purge() -> None:
    p = sh("apt-get", "purge", "-y", "-q", "santhrottle", timeout_s=300)
    obs["purge"] = {
        "apt": p,
        "status": sh("dpkg-query", "-W", "-f=${Status}", "santhrottle"),
        "left": sorted(str(p) for p in (Path("/etc/santhrottle"), Path("/var/lib/santhrottle"),
                                        Path("/run/santhrottle"),
                                        Path("/etc/systemd/system/multi-user.target.wants/"
                                             "santhrottled.service"))
                       if p.exists() or p.is_symlink()),
        "unit_files": sh("systemctl", "list-unit-files", "santhrottled*")["out"],
        "kernel": kernel(),
    }  # fmt: skip


STEPS = (step_install, step_start, step_reload, step_kill, step_faults, step_journal,
         step_stop, step_remove, step_purge)  # fmt: skip


def main() -> int:
    obs["factor"] = round(speed.factor(), 2)
    obs["done"] = []
    save()
    for step in STEPS:
        t0 = time.monotonic()
        try:
            step()
        except Exception as e:  # recorded for the host's tests, and the next steps run
            obs.setdefault("errors", {})[step.__name__] = repr(e)
        obs["done"].append([step.__name__, round(time.monotonic() - t0, 1)])
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
