#!/usr/bin/env python3
"""Where the target's tail-loss probes come from: the paper's reader over iSCSI and
over NVMe/TCP, captured at the target, with no santhrottled.  Runs INSIDE the guest.

    .venv/bin/python vagrant/qemu/lab.py run --timeout 900 vagrant/experiments/tlp_lab.py \\
        --out results/tlp-lab.json                      # make lab-tlp

One iSCSI initiator and one NVMe/TCP host on the unthrottled disk.  Per case, the
reader of the paper's experiment (fio 4 KiB random reads, QD 1, 256 kB/s) for
--seconds, with tcpdump on the target's veth (headers only, that initiator's
storage connection) and the target's TCP counters around it:

  iscsi         the iSCSI initiator
  nvme          the NVMe/TCP host, as nvme-cli connects it
  nvme-quickack the same, the host's route to its port with `quickack 1` (the host
                ACKs every segment at once instead of delaying the ACK)

From each capture: how the target answers a read (its segments per answer, their
sizes: a data PDU and a separate completion capsule, or one PDU), how long the
host takes to ACK the answer's last byte, and every retransmitted segment, with the
time since the answer was sent and whether the host reported it as a duplicate
(D-SACK).  Linux arms the probe timer at 2 x srtt + 2 jiffies when more than one
segment is in flight and at 2 x srtt + 200 ms when one is (tcp_schedule_loss_probe),
so a host that holds its ACK longer than that behind several small segments draws a
probe that only repeats what it already has.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from labkit import fio, topology
from labkit.curves import DEVICE, NETNS, diff
from labkit.curves import counters as tcp_counters

# tcpdump -tt -nn -S -r: "<t> IP[6] <src>.<port> > <dst>.<port>: Flags [..], seq a:b, ack c, ..."
LINE = re.compile(
    r"^(?P<t>\d+\.\d+) IP6? (?P<src>\S+)\.(?P<sport>\d+) > (?P<dst>\S+)\.(?P<dport>\d+): "
    r"Flags \[(?P<flags>[^\]]*)\](?:, seq (?P<seq>\d+)(?::(?P<end>\d+))?)?"
    r"(?:, ack (?P<ack>\d+))?(?P<rest>.*)$"
)
SACK = re.compile(r"sack \d+ \{([^}]*)\}")
BURST_GAP_S = 0.002  # target segments closer than this belong to one answer
SNAPLEN = 128


def parse(pcap: Path, target_port: int) -> list[dict]:
    """The capture's TCP segments, each: t, out (target -> host), seq, end, ack, sacks."""
    text = topology.sh(["tcpdump", "-tt", "-nn", "-S", "-r", str(pcap)], check=False, timeout=120)
    segs: list[dict] = []
    # per connection (the host's port) and direction, its first sequence number: seqs
    # wrap at 2**32, and an NVMe/TCP host has a connection per queue
    base: dict[tuple[int, bool], int] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        out = int(m["sport"]) == target_port
        conn = int(m["dport"] if out else m["sport"])
        if m["seq"]:
            base.setdefault((conn, out), int(m["seq"]))
        if m["ack"]:
            base.setdefault((conn, not out), int(m["ack"]))

        def rel(x: str | None, side: bool, conn: int = conn) -> int | None:
            key = (conn, side)
            return (int(x) - base[key]) % 2**32 if x and key in base else None

        seq = rel(m["seq"], out)
        sacks = []
        s = SACK.search(m["rest"])
        if s:
            for block in s.group(1).split("}{"):
                a, _, b = block.strip("{} ").partition(":")
                if a and b:
                    sacks.append((rel(a, not out), rel(b, not out)))
        segs.append(
            {
                "t": float(m["t"]),
                "out": out,
                "conn": conn,
                "seq": seq,
                "end": rel(m["end"], out) if m["end"] else seq,
                "ack": rel(m["ack"], not out),
                "sacks": sacks,
            }
        )
    return segs


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_connection(segs: list[dict]) -> tuple[list[list[dict]], list[float], list[dict]]:
    """One connection's answers (bursts of target data), the host's ACK delay after each,
    and the retransmissions with their D-SACKs."""
    data = [s for s in segs if s["out"] and s["end"] is not None and s["end"] > s["seq"]]
    acks = [s for s in segs if not s["out"] and s["ack"] is not None]
    highest, retrans, bursts = None, [], []
    for s in data:
        if highest is not None and s["end"] <= highest:
            retrans.append(s)
            continue
        highest = s["end"] if highest is None else max(highest, s["end"])
        if bursts and s["t"] - bursts[-1][-1]["t"] <= BURST_GAP_S:
            bursts[-1].append(s)
        else:
            bursts.append([s])
    delays, j = [], 0
    for b in bursts:
        end, t_end = b[-1]["end"], b[-1]["t"]
        while j < len(acks) and acks[j]["t"] < t_end:
            j += 1
        ack = next((a for a in itertools.islice(acks, j, None) if a["ack"] >= end), None)
        if ack is not None:
            delays.append(ack["t"] - t_end)
    rows = []
    for r in retrans:
        sent = next((s for s in data if s["seq"] <= r["seq"] < s["end"] and s["t"] < r["t"]), None)
        dsack = any(
            a["t"] > r["t"]
            and any(lo <= r["seq"] and hi >= r["end"] and hi <= a["ack"] for lo, hi in a["sacks"])
            for a in acks
            if 0 < a["t"] - r["t"] < 1.0
        )
        acked_before = any(a["t"] < r["t"] and a["ack"] >= r["end"] for a in acks)
        rows.append(
            {
                "bytes": r["end"] - r["seq"],
                "after_sent_ms": round((r["t"] - sent["t"]) * 1e3, 2) if sent else None,
                "dsack": dsack,
                "acked_before": acked_before,
            }
        )
    return bursts, delays, rows


