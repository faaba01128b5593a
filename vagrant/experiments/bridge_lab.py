#!/usr/bin/env python3
"""Bridge mode in the lab: the wire against the target and fio; what the gate costs. In the guest.

    .venv/bin/python vagrant/qemu/lab.py --array nbd:c_ms=2,m_ms=5 run --timeout 3000 \\
        vagrant/experiments/bridge_lab.py [--only agreement|nf-cost] [--seconds 20]
    make lab-bridge                                    # the same, both parts

(docs/bridge.md, "Measured in the lab".)  The topology with a bridge
(labkit.topology with a bridge: the initiators -- lab-bi [lab-br in netns labbr] lab-ba
-- the target) on the known plant (the lab-array disk).

agreement
    santhrottled in bridge mode on lab-br, observing (no threshold): one
    resource per reader volume, named as the wire names it. An iSCSI reader
    (LUN 0) and an NVMe/TCP reader (namespace 1 of subsystem nvme0), 4 KiB
    random reads at QD1 and --reader-iops, each alone (idle) and beside
    writers on the other LVs of the same VG (three iSCSI hosts and one
    NVMe/TCP host, sequential --writer-bs 16 KiB at --writer-qd 2). The
    sessions log in through the running daemon's bridge, so the wire names
    every volume; at the end the daemon is restarted in mid-session and
    names them again from its saved names (daemon.state_dir). Every second: the daemon's
    read totals for the reader's resource (the wire), the target's diskstats
    for the reader's LV (dm-N), and fio's own completion latency (its
    latency log averaged over 1 s, stamped with the epoch). Per 1 s window
    the mean latency of each; per phase the mean over its windows and each
    source against the wire.

nf-cost
    The per-packet cost of the two gates a bridged packet can pass
    (bridge_nfcost.py).

capture (--capture, after the agreement)
    tcpdump on the array-side port while both readers read and two writers
    write zeros at 1 MB/s, gzipped to OUT/lab-wire.pcap.gz with the daemon's
    wire counts over it: the lab traffic `make bench` replays
    (tests/fixtures/wire/lab-wire.pcap.gz).

Results: OUT/bridge-lab.json (default /shared/work/bridge, the run dir's
work/bridge on the host) and tables on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bridge_nfcost import STREAM_PORT, nf_cost
from labkit import fio, probes, topology
from labkit.analysis import READ_TICKS, READS
from labkit.daemon import Daemon, bridge_config
from labkit.sampler import Probe, Sampler

SOCK = "/run/santhrottle-exp/control.sock"
NAME = "bridge"  # the daemon's config and log: santhrottle-bridge.toml, santhrottled-bridge.log
# the wire sensor's counts per phase: what it matched, what it could not, what it lost
WIRE_KEYS = ("completions", "unmatched", "replaced", "capture_frames", "capture_kernel_drops")
WARMUP_WINDOWS = 2  # the first windows of a phase: fio ramps, the daemon's counters start
SAMPLE_S = 1.0
# the bridge's set-up comes first in bridge mode: a longer start than the target's
START_S = 120.0


# ------------------------------------------------------------------ daemon
def daemon(t: dict, out: Path, leaf: str = "netem", ports: list[int] | None = None) -> Daemon:
    """santhrottled in bridge mode on lab-br, observing: one resource per reader volume
    (iSCSI LUN 0, NVMe/TCP namespace 1 of nvme0), one for the writers' volumes."""
    lun0, nvme0 = t["iscsi"][0], t["nvme"][0]
    writers = [f"iscsi://{x['portal']}:{x['port']}/*/*" for x in t["iscsi"][1:]]
    writers += [f"nvme://{x['traddr']}:{x['port']}/*/*" for x in t["nvme"][1:]]
    conf = bridge_config(t["bridge"], SOCK, out / "state", leaf=leaf, ports=ports)
    conf["resources"] = {
        "r_iscsi": {"volumes": [f"iscsi://{lun0['portal']}:{lun0['port']}/{lun0['iqn']}/0"]},
        "r_nvme": {"volumes": [f"nvme://{nvme0['traddr']}:{nvme0['port']}/{nvme0['nqn']}/1"]},
        "writers": {"volumes": writers},
    }
    return Daemon(NAME, conf, out)


