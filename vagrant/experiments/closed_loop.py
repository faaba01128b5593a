#!/usr/bin/env python3
"""The paper's experiments in the lab guest (issue: closed loop). Runs INSIDE the guest.

    python3 vagrant/qemu/lab.py run vagrant/experiments/closed_loop.py --out DIR [--short]

(`make lab` runs it through vagrant/experiments/report.py, which also draws
the report.) The topology: LIO in netns `tgt` on a VG over a shared "array"
(null_blk: memory-backed, a bandwidth cap and a small hardware queue shared by
reads and writes), one iSCSI initiator per LV. Experiments:

1. interference (paper 3.4): a 256 kB/s 4 KiB random reader on LV 0 alone,
   then with 1 and with all writers on the other LVs; steady state each.
2. controlled (paper 3.6): the writers switched on together for `on` s and
   off for `off` s, `cycles` times, once without the daemon and once per
   threshold with santhrottled discovering the VG and the writers by itself.
   In the last on-period of each controlled phase the reader stops: the
   writers no longer hurt anyone, and the release time of their throttle is
   measured.
Raw series go to DIR/raw.json: every 100 ms the reader's and the VG's
diskstats counters, the writers' write bytes, the array's in-flight time
(for the LQ fit); every 500 ms the daemon's status and each iSCSI
connection's retransmissions (`ss -ti`); nstat of the target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(CHECKOUT / "vagrant" / "qemu" / "guest"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import topology  # noqa: E402
from report import conn_retrans, summarize  # noqa: E402

BIN = Path(sys.executable).parent
SOCK = "/run/santhrottle-exp/control.sock"
# The unit the daemon ships with: the experiment runs it at the unit's Nice=.
UNIT = CHECKOUT / "systemd" / "santhrottled.service"
SAMPLE_S = 0.1
STATUS_EVERY = 5  # samples: the daemon's status every 0.5 s
NSTAT_KEYS = (
    "TcpRetransSegs",
    "TcpExtTCPLossProbes",
    "TcpExtTCPFastRetrans",
    "TcpExtTCPTimeouts",
    # reordering the target's TCP noticed (SACK / timestamps) and the
    # initiators' DSACKs (a retransmission they already had: spurious)
    "TcpExtTCPSACKReorder",
    "TcpExtTCPTSReorder",
    "TcpExtTCPDSACKRecv",
)
# What `ss -ti` says of each iSCSI connection at a phase's end: RACK's
# reordering window is min_rtt / 4 until the connection has seen reordering.
SS_FIELDS = re.compile(r"\b(minrtt|rtt|retrans|reord_seen|reordering):(\S+)")


def tcp_conns(netns: str, port: int = 3260) -> list[dict[str, str]]:
    text = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-tinH", "state", "established",
         f"( sport = :{port} )"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    conns: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            conns.append({"peer": line.split()[-1]})
        elif conns:
            conns[-1].update(SS_FIELDS.findall(line))
    return conns


def diskstats() -> dict[str, list[int]]:
    out = {}
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            out[p[2]] = [int(x) for x in p[3:14]]
    return out


def nstat(netns: str) -> dict[str, int]:
    text = subprocess.run(
        ["ip", "netns", "exec", netns, "nstat", "-saz"], capture_output=True, text=True
    ).stdout
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in NSTAT_KEYS:
            vals[parts[0]] = int(parts[1])
    return vals


def fio(dev: str, *job: str, runtime: float) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "fio",
            "--output-format=json",
            "--name=j",
            f"--filename={dev}",
            "--direct=1",
            "--ioengine=libaio",
            "--time_based",
            f"--runtime={runtime:.1f}",
            "--size=200m",
            *job,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd="/tmp",
    )


def reader_job(a: argparse.Namespace, dev: str, runtime: float) -> subprocess.Popen:
    """The paper's small random reader: 4 KiB, QD1, rate-limited."""
    return fio(
        dev, "--rw=randread", "--bs=4k", "--iodepth=1", f"--rate={a.reader_rate}", runtime=runtime
    )


def writer_job(a: argparse.Namespace, dev: str, runtime: float) -> subprocess.Popen:
    """One writer host: sequential writes at the configured size and depth."""
    return fio(
        dev, "--rw=write", f"--bs={a.writer_bs}", f"--iodepth={a.writer_qd}", runtime=runtime
    )


