"""bridge/tracker.py: reads' latencies and writes' bytes per volume, from the segments."""

from __future__ import annotations

import pytest

from santhrottle.bridge import tracker as T
from tests.unit import storage_pdus as B

INI, TGT = "10.0.0.2", "10.0.0.9"


class Conn:
    """Both directions of one connection, fed to a tracker with their sequence numbers."""

    def __init__(self, tr: T.Tracker, port: int, sport: int = 40000, ini: str = INI) -> None:
        self.tr, self.port, self.sport, self.ini = tr, port, sport, ini
        self.seq = {True: 1000, False: 5000}
        tr.segment(0.0, ini, sport, TGT, port, 999, b"", syn=True)
        tr.segment(0.0, TGT, port, ini, sport, 4999, b"", syn=True)

    def send(self, t: float, data: bytes, to_target: bool) -> None:
        seq = self.seq[to_target]
        if to_target:
            self.tr.segment(t, self.ini, self.sport, TGT, self.port, seq, data)
        else:
            self.tr.segment(t, TGT, self.port, self.ini, self.sport, seq, data)
        self.seq[to_target] = (seq + len(data)) % (1 << 32)


def _logged_in(tr: T.Tracker, target: str, digests: str = "None") -> Conn:
    """An iSCSI connection through its login: the request names the target, the
    response the negotiated digests."""
    c = Conn(tr, 3260)
    c.send(0.0, B.login_request(target), True)
    text = f"HeaderDigest={digests}\0DataDigest={digests}\0".encode()
    c.send(0.001, B.iscsi(B.LOGIN_RESP, 0x87, 0, data=text), False)
    return c


def test_iscsi_read_latency_per_lun_named_by_the_login():
    tr = T.Tracker()
    c = _logged_in(tr, "iqn.2026-11.lab:array")
    c.send(1.000, B.scsi_read(1, lun=2) + B.scsi_read(2, lun=3), True)
    c.send(1.004, B.data_in(1, b"r" * 4096), False)  # F|S: the read's completion
    c.send(1.010, B.data_in(2, b"r" * 4096, final_status=False) + B.scsi_response(2), False)
    reads = tr.take_tick()[0]
    lun2 = T.Volume("iscsi", f"{TGT}:3260", "iqn.2026-11.lab:array", 2)
    lun3 = T.Volume("iscsi", f"{TGT}:3260", "iqn.2026-11.lab:array", 3)
    assert reads[lun2].reads == 1 and reads[lun2].mean_s == pytest.approx(0.004)
    assert reads[lun3].mean_s == pytest.approx(0.010)
    assert tr.take_tick()[0] == {}  # taken
    assert str(lun2) == "iscsi 10.0.0.9:3260 iqn.2026-11.lab:array lun 2"


def test_iscsi_writes_count_their_expected_length_per_initiator():
    tr = T.Tracker()
    a, b = Conn(tr, 3260), Conn(tr, 3260, 40001, ini="10.0.0.3")
    a.send(0.1, B.scsi_write(1, lun=1, nbytes=65536), True)
    a.send(0.2, B.scsi_write(2, lun=1, nbytes=65536, immediate=b"x" * 8192), True)
    b.send(0.2, B.scsi_write(1, lun=1, nbytes=4096), True)
    w = tr.take_writes()
    vol = T.Volume("iscsi", f"{TGT}:3260", "", 1)
    assert w == {(vol, INI): 131072, (vol, "10.0.0.3"): 4096}


def test_negotiated_digests_apply_to_both_directions():
    tr = T.Tracker()
    c = _logged_in(tr, "iqn.x:t", digests="CRC32C")
    c.send(1.0, B.scsi_read(7, header_digest=True) + B.scsi_read(8, header_digest=True), True)
    c.send(1.002, B.data_in(7, b"d" * 100, header_digest=True, data_digest=True), False)
    c.send(1.003, B.data_in(8, b"d" * 100, header_digest=True, data_digest=True), False)
    (vr,) = tr.take_tick()[0].values()
    assert vr.reads == 2 and tr.counters.unmatched == 0


