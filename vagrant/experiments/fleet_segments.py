"""fleet_lab.py's parts: the bridge daemons, the pollers, the load segments, the figures.

In the guest; imported by fleet_lab.py and fleet_faults.py.  A segment is closed_loop.py's
phase on the multipath devices: the reader (LUN 0) and the writer hosts' fio jobs, the
sampler of the LVs' diskstats (report.windows' 1 s windows), and every POLL_S each running
daemon's status and fleet status.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import closed_loop  # noqa: E402
import fabrics  # noqa: E402  (vagrant/qemu/guest, on the path too)
import topology  # noqa: E402  (closed_loop put vagrant/qemu/guest on the path)
from report import percentile, summarize  # noqa: E402

BIN = closed_loop.BIN
RESOURCE = "labvg"
ARRAY = "lab"
PREFIX = f"/santhrottle/{ARRAY}/"
SAMPLER_NICE = -15
POLL_S = 0.5  # the daemons' status and fleet status (each request costs them CPU)
LEASE_WAIT_S = 3.0  # a lease asked for 1 s is granted 2 s (docs/fleet.md): past its TTL


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def request(sock: str, what: str, timeout_s: float = 2.0) -> dict:
    from santhrottle.appliance.daemon.control import request as req

    return req(sock, what, timeout_s=timeout_s)


# ------------------------------------------------------------------ daemons
class Daemon:
    """santhrottled in bridge mode on one fabric's bridge, in its namespace."""

    def __init__(
        self, name: str, bridge: dict, member: int | None, out: Path, nice: int | None = None
    ) -> None:
        self.name, self.bridge, self.member, self.out = name, bridge, member, out
        self.nice = closed_loop.unit_nice() if nice is None else nice
        self.dir = out / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sock = f"/run/santhrottle-fleetlab/{name}.sock"
        self.conf = self.dir / "santhrottle.toml"
        self.proc: subprocess.Popen | None = None

    def write_config(self, t: dict, threshold: str, lease_ttl_s: int) -> None:
        b = self.bridge
        vols = [
            f"iscsi://{topology.hostport(p, topology.ISCSI_PORT)}/*/*"
            for x in t["iscsi"]
            for p in (x["portal"], x["portal_b"])
        ]
        hosts = "".join(
            f'[hosts.{x["iface"]}]\naddresses = ["{x["initiator_ip"]}", "{x["initiator_ip_b"]}"]\n'
            for x in t["iscsi"]
        )
        fleet = ""
        if self.member is not None:
            fleet = (
                f"[fleet]\nendpoints = {json.dumps(fabrics.endpoints(self.member))}\n"
                f'array = "{ARRAY}"\nappliance = "{self.name}"\nlease_ttl = "{lease_ttl_s}s"\n'
            )
        self.conf.write_text(
            f'[daemon]\nmode = "bridge"\ncontrol_socket = "{self.sock}"\n'
            f'netns = "{b["netns"]}"\nstate_dir = "{self.dir / "state"}"\n'
            f'[bridge]\nname = "{b["name"]}"\ninitiator_port = "{b["initiator_port"]}"\n'
            f'array_port = "{b["array_port"]}"\n'
            f'[datapath]\nlink_speed = "10gbit"\n[metrics]\nport = 0\n'
            f'[resources.{RESOURCE}]\nvolumes = {json.dumps(vols)}\nthreshold = "{threshold}"\n'
            + hosts
            + fleet
        )

    def start(self) -> None:
        self.launch()
        self.wait_up()

    def launch(self) -> None:
        Path(self.sock).parent.mkdir(parents=True, exist_ok=True)
        Path(self.sock).unlink(missing_ok=True)
        nice = self.nice
        logf = open(self.dir / "santhrottled.log", "a")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.bridge["netns"],
                str(BIN / "santhrottled"),
                "--config",
                str(self.conf),
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(nice),
        )

    def wait_up(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 120
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {self.dir}/santhrottled.log")
            time.sleep(0.2)
        closed_loop.first_status(self.sock)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # `ip netns exec` execs santhrottled: this PID is the daemon
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)  # our own child, by PID
            t0 = time.monotonic()
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: no exit 40 s after SIGTERM: kill -9")
                self.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=10)
            log(f"{self.name} stopped ({time.monotonic() - t0:.1f} s)")
        self.cleanup()

    def cleanup(self) -> None:
        try:
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.bridge["netns"],
                    str(BIN / "santhrottle"),
                    "cleanup",
                    "--config",
                    str(self.conf),
                ],
                capture_output=True,
                timeout=150,
            )
        except subprocess.TimeoutExpired:
            log(f"{self.name}: santhrottle cleanup took over 150 s")

    def left(self) -> dict:
        """What is on its bridge now: nft maps with elements, the initiator port's qdiscs."""
        ns = self.bridge["netns"]
        qd = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "tc",
                "qdisc",
                "show",
                "dev",
                self.bridge["initiator_port"],
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        netem = [ln for ln in qd.stdout.splitlines() if "netem" in ln]
        return {
            "maps_with_elements": closed_loop.left_members(ns, True),
            "netem_qdiscs": len(netem),
            "netem_sample": netem[:3],
        }

    def fleet(self) -> dict | None:
        try:
            return request(self.sock, "fleet_status", timeout_s=5.0)
        except Exception:
            return None

    def leader(self) -> str | None:
        fs = self.fleet()
        got = (fs or {}).get("leaders", {}).get(RESOURCE)
        return None if got is None else got["appliance"]


