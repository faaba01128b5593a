"""The controller compiled with mypyc (buildsys/compiled.py; `make wheel MYPYC=1`)
makes the pure controller's decisions, bit for bit.

Compiles this checkout's controller into a temporary directory as the wheel's
build does, then runs tests/sim/compiled_decisions.py once pure and once with
that directory first on PYTHONPATH, and compares everything it prints.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "buildsys"))
import compiled  # noqa: E402  (buildsys/compiled.py)

pytestmark = pytest.mark.sim
DRIVER = Path(__file__).with_name("compiled_decisions.py")


@pytest.fixture(scope="module")
def compiled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("mypyc") is None:
        pytest.skip("mypyc (mypy) is not installed")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to compile the controller with")
    d = tmp_path_factory.mktemp("mypyc")
    try:
        compiled.compile_into(d)
    except SystemExit as e:
        pytest.fail(str(e))
    return d


def _decisions(pythonpath: Path | None) -> dict[str, object]:
    p = subprocess.run(
        [sys.executable, str(DRIVER)],
        capture_output=True,
        text=True,
        env=compiled.env_for(pythonpath),
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, object] = json.loads(p.stdout)
    return out


def test_the_compiled_controller_decides_as_the_pure_one(compiled_dir: Path) -> None:
    pure = _decisions(None)
    comp = _decisions(compiled_dir)
    assert str(pure["decide_from"]).endswith("decide.py")
    assert str(comp["decide_from"]).endswith(".so"), comp["decide_from"]
    assert str(comp["decide_from"]).startswith(str(compiled_dir))
    keys = sorted(set(pure) - {"decide_from"})
    assert keys == sorted(set(comp) - {"decide_from"})
    for key in keys:
        assert comp[key] == pure[key], f"{key}: the compiled controller decided otherwise"
