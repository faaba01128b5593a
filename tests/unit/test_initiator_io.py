"""Each initiator's IOs and names on a target host (appliance/sensing/initiator_io.py,
the debugfs reader in nvmet.py, TargetSensor's io_samples and initiator_names())."""

import json
import shutil
from pathlib import Path

import pytest

from santhrottle.appliance.sensing.blockdevs import scan_lvm
from santhrottle.appliance.sensing.conns import TcpConn, parse_diag_dump
from santhrottle.appliance.sensing.discovery import build_discovery
from santhrottle.appliance.sensing.diskstats import WRAP_32, DevInterval, interval, parse_diskstats
from santhrottle.appliance.sensing.initiator_io import (
    AclCount,
    acl_counters,
    acl_deltas,
    initiator_names,
    io_plan,
    io_samples,
)
from santhrottle.appliance.sensing.lio import (
    MIB,
    LioAcl,
    LioLun,
    LioSensor,
    LioTpg,
    _session_names,
)
from santhrottle.appliance.sensing.nvmet import (
    NvmetSensor,
    debugfs_controllers,
    debugfs_hosts,
    host_address,
)
from santhrottle.appliance.sensing.target import TargetSensor

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
META = json.loads((LAB / "meta.json").read_text())
VG = META["vg"]
INI0, INI1 = (x["initiator_ip"] for x in META["iscsi"])
IQN_INI0, IQN_INI1 = (x["initiator_iqn"] for x in META["iscsi"])
NVME_HOST = META["nvme"][0]["host_traddr"]
NVME_NQN = META["nvme"][0]["nqn"]
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:5a1f0c2e-lab-host"
LVS = scan_lvm(LAB / "sys")  # labvg: dm-0 lun0, dm-1 lun1, dm-2 nvme0


@pytest.fixture(scope="module")
def lab_tpgs():
    return LioSensor(LAB / "configfs").scan()


def _lab_discovery(tpgs):
    nv = NvmetSensor(LAB / "configfs")
    return build_discovery(
        lio=tpgs,
        nvmet_subsystems=nv.subsystems(),
        nvmet_ports=nv.ports(),
        conns=parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420]),
        lvs=LVS,
    )


def _lab_intervals():
    s0 = parse_diskstats((LAB / "proc" / "diskstats.0").read_text())
    s1 = parse_diskstats((LAB / "proc" / "diskstats.1").read_text())
    return interval(s0, s1, 1.0).devices


def _iv(name, reads, writes, read_ms, write_ms, read_bytes=0, write_bytes=0):
    return DevInterval(name, 1.0, reads, writes, read_bytes, write_bytes, read_ms, write_ms,
                       0, 0, 0)  # fmt: skip


def _cluster(*peers, acl=None, lun_path="/dev/labvg/lun1"):
    """One TPG (generated ACLs) on 10.0.0.12 exporting lun_path, the peers connected to
    it, and an explicit ACL (initiator, address, commands, MiB read, MiB written)."""
    acls = ()
    if acl is not None:
        ini, addr, cmds, rmib, wmib = acl
        acls = (LioAcl(ini, (addr,), (0,), {0: wmib * MIB}, {0: rmib * MIB}, {0: cmds}),)
    tpg = LioTpg("iscsi", "iqn.t:lun1", 1, True, True, (("10.0.0.12", 3260),),
                 (LioLun(0, "block/lun1", lun_path),), acls)  # fmt: skip
    conns = [TcpConn("10.0.0.12", 3260, p, 40000 + i) for i, p in enumerate(peers)]
    return tpg, build_discovery(lio=[tpg], conns=conns, lvs=LVS)


def _two_luns():
    """lun0 on 10.0.0.11 and lun1 on 10.0.0.12, generated ACLs."""
    return [
        LioTpg("iscsi", "iqn.t:a", 1, True, True, (("10.0.0.11", 3260),),
               (LioLun(0, "block/lun0", "/dev/labvg/lun0"),), ()),
        LioTpg("iscsi", "iqn.t:b", 1, True, True, (("10.0.0.12", 3260),),
               (LioLun(0, "block/lun1", "/dev/labvg/lun1"),), ()),
    ]  # fmt: skip


def _by_initiator(samples):
    return {s.initiator: s for s in samples}


# -- the sources --------------------------------------------------------------------