def analyse(segs: list[dict]) -> dict:
    """The connections' answers, ACK delays and retransmissions, together."""
    bursts: list[list[dict]] = []
    delays: list[float] = []
    rows: list[dict] = []
    for conn in sorted({s["conn"] for s in segs}):
        b, d, r = one_connection([s for s in segs if s["conn"] == conn])
        bursts += b
        delays += d
        rows += r
    shapes: dict[str, int] = {}
    for b in bursts:
        sizes = [x["end"] - x["seq"] for x in b]
        key = " + ".join(map(str, sizes)) if len(sizes) <= 4 else f"{len(sizes)} segments"
        shapes[key] = shapes.get(key, 0) + 1
    top = sorted(shapes.items(), key=lambda kv: -kv[1])[:4]
    after = [r["after_sent_ms"] for r in rows if r["after_sent_ms"] is not None]
    return {
        "connections": len({s["conn"] for s in segs}),
        "answers": len(bursts),
        "answer_shapes": dict(top),
        "ack_delay_ms": {
            "p50": round(pct(delays, 0.5) * 1e3, 2) if delays else None,
            "p95": round(pct(delays, 0.95) * 1e3, 2) if delays else None,
            "max": round(max(delays) * 1e3, 2) if delays else None,
            "over_8ms": sum(d > 0.008 for d in delays),
        },
        "retransmitted": len(rows),
        "dsacked": sum(r["dsack"] for r in rows),
        "retransmissions": rows[:20],
        "retrans_median_after_sent_ms": statistics.median(after) if after else None,
    }


def capture(pcap: Path, host: str, port: int) -> subprocess.Popen:
    p = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            NETNS,
            "tcpdump",
            "-i",
            DEVICE,
            "-nn",
            "-s",
            str(SNAPLEN),
            "-w",
            str(pcap),
            f"host {host} and tcp port {port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stderr.readline()  # "listening on ..." once the filter is attached
    if "listening" not in line:
        p.kill()
        raise RuntimeError(f"tcpdump: {line.strip()}")
    return p


def read(device: str, seconds: int) -> dict:
    cmd = fio.reader(device, "256k", seconds, name="reader", size=None)
    job = fio.parse(topology.sh(cmd, timeout=seconds + 120))["jobs"][0]
    rd = job["read"]
    lat_ms = rd["lat_ns"]["mean"] / 1e6
    return {"ios": rd["total_ios"], "error": job["error"], "lat_mean_ms": lat_ms}


def quickack(nv: dict, dev: str, on: bool) -> None:
    """The host's route to its NVMe/TCP port with quickack on or off, and the host
    connected again: a connection takes the route's quickack when it is made."""
    topology.nvme_disconnect([nv])
    topology.sh(
        [
            "ip",
            "route",
            "replace",
            f"{nv['traddr']}/32",
            "dev",
            dev,
            "src",
            nv["host_traddr"],
            "quickack",
            "1" if on else "0",
        ]
    )
    topology.nvme_connect([nv])


def hogs(n: int) -> list[subprocess.Popen]:
    """n busy loops beside the reader, as the closed loop's writers and daemon load the
    guest's CPU (the host's I/O worker, which reads the answers, then waits its turn)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--hogs", type=int, default=2, help="busy loops beside the reader")
    a = ap.parse_args()
    if topology.status() is not None:
        topology.down()
    t0 = time.monotonic()
    t = topology.up(luns=1, nvme=1, disk="fast", lv_size_mib=128)
    isc, nv = t["iscsi"][0], t["nvme"][0]
    dev = t["veth"]["initiator"]
    cases = [
        ("iscsi", isc, isc["initiator_ip"], 3260, False),
        ("nvme", nv, nv["host_traddr"], 4420, False),
        ("nvme-quickack", nv, nv["host_traddr"], 4420, True),
    ]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"kernel": os.uname().release, "seconds": a.seconds, "hogs": a.hogs, "cases": {}}
    quick = False
    try:
        for name, x, host, port, qa in cases:
            if port == 4420 and qa != quick:
                quickack(nv, dev, qa)
                quick = qa
            pcap = a.out.with_name(f"{a.out.stem}-{name}.pcap")
            dump = capture(pcap, host, port)
            busy = hogs(a.hogs)
            c0 = tcp_counters()
            try:
                fio = read(x["device"], a.seconds)
            finally:
                c1 = tcp_counters()
                for h in busy:
                    h.kill()
                    h.wait()
            time.sleep(0.5)
            dump.send_signal(signal.SIGINT)
            dump.wait(timeout=30)
            r = {"fio": fio, "counters": {k: v for k, v in diff(c0, c1).items() if v}}
            r.update(analyse(parse(pcap, port)))
            res["cases"][name] = r
            print(
                f"{name}: {fio['ios']} reads, {r['connections']} connection(s), answers "
                f"{r['answers']} shaped "
                f"{r['answer_shapes']}, host ACK after {r['ack_delay_ms']}, target "
                f"counters {r['counters']}, retransmitted in the capture "
                f"{r['retransmitted']} (median {r['retrans_median_after_sent_ms']} ms after "
                f"the original; D-SACKed {r['dsacked']})",
                flush=True,
            )
    finally:
        if quick:
            quickack(nv, dev, False)
        topology.down()
        res["wall_s"] = time.monotonic() - t0
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
