"""Tables, fits and the figure of the throttle curves (vagrant/experiments/datapath_lab.py sweep).

Run on the host (needs matplotlib for the PNG):

    .venv/bin/python vagrant/experiments/datapath_lab.py report results/datapath-lab.json \\
        --png docs/img/datapath-throughput.png
"""

from __future__ import annotations

from pathlib import Path

PATTERNS = {  # name -> (block size, iodepth, bytes moved per point)
    "64k qd1": ("64k", 1, 32 << 20),
    "256k qd4": ("256k", 4, 64 << 20),
}

CURVE_ORDER = [
    ("read", "read", "reads, `read` mode (payload delayed)"),
    ("write", "all", "writes, `all` mode (every packet delayed)"),
    ("write", "ack", "writes, `ack` mode (pure ACKs delayed)"),
    ("read", "all", "reads, `all` mode"),
]


def report(res: dict, png: str | None) -> str:
    proto = {"iscsi": "iSCSI", "nvme": "NVMe/TCP"}[res.get("protocol", "iscsi")]
    lines = [f"protocol: {proto}"]
    delays = res["delays_ms"]
    for pat in PATTERNS:
        cs = [
            (label, res["curves"].get(f"{pat}|{rw}|{mode}"))
            for rw, mode, label in CURVE_ORDER
            if f"{pat}|{rw}|{mode}" in res["curves"]
        ]
        if not cs:
            continue
        lines.append(f"\n{pat}, MB/s (seconds per GB) vs delay:\n")
        lines.append("| delay | " + " | ".join(label for label, _ in cs) + " |")
        lines.append("|---:|" + "---:|" * len(cs))
        for i, ms in enumerate(delays):
            row = [f"{ms:g} ms"]
            for _, c in cs:
                p = c["points"][i]
                row.append(f"{p['mb_s']:.1f} ({p['s_per_gb']:.0f})")
            lines.append("| " + " | ".join(row) + " |")
        fit = ["fit s/GB = a + b·ms"] + [
            f"{c['intercept_s_per_gb']:.0f} + {c['slope_s_per_gb_per_ms']:.1f}·ms, "
            f"R² {c['r2']:.3f}, retrans {c['retrans']} (+{c.get('transition_retrans', 0)} "
            "at class changes)"
            for _, c in cs
        ]
        lines.append("| " + " | ".join(fit) + " |")
    awl = res.get("ack_window_limited")
    if awl:
        lines.append("\n64k qd1 writes, `ack` mode, target tcp_rmem capped at 64 KiB:\n")
        lines.append("| delay | MB/s (s/GB) |")
        lines.append("|---:|---:|")
        for p in awl["points"]:
            lines.append(f"| {p['delay_ms']:g} ms | {p['mb_s']:.1f} ({p['s_per_gb']:.0f}) |")
        lines.append(
            f"| fit | {awl['intercept_s_per_gb']:.0f} + {awl['slope_s_per_gb_per_ms']:.1f}·ms, "
            f"R² {awl['r2']:.3f}, retrans {awl['retrans']} |"
        )
    ov = res.get("overhead")
    if ov:
        lines.append(
            f"\nIdle data path vs none, 64k qd1, median of {len(ov['read']['none_mb_s'])}:\n"
        )
        lines.append(
            "| | none MB/s | idle data path MB/s | difference of medians | paired difference, "
            "median [min, max] | spread none / idle |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|")
        for rw in ("read", "write"):
            o = ov[rw]
            lines.append(
                f"| {rw} | {o['none_median']:.2f} | {o['idle_median']:.2f} | "
                f"{o['diff_pct']:+.2f} % | {o['paired_median_pct']:+.2f} % "
                f"[{o['paired_min_pct']:+.1f}, {o['paired_max_pct']:+.1f}] | "
                f"{o['none_spread_pct']:.1f} % / {o['idle_spread_pct']:.1f} % |"
            )
    text = "\n".join(lines)
    if png:
        plot(res, png)
    return text


def plot(res: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pats = [p for p in PATTERNS if any(k.startswith(p + "|") for k in res["curves"])]
    fig, axes = plt.subplots(1, len(pats), figsize=(6 * len(pats), 4.5), squeeze=False)
    for ax, pat in zip(axes[0], pats, strict=True):
        for rw, mode, label in CURVE_ORDER:
            c = res["curves"].get(f"{pat}|{rw}|{mode}")
            if not c:
                continue
            xs = [p["delay_ms"] for p in c["points"]]
            ys = [p["s_per_gb"] for p in c["points"]]
            (line,) = ax.plot(xs, ys, "o", label=f"{label}: R² {c['r2']:.3f}")
            a, b = c["intercept_s_per_gb"], c["slope_s_per_gb_per_ms"]
            ax.plot([xs[0], xs[-1]], [a + b * xs[0], a + b * xs[-1]], "-", color=line.get_color())
        awl = res.get("ack_window_limited")
        if awl and pat == "64k qd1":
            xs = [p["delay_ms"] for p in awl["points"]]
            ys = [p["s_per_gb"] for p in awl["points"]]
            ax.plot(xs, ys, "x--", label=f"writes, `ack` mode, tcp_rmem 64 KiB: R² {awl['r2']:.3f}")
        proto = {"iscsi": "iSCSI", "nvme": "NVMe/TCP"}[res.get("protocol", "iscsi")]
        ax.set_title(f"one {proto} initiator, {pat} (Debian {res['kernel']}, QEMU/TCG)", fontsize=9)
        ax.set_xlabel("delay class (ms)")
        ax.set_ylabel("seconds per GB moved")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