class Poller(threading.Thread):
    """Every POLL_S: each running daemon's resource class, initiators' classes, fleet view."""

    def __init__(self, daemons: list[Daemon], t0: float) -> None:
        super().__init__(daemon=True)
        self.daemons, self.t0 = daemons, t0
        self.rows: list[dict] = []
        self.stop_ev = threading.Event()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            for d in self.daemons:
                if not d.alive():
                    continue
                row: dict = {"t": round(time.monotonic() - self.t0, 3), "d": d.name}
                try:
                    st = request(d.sock, "status")
                    r = next((x for x in st["resources"] if x["resource"] == RESOURCE), {})
                    row["class"] = r.get("delay_class")
                    row["latency_s"] = r.get("read_latency_ewma_s")
                    row["initiators"] = {
                        i["initiator"]: i["class"] for i in st["initiators"] if i["class"]
                    }
                    if d.member is not None:
                        fs = request(d.sock, "fleet_status")
                        row["mode"] = fs["mode"]
                        row["members"] = fs["members"]
                        row["leader"] = (fs["leaders"].get(RESOURCE) or {}).get("appliance")
                        row["leading"] = fs["leading"]
                except Exception as e:  # keep polling; record why
                    row["error"] = str(e)[:200]
                self.rows.append(row)
            self.stop_ev.wait(POLL_S)


# ------------------------------------------------------------------ segments
class Sampler(closed_loop.Sampler):
    """closed_loop's sampler, its thread at SAMPLER_NICE: on a guest whose vCPUs the daemons
    and fio share, its 100 ms rows (and so report.windows' 1 s windows) keep their pace."""

    def run(self) -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SAMPLER_NICE)
        super().run()


