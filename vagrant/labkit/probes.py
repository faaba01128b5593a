"""What the lab reads in the guest: the readers the sampler's probes and the phases use.

What it owns
    One reader per source, each a function of its kernel path or namespace:

    diskstats(devices)   the product's parser (santhrottle.appliance.sensing.
                         diskstats) over /proc/diskstats: per device its counters
                         from `reads` on (labkit.analysis' positions), the devices
                         present only
    tcp_conns(netns, port), conn_retrans   `ss -ti` of the target's storage
                         connections: peer, min RTT, RTT, retransmissions, reordering
    nstat(netns)         the target's TCP counters that tell retransmissions apart
                         (absolute; differences are the caller's)
    guest_cpu()          the guest's CPU time by kind (/proc/stat's cpu line, ticks)
    proc_cpu(pid, task)  utime + stime of a process or one of its threads, ticks
    children(pid)        the processes pid started, with their names and states
                         (/proc/*/stat; the host's too: a session's QEMU)
    plant_stats()        the known plant's own counters (labkit.plant, read in the
                         guest from /shared/work/array-stats.json)
    sets_left(netns, bridge)   what a daemon's stop left of its member sets: on a
                         target host the ipsets, on a bridge the nftables maps that
                         still hold an element

Worked example
    diskstats(["dm-0"])() -> {"dm-0": [1520, 0, 12160, 6080, 0, 0, 0, 0, 0, 6100, 6080]}
    (a Probe's read: diskstats() returns the function that reads).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from labkit.analysis import conn_retrans as conn_retrans
from santhrottle.appliance.sensing.diskstats import DiskstatsReader

STORAGE_PORTS = {"iscsi": 3260, "nvme": 4420}
NSTAT_KEYS = (
    "TcpRetransSegs",
    "TcpExtTCPLossProbes",
    "TcpExtTCPFastRetrans",
    "TcpExtTCPTimeouts",
    # reordering the target's TCP noticed (SACK / timestamps) and the initiators'
    # DSACKs (a retransmission they already had: spurious)
    "TcpExtTCPSACKReorder",
    "TcpExtTCPTSReorder",
    "TcpExtTCPDSACKRecv",
    "TcpExtTCPSpuriousRTOs",
    "TcpExtTCPSlowStartRetrans",
    # a probe or retransmission timer that found its segment still in the target's own
    # qdisc (a netem class) and sent nothing (skb_still_in_host_queue); tail-loss probes
    # that repaired a real loss
    "TcpExtTCPSpuriousRtxHostQueues",
    "TcpExtTCPLossProbeRecovery",
)
# What `ss -ti` says of each connection: RACK's reordering window is min_rtt / 4 until the
# connection has seen reordering.
SS_FIELDS = re.compile(r"\b(minrtt|rtt|retrans|reord_seen|reordering):(\S+)")
GUEST_WORK = Path("/shared/work")
CPU_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def diskstats(devices: list[str], proc_root: str | Path = "/proc") -> Callable[[], dict]:
    """A probe's read: the devices' counters (from `reads` on), those present."""
    reader = DiskstatsReader(proc_root)

    def read() -> dict[str, list[int]]:
        devs = reader.snapshot().devices
        return {d: list(devs[d][3:]) for d in devices if d in devs}

    return read


def all_diskstats(proc_root: str | Path = "/proc") -> dict[str, list[int]]:
    """Every device's counters (from `reads` on).  The reader keeps its file open (the
    product's, for the daemon's life): closed here, as this one is read once (a phase's
    wait for the writers calls it in a loop)."""
    reader = DiskstatsReader(proc_root)
    try:
        return {n: list(c[3:]) for n, c in reader.snapshot().devices.items()}
    finally:
        reader.close()


def _ns(netns: str | None, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def tcp_conns(netns: str | None, port: int) -> list[dict[str, str]]:
    """The established connections of a local port: each {"peer": ..., ss -ti's fields}."""
    text = subprocess.run(
        _ns(netns, ["ss", "-tinH", "state", "established", f"( sport = :{port} )"]),
        capture_output=True,
        text=True,
    ).stdout
    conns: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            conns.append({"peer": line.split()[-1]})
        elif conns:
            conns[-1].update(SS_FIELDS.findall(line))
    return conns


def retrans(netns: str | None, port: int) -> Callable[[], dict[str, int]]:
    """A probe's read: initiator IP -> its connections' retransmissions so far."""
    return lambda: conn_retrans(tcp_conns(netns, port))


def nstat(netns: str | None, keys: tuple[str, ...] = NSTAT_KEYS) -> dict[str, int]:
    """The namespace's TCP counters (absolute), those of `keys` (0 when nstat lacks one)."""
    text = subprocess.run(_ns(netns, ["nstat", "-saz"]), capture_output=True, text=True).stdout
    vals = dict.fromkeys(keys, 0)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in vals:
            vals[parts[0]] = int(parts[1])
    return vals


def guest_cpu(proc_root: str | Path = "/proc") -> dict[str, int]:
    """The guest's CPU time by kind, in clock ticks (/proc/stat's cpu line)."""
    first = (Path(proc_root) / "stat").read_text().splitlines()[0].split()[1:]
    return dict(zip(CPU_KINDS, map(int, first), strict=False))


def busy_share(c0: dict[str, int], c1: dict[str, int]) -> float:
    """The share of the CPU busy between two guest_cpu() readings (not idle or iowait)."""
    d = {k: c1[k] - c0.get(k, 0) for k in c1}
    tot = sum(d.values())
    return 1 - (d.get("idle", 0) + d.get("iowait", 0)) / tot if tot else 0.0


def proc_cpu(
    pid: int | str, task: int | str | None = None, proc_root: str = "/proc", children: bool = False
) -> int:
    """utime + stime of a process (or one of its threads), in clock ticks; children: of
    the children it waited for (cutime + cstime) instead."""
    path = f"{proc_root}/{pid}/task/{task}/stat" if task is not None else f"{proc_root}/{pid}/stat"
    fields = _fields(Path(path).read_text())
    if children:
        return int(fields[13]) + int(fields[14])  # stat(5)'s 16th and 17th
    return int(fields[11]) + int(fields[12])  # stat(5)'s 14th and 15th


def _fields(stat: str) -> list[str]:
    """stat(5)'s fields after comm, the state first (a comm may hold ")")."""
    return stat.rpartition(")")[2].split()


def parent(pid: int, proc_root: str | Path = "/proc") -> int:
    """A process's parent; ProcessLookupError once it has ended."""
    try:
        return int(_fields((Path(proc_root) / str(pid) / "stat").read_text())[1])
    except OSError as e:
        raise ProcessLookupError(pid) from e


def children(pid: int, proc_root: str | Path = "/proc") -> list[tuple[int, str, str]]:
    """(pid, comm, state) of each process whose parent is pid, in pid order; a process
    that ends while being read is left out.  The state is stat(5)'s: "Z" a zombie."""
    found = []
    for stat in Path(proc_root).glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = _fields(text)
        if int(fields[1]) == pid:
            comm = text.partition("(")[2].rpartition(")")[0]
            found.append((int(stat.parent.name), comm, fields[0]))
    return sorted(found)


def plant_stats(path: Path = GUEST_WORK / "array-stats.json") -> dict | None:
    """The known plant's cumulative counters (vagrant/qemu/lqarray.py), or None."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def plant_config() -> dict | None:
    """The plant the guest was booted with (labkit.plant's spec, SANTHROTTLE_LAB_ARRAY)."""
    import os

    return json.loads(os.environ.get("SANTHROTTLE_LAB_ARRAY") or "null")


def sets_left(netns: str, bridge: bool) -> list[str]:
    """What a stop left of santhrottle's member sets: on a target host the ipsets, on a
    bridge the nftables maps that still hold an element."""
    if not bridge:
        names = subprocess.run(
            _ns(netns, ["ipset", "list", "-n"]), capture_output=True, text=True
        ).stdout.split()
        return [m for m in names if m.startswith("santhrottle")]
    text = subprocess.run(
        _ns(netns, ["nft", "-j", "list", "ruleset", "bridge"]), capture_output=True, text=True
    ).stdout
    items = json.loads(text or '{"nftables": []}')["nftables"]
    return [m["map"]["name"] for m in items if "map" in m and m["map"].get("elem")]
