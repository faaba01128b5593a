"""Sensing parsers on synthetic input: field counts, malformed lines, wraps, fuzzing."""

import errno
import json
import os
import shutil
import socket
import string
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance.sensing.blockdevs import LvmScanner, scan_lvm, split_dm_name
from santhrottle.appliance.sensing.conns import TcpConn
from santhrottle.appliance.sensing.discovery import build_discovery
from santhrottle.appliance.sensing.diskstats import (
    WRAP_32,
    DiskstatsReader,
    interval,
    parse_diskstats,
    write_bps_of,
)
from santhrottle.appliance.sensing.lio import LioLun, LioTpg
from santhrottle.appliance.sensing.nvmet import NvmetSensor
from santhrottle.appliance.sensing.target import TargetSensor, busy_devices

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
L14 = "   8       0 sda 10 0 80 40 5 0 40 20 0 30 60"
L18 = L14 + " 0 0 0 0"
L20 = L18 + " 3 7"


@pytest.mark.parametrize("line", [L14, L18, L20], ids=["14", "18", "20"])
def test_all_field_counts(line):
    d = parse_diskstats(line + "\n").devices["sda"]
    assert (d.reads, d.read_sectors, d.read_ticks_ms, d.writes, d.io_ticks_ms) == (
        10,
        80,
        40,
        5,
        30,
    )


def test_malformed_lines_are_skipped_and_counted():
    text = "\n".join(
        [L20, "garbage", "8 1 sdb 1 2 3", "8 2 sdc " + "x " * 17, "8 3 sdd" + " -1" * 17]
    )
    snap = parse_diskstats(text)
    assert list(snap.devices) == ["sda"]
    assert len(snap.malformed) == 4


def test_interval_wrap_reset_and_disappearance():
    old = parse_diskstats(
        f"8 0 sda {WRAP_32 - 5} 0 0 {WRAP_32 - 10} 0 0 0 0 0 0 0\n"
        "8 16 sdb 10 0 0 10 0 0 0 0 0 0 0\n"
        f"8 32 sdc {WRAP_32 * 4} 0 0 0 0 0 0 0 0 0 0\n"
        "8 48 sdd 1 0 0 0 0 0 0 0 0 0 0\n"
    )
    new = parse_diskstats(
        "8 0 sda 5 0 0 10 0 0 0 0 0 0 0\n"  # 32-bit wrap: +10 reads, +20 ms
        "8 32 sdc 3 0 0 0 0 0 0 0 0 0 0\n"  # 64-bit counter went back: reset
        "9 0 sdd 5 0 0 0 0 0 0 0 0 0 0\n"  # same name, other device
    )
    res = interval(old, new, 0.5)
    assert res.devices["sda"].reads == 10
    assert res.devices["sda"].read_latency_s == pytest.approx(0.002)
    assert res.disappeared == ["sdb"]
    assert sorted(res.reset) == ["sdc", "sdd"]
    with pytest.raises(ValueError):
        interval(old, new, 0.0)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable, max_size=400))
def test_diskstats_parser_never_crashes(text):
    snap = parse_diskstats(text)
    assert all(d.reads >= 0 for d in snap.devices.values())


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=2**64), min_size=11, max_size=11),
    st.lists(st.integers(min_value=0, max_value=2**64), min_size=11, max_size=11),
)
def test_interval_never_negative(a, b):
    fmt = "8 0 sda " + " ".join(["{}"] * 11)
    res = interval(parse_diskstats(fmt.format(*a)), parse_diskstats(fmt.format(*b)), 1.0)
    for d in res.devices.values():
        assert d.reads >= 0 and d.write_bytes >= 0 and d.read_ticks_ms >= 0


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("vg-lv", ("vg", "lv")),
        ("my--vg-my--lv", ("my-vg", "my-lv")),
        ("vg-lv--x--", ("vg", "lv-x-")),
        ("novg", None),
        ("a-b-c", None),
    ],
)
def test_split_dm_name(name, want):
    assert split_dm_name(name) == want


names = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(st.lists(st.tuples(names, st.text(max_size=30), st.text(max_size=30)), max_size=6))
def test_sysfs_scan_never_crashes(tmp_path_factory, entries):
    root = tmp_path_factory.mktemp("sys")
    for i, (_, uuid, name) in enumerate(entries):
        d = root / "block" / f"dm-{i}" / "dm"
        d.mkdir(parents=True)
        (d / "uuid").write_text(uuid)
        (d / "name").write_text(name)
    lvs = scan_lvm(root)
    assert all(lv.device.startswith("dm-") for lv in lvs.values())


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "subsystems/s1/attr_allow_any_host",
                "subsystems/s1/namespaces/1/device_path",
                "subsystems/s1/namespaces/x/enable",
                "ports/1/addr_trsvcid",
                "ports/1/addr_traddr",
                "ports/p/addr_trtype",
            ]
        ),
        st.binary(max_size=20),
    )
)
def test_nvmet_reader_never_crashes(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("cfg")
    for rel, data in files.items():
        p = root / "nvmet" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    nv = NvmetSensor(root)
    nv.subsystems()
    nv.ports()


def _tpg(wwn, portal, lun_path):
    return LioTpg("iscsi", wwn, 1, True, True, ((portal, 3260),), (LioLun(0, "b/x", lun_path),), ())


def test_wildcard_portal_shared_by_two_targets_is_ambiguous_then_static_map():
    tpgs = [_tpg("iqn.a", "0.0.0.0", "/dev/vg/a"), _tpg("iqn.b", "0.0.0.0", "/dev/vg/b")]
    conn = TcpConn("10.1.0.1", 3260, "10.1.0.9", 40000)
    d = build_discovery(lio=tpgs, conns=[conn])
    assert d.ambiguous and d.initiators["10.1.0.9"].resources == set()
    d = build_discovery(lio=tpgs, conns=[conn], static_map={"10.1.0.0/24": ["vg"]})
    assert d.initiators["10.1.0.9"].resources == {"vg"}
    assert d.initiators["10.1.0.9"].write_sources == {"vg": "static"}
    d = build_discovery(static_map={"10.2.0.5": ["vg2"]})  # not connected: a single address
    assert d.initiators["10.2.0.5"].resources == {"vg2"}


def test_declared_resource_and_shared_lun():
    tpgs = [_tpg("iqn.a", "10.1.0.1", "/dev/sdx")]
    conns = [TcpConn("10.1.0.1", 3260, "10.1.0.8", 1), TcpConn("10.1.0.1", 3260, "10.1.0.9", 2)]
    d = build_discovery(lio=tpgs, conns=conns, declared={"array1": ["sdx", "sdy"]})
    assert d.resources == {"array1": ("sdx", "sdy")}
    assert d.device_writers["sdx"] == (("10.1.0.8", "10.1.0.9"), "shared")
    assert d.initiators["10.1.0.8"].write_sources == {"array1": "shared"}


class FakeConns:
    def __init__(self, conns):
        self._conns = conns

    def connections(self):
        return self._conns


def test_target_sensor_samples_from_captured_files(tmp_path):
    from santhrottle.appliance.sensing.conns import parse_diag_dump

    meta = json.loads((LAB / "meta.json").read_text())
    proc = tmp_path / "proc"
    proc.mkdir()
    now = [100.0]
    conns = parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420])
    s = TargetSensor(
        proc_root=proc,
        sys_root=LAB / "sys",
        configfs_root=LAB / "configfs",
        clock=lambda: now[0],
        connections=FakeConns(conns),
    )
    shutil.copy(LAB / "proc" / "diskstats.0", proc / "diskstats")
    assert s.converge()[1] == [] and s.read_samples() == []  # first pass only primes
    shutil.copy(LAB / "proc" / "diskstats.1", proc / "diskstats")
    now[0] += 1.0
    (rs,) = s.read_samples()
    assert rs.resource == meta["vg"] and rs.reads > 50 and 0 < rs.read_latency_s < 0.1
    assert rs.write_bps > 1e6
    ws = {(w.resource, w.initiator): w.write_bps for w in s.converge()[1]}
    vg = meta["vg"]
    ini0, ini1 = (x["initiator_ip"] for x in meta["iscsi"])
    assert ws[(vg, ini0)] == 0.0  # the reader host wrote nothing (device source)
    # the ACL host is charged from its ACL counter, not its device's writes: the
    # captured tree does not change between the two scans, so 0
    assert ws[(vg, ini1)] == 0.0


