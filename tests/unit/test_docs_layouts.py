"""The layouts the manual calls exact, against the real formatters without a kernel:
`santhrottle datapath show` (docs/operate.md) from what the data path's status read in
a scratch namespace with the manual's two pins (tests/fixtures/datapath_show.json, as
`datapath show --json` printed it; the same session on a real kernel is
tests/privileged/test_docs_kernel.py's).  The daemon's tables (status, group, hosts)
are tests/unit/test_docs_sessions.py's, printed by a running daemon."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from santhrottle.appliance.cli.datapathview import print_status

from .docs_blocks import ROOT, blocks, commands

FIXTURE = Path(__file__).parents[1] / "fixtures" / "datapath_show.json"


def test_datapath_show_prints_the_manuals_layout():
    (shown,) = [
        c
        for b in blocks(ROOT / "docs" / "operate.md")
        for c in commands(b)
        if c.argv == "santhrottle datapath show --netns stdoc"
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_status(json.loads(FIXTURE.read_text()))
    assert shown.output == out.getvalue().splitlines()
