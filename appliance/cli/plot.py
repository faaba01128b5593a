"""PNG figures like the method paper's figure 16: latency vs threshold, delay, write rate.

What it owns
    plot_simulation(): three panels over time from simulate()'s result, written
    with matplotlib (Agg) to the file named (its suffix picks the format).
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


def plot_simulation(result: dict[str, Any], path: Path, title: str) -> None:
    """Three panels over time: 1 s read latency (with thresholds), delay (ms), write MB/s."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise PlotUnavailable("--plot needs matplotlib: pip install 'santhrottle[plot]'") from e

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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise PlotError(f"cannot write plot {path}: {e.strerror or e}") from None
    except ValueError as e:  # matplotlib: a format it does not write
        raise PlotError(f"cannot write plot {path}: {str(e).splitlines()[0]}") from None
    finally:
        plt.close(fig)