def _lab_sensor(tmp_path, sys_root, t0):
    """A TargetSensor on the captured lab tree (no connections), discovered; its proc
    dir (empty) and its clock ([t0], to move)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    now = [t0]
    s = TargetSensor(
        proc_root=proc,
        sys_root=sys_root,
        configfs_root=LAB / "configfs",
        clock=lambda: now[0],
        connections=FakeConns([]),
    )
    s.discover()
    return s, proc, now


def test_a_volume_groups_utilization_is_its_pvs_io_ticks_share(tmp_path):
    """The lab's captured second: the three LVs of labvg (all on vda) busy 80, 192 and
    264 ms, vda 388 ms: the VG's utilization is vda's (the time any LV had an IO in
    flight), not the busiest LV's 0.264 nor their sum, with the tick as its span."""
    s, proc, now = _lab_sensor(tmp_path, LAB / "sys", 100.0)
    shutil.copy(LAB / "proc" / "diskstats.0", proc / "diskstats")
    s.read_samples()
    shutil.copy(LAB / "proc" / "diskstats.1", proc / "diskstats")
    now[0] += 1.0
    assert s.read_samples()
    (u,) = s.utilization_samples()
    assert u.resource == "labvg"
    assert u.utilization == pytest.approx(0.388) and u.span_s == pytest.approx(1.0)
    assert busy_devices({"vg": ("dm-0", "sdz")}, scan_lvm(LAB / "sys")) == {"vg": ("sdz", "vda")}


def test_reads_in_flight_only_without_completed_reads(tmp_path):
    sys_root = tmp_path / "sys"
    shutil.copytree(LAB / "sys", sys_root)
    for dev, inflight in (("dm-0", "2 0\n"), ("dm-1", "0 5\n"), ("dm-2", "0 0\n")):
        (sys_root / "block" / dev / "inflight").write_text(inflight)
    s, proc, now = _lab_sensor(tmp_path, sys_root, 0.0)
    shutil.copy(LAB / "proc" / "diskstats.1", proc / "diskstats")
    s.read_samples()
    now[0] = 1.0
    (idle,) = s.read_samples()  # the same counters again: no completed reads
    assert idle.reads == 0 and idle.reads_in_flight == 2  # writes in flight do not count


def test_reads_in_flight_come_from_files_kept_open(tmp_path):
    """The inflight files are opened once and read again from offset 0 (keptfile.py):
    no open per tick (a sysfs open is as dear as the read in the lab guest, and a
    process out of descriptors still reads them); close() closes them."""
    sys_root = tmp_path / "sys"
    shutil.copytree(LAB / "sys", sys_root)
    for dev in ("dm-0", "dm-1", "dm-2"):
        (sys_root / "block" / dev / "inflight").write_text("1 0\n")
    s, proc, now = _lab_sensor(tmp_path, sys_root, 0.0)
    shutil.copy(LAB / "proc" / "diskstats.1", proc / "diskstats")
    s.read_samples()

    def held() -> set[str]:
        fds = Path("/proc/self/fd")
        links = {os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).is_symlink()}
        mine = str(sys_root.resolve())
        return {Path(p).parent.name for p in links if p.startswith(mine) and "inflight" in p}

    now[0] = 1.0
    assert s.read_samples()[0].reads_in_flight == 3
    assert held() == {"dm-0", "dm-1", "dm-2"}
    (sys_root / "block" / "dm-0" / "inflight").write_text("4 0\n")  # the same inode
    now[0] = 2.0
    assert s.read_samples()[0].reads_in_flight == 6  # read again from offset 0
    s.close()
    assert held() == set()


def test_write_bps_of_only_the_asked_devices_with_wrap_and_reset():
    old = parse_diskstats(
        f"8 0 sda 0 0 0 0 0 0 {WRAP_32 - 8} 0 0 0 0\n"
        "8 16 sdb 0 0 0 0 0 0 100 0 0 0 0\n"
        "8 32 sdc 0 0 0 0 0 0 100 0 0 0 0\n"
        "8 48 sdd 0 0 0 0 0 0 100 0 0 0 0\n"
    )
    new = parse_diskstats(
        "8 0 sda 0 0 0 0 0 0 8 0 0 0 0\n"  # 32-bit wrap: +16 sectors
        "8 16 sdb 0 0 0 0 0 0 300 0 0 0 0\n"
        "9 0 sdc 0 0 0 0 0 0 900 0 0 0 0\n"  # another device under the name
    )
    got = write_bps_of(old, new, 2.0, ["sda", "sdc", "sdd", "sde"])
    assert got == {"sda": 16 * 512 / 2.0}  # sdb not asked; sdc reset; sdd gone; sde unknown
    assert write_bps_of(old, new, 1.0, ["sdb"]) == {"sdb": 200 * 512}
    with pytest.raises(ValueError):
        write_bps_of(old, new, 0.0, ["sda"])