# --------------------------------------------------------------- agreement
def sampler(d: Daemon, resource: str, dm: str) -> Sampler:
    """Every second: epoch time, the resource's wire totals, the LV's diskstats."""

    def wire() -> dict:
        st = d.status()
        r = next(x for x in st["resources"] if x["resource"] == resource)
        return {"totals": (r["reads_completed"], r["read_time_s"]), "counters": st.get("wire")}

    return Sampler(
        [Probe("epoch", time.time), Probe("wire", wire), Probe("ds", probes.diskstats([dm]))],
        period_s=SAMPLE_S,
    )


def windows(rows: list[dict], dm: str, fio_lat: list[tuple[float, float]]) -> list[dict]:
    """Per window between two samples (about 1 s): the wire's, the LV's and fio's mean
    latency."""
    out = []
    for a, b in itertools.pairwise(rows):
        if "wire" not in a or "wire" not in b or dm not in a["ds"] or dm not in b["ds"]:
            continue
        (na, ta), (nb, tb) = a["wire"]["totals"], b["wire"]["totals"]
        da, db = a["ds"][dm], b["ds"][dm]
        n_wire, n_ds = nb - na, db[READS] - da[READS]
        if n_wire <= 0 or n_ds <= 0:
            continue
        w = {
            "end": b["epoch"],
            "reads_wire": n_wire,
            "reads_disk": n_ds,
            "wire_s": (tb - ta) / n_wire,
            "disk_s": (db[READ_TICKS] - da[READ_TICKS]) / 1e3 / n_ds,
        }
        # fio's interval ending closest to this window's end, within half a second
        near = [v for t_end, v in fio_lat if abs(t_end - b["epoch"]) <= 0.5]
        w["fio_s"] = near[0] if near else None
        out.append(w)
    return out[WARMUP_WINDOWS:-1]


def summarize(ws: list[dict]) -> dict:
    def mean(k):
        vals = [w[k] for w in ws if w.get(k) is not None]
        return statistics.fmean(vals) if vals else None

    s = {
        "windows": len(ws),
        "wire_s": mean("wire_s"),
        "disk_s": mean("disk_s"),
        "fio_s": mean("fio_s"),
    }
    for other in ("disk", "fio"):
        ratios = [w["wire_s"] / w[f"{other}_s"] for w in ws if w.get(f"{other}_s")]
        if s[f"{other}_s"]:
            s[f"wire_vs_{other}"] = s["wire_s"] / s[f"{other}_s"] - 1.0
        if ratios:
            q = statistics.quantiles(ratios, n=20) if len(ratios) > 1 else ratios * 19
            s[f"window_ratio_{other}"] = {
                "median": statistics.median(ratios),
                "p5": q[0],
                "p95": q[-1],
                "min": min(ratios),
                "max": max(ratios),
            }
    return s


def agreement(a, t: dict, out: Path) -> tuple[list[dict], dict, dict | None]:
    """The phases (and with --capture the capture); then a restart of the daemon in
    mid-session, and the names it keeps."""
    d = daemon(t, out)
    d.start(START_S)
    # the sessions log in through the running bridge, as they do in production: the
    # wire names each volume from its login
    topology.iscsi_login(t["iscsi"])
    topology.nvme_connect(t["nvme"])
    results = []
    try:
        readers = {
            "iscsi": ("r_iscsi", t["iscsi"][0]["device"], t["iscsi"][0]["dm"]),
            "nvme": ("r_nvme", t["nvme"][0]["device"], t["nvme"][0]["dm"]),
        }
        writer_devs = [x["device"] for x in t["iscsi"][1:] + t["nvme"][1:]]
        for rep in range(a.reps):
            for proto, (res, dev, dm) in readers.items():
                for load in ("idle", "loaded"):
                    ws = writer_devs if load == "loaded" else []
                    results.append(phase(a, d, f"{proto}-{load}-{rep}", res, dev, dm, ws, out))
                    show(results[-1])
        cap = capture(a, d, t, out) if a.capture else None
        (out / "status-end.json").write_text(json.dumps(d.status(timeout_s=5.0), indent=1))
        d.stop()
        d.start(START_S)
        restart = names_after_restart(d, t)
        print(f"after a restart: {restart}", flush=True)
    finally:
        d.stop()
    return results, restart, cap


