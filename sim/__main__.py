"""`python3 -m santhrottle.sim`: the same as `santhrottle-simulate` (sim/cli.py)."""

import sys

from santhrottle.sim.cli import main

sys.exit(main())