def _dm(block: Path, dev: str, name: str) -> None:
    (block / dev / "dm").mkdir(parents=True)
    (block / dev / "dm" / "name").write_text(name + "\n")
    (block / dev / "dm" / "uuid").write_text(f"LVM-{dev}\n")
    (block / dev / "dev").write_text("253:0\n")
    (block / dev / "slaves").mkdir()


def test_lvm_scanner_rescans_on_new_devices_and_finds_a_rename_in_rotation(tmp_path):
    block = tmp_path / "block"
    for i in range(10):
        _dm(block, f"dm-{i}", f"vg-lv{i}")
    now = [0.0]
    sc = LvmScanner(tmp_path, full_rescan_s=10.0, clock=lambda: now[0])
    first = sc.scan()
    assert len(first) == 10 and sc.full_scans == 1
    for _ in range(3):  # nothing changed: no full scan, the same object
        now[0] += 1.0
        assert sc.scan() is first
    assert sc.full_scans == 1
    (block / "dm-7" / "dm" / "name").write_text("vg-renamed\n")  # lvrename
    seen_at = None
    for _ in range(12):
        now[0] += 1.0
        if sc.scan()["dm-7"].lv == "renamed":
            seen_at = now[0]
            break
    assert seen_at is not None and seen_at - 3.0 <= 10.0 and sc.full_scans == 2
    _dm(block, "dm-10", "vg-lv10")  # a new LV: at once
    now[0] += 1.0
    assert "dm-10" in sc.scan() and sc.full_scans == 3