def test_one_initiator_per_device_is_that_device_exactly(lab_tpgs):
    """The lab: a reader on lun0 (generated ACLs), the ACL's writer alone on lun1, the
    NVMe reader on nvme0: each is its device's interval, counts and latencies."""
    d = _lab_discovery(lab_tpgs)
    devs = _lab_intervals()
    got = _by_initiator(io_samples(io_plan(d), devs, {}))
    assert set(got) == {INI0, INI1, NVME_HOST}
    for ini, dev in ((INI0, "dm-0"), (INI1, "dm-1"), (NVME_HOST, "dm-2")):
        iv, s = devs[dev], got[ini]
        assert s.resource == VG
        assert s.ios == iv.reads + iv.writes and s.reads == iv.reads
        assert s.bytes == iv.read_bytes + iv.write_bytes
        assert s.read_latency_s == iv.read_latency_s
        assert s.latency_s == pytest.approx(
            (iv.read_ticks_ms + iv.write_ticks_ms) / 1000 / (iv.reads + iv.writes)
        )
    assert got[INI0].reads > 50 and 0 < got[INI0].read_latency_s < 0.01  # fio's reader
    assert got[INI1].reads == 0 and got[INI1].read_latency_s is None  # the writer
    assert got[INI1].latency_s is not None and got[INI1].bytes > 1e6


def test_shared_with_acl_counters_the_header_example():
    """dm-1 used by 10.0.0.3 (an ACL) and 10.0.0.4, 10.0.0.5 (generated ACLs): 300 reads
    at 4 ms and 100 writes; the ACL counted 120 commands and 1 MiB written."""
    ini = "iqn.2024-01.com.example:db1"
    tpg0, d = _cluster("10.0.0.4", "10.0.0.5", acl=(ini, "10.0.0.3", 774, 0, 44))
    tpg1, _ = _cluster("10.0.0.4", "10.0.0.5", acl=(ini, "10.0.0.3", 894, 0, 45))
    acl = acl_deltas(acl_counters([tpg0], d.exports), acl_counters([tpg1], d.exports))
    assert acl == {("10.0.0.3", "dm-1"): (120.0, float(MIB))}
    iv = _iv("dm-1", 300, 100, 1200, 300, 300 * 4096, 100 * 65536)
    got = _by_initiator(io_samples(io_plan(d), {"dm-1": iv}, acl))
    a, b, c = got["10.0.0.3"], got["10.0.0.4"], got["10.0.0.5"]
    assert (a.ios, a.bytes, a.reads) == (120.0, float(MIB), 90.0)  # 120 x 300/400 reads
    assert (b.ios, b.reads) == (c.ios, c.reads) == (140.0, 105.0)  # the rest, halved
    assert b.bytes == c.bytes == (300 * 4096 + 100 * 65536 - MIB) / 2
    for s in (a, b, c):  # the device's latencies: LIO times nothing per ACL
        assert s.read_latency_s == pytest.approx(0.004)
        assert s.latency_s == pytest.approx(1.5 / 400)
    assert sum(s.ios for s in (a, b, c)) == 400 and sum(s.reads for s in (a, b, c)) == 300


def test_shared_without_counters_an_equal_share_of_the_device():
    _tpg, d = _cluster("10.0.0.4", "10.0.0.5", "10.0.0.6")
    assert d.device_writers["dm-1"][1] == "shared"
    iv = _iv("dm-1", 30, 60, 300, 120, 30 * 4096, 60 * 8192)
    got = io_samples(io_plan(d), {"dm-1": iv}, {})
    assert [s.initiator for s in got] == ["10.0.0.4", "10.0.0.5", "10.0.0.6"]
    for s in got:
        assert (s.ios, s.reads, s.bytes) == (30.0, 10.0, (30 * 4096 + 60 * 8192) / 3)
        assert s.read_latency_s == pytest.approx(0.010)
        assert s.latency_s == pytest.approx(0.420 / 90)
    idle = io_samples(io_plan(d), {"dm-1": _iv("dm-1", 0, 0, 0, 0)}, {})
    assert idle == []  # no IOs: no samples


def test_a_device_that_vanished_gives_its_users_no_samples(lab_tpgs):
    d = _lab_discovery(lab_tpgs)
    s0 = parse_diskstats((LAB / "proc" / "diskstats.0").read_text())
    text = (LAB / "proc" / "diskstats.1").read_text()
    s1 = parse_diskstats("".join(x + "\n" for x in text.splitlines() if " dm-2 " not in x))
    res = interval(s0, s1, 1.0)
    assert res.disappeared == ["dm-2"]
    got = _by_initiator(io_samples(io_plan(d), res.devices, {}))
    assert set(got) == {INI0, INI1}  # the NVMe host's namespace is gone: no sample


