#!/usr/bin/env python3
"""The data path's throttle curves and idle cost, measured on the real kernel (lab guest).

In the guest (vagrant/qemu/lab.py runs a script of the checkout):

    .venv/bin/python vagrant/qemu/lab.py run --timeout 3600 \\
        vagrant/experiments/datapath_lab.py sweep
    .venv/bin/python vagrant/qemu/lab.py --smp 1 run --timeout 2400 \\
        vagrant/experiments/datapath_lab.py side-by-side --baseline fq_codel --variants full,tc
    .venv/bin/python vagrant/qemu/lab.py run --timeout 2400 \\
        vagrant/experiments/datapath_lab.py overhead

and on the host:

    .venv/bin/python vagrant/experiments/datapath_lab.py report results/datapath-lab.json \\
        --png docs/img/datapath-throughput.png

`sweep` brings up one initiator on the unthrottled ("fast") disk (`--protocol
iscsi`: a LIO LUN; `--protocol nvme`: an nvmet NVMe/TCP namespace) and measures
seconds per GB against the delay for reads and writes in each mode (64k qd1
and 256k qd4), target retransmissions per point, and the idle data path
against none at all (alternating runs); it writes results/datapath-lab.json
(results/datapath-lab-nvme.json with --protocol nvme).
`overhead` times each part of the idle data path in rotating sequential
runs; `side-by-side` (best with `lab.py --smp 1`) runs two initiators on two
links at once with a part installed on one of them, which cancels the
host's noise.  `report` prints the tables and fits and writes the PNG
(needs matplotlib).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from curves_report import PATTERNS, report
from labkit import fio, topology
from labkit.curves import DEVICE, NETNS, PORTS, curve, fit, netns_sysctl

from santhrottle.appliance.datapath import Datapath, DatapathSpec
from santhrottle.appliance.datapath.tctree import desired_tree, htb_params, render_tc_plan

RESULTS = Path(__file__).resolve().parents[2] / "results" / "datapath-lab.json"
SWEEP_DELAYS_MS = (0.0, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0)
QUICK_DELAYS_MS = (0.0, 2.0, 5.0, 10.0)
OVERHEAD_PAIRS = 7  # alternating runs without / with the idle data path
OVERHEAD_SIZE = 64 << 20


# ================================================================= sweep
def sweep(args) -> dict:
    t_start = time.monotonic()
    if topology.status() is not None:
        topology.down()
    nvme = args.protocol == "nvme"
    t = topology.up(
        luns=0 if nvme else 1, nvme=1 if nvme else 0, disk="fast", lv_size_mib=args.lv_mib
    )
    ini = t["nvme"][0] if nvme else t["iscsi"][0]
    ip, device = ini["host_traddr" if nvme else "initiator_ip"], ini["device"]
    delays = QUICK_DELAYS_MS if args.quick else SWEEP_DELAYS_MS
    res: dict = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "protocol": args.protocol,
        "disk": "fast (unthrottled virtio)",
        "initiator": ip,
        "device": device,
        "delays_ms": list(delays),
        "curves": {},
        "overhead": None,
        "ack_window_limited": None,
        "repeat": args.repeat,
    }
    log = lambda s: print(s, flush=True)  # noqa: E731
    d = Datapath(DatapathSpec((DEVICE,), ports=PORTS), netns=NETNS)
    try:
        # -- overhead: nothing installed vs installed with nobody throttled
        if not args.no_overhead:
            log("overhead: alternating runs without / with the idle data path")
            runs: dict[str, dict[str, list[float]]] = {
                "none": {"read": [], "write": []},
                "idle": {"read": [], "write": []},
            }
            for i in range(OVERHEAD_PAIRS):
                for state in ("none", "idle") if i % 2 == 0 else ("idle", "none"):
                    if state == "idle":
                        d.apply()
                    else:
                        d.cleanup()
                    for rw in ("read", "write"):
                        s = fio.once(device, rw, "64k", 1, OVERHEAD_SIZE)
                        runs[state][rw].append(OVERHEAD_SIZE / s / 1e6)
                log(
                    f"  pair {i}: "
                    + ", ".join(
                        f"{st} {rw} {runs[st][rw][-1]:.2f}"
                        for st in ("none", "idle")
                        for rw in ("read", "write")
                    )
                )
            d.cleanup()
            ov = {}
            for rw in ("read", "write"):
                none, idle = runs["none"][rw], runs["idle"][rw]
                # paired: each pair ran back to back, so slow drifts of the
                # host's load cancel in the ratio
                pct = [100.0 * (i / n - 1.0) for n, i in zip(none, idle, strict=True)]
                ov[rw] = {
                    "none_mb_s": none,
                    "idle_mb_s": idle,
                    "none_median": statistics.median(none),
                    "idle_median": statistics.median(idle),
                    "diff_pct": 100.0
                    * (statistics.median(idle) - statistics.median(none))
                    / statistics.median(none),
                    "paired_pct": pct,
                    "paired_median_pct": statistics.median(pct),
                    "paired_min_pct": min(pct),
                    "paired_max_pct": max(pct),
                    "none_spread_pct": 100.0 * (max(none) - min(none)) / statistics.median(none),
                    "idle_spread_pct": 100.0 * (max(idle) - min(idle)) / statistics.median(idle),
                }
                log(
                    f"  {rw}: none {ov[rw]['none_median']:.2f} MB/s, idle data path "
                    f"{ov[rw]['idle_median']:.2f} MB/s: {ov[rw]['diff_pct']:+.2f} %; paired "
                    f"median {ov[rw]['paired_median_pct']:+.2f} % "
                    f"[{ov[rw]['paired_min_pct']:+.1f}, {ov[rw]['paired_max_pct']:+.1f}]"
                )
            res["overhead"] = ov
        # -- the curves
        d.cleanup()
        t0 = time.monotonic()
        rep = d.apply()
        res["apply_s"] = time.monotonic() - t0
        res["apply_timings_s"] = rep.timings_s
        t0 = time.monotonic()
        d.apply()
        res["reapply_s"] = time.monotonic() - t0
        for pat, (bs, qd, size) in PATTERNS.items():
            for mode, rw in (("read", "read"), ("all", "write"), ("ack", "write"), ("all", "read")):
                if args.quick and (pat != "64k qd1" or (mode, rw) == ("all", "read")):
                    continue
                if f"{mode}/{rw}" not in args.curves.split(","):
                    continue
                log(f"curve: {pat} {rw}, mode {mode}")
                pts = curve(d, ip, device, mode, rw, bs, qd, size, delays, log, args.repeat)
                s = fit(pts)
                log(
                    f"  fit: {s['intercept_s_per_gb']:.1f} s/GB + "
                    f"{s['slope_s_per_gb_per_ms']:.2f} s/GB per ms, R^2 {s['r2']:.4f}, "
                    f"retrans {s['retrans']}"
                )
                res["curves"][f"{pat}|{rw}|{mode}"] = {
                    "pattern": pat,
                    "rw": rw,
                    "mode": mode,
                    "points": pts,
                    **s,
                }
        # -- ack mode when the initiator is window-limited (target tcp_rmem capped)
        if not args.quick:
            log("curve: 64k qd1 write, mode ack, target tcp_rmem capped at 64 KiB")
            with netns_sysctl("net.ipv4.tcp_rmem", "4096 65536 65536"):
                # new window limits apply to new connections: log the session in again
                if nvme:
                    topology.nvme_disconnect(t["nvme"])
                    topology.nvme_connect(t["nvme"])
                    device2 = t["nvme"][0]["device"]
                else:
                    topology.sh(["iscsiadm", "-m", "node", "-U", "all"])
                    topology.iscsi_login(t["iscsi"])
                    device2 = t["iscsi"][0]["device"]
                pts = curve(
                    d, ip, device2, "ack", "write", "64k", 1, 32 << 20, delays, log, args.repeat
                )
            res["ack_window_limited"] = {"points": pts, **fit(pts)}
        d.cleanup()
    finally:
        d.close()
        topology.down()
    res["wall_s"] = time.monotonic() - t_start
    return res


# ============================================================= overhead
VARIANTS = ("none", "tc", "tc-defclass", "full", "gated")
# gated's member: an address no initiator has, so the measured one stays unthrottled
BYSTANDER_IP = "192.0.2.250"


def set_variant(d: Datapath, variant: str) -> None:
    """What is installed on the data path's devices: none: nothing; tc: the
    HTB tree only (unthrottled packets in HTB's direct queue); tc-defclass:
    the tree with a default class 5374:ffff + pfifo instead; full: the data
    path as santhrottled installs it, idle (tree, sets, chain; no jump);
    gated: full with somebody else throttled (the jump is in: every storage
    packet to a non-member pays the gate's lookup)."""
    d.cleanup()
    if variant == "none":
        return
    if variant == "tc-defclass":
        _defclass_tree(d)
        return
    d.apply()
    if variant == "tc":
        d.mangle.cleanup()
        d.sets.destroy()
    elif variant == "gated":
        d.set_classes({BYSTANDER_IP: 1})


def _defclass_tree(d: Datapath) -> None:
    """The tree with a default class 5374:ffff (HTB's pfifo leaf) for
    unthrottled packets instead of HTB's direct queue."""
    s = d.spec
    want = desired_tree(s.ladder.delays_us, s.link_bits_s)
    want.default_minor = 0xFFFF
    want.classes[0xFFFF] = htb_params(s.link_bits_s)
    for dev in s.devices:
        lines = render_tc_plan(dev, want, None)
        topology.sh(
            ["ip", "netns", "exec", NETNS, "tc", "-batch", "-"], input="\n".join(lines) + "\n"
        )


def overhead(args) -> dict:
    """Which part of the idle data path costs what: rounds over the variants
    in rotating order, 64k qd1 read and write of a fixed size each."""
    if topology.status() is not None:
        topology.down()
    t = topology.up(luns=1, nvme=0, disk="fast", lv_size_mib=args.lv_mib)
    device = t["iscsi"][0]["device"]
    variants = args.variants.split(",")
    runs: dict[str, dict[str, list[float]]] = {v: {"read": [], "write": []} for v in variants}
    d = Datapath(DatapathSpec((DEVICE,), ports=PORTS), netns=NETNS)
    try:
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                set_variant(d, v)
                for rw in ("read", "write"):
                    secs = fio.once(device, rw, "64k", 1, args.size_mib << 20)
                    runs[v][rw].append((args.size_mib << 20) / secs / 1e6)
            print(
                f"round {r}: "
                + ", ".join(
                    f"{v} {runs[v]['read'][-1]:.1f}/{runs[v]['write'][-1]:.1f}" for v in variants
                ),
                flush=True,
            )
        d.cleanup()
    finally:
        d.close()
        topology.down()
    out: dict = {"rounds": args.rounds, "size_mib": args.size_mib, "runs": runs, "variants": {}}
    for v in variants:
        out["variants"][v] = {}
        for rw in ("read", "write"):
            pct = [
                100.0 * (x / n - 1.0)
                for x, n in zip(runs[v][rw], runs[variants[0]][rw], strict=True)
            ]
            out["variants"][v][rw] = {
                "median_mb_s": statistics.median(runs[v][rw]),
                "paired_median_pct": statistics.median(pct),
                "paired_min_pct": min(pct),
                "paired_max_pct": max(pct),
            }
    return out


# ========================================================= side by side
def fio_side_by_side(devices: list[str], rw: str, bs: str, qd: int, seconds: int) -> list[float]:
    """One fio, one job per device, started together, time-based: MB/s of each."""
    cmd = [
        "fio",
        "--output-format=json",
        "--direct=1",
        "--ioengine=libaio",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={qd}",
        "--time_based",
        f"--runtime={seconds}",
        "--verify_state_save=0",
    ]
    for i, dev in enumerate(devices):
        cmd += [f"--name=j{i}", f"--filename={dev}"]
    jobs = fio.parse(topology.sh(cmd, timeout=seconds * 4 + 60))["jobs"]
    side = "read" if rw == "read" else "write"
    if any(j["error"] or not j[side]["io_bytes"] for j in jobs):
        got = [(j["error"], j[side]["io_bytes"]) for j in jobs]
        raise RuntimeError(f"fio side by side {rw}: {got}")
    return [j[side]["bw_bytes"] / 1e6 for j in jobs]


def set_side(links: list[str], state: str, baseline: str) -> None:
    """state "none": no data path on either link; "VARIANT@J": VARIANT (see
    set_variant) installed on link J.  A link without the data path has no
    root qdisc (veth: noqueue) or the baseline's: fq_codel is the root a
    physical NIC has on Debian (systemd's default_qdisc); tc is the HTB
    tree alone, so that full@J against it is what the rest of the data path
    adds to the tree.  Everything is cleaned up first."""
    variant, _, on = state.partition("@")
    tc = ["ip", "netns", "exec", NETNS, "tc", "qdisc"]
    for link in links:
        with Datapath(DatapathSpec((link,), ports=PORTS), netns=NETNS) as d:
            d.cleanup()
        topology.sh([*tc, "del", "dev", link, "root"], check=False)
    # the variant first: set_variant's cleanup removes every tree of ours in the namespace
    for j, link in enumerate(links):
        if on == str(j):
            with Datapath(DatapathSpec((link,), ports=PORTS), netns=NETNS) as d:
                set_variant(d, variant)
    for j, link in enumerate(links):
        if on == str(j):
            continue
        if baseline == "tc":
            with Datapath(DatapathSpec((link,), ports=PORTS), netns=NETNS) as d:
                s = d.spec
                tree = desired_tree(s.ladder.delays_us, s.link_bits_s, s.leaf, s.glide_leaves)
                d.device().apply(tree)
        elif baseline != "noqueue":
            topology.sh([*tc, "add", "dev", link, "root", baseline])


def side_by_side(args) -> dict:
    """The idle data path's overhead with the host's noise cancelled: two
    initiators on two veth pairs run 64k qd1 at the same time, the data path
    installed (nobody throttled) on one link, then on the other, and on
    neither.  Whatever the host does to the guest, it does to both streams;
    the ratio of the two streams is what the data path changes.  Per round,
    r = MB/s of link 0 / MB/s of link 1 in each state; the overhead is
    sqrt(r_on0 / r_on1) - 1 (the links' own asymmetry cancels), and the same
    statistic over two consecutive `none` states, sqrt(r_none / r_none') - 1,
    is what the method reads when there is nothing to find (its noise).  The
    streams share the guest's CPUs: a path that costs more CPU per IO also
    gives the other stream more, so the ratio is an upper bound of one
    stream's own loss."""
    if topology.status() is not None:
        topology.down()
    t = topology.up(luns=2, nvme=0, disk="fast", lv_size_mib=args.lv_mib, links=2)
    devices = [x["device"] for x in t["iscsi"]]
    links = [x["target_device"] for x in t["iscsi"]]
    variants = args.variants.split(",")
    states = ["none"] + [f"{v}@{j}" for v in variants for j in (0, 1)]
    runs: dict[str, dict[str, list[list[float]]]] = {
        rw: {st: [] for st in states} for rw in ("read", "write")
    }
    try:
        for r in range(args.rounds):
            k = r % len(states)
            for st in states[k:] + states[:k]:
                set_side(links, st, args.baseline)
                for rw in ("read", "write"):
                    runs[rw][st].append(fio_side_by_side(devices, rw, "64k", 1, args.seconds))
            print(
                f"round {r}: "
                + "; ".join(
                    f"{rw} "
                    + ", ".join(f"{st} {x[-1][0]:.1f}/{x[-1][1]:.1f}" for st, x in sts.items())
                    for rw, sts in runs.items()
                ),
                flush=True,
            )
        set_side(links, "none", "noqueue")
    finally:
        topology.down()
    out: dict = {
        "rounds": args.rounds,
        "seconds": args.seconds,
        "baseline": args.baseline,
        "links": links,
        "runs": runs,
        "variants": {},
    }
    for rw in ("read", "write"):
        ratio = {st: [a / b for a, b in runs[rw][st]] for st in states}
        aa = [100.0 * (math.sqrt(x / y) - 1.0) for x, y in itertools.pairwise(ratio["none"])]
        out[f"noise_{rw}"] = {
            "pct": aa,
            "median_pct": statistics.median(aa) if aa else None,
            "abs_median_pct": statistics.median(abs(x) for x in aa) if aa else None,
        }
        for v in variants:
            pct = [
                100.0 * (math.sqrt(x / y) - 1.0)
                for x, y in zip(ratio[f"{v}@0"], ratio[f"{v}@1"], strict=True)
            ]
            out["variants"].setdefault(v, {})[rw] = {
                "overhead_pct": pct,
                "median_pct": statistics.median(pct),
                "min_pct": min(pct),
                "max_pct": max(pct),
            }
    return out


def _show_sweep(res: dict, out: str) -> None:
    print(report(res, None))
    print(f"\nwrote {out} in {res['wall_s']:.0f} s")


def _show_overhead(res: dict, _out: str) -> None:
    for v, x in res["variants"].items():
        print(
            f"{v:>10}: "
            + "; ".join(
                f"{rw} {x[rw]['median_mb_s']:.2f} MB/s, "
                f"paired {x[rw]['paired_median_pct']:+.2f} % "
                f"[{x[rw]['paired_min_pct']:+.1f}, {x[rw]['paired_max_pct']:+.1f}]"
                for rw in ("read", "write")
            )
        )


def _show_side_by_side(res: dict, _out: str) -> None:
    for rw in ("read", "write"):
        n = res[f"noise_{rw}"]
        print(
            f"{rw}: method's noise (none vs none) median {n['median_pct']:+.2f} %, "
            f"|median| {n['abs_median_pct']:.2f} %"
        )
        for v, x in res["variants"].items():
            y = x[rw]
            print(
                f"  {v}: {y['median_pct']:+.2f} % (median of {res['rounds']} rounds, "
                f"[{y['min_pct']:+.2f}, {y['max_pct']:+.2f}])"
            )


# The commands that measure in the lab guest: (measure, print), each writing --out.
GUEST_COMMANDS = {
    "sweep": (sweep, _show_sweep),
    "overhead": (overhead, _show_overhead),
    "side-by-side": (side_by_side, _show_side_by_side),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="(in the lab guest) measure; writes results/datapath-lab.json")
    s.add_argument("--quick", action="store_true", help="4 delays, 64k qd1 only")
    s.add_argument("--no-overhead", action="store_true", help="skip the overhead runs")
    s.add_argument(
        "--repeat", type=int, default=1, help="runs per point; the fastest counts (default 1)"
    )
    s.add_argument(
        "--curves",
        default="read/read,all/write,ack/write,all/read",
        help="mode/rw pairs to measure (default all four)",
    )
    s.add_argument(
        "--protocol",
        choices=("iscsi", "nvme"),
        default="iscsi",
        help="the initiator: an iSCSI LUN (LIO) or an NVMe/TCP namespace (nvmet), on the "
        "same disk (default iscsi)",
    )
    s.add_argument("--lv-mib", type=int, default=256)
    s.add_argument("--out", help=f"default {RESULTS}, or datapath-lab-nvme.json")
    o = sub.add_parser("overhead", help="(in the lab guest) cost of each part of the idle path")
    o.add_argument("--rounds", type=int, default=5)
    o.add_argument("--size-mib", type=int, default=64)
    o.add_argument("--variants", default=",".join(VARIANTS))
    o.add_argument("--lv-mib", type=int, default=256)
    o.add_argument("--out", default=str(RESULTS.with_name("datapath-overhead.json")))
    b = sub.add_parser(
        "side-by-side", help="(in the lab guest) idle overhead, two links measured at once"
    )
    b.add_argument("--rounds", type=int, default=10)
    b.add_argument("--seconds", type=int, default=6, help="of each fio run")
    b.add_argument(
        "--baseline",
        default="noqueue",
        choices=("noqueue", "fq_codel", "pfifo_fast", "tc"),
        help="root of a link without the data path (veth: noqueue; a NIC: fq_codel; "
        "tc: the HTB tree alone)",
    )
    b.add_argument(
        "--variants",
        default="full",
        help=f"what is installed, comma-separated ({', '.join(VARIANTS)})",
    )
    b.add_argument("--lv-mib", type=int, default=256)
    b.add_argument("--out", default=str(RESULTS.with_name("datapath-side-by-side.json")))
    r = sub.add_parser("report", help="(on the host) tables, fits and the PNG")
    r.add_argument("json")
    r.add_argument("--png")
    a = ap.parse_args(argv)
    if a.cmd in GUEST_COMMANDS:
        if os.environ.get("SANTHROTTLE_IN_GUEST") != "1":
            print(
                f"{a.cmd} runs in the lab guest: .venv/bin/python vagrant/qemu/lab.py run "
                f"vagrant/experiments/datapath_lab.py {a.cmd}",
                file=sys.stderr,
            )
            return 2
        if a.out is None:  # sweep: one file per protocol
            a.out = str(
                RESULTS if a.protocol == "iscsi" else RESULTS.with_name("datapath-lab-nvme.json")
            )
        measure, show = GUEST_COMMANDS[a.cmd]
        res = measure(a)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
        show(res, a.out)
        return 0
    res = json.loads(Path(a.json).read_text())
    print(report(res, a.png))
    if a.png:
        print(f"\nwrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
