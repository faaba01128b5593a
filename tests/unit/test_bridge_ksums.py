"""bridge/ksums.py: the in-kernel sensor's running totals as the tracker's per-tick and
per-convergence sums, and the names from logins and connects that come up in parts.

The wire here is a fake with KernelWire's reading interface; the real one is proved on
the host kernel in tests/privileged/test_bridge_kernel.py and test_bridge_daemon.py."""

from __future__ import annotations

import time

from santhrottle.bridge.kernel import (
    EV_BODY,
    EV_CONNECT,
    EV_LOGIN,
    Conn,
    Event,
    FlowState,
    VolumeSums,
)
from santhrottle.bridge.ksums import KernelSums
from santhrottle.bridge.tracker import ISCSI, NVME, Volume

C = Conn("10.0.0.2", "10.0.0.11", 51000, 3260)
N = Conn("10.0.0.3", "10.0.0.21", 52000, 4420)
IQN = "iqn.2003-01.org.lab:lun0"
NQN = "nqn.2003-01.org.lab:nvme0"


class FakeWire:
    def __init__(self) -> None:
        self.sums: dict[tuple[Conn, int], VolumeSums] = {}
        self.queued: list[Event] = []
        self.open: dict[tuple[Conn, int], tuple[int, int, int]] = {}
        self.digests: dict[Conn, tuple[bool, bool]] = {}
        self.limits: dict[Conn, dict[bool, int]] = {}
        self.flow_states: list[FlowState] = []
        self.forgotten: list[tuple[Conn, int]] = []
        self.retired: dict[tuple[Conn, int], tuple[int, int]] = {}
        self.esp: list = []  # kernel.EspState
        # the flow map's intake as the program counts it (each read of counters() is one)
        self.flow_counts: list[tuple[int, int]] = []

    def events(self) -> list[Event]:
        out, self.queued = self.queued, []
        return out

    def volume_sums(self) -> dict[tuple[Conn, int], VolumeSums]:
        return dict(self.sums)

    def counters(self) -> dict[str, int]:
        added, removed = self.flow_counts.pop(0) if self.flow_counts else (0, 0)
        return {"frames": 10, "segments": 7, "commands": 5, "completions": 4,
                "flows_added": added, "flows_removed": removed}  # fmt: skip

    def inflight(self) -> dict[tuple[Conn, int], tuple[int, int, int]]:
        return dict(self.open)

    def forget_sums(self, conn: Conn, volume: int) -> None:
        self.sums.pop((conn, volume), None)

    def forget_inflight(self, conn: Conn, tag: int) -> bool:
        self.forgotten.append((conn, tag))
        return self.open.pop((conn, tag), None) is not None

    def retire(self, conn: Conn, volume: int, count: int, at_ns: int) -> None:
        self.retired[conn, volume] = (count, at_ns)

    def esp_flows(self) -> list:
        return list(self.esp)

    def flows(self) -> list[FlowState]:
        return self.flow_states

    def set_login(
        self, conn: Conn, digests: tuple[bool, bool] | None, limits: dict[bool, int]
    ) -> None:
        self.digests[conn] = digests  # type: ignore[assignment]
        self.limits[conn] = limits

    def close(self) -> None:
        self.closed = True

    # the port's attachment (appliance/sensing/bridge.py checks it every second)
    on_port = True
    reattach_error: Exception | None = None

    def attached(self) -> bool:
        return self.on_port

    def reattach(self) -> None:
        if self.reattach_error is not None:
            raise self.reattach_error
        self.on_port = True


