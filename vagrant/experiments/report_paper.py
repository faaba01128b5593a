"""The paper's run, reported: `make lab`'s figures, its tables and its verdict lines.

What it owns
    From a closed_loop.py run (raw.json) of the paper's experiment, the null_blk one or
    CI's short one: the phases summarized (labkit.analysis.summarize), the best static
    delay per threshold (static_pick), the bridge's phases beside the target host's
    (bridge_rows), the regime (regime_of, labkit.regime) and the bounds a run must show
    (labkit.regime.bounds), the LQ fit and the simulator's prediction (report_sim):
    summary(), summary.json's content.  print_report(): the report's lines, the regime
    and the bounds first (docs/lab.md, "What a run must show").
"""

from __future__ import annotations

import math

from labkit import capture, regime
from labkit.analysis import classes, fit_lq, summarize
from report_figures import ladder_of
from report_sim import calibrate_overhead, fit_streams, is_controlled, simulate_lab

PROTOCOL_NAMES = {"iscsi": "iSCSI", "nvme": "NVMe/TCP"}


HEAD = (
    f"{'threshold':>9} {'p50':>6} {'p95':>6} {'p99':>6} {'above%':>6} {'wr MB/s':>7} "
    f"{'retrans':>7} {'TLP':>4} {'spur.':>5} {'writers':>7} {'reader':>6} {'release':>8}"
)