def test_without_the_logins_text_the_walks_find_the_digests_themselves():
    """learn_logins=False: what the kernel's walk does until userspace has read the login
    (kernel.py's set_login): the same reads, the digests found by the walk."""
    tr = T.Tracker(learn_logins=False)
    c = _logged_in(tr, "iqn.x:t", digests="CRC32C")
    c.send(1.0, B.scsi_read(7, header_digest=True) + B.scsi_read(8, header_digest=True), True)
    c.send(1.002, B.data_in(7, b"d" * 100, header_digest=True, data_digest=True), False)
    c.send(1.003, B.data_in(8, b"d" * 100, header_digest=True, data_digest=True), False)
    (vr,) = tr.take_tick()[0].values()
    assert vr.reads == 2 and tr.counters.unmatched == 0
    (conn,) = tr.conns.values()
    assert conn.to_initiator.digests == (True, True) and conn.to_initiator.dd_known


def test_nvme_reads_writes_and_the_subsystem_name():
    tr = T.Tracker()
    c = Conn(tr, 4420)
    c.send(0.0, B.nvme_connect("nqn.2026-11.lab:sub"), True)
    c.send(0.0, B.capsule_resp(0), False)
    c.send(2.0, B.capsule_cmd(0x1001, 0x02, nsid=1, nlb=7), True)
    c.send(2.0, B.capsule_cmd(0x1002, 0x01, nsid=1, nlb=15, data=b"w" * 4096), True)
    c.send(2.001, B.h2c_data(0x1002, b"w" * 4096), True)
    c.send(2.003, B.c2h_data(0x1001, b"r" * 4096) + B.capsule_resp(0x1001), False)
    c.send(2.005, B.capsule_resp(0x1002), False)
    vol = T.Volume("nvme", f"{TGT}:4420", "nqn.2026-11.lab:sub", 1)
    assert tr.take_tick()[0][vol].mean_s == pytest.approx(0.003)
    assert tr.take_writes() == {(vol, INI): 8192}
    assert tr.counters.completions == 3  # the connect's, the read's, the write's


def test_c2h_success_completes_and_a_following_response_is_unmatched():
    tr = T.Tracker()
    c = Conn(tr, 4420)
    c.send(1.0, B.capsule_cmd(5, 0x02), True)
    c.send(1.002, B.c2h_data(5, b"r" * 512, success=True) + B.capsule_resp(5), False)
    (vr,) = tr.take_tick()[0].values()
    assert vr.reads == 1 and vr.mean_s == pytest.approx(0.002)
    assert tr.counters.unmatched == 1


def test_commands_never_completed_are_aged_out_and_counted():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(1.0, B.scsi_read(1), True)
    c.send(1.0 + T.INFLIGHT_MAX_S / 2, B.scsi_read(2), True)
    assert sum(tr.in_flight().values()) == 2
    c.send(1.0 + T.INFLIGHT_MAX_S + T.AGE_SWEEP_S, B.scsi_read(3), True)
    assert tr.counters.aged == 1 and sum(tr.in_flight().values()) == 2


def test_a_reused_tag_replaces_and_counts():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(1.0, B.scsi_read(1), True)
    c.send(2.0, B.scsi_read(1), True)
    c.send(2.5, B.scsi_response(1), False)
    (vr,) = tr.take_tick()[0].values()
    assert tr.counters.replaced == 1 and vr.mean_s == pytest.approx(0.5)


def test_fin_forgets_the_connection_and_idle_ones_go():
    tr = T.Tracker()
    Conn(tr, 3260)
    b = Conn(tr, 3260, 40001)
    tr.segment(1.0, INI, 40000, TGT, 3260, 0, b"", fin_or_rst=True)
    assert len(tr.conns) == 1
    b.send(2.0, B.scsi_read(1), True)
    tr.segment(3.0 + T.CONN_IDLE_S, "10.0.0.7", 40009, TGT, 4420, 1, b"", syn=True)
    assert list(tr.conns) == [("10.0.0.7", 40009, TGT, 4420)]


def test_other_ports_are_ignored_and_ipv6_portals_are_bracketed():
    tr = T.Tracker()
    tr.segment(0.0, INI, 1234, TGT, 80, 1, b"GET /")
    assert tr.conns == {}
    tr.segment(0.0, "fd00::2", 40000, "fd00::9", 3260, 1, b"", syn=True)
    (conn,) = tr.conns.values()
    assert conn.portal == "[fd00::9]:3260"


def test_lun_numbers_of_both_addressing_methods():
    assert T.lun_number(5 << 48) == 5
    assert T.lun_number((0x4000 | 300) << 48) == 300


def test_a_new_syn_on_the_same_ports_is_a_new_connection():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(0.0, B.login_request("iqn.x:old"), True)
    c.send(1.0, B.scsi_read(1), True)
    Conn(tr, 3260)  # the same four-tuple again: the old one ended unseen
    (conn,) = tr.conns.values()
    assert conn.target == "" and tr.counters.connections == 2
    # its commands in flight wait for their completion (or their age), as the kernel's
    assert list(conn.inflight) == [1] and tr.inflight_total == 1


