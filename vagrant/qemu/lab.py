#!/usr/bin/env python3
"""santhrottle lab runner: Debian's real kernel under QEMU/TCG (vagrant/qemu/README.md).

The runner is the lab kit's (labkit.cli; the image builders in labkit.images, the
boot in labkit.qemu), installed in the project's venv by `make setup`:

    .venv/bin/python vagrant/qemu/lab.py up | run SCRIPT [ARGS] | sh LINE | ...
"""

import sys

try:
    from labkit.cli import main
except ModuleNotFoundError as e:
    if e.name != "labkit":
        raise
    print(
        "lab.py runs with the project's venv, which has the lab kit (vagrant/labkit): "
        "run `make setup`, then .venv/bin/python vagrant/qemu/lab.py",
        file=sys.stderr,
    )
    sys.exit(1)

if __name__ == "__main__":
    sys.exit(main())
