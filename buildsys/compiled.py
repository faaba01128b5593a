"""The controller's hot path compiled with mypyc: an opt-in of the wheel's build.

Why
    One tick of 1,000 resources and 10,000 initiators takes 4-9 ms of pure
    Python on a 2-core host (`make bench`); the controller modules below,
    compiled by mypyc (mypy's compiler: the same typed source, checked by
    `mypy --strict`, turned into C extension modules), run it about twice
    as fast. Nothing else changes: the compiled modules make the same
    decisions (tests/sim/test_compiled.py runs both on the same scenarios).

How
    SANTHROTTLE_MYPYC=1 in the environment of a wheel's build
    (`make wheel MYPYC=1`): the backend asks for mypy as a build requirement
    (buildsys/santhrottle_build.py), and setup.py hands setuptools the
    extensions of extensions().  The wheel then holds both the .py files and
    the extension modules beside them (Python imports an extension before a
    source of the same name), and is tagged for the building Python's
    version and platform (cp311 on Debian 12's python3.11), not py3-none-any.
    Without the variable nothing is compiled: the default wheel stays pure and
    reproducible byte for byte, and an editable install never runs stale
    compiled code after an edit.

    mypyc names a module after its path, and the source tree maps controller/
    to santhrottle.controller (pyproject.toml's package-dir): stage() copies
    the controller into a santhrottle/controller/ layout first.

    compile_into(dir) builds the same modules in place into dir (no wheel):
    `make bench` runs with env_for(dir), dir first on PYTHONPATH, to measure
    the compiled tick beside the pure one in one run, and the test does the same.

    The Debian package compiles them at build time (debian/rules: SANTHROTTLE_MYPYC=1
    with Debian 12's python3-mypy, 1.0.1) and checks them there:
    `python3 buildsys/compiled.py check DIR` runs tests/sim/compiled_decisions.py
    with DIR's santhrottle (the built one) and with the pure source, and fails
    unless the first ran compiled and both decided alike.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = "SANTHROTTLE_MYPYC"
# The tick's path (controller/decide.py and what it calls every tick or convergence);
# the simulators, the sweep and the fleet's logic stay Python.
MODULES = (
    "decide",
    "domain",
    "effective",
    "ewma",
    "futile",
    "ladder",
    "lqfit",
    "pid",
    "ramp",
    "rhythm",
    "setpoint",
    "state",
    "writeheavy",
)
STAGE = Path("build") / "mypyc-stage"  # under the tree being built
GROUP = "santhrottle.controller"
DRIVER = ROOT / "tests" / "sim" / "compiled_decisions.py"


def wanted() -> bool:
    """The build compiles (SANTHROTTLE_MYPYC set to 1, yes or true)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "yes", "true")


def stage(src: Path, into: Path) -> list[Path]:
    """Copy src/controller/*.py to into/santhrottle/controller/; returns the paths of
    MODULES there."""
    pkg = into / "santhrottle" / "controller"
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    (into / "santhrottle" / "__init__.py").write_text("")
    for f in sorted((src / "controller").glob("*.py")):
        shutil.copy2(f, pkg / f.name)
    return [pkg / f"{m}.py" for m in MODULES]


def extensions(root: Path = ROOT) -> list[Any]:
    """setuptools Extensions of MODULES (setup.py), staged under root/STAGE."""
    from mypyc.build import mypycify  # a build requirement only when wanted()

    paths = [str(p.relative_to(root)) for p in stage(root, root / STAGE)]
    # one group named after the package: mypyc's shared library is then
    # santhrottle/controller__mypyc.*.so, inside the package, not a top-level
    # module with a hash for a name
    exts: list[Any] = mypycify(paths, opt_level="3", separate=[(paths, GROUP)])
    return exts


def env_for(into: Path | str | None) -> dict[str, str]:
    """This process's environment with compile_into()'s directory first on
    PYTHONPATH (the compiled controller), or with no PYTHONPATH (None: the pure one)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if into is not None:
        env["PYTHONPATH"] = str(into)
    return env


def compile_into(into: Path, src: Path = ROOT) -> None:
    """Stage and compile MODULES in place under into (put into first on PYTHONPATH);
    SystemExit with mypyc's output if it fails."""
    paths = stage(src, into)
    cmd = [sys.executable, "-m", "mypyc", *(str(p.relative_to(into)) for p in paths)]
    r = subprocess.run(cmd, cwd=into, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"mypyc failed ({' '.join(cmd)}):\n{(r.stdout + r.stderr)[-3000:]}")


def decisions(pythonpath: Path) -> dict[str, Any]:
    """tests/sim/compiled_decisions.py's output with pythonpath's santhrottle."""
    import json
    import tempfile

    r = subprocess.run(
        [sys.executable, str(DRIVER)],
        env=env_for(pythonpath),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode:
        raise SystemExit(f"{DRIVER.name} with {pythonpath} failed:\n{r.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def check(built: Path) -> None:
    """SystemExit unless built's santhrottle.controller runs compiled and decides as
    the pure source does."""
    import tempfile

    comp = decisions(built)
    if not str(comp["decide_from"]).endswith(".so"):
        raise SystemExit(f"{built}: decide is not compiled ({comp['decide_from']})")
    with tempfile.TemporaryDirectory() as pure_dir:
        # the same package without the extension modules: Python then imports the .py
        # sources beside them, the pure controller
        shutil.copytree(
            built / "santhrottle",
            Path(pure_dir) / "santhrottle",
            ignore=shutil.ignore_patterns("*.so"),
        )
        pure = decisions(Path(pure_dir))
    if not str(pure["decide_from"]).endswith("decide.py"):
        raise SystemExit(f"the pure run imported {pure['decide_from']}")
    differ = sorted(k for k in pure if k != "decide_from" and comp.get(k) != pure[k])
    if differ:
        raise SystemExit(f"the compiled controller decided otherwise: {', '.join(differ)}")
    checked = ", ".join(sorted(k for k in pure if k != "decide_from"))
    print(f"compiled ({comp['decide_from']}) and pure decide alike: {checked}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "check":
        raise SystemExit("usage: python3 buildsys/compiled.py check DIR")
    check(Path(sys.argv[2]).resolve())
