"""labkit.daemon's configs go through the product's schema; labkit.plant's spec, command line
and live control file."""

from __future__ import annotations

import json
import threading
import time
import tomllib

import pytest
from labkit import plant
from labkit.daemon import bridge_config, config_text, target_config

from santhrottle.appliance.config import ConfigError, parse_config

TOPO = {"netns": "tgt", "vg": "labvg", "veth": {"target": "lab-tgt"}}
BRIDGE = {"netns": "labbr", "name": "lab-br", "initiator_port": "lab-bi", "array_port": "lab-ba"}


def test_a_target_config_is_the_products_file_with_only_what_was_given(tmp_path):
    conf = target_config(
        TOPO,
        "/run/x/control.sock",
        tmp_path / "state",
        "10ms",
        max_delay=None,
        setpoint_fraction=None,
    )
    text = config_text(conf)
    c = parse_config(text, "lab.toml")
    assert c.resources["labvg"].threshold_s == pytest.approx(0.010)
    assert c.netns == "tgt" and c.devices == ("lab-tgt",) and c.metrics_port == 0
    data = tomllib.loads(text)
    assert "controller" not in data  # the product's defaults: nothing written
    assert "max_delay" not in data["datapath"]
    observe = tomllib.loads(config_text(target_config(TOPO, "/run/x.sock", None)))
    assert "resources" not in observe and "state_dir" not in observe["daemon"]


def test_bridge_groups_hosts_and_fleet_tables_render_and_parse(tmp_path):
    conf = bridge_config(BRIDGE, "/run/x.sock", tmp_path, leaf="pfifo", ports=[3260, 4420])
    conf["resources"] = {"array": {"volumes": ["iscsi://10.0.0.11:3260/*/*"], "threshold": "15ms"}}
    conf["groups"] = {
        "gold": {"members": ["10.0.0.2"], "latency_target": "30ms", "priority": 2.0},
        "bulk": {"members": ["10.0.0.4"], "throughput_target": None},
    }
    conf["hosts"] = {"ini1": {"addresses": ["10.0.0.3", "10.0.1.3"]}}
    c = parse_config(config_text(conf), "lab.toml")
    assert c.mode == "bridge" and c.leaf == "pfifo" and c.ports == (3260, 4420)
    assert set(c.groups) == {"gold", "bulk"}


@pytest.mark.parametrize(
    ("table", "keys", "named"),
    [
        ("datapath", {"link_sped": "10gbit"}, "link_sped"),  # a key the schema does not know
        ("controller", {"setpoint_fraction": 3.0}, "setpoint_fraction"),  # out of bounds
        ("resources", {"labvg": {"threshold": "fast"}}, "threshold"),  # not a duration
    ],
)
def test_a_config_the_schema_refuses_stops_before_any_daemon(tmp_path, table, keys, named):
    conf = target_config(TOPO, "/run/x.sock", tmp_path)
    conf.setdefault(table, {}).update(keys)
    with pytest.raises(ConfigError, match=named) as e:
        config_text(conf)
    assert "\n" not in str(e.value)


def test_the_plants_spec_and_its_nbdkit_command_line(tmp_path):
    a = plant.parse_array("nbd:c_ms=2,m_ms=10")
    assert a == {**plant.ARRAY_DEFAULTS, "m_ms": 10.0}
    assert plant.parse_array("none") is None
    for bad, why in (
        ("iscsi:x", "unknown array"),
        ("nbd:m_ms=-1", "negative"),
        ("nbd:q=1", "one of"),
        ("nbd:model=ssd", "model"),
    ):
        with pytest.raises(plant.PlantError, match=why):
            plant.parse_array(bad)
    argv = plant.nbdkit_argv(
        "nbdkit", a, tmp_path / "s", tmp_path / "i", 8, tmp_path / "st", tmp_path / "ctl"
    )
    assert argv[:4] == ["nbdkit", "-f", "--exit-with-parent", "--unix"]
    assert "m_ms=10" in argv and "c_ms=2" in argv and argv[-1] == f"control={tmp_path / 'ctl'}"
    assert plant.PLUGIN.is_file()


def test_the_guest_changes_the_plant_through_its_control_file(tmp_path):
    stats = tmp_path / plant.STATS_NAME

    def plugin() -> None:  # what lqarray.py's counters thread does with the file
        for _ in range(50):
            ctl = tmp_path / plant.CONTROL_NAME
            if ctl.exists():
                want = json.loads(ctl.read_text())
                stats.write_text(json.dumps({"config": {"c_ms": 2.0, **want}}))
                return
            time.sleep(0.02)

    th = threading.Thread(target=plugin)
    th.start()
    cfg = plant.guest_set(tmp_path, m_ms=9.0)
    th.join()
    assert cfg["m_ms"] == 9.0
    with pytest.raises(plant.PlantError, match="cannot change"):
        plant.guest_set(tmp_path, tau_ms=10.0)


def test_the_plugin_takes_only_a_valid_c_and_m(tmp_path, monkeypatch):
    """vagrant/qemu/lqarray.py's control file, loaded without nbdkit (a stub module)."""
    import importlib.util
    import sys
    import types

    monkeypatch.setitem(sys.modules, "nbdkit", types.SimpleNamespace(THREAD_MODEL_PARALLEL=3))
    spec = importlib.util.spec_from_file_location("lqarray_unit", plant.PLUGIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ctl = tmp_path / "control.json"
    mod.cfg["control"] = str(ctl)
    assert mod._control() is None  # no file yet
    ctl.write_text(json.dumps({"m_ms": 12, "c_ms": "x", "tau_ms": 1}))
    assert mod._control() == {"m_ms": 12.0}
    assert mod._control() is None  # unchanged since
    for bad in ("[1]", "not json", json.dumps({"m_ms": -1}), json.dumps({"m_ms": True})):
        ctl.write_text(bad)
        ctl.touch()
        mod.st["control_mtime"] = None
        assert mod._control() is None, bad
