"""IPv6 initiators through the daemon and the CLI, and [hosts.NAME] (dual-stack hosts).

Pins of IPv6 addresses through the control requests and the state file, one
clear error for what is not an address, the CLI's argument type and tables
(widths from their content, IPv4 then IPv6), the static map over an IPv6
prefix, the [hosts] table's rules, and a host's addresses judged, shown,
counted and delayed as one initiator.  No network traffic: fake sensors and
a fake actuator in virtual time (tests/unit/test_daemon.py).
"""

from __future__ import annotations

import argparse
import json

import pytest
from prometheus_client.exposition import generate_latest

from santhrottle.appliance.cli.common import ip_address
from santhrottle.appliance.cli.datapathview import _print_members
from santhrottle.appliance.cli.sensing import _print_initiators
from santhrottle.appliance.cli.statusview import print_status
from santhrottle.appliance.cli.wire import print_initiators as print_wire_initiators
from santhrottle.appliance.config import ConfigError, parse_config
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.control.requests import RequestError, check
from santhrottle.appliance.daemon.core.hosts import HostMap
from santhrottle.appliance.daemon.core.state import Saved, StateError, StateStore, decode
from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.appliance.sensing.conns import TcpConn
from santhrottle.appliance.sensing.discovery import build_discovery
from santhrottle.appliance.sensing.lio import LioLun, LioTpg
from santhrottle.controller.domain import WriteSample
from tests.unit.test_daemon import handle, status_of

from .test_daemon import CONF, MIB, make, run_for

HOSTS = '[hosts.db1]\naddresses = ["fd00:1::5", "10.0.1.5"]\n'
# absolute write-heavy thresholds only: enter 1 MiB/s, whoever else writes
ABSOLUTE = CONF.replace("class_hysteresis = 0", "class_hysteresis = 0\nwrite_heavy_share = 0")


# ------------------------------------------------------------- pins, requests, state
@pytest.mark.parametrize(
    "sent, canonical",
    [
        ("fd00::3", "fd00::3"),
        ("FD00:0:0::3", "fd00::3"),
        ("fd00:0::0:3", "fd00::3"),  # (a link-local one is refused: tests/unit/test_addresses.py)
        ("::ffff:10.0.0.3", "10.0.0.3"),  # IPv4-mapped: its IPv4 address
        ("10.0.0.3", "10.0.0.3"),
    ],
)
def test_pin_and_unpin_take_either_family_in_the_data_paths_form(sent, canonical):
    args = check("pin", {"initiator": sent, "class": 4, "mode": "all"})
    assert args == {"initiator": canonical, "class": 4, "mode": "all"}
    assert check("unpin", {"initiator": sent}) == {"initiator": canonical}


@pytest.mark.parametrize("bad", ["bogus", "fd00::1::2", "fd00::/64", "10.0.0.256", "", 7, None])
def test_a_bad_address_is_one_clear_error(bad):
    with pytest.raises(RequestError) as e:
        check("pin", {"initiator": bad, "class": 4, "mode": "all"})
    msg = str(e.value)
    assert msg.startswith("pin: initiator: ") and msg.endswith(" is not an IPv4 or IPv6 address")
    assert "\n" not in msg


def test_an_ipv6_pin_reaches_the_kernel_and_survives_a_restart(tmp_path):
    store = StateStore(tmp_path)
    d, vt, _s, act = make(store=store)
    run_for(d, vt, 1.0)
    out = handle(d, "pin", {"initiator": "FD00::9", "class": 3, "mode": "read"})
    assert out["initiator"] == "fd00::9"
    run_for(d, vt, 0.2)
    assert act.kernel["fd00::9"] == (3, "read")
    assert store.load(max_class=100).pins == {"fd00::9": (3, "read")}
    text = (tmp_path / "state.json").read_text()
    assert json.loads(text)["pins"] == {"fd00::9": [3, "read"]}
    handle(d, "unpin", {"initiator": "fd00:0::9"})
    assert d.runtime.pins == {}