def test_converge_reuses_a_fresh_tick_snapshot(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    now = [100.0]
    conns = [TcpConn("10.0.0.1", 3260, "10.0.0.2", 40000)]
    tpg = LioTpg(
        "iscsi", "iqn.t", 1, True, True, (("10.0.0.1", 3260),),
        (LioLun(0, "block/lv0", "/dev/labvg/lun0"),), (),
    )  # fmt: skip
    s = TargetSensor(
        proc_root=proc,
        sys_root=LAB / "sys",
        configfs_root=tmp_path / "none",
        clock=lambda: now[0],
        connections=FakeConns(conns),
        snapshot_reuse_s=0.1,
    )
    s.lio = type("L", (), {"last_skipped": (), "scan": lambda self: [tpg]})()
    dev = s.discover().exports[0].device
    line = "253 {m} {d} 0 0 0 0 0 0 {w} 0 0 0 0\n"
    minor = next(lv.major_minor for lv in scan_lvm(LAB / "sys").values() if lv.device == dev)
    m = minor.split(":")[1]

    def write(sectors: int) -> None:
        (proc / "diskstats").write_text(line.format(m=m, d=dev, w=sectors))

    write(0)
    s.read_samples()  # tick at 100.0
    now[0] = 100.05
    s.converge()  # primes with the tick's snapshot (0 sectors at 100.0)
    now[0] = 101.0
    write(2048)
    s.read_samples()  # tick at 101.0 sees 2048 sectors
    write(999_999)  # the file moves on; converge must not read it within 0.1 s
    now[0] = 101.08
    (w,) = s.converge()[1]
    assert w.initiator == "10.0.0.2" and w.write_bps == pytest.approx(2048 * 512 / 1.0)
    now[0] = 101.5  # the last tick is 0.5 s old: read the file
    (w,) = s.converge()[1]
    assert w.write_bps == pytest.approx((999_999 - 2048) * 512 / 0.5)


# -- the fast paths give what the line-by-line / device-by-device code gives --------

_counts = st.lists(st.integers(min_value=0, max_value=2**64), min_size=17, max_size=17)


def _line(name: str, width: int, nums: list[int]) -> str:
    return " ".join(["253", str(len(name)), name, *map(str, nums[: width - 3])])


@st.composite
def _diskstats_texts(draw):
    """Mostly well-formed files (the column path), some lines of another width,
    negative, non-numeric or empty, over several parse blocks."""
    width = draw(st.sampled_from([14, 18, 20]))
    n = draw(st.integers(min_value=0, max_value=150))
    lines = [_line(f"dm-{i}", width, draw(_counts)) for i in range(n)]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        bad = draw(
            st.sampled_from(
                ["", "garbage", _line("sdx", 19, [1] * 17), _line("sdy", 20, [-1] * 17),
                 _line("dm-1", 14, [5] * 17), _line("sdz", 18, [3] * 17), "8 0 sdw x 1"]
            )
        )  # fmt: skip
        lines.insert(draw(st.integers(min_value=0, max_value=len(lines))), bad)
    return "\n".join(lines)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(_diskstats_texts())
def test_parse_diskstats_columns_match_line_by_line(text):
    from santhrottle.appliance.sensing.diskstats import Snapshot, _parse_lines

    want = Snapshot()
    _parse_lines(text.splitlines(), want)
    got = parse_diskstats(text)
    assert list(got.devices.items()) == list(want.devices.items())
    assert got.malformed == want.malformed


@st.composite
def _snapshot_pairs(draw):
    """Two snapshots of the same devices, mostly counters that went forward; some
    wrap, reset, re-created, disappeared, new or reordered devices."""
    n = draw(st.integers(min_value=1, max_value=20))
    old_lines, new_lines = [], []
    for i in range(n):
        a = draw(st.lists(st.integers(min_value=0, max_value=2**40), min_size=11, max_size=11))
        step = draw(st.lists(st.integers(min_value=0, max_value=10**6), min_size=11, max_size=11))
        b = [x + d for x, d in zip(a, step, strict=True)]
        kind = draw(st.sampled_from(["fwd"] * 6 + ["wrap", "reset", "major", "gone"]))
        if kind == "wrap":
            a[0], b[0] = WRAP_32 - 3, 5
        elif kind == "reset":
            b[4] = a[4] - 1 if a[4] else 0
            a[4] = max(a[4], 2**33)
        old_lines.append(f"8 {i} sd{i} " + " ".join(map(str, a)))
        if kind != "gone":
            major = 9 if kind == "major" else 8
            new_lines.append(f"{major} {i} sd{i} " + " ".join(map(str, b)))
    if draw(st.booleans()):
        new_lines.append("8 99 sdnew " + " ".join(["1"] * 11))
    if draw(st.booleans()):
        new_lines.reverse()
    return parse_diskstats("\n".join(old_lines)), parse_diskstats("\n".join(new_lines))


@settings(derandomize=True, max_examples=80, deadline=None)
@given(_snapshot_pairs(), st.sampled_from([0.1, 1.0, 2.5]))
def test_interval_columns_match_device_by_device(pair, dt):
    from santhrottle.appliance.sensing.diskstats import _interval_by_device

    old, new = pair
    got, want = interval(old, new, dt), _interval_by_device(old, new, dt)
    assert list(got.devices.items()) == list(want.devices.items())
    assert (got.disappeared, got.reset) == (want.disappeared, want.reset)


def test_write_samples_single_shared_multi_and_gone_devices(tmp_path):
    """Every write source the convergence charges from diskstats, and a device that
    disappears: its pairs get no sample, the others keep theirs, in order."""
    proc = tmp_path / "proc"
    proc.mkdir()
    now = [100.0]
    tpgs = [
        LioTpg("iscsi", "iqn.a", 1, True, True, (("10.0.0.1", 3260),),
               (LioLun(0, "b/0", "/dev/labvg/lun0"), LioLun(1, "b/1", "/dev/labvg/lun1")), ()),
        LioTpg("iscsi", "iqn.b", 1, True, True, (("10.0.0.11", 3260),),
               (LioLun(0, "b/2", "/dev/labvg/nvme0"),), ()),
    ]  # fmt: skip
    conns = [
        TcpConn("10.0.0.1", 3260, "10.0.0.5", 1),  # both LUNs of iqn.a: charged by two devices
        TcpConn("10.0.0.11", 3260, "10.0.0.6", 2),  # iqn.b's LUN, shared by .6 and .7
        TcpConn("10.0.0.11", 3260, "10.0.0.7", 3),
    ]
    s = TargetSensor(
        proc_root=proc,
        sys_root=LAB / "sys",
        configfs_root=tmp_path / "none",
        clock=lambda: now[0],
        connections=FakeConns(conns),
    )
    s.lio = type("L", (), {"last_skipped": (), "scan": lambda self: tpgs})()

    def converge(t: float, **sectors: int) -> list[tuple[str, str, float]]:
        now[0] = t
        (proc / "diskstats").write_text(
            "".join(f"253 {d[3:]} {d} 0 0 0 0 0 0 {w} 0 0 0 0\n" for d, w in sectors.items())
        )
        return [tuple(w) for w in s.converge()[1]]

    assert converge(100.0, **{"dm-0": 0, "dm-1": 0, "dm-2": 0}) == []
    assert converge(101.0, **{"dm-0": 100, "dm-1": 300, "dm-2": 50}) == [
        ("labvg", "10.0.0.6", 50 * 512.0),
        ("labvg", "10.0.0.7", 50 * 512.0),
        ("labvg", "10.0.0.5", 400 * 512.0),
    ]
    assert converge(102.0, **{"dm-0": 200, "dm-1": 300}) == [("labvg", "10.0.0.5", 100 * 512.0)]
    assert s.warnings.disappeared_devices == ["dm-2"]
    assert converge(103.0, **{"dm-0": 200, "dm-1": 340, "dm-2": 60}) == [
        ("labvg", "10.0.0.5", 40 * 512.0)  # dm-2 is back: no rate from a missing snapshot
    ]


# -- raw sock_diag replies, without a kernel ------------------------------------------


def _diag_msg(mtype, family, sport, src, dst, size=124):
    """nlmsghdr + inet_diag_msg (sockid: sport, dport 40000, src, dst) + attributes."""
    body = struct.pack("=BBBB", family, 1, 0, 0) + struct.pack(">HH", sport, 40000)
    body += src.ljust(16, b"\0") + dst.ljust(16, b"\0") + bytes(12 + 20)  # if, cookie; rest
    return struct.pack("=IHHII", size, mtype, 2, 1, 0) + body + bytes(size - 16 - len(body))


def _sid(sport, src, dst):
    return struct.pack(">HH", sport, 40000) + src.ljust(16, b"\0") + dst.ljust(16, b"\0")


_DONE = struct.pack("=IHHIIi", 20, 3, 2, 1, 0, 0)


class FakeDiagSocket:
    """Answers each request sent with the datagrams `replies(request)` returns."""

    def __init__(self, replies):
        self.replies, self.sent, self.queue = replies, [], []

    def send(self, data):
        self.sent.append(data)
        self.queue.extend(self.replies(data))
        return len(data)

    def recv_into(self, buf):
        d = self.queue.pop(0)
        buf[: len(d)] = d
        return len(d)


V4A, V4B, V6A = (
    socket.inet_pton(socket.AF_INET, "10.0.0.1"),
    b"\x0a\0\0\x02",
    b"\xfe\x80" + bytes(14),
)


def test_one_walk_dump_sorts_families_and_ports_in_either_decoder():
    from santhrottle.appliance.sensing.conns import _dump_sockets

    def replies(req):
        assert struct.unpack_from("=H", req, 4)[0] == 18  # TCPDIAG_GETSOCK
        uniform = b"".join(
            [
                _diag_msg(18, socket.AF_INET, 3260, V4A, V4B),
                _diag_msg(18, socket.AF_INET6, 4420, V6A, V6A),
                _diag_msg(18, socket.AF_INET, 22, V4A, V4B),  # not a storage port
                _diag_msg(18, socket.AF_INET, 3260, V4B, V4A),
            ]
        )
        # then another message length and DONE: message by message
        return [uniform, _diag_msg(18, socket.AF_INET6, 3260, V6A, V6A, size=140) + _DONE]

    sock = FakeDiagSocket(replies)
    got = _dump_sockets(sock, frozenset({3260, 4420}), bytearray(1 << 16))
    assert got == [
        (socket.AF_INET, [_sid(3260, V4A, V4B), _sid(3260, V4B, V4A)]),
        (socket.AF_INET6, [_sid(4420, V6A, V6A), _sid(3260, V6A, V6A)]),
    ]
    assert len(sock.sent) == 1
    every = _dump_sockets(FakeDiagSocket(replies), None, bytearray(1 << 16))
    assert [len(ids) for _, ids in every] == [3, 2]


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EOPNOTSUPP])
def test_a_kernel_that_refuses_the_one_walk_request_gets_one_per_family(err):
    from santhrottle.appliance.sensing.conns import _dump_sockets

    def replies(req):
        mtype, family = struct.unpack_from("=H", req, 4)[0], req[16]
        if mtype == 18:
            return [struct.pack("=IHHIIi", 36, 2, 0, 1, 0, -err) + bytes(16)]  # NLMSG_ERROR
        assert mtype == 20  # SOCK_DIAG_BY_FAMILY
        if family == socket.AF_INET:
            return [_diag_msg(20, socket.AF_INET, 3260, V4A, V4B) * 2, _DONE]
        return [_DONE]

    sock = FakeDiagSocket(replies)
    got = _dump_sockets(sock, frozenset({3260}), bytearray(1 << 16))
    assert got == [(socket.AF_INET, [_sid(3260, V4A, V4B)] * 2), (socket.AF_INET6, [])]
    assert [struct.unpack_from("=H", r, 4)[0] for r in sock.sent] == [18, 20, 20]


