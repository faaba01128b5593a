"""`python -m santhrottle.appliance.config`: the reference table of every key (Markdown)."""

import sys

from santhrottle.appliance.config.schema import reference_table

sys.stdout.write(reference_table())
