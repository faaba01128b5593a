"""appliance/sensing/bridge.py: the wire's segments become the controller's samples.

The capture is a scripted one behind the interface bridge/capture.py's Ring
implements (tested on real veths in tests/privileged/test_bridge_capture.py and
with the daemon in tests/privileged/test_bridge_daemon.py)."""

from __future__ import annotations

import threading

import pytest

from santhrottle.appliance.sensing.bridge import WIRE, BridgeSensor, CaptureDown
from santhrottle.bridge.capture import CaptureCounters
from santhrottle.bridge.kernel import Conn
from tests.unit import storage_pdus as B

INI, INI2, TGT = "10.0.0.2", "10.0.0.3", "10.0.0.9"
IQN = "iqn.2026-11.lab:array"


class ScriptedCapture:
    """Hands over the segments queued with feed(), in order, under the sensor's lock."""

    def __init__(self) -> None:
        self.counters = CaptureCounters()
        self.queue: list[tuple] = []
        self.cv = threading.Condition()
        self.fail: OSError | None = None
        self.closed = False

    def feed(self, *segments: tuple) -> None:
        with self.cv:
            self.queue.extend(segments)
            self.cv.notify_all()
            assert self.cv.wait_for(lambda: not self.queue, timeout=10), "not consumed"

    def poll(self, timeout_ms, segment, guard=None, esp=None):
        with self.cv:
            if self.fail is not None:
                raise self.fail
            if not self.queue:
                self.cv.wait(timeout_ms / 1000)
            batch, self.queue = self.queue, []
            with guard:
                for s in batch:
                    self.counters.segments += 1
                    segment(*s)
            self.cv.notify_all()
            return 1 if batch else 0

    def kernel_stats(self):
        return 0, 0

    def close(self):
        self.closed = True


class Wire:
    """Segments of one TCP connection, both directions, with their sequence numbers."""

    def __init__(self, port: int, sport: int = 40000, ini: str = INI) -> None:
        self.port, self.sport, self.ini = port, sport, ini
        self.seq = {True: 1000, False: 5000}

    def syn(self) -> list[tuple]:
        return [
            (0.0, self.ini, self.sport, TGT, self.port, 999, b"", True, False),
            (0.0, TGT, self.port, self.ini, self.sport, 4999, b"", True, False),
        ]

    def send(self, t: float, data: bytes, to_target: bool) -> tuple:
        seq = self.seq[to_target]
        self.seq[to_target] = seq + len(data)
        if to_target:
            return (t, self.ini, self.sport, TGT, self.port, seq, data, False, False)
        return (t, TGT, self.port, self.ini, self.sport, seq, data, False, False)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def rig():
    caps: list[ScriptedCapture] = []
    clock = Clock()

    def open_capture(port: str) -> ScriptedCapture:
        assert port == "eth-array"
        caps.append(ScriptedCapture())
        return caps[-1]

    resources = {
        "fast": [f"iscsi://{TGT}/{IQN}/*"],
        "slow": [f"nvme://{TGT}/*/1"],
    }
    s = BridgeSensor(port="eth-array", resources=resources, open_capture=open_capture,
                     clock=clock, sensor="capture")  # fmt: skip
    s.start()
    try:
        yield s, caps, clock
    finally:
        s.close()


def _iscsi_session(w: Wire) -> list[tuple]:
    return [*w.syn(), w.send(0.0, B.login_request(IQN), True)]


def test_a_tick_gives_every_resource_its_reads_and_the_read_weighted_mean(rig):
    s, caps, clock = rig
    w = Wire(3260)
    caps[0].feed(
        *_iscsi_session(w),
        w.send(1.000, B.scsi_read(1, lun=0) + B.scsi_read(2, lun=5), True),
        w.send(1.004, B.data_in(1, b"r" * 512), False),
        w.send(1.010, B.data_in(2, b"r" * 512), False),
    )
    clock.t += 0.1
    got = {r.resource: r for r in s.read_samples()}
    assert got["fast"].reads == 2
    assert got["fast"].read_latency_s == pytest.approx(0.007)
    # the NVMe resource had no reads and none in flight: idle, not stalled
    assert got["slow"].reads == 0 and got["slow"].reads_in_flight == 0
    assert s.device_samples() == []


