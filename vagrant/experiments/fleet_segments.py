"""fleet_lab.py's parts: the bridge daemons, the pollers, the load segments, the figures.

In the guest; imported by fleet_lab.py and fleet_faults.py.  A segment is closed_loop.py's
phase on the multipath devices (labkit.bursts' schedule, labkit.sampler's rows, the
windows and summary of labkit.analysis), with every POLL_S each running daemon's status
and fleet status.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import time
from pathlib import Path

from labkit import analysis, bursts, fabrics, fio, probes, topology
from labkit.daemon import Daemon, bridge_config, poll_until
from labkit.sampler import Probe, Sampler

RESOURCE = "labvg"
ARRAY = "lab"
PREFIX = f"/santhrottle/{ARRAY}/"
SAMPLER_NICE = -15
POLL_S = 0.5  # the daemons' status and fleet status (each request costs them CPU)
LEASE_WAIT_S = 3.0  # a lease asked for 1 s is granted 2 s (docs/fleet.md): past its TTL
STOP_S = 40.0
START_S = 120.0
SOCKS = Path("/run/santhrottle-fleetlab")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ daemons
class FleetDaemon(Daemon):
    """santhrottled in bridge mode on one fabric's bridge, in its namespace; in the fleet
    `ARRAY` as member `member` of the etcd cluster (None: alone, no [fleet])."""

    def __init__(
        self,
        name: str,
        bridge: dict,
        member: int | None,
        out: Path,
        t: dict,
        threshold: str,
        lease_ttl_s: int,
        nice: int | None = None,
    ) -> None:
        self.bridge, self.member = bridge, member
        conf = bridge_config(bridge, str(SOCKS / f"{name}.sock"), out / name / "state")
        vols = [
            f"iscsi://{topology.hostport(p, topology.ISCSI_PORT)}/*/*"
            for x in t["iscsi"]
            for p in (x["portal"], x["portal_b"])
        ]
        conf["resources"] = {RESOURCE: {"volumes": vols, "threshold": threshold}}
        conf["hosts"] = {
            x["iface"]: {"addresses": [x["initiator_ip"], x["initiator_ip_b"]]} for x in t["iscsi"]
        }
        if member is not None:
            conf["fleet"] = {
                "endpoints": fabrics.endpoints(member),
                "array": ARRAY,
                "appliance": name,
                "lease_ttl": f"{lease_ttl_s}s",
            }
        super().__init__(name, conf, out / name, nice=nice, netns=bridge["netns"])

    def wait_up(self, start_s: float = START_S, first_status_s: float = 90.0) -> dict:
        return super().wait_up(start_s, first_status_s)

    def stop(self, cleanup: str | None = "all", timeout_s: float = STOP_S) -> int | None:
        t0 = time.monotonic()
        alive = self.alive()
        code = super().stop(cleanup, timeout_s)
        if alive:
            log(f"{self.name} stopped ({time.monotonic() - t0:.1f} s, exit {code})")
        return code

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
            "maps_with_elements": probes.sets_left(ns, True),
            "netem_qdiscs": len(netem),
            "netem_sample": netem[:3],
        }

    def fleet(self) -> dict | None:
        try:
            return self.request("fleet_status", timeout_s=5.0)
        except Exception:
            return None

    def leader(self) -> str | None:
        fs = self.fleet()
        got = (fs or {}).get("leaders", {}).get(RESOURCE)
        return None if got is None else got["appliance"]


def poll(d: FleetDaemon, now) -> dict:
    """One daemon's view: the resource's class and latency, the initiators' classes, and
    in the fleet its mode, appliances and the resource's leader."""
    row: dict = {"t": round(now(), 3), "d": d.name}
    try:
        st = d.status()
        r = next((x for x in st["resources"] if x["resource"] == RESOURCE), {})
        row["class"] = r.get("delay_class")
        row["latency_s"] = r.get("read_latency_ewma_s")
        row["initiators"] = {i["initiator"]: i["class"] for i in st["initiators"] if i["class"]}
        if d.member is not None:
            fs = d.request("fleet_status")
            row["mode"] = fs["mode"]
            row["appliances"] = fs["appliances"]
            row["leader"] = (fs["leaders"].get(RESOURCE) or {}).get("appliance")
            row["leading"] = fs["leading"]
    except Exception as e:  # keep polling; record why
        row["error"] = str(e)[:200]
    return row


