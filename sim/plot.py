"""PNG figures like the method paper's figure 16: latency vs threshold, delay, write rate.

What it owns
    plot_simulation(): three panels over time from simulate()'s result, written
    with matplotlib (Agg) to the file named (its suffix picks the format).
    plot_groups(): for a scenario with groups, one row per group: its
    performance against its target, and its PWFTE and share, over time
    (written beside the first: NAME-groups.SUFFIX).
    PlotUnavailable: no matplotlib; PlotError: the figure cannot be written
    there (one line each, for the CLI).

Worked example
    plot_simulation(result, Path("/tmp/paper.png"), "paper") writes a 1000x800 PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


class PlotError(ValueError):
    """The figure cannot be written to that file (its format or its place)."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise PlotUnavailable("--plot needs matplotlib: pip install 'santhrottle[plot]'") from e
    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise PlotError(f"cannot write plot {path}: {e.strerror or e}") from None
    except ValueError as e:  # matplotlib: a format it does not write
        raise PlotError(f"cannot write plot {path}: {str(e).splitlines()[0]}") from None
    finally:
        plt.close(fig)


def groups_plot_path(path: Path) -> Path:
    """Where plot_groups() writes beside the figure at `path`."""
    return path.with_name(f"{path.stem}-groups{path.suffix}")


def plot_groups(result: dict[str, Any], path: Path, title: str) -> None:
    """Per group (a row): what it gets against its target; its PWFTE and share."""
    plt = _pyplot()
    runs = result["groups"]
    label = next(iter(runs))  # the first controlled run
    groups = runs[label]
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 2.6 * len(groups) + 0.8), squeeze=False)
    for row, (name, g) in zip(axes, groups.items(), strict=True):
        ax_perf, ax_err = row
        s = g["series"]
        t = s["t_s"]
        if g["latency_target_s"] is not None:
            ax_perf.plot(t, [None if v is None else v * 1000.0 for v in s["latency_s"]], lw=0.9)
            ax_perf.axhline(g["latency_target_s"] * 1000.0, color="black", ls="--", lw=0.8)
            ax_perf.set_ylabel(f"{name}: latency (ms)")
        else:
            ax_perf.plot(t, [b / 1e6 for b in s["throughput_bps"]], lw=0.9)
            if g["throughput_target_bps"] is not None:
                ax_perf.axhline(g["throughput_target_bps"] / 1e6, color="black", ls="--", lw=0.8)
            ax_perf.set_ylabel(f"{name}: MB/s")
        ax_err.plot(t, s["pwfte"], lw=0.9, label="PWFTE p(1 - y)")
        ax_err.plot(t, s["share"], lw=0.9, label="share")
        ax_err.plot(t, s["priority"], lw=0.7, ls=":", label="priority")
        ax_err.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1][0].set_xlabel("time (s)")
    axes[-1][1].set_xlabel("time (s)")
    fig.suptitle(f"{title} ({label}): dashed = target")
    fig.tight_layout()
    _save(plt, fig, path)


def plot_simulation(result: dict[str, Any], path: Path, title: str) -> None:
    """Three panels over time: 1 s read latency (with thresholds), delay (ms), write MB/s."""
    plt = _pyplot()

    series = result["series"]
    thresholds = {c["label"]: c["threshold_s"] for c in result["controlled"]}
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ax_lat, ax_delay, ax_wr = axes
    colors = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd", "#ff7f0e"]
    for i, (label, s) in enumerate(series.items()):
        color = "black" if label == "uncontrolled" else colors[(i - 1) % len(colors)]
        t = s["t_s"]
        lat = [None if v is None else v * 1000.0 for v in s["read_latency_s"]]
        ax_lat.plot(t, lat, color=color, lw=0.9, label=label)
        if label in thresholds:
            ax_lat.axhline(thresholds[label] * 1000.0, color=color, ls="--", lw=0.8)
            ax_delay.plot(t, [d * 1000.0 for d in s["delay_s"]], color=color, lw=0.9, label=label)
        ax_wr.plot(t, [b / 1e6 for b in s["write_bps"]], color=color, lw=0.7, label=label)
    ax_lat.set_ylabel("read latency, 1 s mean (ms)")
    ax_lat.legend(loc="upper right", fontsize=8, ncol=len(series))
    ax_delay.set_ylabel("packet delay (ms)")
    ax_wr.set_ylabel("aggregate writes (MB/s)")
    ax_wr.set_xlabel("time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, path)
