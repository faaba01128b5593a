"""The alerting rules the packages ship (docs/prometheus/santhrottle-rules.yml) name
only series the exporter exports, and docs/monitor.md's table lists every rule with its
`for`; `promtool check rules` is tests/rollout/test_deb.py's, each rule's firing and
quiet cases tests/rollout/alert_rules_test.yml's (tests/rollout/test_promql.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .exported_series import exported_series

ROOT = Path(__file__).parents[2]
RULES = ROOT / "docs" / "prometheus" / "santhrottle-rules.yml"
MONITOR = ROOT / "docs" / "monitor.md"
ROW = re.compile(r"^\| `(Santhrottle\w+)` \| .* \|(?: (\w+))? \|$", re.M)
NUMBERS = {12: "Twelve", 13: "Thirteen", 14: "Fourteen", 15: "Fifteen", 16: "Sixteen",
           17: "Seventeen", 18: "Eighteen", 19: "Nineteen", 20: "Twenty"}  # fmt: skip


def _rules() -> list[dict]:
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    return group["rules"]


def test_alert_rules_name_exported_series():
    rules = _rules()
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)) >= 12, alerts
    used = {m for r in rules for m in re.findall(r"santhrottle_\w+", r["expr"])}
    assert used and used <= exported_series(), used - exported_series()
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]


def test_the_manuals_table_is_the_rules_file():
    """monitor.md, "What to alert on": one row per rule, its `for` as the file has it,
    and the count the text gives."""
    text = MONITOR.read_text()
    rows = ROW.findall(text)
    assert rows == [(r["alert"], r.get("for", "")) for r in _rules()]
    assert f"{NUMBERS[len(rows)]} rules to start from" in text