def test_counters_that_wrap_or_reset():
    """diskstats: a 32-bit wrap is an interval, a reset is none (no sample); an ACL
    counter that went back makes its initiator one without counters for the interval."""
    _tpg, d = _cluster("10.0.0.4")
    plan = io_plan(d)
    line = "253 1 dm-1 {r} 0 {rs} {rt} 0 0 0 0 0 0 0"
    old = parse_diskstats(line.format(r=WRAP_32 - 10, rs=800, rt=WRAP_32 - 100))
    new = parse_diskstats(line.format(r=20, rs=1040, rt=200))
    (s,) = io_samples(plan, interval(old, new, 1.0).devices, {})
    assert (s.ios, s.reads, s.bytes) == (30, 30, 240 * 512)
    assert s.read_latency_s == pytest.approx(0.300 / 30)
    big = parse_diskstats(line.format(r=WRAP_32 + 5, rs=800, rt=9))
    res = interval(big, new, 1.0)
    assert res.reset == ["dm-1"] and io_samples(plan, res.devices, {}) == []

    ini = "iqn.2024-01.com.example:db1"
    tpg0, d = _cluster("10.0.0.4", acl=(ini, "10.0.0.3", 5000, 3, 44))
    tpg1, _ = _cluster("10.0.0.4", acl=(ini, "10.0.0.3", 40, 3, 44))  # ACL re-created
    acl = acl_deltas(acl_counters([tpg0], d.exports), acl_counters([tpg1], d.exports))
    assert acl == {}
    got = io_samples(io_plan(d), {"dm-1": _iv("dm-1", 10, 10, 50, 50)}, acl)
    assert [(s.initiator, s.ios) for s in got] == [("10.0.0.3", 10.0), ("10.0.0.4", 10.0)]


def test_an_initiator_on_two_devices_is_one_sample_read_weighted():
    """10.0.0.4 uses lun0 alone and shares lun1 with 10.0.0.5: one sample on labvg, its
    reads' latency weighted by its reads on each device."""
    tpgs = _two_luns()
    conns = [TcpConn("10.0.0.11", 3260, "10.0.0.4", 1), TcpConn("10.0.0.12", 3260, "10.0.0.4", 2),
             TcpConn("10.0.0.12", 3260, "10.0.0.5", 3)]  # fmt: skip
    plan = io_plan(build_discovery(lio=tpgs, conns=conns, lvs=LVS))
    assert plan.several == {(VG, "10.0.0.4")}
    devs = {"dm-0": _iv("dm-0", 30, 0, 30, 0), "dm-1": _iv("dm-1", 20, 0, 200, 0)}
    got = _by_initiator(io_samples(plan, devs, {}))
    a, b = got["10.0.0.4"], got["10.0.0.5"]
    assert (a.ios, a.reads) == (40.0, 40.0)  # 30 alone + half of 20
    assert a.read_latency_s == pytest.approx((30 * 0.001 + 10 * 0.010) / 40)
    assert (b.ios, b.read_latency_s) == (10.0, pytest.approx(0.010))
    assert io_samples(plan, devs, {}, resources={"other"}) == []  # only those asked


def test_an_acl_with_two_addresses_splits_its_counts():
    c0 = AclCount(("10.0.0.3", "10.0.0.30"), "dm-1", 100, 0, 0)
    c1 = AclCount(("10.0.0.3", "10.0.0.30"), "dm-1", 300, MIB, 3 * MIB)
    key = ("iqn.t", 1, "iqn.i", 0)
    assert acl_deltas({key: c0}, {key: c1}) == {
        ("10.0.0.3", "dm-1"): (100.0, 2.0 * MIB),
        ("10.0.0.30", "dm-1"): (100.0, 2.0 * MIB),
    }


# -- names ----------------------------------------------------------------------------


def test_names_from_lio_acls_and_dynamic_sessions(lab_tpgs):
    """The lab: ini1's explicit ACL names 10.0.0.3; lun0's generated ACLs list ini0's
    session, and one address (10.0.0.2) is connected to that target."""
    assert [t.dynamic_sessions for t in lab_tpgs] == [(IQN_INI0,), ()]
    d = _lab_discovery(lab_tpgs)
    assert initiator_names(d, lab_tpgs, {}) == {INI0: (IQN_INI0,), INI1: (IQN_INI1,)}
    # a second peer on lun0's portal: whose session is ini0's is unknown
    conns = parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420])
    conns.append(TcpConn(META["iscsi"][0]["portal"], 3260, "10.0.0.9", 50000))
    d2 = build_discovery(lio=lab_tpgs, conns=conns, lvs=LVS)
    assert initiator_names(d2, lab_tpgs, {}) == {INI1: (IQN_INI1,)}


