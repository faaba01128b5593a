"""docs/monitor.md lists every series the exporter exports, and only those: its tables'
rows against the series scraped from real registries (tests/unit/exported_series.py)."""

from __future__ import annotations

import re
from pathlib import Path

from .exported_series import exported_series

MONITOR = Path(__file__).parents[2] / "docs" / "monitor.md"
ROW = re.compile(r"^\| `((?:santhrottle|process)_[a-z0-9_]+)` \|", re.M)
HISTOGRAM = ("_bucket", "_sum", "_count")


def _families(names):
    """Series names with a histogram's three as its one family name."""
    out = set()
    for n in names:
        for suffix in HISTOGRAM:
            if n.endswith(suffix) and n[: -len(suffix)] + "_bucket" in names:
                n = n[: -len(suffix)]
        out.add(n)
    return out


def test_every_exported_series_has_its_row_and_every_row_is_exported():
    rows = ROW.findall(MONITOR.read_text())
    assert len(rows) == len(set(rows)), "a series documented twice"
    exported = _families(exported_series())
    assert set(rows) == exported, (
        f"not documented: {sorted(exported - set(rows))}; "
        f"documented, not exported: {sorted(set(rows) - exported)}"
    )