def test_a_resource_without_completions_reports_its_reads_in_flight(rig):
    s, caps, clock = rig
    w = Wire(4420)
    caps[0].feed(*w.syn(), w.send(1.0, B.capsule_cmd(7, opcode=0x02, nsid=1), True))
    clock.t += 0.1
    got = {r.resource: r for r in s.read_samples()}
    assert got["slow"].reads == 0 and got["slow"].reads_in_flight == 1


def test_a_convergence_names_each_initiators_resources_and_write_rates(rig):
    s, caps, clock = rig
    a, b = Wire(3260), Wire(3260, 40001, ini=INI2)
    caps[0].feed(
        *_iscsi_session(a),
        *_iscsi_session(b),
        a.send(1.0, B.scsi_write(1, lun=0, nbytes=400_000), True),
        b.send(1.0, B.scsi_read(1, lun=0), True),
    )
    clock.t += 2.0
    disc, writes = s.converge()
    assert set(disc.resources) == {"fast", "slow"}
    assert disc.initiators[INI].resources == {"fast"}
    assert disc.initiators[INI].write_sources == {"fast": WIRE}
    assert disc.initiators[INI2].resources == {"fast"}
    assert [(w.resource, w.initiator, w.write_bps) for w in writes] == [("fast", INI, 200_000.0)]
    # the groups' samples of the same convergence: INI's write and INI2's read are in
    # flight (no IO completed), INI's bytes are counted
    assert [(i.resource, i.initiator, i.bytes, i.ios) for i in s.io_samples] == [
        ("fast", INI, 400_000, 0)
    ]
    rows = s.volume_rows()
    assert [r.name for r in rows] == [f"iscsi://{TGT}:3260/{IQN}/0"]
    assert rows[0].initiators == (INI, INI2) and rows[0].resources == ("fast",)


def test_a_volume_in_no_resource_is_listed_but_counted_nowhere(rig):
    s, caps, clock = rig
    w = Wire(4420)
    caps[0].feed(
        *w.syn(),
        w.send(1.0, B.capsule_cmd(3, opcode=0x02, nsid=9), True),
        w.send(1.002, B.capsule_resp(3), False),
    )
    clock.t += 0.1
    assert all(r.reads == 0 for r in s.read_samples())
    (row,) = s.volume_rows()
    assert row.name == f"nvme://{TGT}:4420/*/9" and row.resources == ()
    assert row.reads == 1 and row.read_latency_s == pytest.approx(0.002)
    disc, _ = s.converge()
    assert disc.initiators[INI].resources == set()


def test_a_reload_regroups_the_volumes(rig):
    s, caps, clock = rig
    s.reconfigure({"everything": [f"nvme://{TGT}/*/*", f"iscsi://{TGT}/*/*"]})
    w = Wire(4420)
    caps[0].feed(
        *w.syn(),
        w.send(1.0, B.capsule_cmd(3, opcode=0x02, nsid=9), True),
        w.send(1.003, B.capsule_resp(3), False),
    )
    clock.t += 0.1
    (r,) = s.read_samples()
    assert (r.resource, r.reads) == ("everything", 1)


def test_a_failed_capture_is_a_sensor_error_until_it_is_open_again(rig, monkeypatch):
    s, caps, clock = rig
    monkeypatch.setattr("santhrottle.appliance.sensing.bridge.REOPEN_S", 0.01)
    caps[0].counters.frames = 5
    with caps[0].cv:
        caps[0].fail = OSError(19, "No such device")
    deadline = threading.Event()
    for _ in range(500):  # the thread notices within one poll, then opens a new capture
        if len(caps) > 1 or not s.running:
            break
        deadline.wait(0.01)
    assert caps[0].closed
    for _ in range(500):
        if len(caps) > 1 and s.running:
            break
        with pytest.raises(CaptureDown, match="capture on eth-array: No such device"):
            s.read_samples()
        deadline.wait(0.01)
    assert len(caps) == 2 and s.running
    clock.t += 0.1
    assert len(s.read_samples()) == 2
    assert s.counters()["capture_frames"] == 5  # the first capture's counts are kept


def test_a_tick_too_soon_after_the_last_gives_nothing(rig):
    s, _, clock = rig
    clock.t += 0.1
    assert s.read_samples()
    assert s.read_samples() == []  # no time has passed


