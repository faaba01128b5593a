"""`make wheel MYPYC=1`'s build: a wheel whose controller tick is compiled (mypyc),
that installs into Debian 12's Python and decides as the pure controller.

The build is the real one (`python -m build`: sdist, then the wheel from it, in
an isolated environment that fetches mypy), with SANTHROTTLE_MYPYC=1.  The
wheel is installed without dependencies into a venv of /usr/bin/python3 (the
targets' Python; this one where it is not there) and runs
tests/sim/compiled_decisions.py, whose output must match this checkout's pure
controller's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "buildsys"))
import compiled  # noqa: E402  (buildsys/compiled.py)

DRIVER = ROOT / "tests" / "sim" / "compiled_decisions.py"
DEBIAN_PY = Path("/usr/bin/python3")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=900, check=False, **kw
    )


def _decisions(python: str | Path, env: dict[str, str]) -> dict[str, object]:
    p = _run([python, DRIVER], env=env, cwd="/")
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, object] = json.loads(p.stdout)
    return out


def test_the_compiled_wheel_carries_the_extensions_and_decides_as_the_pure_controller(
    tmp_path: Path,
) -> None:
    try:
        import build  # noqa: F401
    except ImportError:
        pytest.skip("python -m build: the `build` package is not installed in this venv")
    env = dict(compiled.env_for(None), SANTHROTTLE_MYPYC="1")
    dist = tmp_path / "dist"
    p = _run([sys.executable, "-m", "build", "--outdir", dist, ROOT], env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    (whl,) = dist.glob(f"santhrottle-*-{tag}-{tag}-*.whl")
    (sdist,) = dist.glob("santhrottle-*.tar.gz")
    with tarfile.open(sdist) as t:
        snames = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"setup.py", "buildsys/compiled.py"} <= snames
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
    for m in compiled.MODULES:
        assert f"santhrottle/controller/{m}{suffix}" in names, m
        assert f"santhrottle/controller/{m}.py" in names, m
    # mypyc's shared library, inside the package (one group: santhrottle.controller)
    assert f"santhrottle/controller__mypyc{suffix}" in names, sorted(names)
    assert not [n for n in names if "__mypyc" in n and "/" not in n], sorted(names)

    python = DEBIAN_PY if DEBIAN_PY.exists() else Path(sys.executable)
    venv = tmp_path / "venv"
    assert _run([python, "-m", "venv", venv]).returncode == 0
    p = _run([venv / "bin" / "pip", "install", "-q", "--no-deps", whl])
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    clean = compiled.env_for(None)
    comp = _decisions(venv / "bin" / "python", clean)
    assert str(comp["decide_from"]).startswith(str(venv)), comp["decide_from"]
    assert str(comp["decide_from"]).endswith(".so"), comp["decide_from"]
    pure = _decisions(sys.executable, clean)
    assert str(pure["decide_from"]).endswith("decide.py")
    for key in sorted(set(pure) - {"decide_from"}):
        assert comp[key] == pure[key], f"{key}: the compiled wheel decided otherwise"
