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
import re
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


def _keys(obj, into: set[str]) -> set[str]:
    """Every key of a status JSON, nested ones too (not the resources' and initiators'
    names that key some of its maps)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            into.add(k)
            if k not in (
                "write_bytes_per_second",
                "written_bytes",
                "quarantines",
                "tick_duration_buckets",
            ):
                _keys(v, into)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, into)
    return into


def test_operate_names_every_key_of_status_json():
    """operate.md's paragraph on `status --json` names every key the daemons of the
    manual answer with (target, groups, levels): a new key is documented or fails here."""
    from santhrottle.appliance.daemon.status.build import status
    from santhrottle.appliance.daemon.status.views import to_json

    from . import docs_daemon

    text = (ROOT / "docs" / "operate.md").read_text()
    start = text.index("`--json` gives the same and more.")
    paragraph = text[start : text.index("\n\n", start)]
    named = set(re.findall(r"`([a-z_0-9]+)`", paragraph))
    keys: set[str] = set()
    for make in (docs_daemon.operate, docs_daemon.groups, docs_daemon.levels):
        d, _advance = make()
        _keys({k: v for k, v in to_json(status(d)).items() if k not in ("fleet", "wire")}, keys)
    assert keys <= named, sorted(keys - named)
