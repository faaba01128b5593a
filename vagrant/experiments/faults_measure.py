"""What the fault campaign measures in the lab guest (vagrant/experiments/faults.py).

What it owns
    Every reading of one repetition, taken from outside the daemon: the
    reader's read latency at the target (its LV's diskstats every 100 ms,
    the signal the controller holds), the daemon's answers on its control
    socket (a raw client of the JSON-line protocol, so a change of the CLI
    cannot hide a dead socket), the kernel's set members against the
    daemon's view (orphans), the iSCSI sessions and the target's TCP
    connections, the target's TCP counters (nstat in netns tgt), the
    kernel's new iSCSI log lines, and the daemon's log ("tick late by").
    The polling is labkit.sampler's (one sampler for the diskstats, one for
    the status probes, one for the log).  Pure helpers (`time_to_hold`,
    `orphans_of`) are separate from the readers so the definitions can be
    read and checked alone.

Definitions (docs/faults.md)
    window     the reader LV's mean read latency over the last 1 s
               (labkit.analysis' window: back to the last sample at least
               1 s before); a window with no read completed is not held.
    held       a window <= T.
    time to hold again
               from the fault's end E: the smallest d >= 0 such that every
               window ending in [E + d, E + d + HOLD_S] is held.  None when
               that never happens before the repetition's end.
    orphan     an IP whose packets the kernel delays (a member of
               santhrottle-all/-ack/-read, `ipset save` in the target's netns,
               whose skbprio's leaf is a netem with a delay: `tc qdisc show`
               prints one only when it is not 0) that the daemon's status does
               not show with a class > 0, in each of ORPHAN_ROUNDS readings
               ORPHAN_GAP_S apart (a glide leaf's hand-off lasts up to
               max_delay: one reading could catch it in passing).  A member
               that rides a glide leaf whose delay is already 0 (its traffic
               never paused for the hand-off: docs/datapath.md) is not
               delayed: counted apart, as riding.

Worked example
    windows [(1.0, 0.001), (2.0, 0.0029)] (t, latency): at T = 2 ms the first is
    held, the second not; time_to_hold(windows, T, end=0.5, hold_s=0.5) -> 0.5 (the
    first held window at t = 1.0 is followed by a late one only at 2.0, past 1.0 +
    0.5).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

from labkit import analysis, probes
from labkit import sampler as kit
from labkit.sampler import Probe

NETNS = "tgt"
SAMPLE_S = 0.1
WINDOW_S = 1.0
HOLD_S = 3.0  # a recovery counts once the threshold held this long
PROBE_EVERY_S = 1.0  # the daemon's status, from outside
# long enough for a loaded daemon to answer (a client that leaves first costs the
# daemon a BrokenPipeError traceback in its log, today)
PROBE_TIMEOUT_S = 5.0
ORPHAN_ROUNDS = 3
ORPHAN_GAP_S = 1.0
MODE_SETS = ("santhrottle-all", "santhrottle-ack", "santhrottle-read")
ROOT_MAJOR_HEX = "5374"  # the HTB root santhrottle builds (datapath/names.py)
LEAF = re.compile(rf"qdisc netem [0-9a-f]+: .*parent {ROOT_MAJOR_HEX}:([0-9a-f]+)\b")
NSTAT_KEYS = (
    "TcpRetransSegs",
    "TcpExtTCPLossProbes",
    "TcpExtTCPTimeouts",
    "TcpExtTCPFastRetrans",
    "TcpExtTCPSACKReorder",
)
TICK_LATE = re.compile(r"tick late by (\d+) ms")
# what the kernel's iSCSI initiator and LIO log when a connection breaks
KERNEL_ISCSI = re.compile(r"conn error|ping timeout|session recovery|Unable to recover|iSCSI Login")


# ------------------------------------------------------------------ pure
def held(lat: float | None, threshold_s: float) -> bool:
    return lat is not None and lat <= threshold_s


def time_to_hold(wins: list[tuple], threshold_s: float, end: float, hold_s: float = HOLD_S):
    """Seconds from `end` until the windows hold for hold_s (module header); None if never."""
    after = [(t, lat) for t, lat in wins if t >= end]
    for i, (t, _) in enumerate(after):
        span = [w for w in after[i:] if w[0] <= t + hold_s]
        if after[-1][0] < t + hold_s:
            return None  # not enough windows left to tell
        if all(held(lat, threshold_s) for _, lat in span):
            return round(t - end, 2)
    return None


def orphans_of(
    rounds: list[tuple[set[str], set[str], set[str]]],
) -> tuple[list[str], list[str], list[str]]:
    """(orphans, missing, riding) from (kernel members, those the kernel delays, the
    daemon's delayed IPs) readings: in every reading, delayed by the kernel and not in
    the daemon's view; in the daemon's view and no member; a member not delayed."""
    if not rounds:
        return [], [], []
    orphans = set.intersection(*(k - d for _m, k, d in rounds))
    missing = set.intersection(*(d - m for m, _k, d in rounds))
    riding = set.intersection(*(m - k - d for m, k, d in rounds))
    return sorted(orphans), sorted(missing), sorted(riding)


def member_minors(text: str) -> dict[str, int]:
    """IP -> the HTB minor of its skbprio (0: none, or not santhrottle's tree) for the
    members of the mode sets, from `ipset save`."""
    out = {}
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 3 and p[0] == "add" and p[1] in MODE_SETS:
            kv = dict(zip(p[3::2], p[4::2], strict=False))
            major, _, minor = kv.get("skbprio", "").partition(":")
            out[p[2]] = int(minor, 16) if major == ROOT_MAJOR_HEX and minor else 0
    return out


def delaying_leaves(tc_text: str) -> set[int]:
    """The minors of santhrottle's classes whose leaf delays now, from `tc qdisc show`:
    a netem leaf printed with a delay (netem prints none when it is 0)."""
    out = set()
    for line in tc_text.splitlines():
        m = LEAF.match(line)
        if m and " delay " in line:
            out.add(int(m.group(1), 16))
    return out


def parse_ipset_save(text: str) -> dict[str, str]:
    """IP -> set name, for members of the mode sets (not the -tmp sets, not the list:set)."""
    out = {}
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 3 and p[0] == "add" and p[1] in MODE_SETS:
            out[p[2]] = p[1]
    return out


def tick_lateness_ms(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for x in lines if (m := TICK_LATE.search(x))]


# --------------------------------------------------------------- readers
def run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def ctl(sock: str, cmd: str = "status", timeout_s: float = PROBE_TIMEOUT_S, **args):
    """One request on the control socket; returns `data` or raises (OSError, RuntimeError)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(sock)
        s.sendall(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                raise RuntimeError("closed without an answer")
            buf += chunk
    resp = json.loads(buf)
    if not resp.get("ok"):
        raise RuntimeError(resp.get("error", "refused"))
    return resp.get("data")


def delayed_ips(st: dict) -> set[str]:
    return {i["initiator"] for i in st.get("initiators", []) if i.get("class")}


def kernel_members(netns: str = NETNS) -> dict[str, str]:
    return parse_ipset_save(run(["ip", "netns", "exec", netns, "ipset", "save"]).stdout)


def kernel_delayed(devices: list[str], netns: str = NETNS) -> tuple[set[str], set[str]]:
    """(the members, those whose leaf delays now on every device)."""
    minors = member_minors(run(["ip", "netns", "exec", netns, "ipset", "save"]).stdout)
    delaying = None
    for dev in devices:
        tc = run(["ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", dev]).stdout
        leaves = delaying_leaves(tc)
        delaying = leaves if delaying is None else delaying & leaves
    return set(minors), {ip for ip, minor in minors.items() if minor in (delaying or set())}


def orphan_check(
    sock: str, devices: list[str], rounds: int = ORPHAN_ROUNDS, gap_s: float = ORPHAN_GAP_S
) -> dict:
    readings, errors = [], []
    for k in range(rounds):
        if k:
            time.sleep(gap_s)
        members, delayed = kernel_delayed(devices)
        try:
            readings.append((members, delayed, delayed_ips(ctl(sock, timeout_s=10.0))))
        except Exception as e:  # a daemon that does not answer wants nothing
            errors.append(str(e))
            readings.append((members, delayed, set()))
    orphans, missing, riding = orphans_of(readings)
    return {
        "orphans": orphans,
        "missing": missing,
        "riding": riding,
        "status_errors": errors,
        "members_last": sorted(readings[-1][0]),
    }


def nstat(netns: str = NETNS) -> dict[str, int]:
    vals = dict.fromkeys(NSTAT_KEYS, 0)
    for line in run(["ip", "netns", "exec", netns, "nstat", "-saz"]).stdout.splitlines():
        p = line.split()
        if len(p) >= 2 and p[0] in vals:
            vals[p[0]] = int(p[1])
    return vals


def sessions(topology) -> dict[int, dict]:
    """sid -> target and state, from the initiator's sysfs (topology.iscsi_sessions)."""
    return {
        s["sid"]: {"target": s["targetname"], "state": s["state"]}
        for s in topology.iscsi_sessions()
    }


def target_conns(netns: str = NETNS, port: int = 3260) -> list[str]:
    """The target's iSCSI connections, 'local peer' (a reconnect changes the peer's port)."""
    out = run(
        ["ip", "netns", "exec", netns, "ss", "-tnH", "state", "established", f"( sport = :{port} )"]
    ).stdout
    return sorted(" ".join(x.split()[-2:]) for x in out.splitlines() if x.strip())


def kernel_log_lines() -> list[str]:
    return run(["dmesg"]).stdout.splitlines()


def proc_status(pid: int) -> dict[str, int]:
    """Threads and VmRSS (kB) of a process; {} once it is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("Threads", "VmRSS"):
                out[k] = int(v.split()[0])
        out["fds"] = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        pass
    return out


class Sampler:
    """The reader LV's diskstats every SAMPLE_S, the daemon's status from outside every
    PROBE_EVERY_S (its answer, or its failure, and how long it took): two samplers, so
    that a daemon slow to answer does not space the diskstats out.  Times are
    time.monotonic()'s, as the repetitions' marks."""

    def __init__(self, dm: str, sock: str) -> None:
        self.dm, self.sock = dm, sock
        self.ds = kit.Sampler([Probe("ds", probes.diskstats([dm]))], SAMPLE_S)
        self.pr = kit.Sampler([Probe("probe", self._probe)], PROBE_EVERY_S)

    def start(self) -> None:
        self.ds.start()
        self.pr.start()

    def stop(self) -> None:
        self.ds.stop()
        self.pr.stop()

    def _probe(self) -> dict:
        t0 = time.monotonic()
        rec: dict = {"t": t0}
        try:
            st = ctl(self.sock)
            rec.update(
                ok=True,
                overruns=st["counters"]["tick_overruns"],
                max_class=max((i["class"] for i in st["initiators"]), default=0),
            )
        except Exception as e:
            rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:200])
        rec["latency_s"] = round(time.monotonic() - t0, 3)
        return rec

    def windows(self, t0: float, t1: float) -> list[tuple[float, float | None]]:
        """(t, the reader's latency) of the windows that end in [t0, t1]."""
        rows = [
            dict(r, t=self.ds.t0 + r["t"])
            for r in list(self.ds.rows)
            if "ds" in r and t0 <= self.ds.t0 + r["t"] <= t1
        ]
        return [(w.t, w.read_latency_s) for w in analysis.windows(rows, self.dm, [], None)]

    @property
    def probes(self) -> list[dict]:
        return [r["probe"] for r in list(self.pr.rows) if "probe" in r]


class LogTail:
    """New lines of the daemon's current log file, each stamped with the time it was seen
    (read every 0.2 s by a sampler, and at once when asked)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.path: Path | None = None
        self._pos = 0
        self._lock = threading.Lock()
        self.s = kit.Sampler([Probe("new_lines", self._poll)], period_s=0.2)

    def start(self) -> None:
        self.s.start()

    def stop(self) -> None:
        self.s.stop()

    def follow(self, path: Path) -> None:
        with self._lock:
            self._read()
            self.path, self._pos = path, 0

    def _poll(self) -> int:
        with self._lock:
            return self._read()

    def _read(self) -> int:
        if self.path is None or not self.path.exists():
            return 0
        with open(self.path, errors="replace") as f:
            f.seek(self._pos)
            data = f.read()
            self._pos = f.tell()
        now = time.monotonic()
        new = data.splitlines()
        self.lines.extend((now, x) for x in new)
        return len(new)

    def between(self, t0: float, t1: float) -> list[str]:
        return [x for _, x in self.stamped(t0, t1)]

    def stamped(self, t0: float, t1: float) -> list[tuple[float, str]]:
        with self._lock:
            self._read()
            return [(t, x) for t, x in self.lines if t0 <= t <= t1]
