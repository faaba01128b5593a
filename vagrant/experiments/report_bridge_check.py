#!/usr/bin/env python3
"""The report of a closed_loop.py --bridge-check run: the wire against the array and the initiator.

    .venv/bin/python vagrant/experiments/report_bridge_check.py RESULTS_DIR   # on the host

Per phase (labkit.analysis.summarize at the run's threshold): the p95 of the 1 s
windows of the reader's latency three ways -- the array's (the target's diskstats of
the reader's LV), the initiator's (fio's completion latency, reader_clat) and the
daemon's sensor's (the wire, sensor_*) -- with the share of windows above T; the
writers' throughput against the uncontrolled phase's; the share of the daemon's
samples with a writer delayed and the highest class; the daemon's CPU and that of
the programs it ran (nft), of the guest's. Then the medians with their spread per
kind of phase. Writes RESULTS_DIR/bridge-check.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from labkit.analysis import spread, summarize
from report_light import delayed_share

from santhrottle.appliance.units import parse_duration_s


def label(ph: dict) -> str:
    if ph["kind"] != "bridge":
        return ph["kind"]
    if ph.get("threshold") is None:
        return "bridge-observe"
    return "bridge-nft-prog" if ph.get("nft_program") else "bridge"


def rows(raw: dict) -> list[dict]:
    t_s = parse_duration_s(raw["args"]["thresholds"].split(",")[0])
    out = []
    for ph in raw["phases"]:
        s = summarize(ph, t_s, None)
        s["label"], s["rep"] = label(ph), ph.get("rep", 0)
        if ph["kind"] != "uncontrolled":
            s["delayed_share"] = delayed_share(ph)
        out.append(s)
    unc = [s["write_bytes_per_s"] for s in out if s["label"] == "uncontrolled"]
    for s in out:
        if unc and unc[0]:
            s["vs_uncontrolled_writes"] = s["write_bytes_per_s"] / unc[0]
    return out


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def pc(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}"


def report(out: Path) -> int:
    """Print the table and the medians of the run in `out`; write its bridge-check.json."""
    raw = json.loads((out / "raw.json").read_text())
    rs = rows(raw)
    print(
        f"{'phase':<16}{'rep':>3} {'array p95':>9} {'fio p95':>8} {'fio>T%':>6} "
        f"{'wire p95':>8} {'wire>T%':>7} {'wr MB/s':>7} {'vs unc':>6} {'delayed':>7} "
        f"{'max cl':>6} {'daemon':>6} {'nft &c':>6} {'idle':>5}"
    )
    for s in rs:
        vs, dl = s.get("vs_uncontrolled_writes"), s.get("delayed_share")
        cpu = {k: s.get(f"{k}_share") for k in ("daemon_cpu", "daemon_children_cpu", "guest_idle")}
        print(
            f"{s['label']:<16}{s['rep']:>3} {ms(s['read_latency_p95_s']):>9} "
            f"{ms(s.get('reader_clat_p95_s')):>8} "
            f"{pc(s.get('reader_clat_above_threshold_pct')):>6} "
            f"{ms(s.get('sensor_p95_s')):>8} {pc(s.get('sensor_above_threshold_pct')):>7} "
            f"{s['write_bytes_per_s'] / 1e6:>7.2f} {'-' if vs is None else f'{vs:.0%}':>6} "
            f"{'-' if dl is None else f'{dl:.0%}':>7} {s.get('max_delay_class', '-'):>6} "
            f"{pct(cpu['daemon_cpu']):>6} {pct(cpu['daemon_children_cpu']):>6} "
            f"{pct(cpu['guest_idle']):>5}"
        )
    med = {}
    for lab in sorted({s["label"] for s in rs}):
        for key in ("vs_uncontrolled_writes", "reader_clat_p95_s", "sensor_p95_s", "delayed_share"):
            sp = spread([s[key] for s in rs if s["label"] == lab and s.get(key) is not None])
            if sp:
                med[f"{lab}.{key}"] = sp
    for k, v in med.items():
        print(f"median [min..max] {k}: {v[0]:.4g} [{v[1]:.4g}..{v[2]:.4g}]")
    (out / "bridge-check.json").write_text(json.dumps({"phases": rs, "medians": med}, indent=1))
    return 0


def main() -> int:
    return report(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
