"""docs/monitor.md lists every series the exporter exports, and only those: its tables'
rows against the series scraped from real registries (tests/unit/exported_series.py);
its scrape excerpts are scrapes of the manual's daemons (tests/unit/docs_daemon.py)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for

from . import docs_daemon
from .docs_blocks import blocks
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


def _excerpt(first: str) -> list[str]:
    """The lines of monitor.md's code block that starts with `first`."""
    (lines,) = [b.lines for b in blocks(MONITOR) if b.lines and b.lines[0].startswith(first)]
    return lines


def _not_scraped(lines: list[str], d) -> list[str]:
    scraped = set(generate_latest(registry_for(StatusCache(d))).decode().splitlines())
    return [ln for ln in lines if ln not in scraped]


def test_the_scrape_excerpt_is_a_scrape_of_the_manuals_daemon():
    d, _advance = docs_daemon.operate()
    assert _not_scraped(_excerpt("santhrottle_resource_read_latency_seconds{"), d) == []


def test_the_groups_excerpt_is_a_scrape_after_the_live_change():
    from .test_group_commands import group_set

    d, advance = docs_daemon.groups()
    group_set(d, "db", priority=4.0, latency_target_s=0.005)
    advance()
    assert _not_scraped(_excerpt("santhrottle_group_priority{"), d) == []
