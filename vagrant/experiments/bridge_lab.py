#!/usr/bin/env python3
"""Bridge mode in the lab: the wire against the target and fio; what the gate costs. In the guest.

    python3 vagrant/qemu/lab.py --array nbd:c_ms=2,m_ms=5 run --timeout 3000 \\
        vagrant/experiments/bridge_lab.py [--only agreement|nf-cost] [--seconds 20]
    make lab-bridge                                    # the same, both parts

(docs/bridge.md, "Measured in the lab".)  The topology with a bridge
(topology.py --bridge: the initiators -- lab-bi [lab-br in netns labbr] lab-ba
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
    The per-packet cost of the two ways a bridged packet can reach the delay
    classes, side by side in alternating rounds: a 256 MiB TCP stream from the
    target's namespace to an initiator address through the bridge, its
    segments unaggregated (TSO, GSO and GRO off on every veth: one packet one
    frame), the CPU time of the whole guest per packet forwarded, for
      none      br_netfilter off, no rule: the bridge and the port's HTB;
      brnf-idle br_netfilter on, nobody delayed (so no jump: the data path's
                idle gate), what every bridged packet pays for the switch;
      iptables  br_netfilter on, the target host's gate made by hand for
                the receiver (the physdev jump matching an skbinfo ipset, a
                chain with the ports, SET --map-prio);
      nft       br_netfilter off, santhrottled's own gate with the receiver
                pinned (nftables' bridge family: the hook chain's jump, the
                ports, the map lookup, the counting set; what bridge mode
                runs, datapath/nftrules.py).
    Both gates put the packets into the same HTB class (pfifo leaf: classified,
    not delayed); its counters prove each did.

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
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from labkit import fio, probes, topology
from labkit.analysis import READ_TICKS, READS
from labkit.daemon import Daemon, bridge_config, not_answering
from labkit.sampler import Probe, Sampler

SOCK = "/run/santhrottle-exp/control.sock"
NAME = "bridge"  # the daemon's config and log: santhrottle-bridge.toml, santhrottled-bridge.log
# the wire sensor's counts per phase: what it matched, what it could not, what it lost
WIRE_KEYS = ("completions", "unmatched", "replaced", "capture_frames", "capture_kernel_drops")
WARMUP_WINDOWS = 2  # the first windows of a phase: fio ramps, the daemon's counters start
STREAM_BYTES = 256 << 20
# The stream's source port: one of the data path's ports (its rules match it) that the
# wire sensor does not read (its capture filter takes 3260 and 4420 only).
STREAM_PORT = 5001
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


# ---------------------------------------------------------------- nf-cost
def _ns(ns: str, *cmd: str, check: bool = True, input: str | None = None) -> str:
    return topology.sh(["ip", "netns", "exec", ns, *cmd], check=check, input=input)


def cpu_busy_s() -> float:
    """The guest's busy CPU seconds so far (/proc/stat: all but idle and iowait)."""
    v = probes.guest_cpu()
    return (sum(v.values()) - v["idle"] - v["iowait"]) / os.sysconf("SC_CLK_TCK")


def tx_packets(ns: str, dev: str) -> int:
    return int(_ns(ns, "cat", f"/sys/class/net/{dev}/statistics/tx_packets"))


IPT_SET, IPT_CHAIN = "nfcost", "NFCOST"
GATES = ("none", "brnf-idle", "iptables", "nft")


def set_gate(d: Daemon, t: dict, gate: str, member: str, minor: int) -> None:
    b = t["bridge"]
    ns = b["netns"]
    _ns(ns, "iptables", "-t", "mangle", "-F", IPT_CHAIN, check=False)
    _ns(ns, "iptables", "-t", "mangle", "-D", "POSTROUTING", *ipt_jump(b), check=False)
    _ns(ns, "iptables", "-t", "mangle", "-X", IPT_CHAIN, check=False)
    _ns(ns, "ipset", "destroy", IPT_SET, check=False)
    on = "1" if gate in ("iptables", "brnf-idle") else "0"
    _ns(ns, "sysctl", "-qw", f"net.bridge.bridge-nf-call-iptables={on}")
    if gate == "nft":
        pin_class(d, member, minor)  # santhrottled's own gate
    else:
        unpin(d, member)
    if gate == "iptables":  # the target host's gate, behind br_netfilter
        _ns(ns, "ipset", "create", IPT_SET, "hash:ip", "skbinfo")
        _ns(ns, "ipset", "add", IPT_SET, member, "skbprio", f"5374:{minor:x}")
        _ns(
            ns,
            "iptables-restore",
            "--noflush",
            input=(
                f"*mangle\n:{IPT_CHAIN} - [0:0]\n-I POSTROUTING {' '.join(ipt_jump(b))}\n"
                f"-A {IPT_CHAIN} -p tcp -m multiport ! --sports 3260,4420,{STREAM_PORT} -j RETURN\n"
                f"-A {IPT_CHAIN} -j SET --map-set {IPT_SET} dst --map-prio\nCOMMIT\n"
            ),
        )