def test_a_completion_after_the_initiators_fin_completes_its_command():
    tr = T.Tracker()
    c = Conn(tr, 4420)
    c.send(0.0, B.capsule_cmd(7, nsid=1), True)
    tr.segment(0.5, INI, c.sport, TGT, 4420, c.seq[True], b"", fin_or_rst=True)
    assert not tr.conns and tr.inflight_total == 1
    c.send(0.8, B.capsule_resp(7), False)  # mid-session to the sensor: a new walk
    assert tr.counters.completions == 1 and tr.inflight_total == 0
    # left alone, they age out like any command
    c.send(0.9, B.capsule_cmd(8, nsid=1), True)
    tr.segment(1.0, INI, c.sport, TGT, 4420, c.seq[True], b"", fin_or_rst=True)
    tr.segment(2.0 + T.INFLIGHT_MAX_S, INI, 1, TGT, 4420, 1, b"x")
    assert tr.counters.aged == 1 and tr.inflight_total == 0 and not tr.orphans


def test_a_tick_takes_each_volumes_write_bytes_too():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(0.1, B.scsi_write(1, lun=1, nbytes=65536), True)
    c.send(0.1, B.scsi_write(2, lun=1, nbytes=4096), True)
    vol = T.Volume("iscsi", f"{TGT}:3260", "", 1)
    assert tr.take_tick() == ({}, {vol: 69632})
    assert tr.take_tick() == ({}, {})
    assert tr.take_writes() == {(vol, INI): 69632}  # the convergence's, apart


def test_the_volumes_seen_with_their_initiators():
    tr = T.Tracker()
    a, b = Conn(tr, 3260), Conn(tr, 3260, 40001, ini="10.0.0.3")
    a.send(0.1, B.scsi_read(1, lun=1) + B.scsi_read(2, lun=2), True)
    b.send(0.1, B.scsi_write(1, lun=1), True)
    lun1 = T.Volume("iscsi", f"{TGT}:3260", "", 1)
    lun2 = T.Volume("iscsi", f"{TGT}:3260", "", 2)
    assert tr.seen() == {lun1: {INI, "10.0.0.3"}, lun2: {INI}}


def test_known_targets_name_a_session_seen_mid_way_but_not_a_new_one():
    key = (INI, 40000, TGT, 3260)
    tr = T.Tracker(known_targets={key: "iqn.2026-11.lab:array"})
    tr.segment(1.0, INI, 40000, TGT, 3260, 5, B.scsi_read(1, lun=0))  # no SYN: mid-session
    assert tr.targets() == {key: "iqn.2026-11.lab:array"}
    assert {v.target for v in tr.seen()} == {"iqn.2026-11.lab:array"}
    fresh = T.Tracker(known_targets={key: "iqn.2026-11.lab:array"})
    Conn(fresh, 3260).send(1.0, B.scsi_read(1, lun=0), True)  # a SYN: it logs in again
    assert fresh.targets() == {} and {v.target for v in fresh.seen()} == {""}


def test_nvme_commands_of_no_namespace_are_matched_but_name_no_volume():
    tr = T.Tracker()
    c = Conn(tr, 4420)
    c.send(0.0, B.nvme_connect("nqn.2026-11.lab:sub", cid=1), True)  # NSID 0
    c.send(0.001, B.capsule_resp(1), False)
    c.send(0.1, B.capsule_cmd(2, opcode=0x00, nsid=0xFFFFFFFF), True)  # flush, broadcast
    c.send(0.2, B.capsule_resp(2), False)
    assert tr.seen() == {} and tr.counters.completions == 2 and tr.counters.unmatched == 0


def test_reads_per_initiator_for_the_groups():
    tr = T.Tracker()
    a = _logged_in(tr, "iqn.2026-11.lab:array")
    b = Conn(tr, 3260, sport=40001, ini="10.0.0.3")
    b.send(0.0, B.login_request("iqn.2026-11.lab:array"), True)
    a.send(1.000, B.scsi_read(1, lun=2), True)
    b.send(1.000, B.scsi_read(7, lun=2), True)
    a.send(1.004, B.data_in(1, b"r" * 4096), False)
    b.send(1.012, B.data_in(7, b"r" * 4096), False)
    b.send(1.020, B.scsi_write(8, lun=2, nbytes=4096), True)
    b.send(1.030, B.scsi_response(8), False)
    lun2 = T.Volume("iscsi", f"{TGT}:3260", "iqn.2026-11.lab:array", 2)
    assert tr.take_tick()[0][lun2].reads == 2  # the tick's sums are per volume
    per = tr.take_initiator_ios()
    assert per[lun2, INI].reads == 1 and per[lun2, INI].mean_s == pytest.approx(0.004)
    assert per[lun2, INI].writes == 0
    assert per[lun2, "10.0.0.3"].mean_s == pytest.approx(0.012)
    assert per[lun2, "10.0.0.3"].writes == 1  # a write completed
    assert tr.take_initiator_ios() == {}  # taken