CAPTURE = "lab-wire.pcap"


def reader(dev: str, iops: int, runtime: float, *extra: str) -> list[str]:
    """A 4 KiB random reader at QD1 and `iops` (fio's --rate_iops)."""
    return fio.argv(
        "j",
        dev,
        "--rw=randread",
        "--bs=4k",
        "--iodepth=1",
        f"--rate_iops={iops}",
        *extra,
        runtime=runtime,
        size="200m",
    )


def capture(a, d: Daemon, t: dict, out: Path) -> dict:
    """The array-side port captured (tcpdump, whole frames, the storage ports) while both
    readers read and one iSCSI and one NVMe/TCP writer write zeros at 1 MB/s (fio
    --zero_buffers: the capture compresses to a fixture), for `make bench`'s replay of
    lab traffic (tests/fixtures/wire/); gzipped to OUT/lab-wire.pcap.gz, with the
    daemon's wire counts over the capture."""
    import gzip
    import signal

    b = t["bridge"]
    pcap = out / CAPTURE
    dump = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            b["netns"],
            "tcpdump",
            "-i",
            b["array_port"],
            "-s",
            "0",
            "-U",
            "-w",
            str(pcap),
            "tcp port 3260 or tcp port 4420",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(2.0)
    w0 = d.status()["wire"]
    jobs = [
        fio.start(reader(x["device"], a.reader_iops, a.capture_seconds))
        for x in (t["iscsi"][0], t["nvme"][0])
    ]
    jobs += [
        fio.start(
            fio.argv(
                "j",
                x["device"],
                "--rw=write",
                "--bs=16k",
                "--iodepth=2",
                "--rate=1m",
                "--zero_buffers",
                runtime=a.capture_seconds,
                size="200m",
            )
        )
        for x in (t["iscsi"][1], t["nvme"][1])
    ]
    for j in jobs:
        j.wait()
    time.sleep(1.0)
    w1 = d.status()["wire"]
    dump.send_signal(signal.SIGINT)  # our own child, by PID
    dump.wait(timeout=30)
    raw = pcap.read_bytes()
    (out / (CAPTURE + ".gz")).write_bytes(gzip.compress(raw, mtime=0))
    pcap.unlink()
    got = {
        "phase": "capture",
        "pcap_bytes": len(raw),
        "wire_counts": {k: w1[k] - w0[k] for k in WIRE_KEYS},
    }
    print(
        f"capture: {len(raw):,} B of frames; the daemon's wire over it: {got['wire_counts']}",
        flush=True,
    )
    return got


def names_after_restart(d: Daemon, t: dict) -> dict:
    """The volumes a restarted daemon lists while both readers read (sessions it never
    saw log in): named from the saved names, and counted in their resources."""
    lun0, nvme0 = t["iscsi"][0], t["nvme"][0]
    rds = [fio.start(reader(x["device"], 50, 6)) for x in (lun0, nvme0)]
    time.sleep(5)
    vols = d.request("volumes")
    for j in rds:
        j.wait()
    want = {
        f"iscsi://{lun0['portal']}:3260/{lun0['iqn']}/0": ["r_iscsi"],
        f"nvme://{nvme0['traddr']}:4420/{nvme0['nqn']}/1": ["r_nvme"],
    }
    got = {v["volume"]: v["resources"] for v in vols}
    return {"volumes": vols, "named": all(got.get(k) == r for k, r in want.items())}


