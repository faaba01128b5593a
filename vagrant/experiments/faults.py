#!/usr/bin/env python3
"""The fault campaign (issue 17): santhrottled under the closed loop's load, faults repeated.

    python3 vagrant/experiments/faults.py [--reps 5] [--faults kill9,hup,...] [--rev HEAD]
    python3 vagrant/experiments/faults.py --from results/faults-...     # the table again
    make lab-faults [ARGS='--reps 1 --faults kill9']

What it owns
    The host's half: a snapshot of the product at a commit (`git archive REV`
    of appliance/, controller/, bridge/ into OUT/product/santhrottle, which
    the guest puts first on PYTHONPATH: the run measures that commit, not
    whatever the shared working tree holds at the time), one lab guest
    (vagrant/qemu/lab.py run, the lab's default two vCPUs) running the
    campaign (faults_run.py; the faults in faults_inject.py, the readings in
    faults_measure.py), then the table: per fault, the repetitions, iSCSI
    sessions alive, I/O errors at the initiators, orphan members, the
    target's retransmissions, the worst tick lateness and the time to hold
    the threshold again, median and range; and whether each row meets
    issue 17's acceptance.  The definitions: docs/faults.md.

    OUT (results/faults-YYYYmmdd-HHMMSS/) keeps faults.json (every
    repetition's readings), faults.md (the table), the daemon's log of every
    start and the config it ran with.

Worked example
    faults.py --reps 1 --faults baseline,kill9 --out results/faults-try
    -> `lab.py run --timeout ... faults.py --in-guest --out ... --product ... --rev 564dcbe...`,
       then a table with a row per fault, e.g.
       | kill9 | 1 | 1/1 | 0 | 0 | 0 [0..0] | 310 (310 [310..310]) ms | 2.4 [2.4..2.4] s | yes |
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
LAB_PY = CHECKOUT / "vagrant" / "qemu" / "lab.py"
PRODUCT_DIRS = ("appliance", "controller", "bridge")
FAULT_ORDER = ("baseline", "kill9", "hup", "link", "stall", "cli", "flood")
# lab.py's guest limit: the whole campaign (7 faults x 5 repetitions) is 25-40 min under TCG
TIMEOUT_S = 3600.0
GUEST_PYTHON = "/usr/bin/python3"  # the guest's (labkit.images.SYSTEM_PYTHON)
# issue 17's acceptance, per row
MAX_TICK_LATE_MS = 1000
MAX_TIME_TO_HOLD_S = 5.0


def snapshot(rev: str, out: Path) -> str:
    """`git archive rev` of the product's packages into out/santhrottle; returns the commit."""
    sha = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    pkg = out / "santhrottle"
    pkg.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(CHECKOUT), "archive", sha, *PRODUCT_DIRS], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive, check=True)
    (pkg / "__init__.py").write_text("")  # a regular package: nothing of the working tree mixes in
    # compiled as the Debian package's postinst compiles it, by the guest's interpreter
    # (the host's /usr, shared): the guest writes no bytecode (PYTHONDONTWRITEBYTECODE),
    # and each `santhrottle` a fault runs would compile every module it imports under TCG
    subprocess.run([GUEST_PYTHON, "-m", "compileall", "-q", str(pkg)], check=True)
    return sha


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    if not xs:
        return "-"
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}..{fmt.format(max(xs))}]"


