"""The import contracts (pyproject.toml's [tool.importlinter]) hold: `lint-imports` on the
tree as it installs (controller/, sim/, appliance/, bridge/ as santhrottle.*), every chain
of imports counted. `make lint` runs the same."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FOLDERS = ("controller", "sim", "appliance", "bridge")


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A santhrottle package whose subpackages are this tree's folders (package-dir)."""
    d = tmp_path_factory.mktemp("shim")
    pkg = d / "santhrottle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for folder in FOLDERS:
        (pkg / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return d


def test_every_contract_is_kept(shim: Path) -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        lint = Path(shutil.which("lint-imports") or "lint-imports")
    p = subprocess.run(
        [str(lint), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env={"PYTHONPATH": str(shim), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    n = len(_contracts())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert f"Contracts: {n} kept, 0 broken." in p.stdout


def test_the_appliance_rooms_of_the_contract_are_its_folders() -> None:
    """A room (a folder or a top-level module of appliance/) outside the rooms' contract
    would escape it."""
    (rooms,) = [c for c in _contracts() if c["id"] == "appliance-rooms"]
    named = {
        m.strip().removeprefix("santhrottle.appliance.")
        for layer in rooms["layers"]
        for m in layer.split("|")
    }
    found = {p.name.removesuffix(".py") for p in (ROOT / "appliance").iterdir()}
    assert named == found - {"__init__", "__pycache__"}


def test_no_product_module_may_import_the_simulator_no_exception():
    (c,) = [c for c in _contracts() if c["id"] == "sim-beside-the-product"]
    assert sorted(c["source_modules"]) == sorted(f"santhrottle.{f}" for f in FOLDERS if f != "sim")
    assert c["forbidden_modules"] == ["santhrottle.sim"]
    assert not c.get("ignore_imports") and not c.get("allow_indirect_imports")


def test_the_command_line_never_loads_the_simulator():
    """No product module imports sim/ (the contract, statically); at run time neither:
    a verb, the parser of the man page and the completions, and `santhrottle simulate`
    itself (whose simulator runs in a child) leave sys.modules without sim/."""
    probe = (
        "import io, sys\n"
        "from santhrottle.appliance.cli.main import build_parser, main\n"
        "build_parser()\n"
        "sys.stdout = sys.stderr = io.StringIO()\n"
        "main(['status', '--socket', '/nonexistent/santhrottle.sock'])\n"
        "rc = main(['simulate', '/nonexistent/scenario.toml'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('santhrottle.sim'))\n"
        "print(rc, loaded, file=sys.__stdout__)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert p.stdout.split("\n")[0] == "2 []", p.stdout + p.stderr