def test_what_grew_since_the_last_take_is_the_tick_and_the_convergence():
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    w.sums[C, 0] = VolumeSums(reads=10, read_ns=50_000_000, write_bytes=0)
    w.sums[C, 1 << 48] = VolumeSums(reads=0, read_ns=0, write_bytes=4096, writes=1)
    reads, writes = ks.take_tick()
    lun0, lun1 = Volume(ISCSI, "10.0.0.11:3260", "", 0), Volume(ISCSI, "10.0.0.11:3260", "", 1)
    assert reads[lun0].reads == 10 and abs(reads[lun0].mean_s - 0.005) < 1e-12
    assert writes == {lun1: 4096}
    w.sums[C, 0] = VolumeSums(reads=12, read_ns=70_000_000, write_bytes=0)
    reads, writes = ks.take_tick()
    assert reads[lun0].reads == 2 and abs(reads[lun0].mean_s - 0.010) < 1e-12 and not writes
    # the convergence sees every write since the last convergence, ticks or not
    assert ks.take_writes() == {(lun1, "10.0.0.2"): 4096}
    assert ks.take_writes() == {}
    # and every read, per initiator, since the last convergence
    per = ks.take_initiator_ios()
    assert set(per) == {(lun0, "10.0.0.2"), (lun1, "10.0.0.2")}
    assert per[lun0, "10.0.0.2"].reads == 12 and per[lun1, "10.0.0.2"].writes == 1
    assert abs(per[lun0, "10.0.0.2"].mean_s - 70e-3 / 12) < 1e-12
    assert ks.take_initiator_ios() == {}
    # a total that went down (the map's entry made anew) counts from zero
    w.sums[C, 0] = VolumeSums(reads=3, read_ns=3_000_000, write_bytes=0)
    assert ks.take_tick()[0][lun0].reads == 3
    assert ks.seen() == {lun0: {"10.0.0.2"}, lun1: {"10.0.0.2"}}
    assert (ks.counters.commands, ks.counters.completions, ks.capture.acks) == (5, 4, 3)