def row(fault: str, reps: list[dict]) -> dict:
    holds = [r["time_to_hold_s"] for r in reps]
    late = [r["tick_late_max_ms"] for r in reps]
    return {
        "fault": fault,
        "reps": len(reps),
        "sessions_alive": sum(bool(r["sessions_alive"]) for r in reps),
        "connections_replaced": sum(r.get("connections_replaced", 0) for r in reps),
        "io_errors": sum(r["io_errors"] for r in reps),
        "orphans": sum(len(r["orphans"]) for r in reps),
        "riding": sum(len(r.get("riding", [])) for r in reps),
        "faults_broken": sum(bool(r.get("fault_error")) for r in reps),
        "retrans": [r["target_retrans"] for r in reps],
        "tick_late_ms": late,
        "hold_s": [h for h in holds if h is not None],
        "never_held": sum(h is None for h in holds),
        "met": all(
            r["sessions_alive"]
            and not r.get("fault_error")
            and not r["io_errors"]
            and not r["orphans"]
            and r["tick_late_max_ms"] <= MAX_TICK_LATE_MS
            and r["time_to_hold_s"] is not None
            and r["time_to_hold_s"] <= MAX_TIME_TO_HOLD_S
            for r in reps
        ),
    }


def over_pct(r: dict) -> float | None:
    """Percent of the 1 s windows over T from the fault's start until it held again."""
    thr_ms, hold = r.get("threshold_ms", 2.0), r["time_to_hold_s"]
    span = [v for t, v in r.get("windows_ms", []) if -r["fault_s"] <= t <= (hold or 0.0)]
    if not span:
        return None
    return 100 * sum(v is None or v > thr_ms for v in span) / len(span)


def notes(fault: str, reps: list[dict]) -> str:
    """What the fault itself saw, in a few words per row."""
    if fault == "kill9":
        over = [over_pct(r) for r in reps]
        return (
            f"restart (kill -> answering) {spread([r.get('restart_s', 0) for r in reps])} s, of "
            f"which cleanup {spread([r.get('cleanup_s', 0) for r in reps])} s, --check "
            f"{spread([r.get('check_s', 0) for r in reps])} s, start "
            f"{spread([r.get('ready_s', 0) for r in reps])} s; members the kill left "
            f"{[r.get('members_left_by_kill') for r in reps]}; windows over T from the kill to "
            f"the hold {spread([x for x in over if x is not None], '{:.0f}')} %"
        )
    if fault == "hup":
        bad = [r["kind"] for r in reps if not r.get("alive") or not r.get("good_reload_taken")]
        refused = [r["kind"] for r in reps if r.get("reload_failures_counted")]
        other = [
            f"{r['kind']}: '{' '.join(x for x in r.get('log', []) if 'reload' in x)[:120]}'"
            for r in reps
            if not r.get("reload_failures_counted")
        ]
        return (
            f"daemon alive and the good reload taken after {len(reps) - len(bad)}/{len(reps)}; "
            f"refused and counted: {len(refused)}/{len(reps)}"
            + (f"; not refused: {'; '.join(other)}" if other else "")
        )
    if fault == "cli":
        failed = [r.get("failed", "?") for r in reps]
        errs: dict[str, int] = {}
        for r in reps:
            for k, v in (r.get("errors") or {}).items():
                errs[k] = errs.get(k, 0) + v
        top = max(errs, key=errs.get) if errs else ""
        return f"failed calls per 1,000: {failed}" + (f"; most common: '{top}'" if top else "")
    if fault == "flood":
        return (
            "opened "
            + ", ".join(str(r.get("opened")) for r in reps)
            + f"; daemon threads during {[r.get('daemon_during', {}).get('Threads') for r in reps]}"
            + f"; admin's status probes failed {[r.get('probe_failures') for r in reps]}"
        )
    if fault == "link":
        return (
            f"down {spread([r.get('down_s', 0) for r in reps])} s; iSCSI connections "
            f"re-established {[r.get('connections_replaced') for r in reps]}"
        )
    if fault == "stall":
        return f"stalled {spread([r.get('stalled_s', 0) for r in reps])} s"
    return ""