def test_the_state_file_canonicalises_and_refuses_ipv6_pins():
    doc = {"version": 1, "pins": {"FD00:0::9": [3, "all"], "10.0.0.3": [2, "ack"]}}
    assert decode(json.dumps(doc), max_class=100).pins == {
        "fd00::9": (3, "all"),
        "10.0.0.3": (2, "ack"),
    }
    with pytest.raises(StateError, match=r"^state.json: pins: 'fd00::/64' is not an IPv4 or IPv6"):
        decode(json.dumps({"version": 1, "pins": {"fd00::/64": [3, "all"]}}), max_class=100)


def test_a_state_file_round_trip_keeps_both_families(tmp_path):
    store = StateStore(tmp_path)
    saved = Saved(pins={"fd00::9": (3, "all"), "10.0.0.3": (2, "ack")})
    store.save(saved)
    assert store.load(max_class=100).pins == saved.pins


def test_the_cli_argument_type_takes_both_families():
    assert ip_address("FD00::3") == "fd00::3"
    assert ip_address("10.0.0.3") == "10.0.0.3"
    with pytest.raises(argparse.ArgumentTypeError, match="is not an IPv4 or IPv6 address"):
        ip_address("fd00::g")


# ------------------------------------------------------------------- CLI tables
def _aligned(lines: list[str], column: str) -> None:
    """Every line's text after the first column starts where the heading's does."""
    at = lines[0].index(column)
    for line in lines[1:]:
        assert line[at - 1] == " " and line[at] != " ", (line, at)


def test_the_datapath_member_table_fits_ipv6_and_sorts_v4_first(capsys):
    long6 = "fd00:1234:5678:9abc:def0:1234:5678:9abc"  # 39 characters
    members = [
        {"ip": ip, "mode": "all", "class": 4, "delay_us": 2000, "packets": 10, "bytes": 999}
        for ip in (long6, "10.0.0.20", "fd00::3", "10.0.0.3")
    ]
    _print_members(members)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["10.0.0.3", "10.0.0.20", "fd00::3", long6]
    _aligned(lines, "mode")
    assert lines[0].index("mode") == 2 + len(long6) + 1


def _row(ip, host=None, addresses=None, resources=("vg0",), k=0):
    return {
        "initiator": ip,
        "host": host,
        "addresses": addresses or [ip],
        "resources": list(resources),
        "write_bytes_per_second": {r: 1.5 * MIB for r in resources},
        "written_bytes": {r: 0.0 for r in resources},
        "write_heavy_on": [],
        "class": k,
        "delay_s": k * 0.0005,
        "mode": "all",
        "pinned": False,
        "adopted": False,
    }


def _status(initiators, members=()):
    """A whole status answer (status/views.py) around these initiator rows."""
    from santhrottle.appliance.daemon.status.views import (
        CountersView,
        LadderView,
        ResourceView,
        StatusView,
        ThresholdView,
        to_json,
    )

    vg0 = ResourceView(
        resource="vg0",
        threshold=ThresholdView(0.01, 0.01, False, 0.01, 0.9, None),
        mode="control",
        read_latency_ewma_s=0.012,
        read_latency_s=0.011,
        reads=10,
        write_bytes_per_second=None,
        delay_class=4,
        delay_s=0.002,
        members=list(members),
        devices=[],
        reads_completed=0,
        read_time_s=0.0,
        written_bytes=0.0,
        utilization=None,
        saturated=False,
        futile_released_s=None,
        futile_releases=0,
        futile_refutations=0,
    )
    counters = CountersView(1, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, {}, 0, 0, {})
    st = StatusView(
        mode="target",
        paused=False,
        restart_needed=[],
        tick_s=0.1,
        step_s=0.0005,
        max_class=88,
        ladder=LadderView(500, 250_000, 1.0),
        write_mode="all",
        counters=counters,
        resources=[vg0],
        initiators=[],
        wire=None,
        groups=[],
        quarantine=[],
        levels=[],
        fleet=None,
    )
    return {**to_json(st), "initiators": initiators}