def test_dynamic_sessions_file(tmp_path):
    f = tmp_path / "dynamic_sessions"
    f.write_bytes(b"iqn.a:x\n\x00iqn.b:y\n\x00iqn.a:x\n\x00")  # two sessions of iqn.a:x
    assert _session_names(f) == ("iqn.a:x", "iqn.b:y")
    f.write_bytes(b"")
    assert _session_names(f) == ()
    assert _session_names(tmp_path / "absent") == ()


def _debugfs(root: Path, ctrls: dict[str, tuple[str, str]]) -> Path:
    """<root>/nvmet/<subsystem>/ctrl<N>/{hostnqn,host_traddr,...} as the kernel makes it."""
    for name, (nqn, traddr) in ctrls.items():
        sub, ctrl = name.split("/")
        d = root / "nvmet" / sub / ctrl
        d.mkdir(parents=True)
        (d / "hostnqn").write_text(nqn)  # seq_puts: no newline
        (d / "host_traddr").write_text(traddr + "\n")
        (d / "port").write_text("1\n")
        (d / "kato").write_text("5000\n")
        (d / "state").write_text("ready\n")
    return root


def test_nvmet_host_names_from_debugfs(tmp_path):
    root = _debugfs(tmp_path / "debug", {
        f"{NVME_NQN}/ctrl1": (HOSTNQN, NVME_HOST),
        f"{NVME_NQN}/ctrl2": (HOSTNQN, NVME_HOST),  # its second connection
        "nqn.x:other/ctrl7": ("nqn.2014-08.org.nvmexpress:uuid:b", "::ffff:10.0.0.32"),
        "nqn.x:other/ctrl8": ("nqn.2014-08.org.nvmexpress:uuid:c", ""),  # no address yet
        "nqn.x:other/ctrl9": ("", "10.0.0.33"),  # no name
    })  # fmt: skip
    (root / "nvmet" / "nqn.x:other" / "notctrl").mkdir()
    ctrls = debugfs_controllers(root)
    assert [c.name for c in ctrls] == ["ctrl1", "ctrl2", "ctrl7", "ctrl8", "ctrl9"]
    assert debugfs_hosts(ctrls) == {
        NVME_HOST: (HOSTNQN,),
        "10.0.0.32": ("nqn.2014-08.org.nvmexpress:uuid:b",),
    }
    assert debugfs_controllers(tmp_path / "no-debugfs") == []


@pytest.mark.parametrize(
    ("text", "want"),
    [("10.0.0.31", "10.0.0.31"), ("10.0.0.31:4420", "10.0.0.31"), ("fd00::1", "fd00::1"),
     ("[fd00::1]:4420", "fd00::1"), ("::ffff:10.0.0.1", "10.0.0.1"), ("fe80::1%eth1", "fe80::1"),
     ("", None), ("garbage", None), ("10.0.0.999", None)],
)  # fmt: skip
def test_host_address(text, want):
    assert host_address(text) == want


# -- TargetSensor -------------------------------------------------------------------


class FakeConns:
    def __init__(self, conns):
        self.conns = conns

    def connections(self):
        return self.conns


def _acl_stats(root: Path) -> Path:
    t = META["acl_target"]
    return (root / "configfs" / "target" / "iscsi" / t / "tpgt_1" / "acls" / IQN_INI1 / "lun_0"
            / "statistics" / "scsi_auth_intr")  # fmt: skip


def _again(text0: str, text1: str) -> str:
    """diskstats one interval later, each counter moved as from text0 to text1."""
    out = []
    for a, b in zip(text0.splitlines(), text1.splitlines(), strict=True):
        fa, fb = a.split(), b.split()
        moved = [str(2 * int(y) - int(x)) for x, y in zip(fa[3:], fb[3:], strict=True)]
        out.append(" ".join(fb[:3] + moved))
    return "\n".join(out) + "\n"