def test_target_names_outlive_a_restart_through_the_names_file(tmp_path):
    """The first sensor sees the login and saves the name; the second, started in
    mid-session (no SYN, no login), names the volume from the file; a broken file
    names nothing and is no error."""
    names = tmp_path / "state" / "wire-names.json"
    w = Wire(3260)
    caps: list[ScriptedCapture] = []

    def sensor(**kw) -> BridgeSensor:
        def open_capture(_port):
            caps.append(ScriptedCapture())
            return caps[-1]

        s = BridgeSensor(port="p", resources={"a": [f"iscsi://{TGT}/{IQN}/*"]},
                         open_capture=open_capture, clock=Clock(), sensor="capture",
                         **kw)  # fmt: skip
        s.start()
        return s

    first = sensor(names_path=names)
    try:
        caps[-1].feed(*_iscsi_session(w), w.send(1.0, B.scsi_read(1, lun=0), True))
        first.converge()
    finally:
        first.close()
    assert names.exists()

    def mid_session(s: BridgeSensor) -> str:
        try:
            caps[-1].feed(w.send(2.0, B.scsi_read(2, lun=0), True))
            (row,) = s.volume_rows()
            return row.name
        finally:
            s.close()

    assert mid_session(sensor(names_path=names, save_names=False)) == (
        f"iscsi://{TGT}:3260/{IQN}/0"
    )
    names.write_text("{not json")
    assert mid_session(sensor(names_path=names)) == f"iscsi://{TGT}:3260/*/0"


def test_a_port_that_cannot_be_read_fails_the_start_with_one_line():
    def refuse(_port):
        raise OSError(19, "No such device")

    s = BridgeSensor(port="eth9", resources={}, open_capture=refuse, sensor="capture")
    with pytest.raises(CaptureDown, match=r"^cannot capture on eth9: No such device$"):
        s.start()
    s.close()


def test_the_kernel_sensor_first_the_capture_when_it_cannot_load(caplog):
    """auto: the in-kernel sensor when it loads (its sums are the samples), else one
    warning and the capture; kernel: one line, no capture."""
    from santhrottle.bridge.kernel import KernelWireError, VolumeSums
    from tests.unit.test_bridge_ksums import C, FakeWire

    def refused(_port):
        raise KernelWireError("the kernel refused wire.bpf.o: no BPF here")

    caps: list[ScriptedCapture] = []

    def open_capture(_port):
        caps.append(ScriptedCapture())
        return caps[-1]

    s = BridgeSensor(port="eth9", resources={"a": ["iscsi://10.0.0.11/*/*"]},
                     open_capture=open_capture, open_kernel=refused)  # fmt: skip
    s.start()
    try:
        assert s.kind == "capture" and len(caps) == 1
        assert "cannot run (the kernel refused wire.bpf.o: no BPF here)" in caplog.text
    finally:
        s.close()
    k = BridgeSensor(port="eth9", resources={}, open_capture=open_capture,
                     open_kernel=refused, sensor="kernel")  # fmt: skip
    with pytest.raises(CaptureDown, match=r"^cannot read eth9 in the kernel: the kernel"):
        k.start()
    assert len(caps) == 1, "no capture was opened"
    wire = FakeWire()
    clock = Clock()
    w = BridgeSensor(port="eth9", resources={"a": ["iscsi://10.0.0.11/*/*"]},
                     open_capture=open_capture, open_kernel=lambda _p: wire,
                     clock=clock)  # fmt: skip
    w.start()
    try:
        assert w.kind == "kernel" and w.running
        clock.t += 0.1
        wire.sums[C, 0] = VolumeSums(reads=4, read_ns=40_000_000, write_bytes=0)
        (sample,) = w.read_samples()
        assert (sample.resource, sample.reads) == ("a", 4)
        assert abs(sample.read_latency_s - 0.010) < 1e-9
        assert w.counters()["capture_frames"] == 10 and "kernel_frames" in w.counters()
        assert w.counters()["kernel_flows_evicted"] == 0  # the flow walks', none dropped
        # the volume busy 50 ms of the next 100 ms tick (the program's closed spans,
        # bridge/kbusy.py): the resource's utilization, as the capture's tracker gives it
        clock.t += 0.1
        wire.sums[C, 0] = VolumeSums(reads=4, read_ns=40_000_000, write_bytes=0,
                                     busy_ns=50_000_000)  # fmt: skip
        w.read_samples()
        (u,) = w.utilization_samples()
        assert (u.resource, u.span_s) == ("a", pytest.approx(0.1))
        assert u.utilization == pytest.approx(0.5)
        # the port made anew: the program goes on it again; until it can, the ticks fail
        wire.on_port = False
        wire.reattach_error = KernelWireError("no device eth9")
        clock.t += 1.5
        with pytest.raises(CaptureDown, match="in-kernel wire sensor on eth9: no device eth9"):
            w.read_samples()
        assert not w.running
        wire.reattach_error = None
        clock.t += 1.5
        assert [x.resource for x in w.read_samples()] == ["a"] and w.running
    finally:
        w.close()