def test_status_prints_a_host_once_with_its_addresses_and_name(capsys):
    long6 = "fd00:1234:5678:9abc:def0:1234:5678:9abc"
    rows = [
        _row("fd00::7"),
        _row("10.0.1.5", "db1", ["10.0.1.5", "fd00:1::5"], k=4),
        _row(long6, resources=("vg0", "vg1")),
        _row("10.0.0.9"),
    ]
    print_status(_status(rows, members=["10.0.1.5", "fd00::7"]))
    out = capsys.readouterr().out.splitlines()
    (res,) = [ln for ln in out if ln.startswith("vg0 ")]
    assert res.endswith("  db1,fd00::7")  # a resource's members: the host by its name
    head = out.index(next(ln for ln in out if ln.startswith("INITIATOR")))
    table = out[head : head + 5]
    assert table[0].split()[:3] == ["INITIATOR", "HOST", "RESOURCES"]
    firsts = [ln.split()[0] for ln in table[1:]]
    assert firsts == ["10.0.0.9", "10.0.1.5,fd00:1::5", "fd00::7", long6]
    assert table[2].split()[1] == "db1" and table[1].split()[1] == "-"
    _aligned(table, "HOST")
    _aligned(table, "RESOURCES")


def test_status_without_hosts_has_no_host_column_and_fits_ipv6(capsys):
    long6 = "fd00:1234:5678:9abc:def0:1234:5678:9abc"
    print_status(_status([_row(long6), _row("10.0.0.3")]))
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(ln for ln in out if ln.startswith("INITIATOR")))
    table = out[head : head + 3]
    assert table[0].split()[:2] == ["INITIATOR", "RESOURCES"]
    assert [ln.split()[0] for ln in table[1:]] == ["10.0.0.3", long6]
    _aligned(table, "RESOURCES")


