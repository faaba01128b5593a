"""Sensing parsers on trees and files captured from the lab (tests/fixtures/capture_lab.py)."""

import json
from pathlib import Path

import pytest

from santhrottle.appliance.sensing.blockdevs import (
    lv_index,
    resolve_device_path,
    scan_lvm,
    volume_groups,
)
from santhrottle.appliance.sensing.conns import parse_diag_dump
from santhrottle.appliance.sensing.discovery import build_discovery
from santhrottle.appliance.sensing.diskstats import interval, parse_diskstats, read_latency_of
from santhrottle.appliance.sensing.lio import LioSensor
from santhrottle.appliance.sensing.nvmet import NvmetSensor

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
META = json.loads((LAB / "meta.json").read_text())
IQN0, IQN1 = (x["iqn"] for x in META["iscsi"])


@pytest.fixture(scope="module")
def tpgs():
    return {t.wwn: t for t in LioSensor(LAB / "configfs").scan()}


def test_diskstats_20_field_lines_and_interval():
    s0 = parse_diskstats((LAB / "proc" / "diskstats.0").read_text())
    s1 = parse_diskstats((LAB / "proc" / "diskstats.1").read_text())
    assert not s0.malformed and {"dm-0", "dm-1", "dm-2"} <= set(s1.devices)
    iv = interval(s0, s1, 1.0).devices
    reader = META["iscsi"][0]["dm"]  # lun0 had the random reader
    writer = META["iscsi"][1]["dm"]  # lun1 the writer
    r = iv[reader]
    want_reads = s1.devices[reader].reads - s0.devices[reader].reads
    want_ms = s1.devices[reader].read_ticks_ms - s0.devices[reader].read_ticks_ms
    assert r.reads == want_reads > 50
    assert r.read_latency_s == pytest.approx(want_ms / want_reads / 1000)
    assert iv[writer].write_bps > 1e6 and iv[writer].reads == 0
    assert iv[writer].read_latency_s is None
    reads, lat = read_latency_of([iv[d] for d in ("dm-0", "dm-1", "dm-2")])
    assert reads == sum(iv[d].reads for d in ("dm-0", "dm-1", "dm-2"))
    assert 0 < lat < 0.1


def test_lvm_from_sysfs():
    lvs = scan_lvm(LAB / "sys")
    assert {lv.vg for lv in lvs.values()} == {META["vg"]}
    assert {lv.device: lv.lv for lv in lvs.values()} == {
        x["dm"]: x["lv"] for x in META["iscsi"] + META["nvme"]
    }
    assert volume_groups(lvs) == {META["vg"]: ["dm-0", "dm-1", "dm-2"]}
    idx = lv_index(lvs)
    assert resolve_device_path(f"/dev/{META['vg']}/lun1", idx) == META["iscsi"][1]["dm"]
    assert resolve_device_path(f"/dev/mapper/{META['vg']}-lun0", idx) == META["iscsi"][0]["dm"]
    assert resolve_device_path("/dev/dm-7", idx) == "dm-7"


def test_lio_tree_through_rtslib(tpgs):
    assert set(tpgs) == {IQN0, IQN1}
    t0, t1 = tpgs[IQN0], tpgs[IQN1]
    assert t0.generate_node_acls and not t0.acls
    assert t0.portals == ((META["iscsi"][0]["portal"], 3260),)
    assert [(lun.lun, lun.udev_path) for lun in t0.luns] == [(0, f"/dev/{META['vg']}/lun0")]
    assert not t1.generate_node_acls
    (acl,) = t1.acls
    assert acl.initiator == META["iscsi"][1]["initiator_iqn"]
    assert acl.addresses == (META["iscsi"][1]["initiator_ip"],)
    assert acl.mapped_luns == (0,)
    assert acl.write_bytes[0] >= 1024 * 1024  # the fio writer on lun1


def test_lio_absent_tree_is_empty(tmp_path):
    assert LioSensor(tmp_path).scan() == []


def test_nvmet_tree():
    nv = NvmetSensor(LAB / "configfs")
    (sub,) = nv.subsystems()
    assert sub.nqn == META["nvme"][0]["nqn"] and sub.allow_any_host
    assert [(n.nsid, n.device_path, n.enabled) for n in sub.namespaces] == [
        (1, f"/dev/{META['vg']}/nvme0", True)
    ]
    (port,) = nv.ports()
    assert (port.trtype, port.traddr, port.trsvcid) == ("tcp", META["nvme"][0]["traddr"], 4420)
    assert port.subsystems == (sub.nqn,)


def test_sock_diag_dump():
    conns = parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420])
    peers = {(c.local_ip, c.peer_ip) for c in conns}
    assert (META["iscsi"][0]["portal"], META["iscsi"][0]["initiator_ip"]) in peers
    assert (META["nvme"][0]["traddr"], META["nvme"][0]["host_traddr"]) in peers
    assert parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [9]) == []


def test_discovery_maps_every_session_to_the_vg(tpgs):
    nv = NvmetSensor(LAB / "configfs")
    d = build_discovery(
        lio=tpgs.values(),
        nvmet_subsystems=nv.subsystems(),
        nvmet_ports=nv.ports(),
        conns=parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420]),
        lvs=scan_lvm(LAB / "sys"),
    )
    vg = META["vg"]
    assert d.resources == {vg: ("dm-0", "dm-1", "dm-2")}
    ini0, ini1 = (x["initiator_ip"] for x in META["iscsi"])
    host = META["nvme"][0]["host_traddr"]
    assert {a: v.resources for a, v in d.initiators.items()} == {
        ini0: {vg},
        ini1: {vg},
        host: {vg},
    }
    assert d.initiators[ini0].write_sources == {vg: "device"}
    assert d.initiators[ini1].write_sources == {vg: "acl"}
    assert d.initiators[host].write_sources == {vg: "device"}
    assert d.device_writers[META["iscsi"][0]["dm"]] == ((ini0,), "device")
    assert not d.ambiguous
