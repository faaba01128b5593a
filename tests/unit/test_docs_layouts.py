"""The layouts the manual calls exact, against the real formatters without a kernel:
`santhrottle datapath show` (docs/operate.md) from what the data path's status read in
a scratch namespace with the manual's two pins (tests/fixtures/datapath_show.json, as
`datapath show --json` printed it; the same session on a real kernel is
tests/privileged/test_docs_kernel.py's); `santhrottle meter` (docs/levels.md) from
tests/unit/test_meter.py's files.  The daemon's tables (status, group, hosts)
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


def test_meter_prints_the_manuals_layout(tmp_path, monkeypatch):
    """docs/levels.md's `santhrottle meter` on tests/unit/test_meter.py's files, at the
    price the page names."""
    from santhrottle.appliance.cli.main import main

    from .test_meter import _meter_files

    (shown,) = [
        c
        for b in blocks(ROOT / "docs" / "levels.md")
        for c in commands(b)
        if c.argv.startswith("santhrottle meter")
    ]
    _meter_files(tmp_path)
    conf = tmp_path / "santhrottle.toml"
    conf.write_text('[datapath]\ndevices = ["eth1"]\n[metering]\nprice_per_iops_hour = 0.0001\n')
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    argv = [*shown.argv.split()[1:], "--state-dir", str(tmp_path), "--config", str(conf)]
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    assert shown.output == out.getvalue().splitlines()