class MidSession(Conn):
    """A connection first seen without its SYN: its streams start anywhere."""

    def __init__(self, tr: T.Tracker, port: int, sport: int = 40000, ini: str = INI) -> None:
        self.tr, self.port, self.sport, self.ini = tr, port, sport, ini
        self.seq = {True: 77000, False: 99000}


def _stream(tr: T.Tracker, key: T.ConnKey, to_target: bool):  # type: ignore[no-untyped-def]
    c = tr.conns[key]
    return c.to_target if to_target else c.to_initiator


def test_a_login_without_its_syn_names_the_target_and_the_initiator():
    tr = T.Tracker()
    c = MidSession(tr, 3260)
    c.send(0.0, B.login_request("iqn.2026-11.lab:array", initiator="iqn.2026-11.lab:db1"), True)
    c.send(0.001, B.iscsi(B.LOGIN_RESP, 0x87, 0, data=b"HeaderDigest=None\0"), False)
    c.send(1.0, B.scsi_read(1, lun=2), True)
    c.send(1.005, B.data_in(1, b"r" * 512), False)
    key = (INI, 40000, TGT, 3260)
    assert tr.targets() == {key: "iqn.2026-11.lab:array"}
    assert tr.initiator_logins() == {key: "iqn.2026-11.lab:db1"}
    (vr,) = tr.take_tick()[0].values()
    assert vr.reads == 1


def test_digests_apply_when_the_login_reaches_full_feature():
    """The digests are said in a response that does not end the login: the login's
    last PDUs carry none, the full feature phase's all."""
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(0.0, B.iscsi(B.LOGIN_REQ | 0x40, 0x81, 0, data=b"InitiatorName=iqn.x:i\0"), True)
    c.send(0.001, B.iscsi(B.LOGIN_RESP, 0x81, 0, data=b"HeaderDigest=CRC32C\0"
                          b"DataDigest=CRC32C\0"), False)  # fmt: skip
    c.send(0.002, B.iscsi(B.LOGIN_REQ | 0x40, 0x87, 0, data=b"TargetName=iqn.x:t\0"), True)
    c.send(0.003, B.iscsi(B.LOGIN_RESP, 0x87, 0, data=b"MaxRecvDataSegmentLength=8192\0"),
           False)  # fmt: skip
    kw = {"header_digest": True, "data_digest": True}
    c.send(1.0, B.scsi_read(1, **kw) + B.scsi_read(2, **kw), True)
    c.send(1.002, B.data_in(1, b"d" * 100, **kw) + B.data_in(2, b"d" * 100, **kw), False)
    assert tr.counters.completions == 2 and tr.counters.unmatched == 0
    assert tr.walk_totals().desyncs == 0


def test_a_data_segment_past_the_declared_limit_is_a_desync():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    text = b"TargetName=iqn.x:t\0MaxRecvDataSegmentLength=4096\0"
    c.send(0.0, B.iscsi(B.LOGIN_REQ | 0x40, 0x87, 0, data=text), True)
    c.send(0.001, B.iscsi(B.LOGIN_RESP, 0x87, 0, data=b"HeaderDigest=None\0"), False)
    c.send(1.0, B.scsi_read(1) + B.scsi_read(2) + B.scsi_read(3), True)
    c.send(1.002, B.data_in(1, b"d" * 4096) + B.data_in(2, b"d" * 8192)
           + B.data_in(3, b"d" * 4096), False)  # fmt: skip
    assert _stream(tr, (INI, 40000, TGT, 3260), False).counters.desyncs == 1
    assert tr.counters.completions == 2  # 1 and 3: the resync found 3 past the bad one