class Segment:
    """The reader and the writers on the multipath devices, sampled as closed_loop's phase."""

    def __init__(self, t: dict, a: argparse.Namespace, kind: str, daemons: list[Daemon]) -> None:
        self.t, self.a, self.kind, self.daemons = t, a, kind, daemons
        reader, writers = t["iscsi"][0], t["iscsi"][1:]
        self.devices = [
            reader["dm"],
            reader["mpath_dm"],
            *[w["dm"] for w in writers],
            Path(t["disk"]).name,
        ]
        self.s = Sampler(self.devices, False, t["netns"], topology.ISCSI_PORT)
        self.poll = Poller(daemons, self.s.t0)
        self.fio: list[tuple[str, subprocess.Popen]] = []
        self.dmesg0 = len(fabrics.multipath_log_lines())

    def now(self) -> float:
        return time.monotonic() - self.s.t0

    def counters(self) -> dict:
        """Each fleet daemon's fleet counters (leases lost, elections won, ...)."""
        return {d.name: (d.fleet() or {}).get("counters") for d in self.daemons
                if d.member is not None and d.alive()}  # fmt: skip

    def begin(self, duration: float) -> None:
        self.fc0 = self.counters()
        self.net0 = closed_loop.nstat(self.t["netns"])
        self.conns0 = closed_loop.tcp_conns(self.t["netns"])
        self.s.start()
        self.poll.start()
        self.fio.append(
            ("reader", closed_loop.reader_job(self.a, self.t["iscsi"][0]["device"], duration))
        )
        self.s.mark("reader on")

    def writers(self, runtime: float) -> list[subprocess.Popen]:
        ws = [closed_loop.writer_job(self.a, w["device"], runtime) for w in self.t["iscsi"][1:]]
        self.fio += [(f"writer{i + 1}", p) for i, p in enumerate(ws)]
        self.s.mark("writers on")
        return ws

    def cycles(self, n: int, settle: bool = False) -> None:
        """n on/off cycles; settle: every on-period counts (nothing to learn)."""
        # the writers' fio takes seconds to start under TCG, so the schedule outlasts
        # its nominal length: the reader gets more and is stopped when it ends
        nominal = self.a.lead + n * (self.a.on + self.a.off)
        self.begin(closed_loop.READER_RUNTIME_FACTOR * nominal)
        if settle:
            self.s.mark("settle")
        time.sleep(self.a.lead)
        for _ in range(n):
            for w in self.writers(self.a.on):
                w.wait()
            self.s.mark("writers off")
            time.sleep(self.a.off)
        for name, p in self.fio:
            if name == "reader":
                closed_loop.stop_reader(p)

    def end(self) -> dict:
        results = []
        for name, p in self.fio:
            try:
                out, _ = p.communicate(timeout=60)
                job = json.loads(out)["jobs"][0]
                results.append(
                    {
                        "job": name,
                        "rc": p.returncode,
                        "error": job.get("error", 0),
                        "total_err": job.get("total_err", 0),
                    }
                )
            except Exception as e:  # recorded
                results.append({"job": name, "rc": p.returncode, "parse_error": str(e)[:200]})
        fc1 = self.counters()
        fleet_counters = {
            n: {k: v - (self.fc0.get(n) or {}).get(k, 0) for k, v in c.items()}
            for n, c in fc1.items() if c
        }  # fmt: skip
        self.s.stop_ev.set()
        self.poll.stop_ev.set()
        self.s.join()
        self.poll.join()
        r, ws = self.t["iscsi"][0], self.t["iscsi"][1:]
        mp = fabrics.multipath_log_lines()[self.dmesg0 :]
        return {
            "kind": self.kind,
            "rows": self.s.rows,
            "events": self.s.events,
            "polls": self.poll.rows,
            "nstat": {
                k: v - self.net0.get(k, 0) for k, v in closed_loop.nstat(self.t["netns"]).items()
            },
            "tcp_conns_start": self.conns0,
            "tcp_conns": closed_loop.tcp_conns(self.t["netns"]),
            "sets_left_after_stop": [],
            "reader_dm": r["dm"],
            "reader_mpath_dm": r["mpath_dm"],
            "writer_dms": [w["dm"] for w in ws],
            "writer_ips": [ip for w in ws for ip in (w["initiator_ip"], w["initiator_ip_b"])],
            "array": Path(self.t["disk"]).name,
            "fio": results,
            "fleet_counters": fleet_counters,
            "leader_changes": leader_changes(self.poll.rows),
            "io_errors": sum(
                int(x.get("error", 0) or 0) + int(x.get("total_err", 0) or 0) for x in results
            ),
            "multipath_kernel_messages": mp,
            "path_failures": sum(1 for ln in mp if "Failing path" in ln),
        }


def current_leader(seg: Segment, ds: list[Daemon]) -> str | None:
    """The resource's leader as a daemon's fleet status names it now, else as the poller
    last saw it (within 3 s; on a starved guest a status request can time out)."""
    for d in ds:
        if d.alive() and (got := d.leader()):
            return got
    recent = [p for p in seg.poll.rows if p.get("leader") and p["t"] > seg.now() - 3.0]
    return recent[-1]["leader"] if recent else None


def leader_changes(polls: list[dict]) -> int:
    """How often the leader of the resource the daemons named changed between polls."""
    seen = [p["leader"] for p in polls if p.get("leader")]
    return sum(1 for x, y in itertools.pairwise(seen) if x != y)


def attach_status(ph: dict) -> None:
    """The initiators' classes (the highest any daemon gives) into the sampler's rows, for
    report.summarize's max_delay_class."""
    polls = [p for p in ph["polls"] if "initiators" in p]
    j, last = 0, {}
    for r in ph["rows"]:
        while j < len(polls) and polls[j]["t"] <= r["t"]:
            last[polls[j]["d"]] = polls[j]["initiators"]
            j += 1
        if last:
            merged: dict[str, int] = {}
            for ini in last.values():
                for k, c in ini.items():
                    merged[k] = max(merged.get(k, 0), c)
            r["status"] = {"initiators": merged}