def test_initiator_names_from_the_logins_outlive_a_restart_in_their_own_file(tmp_path, caplog):
    """The names initiators logged in with: from the sensor, in the discovery's views
    and in the daemon's volume list; saved beside the target names and read back by a
    sensor started in mid-session (by either walker); a broken file is a warning."""
    from types import SimpleNamespace

    from santhrottle.appliance.daemon.status import build as view
    from santhrottle.appliance.sensing.wirenames import INITIATORS_FILE
    from santhrottle.bridge.kernel import VolumeSums
    from tests.unit.test_bridge_ksums import FakeWire

    names = tmp_path / "state" / "wire-names.json"
    host = "iqn.2026-11.lab:db1"
    w = Wire(3260)
    caps: list[ScriptedCapture] = []

    def sensor(**kw) -> BridgeSensor:
        def open_capture(_port):
            caps.append(ScriptedCapture())
            return caps[-1]

        kw.setdefault("sensor", "capture")
        s = BridgeSensor(port="p", resources={"a": [f"iscsi://{TGT}/*/*"]},
                         open_capture=open_capture, clock=Clock(), names_path=names,
                         **kw)  # fmt: skip
        s.start()
        return s

    first = sensor()
    try:
        caps[-1].feed(*w.syn(), w.send(0.0, B.login_request(IQN, initiator=host), True),
                      w.send(1.0, B.scsi_read(1, lun=0), True))  # fmt: skip
        assert first.initiator_names() == {INI: (host,)}
        disc, _ = first.converge()
        assert disc.initiators[INI].names == {host}
        cfg = SimpleNamespace(bridge_mode=True, controller=SimpleNamespace(tick_s=0.1))
        (row,) = view.volumes(SimpleNamespace(bridge=first, config=cfg))  # type: ignore[arg-type]
        assert row["initiator_names"] == {INI: [host]}
    finally:
        first.close()
    saved = tmp_path / "state" / INITIATORS_FILE
    assert saved.exists()

    def mid_session(s: BridgeSensor) -> dict[str, tuple[str, ...]]:
        try:
            caps[-1].feed(w.send(2.0, B.scsi_read(2, lun=0), True))  # no SYN, no login
            return s.initiator_names()
        finally:
            s.close()

    assert mid_session(sensor(save_names=False)) == {INI: (host,)}
    wire = FakeWire()
    k = sensor(sensor="kernel", open_kernel=lambda _p: wire)
    try:  # the in-kernel walker's sessions are named from the same file
        wire.sums[Conn(INI, TGT, 40000, 3260), 0] = VolumeSums(1, 1000, 0)
        k.converge()
        assert k.initiator_names() == {INI: (host,)}
    finally:
        k.close()
    saved.write_text("[[1, 2]]")
    assert mid_session(sensor()) == {}  # known by its address only
    assert "cannot use the saved initiator names" in caplog.text


def test_a_resource_mostly_out_of_sync_holds_its_class(rig):
    """Three sessions to the resource's target: one in sync reads, two walk into bytes
    that are no header. The resource's connections are mostly out of sync: its tick
    shows no reads and reads in flight (the controller holds the class), not the one
    session's partial sample."""
    s, caps, clock = rig
    ws = [Wire(3260, sport=40000 + k) for k in range(3)]
    for w in ws:
        caps[0].feed(*_iscsi_session(w))
    caps[0].feed(*(w.send(1.0, B.scsi_read(1, lun=0), True) for w in ws))
    caps[0].feed(ws[0].send(1.004, B.data_in(1, b"r" * 512), False),
                 *(w.send(1.004, B.data_in(1, b"r" * 512) + b"\xff" * 300, False)
                   for w in ws[1:]))  # fmt: skip
    clock.t += 1.0
    s.converge()
    assert s.held == {"fast"}
    got = {r.resource: r for r in s.read_samples()}
    assert got["fast"].reads == 0 and got["fast"].reads_in_flight >= 1
    rows = [r for r in s.sync() if r.direction == "to_initiator"]
    assert sorted(r.state for r in rows) == ["in sync", "out of sync", "out of sync"]
    assert s.counters()["walk_desyncs"] == 2