def table(res: dict) -> str:
    meta = res["meta"]
    faults = [f for f in FAULT_ORDER if any(r["fault"] == f for r in res["reps"])]
    lines = [
        f"threshold {meta['threshold_s'] * 1e3:g} ms; product {meta.get('product_rev') or 'tree'}; "
        f"kernel {meta['kernel']}; {meta['vcpus']} vCPU(s)",
        "",
        "| fault | reps | sessions alive | I/O errors | orphan members | target retrans "
        "median [range] | worst tick late, ms: max (median [range]) | time to hold again, s: "
        "median [range] | met | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in faults:
        reps = [
            {**r, "threshold_ms": meta["threshold_s"] * 1e3} for r in res["reps"] if r["fault"] == f
        ]
        x = row(f, reps)
        never = f" ({x['never_held']} never)" if x["never_held"] else ""
        riding = f" ({x['riding']} riding a 0 ms leaf)" if x["riding"] else ""
        broken = f"; **the fault broke in {x['faults_broken']}**" if x["faults_broken"] else ""
        lines.append(
            f"| {f} | {x['reps']} | {x['sessions_alive']}/{x['reps']} | {x['io_errors']} | "
            f"{x['orphans']}{riding} | {spread(x['retrans'], '{:g}')} | {max(x['tick_late_ms'])} "
            f"({spread(x['tick_late_ms'], '{:g}')}) | {spread(x['hold_s'])}{never} | "
            f"{'yes' if x['met'] else '**no**'} | {notes(f, reps)}{broken} |"
        )
    return "\n".join(lines)


def report(out: Path) -> int:
    res = json.loads((out / "faults.json").read_text())
    text = table(res)
    (out / "faults.md").write_text(text + "\n")
    print(text)
    print(f"results: {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--from", dest="from_dir", type=Path, help="print the table of an earlier run")
    ap.add_argument("--faults", default=",".join(FAULT_ORDER))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threshold", default="2ms")
    ap.add_argument("--rev", default="HEAD", help="the commit whose product is measured")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S)
    ap.add_argument("--in-guest", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--product", help=argparse.SUPPRESS)
    # the closed loop's load (vagrant/experiments/closed_loop.py)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--writer-bs", default="64k")
    ap.add_argument("--writer-qd", type=int, default=4)
    ap.add_argument("--reader-rate", default="256k")
    ap.add_argument("--mbps", type=int, default=20)
    ap.add_argument("--queue-depth", type=int, default=4)
    ap.add_argument("--max-delay", default="100ms")
    ap.add_argument("--setpoint", type=float, default=0.55)
    a = ap.parse_args()
    unknown = set(a.faults.split(",")) - set(FAULT_ORDER)
    if unknown:
        ap.error(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {', '.join(FAULT_ORDER)}")
    if a.in_guest:
        import faults_run

        return faults_run.main(a)
    if a.from_dir:
        return report(a.from_dir.resolve())
    out = (a.out or CHECKOUT / "results" / time.strftime("faults-%Y%m%d-%H%M%S")).resolve()
    if not out.is_relative_to(CHECKOUT):
        ap.error(f"--out must be inside the checkout {CHECKOUT} (the guest sees only that)")
    out.mkdir(parents=True, exist_ok=True)
    sha = snapshot(a.rev, out / "product")
    print(f"faults: product of {sha} in {out / 'product'}", flush=True)
    passed = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(a).items()
        if k not in ("out", "from_dir", "rev", "timeout", "in_guest", "product")
    ]
    smp = os.environ.get("SANTHROTTLE_LAB_SMP")
    p = subprocess.run(
        [
            sys.executable,
            str(LAB_PY),
            *(["--smp", smp] if smp else []),
            "run",
            "--timeout",
            str(a.timeout),
            str(Path(__file__).resolve()),
            "--in-guest",
            f"--out={out}",
            f"--product={out / 'product'}",
            f"--rev={sha}",
            *passed,
        ]
    )
    if not (out / "faults.json").exists():
        print(f"lab run failed (exit {p.returncode}); nothing measured", file=sys.stderr)
        return p.returncode or 1
    report(out)
    if p.returncode != 0:
        print(
            f"lab run failed (exit {p.returncode}); the table has what was measured",
            file=sys.stderr,
        )
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