def test_other_sock_diag_errors_are_raised():
    from santhrottle.appliance.sensing.conns import _dump_sockets

    def replies(req):
        return [struct.pack("=IHHIIi", 36, 2, 0, 1, 0, -errno.EPERM) + bytes(16)]

    with pytest.raises(OSError) as e:
        _dump_sockets(FakeDiagSocket(replies), frozenset({3260}), bytearray(1 << 16))
    assert e.value.errno == errno.EPERM


def test_a_snapshot_of_some_devices_is_theirs_exactly(tmp_path):
    """DiskstatsReader.snapshot(devices) parses only their lines: the same counters as
    the whole file's, no device whose name merely starts like one (dm-1, dm-10), and a
    malformed line noted only when it is one of theirs."""
    text = (LAB / "proc" / "diskstats.1").read_text()
    text += " 253 10 dm-10 1 0 8 4 0 0 0 0 0 4 4\n 7 0 loop0 1 2 3\n 253 1 dm-1 x\n"
    (tmp_path / "diskstats").write_text(text)
    reader = DiskstatsReader(tmp_path)
    whole = reader.snapshot()
    some = reader.snapshot(["dm-0", "vda", "nbd0"])
    assert sorted(some.devices) == ["dm-0", "vda"]
    assert some.devices == {n: whole.devices[n] for n in ("dm-0", "vda")}
    assert some.malformed == [] and len(whole.malformed) == 2
    assert reader.snapshot(["dm-1"]).malformed == [" 253 1 dm-1 x"]
    assert reader.snapshot([]).devices == {}