def polls_of(rows: list[dict]) -> list[dict]:
    """The pollers' rows, one per daemon and poll."""
    return [p for r in rows for p in r.get("polls", [])]


# ------------------------------------------------------------------ segments
class Segment:
    """The reader and the writers on the multipath devices, sampled as closed_loop's phase
    (at SAMPLER_NICE: on a guest whose vCPUs the daemons and fio share, the 100 ms rows
    keep their pace), the daemons polled every POLL_S."""

    def __init__(
        self, t: dict, a: argparse.Namespace, kind: str, daemons: list[FleetDaemon]
    ) -> None:
        self.t, self.a, self.kind, self.daemons = t, a, kind, daemons
        reader, writers = t["iscsi"][0], t["iscsi"][1:]
        self.devices = [
            reader["dm"],
            reader["mpath_dm"],
            *[w["dm"] for w in writers],
            Path(t["disk"]).name,
        ]
        self.s = Sampler(
            [
                Probe("ds", probes.diskstats(self.devices)),
                Probe("retrans", probes.retrans(t["netns"], topology.ISCSI_PORT), every=5),
            ],
            nice=SAMPLER_NICE,
        )
        self.poll = Sampler(
            [Probe("polls", lambda: [poll(d, self.now) for d in daemons if d.alive()])],
            period_s=POLL_S,
        )
        self.jobs: list[tuple[str, fio.Job]] = []
        self.dmesg0 = len(fabrics.multipath_log_lines())

    def now(self) -> float:
        return self.s.now()

    def counters(self) -> dict:
        """Each fleet daemon's fleet counters (leases lost, elections won, ...)."""
        return {
            d.name: (d.fleet() or {}).get("counters")
            for d in self.daemons
            if d.member is not None and d.alive()
        }

    def reader_job(self, runtime: float) -> list[str]:
        return fio.reader(self.t["iscsi"][0]["device"], self.a.reader_rate, runtime)

    def writer_jobs(self, runtime: float) -> list[list[str]]:
        a = self.a
        return [
            fio.writers(w["device"], a.writer_bs, a.writer_qd, runtime, jobs=a.writer_jobs)
            for w in self.t["iscsi"][1:]
        ]

    def _start_measuring(self) -> None:
        self.fc0 = self.counters()
        self.net0 = probes.nstat(self.t["netns"])
        self.conns0 = probes.tcp_conns(self.t["netns"], topology.ISCSI_PORT)
        self.s.start()
        self.poll.start()

    def begin(self, duration: float) -> None:
        """The reader for `duration` (a fault's segment: the writers by writers())."""
        self._start_measuring()
        self.jobs.append(("reader", fio.start(self.reader_job(duration))))
        self.s.mark("reader on")

    def writers(self, runtime: float) -> list[fio.Job]:
        ws = [fio.start(cmd) for cmd in self.writer_jobs(runtime)]
        self.jobs += [(f"writer{i + 1}", j) for i, j in enumerate(ws)]
        self.s.mark("writers on")
        return ws

    def cycles(self, n: int, settle: bool = False) -> None:
        """n on/off cycles (labkit.bursts); settle: every on-period counts."""
        self._start_measuring()
        sched = bursts.Schedule(self.a.lead, self.a.on, self.a.off, n)
        jobs = bursts.run(self.s, self.reader_job, self.writer_jobs, sched, learn=not settle)
        self.jobs += [("reader" if i == 0 else f"writer{i}", j) for i, j in enumerate(jobs)]

    def end(self) -> dict:
        results = []
        for name, j in self.jobs:
            try:
                j.wait(60)
            except subprocess.TimeoutExpired:
                j.stop()
            job = j.result()
            if job is None:
                results.append(
                    {"job": name, "rc": j.proc.returncode, "parse_error": (j.out or "")[-200:]}
                )
            else:
                results.append(
                    {
                        "job": name,
                        "rc": j.proc.returncode,
                        "error": job.get("error", 0),
                        "total_err": job.get("total_err", 0),
                    }
                )
        fc1 = self.counters()
        fleet_counters = {
            n: {k: v - (self.fc0.get(n) or {}).get(k, 0) for k, v in c.items()}
            for n, c in fc1.items()
            if c
        }
        self.s.stop()
        self.poll.stop()
        r, ws = self.t["iscsi"][0], self.t["iscsi"][1:]
        mp = fabrics.multipath_log_lines()[self.dmesg0 :]
        pl = polls_of(self.poll.rows)
        net1 = probes.nstat(self.t["netns"])
        return {
            "kind": self.kind,
            "rows": self.s.rows,
            "events": self.s.events,
            "polls": pl,
            "nstat": {k: v - self.net0.get(k, 0) for k, v in net1.items()},
            "tcp_conns_start": self.conns0,
            "tcp_conns": probes.tcp_conns(self.t["netns"], topology.ISCSI_PORT),
            "sets_left_after_stop": [],
            "reader_dm": r["dm"],
            "reader_mpath_dm": r["mpath_dm"],
            "writer_dms": [w["dm"] for w in ws],
            "writer_ips": [ip for w in ws for ip in (w["initiator_ip"], w["initiator_ip_b"])],
            "array": Path(self.t["disk"]).name,
            "fio": results,
            "fleet_counters": fleet_counters,
            "leader_changes": leader_changes(pl),
            "io_errors": sum(
                int(x.get("error", 0) or 0) + int(x.get("total_err", 0) or 0) for x in results
            ),
            "multipath_kernel_messages": mp,
            "path_failures": sum(1 for ln in mp if "Failing path" in ln),
        }