def test_a_run_of_completions_of_nothing_is_a_desync():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(1.0, B.scsi_read(1), True)
    run = b"".join(B.scsi_response(0x1000 + k) for k in range(T.UNMATCHED_RUN))
    c.send(1.1, run + B.scsi_response(1), False)
    st = _stream(tr, (INI, 40000, TGT, 3260), False)
    assert st.counters.desyncs == 1 and st.counters.resyncs == 1
    assert tr.counters.completions == 1, "the walk found its place again at once"


def test_a_retracted_command_is_not_counted_and_a_confirmed_write_is():
    tr = T.Tracker()
    c = MidSession(tr, 3260)
    c.send(1.0, B.scsi_write(1, nbytes=8192), True)  # alone: provisional
    assert tr.counters.commands == 1 and tr.take_writes() == {}
    c.send(1.1, B.scsi_write(2, nbytes=4096), True)  # its successor: 1 holds, 2 walked
    vol = T.Volume("iscsi", f"{TGT}:3260", "", 1)
    assert tr.take_writes() == {(vol, INI): 8192 + 4096}
    d = MidSession(tr, 3260, sport=40001)
    d.send(1.0, B.scsi_write(5, nbytes=8192), True)
    d.send(1.1, b"\x7f" * 48, True)  # where its successor should be: not a header
    assert tr.conns[(INI, 40001, TGT, 3260)].inflight == {}
    assert tr.counters.commands == 2  # 1 and 2, not 5
    assert tr.take_writes() == {}
    assert _stream(tr, (INI, 40001, TGT, 3260), True).counters.retracted == 1


def test_tls_on_the_nvme_port_is_not_measurable():
    tr = T.Tracker()
    c = Conn(tr, 4420)
    c.send(0.0, bytes([22, 3, 1, 0, 100]) + bytes(100), True)
    c.send(0.1, bytes([22, 3, 3, 0, 90]) + bytes(90), False)
    key = (INI, 40000, TGT, 4420)
    assert tr.unmeasurable() == [(key, "tls")]
    rows = {r.direction: r for r in tr.sync_rows(1.0)}
    assert rows["to_target"].state == "not measurable" and rows["to_target"].reason == "tls"
    assert tr.walk_totals().desyncs == 0 and tr.out_of_sync() == {}


def test_sync_rows_per_direction():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(1.0, B.scsi_read(1), True)
    c.send(1.5, B.scsi_response(1), False)
    c.send(2.0, b"\xff" * 200, False)  # not a header where one must be
    rows = {r.direction: r for r in tr.sync_rows(5.0)}
    assert rows["to_target"].state == "in sync" and rows["to_target"].out_of_sync_s == 0
    ti = rows["to_initiator"]
    assert ti.state == "out of sync" and ti.out_of_sync_s == pytest.approx(3.0)
    assert ti.desyncs == 1 and ti.out_of_sync_bytes == 200
    assert tr.out_of_sync() == {("iscsi", f"{TGT}:3260", ""): (1, 1)}


def test_a_connection_silent_for_sync_vote_s_has_no_say_in_the_hold():
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(1.0, b"\xff" * 200, False)  # garbage: out of sync
    assert tr.out_of_sync() == {("iscsi", f"{TGT}:3260", ""): (1, 1)}
    other = Conn(tr, 3260, sport=40001)
    other.send(1.0 + T.SYNC_VOTE_S + 0.5, B.scsi_read(1), True)  # the wire goes on
    other.send(1.0 + T.SYNC_VOTE_S + 0.6, B.scsi_response(1), False)
    assert tr.out_of_sync() == {("iscsi", f"{TGT}:3260", ""): (1, 0)}


def test_a_segment_forged_far_ahead_on_the_ports_does_not_blind_the_real_stream():
    """A segment with the session's four ports and a sequence number a GiB ahead moves
    the walk there; the real segments after it are far behind, no retransmission: the
    walk is lost at them and finds their headers again, the reads measured."""
    tr = T.Tracker()
    c = Conn(tr, 3260)
    c.send(1.0, B.scsi_read(1), True)
    c.send(1.1, B.data_in(1, b"r" * 512), False)
    assert tr.counters.completions == 1
    for to_target, port_pair in ((True, (INI, 40000, TGT, 3260)), (False, (TGT, 3260, INI, 40000))):
        src, sp, dst, dp = port_pair
        tr.segment(1.2, src, sp, dst, dp, (c.seq[to_target] + (1 << 30)) % (1 << 32), b"\xff" * 100)
    for k in range(2, 12):
        c.send(1.0 + k, B.scsi_read(k), True)
        c.send(1.05 + k, B.data_in(k, b"r" * 512), False)
    assert tr.counters.completions >= 9, tr.counters