def test_the_tick_parses_only_the_devices_the_discovery_uses(tmp_path):
    """After a discovery the tick's snapshot holds the resources' members and the
    devices their utilization and write rates come from, nothing else: in the lab
    guest the whole file (loop, nbd, sr devices) was a third of the tick's CPU. Lines of
    other devices are not parsed (a malformed one is not noted), and a device the
    discovery stops using is no device gone."""
    s, proc, now = _lab_sensor(tmp_path, LAB / "sys", 100.0)
    extra = " 7 0 loop0 1 2\n 11 0 sr0 1 0 8 4 0 0 0 0 0 4 4\n"
    (proc / "diskstats").write_text((LAB / "proc" / "diskstats.0").read_text() + extra)
    s.read_samples()
    now[0] += 1.0
    (proc / "diskstats").write_text((LAB / "proc" / "diskstats.1").read_text() + extra)
    assert s.read_samples()
    assert s._tick_prev is not None
    watched = set(s._tick_prev[1].devices)
    assert {"dm-0", "dm-1", "dm-2", "vda"} <= watched and "sr0" not in watched
    assert s.warnings.malformed_diskstats_lines == 0
    s._watched = frozenset({"dm-0"})  # a discovery that uses dm-0 only
    now[0] += 1.0
    s.read_samples()
    assert s.warnings.disappeared_devices == []
