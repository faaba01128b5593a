#!/usr/bin/env python3
"""The paper's closed-loop experiment in the lab guest (docs/lab.md). Runs INSIDE the guest.

    .venv/bin/python vagrant/qemu/lab.py --smp 1 --array nbd:c_ms=2,m_ms=5 run \\
        vagrant/experiments/closed_loop.py --out DIR --paper     # make lab (report.py)

(`make lab` runs it through vagrant/experiments/report.py, which also draws the
report.)  The topology (labkit.topology): LIO (or nvmet with --protocol nvme) in
netns `tgt` on a VG over a shared array (--disk: the known plant of lab.py --array,
or null_blk), one iSCSI initiator (NVMe/TCP host) per LV; LV 0's is the reader
(4 KiB random reads, QD1, --reader-rate), the others the writer hosts.  The phases,
in order:

    interference  the reader alone, with one host's writers, with all (paper 3.4)
    uncontrolled  the schedule (labkit.bursts: the writers on for --on s, off for
                  --off s, --cycles times), no daemon (with --plant auto before the
                  interference points, which then run on the plant it chose)
    per threshold T:
      controlled  the same with santhrottled discovering the VG and the writers by
                  itself; in the last on-period the reader leaves halfway through
                  the writes (the release is timed from there)
      static      (--static) the writers pinned by hand (`santhrottle pin`) at
                  delays of the ladder, the daemon running with T as controlled
                  (both pay its CPU; the pins override its classes): from the
                  controller's median class while the writers wrote, --static-step
                  classes up while the reader's p95 is over T (down while it holds),
                  the step doubling, then bisection; at most --static-probes
      bridge      (--bridge) the controlled phase with santhrottled in bridge mode
                  on a transparent bridge in front of the target (its resource every
                  volume of the portals, its latency the wire's)

--light (work conservation, make lab-light): a light plant, no interference points, no
static search.  The uncontrolled phase first; where its p95 is not within 0.4-0.8 of the
smallest of --thresholds, the plant's slope m is moved (labkit.regime.light_slope: down
on a host whose writers load the array hard, up where they hardly do) and the phase run
again, at most regime.MAX_TRIES times; T is then the smallest of --thresholds the last
one stays under with room (labkit.regime.light_threshold); then --reps repetitions of
controlled at T (and bridge at T with --bridge) and uncontrolled again, each phase
tagged with its repetition ("rep"; the last try's uncontrolled phase is repetition 0's);
--bridge-only keeps only the bridge at T and the uncontrolled phases.
--observed adds, per repetition after the controlled phase, an observed one: the same
daemon, data path and status probe with no threshold (it discovers the VG and delays
nobody), so the report splits the controlled writers' loss into what the daemon's
presence and the lab's probe cost (observed against uncontrolled) and what control
costs (controlled against observed); with --bridge, a bridge-observed one before the
bridge phase: the bridge's daemon with no threshold (it measures the wire, delays
nobody), the same split for the bridge.  The phases' CPU records the sampler's own CPU
per probe (labkit.sampler cpu_s): the status probe is the lab's, not the product's.

--bridge-check (the bridge's latency against the initiator's and the array's): on the
plant lab.py started, at the first of --thresholds, uncontrolled, the bridge's daemon
observing (no threshold: it measures the wire and delays nobody), then --reps x the
bridge controlled and the same with its gate by the `nft` program
(daemon_nft_program.py), which of the two first alternating. Every phase logs the
reader's fio completion latency (1 s means: what the initiator sees, "reader_clat"),
and the status samples keep the sensor's read totals (in bridge mode the wire's).

--paper is the method paper's experiment on the known plant (PAPER below).
--thresholds auto[:LO-HI]: one threshold, half the uncontrolled p95 within LO-HI.
--plant auto (make lab): the uncontrolled phase first; where its p95 is under twice the
largest threshold, the plant's slope m is raised (labkit.regime's rule, the plant changed
live: labkit.plant.guest_set) and the phase run again, at most regime.MAX_TRIES times; the
thresholds are those the last one admits (uncontrolled p95 >= 2 T), none when none does.

Raw series go to DIR/raw.json: per phase every 100 ms the reader's, the writers'
and the array's diskstats, every 500 ms the daemon's status and each connection's
retransmissions, the target's nstat and ss around it, the guest's and the
daemon's CPU (labkit.analysis reads them); with --capture, per phase but the bridge's,
the order the target's packets to the writers left its veth (labkit.capture).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit import analysis, bursts, capture, fio, plant, probes, regime, search, speed, topology
from labkit.daemon import Daemon, bridge_config, target_config
from labkit.sampler import Probe, Sampler

SOCK = "/run/santhrottle-exp/control.sock"
STATUS_EVERY = 5  # samples: the daemon's status and ss every 0.5 s
DAEMON_PROFILE = Path(__file__).with_name("daemon_profile.py")
DAEMON_NFT_PROGRAM = Path(__file__).with_name("daemon_nft_program.py")
FIRST_TICK_S = 2.0  # a first discovery (and the pins applied by a tick)


def parse_ms(text: str) -> float:
    from santhrottle.appliance.units import parse_duration_s

    return parse_duration_s(text)


@dataclass
class Setting:
    """What every phase of one run shares: the topology, its hosts, the options."""

    t: dict
    a: argparse.Namespace
    hosts: list[dict]
    port: int
    lat_prefix: Path | None = None  # the running phase's reader latency log (fio's)
    phases_run: int = 0

    @property
    def reader(self) -> dict:
        return self.hosts[0]

    @property
    def writers(self) -> list[dict]:
        return self.hosts[1:]

    def devices(self) -> list[str]:
        return [self.reader["dm"], *[w["dm"] for w in self.writers], Path(self.t["disk"]).name]

    def reader_job(self, runtime: float) -> list[str]:
        """The reader, logging what the initiator sees: fio's completion latency as 1 s
        means, stamped with the epoch (fio.lat_log)."""
        log = ()
        if self.lat_prefix is not None:
            log = (
                f"--write_lat_log={self.lat_prefix}",
                "--log_avg_msec=1000",
                "--log_unix_epoch=1",
            )
        return fio.reader(self.reader["device"], self.a.reader_rate, runtime, extra=log)

    def writer_jobs(self, runtime: float) -> list[list[str]]:
        a = self.a  # --writer-jobs > 1: each job in its own region of the host's LV
        return [
            fio.writers(w["device"], a.writer_bs, a.writer_qd, runtime, jobs=a.writer_jobs)
            for w in self.writers
        ]

    def daemon(
        self, name: str, threshold: str | None, bridge: bool = False, nft_program: bool = False
    ) -> Daemon:
        """santhrottled on the target's veth (threshold None: it only observes), or in
        bridge mode on the topology's bridge: the resource is every volume of the
        portals (one per LUN) or of the nvmet ports, as the wire shows them (threshold
        None: observed). nft_program: its gate through the `nft` program, not the
        library (daemon_nft_program.py: the gate before the library, for comparison)."""
        a, t = self.a, self.t
        state = a.out / f"state-{name}"
        ctl = {"setpoint_fraction": a.setpoint}
        if bridge:
            conf = bridge_config(t["bridge"], SOCK, state, max_delay=a.max_delay)
            vols = [f"iscsi://{topology.hostport(x['portal'], x['port'])}/*/*" for x in t["iscsi"]]
            vols += [
                f"nvme://{topology.hostport(x['traddr'], topology.NVME_PORT)}/*/*"
                for x in t["nvme"]
            ]
            if a.setpoint is not None:
                conf["controller"] = ctl
            res: dict = {"volumes": vols}
            if threshold is not None:
                res["threshold"] = threshold
            conf["resources"] = {t["vg"]: res}
        else:
            conf = target_config(t, SOCK, state, threshold, max_delay=a.max_delay, **ctl)
        command = None
        if a.profile_daemon:  # the same daemon under cProfile, each thread on its CPU clock
            command = [sys.executable, str(DAEMON_PROFILE), str(a.out / f"profile-{name}.prof")]
        if nft_program:
            command = [sys.executable, str(DAEMON_NFT_PROGRAM)]
        return Daemon(name, conf, a.out, command=command)

    def sampler(self, daemon: Daemon | None) -> Sampler:
        ps = [
            Probe("ds", probes.diskstats(self.devices())),
            Probe("epoch", time.time, every=STATUS_EVERY),  # to place fio's latency log
            Probe(
                "retrans",
                probes.retrans(self.t["netns"], self.port),
                every=STATUS_EVERY,
                stamped=True,
            ),
        ]
        if daemon is not None:
            ps.append(Probe("status", daemon.status_row, every=STATUS_EVERY, stamped=True))
        return Sampler(ps)


def phase(
    lab: Setting,
    threshold: str | None,
    static_us: int | None = None,
    cycles: int | None = None,
    bridge: bool = False,
    nft_program: bool = False,
    observed: bool = False,
) -> dict:
    """One phase (module header): uncontrolled (threshold None), controlled at `threshold`,
    static (the writers pinned at static_us, judged against `threshold`), bridged
    (threshold None: the bridge's daemon observing; nft_program: its gate through the
    `nft` program), or observed (the target's daemon with no threshold; `threshold`
    only judges the reader)."""
    a, t = lab.a, lab.t
    static = static_us is not None
    name = f"static-{threshold}-{static_us}us" if static else threshold
    if bridge:
        name = f"bridge-{threshold or 'observe'}" + ("-nft-program" if nft_program else "")
    if observed:
        name = "bridge-observed" if bridge else "observed"
    slow = speed.factor(fresh=True)  # the guest's pace now (the host's limit follows it)
    with_daemon = threshold is not None or bridge
    ruling = None if observed else threshold  # the daemon's own threshold
    daemon = lab.daemon(name, ruling, bridge, nft_program) if with_daemon else None
    lab.phases_run += 1
    lab.lat_prefix = a.out / f"lat-{lab.phases_run:02d}-{name or 'uncontrolled'}"
    ladder = None
    pcap, cap = Path(tempfile.gettempdir()) / f"capture-{name}.pcap", None
    try:
        if daemon is not None:
            ladder = daemon.start()["ladder"]
        if static:
            for w in lab.writers:
                daemon.pin(w["initiator_ip"], static_us)
        time.sleep(FIRST_TICK_S)
        s = lab.sampler(daemon)
        net0 = probes.nstat(t["netns"])
        conns0 = probes.tcp_conns(t["netns"], lab.port)
        cpu0, wall0 = probes.guest_cpu(), time.monotonic()
        dcpu0 = daemon.cpu() if daemon is not None else {}
        if a.capture and not bridge:
            ips = [w["initiator_ip"] for w in lab.writers]
            cap = capture.start(t["netns"], topology.VETH_TGT, lab.port, ips, pcap)
        s.start()
        epoch0 = time.time() - s.now()  # the rows' t = 0 on the capture's clock
        sched = bursts.Schedule(a.lead, a.on, a.off, a.cycles if cycles is None else cycles)
        controls = daemon is not None and threshold is not None and not static
        release = [w["dm"] for w in lab.writers] if controls else None
        # --pause-writers: each pause off_s at the array, not off_s plus the writers' fio
        # start under TCG (labkit.bursts; docs/lab.md, "Stretched pauses")
        paused = [w["dm"] for w in lab.writers] if a.pause_writers else None
        bursts.run(s, lab.reader_job, lab.writer_jobs, sched, not static, release, paused)
        s.stop()
        if cap is not None:
            capture.stop(cap)
            cap = None
        net1 = probes.nstat(t["netns"])
        conns = probes.tcp_conns(t["netns"], lab.port)
        cpu = {
            "wall_s": time.monotonic() - wall0,
            "guest_ticks": {k: v - cpu0[k] for k, v in probes.guest_cpu().items()},
            "probes_cpu_s": dict(s.cpu_s),  # the sampler's own, per probe
        }
        if daemon is not None:  # from the sampler's start to its stop, as the figures
            dcpu1 = daemon.cpu()
            cpu["daemon"] = {k: v - dcpu0.get(k, 0.0) for k, v in dcpu1.items() if k != "error"}
    finally:
        if cap is not None:
            capture.stop(cap)
        if daemon is not None:
            daemon.stop()
    daemon_ns = t["bridge"]["netns"] if bridge else t["netns"]
    kind = "static" if static else ("controlled" if threshold else "uncontrolled")
    kind = "observed" if observed else kind
    order = None
    if a.capture and not bridge and pcap.exists():
        order = capture.order(capture.read(pcap), epoch0, lab.port)
        pcap.unlink()
    return {
        "capture": order,
        "threshold": threshold,
        "plant": (probes.plant_stats() or {}).get("config"),
        "speed_factor": slow,
        "kind": ("bridge-observed" if observed else "bridge") if bridge else kind,
        "nft_program": nft_program,
        "static_delay_us": static_us,
        "ladder": ladder,
        "rows": s.rows,
        "events": s.events,
        "reader_clat": reader_clat(lab.lat_prefix, s.rows),
        "nstat": {k: net1.get(k, 0) - net0.get(k, 0) for k in probes.NSTAT_KEYS},
        "cpu": cpu,
        "tcp_conns": conns,
        "tcp_conns_start": conns0,
        "sets_left_after_stop": probes.sets_left(daemon_ns, bridge),
        "reader_dm": lab.reader["dm"],
        "writer_dms": [w["dm"] for w in lab.writers],
        "writer_ips": [w["initiator_ip"] for w in lab.writers],
        "array": Path(t["disk"]).name,
    }


def reader_clat(prefix: Path, rows: list[dict]) -> list[tuple[float, float]] | None:
    """fio's 1 s means of the reader's completion latency (what the initiator sees), each
    at the end of its second on the phase's clock (the samples' epoch stamps place it);
    None without a log."""
    log = next(iter(sorted(prefix.parent.glob(f"{prefix.name}_clat*.log"))), None)
    stamped = next((r for r in rows if "epoch" in r), None)
    if log is None or stamped is None:
        return None
    offset = stamped["epoch"] - stamped["t"]
    return [(round(end - offset, 3), mean_s) for end, mean_s in fio.lat_log(log)]


def static_search(lab: Setting, thr: str, ctl: dict) -> list[dict]:
    """The smallest delay of the ladder an admin could pin on the writers that holds T
    (labkit.search), from the controller's median class while the writers wrote; the
    static phases, each with "holds"."""
    from santhrottle.controller.ladder import Ladder

    a = lab.a
    lad = ctl["ladder"]
    ladder = Ladder(lad["step_us"], lad["max_delay_us"], lad["ratio"])
    thr_s = parse_ms(thr)
    phases = []

    def holds(k: int) -> bool:
        ph = phase(lab, thr, static_us=ladder.delay_us(k), cycles=a.static_cycles)
        p95 = analysis.summarize(ph, thr_s, None)["read_latency_p95_s"]
        ph["holds"] = p95 <= thr_s
        phases.append(ph)
        print(
            f"  static {thr} at {ladder.delay_us(k) / 1000:g} ms (class {k}): p95 "
            f"{p95 * 1e3:.2f} ms, {'holds' if ph['holds'] else 'over T'}",
            flush=True,
        )
        return ph["holds"]

    start = analysis.writing_class(ctl)
    search.smallest_holding(holds, start, ladder.max_class, a.static_step, a.static_probes)
    return phases


def interference(lab: Setting) -> list[dict]:
    """The reader alone, with one host's writers, with all: a.steady s each, measured
    over the interval the reader ran (diskstats before and after it)."""
    a = lab.a
    out = []
    for n in sorted({0, 1, len(lab.writers)}):
        ws = [fio.start(cmd) for cmd in lab.writer_jobs(a.steady + 3)[:n]]
        time.sleep(2)
        d0, t0 = probes.all_diskstats(), time.monotonic()
        rd = fio.start(lab.reader_job(a.steady))
        res = (rd.result() or {})["read"]
        d1, t1 = probes.all_diskstats(), time.monotonic()
        for w in ws:
            w.wait()
        dm = lab.reader["dm"]
        r = analysis.device_delta(d0[dm], d1[dm], t1 - t0)
        wr = [analysis.device_delta(d0[w["dm"]], d1[w["dm"]], t1 - t0) for w in lab.writers]
        out.append(
            {
                "writers": n,
                "reader_dm_latency_s": r["read_l_s"] if r["reads"] else 0.0,
                "reader_fio_mean_s": res["clat_ns"]["mean"] / 1e9,
                "reader_fio_p95_s": res["clat_ns"]["percentile"]["95.000000"] / 1e9,
                "writes_bytes_per_s": sum(x["write_mb_s"] for x in wr) * 1e6,
                "interval_s": t1 - t0,
            }
        )
        print(f"interference: {out[-1]}", flush=True)
    return out


def uncontrolled_figures(lab: Setting, ph: dict, m_ms: float, c_ms: float) -> regime.Uncontrolled:
    """What labkit.regime reads of an uncontrolled phase."""
    a = lab.a
    w = analysis.writing_windows(ph)
    bs = int(a.writer_bs.rstrip("kK")) * 1024
    return regime.Uncontrolled(
        m_ms=m_ms,
        c_ms=c_ms,
        writers=a.writers * a.writer_jobs,
        p95_s=analysis.summarize(ph, None, None)["read_latency_p95_s"],
        q=sum(x.array_q for x in w) / len(w) if w else 0.0,
        iops=sum(x.write_bps for x in w) / len(w) / bs if w else 0.0,
    )


def slope_tries(
    lab: Setting, rule: Callable[[regime.Uncontrolled], tuple[float | None, dict]], what: str
) -> tuple[list[dict], dict]:
    """The uncontrolled phase at the booted plant's slope, then at each slope `rule` names
    (the next slope or None, and what to keep of the phase), the plant changed live
    (labkit.plant.guest_set), at most regime.MAX_TRIES; returns the tries and the last
    phase."""
    cfg = probes.plant_config() or {}
    m, c = float(cfg.get("m_ms", 0.0)), float(cfg.get("c_ms", 0.0))
    tries: list[dict] = []
    for i in range(regime.MAX_TRIES):
        if i:
            plant.guest_set(m_ms=m)
        unc = phase(lab, None)
        u = uncontrolled_figures(lab, unc, m, c)
        nxt, keep = rule(u)
        nxt = nxt if cfg else None  # no known plant: nothing to change
        tries.append(
            {"m_ms": m, "c_ms": c, "p95_s": u.p95_s, "q": u.q, "iops": u.iops, **keep}
            | {"next_m_ms": nxt}
        )
        print(
            f"{what}: plant m {m:g} ms/IO: uncontrolled p95 {u.p95_s * 1e3:.2f} ms"
            + (f" ({keep['status']})" if "status" in keep else "")
            + f"; Q {u.q:.2f}, {u.iops:.0f} IOPS, writers' time per IO "
            f"outside the array {regime.overhead_s(u) * 1e3:.1f} ms; next slope {nxt}",
            flush=True,
        )
        if nxt is None or nxt == m:
            break
        m = nxt
    return tries, unc


def choose_plant(lab: Setting, wanted: list[str]) -> tuple[dict, dict]:
    """--plant auto (module header): the uncontrolled phase, again at a steeper slope
    while its p95 is under 2 x the largest wanted threshold; returns the choice (every
    try, the slope kept, the verdict, the thresholds) and the last phase."""
    wanted_s = [parse_ms(x) for x in wanted]

    def rule(u: regime.Uncontrolled) -> tuple[float | None, dict]:
        status, _ = regime.verdict(u.p95_s, wanted_s)
        nxt = None if status == "reached" else regime.next_slope(u, max(wanted_s))
        return nxt, {"overhead_s": regime.overhead_s(u), "status": status}

    tries, unc = slope_tries(lab, rule, "regime")
    status, ok = regime.verdict(tries[-1]["p95_s"], wanted_s)
    return {
        "wanted": wanted,
        "tries": tries,
        "m_ms": tries[-1]["m_ms"],  # the plant the last try, and every phase after it, ran at
        "c_ms": tries[-1]["c_ms"],
        "status": status,
        "thresholds": [x for x, t in zip(wanted, wanted_s, strict=True) if t in ok],
        "regime_x": regime.REGIME_X,
        "aim_x": regime.AIM_X,
    }, unc


def light(lab: Setting, wanted: list[str], phases: list[dict]) -> dict:
    """--light (module header): the plant and threshold chosen; the phases appended to
    `phases` as they end (a cut run keeps those)."""
    by_s = {parse_ms(x): x for x in wanted}
    aim_s = min(by_s)
    tries, unc = slope_tries(lab, lambda u: (regime.light_slope(u, aim_s), {}), "light")
    m, c = tries[-1]["m_ms"], tries[-1]["c_ms"]
    unc["rep"] = 0
    phases.append(unc)
    say(unc, "uncontrolled", None)
    p95 = tries[-1]["p95_s"]
    t_s = regime.light_threshold(p95, list(by_s))
    thr = None if t_s is None else by_s[t_s]
    choice = {
        "wanted": wanted,
        "tries": tries,
        "m_ms": m,
        "c_ms": c,
        "uncontrolled_p95_s": p95,
        "light_x": regime.LIGHT_X,
        "aim_x": regime.LIGHT_AIM_X,
        "threshold": thr,
    }
    print(f"light plant: m {m:g} ms/IO, threshold {thr}", flush=True)
    if thr is None:
        return choice
    for rep in range(lab.a.reps):
        if lab.a.bridge_only:  # the bridge's controlled phase alone (and uncontrolled)
            todo = [("bridge", thr, True)]
        else:
            todo = [("controlled", thr, False)]
            todo += [("observed", thr, False)] if lab.a.observed else []
            todo += [("bridge-observed", thr, True)] if lab.a.bridge and lab.a.observed else []
            todo += [("bridge", thr, True)] if lab.a.bridge else []
        if rep:
            todo.insert(0, ("uncontrolled", None, False))
        for what, t, bridge in todo:
            ph = phase(lab, t, bridge=bridge, observed=what in ("observed", "bridge-observed"))
            ph["rep"] = rep
            phases.append(ph)
            say(ph, f"{what} (repetition {rep})", t)
    return choice


def bridge_check(lab: Setting, thr: str, phases: list[dict], save: Callable[[], None]) -> None:
    """--bridge-check (module header): the phases appended to `phases` as they end, and
    saved (a run cut by its guest's timeout keeps them)."""
    todo = [("uncontrolled", None, False, False), ("bridge observing", None, True, False)]
    for rep in range(lab.a.reps):
        pair = [("bridge", thr, True, False), ("bridge, gate by the nft program", thr, True, True)]
        todo += pair if rep % 2 == 0 else pair[::-1]  # which runs first alternates
    seen: dict[tuple, int] = {}
    for what, t, bridge, program in todo:
        ph = phase(lab, t, bridge=bridge, nft_program=program)
        ph["rep"] = seen[what, t] = seen.get((what, t), -1) + 1
        phases.append(ph)
        save()
        say(ph, f"{what} (repetition {ph['rep']})", t)


# --paper: the method paper's experiment on the known plant (docs/lab.md); explicit
# options still win.  No setpoint, no max_delay: the daemon runs the product's defaults.
PAPER = {
    "disk": "array",
    "writers": 3,
    "writer_jobs": 4,
    "writer_bs": "128k",
    "writer_qd": 1,
    "lv_size_mib": 1536,
    "thresholds": "10ms,15ms,20ms",
    "max_delay": None,
    "setpoint": None,
    "cycles": 4,
    "on": 20.0,
    "off": 5.0,
    "static": True,
    "bridge": True,
}


def hosts(t: dict, protocol: str) -> list[dict]:
    """The initiator hosts, reader first: the iSCSI LUNs' initiators, or the NVMe/TCP
    hosts (each its own address, host NQN and subsystem; initiator_ip its source)."""
    if protocol == "iscsi":
        return t["iscsi"]
    return [dict(n, initiator_ip=n["host_traddr"]) for n in t["nvme"]]


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument(
        "--protocol",
        choices=("iscsi", "nvme"),
        default="iscsi",
        help="the reader and the writer hosts: iSCSI initiators (LIO) or NVMe/TCP hosts "
        "(nvmet), on the same VG",
    )
    ap.add_argument("--paper", action="store_true", help="the paper's experiment (PAPER)")
    ap.add_argument(
        "--ipv6",
        default="",
        help="hosts over IPv6 (topology --ipv6-iscsi / --ipv6-nvme), by index: 0 is the "
        "reader, 1.. the writer hosts; e.g. 0,3",
    )
    ap.add_argument(
        "--nvme-quickack",
        action="store_true",
        help="the NVMe/TCP hosts' routes to their ports with quickack 1 (topology.up)",
    )
    ap.add_argument(
        "--disk",
        choices=("nullb", "array"),
        default="nullb",
        help="array: lab.py --array nbd's known plant",
    )
    ap.add_argument("--lv-size-mib", type=int, default=256)
    ap.add_argument("--writers", type=int, default=3, help="writer hosts")
    ap.add_argument("--writer-jobs", type=int, default=1, help="writers per host")
    ap.add_argument("--writer-bs", default="64k")
    ap.add_argument("--writer-qd", type=int, default=4)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--mbps", type=int, default=20)
    ap.add_argument("--queue-depth", type=int, default=4)
    # under half the one-vCPU lab's uncontrolled p95 (2.1-5.7 ms, docs/lab.md);
    # "auto[:LO-HI]": one threshold, half the uncontrolled phase's p95 (auto_threshold)
    ap.add_argument("--thresholds", default="1ms,1.25ms")
    ap.add_argument(
        "--plant",
        default="fixed",
        choices=("fixed", "auto"),
        help="auto: choose the plant's slope so that the uncontrolled p95 is at least 2 T "
        "at every threshold (choose_plant); fixed: the plant lab.py started",
    )
    # "default": the product's (nothing in the daemon's file)
    ap.add_argument("--max-delay", default="100ms")
    # The null_blk lab's reader is noisy (heavy-tailed waits behind writes, ~6 reads
    # per tick): aiming at 0.55 x threshold keeps p95 of the 1 s mean under it
    # (docs/lab.md, tuned with the simulator fitted to the lab); "default": the
    # product's setpoint_fraction.
    ap.add_argument("--setpoint", default=0.55)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument(
        "--pause-writers",
        action="store_true",
        help="one fio per writer host, SIGSTOPped between on-periods (labkit.bursts)",
    )
    ap.add_argument("--on", type=float, default=25.0)
    ap.add_argument("--off", type=float, default=5.0)
    ap.add_argument("--lead", type=float, default=4.0)
    ap.add_argument("--steady", type=float, default=6.0)
    ap.add_argument("--skip-interference", action="store_true")
    ap.add_argument(
        "--light",
        action="store_true",
        help="work conservation: T the smallest threshold the uncontrolled p95 stays "
        "under, then --reps x (controlled, bridge with --bridge, uncontrolled)",
    )
    ap.add_argument("--reps", type=int, default=3, help="--light's repetitions")
    ap.add_argument(
        "--observed",
        action="store_true",
        help="--light: per repetition also the daemon with no threshold (module header)",
    )
    ap.add_argument(
        "--static",
        action="store_true",
        help="per threshold, the smallest delay pinned by hand that holds it",
    )
    ap.add_argument("--no-static", dest="static", action="store_false")
    ap.add_argument("--static-probes", type=int, default=4)
    ap.add_argument("--static-cycles", type=int, default=2)
    ap.add_argument("--static-step", type=int, default=5, help="classes per probe")
    ap.add_argument(
        "--bridge",
        action="store_true",
        help="the initiators behind a transparent bridge; per threshold, after the target "
        "host's phases, one controlled by santhrottled in bridge mode on it",
    )
    ap.add_argument("--no-bridge", dest="bridge", action="store_false")
    ap.add_argument(
        "--bridge-only",
        action="store_true",
        help="--light: per repetition only the bridge's controlled phase (and the "
        "uncontrolled one), no target-host or observed phases",
    )
    ap.add_argument(
        "--bridge-check",
        action="store_true",
        help="the bridge alone, on the plant lab.py started, at the first of --thresholds: "
        "uncontrolled, the bridge's daemon observing, then --reps x (bridge, bridge with "
        "its gate by the nft program), each with the reader's fio latency log",
    )
    ap.add_argument(
        "--profile-daemon",
        action="store_true",
        help="each phase's daemon under cProfile, each thread on its own CPU clock "
        "(daemon_profile.py): OUT/profile-NAME.prof (the main thread), "
        "OUT/profile-NAME.THREAD.prof, OUT/profile-NAME.all.prof",
    )
    ap.add_argument(
        "--capture",
        action="store_true",
        help="the packets between the target and the writers captured at its veth (headers) "
        "in every phase but the bridge's: the order the target's left santhrottle's qdisc, "
        "and each retransmission's timing (labkit.capture)",
    )
    pre, _ = ap.parse_known_args()
    if pre.paper:
        ap.set_defaults(**PAPER)
    a = ap.parse_args()
    if a.plant == "auto" and (a.disk != "array" or a.thresholds.startswith("auto")):
        ap.error(
            "--plant auto chooses the known plant's slope (--disk array) for fixed "
            "thresholds, not with --thresholds auto"
        )
    if a.light and (a.plant == "auto" or a.thresholds.startswith("auto")):
        ap.error(
            "--light keeps the plant and picks T itself: not with --plant auto or --thresholds auto"
        )
    if a.bridge_only:
        if not a.light:
            ap.error("--bridge-only goes with --light")
        a.bridge = True
    if a.bridge_check:
        if a.light or a.plant == "auto" or a.thresholds.startswith("auto"):
            ap.error("--bridge-check runs on the plant and at the threshold given")
        a.bridge = True
    if a.max_delay in (None, "default"):
        a.max_delay = None
    a.setpoint = None if a.setpoint in (None, "default") else float(a.setpoint)
    return a


def say(ph: dict, what: str, threshold: str | None) -> None:
    s = analysis.summarize(ph, parse_ms(threshold) if threshold else None, None)
    print(
        f"phase {what} done: p95 {s['read_latency_p95_s'] * 1e3:.2f} ms, writes "
        f"{s['write_bytes_per_s'] / 1e6:.1f} MB/s",
        flush=True,
    )


def main() -> int:
    a = arguments()
    a.out.mkdir(parents=True, exist_ok=True)
    nvme = a.protocol == "nvme"
    if a.disk == "array":
        topology.load_modules(["virtio_blk"])
    n = a.writers + 1
    v6 = tuple(int(x) for x in a.ipv6.split(",") if x)
    t = topology.up(
        luns=0 if nvme else n,
        nvme=n if nvme else 0,
        disk=a.disk,
        lv_size_mib=a.lv_size_mib,
        nullb_mbps=a.mbps,
        nullb_queue_depth=a.queue_depth,
        bridge=a.bridge,
        ipv6_iscsi=() if nvme else v6,
        ipv6_nvme=v6 if nvme else (),
        nvme_quickack=a.nvme_quickack,
    )
    lab = Setting(t, a, hosts(t, a.protocol), topology.NVME_PORT if nvme else topology.ISCSI_PORT)
    raw: dict = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "kernel": os.uname().release,
        "protocol": a.protocol,
        "hosts": [
            {k: h.get(k) for k in ("initiator_ip", "device", "dm", "lv", "iqn", "nqn", "hostnqn")}
            for h in lab.hosts
        ],
        "topology_timings_s": t.get("timings_s"),
        "array_config": probes.plant_config(),
    }
    t_all = time.monotonic()
    try:
        thresholds = a.thresholds.split(",")
        if a.light:
            raw["phases"] = []
            raw["light"] = light(lab, thresholds, raw["phases"])
            return 0
        if a.bridge_check:
            raw["phases"] = []
            bridge_check(
                lab,
                thresholds[0],
                raw["phases"],
                lambda: (a.out / "raw.json").write_text(json.dumps(raw)),
            )
            return 0
        if a.plant == "auto":  # the plant first: the interference points run on it
            raw["plant_choice"], unc = choose_plant(lab, thresholds)
        raw["interference"] = [] if a.skip_interference else interference(lab)
        if a.plant != "auto":
            unc = phase(lab, None)
        raw["phases"] = [unc]
        say(unc, "uncontrolled", None)
        if a.thresholds.startswith("auto"):
            unc_p95_s = analysis.summarize(unc, None, None)["read_latency_p95_s"]
            thresholds = [regime.auto_threshold(unc_p95_s, a.thresholds)]
            print(f"uncontrolled p95 {unc_p95_s * 1e3:.2f} ms: threshold {thresholds[0]}")
        elif a.plant == "auto":
            thresholds = raw["plant_choice"]["thresholds"]
        for thr in thresholds:
            ctl = phase(lab, thr)
            raw["phases"].append(ctl)
            say(ctl, thr, thr)
            if a.static:
                raw["phases"] += static_search(lab, thr, ctl)
            if a.bridge:
                br = phase(lab, thr, bridge=True)
                raw["phases"].append(br)
                say(br, f"{thr} through the bridge", thr)
    finally:
        raw["guest_wall_s"] = time.monotonic() - t_all
        (a.out / "raw.json").write_text(json.dumps(raw))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