def ms(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x * 1e3:.2f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def row_text(s: dict) -> str:
    """One controlled phase's columns of HEAD."""
    rel = s.get("release_throughput_back_after_s")
    return (
        f"{ms(s['threshold_s']):>7}ms {ms(s['read_latency_p50_s']):>6} "
        f"{ms(s['read_latency_p95_s']):>6} {ms(s['read_latency_p99_s']):>6} "
        f"{s['time_above_threshold_pct']:>6.1f} {s['write_bytes_per_s'] / 1e6:>7.1f} "
        f"{s['target_retrans_segs']:>7} {s['target_loss_probes']:>4} "
        f"{s['target_dsack_recv']:>5} {known(s.get('target_retrans_writers')):>7} "
        f"{known(s.get('target_retrans_others')):>6} "
        f"{'-' if rel is None else f'{rel:.1f}s':>8}"
    )


def parse_ms(text: str) -> float:
    from santhrottle.appliance.units import parse_duration_s

    return parse_duration_s(text)


def known(x: object) -> str:
    """A figure, or '?' where an older run did not record it."""
    return "?" if x is None else str(x)


def cpu_rows(unc: dict, rows: list[dict]) -> list[tuple[str, dict]]:
    """The phases that kept their CPU, named for the report's CPU line."""
    out = [("uncontrolled", unc)]
    for s in rows:
        out.append((f"{ms(s['threshold_s'])}ms", s))
        out += [
            (f"pinned {pr['delay_s'] * 1e3:g}ms", pr)
            for pr in (s.get("static") or {}).get("probes", [])
        ]
    return [(name, x) for name, x in out if "guest_idle_share" in x]


def static_pick(phases: list[dict], threshold: str, max_delay: str | None) -> dict | None:
    """The static probes of one threshold, and the smallest pinned delay that held it
    (with its class on the phase's ladder)."""
    probes = []
    for ph in phases:
        if ph.get("kind") == "static" and ph["threshold"] == threshold:
            thr = parse_ms(threshold)
            s = summarize(ph, thr, None)
            s["delay_s"] = ph["static_delay_us"] / 1e6
            s["class"] = ladder_of(ph, max_delay).class_at_least(s["delay_s"])
            probes.append(s)
    if not probes:
        return None
    held = [p for p in probes if p["read_latency_p95_s"] <= p["threshold_s"]]
    best = min(held, key=lambda p: p["delay_s"]) if held else None
    return {"probes": probes, "best": best}


def bridge_rows(phases: list[dict], rows: list[dict], unc: dict) -> list[dict]:
    """The bridge-mode phases summarized, each beside the target host's at its threshold:
    p95 and writes as ratios of the target host's (vs_target_p95, vs_target_writes)."""
    out = []
    for ph in phases:
        if ph.get("kind") != "bridge":
            continue
        s = summarize(ph, parse_ms(ph["threshold"]), unc["write_bytes_per_s"])
        s["uncontrolled_p95_s"] = unc["read_latency_p95_s"]
        host = next((r for r in rows if r["threshold_s"] == s["threshold_s"]), None)
        if host is not None:
            s["vs_target_p95"] = s["read_latency_p95_s"] / host["read_latency_p95_s"]
            wr = host["write_bytes_per_s"]
            s["vs_target_writes"] = s["write_bytes_per_s"] / wr if wr else None
        out.append(s)
    return out


def regime_of(raw: dict, unc: dict, rows: list[dict]) -> dict:
    """Whether the run shows the paper's regime (labkit.regime): the uncontrolled p95 at
    least 2 T at every threshold it reports; with the plant's choice when it made one."""
    p95 = unc["read_latency_p95_s"]
    ran = [s["threshold_s"] for s in rows]
    choice = raw.get("plant_choice")
    wanted = [parse_ms(x) for x in choice["wanted"]] if choice else ran
    status, ok = regime.verdict(p95, wanted)
    if not wanted:
        status = "not reached"
    return {
        "status": status,
        "uncontrolled_p95_s": p95,
        "wanted_s": wanted,
        "admitted_s": ok,
        "not_admitted_s": [t for t in ran if t not in ok],
        "regime_x": regime.REGIME_X,
        "plant_choice": choice,
    }


def bounds_line(b: dict) -> str:
    """One line: which bound held at which threshold."""
    names = {
        "p95_within_t": "controlled p95 <= T",
        "no_target_retrans": "0 target retransmissions",
        "best_static_above_class_1": "best static above class 1",
        "sim_within": f"simulator within {regime.SIM_WITHIN:.0%}",
        "writes_vs_static": f"writes >= {regime.VS_STATIC_AT_LEAST:.0%} of the best static's",
    }
    parts = []
    for key, name in names.items():
        bad = [t for t, v in b.items() if v[key] is False]
        none = [t for t, v in b.items() if v[key] is None]
        if bad:
            parts.append(f"{name}: NOT at {', '.join(bad)} ms")
        elif len(none) < len(b):
            parts.append(f"{name}: yes" + (f" (no figure at {', '.join(none)} ms)" if none else ""))
    return "BOUNDS (docs/lab.md): " + ("; ".join(parts) or "no controlled phase")


def summary(raw: dict) -> dict:
    """A run's figures (summary.json): the phases, the bridge's, the LQ fit, the
    simulator's prediction, the regime."""
    phases = raw["phases"]
    max_delay = raw["args"].get("max_delay")
    unc = summarize(phases[0], None, None)
    rows = []
    for ph in phases[1:]:
        if not is_controlled(ph):
            continue
        s = summarize(ph, parse_ms(ph["threshold"]), unc["write_bytes_per_s"])
        s["uncontrolled_p95_s"] = unc["read_latency_p95_s"]
        lad = ladder_of(ph, max_delay)
        cl = [k for _, k in classes(ph)]
        s["max_delay_s"] = lad.delay_s(max(cl, default=0))
        st = static_pick(phases, ph["threshold"], max_delay)
        if st is not None:
            s["static"] = st
            b = st["best"]
            s["vs_static_writes"] = (
                s["write_bytes_per_s"] / b["write_bytes_per_s"]
                if b and b["write_bytes_per_s"]
                else None
            )
        rows.append(s)
    fit = fit_lq(phases[0])
    c, m, r2 = (max(fit.c_s, 1e-6), max(fit.m_s, 1e-6), fit.r2) if fit else (1e-6, 1e-6, 0.0)
    out = {
        "args": raw["args"],
        "array_config": raw.get("array_config"),
        "guest_wall_s": raw.get("guest_wall_s"),
        "interference": raw.get("interference", []),
        "regime": regime_of(raw, unc, rows),
        "uncontrolled": unc,
        "controlled": rows,
        "bridge": bridge_rows(phases, rows, unc),
        "lq_fit": {
            "intercept_s": c,
            "slope_s_per_io": m,
            "r2": r2,
            "windows": fit.points if fit else 0,
        },
        "protocol": raw.get("protocol", "iscsi"),
    }
    if rows:  # the simulator runs the thresholds the lab ran
        little, noise = fit_streams(raw, c, m)
        overhead = calibrate_overhead(raw, c, m, noise, unc["read_latency_p50_s"])
        sim = simulate_lab(raw, c, m, noise, overhead)
        for s, sc in zip(rows, sim["controlled"], strict=True):
            s["sim_read_latency_p95_s"] = sc["read_latency_p95_s"]
            s["sim_vs_lab_p95"] = sc["read_latency_p95_s"] / s["read_latency_p95_s"] - 1
            s["sim_write_bytes_per_s"] = sc["write_throughput_bps"]
            if sc.get("best_constant"):
                s["sim_best_constant"] = sc["best_constant"]
        out["lq_fit"].update(
            writer_overhead_s=overhead, writer_overhead_little_s=little, read_noise=noise
        )
        out["sim"] = {
            "uncontrolled_p50_s": sim["uncontrolled"]["read_latency_p50_s"],
            "uncontrolled_p95_s": sim["uncontrolled"]["read_latency_p95_s"],
            "scenario": sim["scenario"],
        }
    out["bounds"] = regime.bounds(rows)
    return out


def regime_lines(r: dict) -> list[str]:
    """The report's first lines: the regime, and the plant's choice that led to it."""
    p95 = r["uncontrolled_p95_s"]
    thr = ", ".join(f"{t * 1e3:g}" for t in r["admitted_s"]) or "none"
    x = r["regime_x"]
    if r["status"] == "reached":
        head = (
            f"REGIME REACHED: the uncontrolled p95 {ms(p95)} ms is at least {x:g} T at "
            f"every threshold reported ({thr} ms)"
        )
    elif r["status"] == "partly":
        miss = ", ".join(f"{t * 1e3:g}" for t in r["wanted_s"] if t not in r["admitted_s"])
        head = (
            f"REGIME PARTLY REACHED: the uncontrolled p95 {ms(p95)} ms is at least {x:g} T "
            f"at {thr} ms only; not at {miss} ms, which this run does not report"
        )
    else:
        wanted = ", ".join(f"{t * 1e3:g}" for t in r["wanted_s"]) or "any"
        head = (
            f"REGIME NOT REACHED: the uncontrolled p95 {ms(p95)} ms is under {x:g} T at "
            f"every threshold wanted ({wanted} ms): without santhrottle the reader already "
            "stays under them, so no controlled figure of this run says what the product "
            "is for"
        )
    lines = [head]
    if r["not_admitted_s"]:
        lines.append(
            "  the thresholds it ran but the regime does not admit: "
            + ", ".join(f"{t * 1e3:g} ms" for t in r["not_admitted_s"])
            + " (their rows below are not the paper's experiment)"
        )
    ch = r.get("plant_choice")
    if ch:
        for t in ch["tries"]:
            lines.append(
                f"  plant C {t['c_ms']:g} ms, m {t['m_ms']:g} ms/IO: uncontrolled p95 "
                f"{ms(t['p95_s'])} ms ({t['status']}); the array's Q {t['q']:.2f} at "
                f"{t['iops']:.0f} IOPS of the writers, their time per IO outside the array "
                f"{ms(t['overhead_s'])} ms"
                + (f"; next: m {t['next_m_ms']:g} ms/IO" if t.get("next_m_ms") else "")
            )
        first = ch["tries"][0]["m_ms"]
        why = (
            "the configured slope"
            if ch["m_ms"] == first
            else f"raised from {first:g} ms/IO: there the emulated writers kept too few IOs at "
            f"the array for its uncontrolled p95 to reach {x:g} x {max(r['wanted_s']) * 1e3:g} ms "
            "(labkit.regime)"
        )
        lines.append(f"  chosen: m {ch['m_ms']:g} ms/IO, {why}; thresholds {thr} ms")
    return lines


def print_report(raw: dict, sm: dict) -> None:
    unc, rows, bridged = sm["uncontrolled"], sm["controlled"], sm["bridge"]
    for line in [*regime_lines(sm["regime"]), bounds_line(sm["bounds"])]:
        print(line)
    proto = PROTOCOL_NAMES[sm["protocol"]]
    print(f"protocol: {proto} (the reader and the writer hosts)")
    print("interference (reader 4 KiB QD1 at 256 kB/s; latency at the target's diskstats / fio):")
    for i in raw.get("interference", []):
        print(
            f"  {i['writers']} writer(s): {ms(i['reader_dm_latency_s'])} ms / fio mean "
            f"{ms(i['reader_fio_mean_s'])} ms, p95 {ms(i['reader_fio_p95_s'])} ms; writes "
            f"{i['writes_bytes_per_s'] / 1e6:.1f} MB/s"
        )
    print(
        f"uncontrolled: p50 {ms(unc['read_latency_p50_s'])} p95 {ms(unc['read_latency_p95_s'])} "
        f"p99 {ms(unc['read_latency_p99_s'])} ms, writes {unc['write_bytes_per_s'] / 1e6:.1f} "
        f"MB/s, target retrans {unc['target_retrans_segs']} (TLP {unc['target_loss_probes']}, "
        f"spurious {unc['target_dsack_recv']}; on the writers' connections "
        f"{known(unc.get('target_retrans_writers'))}, the reader's "
        f"{known(unc.get('target_retrans_others'))})"
    )
    if rows:
        print(f"{HEAD} {'sim p95':>7} {'sim/lab':>7} {'max dly':>7}")
    for s in rows:
        print(
            f"{row_text(s)} {ms(s['sim_read_latency_p95_s']):>7} "
            f"{s['sim_vs_lab_p95']:>+7.0%} {ms(s['max_delay_s']):>7}"
        )
    if bridged:
        print(
            "through the bridge (santhrottled in bridge mode: the wire its sensor, its delays "
            "on the bridge's initiator-side port; the reader still measured at the target):"
        )
        print(f"{HEAD} {'p95/host':>8} {'wr/host':>7}")
        for s in bridged:
            print(
                f"{row_text(s)} {pct(s.get('vs_target_p95')):>8} "
                f"{pct(s.get('vs_target_writes')):>7}"
            )
    lq = sm["lq_fit"]
    c, m = lq["intercept_s"], lq["slope_s_per_io"]
    line = (
        f"LQ fit of the array (uncontrolled run, 1 s windows): C {c * 1e3:.3f} ms, "
        f"m {m * 1e3:.3f} ms/IO, R^2 {lq['r2']:.2f}"
    )
    if "sim" in sm:
        line += (
            f"; simulator's writers: overhead {lq['writer_overhead_s'] * 1e3:.1f} ms per "
            "IO, calibrated to the uncontrolled median (Little's law: "
            f"{lq['writer_overhead_little_s'] * 1e3:.1f}); simulated uncontrolled p95 "
            f"{sm['sim']['uncontrolled_p95_s'] * 1e3:.2f} ms (lab "
            f"{unc['read_latency_p95_s'] * 1e3:.2f})"
        )
    print(line)
    cfg = raw.get("array_config")
    if cfg:
        print(
            f"the array is the known plant: configured C {cfg.get('c_ms')} ms, m "
            f"{cfg.get('m_ms')} ms/IO ({cfg}); fitted / configured: C "
            f"{c * 1e3 / cfg['c_ms']:.2f}, m {m * 1e3 / cfg['m_ms']:.2f}"
        )
    if rows:
        print(
            "descents (initiators whose delay went down) through a glide leaf / unordered: "
            + ", ".join(
                f"{ms(s['threshold_s'])}ms {s['glided_descents']}/{s['unordered_descents']}"
                for s in rows
            )
        )
    for s in rows + bridged:
        if s.get("over_threshold"):
            where = " (bridge)" if s in bridged else ""
            spans = "; ".join(over_text(x) for x in s["over_threshold"])
            print(f"{ms(s['threshold_s'])}ms{where}: over T at {spans}")
    print_static(rows)
    if "guest_idle_share" in unc:
        print(
            "the guest's CPU per phase (daemon / its tick loop / idle): "
            + "; ".join(
                f"{name} {pct(x.get('daemon_cpu_share'))} / {pct(x.get('daemon_tick_cpu_share'))} "
                f"/ {pct(x['guest_idle_share'])}"
                for name, x in cpu_rows(unc, rows)
            )
        )
    for s in rows:
        events = s.get("writer_retrans_events", [])
        for e in events:
            if "classes" in e:  # the interval it happened in, the classes sampled then
                when = ", ".join(f"{c} at {t:.1f} s" for t, c in e["classes"])
                print(
                    f"  {ms(s['threshold_s'])}ms: {e['n']} retransmission(s) to writer "
                    f"{e['initiator']} between {e['after_s']:.1f} and "
                    f"{e.get('until_s', e['t']):.1f} s; its class at the daemon's status "
                    f"samples from the one before: {when}"
                )
            else:  # a summary written before the interval was kept
                print(
                    f"  {ms(s['threshold_s'])}ms: {e['n']} retransmission(s) to writer "
                    f"{e['initiator']} at {e['t']:.1f} s; its classes sampled before: "
                    f"{e['classes_before']}"
                )
        if events:
            print(
                f"    the phase's target TCP: {s.get('target_fast_retrans', 0)} fast "
                f"retransmission(s) (reordering or loss), {s.get('target_loss_probes', 0)} "
                f"tail-loss probe(s), {s.get('target_timeouts', 0)} timeout(s); "
                f"{s.get('target_dsack_recv', 0)} DSACKed (spurious)" + held_in_qdisc(s)
            )
    print_captures(unc, rows)
    print(
        "writers / reader: retransmissions on the connections santhrottle delays (the writers') "
        "and on the reader's, which it never delays (ss -ti at the phase's start and end)"
    )
    print(
        "spur.: retransmissions the initiators' DSACKs showed they already had; "
        f"{proto} connections' min RTT {', '.join(f'{x:g}' for x in unc['min_rtt_ms'])} ms "
        "(RACK's reordering window is a quarter of it)"
    )
    print(
        "latencies in ms, from the target's diskstats over 1 s windows after the writers' first "
        "on-period; release: seconds from the reader leaving until the writers are back at 90 % "
        "of their uncontrolled throughput"
    )


def over_text(x: dict) -> str:
    """One run of windows over T (analysis.over_threshold) in the report's words."""
    when = "in a pause" if x["into_burst_s"] is None else f"{x['into_burst_s']:.1f} s into a burst"
    k = "" if x["classes"] is None else f", class {x['classes'][0]}-{x['classes'][1]}"
    n = x.get("futile")
    f = f", {n} futile release(s)" if n else ""
    return f"{x['from_s']:.1f}-{x['to_s']:.1f} s (peak {ms(x['peak_s'])} ms, {when}{k}{f})"


def held_in_qdisc(s: dict) -> str:
    """The phase's probe and retransmission timers that found their segment still in
    santhrottle's qdisc and sent nothing ("" for a run that did not count them)."""
    n = s.get("target_held_in_qdisc")
    return "" if n is None else f"; {n} timer(s) found the segment still in the qdisc"


def print_captures(unc: dict, rows: list[dict]) -> None:
    """closed_loop.py --capture: per phase and writer, the packets captured at the
    target's veth, those that left after one sent later (overtaken at santhrottle's
    qdisc) and the data segments sent twice (labkit.capture)."""
    phases = [("uncontrolled", unc)] + [(f"{ms(s['threshold_s'])}ms", s) for s in rows]
    phases += [
        (f"{ms(s['threshold_s'])}ms pinned {pr['delay_s'] * 1e3:g} ms", pr)
        for s in rows
        for pr in (s.get("static") or {}).get("probes", [])
    ]
    got = [(name, x["capture"]) for name, x in phases if x.get("capture") is not None]
    if not got:
        return
    print(
        "captured at the target's veth (the order the packets to the writers left "
        "santhrottle's qdisc, by IP ID): packets / overtaken / data sent twice"
    )
    for name, cap in got:
        per = "; ".join(
            f"{ip} {c['packets']} / {c['overtaken']} / {c['sent_twice']}"
            for ip, c in sorted(cap.items())
        )
        print(f"  {name}: {per or 'nothing captured'}")
        for ip, c in sorted(cap.items()):
            for e in c["events"][:5]:
                behind = "" if e["behind"] is None else f", {e['behind']} IDs behind"
                print(
                    f"    {ip} at {e['t']:.3f} s: {e['what']} (IP ID {e['id']}{behind})"
                    + capture.timing(e)
                )


def print_static(rows: list[dict]) -> None:
    if not any("static" in s for s in rows):
        return
    print(
        "static delays pinned by hand on the writers (santhrottle pin; the daemon runs "
        "with the threshold, as controlled, its pins over its classes), each probe over "
        "its on-periods:"
    )
    for s in rows:
        st = s.get("static")
        if not st:
            continue
        for pr in st["probes"]:
            print(
                f"  {ms(s['threshold_s'])}ms: pinned {pr['delay_s'] * 1e3:g} ms: p50 "
                f"{ms(pr['read_latency_p50_s'])} p95 {ms(pr['read_latency_p95_s'])} p99 "
                f"{ms(pr['read_latency_p99_s'])} ms, above T "
                f"{pr['time_above_threshold_pct']:.1f} %, writes "
                f"{pr['write_bytes_per_s'] / 1e6:.2f} MB/s, target retrans "
                f"{pr['target_retrans_segs']}"
            )
        b = st["best"]
        sb = s.get("sim_best_constant")
        ratio = s.get("vs_static_writes")
        print(
            f"  {ms(s['threshold_s'])}ms: best static "
            + (
                "none held T"
                if b is None
                else f"{b['delay_s'] * 1e3:g} ms (class "
                f"{b.get('class', '?')}), {b['write_bytes_per_s'] / 1e6:.2f} MB/s"
            )
            + f"; controller {s['write_bytes_per_s'] / 1e6:.2f} MB/s"
            + ("" if ratio is None else f" = {ratio:.1%} of it")
            + (
                ""
                if not sb
                else f"; simulator's best constant {sb['delay_s'] * 1e3:g} ms, "
                f"controller {sb['controlled_vs_constant']:.1%} of it"
            )
        )