def test_names_come_from_a_login_whose_text_arrives_after_its_header():
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    text = f"InitiatorName=iqn.x:ini\0TargetName={IQN}\0SessionType=Normal\0".encode()
    w.queued = [
        Event(C, EV_LOGIN, True, b""),  # the header alone in its segment
        Event(C, EV_BODY, True, text[:20]),
        Event(C, EV_BODY, True, text[20:]),
        Event(
            C,
            EV_LOGIN,
            False,
            b"HeaderDigest=CRC32C\0DataDigest=None\0MaxRecvDataSegmentLength=65536\0",
            flags=0x87,
        ),
    ]
    w.sums[C, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    reads, _ = ks.take_tick()
    assert list(reads) == [Volume(ISCSI, "10.0.0.11:3260", IQN, 0)]
    assert w.digests[C] == (True, False), "set when the answer moves to full feature"
    assert w.limits[C] == {True: 65536}  # the target takes so much: to the target
    assert ks.targets() == {("10.0.0.2", 51000, "10.0.0.11", 3260): IQN}


def test_an_nvme_connect_names_its_subsystem_and_namespace_zero_is_no_volume():
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    data = bytearray(1024)
    data[256 : 256 + len(NQN)] = NQN.encode()
    w.queued = [
        Event(N, EV_CONNECT, True, bytes(data[:300])),
        Event(N, EV_BODY, True, bytes(data[300:])),
    ]
    w.sums[N, 1] = VolumeSums(reads=2, read_ns=2000, write_bytes=0)
    w.sums[N, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)  # the connect itself
    reads, _ = ks.take_tick()
    assert list(reads) == [Volume(NVME, "10.0.0.21:4420", NQN, 1)]


def test_known_targets_name_sessions_that_logged_in_before_and_old_commands_age_out():
    w = FakeWire()
    ks = KernelSums(w, {("10.0.0.2", 51000, "10.0.0.11", 3260): IQN})  # type: ignore[arg-type]
    w.sums[C, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    now_ns = time.monotonic_ns()
    w.open = {(C, 7): (now_ns - 61 * 10**9, 1, 0), (C, 8): (now_ns, 1, 0)}
    reads, _ = ks.take_tick()
    assert list(reads) == [Volume(ISCSI, "10.0.0.11:3260", IQN, 0)]
    assert w.forgotten == [(C, 7)] and ks.counters.aged == 1
    assert ks.in_flight() == {Volume(ISCSI, "10.0.0.11:3260", IQN, 0): 1}


def test_the_programs_flows_as_sync_rows_and_a_resources_out_of_sync_share():
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    d = Conn("10.0.0.3", "10.0.0.11", 51001, 3260)
    t = Conn("10.0.0.4", "10.0.0.21", 51002, 4420)
    w.flow_states = [
        FlowState(C, True, 0, 0, 0, 1, 0, 0.0, 0),
        FlowState(C, False, 2, 0, 3, 4, 1, 1.5, 9000),  # out of sync since 1.5 s
        FlowState(d, True, 0, 0, 0, 1, 0, 0.0, 0),
        FlowState(d, False, 0, 0, 0, 1, 0, 0.0, 0),
        FlowState(t, True, 3, 1, 0, 0, 0, 2.0, 500),  # TLS: not measurable
    ]
    rows = {(r.initiator, r.direction): r for r in ks.sync_rows(0.0)}
    assert rows["10.0.0.2", "to_initiator"].state == "out of sync"
    assert rows["10.0.0.2", "to_initiator"].desyncs == 3
    assert rows["10.0.0.2", "to_initiator"].out_of_sync_bytes == 9000
    assert rows["10.0.0.4", "to_target"].reason == "tls"
    assert ks.out_of_sync() == {("iscsi", "10.0.0.11:3260", ""): (2, 1)}


def test_a_flow_silent_for_sync_vote_s_has_no_say_in_the_hold():
    """A burst of garbage on connections that then fall silent must not hold the
    resource blind until they are forgotten: a connection whose walk did not move for
    SYNC_VOTE_S does not count; one that moves again counts again."""
    from santhrottle.bridge.tracker import SYNC_VOTE_S

    now = [100.0]
    w = FakeWire()
    ks = KernelSums(w, clock=lambda: now[0])  # type: ignore[arg-type]
    junk = Conn("10.0.0.3", "10.0.0.11", 51001, 3260)

    def flows(seq: int, junk_seq: int) -> list[FlowState]:
        return [
            FlowState(C, True, 0, 0, 0, 1, 0, 0.0, 0, seq),
            FlowState(C, False, 0, 0, 0, 1, 0, 0.0, 0, seq),
            FlowState(junk, True, 2, 0, 3, 4, 1, 1.5, 9000, junk_seq),
            FlowState(junk, False, 2, 0, 3, 4, 1, 1.5, 9000, junk_seq),
        ]

    w.flow_states = flows(1, 7)
    assert ks.out_of_sync() == {("iscsi", "10.0.0.11:3260", ""): (2, 1)}
    now[0] += SYNC_VOTE_S + 0.5  # the session goes on, the garbage stopped
    w.flow_states = flows(2, 7)
    assert ks.out_of_sync() == {("iscsi", "10.0.0.11:3260", ""): (1, 0)}
    now[0] += 1.0
    w.flow_states = flows(3, 8)  # it talks again
    assert ks.out_of_sync() == {("iscsi", "10.0.0.11:3260", ""): (2, 1)}


def test_a_connection_that_ended_is_no_longer_seen_and_its_sums_leave_the_map():
    """Initiators that come and go (their FIN drops their flows): each is forgotten
    ENDED_S after its last sums grew, and its sums go from the program's map -- a plain
    hash of 65,536 that would fill, after which no new connection is measured."""
    from santhrottle.bridge.ksums import ENDED_S

    now = [10.0]
    w = FakeWire()
    ks = KernelSums(w, clock=lambda: now[0])  # type: ignore[arg-type]
    gone = Conn("10.0.0.3", "10.0.0.11", 51001, 3260)
    for c in (C, gone):
        w.sums[c, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    w.flow_states = [FlowState(C, True, 0, 0, 0, 1, 0, 0.0, 0, 1)]  # gone's flows went
    ks.take_tick()
    ks.out_of_sync()  # a convergence reads the flows
    assert {i for s in ks.seen().values() for i in s} == {"10.0.0.2", "10.0.0.3"}
    now[0] += ENDED_S + 1.0
    w.sums[C, 0] = VolumeSums(reads=2, read_ns=2000, write_bytes=0)  # C goes on
    ks.take_tick()
    ks.sweep(now[0])
    assert {i for s in ks.seen().values() for i in s} == {"10.0.0.2"}
    assert list(w.sums) == [(C, 0)]


def test_what_the_full_flow_map_dropped_is_counted_from_its_intake_and_what_a_walk_finds():
    """The program counts the directions its flow map takes in and those it takes out;
    the rest of the intake that a walk does not find, the map's LRU dropped.  Read
    before and after the walk, a flow made or ended meanwhile never counts as dropped,
    and the count never goes back."""
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    w.flow_states = [FlowState(C, way, 0, 0, 0, 1, 0, 0.0, 0) for way in (True, False)]
    w.flow_counts = [(2, 0), (2, 0)]  # all it took in is there
    ks.install(ks.walk_flows(0.0), None)
    assert ks.flows_evicted == 0
    w.flow_counts = [(10, 3), (10, 3)]  # 7 held for 2 found: 5 dropped
    ks.install(ks.walk_flows(1.0), None)
    assert ks.flows_evicted == 5
    w.flow_counts = [(10, 3), (10, 8)]  # 5 ended during the walk: none newly dropped
    ks.install(ks.walk_flows(2.0), None)
    assert ks.flows_evicted == 5