def summary(ph: dict, thr_s: float) -> dict:
    attach_status(ph)
    s = summarize(ph, thr_s, None)
    mp = summarize(dict(ph, reader_dm=ph["reader_mpath_dm"]), thr_s, None)
    keep = (
        "windows",
        "read_latency_p50_s",
        "read_latency_p95_s",
        "read_latency_p99_s",
        "time_above_threshold_pct",
        "write_bytes_per_s",
        "target_retrans_segs",
        "target_retrans_writers",
        "target_retrans_others",
        "max_delay_class",
    )
    out = {k: s.get(k) for k in keep}
    out["mpath_read_latency_p50_s"] = mp["read_latency_p50_s"]
    out["mpath_read_latency_p95_s"] = mp["read_latency_p95_s"]
    out["io_errors"], out["path_failures"] = ph["io_errors"], ph["path_failures"]
    out["fleet_counters"] = ph.get("fleet_counters")
    out["leader_changes"] = ph.get("leader_changes")
    rows = ph["rows"]
    gaps = sorted(b["t"] - a["t"] for a, b in itertools.pairwise(rows))
    out["sample_gap_median_s"] = round(gaps[len(gaps) // 2], 3) if gaps else None
    out["lv_1s"] = window_stats(ph, thr_s)
    out["mpath_1s"] = window_stats(ph, thr_s, ph["reader_mpath_dm"])
    return out


def time_windows(ph: dict, dm: str | None = None, span: float = 1.0) -> list[tuple[float, float]]:
    """The reader's mean read latency over windows of `span` seconds by the rows' times, one
    per 100 ms step: (end, latency).  report.windows takes 10 rows for a second; on a starved
    guest the sampler falls behind (a row with `ss` takes long, the next ones catch up), so
    its rows come in bunches and 10 rows are not a second.  A window longer than 1.5 span
    (a gap in the rows) is left out."""
    dm = dm or ph["reader_dm"]
    rows = [r for r in ph["rows"] if dm in r["ds"]]
    ts = [r["t"] for r in rows]
    out: list[tuple[float, float]] = []
    last_step = -1
    for j, b in enumerate(rows):
        step = int(b["t"] / 0.1)
        if step == last_step:
            continue
        i = bisect.bisect_right(ts, b["t"] - span) - 1
        if i < 0 or b["t"] - rows[i]["t"] > 1.5 * span or i >= j:
            continue
        a = rows[i]
        n = b["ds"][dm][0] - a["ds"][dm][0]
        if n > 0:
            out.append((b["t"], (b["ds"][dm][3] - a["ds"][dm][3]) / 1000 / n))
            last_step = step
    return out


def lat_windows(
    ph: dict, since: float, until: float = float("inf"), dm: str | None = None
) -> list[tuple[float, float]]:
    return [(t, v) for t, v in time_windows(ph, dm) if since <= t < until]


def window_stats(ph: dict, thr_s: float, dm: str | None = None) -> dict:
    """p50/p95/p99 and the time above T of the 1 s windows from the phase's settle on (the
    end of the first on-period of a controlled phase; a segment's "settle" mark)."""
    off = [t for t, e in ph["events"] if e == "writers off"]
    settle = next((t for t, e in ph["events"] if e == "settle"), off[0] if off else 0.0)
    w = [v for _, v in lat_windows(ph, settle, dm=dm)]
    pct = {q: round(percentile(w, q) * 1e3, 2) if w else None for q in (50, 95, 99)}
    above = round(100 * sum(v > thr_s for v in w) / len(w), 1) if w else None
    return {"windows": len(w), "p50_ms": pct[50], "p95_ms": pct[95], "p99_ms": pct[99],
            "above_T_pct": above}  # fmt: skip


def back_under(ph: dict, t_ev: float, thr_s: float) -> dict:
    """After t_ev: the windows above T, the worst, and when they are under T for good."""
    w = lat_windows(ph, t_ev)
    over = [t for t, v in w if v > thr_s]
    return {
        "windows": len(w),
        "windows_over_T": len(over),
        "worst_ms": round(max((v for _, v in w), default=0) * 1e3, 2),
        "back_under_T_after_s": round(max(over) - t_ev + 0.1, 2) if over else 0.0,
        "p50_ms": round(percentile([v for _, v in w], 50) * 1e3, 2) if w else None,
        "p95_ms": round(percentile([v for _, v in w], 95) * 1e3, 2) if w else None,
    }


def until(fn, within_s: float, step: float = 0.05):
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        got = fn()
        if got:
            return got, time.monotonic() - t0
        time.sleep(step)
    return None, None


def both_in_fleet(ds: list[Daemon]):
    fss = [d.fleet() for d in ds]
    if any(f is None for f in fss):
        return None
    names = sorted(d.name for d in ds)
    leaders = {(f["leaders"].get(RESOURCE) or {}).get("appliance") for f in fss}
    ok = all(f["mode"] == "fleet" and sorted(f["members"]) == names for f in fss)
    return fss if ok and len(leaders) == 1 and None not in leaders else None


def classes_of(ph: dict, name: str, since: float, until_: float) -> list[int]:
    return [
        p["class"]
        for p in ph["polls"]
        if p["d"] == name and since <= p["t"] < until_ and p.get("class") is not None
    ]