def phase(
    a, d: Daemon, name: str, res: str, dev: str, dm: str, writers: list[str], out: Path
) -> dict:
    lat_prefix = out / f"lat-{name}"
    ws = [
        fio.start(
            fio.argv(
                "j",
                w,
                "--rw=write",
                f"--bs={a.writer_bs}",
                f"--iodepth={a.writer_qd}",
                runtime=a.seconds + 4,
                size="200m",
            )
        )
        for w in writers
    ]
    if ws:
        time.sleep(2.0)  # the writers reach their pace first
    s = sampler(d, res, dm)
    s.start()
    rd = fio.start(
        reader(
            dev,
            a.reader_iops,
            a.seconds,
            f"--write_lat_log={lat_prefix}",
            "--log_avg_msec=1000",
            "--log_unix_epoch=1",
        )
    )
    result = rd.result()
    time.sleep(1.2)  # the window the reader ended in
    s.stop()
    for w in ws:
        w.wait()
    log = next(iter(sorted(out.glob(f"lat-{name}_clat*.log"))), None)
    ws_ = windows(s.rows, dm, fio.lat_log(log) if log else [])
    fio_mean = result["read"]["clat_ns"]["mean"] / 1e9 if result else None
    counts = [r["wire"]["counters"] for r in s.rows if (r.get("wire") or {}).get("counters")]
    wire = {k: counts[-1][k] - counts[0][k] for k in WIRE_KEYS} if len(counts) > 1 else None
    return {
        "phase": name,
        "writers": len(writers),
        "fio_mean_s": fio_mean,
        **summarize(ws_),
        "wire_counts": wire,
        "window_rows": ws_,
    }


def show(r: dict) -> None:
    def ms(x):
        return "-" if x is None else f"{x * 1e3:.2f}"

    def pct(x):
        return "-" if x is None else f"{x * 100:+.1f}%"

    print(
        f"{r['phase']:<18} windows {r['windows']:>3}  wire {ms(r['wire_s'])} ms  "
        f"target {ms(r['disk_s'])} ms ({pct(r.get('wire_vs_disk'))})  "
        f"fio {ms(r['fio_s'])} ms ({pct(r.get('wire_vs_fio'))})  "
        f"wire counts {r.get('wire_counts')}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("agreement", "nf-cost"))
    ap.add_argument("--seconds", type=float, default=20.0, help="each agreement phase")
    ap.add_argument("--reps", type=int, default=2, help="agreement repetitions")
    ap.add_argument("--reader-iops", type=int, default=100)
    ap.add_argument("--writer-bs", default="16k")
    ap.add_argument("--writer-qd", type=int, default=2)
    ap.add_argument("--nf-rounds", type=int, default=5)
    ap.add_argument(
        "--capture",
        action="store_true",
        help="after the agreement, capture the port for make bench (lab-wire.pcap.gz)",
    )
    ap.add_argument("--capture-seconds", type=float, default=6.0)
    ap.add_argument("--disk", default="array", choices=("array", "slow", "fast"))
    ap.add_argument("--out", default="/shared/work/bridge")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if topology.status() is not None:
        topology.down()
    # logged in by agreement(), through the running daemon's bridge
    t = topology.up(luns=4, nvme=2, disk=a.disk, bridge=True, lv_size_mib=512, login=False)
    res: dict = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "disk": a.disk,
        "array": probes.plant_config(),
        "args": vars(a),
    }
    try:
        if a.only in (None, "agreement"):
            res["agreement"], res["restart"], res["capture"] = agreement(a, t, out)
            (out / "bridge-lab.json").write_text(json.dumps(res, indent=1))
        if a.only == "nf-cost":
            topology.iscsi_login(t["iscsi"])
        if a.only in (None, "nf-cost"):
            d = daemon(t, out, leaf="pfifo", ports=[3260, 4420, STREAM_PORT])
            res["nf_cost"] = nf_cost(a, t, d)
            print(json.dumps(res["nf_cost"]["summary"], indent=1))
    finally:
        (out / "bridge-lab.json").write_text(json.dumps(res, indent=1))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