class Sampler(threading.Thread):
    def __init__(self, devices: list[str], daemon: bool, netns: str) -> None:
        super().__init__(daemon=True)
        self.devices = devices
        self.netns = netns
        self.with_daemon = daemon
        self.rows: list[dict] = []
        self.events: list[tuple[float, str]] = []
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()

    def mark(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.t0, 3), what))

    def run(self) -> None:
        from santhrottle.appliance.daemon.control import request

        k = 0
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            ds = diskstats()
            row = {
                "t": round(time.monotonic() - self.t0, 3),
                "ds": {d: ds[d] for d in self.devices if d in ds},
            }
            slow = k % STATUS_EVERY == 0
            if slow:  # which connection retransmitted, and when
                row["retrans"] = conn_retrans(tcp_conns(self.netns))
            if self.with_daemon and slow:
                try:
                    st = request(SOCK, "status", timeout_s=2.0)
                    row["status"] = {
                        "resources": [
                            {x: r[x] for x in ("resource", "read_latency_ewma_s", "delay_class")}
                            for r in st["resources"]
                        ],
                        "initiators": {
                            i["initiator"]: i["class"] for i in st["initiators"] if i["class"]
                        },
                        "overruns": st["counters"]["tick_overruns"],
                        "glided": st["counters"]["glided_descents"],
                        "unordered": st["counters"]["unordered_descents"],
                    }
                except Exception as e:  # keep sampling; record why
                    row["status_error"] = str(e)
            self.rows.append(row)
            k += 1
            nxt += SAMPLE_S
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))


