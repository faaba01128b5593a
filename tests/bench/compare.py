"""`make bench-compare REV=...`: the benches side by side against another revision, in one run.

Machines differ in speed from run to run, and a shared machine from minute
to minute: a figure measured today is only comparable with one measured in
the same run.  This runs each bench of this checkout and of REV alternately,
ROUNDS times each (this first in odd rounds, REV first in even ones: neither
always runs first), and reports for each figure the median and spread
(min..max) of both and the ratio of the medians (this / REV: below 1 is
faster); each run's summary goes to stderr as it ends.

REV's code is extracted with `git archive` into a temporary directory and
imported through a shim package (santhrottle.controller / .sim / .appliance /
.bridge pointing into it) on PYTHONPATH, ahead of this checkout's editable
install; REV's own tests/bench/run.py measures it, or with --same-bench
this checkout's (the same workload for both, where the bench changed
since REV; REV's code must then have the API the bench calls); a bench
REV's run.py does not have is always this checkout's (bench_sim.py finds
either layout of the simulator).  The
directory is removed at the end.

    .venv/bin/python tests/bench/compare.py --against b858db4 datapath sensing
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# bench -> the figures compared (keys of its JSON result)
FIGURES = {
    "datapath": ("move_ms_median",),
    "drift": ("check_ms_per_convergence", "check_ms_median"),
    "sensing": (
        "full_pass_ms_median",
        "tick_ms_median",
        "converge_ms_median",
        "lio_scan_ms_median",
    ),
    "controller": ("tick_ms_median", "converge_tick_ms_median"),
    "controller-closed": ("tick_ms_median", "converge_tick_ms_median"),
    "simulator": ("paper_s_median",),
    "wire": ("offline_us_per_frame",),  # the Python walker's CPU a frame, from memory
}
# figures in seconds or microseconds rather than milliseconds
SECONDS = {"paper_s_median"}
MICROSECONDS = {"offline_us_per_frame"}


def _extract(rev: str, into: Path) -> Path:
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    shim = into / "shim" / "santhrottle"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("")
    for part in ("controller", "sim", "appliance", "bridge"):
        if (src / part).is_dir():  # sim/ since the simulator left controller/
            os.symlink(src / part, shim / part)
    return src


def run_bench(run_py: Path, name: str, env: dict[str, str] | None) -> dict:
    p = subprocess.run(
        [sys.executable, str(run_py), name, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=run_py.parents[2],
        check=False,
    )
    if p.returncode != 0:
        raise SystemExit(f"{run_py} {name} failed:\n{p.stderr[-2000:]}")
    (result,) = json.loads(p.stdout)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, metavar="REV", help="git revision to compare")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--same-bench", action="store_true", help="measure REV with this checkout's benches"
    )
    ap.add_argument("names", nargs="*", default=list(FIGURES), help="benches (default all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="santhrottle-bench-") as tmp:
        src = _extract(args.against, Path(tmp))
        env = dict(os.environ, PYTHONPATH=str(Path(tmp) / "shim"))
        runs: dict[str, dict[str, list[dict]]] = {n: {"this": [], "rev": []} for n in args.names}
        for r in range(args.rounds):
            for name in args.names:
                # REV's own bench, unless asked for this one's or REV has none of that name
                own = f'"{name}":' in (src / "tests/bench/run.py").read_text()
                bench = ROOT if args.same_bench or not own else src
                sides = [("this", ROOT, None), ("rev", bench, env)]
                for side, where, side_env in sides[:: -1 if r % 2 else 1]:
                    got = run_bench(where / "tests/bench/run.py", name, side_env)
                    runs[name][side].append(got)
                    # each run's own summary too (the wire bench's kernel sensor, say)
                    print(f"round {r + 1} {side} {name}: {got.get('summary', '')}", file=sys.stderr)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        shutil.rmtree(Path(tmp) / "shim", ignore_errors=True)
    out = []
    for name in args.names:
        for fig in FIGURES[name]:
            this = [x[fig] for x in runs[name]["this"] if fig in x]
            rev = [x[fig] for x in runs[name]["rev"] if fig in x]
            if not this or not rev:
                continue
            out.append(
                {
                    "bench": name,
                    "figure": fig,
                    "this": this,
                    "rev": rev,
                    "ratio": statistics.median(this) / statistics.median(rev),
                }
            )
    if args.json:
        json.dump({"against": args.against, "rounds": args.rounds, "figures": out}, sys.stdout)
        print()
        return 0
    print(
        f"{'bench':<10} {'figure':<24} {'this: median [min..max]':>28} "
        f"{args.against[:12] + ': median [min..max]':>32} {'ratio':>6}"
    )
    for f in out:
        t, v = f["this"], f["rev"]
        unit = "s " if f["figure"] in SECONDS else "us" if f["figure"] in MICROSECONDS else "ms"
        print(
            f"{f['bench']:<10} {f['figure']:<24} "
            f"{statistics.median(t):>10.2f} [{min(t):.2f}..{max(t):.2f}] {unit}  "
            f"{statistics.median(v):>10.2f} [{min(v):.2f}..{max(v):.2f}] {unit} {f['ratio']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
