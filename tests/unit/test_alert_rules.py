"""The alerting rules the packages ship (docs/prometheus/santhrottle-rules.yml) name
only series the exporter exports; `promtool check rules` is tests/rollout/test_deb.py's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for

from .test_control_cli import live  # noqa: F401  (the fixture: a daemon with a socket)

RULES = Path(__file__).parents[2] / "docs" / "prometheus" / "santhrottle-rules.yml"


def test_alert_rules_name_exported_series(live):  # noqa: F811
    d, _act, _sock = live
    kernel = {"10.0.0.3": ("all", 0x20, 1834, 2650112)}  # the member counters, faked
    text = generate_latest(registry_for(StatusCache(d), lambda: kernel)).decode()
    exported = set(re.findall(r"^(santhrottle_\w+?)(?:\{| )", text, re.M))
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [r["alert"] for r in group["rules"]]
    assert len(alerts) == len(set(alerts)) >= 12, alerts
    used = {m for r in group["rules"] for m in re.findall(r"santhrottle_\w+", r["expr"])}
    # a histogram's _bucket series carry the family's name
    assert used and used <= exported, used - exported
    for r in group["rules"]:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
