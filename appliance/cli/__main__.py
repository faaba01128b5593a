"""`python -m santhrottle.appliance.cli`: the same as `santhrottle`."""

import sys

from santhrottle.appliance.cli.main import main

sys.exit(main())