def ipt_jump(b: dict) -> list[str]:
    """The by-hand gate's jump: packets leaving the bridge by its initiator-side port."""
    port = ["-m", "physdev", "--physdev-out", b["initiator_port"], "--physdev-is-bridged"]
    return ["-p", "tcp", *port, "-m", "set", "--match-set", IPT_SET, "dst", "-j", IPT_CHAIN]


def pin_class(d: Daemon, ip: str, minor: int) -> None:
    d.request("pin", initiator=ip, **{"class": minor, "mode": "all"})
    time.sleep(0.5)  # the next tick applies it


def unpin(d: Daemon, ip: str) -> None:
    with contextlib.suppress(*not_answering()):  # not pinned
        d.request("unpin", initiator=ip)
    time.sleep(0.5)


RECEIVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while d := c.recv(1 << 20):
    n += len(d)
print(n, flush=True)
"""


def stream(t: dict, src_ns: str, member: str) -> tuple[float, int, float]:
    """STREAM_BYTES from the target's namespace (port 3260) to member: (CPU s, packets, s)."""
    b = t["bridge"]
    rcv = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, member, "40960"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert rcv.stdout is not None and rcv.stdout.readline().strip() == "ready"
        sender = (
            "import socket,sys\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('{t['iscsi'][0]['portal']}', {STREAM_PORT})); "
            f"s.connect(('{member}', 40960))\n"
            f"buf=b'x'*(1<<20)\nfor _ in range({STREAM_BYTES >> 20}): s.sendall(buf)\n"
            "s.close()\n"
        )
        p0, c0, t0 = tx_packets(b["netns"], b["initiator_port"]), cpu_busy_s(), time.monotonic()
        _ns(src_ns, sys.executable, "-c", sender)
        got = int(rcv.stdout.readline())
        p1, c1, t1 = tx_packets(b["netns"], b["initiator_port"]), cpu_busy_s(), time.monotonic()
        assert got == STREAM_BYTES, got
        return c1 - c0, p1 - p0, t1 - t0
    finally:
        if rcv.poll() is None:
            rcv.kill()  # our own child, by PID
        rcv.wait()


def class_bytes(t: dict, minor: int) -> int:
    b = t["bridge"]
    out = _ns(
        b["netns"],
        "tc",
        "-s",
        "class",
        "show",
        "dev",
        b["initiator_port"],
        "classid",
        f"5374:{minor:x}",
    )
    words = out.split()
    return int(words[words.index("Sent") + 1]) if "Sent" in words else 0


def nf_cost(a, t: dict, out: Path) -> dict:
    b = t["bridge"]
    for ns, devs in (
        (b["netns"], (b["initiator_port"], b["array_port"])),
        (topology.NETNS, (topology.VETH_TGT,)),
    ):
        for dev in devs:
            _ns(ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", check=False)
    subprocess.run(
        ["ethtool", "-K", topology.VETH_INI, "gro", "off", "tso", "off", "gso", "off"],
        capture_output=True,
    )
    d = daemon(t, out, leaf="pfifo", ports=[3260, 4420, STREAM_PORT])
    d.start(START_S)
    member, minor = t["iscsi"][0]["initiator_ip"], 5
    rows: list[dict] = []
    try:
        for rnd in range(a.nf_rounds):
            k = rnd % len(GATES)
            order = GATES[k:] + GATES[:k]  # rotate: no gate always first
            for gate in order:
                set_gate(d, t, gate, member, minor)
                before = class_bytes(t, minor)
                cpu, pkts, secs = stream(t, topology.NETNS, member)
                classified = class_bytes(t, minor) - before
                rows.append(
                    {
                        "round": rnd,
                        "gate": gate,
                        "cpu_s": cpu,
                        "packets": pkts,
                        "seconds": secs,
                        "us_per_packet": cpu / pkts * 1e6,
                        "classified_bytes": classified,
                    }
                )
                print(
                    f"nf-cost round {rnd} {gate:<9} {pkts:>8} packets  "
                    f"{cpu / pkts * 1e6:7.2f} us/packet  {secs:6.1f} s  "
                    f"class 5374:{minor} +{classified} B",
                    flush=True,
                )
        set_gate(d, t, "none", member, minor)
    finally:
        d.stop()
    per = {g: [r["us_per_packet"] for r in rows if r["gate"] == g] for g in GATES}
    summary = {
        g: {"median": statistics.median(v), "min": min(v), "max": max(v)} for g, v in per.items()
    }
    # the extra cost of each gate over no gate, per round (the rounds' own noise cancels)
    for g in GATES[1:]:
        d = [x - y for x, y in zip(per[g], per["none"], strict=True)]
        summary[g]["over_none_median"] = statistics.median(d)
        summary[g]["over_none_range"] = [min(d), max(d)]
    return {"rows": rows, "summary": summary}


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
            res["nf_cost"] = nf_cost(a, t, out)
            print(json.dumps(res["nf_cost"]["summary"], indent=1))
    finally:
        (out / "bridge-lab.json").write_text(json.dumps(res, indent=1))
        topology.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
