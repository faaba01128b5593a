"""PromQL checked by Prometheus' own promtool (Debian's prometheus package, unpacked by
`make promtool`): the alerting rules the packages ship pass `promtool check rules` and
their unit tests (tests/rollout/alert_rules_test.yml) `promtool test rules`, each rule
tested firing and quiet; every expression of the Grafana dashboard parses, with
Grafana's variables replaced by values of their kind ($__range a range, $instance a
regex).  The series they name are tests/unit/test_dashboard.py's and
tests/unit/test_alert_rules.py's."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs/grafana/santhrottle.json"
RULES = ROOT / "docs/prometheus/santhrottle-rules.yml"
RULE_TESTS = ROOT / "tests/rollout/alert_rules_test.yml"
# Grafana's variables as a query would see them
VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "1h",
    "$__interval": "15s",
    "$instance": ".*",
    "$resource": ".*",
}


def promtool() -> str:
    found = shutil.which("promtool") or shutil.which("promtool", path=ROOT / "build/tools")
    if found is None:
        pytest.skip("promtool is not installed (make promtool: Debian's prometheus, unpacked)")
    return found


def run(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [promtool(), *map(str, argv)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def dashboard_rules() -> list[dict[str, str]]:
    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    rules = []
    for p in walk(json.loads(DASHBOARD.read_text())["panels"]):
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, (p["title"], expr)  # a variable not replaced
            rules.append({"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": expr})
    return rules


def test_every_dashboard_expression_is_promql(tmp_path):
    rules = dashboard_rules()
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = run("check", "rules", path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(rules)} rules found" in p.stdout, p.stdout


def test_promtool_refuses_what_is_not(tmp_path):
    """The check above can fail: a broken expression is refused."""
    path = tmp_path / "broken.yml"
    rule = {"record": "x:y", "expr": "topk(10, max_over_time(santhrottle_paused[1h] @ end())"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "b", "rules": [rule]}]}))
    p = run("check", "rules", path)
    assert p.returncode != 0 and "FAILED" in p.stdout + p.stderr, p.stdout


def _alerts() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_the_alert_rules_pass_promtool_check():
    p = run("check", "rules", RULES)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in p.stdout, p.stdout


def test_the_alert_rules_pass_their_unit_tests():
    p = run("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout, p.stdout


def test_every_alert_rule_is_tested_firing_and_quiet():
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert [Path(RULE_TESTS.parent, f).resolve() for f in doc["rule_files"]] == [RULES]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    alerts = set(_alerts())
    assert alerts and alerts == firing, f"never fired: {sorted(alerts - firing)}"
    assert alerts == quiet, f"never shown quiet: {sorted(alerts - quiet)}"


def test_promtool_test_rules_fails_a_rule_that_does_not_fire(tmp_path):
    """The unit tests above can fail: a rule whose threshold no series reaches."""
    rules = yaml.safe_load(RULES.read_text())
    for r in rules["groups"][0]["rules"]:
        if r["alert"] == "SanthrottlePausedLong":
            r["expr"] = "santhrottle_paused == 2"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["rules.yml"]
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests))
    p = run("test", "rules", "t.yml", cwd=tmp_path)
    assert p.returncode != 0 and "SanthrottlePausedLong" in p.stdout + p.stderr, p.stdout
