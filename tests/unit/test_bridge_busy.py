"""The wire's utilization (bridge/busy.py): per volume, the time with a command in flight,
kept by the tracker (bridge/tracker.py) and turned into a resource's by the sensor."""

import pytest

from santhrottle.appliance.sensing.bridge import _utilization
from santhrottle.bridge import tracker as T
from santhrottle.bridge.busy import Busy
from santhrottle.bridge.volumes import VolumeMap
from tests.unit import storage_pdus as B
from tests.unit.test_bridge_tracker import TGT, Conn


def test_the_worked_example():
    b: Busy[str] = Busy()
    b.up("v", 0.00)
    b.up("v", 0.01)
    b.down("v", 0.03)
    b.down("v", 0.05)
    b.up("v", 0.08)
    assert b.take(0.10) == {"v": pytest.approx(0.07)}
    assert b.take(0.20) == {"v": pytest.approx(0.10)}  # still in flight: the whole span
    b.down("v", 0.25)
    assert b.take(0.30) == {"v": pytest.approx(0.05)}
    assert b.take(0.40) == {}


def test_the_tracker_counts_every_way_a_command_leaves():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    lun = T.Volume("iscsi", f"{TGT}:3260", "", 1)  # storage_pdus: LUN 1 by default
    c.send(1.000, B.scsi_read(1) + B.scsi_read(2), True)  # two overlap: one busy span
    c.send(1.004, B.scsi_response(1), False)
    c.send(1.010, B.scsi_response(2), False)
    assert tr.busy.take(1.1) == {lun: pytest.approx(0.010)}
    c.send(1.2, B.scsi_read(3), True)
    c.send(1.3, B.scsi_read(3), True)  # a reused tag: still one command
    # a FIN: its command waits for the next connection of that key (tracker.py), busy still
    tr.segment(1.5, "10.0.0.2", 40000, TGT, 3260, 0, b"", fin_or_rst=True)
    assert tr.busy.take(2.0) == {lun: pytest.approx(0.8)}
    aged = 1.3 + T.INFLIGHT_MAX_S + T.AGE_SWEEP_S  # the orphan aged out at the sweep then
    d = Conn(tr, 3260, 40001)
    d.send(aged, B.scsi_read(1), True)
    d.send(aged + 0.5, B.scsi_response(1), False)
    assert tr.busy.take(aged + 1) == {lun: pytest.approx(aged + 0.5 - 2.0)}
    d.send(aged + 2, B.scsi_read(2), True)
    later = aged + 2 + T.INFLIGHT_MAX_S + T.AGE_SWEEP_S
    d.send(later, B.scsi_read(3), True)  # the one before aged out, this one in flight
    assert tr.busy.take(later) == {lun: pytest.approx(later - aged - 2)}
    idle = later + T.CONN_IDLE_S
    tr.segment(idle, "10.0.0.3", 40002, TGT, 3260, 0, b"")  # the sweep: d idle, forgotten
    assert tr.busy.take(idle + 1) == {lun: pytest.approx(T.CONN_IDLE_S)}
    assert tr.busy.take(idle + 2) == {}


def test_a_resource_is_as_busy_as_its_busiest_volume():
    vmap = VolumeMap({"array": ["iscsi://10.0.0.9/*/*"], "other": ["iscsi://10.0.0.8/*/*"]})
    v0 = T.Volume("iscsi", "10.0.0.9:3260", "iqn.a", 0)
    v1 = T.Volume("iscsi", "10.0.0.9:3260", "iqn.a", 1)
    got = {s.resource: s.utilization for s in _utilization(vmap, {v0: 0.03, v1: 0.07}, 0.1)}
    assert got == {"array": pytest.approx(0.7), "other": 0.0}
