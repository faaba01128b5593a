"""report.py's figures: the paper's figures 12, 14 and 16 from a closed-loop run (matplotlib).

What it owns
    fig12.png   the uncontrolled phase: the reader at the target, the writers' bytes
    fig14.png   the reader per phase against each threshold
    fig16-T.png per controlled (and bridged) phase: the reader, the writers' packet
                delay (the highest class, on the phase's ladder), the write-heavy
                members, the writes; the reader's departure dotted
    Every curve is a labkit.analysis window series.
"""

from __future__ import annotations

from pathlib import Path

from labkit.analysis import classes, members, phase_windows
from report_sim import is_controlled, parse_ms


def ladder_of(ph: dict, max_delay: str | None = None):
    """The daemon's ladder in this phase; runs that did not record it: the default
    ladder up to their max_delay."""
    from santhrottle.controller.ladder import Ladder

    lad = ph.get("ladder")
    if lad is None:
        d = Ladder()
        us = round(parse_ms(max_delay) * 1e6) if max_delay else d.max_delay_us
        return Ladder(d.step_us, us, d.ratio)
    return Ladder(lad["step_us"], lad["max_delay_us"], lad["ratio"])


def plot(raw: dict, out: Path) -> list[Path]:
    """The figures of a run into `out`; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    # fig. 12: the interference without santhrottle, the writers switched on and off
    unc = raw["phases"][0]
    w = phase_windows(unc)
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    axes[0].plot(
        [x.t for x in w if x.read_latency_s is not None],
        [x.read_latency_s * 1e3 for x in w if x.read_latency_s is not None],
        lw=0.9,
        color="black",
    )
    axes[0].set_ylabel("reader latency, 1 s mean (ms)")
    axes[1].plot([x.t for x in w], [x.write_bps / 1e6 for x in w], lw=0.9)
    axes[1].set_ylabel("aggregate writes (MB/s)")
    axes[1].set_xlabel("time (s)")
    fig.suptitle(
        "lab, uncontrolled: the reader at the target, writers on and off (cf. paper fig. 12)"
    )
    fig.tight_layout()
    files.append(out / "fig12.png")
    fig.savefig(files[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = ["black", "#d62728", "#2ca02c", "#1f77b4", "#9467bd"]
    shown = [ph for ph in raw["phases"] if ph["threshold"] is None or is_controlled(ph)]
    for k, ph in enumerate(shown):
        w = phase_windows(ph)
        label = ph["threshold"] or "uncontrolled"
        ax.plot(
            [x.t for x in w if x.read_latency_s is not None],
            [x.read_latency_s * 1e3 for x in w if x.read_latency_s is not None],
            lw=0.9,
            color=colors[k % 5],
            label=label,
        )
        if ph["threshold"]:
            ax.axhline(parse_ms(ph["threshold"]) * 1e3, ls="--", lw=0.8, color=colors[k % 5])
    ax.set_xlabel("time (s)")
    ax.set_ylabel("reader latency at the target, 1 s mean (ms)")
    ax.set_title("lab: reader latency vs threshold (cf. paper fig. 14)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    files.append(out / "fig14.png")
    fig.savefig(files[-1], dpi=100)
    plt.close(fig)
    for ph in shown[1:] + [ph for ph in raw["phases"] if ph.get("kind") == "bridge"]:
        bridged = ph.get("kind") == "bridge"
        w = phase_windows(ph)
        cl = classes(ph)
        lad = ladder_of(ph, raw["args"].get("max_delay"))
        mb = members(ph)
        fig, axes = plt.subplots(4, 1, figsize=(10, 8.5), sharex=True)
        axes[0].plot(
            [x.t for x in w if x.read_latency_s is not None],
            [x.read_latency_s * 1e3 for x in w if x.read_latency_s is not None],
            lw=0.9,
        )
        axes[0].axhline(parse_ms(ph["threshold"]) * 1e3, ls="--", color="red", lw=0.8)
        axes[0].set_ylabel("read latency (ms)")
        axes[1].step([t for t, _ in cl], [lad.delay_s(c) * 1e3 for _, c in cl], where="post")
        axes[1].set_ylabel("packet delay (ms)")
        axes[2].step([t for t, _ in mb], [n for _, n in mb], where="post")
        axes[2].set_ylabel("write-heavy members")
        axes[3].plot([x.t for x in w], [x.write_bps / 1e6 for x in w], lw=0.9)
        axes[3].set_ylabel("aggregate writes (MB/s)")
        axes[3].set_xlabel("time (s)")
        for t, e in ph["events"]:
            if e == "reader off":
                for a in axes:
                    a.axvline(t, color="grey", ls=":", lw=0.8)
        where = ", santhrottled in bridge mode" if bridged else ""
        fig.suptitle(f"lab, threshold {ph['threshold']}{where} (cf. paper fig. 16)")
        fig.tight_layout()
        files.append(out / f"fig16-{'bridge-' if bridged else ''}{ph['threshold']}.png")
        fig.savefig(files[-1], dpi=100)
        plt.close(fig)
    return files