def unit_nice() -> int:
    """The Nice= of the systemd unit (0 without one)."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("Nice="):
            return int(line.removeprefix("Nice="))
    return 0


def start_daemon(
    t: dict, threshold: str, conf_dir: Path, max_delay: str, setpoint: float
) -> subprocess.Popen:
    conf = conf_dir / f"santhrottle-{threshold}.toml"
    conf.write_text(
        f'[daemon]\ncontrol_socket = "{SOCK}"\nnetns = "{t["netns"]}"\n'
        f'state_dir = "{conf_dir / f"state-{threshold}"}"\n'
        f'[datapath]\ndevices = ["{t["veth"]["target"]}"]\nmax_delay = "{max_delay}"\n'
        f'link_speed = "10gbit"\n[metrics]\nport = 0\n'
        f"[controller]\nsetpoint_fraction = {setpoint}\n"
        f'[resources.{t["vg"]}]\nthreshold = "{threshold}"\n'
    )
    log = open(conf_dir / f"santhrottled-{threshold}.log", "w")  # noqa: SIM115 - lives with the process
    nice = unit_nice()
    p = subprocess.Popen(
        [str(BIN / "santhrottled"), "--config", str(conf)],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.nice(nice),  # as systemd runs it
    )
    deadline = time.monotonic() + 90
    while not os.path.exists(SOCK):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"santhrottled did not start: {(conf_dir / log.name).read_text()}")
        time.sleep(0.2)
    return p


def stop_daemon(p: subprocess.Popen, conf_dir: Path, threshold: str) -> None:
    p.send_signal(signal.SIGTERM)  # our own child, by PID
    p.wait(timeout=60)
    subprocess.run(
        [
            str(BIN / "santhrottle"),
            "cleanup",
            "--config",
            str(conf_dir / f"santhrottle-{threshold}.toml"),
        ],
        capture_output=True,
    )


def phase(t: dict, a: argparse.Namespace, threshold: str | None, out: Path) -> dict:
    reader, writers = t["iscsi"][0], t["iscsi"][1:]
    devices = [reader["dm"], *[w["dm"] for w in writers], Path(t["disk"]).name]
    daemon = start_daemon(t, threshold, out, a.max_delay, a.setpoint) if threshold else None
    try:
        time.sleep(2.0)  # a first discovery
        s = Sampler(devices, daemon is not None, t["netns"])
        net0 = nstat(t["netns"])
        conns0 = tcp_conns(t["netns"])
        s.start()
        duration = a.lead + a.cycles * (a.on + a.off)
        rd = reader_job(a, reader["device"], duration)
        s.mark("reader on")
        time.sleep(a.lead)
        for c in range(a.cycles):
            last = c == a.cycles - 1
            ws = [writer_job(a, w["device"], a.on) for w in writers]
            s.mark("writers on")
            if last and daemon is not None:
                time.sleep(a.on / 2)
                rd.send_signal(signal.SIGINT)  # the reader leaves: nobody to protect
                s.mark("reader off")
            for w in ws:
                w.communicate()
            s.mark("writers off")
            time.sleep(a.off)
        if rd.poll() is None:
            rd.wait(timeout=30)
        s.stop_ev.set()
        s.join()
        net1 = nstat(t["netns"])
        conns = tcp_conns(t["netns"])
    finally:
        if daemon is not None:
            stop_daemon(daemon, out, threshold)
    members = subprocess.run(
        ["ip", "netns", "exec", t["netns"], "ipset", "list", "-n"], capture_output=True, text=True
    ).stdout.split()
    return {
        "threshold": threshold,
        "rows": s.rows,
        "events": s.events,
        "nstat": {k: net1.get(k, 0) - net0.get(k, 0) for k in NSTAT_KEYS},
        "tcp_conns": conns,
        "tcp_conns_start": conns0,
        "sets_left_after_stop": [m for m in members if m.startswith("santhrottle")],
        "reader_dm": reader["dm"],
        "writer_dms": [w["dm"] for w in writers],
        "writer_ips": [w["initiator_ip"] for w in writers],
        "array": Path(t["disk"]).name,
    }


def interference(t: dict, a: argparse.Namespace) -> list[dict]:
    reader, writers = t["iscsi"][0], t["iscsi"][1:]
    out = []
    for n in sorted({0, 1, len(writers)}):
        ws = [writer_job(a, w["device"], a.steady + 3) for w in writers[:n]]
        time.sleep(2)
        d0 = diskstats()
        rd = reader_job(a, reader["device"], a.steady)
        res = json.loads(rd.communicate()[0])["jobs"][0]["read"]
        d1 = diskstats()
        for w in ws:
            w.communicate()
        dm = reader["dm"]
        reads = d1[dm][0] - d0[dm][0]
        out.append(
            {
                "writers": n,
                "reader_dm_latency_s": (d1[dm][3] - d0[dm][3]) / 1000 / max(1, reads),
                "reader_fio_mean_s": res["clat_ns"]["mean"] / 1e9,
                "reader_fio_p95_s": res["clat_ns"]["percentile"]["95.000000"] / 1e9,
                "writes_bytes_per_s": sum(d1[w["dm"]][6] - d0[w["dm"]][6] for w in writers)
                * 512
                / (a.steady + 2),
            }
        )
        print(f"interference: {out[-1]}", flush=True)
    return out


# CI's short loop: the threshold is half what this host's uncontrolled phase made (the
# emulated array's contention varies with the host's load: 2.1-8.6 ms), on a 0.25 ms
# grid, within 1-2 ms (1 ms: the lowest the two-vCPU guest's noise lets it hold).
AUTO_FRACTION = 0.5
AUTO_GRID_US = 250
AUTO_MIN_US, AUTO_MAX_US = 1000, 2000


def auto_threshold(uncontrolled_p95_s: float) -> str:
    """'1.75ms' for an uncontrolled p95 of 3.9 ms; '2ms' at 4 ms and above; '1ms' below
    2.5 ms (then the test finds the contention too small to tell)."""
    us = int(uncontrolled_p95_s * 1e6 * AUTO_FRACTION) // AUTO_GRID_US * AUTO_GRID_US
    us = max(AUTO_MIN_US, min(AUTO_MAX_US, us))
    return f"{us / 1000:g}ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--writer-bs", default="64k")
    ap.add_argument("--writer-qd", type=int, default=4)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--mbps", type=int, default=20)
    ap.add_argument("--queue-depth", type=int, default=4)
    # under half the one-vCPU lab's uncontrolled p95 (2.1-5.7 ms, docs/lab.md);
    # "auto": one threshold, half the uncontrolled phase's p95 (auto_threshold)
    ap.add_argument("--thresholds", default="1ms,1.25ms")
    ap.add_argument("--max-delay", default="100ms")
    # The lab's reader is noisy (heavy-tailed waits behind writes, ~6 reads per
    # tick): aiming at 0.55 x threshold keeps p95 of the 1 s mean under it
    # (docs/lab.md, tuned with the simulator fitted to the lab).
    ap.add_argument("--setpoint", type=float, default=0.55)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--on", type=float, default=25.0)
    ap.add_argument("--off", type=float, default=5.0)
    ap.add_argument("--lead", type=float, default=4.0)
    ap.add_argument("--steady", type=float, default=6.0)
    ap.add_argument("--skip-interference", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t = topology.up(
        luns=a.writers + 1, nvme=0, disk="nullb", nullb_mbps=a.mbps, nullb_queue_depth=a.queue_depth
    )
    raw: dict = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "kernel": os.uname().release,
        "topology_timings_s": t.get("timings_s"),
    }
    try:
        raw["interference"] = [] if a.skip_interference else interference(t, a)
        raw["phases"] = [phase(t, a, None, a.out)]
        print("phase uncontrolled done", flush=True)
        thresholds = a.thresholds.split(",")
        if a.thresholds == "auto":
            unc_p95_s = summarize(raw["phases"][0], None, None)["read_latency_p95_s"]
            thresholds = [auto_threshold(unc_p95_s)]
            print(f"uncontrolled p95 {unc_p95_s * 1e3:.2f} ms: threshold {thresholds[0]}")
        for thr in thresholds:
            raw["phases"].append(phase(t, a, thr, a.out))
            print(f"phase {thr} done", flush=True)
    finally:
        (a.out / "raw.json").write_text(json.dumps(raw))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
