#!/usr/bin/env python3
"""In each guest of a systemd guest pair: the role's fleet of two (tests_fleet.yml).

Run by tests/systemd_guest/test_fleet_systemd.py as the command of both guests of
vagrant/qemu/systemd_guest.py's run_pair (guest 1 is the appliance gw-a, guest 2
gw-b).  Each guest, against itself (`-c local`), with the Debian package of the
checkout:
  1. sets its address on the pair's link (the card with its MAC, 10.77.0.N/24);
  2. runs tests_fleet.yml: gw-a is in the inventory groups etcd and
     fleet_appliances (the etcd member, then the appliance), gw-b in
     fleet_appliances only (its play waits for gw-a's member); the playbook
     checks that its appliance sees both and a leader of r0;
  3. once both have run, reads its daemon's fleet status (the host compares the
     two: the same appliances, leader and epoch);
  4. with --full (make lab-systemd), gw-a runs the playbook again (both roles: it
     must change nothing; gw-b's second run would repeat gw-a's role with the same
     variables);
  5. the leader of r0 stops santhrottled (`systemctl stop`); the other must lead
     r0 with a newer epoch, alone in the fleet.
The guests wait for each other through files in /shared/pair (tell/hear), each wait
bounded by an idle host's time stretched by the guest's measured speed (measured
again while it waits: a host that slows down slows both guests); a guest that
fails says so there, so that the other stops waiting.  What each saw goes to
/shared/work/fleet.json (written after every step); the host's test judges it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported
import guest_role  # this folder's: one playbook run and its recap
from guest_role import WORK, speed

OUT = WORK / "fleet.json"
PAIR = Path(os.environ.get("SANTHROTTLE_LAB_PAIR", "/shared/pair"))
APPLIANCES = ("gw-a", "gw-b")  # guest 1, guest 2
PLAYBOOK = "tests_fleet.yml"
# Budgets on an idle host, stretched by the guest's measured speed (labkit.speed).
# (one vCPU each, 2026-11-29, a host with others' load and two busy loops: the first
# runs 491-683 s, the second 230-399 s)
FIRST_RUN_BUDGET_S = 600  # the etcd member and the role from the package
AGAIN_BUDGET_S = 400  # the second run
# A wait for the other guest's step: longer than that step's own limit (which the
# other guest keeps, and then says that it failed), as the two guests' speeds differ.
PEER_SLACK = 2
WAIT_BUDGET_S = 300  # the playbook's waits: the member's port, the fleet's view
STEP_BUDGET_S = 120  # a barrier between two short steps, the link's card
FAILOVER_BUDGET_S = 30  # the follower leads r0 after the leader's stop (+ the lease)
# [fleet] lease_ttl: LEASE_TTL_S on an idle host, more on a slow one.  The default 1 s
# would expire whenever a guest's daemon stalls behind ansible on its single vCPU.
LEASE_TTL_S = 5
POLL_S = 0.5
REMEASURE_S = 30  # a wait for the other guest measures this guest's speed again so often


class PeerGone(Exception):
    """The other guest failed, or did not reach a step in time."""


def inventory(index: int, etcd_address: str) -> dict:
    """The inventory of guest ``index`` (1 or 2): itself, local; guest 1 is also the
    cluster's only etcd member (santhrottle_etcd_address on the pair's link)."""
    name = APPLIANCES[index - 1]
    groups: dict = {"fleet_appliances": {"hosts": {name: {}}}}
    if index == 1:
        groups["etcd"] = {"hosts": {name: {"santhrottle_etcd_address": etcd_address}}}
    local = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    return {"all": {"hosts": {name: local}, "children": groups}}


def lease_ttl_s(factor: float) -> int:
    return max(LEASE_TTL_S, math.ceil(LEASE_TTL_S * factor))


def view_problem(view: dict, appliances: list[str]) -> str | None:
    """What is wrong with one appliance's fleet status (its `fleet status --json` data)
    for a fleet of ``appliances`` where r0 has one leader among them; None if nothing."""
    if view.get("mode") != "fleet":
        return f"mode {view.get('mode')!r}, not fleet ({view.get('reason')})"
    if view.get("appliances") != appliances:
        return f"appliances {view.get('appliances')}, not {appliances}"
    lead = (view.get("leaders") or {}).get("r0")
    if not lead or lead.get("appliance") not in appliances:
        return f"r0's leader {lead}, not one of {appliances}"
    mine = lead["appliance"] == view.get("appliance")
    if (view.get("leading") == ["r0"]) != mine:
        return f"leads {view.get('leading')}, but r0's leader is {lead['appliance']}"
    return None


def fleet_status() -> dict:
    p = subprocess.run(["santhrottle", "fleet", "status", "--json"], capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-500:]}
    data: dict = json.loads(p.stdout)["data"]
    return data


def until(check, budget_s: float, what: str) -> tuple[dict, float]:
    """fleet_status() until check(view) is None: (the view, seconds taken)."""
    t0 = time.monotonic()
    limit_s = budget_s * speed.factor(fresh=True)
    while True:
        view = fleet_status()
        why = check(view) if "error" not in view else view["error"]
        if why is None:
            return view, round(time.monotonic() - t0, 2)
        if time.monotonic() - t0 > limit_s:
            raise AssertionError(f"{what}: not within {limit_s:.0f} s (last: {why})")
        time.sleep(POLL_S)


class Pair:
    """This guest's side of the barriers: files STEP-N.json in /shared/pair."""

    def __init__(self, index: int, folder: Path = PAIR) -> None:
        self.me, self.other, self.folder = index, 3 - index, folder

    def tell(self, step: str, data: object = None) -> None:
        tmp = self.folder / f".{step}-{self.me}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.rename(self.folder / f"{step}-{self.me}.json")

    def hear(self, step: str, budget_s: float) -> object:
        """What the other guest told at ``step`` (PeerGone if it failed or is late)."""
        t0 = measured = time.monotonic()
        limit_s = budget_s * speed.factor()
        path, failed = (self.folder / f"{x}-{self.other}.json" for x in (step, "failed"))
        while not path.is_file():
            if failed.is_file():
                raise PeerGone(f"guest {self.other} failed: {json.loads(failed.read_text())}")
            now = time.monotonic()
            if now - measured > REMEASURE_S:  # a host that slows down slows the other too
                limit_s, measured = budget_s * speed.factor(fresh=True), now
            if now - t0 > limit_s:
                raise PeerGone(f"guest {self.other} did not reach {step} within {limit_s:.0f} s")
            time.sleep(POLL_S)
        return json.loads(path.read_text())


