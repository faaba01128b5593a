"""The Grafana dashboard (docs/grafana/santhrottle.json): importable into any fleet
(__inputs, __requires, one data source variable that every panel and query uses),
every expression naming only series the exporter exports (tests/unit/exported_series.py:
scraped from real registries), every query filtered by instance, a top 10 picked over
the whole time range (never per instant), rows for the groups, the fleet and bridge
mode, and panels that do not overlap.  The expressions' PromQL is promtool's to parse
(tests/rollout/test_promql.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .exported_series import exported_series

DASHBOARD = Path(__file__).parents[2] / "docs/grafana/santhrottle.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
METRIC = re.compile(r"\b(?:santhrottle|process)_[a-zA-Z0-9_]+")


@pytest.fixture(scope="module")
def dash():
    return json.loads(DASHBOARD.read_text())


def panels(dash):
    """Every panel, those inside a collapsed row too; rows themselves included."""
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def expressions(dash):
    for p in panels(dash):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            yield f"variable {v['name']}", v["definition"]


def test_every_expression_names_only_exported_series(dash):
    exported = exported_series()
    for where, expr in expressions(dash):
        used = set(METRIC.findall(expr))
        assert used, (where, expr)
        assert used <= exported, (where, used - exported)


def test_it_imports_into_any_fleet(dash):
    (ds_input,) = dash["__inputs"]
    assert ds_input["type"] == "datasource" and ds_input["pluginId"] == "prometheus"
    requires = {(r["type"], r["id"]) for r in dash["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= requires
    assert {("panel", p["type"]) for p in panels(dash)} <= requires
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["definition"] == "label_values(santhrottle_build_info, instance)"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE, v["name"]
            assert v["query"]["query"] == v["definition"], v["name"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))


def test_every_panel_and_query_uses_the_datasource_variable(dash):
    for p in panels(dash):
        if p["type"] == "row":
            assert "targets" not in p, p["title"]
            continue
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, (p["title"], t["refId"])


def test_every_selector_is_filtered_by_instance(dash):
    for where, expr in expressions(dash):
        if where == "variable instance":
            continue  # the variable that lists the instances
        for m in re.finditer(r"\b(?:santhrottle|process)_[a-zA-Z0-9_]+(\{[^}]*\})?", expr):
            assert 'instance=~"$instance"' in (m.group(1) or ""), (where, m.group(0))


def test_a_top_10_is_picked_over_the_time_range_not_per_instant(dash):
    tops = [(w, e) for w, e in expressions(dash) if "topk" in e]
    assert len(tops) >= 5
    for where, expr in tops:
        # topk(10, <range function>(...[$__range] @ end())), joined back to the series
        arg = expr[expr.index("topk(") :]
        assert "[$__range] @ end()" in arg, (where, expr)
        assert re.search(r"\band on \(instance, initiator", expr), (where, expr)


def test_rows_for_groups_fleet_and_bridge_mode(dash):
    rows = {p["title"]: p for p in dash["panels"] if p["type"] == "row"}
    used = {t: set() for t in rows}
    for row in rows.values():
        for p in row["panels"]:
            for t in p["targets"]:
                used[row["title"]] |= set(METRIC.findall(t["expr"]))
    by_prefix = {
        "santhrottle_group_": {"santhrottle_group_performance_ratio",
                               "santhrottle_group_share_ratio", "santhrottle_group_pwfte"},
        "santhrottle_fleet_": {"santhrottle_fleet_degraded", "santhrottle_fleet_leading",
                               "santhrottle_fleet_engine_failures_total"},
        "santhrottle_wire_": {"santhrottle_wire_directions", "santhrottle_wire_desyncs_total",
                              "santhrottle_wire_completions_total",
                              "santhrottle_wire_out_of_sync_seconds"},
    }  # fmt: skip
    for prefix, wanted in by_prefix.items():
        (row,) = [t for t, names in used.items() if any(n.startswith(prefix) for n in names)]
        assert rows[row]["collapsed"], row  # shown when opened: most fleets have none
        assert wanted <= used[row], (row, wanted - used[row])


def _overlaps(boxes):
    for i, (a, pa) in enumerate(boxes):
        for b, pb in boxes[i + 1 :]:
            if (
                a["x"] < b["x"] + b["w"]
                and b["x"] < a["x"] + a["w"]
                and a["y"] < b["y"] + b["h"]
                and b["y"] < a["y"] + a["h"]
            ):
                yield pa, pb


def test_panels_fit_the_grid_and_do_not_overlap(dash):
    top = [(p["gridPos"], p["title"]) for p in dash["panels"]]
    assert list(_overlaps(top)) == []
    for row in dash["panels"]:
        inner = [(p["gridPos"], p["title"]) for p in row.get("panels", [])]
        assert list(_overlaps(inner)) == [], row["title"]
    for p in panels(dash):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
