"""Every lab experiment's imports resolve (vagrant/experiments/*.py), without a path edit.

The experiments run inside the lab guest, where a stale import (a module that moved out
of controller/ into sim/, say) shows only after a boot of many minutes. Each script is
imported as its directory's module, the way `python3 vagrant/experiments/X.py` sees its
siblings, in one child interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

VAGRANT = Path(__file__).resolve().parents[2] / "vagrant"
EXPERIMENTS = VAGRANT / "experiments"


def test_every_experiment_imports() -> None:
    names = sorted(p.stem for p in EXPERIMENTS.glob("*.py"))
    assert names, EXPERIMENTS
    code = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for n in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{n}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(EXPERIMENTS)}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_nothing_under_vagrant_edits_the_import_path() -> None:
    """The lab kit is installed in the venv (make setup) and in the guest's: a script
    that edits sys.path finds a copy the others do not (vagrant/qemu/README.md)."""
    edit = re.compile(r"\bsys\.path\.(insert|append|extend)\b|\bsys\.path\s*(\+=|=)")
    found = [
        f"{p.relative_to(VAGRANT)}:{n}: {line.strip()}"
        for p in sorted(VAGRANT.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if edit.search(line)
    ]
    assert not found, "\n".join(found)