def link_up(mac: str, address: str, budget_s: float) -> str:
    """The name of the card with ``mac``, once it has ``address`` and is up."""
    # udev loads virtio_net for the card (its modalias); load it anyway, then let udev
    # give the card its name
    subprocess.run(["modprobe", "virtio_net"], check=False, capture_output=True, timeout=120)
    subprocess.run(["udevadm", "settle"], check=False, timeout=120)
    t0 = time.monotonic()
    while True:
        names = [d.name for d in Path("/sys/class/net").iterdir()
                 if (d / "address").read_text().strip() == mac]  # fmt: skip
        if names:
            break
        if time.monotonic() - t0 > budget_s * speed.factor():
            raise AssertionError(f"no network card with MAC {mac} (virtio_net not loaded?)")
        time.sleep(POLL_S)
    for cmd in (["ip", "addr", "add", address, "dev", names[0]],
                ["ip", "link", "set", names[0], "up"]):  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return names[0]


def _save(obs: dict) -> None:
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(obs, indent=1))
    tmp.rename(OUT)


def _passed(r: dict) -> bool:
    return r["rc"] == 0 and bool(r["recap"]) and r["recap"]["failed"] == 0


def steps(obs: dict, pair: Pair, again: bool) -> None:
    index = pair.me
    name, other = APPLIANCES[index - 1], APPLIANCES[pair.other - 1]
    etcd = os.environ["SANTHROTTLE_PAIR_PEER" if index == 2 else "SANTHROTTLE_PAIR_ADDRESS"]
    etcd = etcd.split("/")[0]
    obs["link"] = link_up(os.environ["SANTHROTTLE_PAIR_MAC"],
                          os.environ["SANTHROTTLE_PAIR_ADDRESS"], STEP_BUDGET_S)  # fmt: skip
    inv = Path("/tmp/ansible/inventory.yml")
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(json.dumps(inventory(index, etcd)))
    extra = {
        "santhrottle_test_etcd": etcd,
        "santhrottle_test_wait_s": round(WAIT_BUDGET_S * speed.factor(fresh=True)),
        "santhrottle_test_lease_ttl": f"{obs['lease_ttl_s']}s",
    }

    def playbook(label: str, budget_s: float) -> None:
        r = guest_role.run(label, PLAYBOOK, (), str(inv), extra, budget_s)
        obs["runs"][label] = r
        _save(obs)
        if not _passed(r):
            raise AssertionError(f"the {label} run failed (rc {r['rc']}, {r['recap']})")

    def in_fleet(v: dict) -> str | None:
        return view_problem(v, list(APPLIANCES))

    playbook("first", FIRST_RUN_BUDGET_S)
    # both appliances run: what each sees of the fleet, at about the same time
    pair.tell("converged")
    pair.hear("converged", PEER_SLACK * FIRST_RUN_BUDGET_S)
    obs["view"], _ = until(in_fleet, STEP_BUDGET_S, "both appliances in the fleet")
    _save(obs)
    pair.tell("viewed", obs["view"])
    obs["peer_view"] = pair.hear("viewed", STEP_BUDGET_S)
    # the second run, a full run's (--full); gw-b's would be the same role with the same
    # variables as gw-a's
    if again and index == 1:
        playbook("again", AGAIN_BUDGET_S)
        pair.tell("again")
    elif again:
        pair.hear("again", PEER_SLACK * AGAIN_BUDGET_S)
    # the failover: guest 1 says who leads r0 now; that one stops, the other takes over
    if index == 1:
        now, _ = until(in_fleet, STEP_BUDGET_S, "both appliances in the fleet")
        pair.tell("leader", now)
    else:
        now = pair.hear("leader", STEP_BUDGET_S)
    lead = now["leaders"]["r0"]
    if lead["appliance"] == name:
        p = subprocess.run(["systemctl", "stop", "santhrottled"], capture_output=True,
                           text=True, timeout=300, check=False)  # fmt: skip
        obs["stopped"] = {"rc": p.returncode, "err": p.stderr.strip()}
        pair.tell("stopped")
        # etcd (guest 1's) and this guest stay up until the other is done
        obs["failover"] = pair.hear("failover", STEP_BUDGET_S + FAILOVER_BUDGET_S)
        return
    pair.hear("stopped", STEP_BUDGET_S)

    def leads_alone(v: dict) -> str | None:
        r0 = v["leaders"].get("r0") or {}
        if v["leading"] != ["r0"] or r0.get("epoch", 0) <= lead["epoch"]:
            return f"leads {v['leading']}, r0's leader {r0}"
        return None if v["appliances"] == [name] else f"appliances {v['appliances']}"

    view, took = until(leads_alone, FAILOVER_BUDGET_S + obs["lease_ttl_s"],
                       f"{name} leads r0 alone after {other}'s stop")  # fmt: skip
    obs["failover"] = {"appliance": name, "took_s": took, "before": lead, "view": view}
    pair.tell("failover", obs["failover"])


def main() -> int:
    index = int(os.environ["SANTHROTTLE_PAIR_INDEX"])
    pair = Pair(index)
    factor = speed.factor()
    obs: dict = {"factor": round(factor, 2), "appliance": APPLIANCES[index - 1],
                 "lease_ttl_s": lease_ttl_s(factor), "runs": {}}  # fmt: skip
    t0 = time.monotonic()
    try:
        steps(obs, pair, again="--full" in sys.argv[1:])
    except (AssertionError, PeerGone, OSError, subprocess.SubprocessError, KeyError) as e:
        obs["error"] = f"{type(e).__name__}: {e}"
        try:
            pair.tell("failed", obs["error"])
        except OSError as told:
            obs["error"] += f" (and the other guest could not be told: {told})"
    obs["journal"] = subprocess.run(
        ["journalctl", "-u", "santhrottled", "-u", "etcd", "-n", "60", "--no-pager"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    obs["wall_s"] = round(time.monotonic() - t0, 1)
    _save(obs)
    print(f"{obs['appliance']}: {obs.get('error') or 'done'} after {obs['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
