"""The controller's tick compiled with mypyc beside the same tick in pure Python, one run.

Method (run by `make bench` through tests/bench/run.py, or alone:
`.venv/bin/python tests/bench/bench_compiled.py [--json]`):

  * This checkout's controller is compiled into a temporary directory the
    way the compiled wheel compiles it (buildsys/compiled.py: the same
    modules, staged as santhrottle/controller).
  * The controller benches of run.py (open and closed loop) run in
    subprocesses, alternately pure and with that directory first on
    PYTHONPATH, ROUNDS times each: a machine's speed moves from minute to
    minute, a ratio measured side by side does not.
  * Reported: the median over the rounds of each run's median tick and
    convergence tick, their spread (min..max), and the ratio compiled / pure.
    The goal (<= 5 ms) is judged on the compiled figures: the compiled wheel
    (`make wheel MYPYC=1`) is how a host with 1,000 resources runs.

Needs mypy's mypyc, a C compiler and Python's headers (dev dependencies on
this project's machines); without them it reports why and measures nothing.
The directory is removed at the end.

bench_deb() (`controller-deb`) measures the same way the controller the Debian package
carries (`make deb`: compiled at the package's build by Debian 12's mypyc), unpacked
from dist-deb/ with dpkg-deb, its dist-packages first on PYTHONPATH: the tick the
daemon installed by the package runs. With `--deb --against OTHER.deb` (another
revision's package, say) the other package's compiled controller runs in the same
rounds as a third side, and each figure gets the ratio this package / the other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "buildsys"))
sys.path.insert(0, str(Path(__file__).parent))
import compiled  # noqa: E402  (buildsys/compiled.py)
from compare import run_bench  # noqa: E402  (one bench of run.py in a subprocess)

RUN_PY = ROOT / "tests" / "bench" / "run.py"
ROUNDS = 3
GOAL_MS = 5.0
FIGURES = ("tick_ms_median", "converge_tick_ms_median")
PLANTS = ("controller", "controller-closed")


def _loaded_from(pythonpath: str) -> str:
    """Where santhrottle.controller.decide comes from with pythonpath first."""
    code = "import santhrottle.controller.decide as s; print(s.__file__)"
    env = compiled.env_for(pythonpath)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return p.stdout.strip() or p.stderr.strip()[-500:]


def _unpack(deb: Path, into: str) -> str:
    """The package's dist-packages, unpacked under into."""
    subprocess.run(["dpkg-deb", "-x", str(deb), into], check=True, capture_output=True)
    return str(Path(into) / "usr" / "lib" / "python3" / "dist-packages")


def bench_compiled(
    rounds: int = ROUNDS, deb: Path | None = None, against: Path | None = None
) -> dict[str, Any]:
    """deb: the Debian package's compiled controller instead of this checkout's compiled now;
    against: another package's, measured in the same rounds (with deb only)."""
    what = f"of the Debian package ({deb.name})" if deb else "compiled (mypyc)"
    name = f"controller decide() {what} vs pure Python, 1,000 resources x 10,000 initiators"
    if against is not None:
        name += f", and vs the package {against}"
    with tempfile.TemporaryDirectory(prefix="santhrottle-mypyc-") as unpacked:
        tmp = unpacked
        sides = {"compiled": tmp}  # side -> its PYTHONPATH, beside pure
        try:
            if deb is None:
                compiled.compile_into(Path(tmp))
            else:
                sides["compiled"] = _unpack(deb, str(Path(unpacked) / "this"))
            if deb is not None and against is not None:
                sides["against"] = _unpack(against, str(Path(unpacked) / "against"))
        except (SystemExit, OSError, subprocess.CalledProcessError) as e:
            return {"name": name, "summary": f"not measured: {e}"}
        for side, path in sides.items():
            where = _loaded_from(path)
            if not where.endswith(".so"):
                return {"name": name, "summary": f"not measured: {side} loads from {where}"}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            p: {"pure": [], **{side: [] for side in sides}} for p in PLANTS
        }
        for r in range(rounds):
            for plant in PLANTS:
                runs[plant]["pure"].append(run_bench(RUN_PY, plant, compiled.env_for(None)))
                # the packages alternate which runs first
                for side in sorted(sides, reverse=bool(r % 2)):
                    runs[plant][side].append(
                        run_bench(RUN_PY, plant, compiled.env_for(sides[side]))
                    )
    figures: dict[str, dict[str, Any]] = {}
    parts, met = [], True
    for plant in PLANTS:
        loop = "open" if plant == "controller" else "closed"
        for fig in FIGURES:
            pure = [r[fig] for r in runs[plant]["pure"]]
            comp = [r[fig] for r in runs[plant]["compiled"]]
            key = f"{loop}_{fig}"
            figures[key] = {side: [r[fig] for r in got] for side, got in runs[plant].items()}
            mc, mp = statistics.median(comp), statistics.median(pure)
            met = met and mc <= GOAL_MS
            what = "tick" if fig == "tick_ms_median" else "convergence tick"
            part = (
                f"{loop} loop {what} {mc:.2f} ms [{min(comp):.2f}..{max(comp):.2f}] "
                f"vs {mp:.2f} [{min(pure):.2f}..{max(pure):.2f}] (x{mc / mp:.2f})"
            )
            if "against" in runs[plant]:
                other = figures[key]["against"]
                ma = statistics.median(other)
                part += f", against {ma:.2f} [{min(other):.2f}..{max(other):.2f}] (x{mc / ma:.2f})"
            parts.append(part)
    return {
        "name": name,
        "met": met,
        "summary": f"compiled vs pure, medians of {rounds} alternated runs: " + "; ".join(parts),
        "figures": figures,
        "rounds": rounds,
        "goal_ms": GOAL_MS,
    }


def bench_deb(rounds: int = ROUNDS, against: Path | None = None) -> dict[str, Any]:
    """bench_compiled() on the Debian package of dist-deb/ (`make deb`)."""
    debs = sorted((ROOT / "dist-deb").glob("santhrottle_*_*.deb"))
    if len(debs) != 1:
        return {"name": "controller decide() of the Debian package vs pure Python",
                "summary": f"not measured: need one dist-deb/santhrottle_*.deb (make deb), "
                f"found {len(debs)}"}  # fmt: skip
    return bench_compiled(rounds, debs[0], against)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--deb", action="store_true", help="the Debian package's (dist-deb/)")
    ap.add_argument(
        "--against",
        type=Path,
        metavar="DEB",
        help="with --deb: another package, in the same rounds",
    )
    args = ap.parse_args()
    if args.against is not None and not args.deb:
        ap.error("--against needs --deb")
    if args.against is not None and not args.against.is_file():
        ap.error(f"--against: no such package: {args.against}")
    r = bench_deb(args.rounds, args.against) if args.deb else bench_compiled(args.rounds)
    print(json.dumps(r, indent=1) if args.json else f"{r['name']}: {r['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
