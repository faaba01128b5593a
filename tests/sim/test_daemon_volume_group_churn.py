"""A volume group appearing and disappearing under the daemon (issue 46 item 11).

The host kernel has no device-mapper (`lvcreate`: "Required device-mapper target(s)
not detected in your kernel"), so the volume group comes and goes in a sysfs and a
/proc/diskstats of the test's own, read by the real TargetSensor (LvmScanner,
DiskstatsReader) inside the daemon in virtual time: the same files the kernel would
show for an LV `churnvg/lun0` (dm-7) behind a LIO LUN that 10.0.0.4 writes to."""

from __future__ import annotations

import shutil
from pathlib import Path

from santhrottle.appliance.sensing.conns import TcpConn
from santhrottle.appliance.sensing.lio import LioLun, LioTpg
from santhrottle.appliance.sensing.target import TargetSensor
from tests.unit.test_daemon import make, run_for, status_of
from tests.unit.test_sensing import FakeConns

CONF = """
[datapath]
devices = ["eth1"]
[controller]
class_hysteresis = 0
default_threshold = "10ms"
"""


class Host:
    """sysfs and /proc/diskstats of a host whose VG can be created and removed."""

    def __init__(self, root: Path, vt) -> None:
        self.sys, self.proc, self.vt = root / "sys", root / "proc", vt
        (self.sys / "block").mkdir(parents=True)
        self.proc.mkdir()
        self.present = False
        self.write_diskstats()

    def create_vg(self) -> None:
        dm = self.sys / "block" / "dm-7"
        (dm / "dm").mkdir(parents=True)
        (dm / "slaves").mkdir()
        (dm / "slaves" / "loop0").touch()
        (dm / "dev").write_text("253:7\n")
        (dm / "dm" / "name").write_text("churnvg-lun0\n")
        (dm / "dm" / "uuid").write_text("LVM-" + "x" * 64 + "\n")
        self.present = True

    def remove_vg(self) -> None:
        shutil.rmtree(self.sys / "block" / "dm-7")
        self.present = False

    def write_diskstats(self) -> None:
        """Reads at 30 ms and 450 writes/s of 128 KiB while the VG is there."""
        t = self.vt.now - 1000.0
        r, w = int(50 * t), int(450 * t)
        line = "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0\n"
        if self.present:
            line += f" 253 7 dm-7 {r} 0 {r * 8} {r * 30} {w} 0 {w * 256} {w * 20} 0 1 1\n"
        (self.proc / "diskstats").write_text(line)


def test_a_volume_group_that_comes_and_goes_leaves_nothing_behind(tmp_path):
    d, vt, _s, act = make(CONF)
    host = Host(tmp_path, vt)
    tpg = LioTpg(
        "iscsi",
        "iqn.t:lun0",
        1,
        True,
        True,
        (("10.0.0.11", 3260),),
        (LioLun(0, "block/lun0", "/dev/churnvg/lun0"),),
        (),
    )
    sensor = TargetSensor(
        proc_root=host.proc,
        sys_root=host.sys,
        configfs_root=tmp_path / "no-configfs",
        debugfs_root=tmp_path / "no-debugfs",
        clock=vt.clock,
        connections=FakeConns([TcpConn("10.0.0.11", 3260, "10.0.0.4", 40000)]),
    )
    sensor.lio = type("Lio", (), {"last_skipped": (), "scan": lambda self: [tpg]})()
    d.sensors = sensor

    def run(seconds: float) -> None:
        end = vt.now + seconds
        while vt.now < end:
            host.write_diskstats()
            run_for(d, vt, 0.5)

    run(3.0)
    assert [r["resource"] for r in status_of(d)["resources"]] == []  # no VG yet
    for _round in range(3):
        host.create_vg()
        run(8.0)
        st = status_of(d)
        (vg,) = st["resources"]
        assert vg["resource"] == "churnvg" and vg["devices"] == ["dm-7"]
        assert vg["delay_class"] > 0 and "10.0.0.4" in vg["members"]
        assert act.kernel.get("10.0.0.4", (0, ""))[0] > 0  # the writer is delayed
        host.remove_vg()
        run(4.0)
        st = status_of(d)
        assert st["resources"] == []  # gone with its devices
        assert "10.0.0.4" not in act.kernel  # no delay outlives the resource
        assert d.ctl.resources == {} and d.ctl.effective == {}
    c = status_of(d)["counters"]
    assert c["sensor_errors"] == 0 and c["actuator_errors"] == 0
