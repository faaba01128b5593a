"""Every lab experiment's imports resolve (vagrant/experiments/*.py).

The experiments run inside the lab guest, where a stale import (a module that moved out
of controller/ into sim/, say) shows only after a boot of many minutes. Each script is
imported as its directory's module, the way `python3 vagrant/experiments/X.py` sees its
siblings, in one child interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "vagrant" / "experiments"


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