def test_target_sensor_io_samples_and_names_from_the_lab_tree(tmp_path):
    """The lab tree, lun1's TPG made to generate ACLs too and a second host on its
    portal: dm-1 is shared by the ACL's writer and 10.0.0.9. The ACL counters move
    between the two convergences; nvmet's debugfs names the NVMe host."""
    root = tmp_path / "lab"
    shutil.copytree(LAB, root, symlinks=True)
    tpg = root / "configfs" / "target" / "iscsi" / META["acl_target"] / "tpgt_1"
    (tpg / "attrib" / "generate_node_acls").write_text("1\n")
    conns = parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420])
    conns.append(TcpConn(META["iscsi"][1]["portal"], 3260, "10.0.0.9", 50000))
    now = [100.0]
    s = TargetSensor(
        proc_root=root / "proc",
        sys_root=root / "sys",
        configfs_root=root / "configfs",
        debugfs_root=_debugfs(tmp_path / "debug", {f"{NVME_NQN}/ctrl1": (HOSTNQN, NVME_HOST)}),
        clock=lambda: now[0],
        connections=FakeConns(conns),
    )
    stats = _acl_stats(root)
    diskstats = root / "proc" / "diskstats"

    def converge(text: str, cmds: int, write_mib: int) -> list:
        diskstats.write_text(text)
        (stats / "num_cmds").write_text(f"{cmds}\n")
        (stats / "write_mbytes").write_text(f"{write_mib}\n")
        s.converge()
        now[0] += 1.0
        return s.io_samples

    text0, text1 = ((LAB / "proc" / f"diskstats.{k}").read_text() for k in (0, 1))
    assert converge(text0, 774, 44) == []  # primes
    assert s.initiator_names() == {
        INI0: (IQN_INI0,),  # lun0: one address, one dynamic session
        INI1: (IQN_INI1,),  # the ACL (lun1 has two addresses now: no dynamic pairing)
        NVME_HOST: (HOSTNQN,),
    }
    assert converge(text1, 874, 49) == []  # nobody asked for any resource's
    s.want_io_samples([VG])
    # the lab's second as the next one: every counter moved as from .0 to .1
    got = _by_initiator(converge(_again(text0, text1), 974, 54))
    got = _by_initiator(s.io_samples)
    assert set(got) == {INI0, INI1, "10.0.0.9", NVME_HOST}
    devs = _lab_intervals()
    w = devs["dm-1"]  # the writer's device: 123 writes, 15744 sectors, 192 ms
    assert (got[INI1].ios, got[INI1].bytes) == (100.0, 5.0 * MIB)  # its ACL counters
    assert got["10.0.0.9"].ios == w.writes - 100  # the rest of the device
    assert got["10.0.0.9"].bytes == w.write_bytes - 5 * MIB
    for ini in (INI1, "10.0.0.9"):
        assert got[ini].latency_s == pytest.approx(w.write_ticks_ms / 1000 / w.writes)
        assert got[ini].reads == 0 and got[ini].read_latency_s is None
    assert got[INI0].reads == devs["dm-0"].reads  # alone on lun0: its device
    assert got[NVME_HOST].read_latency_s == devs["dm-2"].read_latency_s


def test_an_initiators_own_lun_gives_its_busy_time_a_shared_one_none(lab_tpgs):
    """The lab's captured second: each initiator alone on its LV has that LV's io_ticks
    as its busy time (dm-0 80 ms, dm-1 192, dm-2 264); users of one device have none;
    on its own LUN and a shared one, none either."""
    d = _lab_discovery(lab_tpgs)
    got = _by_initiator(io_samples(io_plan(d), _lab_intervals(), {}))
    assert got[INI0].busy_s == pytest.approx(0.080)
    assert got[INI1].busy_s == pytest.approx(0.192)
    assert got[NVME_HOST].busy_s == pytest.approx(0.264)
    _tpg, d = _cluster("10.0.0.4", "10.0.0.5")
    shared = io_samples(io_plan(d), {"dm-1": _iv("dm-1", 30, 0, 300, 0)}, {})
    assert [s.busy_s for s in shared] == [None, None]
    tpgs = _two_luns()
    two = [TcpConn("10.0.0.11", 3260, "10.0.0.4", 1), TcpConn("10.0.0.12", 3260, "10.0.0.4", 2)]
    mixed = [*two, TcpConn("10.0.0.12", 3260, "10.0.0.5", 3)]
    devs = {
        "dm-0": DevInterval("dm-0", 1.0, 30, 0, 0, 0, 30, 0, 0, 100, 30),
        "dm-1": DevInterval("dm-1", 1.0, 20, 0, 0, 0, 200, 0, 0, 150, 200),
    }
    own = _by_initiator(
        io_samples(io_plan(build_discovery(lio=tpgs, conns=two, lvs=LVS)), devs, {})
    )
    assert own["10.0.0.4"].busy_s == pytest.approx(0.25)  # both its own: their sum
    plan = io_plan(build_discovery(lio=tpgs, conns=mixed, lvs=LVS))
    assert _by_initiator(io_samples(plan, devs, {}))["10.0.0.4"].busy_s is None