def test_santhrottle_initiators_fits_ipv6_and_names_hosts(capsys):
    def ini(ip, host=None):
        return {
            "initiator": ip,
            "host": host,
            "resources": ["vg0"],
            "exports": [],
            "write_bytes_per_second": {"vg0": 1.0 * MIB},
            "write_sources": {"vg0": "acl"},
        }

    long6 = "fd00:1234:5678:9abc:def0:1234:5678:9abc"
    _print_initiators([ini(long6), ini("fd00:1::5", "db1"), ini("10.0.1.5", "db1")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["INITIATOR", "HOST", "RESOURCE"]
    assert [ln.split()[0] for ln in lines[1:]] == ["10.0.1.5", "fd00:1::5", long6]
    _aligned(lines, "HOST")
    _aligned(lines, "RESOURCE")


def test_the_bridge_initiators_table_fits_a_hosts_addresses(capsys):
    rows = [
        {**_row("10.0.1.5", "db1", ["10.0.1.5", "fd00:1::5"]), "volumes": ["iscsi://x/y/0"]},
        {**_row("fd00::7"), "volumes": []},
    ]
    print_wire_initiators({"source": "santhrottled", "interval_s": 0.1, "initiators": rows})
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [ln.split()[0] for ln in lines[1:]] == ["10.0.1.5,fd00:1::5", "fd00::7"]
    _aligned(lines, "RESOURCE")


# ------------------------------------------------------------------- static map
def _tpg(wwn, portal, lun_path):
    return LioTpg("iscsi", wwn, 1, True, True, ((portal, 3260),), (LioLun(0, "b/x", lun_path),), ())


def test_the_static_map_matches_ipv6_peers_and_prefixes():
    # two targets behind one wildcard portal: ambiguous, the static map decides
    tpgs = [_tpg("iqn.a", "::", "/dev/vg/a"), _tpg("iqn.b", "::", "/dev/vg/b")]
    conns = [
        TcpConn("fd00::1", 3260, "fd00:1::7", 40000),
        TcpConn("fd00::1", 3260, "fd00:2::7", 40001),
        TcpConn("10.1.0.1", 3260, "10.1.0.9", 40002),
    ]
    static = {"fd00:1::/64": ["vg6"], "10.1.0.0/24": ["vg4"]}
    d = build_discovery(lio=tpgs, conns=conns, static_map=static)
    assert d.initiators["fd00:1::7"].resources == {"vg6"}
    assert d.initiators["fd00:1::7"].write_sources == {"vg6": "static"}
    assert d.initiators["10.1.0.9"].resources == {"vg4"}
    assert "fd00:2::7" not in d.initiators or not d.initiators["fd00:2::7"].resources
    d = build_discovery(static_map={"FD00:3::5": ["vg6"]})  # one address, not connected
    assert d.initiators["fd00:3::5"].resources == {"vg6"}
    cfg = parse_config('[static_map]\n"fd00:1::/64" = ["vg6"]\n')
    assert cfg.static_map == {"fd00:1::/64": ("vg6",)}


# -------------------------------------------------------------------- [hosts]
def test_hosts_parse_to_canonical_addresses():
    cfg = parse_config('[hosts.db1]\naddresses = ["10.0.1.5", "FD00:1:0::5"]\n[hosts.db2]\n'
                       'addresses = ["fd00:1::6"]\n')  # fmt: skip
    assert {n: h.addresses for n, h in cfg.hosts.items()} == {
        "db1": ("10.0.1.5", "fd00:1::5"),
        "db2": ("fd00:1::6",),
    }
    assert parse_config("").hosts == {}


@pytest.mark.parametrize(
    "text, error",
    [
        ('[hosts.db1]\naddresses = ["10.0.1.5"]\n[hosts.db2]\naddresses = ["FD00::1", '
         '"10.0.1.5"]\n', "h.toml:4: hosts.db2.addresses: 10.0.1.5 is already an address of "
         "hosts.db1"),
        ('[hosts.db1]\naddresses = ["fd00::1", "FD00:0::1"]\n',
         "h.toml:2: hosts.db1.addresses: fd00::1 is given twice"),
        ("[hosts.db1]\naddresses = []\n", "h.toml:2: hosts.db1.addresses: [] must be a non-empty"),
        ("[hosts.db1]\n", "h.toml: hosts.db1.addresses: is required"),
        ('[hosts.db1]\naddresses = ["10.0.1.0/24"]\n', "'10.0.1.0/24' is a network"),
        ('[hosts.db1]\naddresses = ["fe80::1%eth1"]\n', "'fe80::1%eth1' has a zone"),
        ('[hosts.db1]\naddresses = ["::ffff:10.0.1.5"]\n',
         "is IPv4-mapped: write the IPv4 address 10.0.1.5"),
        ('[hosts.db1]\naddresses = ["db1.example"]\n',
         "'db1.example' is not an IPv4 or IPv6 address"),
        ("[hosts.db1]\naddresses = [5]\n", "5 is not an address: write it as a string"),
        ('[hosts.db1]\naddress = ["10.0.1.5"]\n', "hosts.db1.address: unknown key"),
        ('[hosts."10.0.1.5"]\naddresses = ["10.0.1.5"]\n', "'10.0.1.5' is an address: name"),
        ('[hosts."db 1"]\naddresses = ["10.0.1.5"]\n', "host names are letters, digits"),
        ("hosts = 5\n", "h.toml:1: hosts: must be a table of [hosts.NAME] tables"),
        ("[hosts]\ndb1 = 5\n", "hosts.db1: must be a table with addresses"),
    ],
)  # fmt: skip
def test_a_bad_hosts_table_is_one_error_naming_the_key(text, error):
    with pytest.raises(ConfigError) as e:
        parse_config(text, "h.toml")
    assert error in str(e.value) and "\n" not in str(e.value)


def test_the_host_map_folds_writes_and_spreads_classes():
    hosts = HostMap.of(parse_config(HOSTS).hosts)
    assert hosts.key("fd00:1::5") == "10.0.1.5" and hosts.key("10.0.0.9") == "10.0.0.9"
    assert hosts.addresses_of("10.0.1.5") == ("10.0.1.5", "fd00:1::5")
    writes = [
        WriteSample("vg0", "10.0.1.5", 1e6),
        WriteSample("vg0", "fd00:1::5", 1e6),
        WriteSample("vg0", "10.0.0.9", 5e5),
        WriteSample("vg1", "fd00:1::5", 2e5),
    ]
    assert hosts.fold_writes(writes) == [
        ("vg0", "10.0.1.5", 2e6),
        ("vg0", "10.0.0.9", 5e5),
        ("vg1", "10.0.1.5", 2e5),
    ]
    # a group's class on one address reaches every address of the host
    assert hosts.spread({"10.0.1.5": 20, "10.0.0.9": 3, "fd00:1::5": 25}) == {
        "10.0.1.5": 25,
        "fd00:1::5": 25,
        "10.0.0.9": 3,
    }
    assert hosts.rows(["fd00:1::5", "10.0.0.9"]) == {
        "10.0.1.5": ["10.0.1.5", "fd00:1::5"],
        "10.0.0.9": ["10.0.0.9"],
    }
    none = HostMap.of({})
    assert none.fold_writes(writes) is writes and none.spread({"a": 1}) == {"a": 1}


def _dual_stack(conf: str):
    """db1 writes 0.6 MiB/s over each family to vg0: each address is under
    write_heavy_enter (1 MiB/s), the host is over it."""
    d, vt, s, act = make(conf)
    s.writers = {"10.0.1.5": "vg0", "fd00:1::5": "vg0"}
    s.write_bps = 0.6 * MIB
    run_for(d, vt, 4.0)
    return d, vt, s, act


def test_a_dual_stack_host_is_judged_on_its_total_and_delayed_alike():
    d, _vt, _s, act = _dual_stack(ABSOLUTE)  # no [hosts]: two initiators, neither heavy
    assert act.kernel == {} and status_of(d)["resources"][1]["members"] == []
    d, _vt, _s, act = _dual_stack(ABSOLUTE + HOSTS)
    assert set(act.kernel) == {"10.0.1.5", "fd00:1::5"}
    assert act.kernel["10.0.1.5"] == act.kernel["fd00:1::5"] and act.kernel["10.0.1.5"][0] > 0
    st = status_of(d)
    (vg0,) = [r for r in st["resources"] if r["resource"] == "vg0"]
    assert vg0["members"] == ["10.0.1.5"]  # the host once, by its key
    (row,) = st["initiators"]
    assert row["host"] == "db1" and row["addresses"] == ["10.0.1.5", "fd00:1::5"]
    assert row["initiator"] == "10.0.1.5" and row["resources"] == ["vg0"]
    assert row["write_heavy_on"] == ["vg0"] and row["class"] == act.kernel["10.0.1.5"][0]
    assert 1.0 * MIB < row["write_bytes_per_second"]["vg0"] <= 1.2 * MIB  # the EWMA of 1.2
    text = generate_latest(registry_for(StatusCache(d))).decode()
    assert "santhrottle_initiators 1.0" in text
    assert 'santhrottle_resource_write_heavy_initiators{resource="vg0"} 1.0' in text
    for a in ("10.0.1.5", "fd00:1::5"):
        assert (f'santhrottle_host_address_info{{address="{a}",host="db1",'
                f'initiator="10.0.1.5"}} 1.0') in text  # fmt: skip


def test_ipv6_initiators_are_plain_label_values():
    d, vt, s, _act = make()
    s.writers = {"fd00::3": "vg0", "10.0.0.3": "vg0"}
    run_for(d, vt, 3.0)
    text = generate_latest(
        registry_for(StatusCache(d), lambda: {"fd00::3": ("all", 0x20, 5, 640)})
    ).decode()
    assert 'santhrottle_initiator_delayed_packets_total{initiator="fd00::3",mode="all"} 5.0' in text
    assert 'santhrottle_initiator_delay_class{initiator="fd00::3",mode="all"}' in text
    assert "santhrottle_initiators 2.0" in text
    assert [i["initiator"] for i in status_of(d)["initiators"]] == ["10.0.0.3", "fd00::3"]


def test_a_reload_that_changes_the_hosts_leaves_only_addresses_in_the_kernel(tmp_path):
    from santhrottle.appliance.config import load_config

    f = tmp_path / "s.toml"
    f.write_text(ABSOLUTE + HOSTS)
    d, vt, s, act = make(ABSOLUTE + HOSTS, load_config=load_config)
    d.config = load_config(f)
    s.writers = {"10.0.1.5": "vg0", "fd00:1::5": "vg0"}
    s.write_bps = 0.6 * MIB
    run_for(d, vt, 4.0)
    assert set(act.kernel) == {"10.0.1.5", "fd00:1::5"}
    f.write_text(ABSOLUTE + '[hosts.db9]\naddresses = ["fd00:1::5", "fd00::99"]\n')
    handle(d, "reload", {})
    run_for(d, vt, 30.0)
    assert d.counters.actuator_errors == 0
    assert set(act.kernel) <= {"10.0.1.5", "fd00:1::5", "fd00::99"}
    assert [r["host"] for r in status_of(d)["initiators"]] == [None, "db9"]


def test_the_row_order_is_ip_keys():
    from santhrottle.appliance.datapath.names import ip_key

    addrs = ["fd00::10", "10.0.0.20", "fd00::9", "10.0.0.3", "::1", "255.0.0.1", "fe80::1%eth1"]
    assert sorted(addrs, key=ip_key) == [
        "10.0.0.3", "10.0.0.20", "255.0.0.1",
        "::1", "fd00::9", "fd00::10", "fe80::1%eth1"]  # fmt: skip
    assert sorted(["db1", "fd00::1", "10.0.0.1"], key=ip_key) == [
        "10.0.0.1",
        "fd00::1",
        "db1",
    ]


def test_the_cli_pins_an_ipv6_initiator_through_a_running_daemon(tmp_path, capsys):
    from santhrottle.appliance.cli.main import main
    from santhrottle.appliance.daemon.control.server import ControlServer

    d, vt, _s, act = make()
    run_for(d, vt, 1.0)
    path = str(tmp_path / "control.sock")
    srv = ControlServer(path, Commands(d).handle, 0o600)
    srv.start()
    try:
        sock = ["--socket", path]
        assert main(["pin", "FD00:0::9", "--delay", "5ms", *sock]) == 0
        assert "pinned fd00::9 through santhrottled" in capsys.readouterr().out
        d.run_once()
        assert act.kernel["fd00::9"] == (10, "all")
        assert main(["status", *sock]) == 0
        out = capsys.readouterr().out
        assert any(ln.startswith("fd00::9 ") and "(pinned)" in ln for ln in out.splitlines())
        assert main(["unpin", "fd00::9%eth1", *sock]) == 0
        d.run_once()
        assert "fd00::9" not in act.kernel
        with pytest.raises(SystemExit) as e:  # argparse's usage error: exit 2
            main(["pin", "fd00::/64", "--delay", "5ms", *sock])
        assert e.value.code == 2
        err = capsys.readouterr().err.splitlines()[-1]
        assert err.endswith("bad initiator address 'fd00::/64' is not an IPv4 or IPv6 address")
    finally:
        srv.close()