def until(fn, within_s: float, step: float = 0.05):
    """fn() until it returns something true, at most within_s: (that, seconds) or
    (None, None)."""
    return poll_until(fn, within_s, step)


def current_leader(seg: Segment, ds: list[FleetDaemon]) -> str | None:
    """The resource's leader as a daemon's fleet status names it now, else as the poller
    last saw it (within 3 s; on a starved guest a status request can time out)."""
    for d in ds:
        if d.alive() and (got := d.leader()):
            return got
    pl = polls_of(seg.poll.rows)
    recent = [p for p in pl if p.get("leader") and p["t"] > seg.now() - 3.0]
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
    s = analysis.summarize(ph, thr_s, None)
    mp = analysis.summarize(dict(ph, reader_dm=ph["reader_mpath_dm"]), thr_s, None)
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


def lat_windows(
    ph: dict, since: float, until_: float = float("inf"), dm: str | None = None
) -> list[tuple[float, float]]:
    """(end, the reader's latency) of the phase's 1 s windows (labkit.analysis) that end
    in [since, until_), at the LV or at `dm` (the multipath device)."""
    w = analysis.phase_windows(ph, dm)
    return [
        (x.t, x.read_latency_s) for x in w if since <= x.t < until_ and x.read_latency_s is not None
    ]


def pct_ms(xs: list[float], q: float) -> float | None:
    return round(analysis.percentile(xs, q) * 1e3, 2) if xs else None


def window_stats(ph: dict, thr_s: float, dm: str | None = None) -> dict:
    """p50/p95/p99 and the time above T of the 1 s windows from the phase's settle on
    (labkit.analysis.settle_time)."""
    w = [v for _, v in lat_windows(ph, analysis.settle_time(ph), dm=dm)]
    above = round(100 * sum(v > thr_s for v in w) / len(w), 1) if w else None
    return {
        "windows": len(w),
        "p50_ms": pct_ms(w, 50),
        "p95_ms": pct_ms(w, 95),
        "p99_ms": pct_ms(w, 99),
        "above_T_pct": above,
    }


def back_under(ph: dict, t_ev: float, thr_s: float) -> dict:
    """After t_ev: the windows above T, the worst, and when they are under T for good."""
    w = lat_windows(ph, t_ev)
    over = [t for t, v in w if v > thr_s]
    v = [x for _, x in w]
    return {
        "windows": len(w),
        "windows_over_T": len(over),
        "worst_ms": round(max(v, default=0) * 1e3, 2),
        "back_under_T_after_s": round(max(over) - t_ev + 0.1, 2) if over else 0.0,
        "p50_ms": pct_ms(v, 50),
        "p95_ms": pct_ms(v, 95),
    }


def both_in_fleet(ds: list[FleetDaemon]):
    fss = [d.fleet() for d in ds]
    if any(f is None for f in fss):
        return None
    names = sorted(d.name for d in ds)
    leaders = {(f["leaders"].get(RESOURCE) or {}).get("appliance") for f in fss}
    ok = all(f["mode"] == "fleet" and sorted(f["appliances"]) == names for f in fss)
    return fss if ok and len(leaders) == 1 and None not in leaders else None


def classes_of(ph: dict, name: str, since: float, until_: float) -> list[int]:
    return [
        p["class"]
        for p in ph["polls"]
        if p["d"] == name and since <= p["t"] < until_ and p.get("class") is not None
    ]
