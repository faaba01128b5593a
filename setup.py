"""What pyproject.toml cannot say: the controller's opt-in compiled modules.

SANTHROTTLE_MYPYC=1 while a wheel is built (`make wheel MYPYC=1`) adds them as
extension modules (buildsys/compiled.py); otherwise there are none, and the
wheel is pure Python.  Only the wheel's own build compiles: the metadata and
build-requirement steps run this file without the compiler installed.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "buildsys"))
import compiled  # buildsys/compiled.py, after its path

setup(ext_modules=compiled.extensions() if compiled.wanted() and "bdist_wheel" in sys.argv else [])
