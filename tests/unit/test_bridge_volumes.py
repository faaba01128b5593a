"""bridge/volumes.py: the admin's volume names, and a resource's samples from its volumes."""

from __future__ import annotations

import pytest

from santhrottle.bridge.tracker import Volume, VolumeReads
from santhrottle.bridge.volumes import VolumeMap, VolumeNameError, parse_volume, volume_rows
from santhrottle.controller.domain import ReadSample, WriteSample

IQN = "iqn.2026-11.lab:array"
LUN1 = Volume("iscsi", "10.0.0.9:3260", IQN, 1)
LUN2 = Volume("iscsi", "10.0.0.9:3260", IQN, 2)
UNNAMED = Volume("iscsi", "10.0.0.9:3260", "", 3)  # its login was not seen
NS1 = Volume("nvme", "[fd00::9]:4420", "nqn.2026-11.lab:sub", 1)


def test_names_and_what_they_match():
    p = parse_volume(f"iscsi://10.0.0.9/{IQN}/1")
    assert p.portal == "10.0.0.9:3260" and p.matches(LUN1) and not p.matches(LUN2)
    any_lun = parse_volume(f"iscsi://10.0.0.9:3260/{IQN}/*")
    assert any_lun.matches(LUN1) and any_lun.matches(LUN2) and not any_lun.matches(UNNAMED)
    assert parse_volume("iscsi://10.0.0.9/*/3").matches(UNNAMED)
    v6 = parse_volume("nvme://[fd00:0::9]/nqn.2026-11.lab:sub/1")
    assert v6.portal == "[fd00::9]:4420" and v6.matches(NS1)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("fc://10.0.0.9/x/1", "iscsi:// or nvme://"),
        ("iscsi://10.0.0.9/x", "PORTAL/NAME/UNIT"),
        ("iscsi://array.lab/x/1", "not an IP address"),
        ("iscsi://10.0.0.9:99999/x/1", "bad port"),
        ("iscsi://10.0.0.9//1", "target name is empty"),
        ("nvme://10.0.0.9/x/one", "NSID must be a number"),
        ("nvme://[fd00::9]x/x/1", "bad portal"),
    ],
)
def test_bad_names_say_what_is_wrong(name, says):
    with pytest.raises(VolumeNameError, match=says):
        parse_volume(name)


def test_a_resources_tick_and_convergence_from_its_volumes():
    m = VolumeMap({
        "array1": [f"iscsi://10.0.0.9/{IQN}/*", "iscsi://10.0.0.9/*/3"],
        "fast": ["nvme://[fd00::9]/nqn.2026-11.lab:sub/1"],
    })  # fmt: skip
    reads = {
        LUN1: VolumeReads(3, 0.030),  # 10 ms each
        LUN2: VolumeReads(1, 0.030),  # 30 ms
        NS1: VolumeReads(2, 0.002),
        Volume("iscsi", "10.0.0.7:3260", IQN, 1): VolumeReads(5, 1.0),  # in no resource
    }
    got = m.read_samples(reads, {UNNAMED: 1_000_000}, 0.1)
    assert got == [
        ReadSample("array1", 4, pytest.approx(0.015), 10_000_000.0),
        ReadSample("fast", 2, pytest.approx(0.001), 0.0),
    ]
    writes = {(LUN1, "10.0.0.2"): 2_000_000, (LUN2, "10.0.0.2"): 1_000_000, (NS1, "fd00::2"): 5}
    assert m.write_samples(writes, 1.0) == [
        WriteSample("array1", "10.0.0.2", 3_000_000.0),
        WriteSample("fast", "fd00::2", 5.0),
    ]


def test_the_volumes_the_wire_shows_named_as_the_config_takes_them():
    m = VolumeMap({"array1": [f"iscsi://10.0.0.9/{IQN}/*"]})
    seen = {LUN1: {"10.0.0.3", "10.0.0.2"}, UNNAMED: {"10.0.0.4"}}
    rows = volume_rows(seen, {LUN1: VolumeReads(2, 0.006), NS1: VolumeReads(0, 0.0)}, m)
    assert [(r.name, r.resources, r.initiators, r.reads, r.read_latency_s) for r in rows] == [
        ("iscsi://10.0.0.9:3260/*/3", (), ("10.0.0.4",), 0, None),
        (f"iscsi://10.0.0.9:3260/{IQN}/1", ("array1",), ("10.0.0.2", "10.0.0.3"), 2,
         pytest.approx(0.003)),
        ("nvme://[fd00::9]:4420/nqn.2026-11.lab:sub/1", (), (), 0, None),
    ]  # fmt: skip
    # every name it prints parses back to a pattern that matches its volume
    assert parse_volume(rows[1].name).matches(LUN1) and parse_volume(rows[0].name).matches(UNNAMED)


def test_io_samples_per_resource_and_initiator():
    vm = VolumeMap({"r1": ["iscsi://10.0.0.9/*/*"]})
    lun0 = Volume("iscsi", "10.0.0.9:3260", "iqn.x:a", 0)
    lun1 = Volume("iscsi", "10.0.0.9:3260", "iqn.x:a", 1)
    reads = {
        (lun0, "10.0.0.2"): VolumeReads(3, 0.030),
        (lun1, "10.0.0.2"): VolumeReads(1, 0.002),
        (lun1, "10.0.0.3"): VolumeReads(writes=2),
    }
    writes = {(lun1, "10.0.0.3"): 8192}
    out = vm.io_samples(reads, writes)
    assert [(s.resource, s.initiator) for s in out] == [("r1", "10.0.0.2"), ("r1", "10.0.0.3")]
    a, b = out
    assert a.reads == 4 and a.ios == 4 and abs(a.read_latency_s - 0.008) < 1e-12 and a.bytes == 0
    assert b.reads == 0 and b.read_latency_s is None and b.bytes == 8192 and b.ios == 2
