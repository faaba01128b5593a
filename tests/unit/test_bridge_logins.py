"""bridge/logins.py and its readers: the initiator's and the target's names from iSCSI
logins (key=value text over parts and PDUs) and NVMe connects, in the Python tracker
(segments built from tests/unit/storage_pdus.py) and over the kernel's events
(bridge/ksums.py on a fake wire); garbage ignored and counted, never raised."""

from __future__ import annotations

import random

import pytest

from santhrottle.bridge import logins as L
from santhrottle.bridge import tracker as T
from santhrottle.bridge.kernel import EV_BODY, EV_CONNECT, EV_LOGIN, Conn, Event, VolumeSums
from santhrottle.bridge.ksums import KernelSums
from tests.unit import storage_pdus as B
from tests.unit.test_bridge_ksums import C, FakeWire, N
from tests.unit.test_bridge_tracker import INI, TGT
from tests.unit.test_bridge_tracker import Conn as Wire

HOST = "iqn.2026-11.lab:db1"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:9f2a6c1e-0000-4000-8000-00000000db01"
ARRAY = "iqn.2026-11.lab:array"


def _login(text: bytes, flags: int = 0x87, itt: int = 0) -> bytes:
    return B.iscsi(B.LOGIN_REQ | 0x40, flags, itt, data=text)


def test_the_worked_example_of_the_module_header():
    login = L.Login()
    assert login.start(False, True, 0x40, 20, b"InitiatorName=iqn.20") == L.Said()
    said = login.start(False, True, 0x87, 43, b"26-11.lab:db1\0TargetName=iqn.2026-11.lab:a\0")
    assert said == L.Said(target="iqn.2026-11.lab:a", initiator=HOST)


def test_a_login_names_its_initiator_and_the_tracker_gives_names_per_address():
    tr = T.Tracker()
    a = Wire(tr, 3260)
    a.send(0.0, B.login_request(ARRAY, initiator=HOST), True)
    b = Wire(tr, 3260, sport=40001)  # a second session from the same host
    b.send(0.0, B.login_request("iqn.2026-11.lab:other", initiator=HOST), True)
    c = Wire(tr, 3260, sport=40002, ini="10.0.0.3")
    c.send(0.0, B.login_request(ARRAY, initiator="iqn.2026-11.lab:web"), True)
    Wire(tr, 3260, sport=40003, ini="10.0.0.4")  # connected, its login not (yet) seen
    assert tr.initiator_names() == {INI: (HOST,), "10.0.0.3": ("iqn.2026-11.lab:web",)}
    assert tr.initiator_logins() == {
        (INI, 40000, TGT, 3260): HOST,
        (INI, 40001, TGT, 3260): HOST,
        ("10.0.0.3", 40002, TGT, 3260): "iqn.2026-11.lab:web",
    }
    assert tr.conns[INI, 40000, TGT, 3260].target == ARRAY
    # a connection that ends takes its name with it
    tr.segment(1.0, "10.0.0.3", 40002, TGT, 3260, c.seq[True], b"", fin_or_rst=True)
    assert "10.0.0.3" not in tr.initiator_names()


def test_a_login_over_several_pdus_and_segments_with_a_pair_cut_at_the_c_bit():
    """The security stage's PDU (C: its text goes on) ends inside InitiatorName's value;
    the next PDU's header comes alone in its segment, its text cut across two more."""
    tr = T.Tracker()
    c = Wire(tr, 3260)
    first = b"AuthMethod=None\0InitiatorName=iqn.2026-"
    c.send(0.0, _login(first, flags=0x40), True)
    second = _login(b"11.lab:db1\0TargetName=" + ARRAY.encode() + b"\0SessionType=Normal\0")
    c.send(0.0, second[:48], True)
    c.send(0.0, second[48:70], True)
    c.send(0.0, second[70:], True)
    assert tr.initiator_names() == {INI: (HOST,)}
    assert tr.conns[INI, 40000, TGT, 3260].target == ARRAY
    assert tr.counters.bad_names == 0


def test_a_pdu_without_the_c_bit_ends_its_pairs_and_one_cut_short_is_not_glued():
    text = L.LoginText()
    # the last pair of a text needs no NUL when the PDU's text ends there
    whole = b"InitiatorName=iqn.x:whole"
    assert text.pdu(0x87, len(whole), whole) == {b"InitiatorName": b"iqn.x:whole"}
    # a text cut short (the sensor passed up 20 of its 60 bytes): its cut pair is not
    # read, nor glued to the next PDU's text
    assert text.pdu(0x40, 60, b"InitiatorName=iqn.x:") == {}
    assert text.pdu(0x87, 9, b"tail\0A=b\0") == {}
    # a text of unknown length: a pair is read at its NUL
    assert text.pdu(0, None, b"TargetName=iqn.x:t") == {}
    assert text.part(b"\0") == {b"TargetName": b"iqn.x:t"}


def test_garbage_names_are_ignored_and_counted():
    tr = T.Tracker()
    bad = [
        b"iqn.2026-11.lab:\x01ctl",  # a control byte
        "iqn.2026-11.lab:host\u00e9".encode(),  # not ASCII
        b"iqn." + b"x" * 220,  # 224 bytes: over the limit
        b"",  # empty
    ]
    for i, name in enumerate(bad):
        c = Wire(tr, 3260, sport=41000 + i)
        c.send(0.0, _login(b"InitiatorName=" + name + b"\0TargetName=iqn.x:t\0"), True)
    assert tr.initiator_names() == {} and tr.counters.bad_names == len(bad)
    ok = "iqn." + "y" * 219  # 223 bytes: the limit
    Wire(tr, 3260, sport=42000).send(0.0, _login(f"InitiatorName={ok}\0".encode()), True)
    assert tr.initiator_names() == {INI: (ok,)} and tr.counters.bad_names == len(bad)


def test_a_pair_longer_than_the_bound_is_read_as_garbage_and_skipped_to_its_nul():
    text = L.LoginText()
    huge = b"InitiatorName=" + b"z" * 3000
    got = text.pdu(0, None, huge[:1500])
    assert len(got[b"InitiatorName"]) > L.NAME_MAX_BYTES  # its start: garbage
    assert text.part(huge[1500:]) == {}  # skipped
    assert text.part(b"\0TargetName=iqn.x:after\0") == {b"TargetName": b"iqn.x:after"}
    login = L.Login()
    assert login.start(False, True, 0, None, huge[:1500]).bad_names == 1


def test_the_targets_answers_give_the_digests_over_its_pdus():
    login = L.Login()
    said = login.start(False, False, 0x40, 20, b"HeaderDigest=CRC32C\0")
    assert said.digests == (True, False)
    said = login.start(False, False, 0x87, 21, b"DataDigest=CRC32C\0X=1\0")
    assert said.digests == (True, True)
    # an initiator name the target's direction carries is no initiator's name
    assert login.start(False, False, 0x87, 18, b"InitiatorName=x:y\0").initiator is None


def test_an_nvme_connect_names_its_host_and_subsystem():
    tr = T.Tracker()
    c = Wire(tr, 4420)
    c.send(0.0, B.nvme_connect("nqn.2026-11.lab:sub", cid=1, hostnqn=HOSTNQN), True)
    c.send(0.0, B.capsule_resp(1), False)
    d = Wire(tr, 4420, sport=40001)  # an I/O queue, its capsule cut into three segments
    pdu = B.nvme_connect("nqn.2026-11.lab:sub", cid=2, hostnqn=HOSTNQN)
    for cut in (pdu[:72], pdu[72:700], pdu[700:]):
        d.send(0.0, cut, True)
    assert tr.initiator_names() == {INI: (HOSTNQN,)}
    assert {cn.target for cn in tr.conns.values()} == {"nqn.2026-11.lab:sub"}
    # a host NQN that fills its 256 bytes with no NUL is garbage
    e = Wire(tr, 4420, sport=40002, ini="10.0.0.7")
    raw = bytearray(B.nvme_connect("nqn.2026-11.lab:sub"))
    raw[72 + 512 : 72 + 768] = b"n" * 256
    e.send(0.0, bytes(raw), True)
    assert "10.0.0.7" not in tr.initiator_names() and tr.counters.bad_names == 1


def test_a_connect_read_in_parts_reads_each_nqn_once_it_is_whole():
    data = bytearray(1024)
    data[256:270] = b"nqn.x:sub\0\0\0\0\0"
    data[512 : 512 + len(HOSTNQN)] = HOSTNQN.encode()
    cd = L.ConnectData(1024)
    assert cd.part(bytes(data[:300])) == {b"SUBNQN": b"nqn.x:sub"}
    assert cd.part(bytes(data[300:530])) == {}  # the host NQN goes on
    assert cd.part(bytes(data[530:])) == {b"HOSTNQN": HOSTNQN.encode()}
    assert cd.part(b"more") == {}  # each once
    short = L.ConnectData(600)  # a connect whose data ends inside the host NQN
    assert short.part(bytes(data[:600]))[b"HOSTNQN"] == HOSTNQN.encode()[:88]


def test_names_per_address_are_bounded_the_latest_kept():
    logins = [("10.0.0.2", f"iqn.x:{i:02}") for i in range(L.MAX_NAMES_PER_INITIATOR + 4)]
    logins.append(("10.0.0.2", "iqn.x:00"))  # logged in again: the latest
    (names,) = L.by_address(logins).values()
    assert len(names) == L.MAX_NAMES_PER_INITIATOR and "iqn.x:00" in names
    assert "iqn.x:01" not in names and "iqn.x:19" in names
    d: dict[str, int] = {}
    assert [L.put_bounded(d, k, 1, 3) for k in "abcad"] == [0, 0, 0, 0, 1]
    assert list(d) == ["c", "a", "d"]


def test_the_kernels_events_give_the_same_names_over_parts_and_pdus():
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    first = b"AuthMethod=None\0InitiatorName=iqn.2026-"
    second = b"11.lab:db1\0TargetName=" + ARRAY.encode() + b"\0"
    hostdata = bytearray(1024)
    hostdata[256:270] = b"nqn.x:sub\0\0\0\0\0"
    hostdata[512 : 512 + len(HOSTNQN)] = HOSTNQN.encode()
    w.queued = [
        Event(C, EV_LOGIN, True, first, 0x40, len(first)),
        Event(C, EV_LOGIN, True, b"", 0x87, len(second)),  # the header alone
        Event(C, EV_BODY, True, second[:7]),
        Event(C, EV_BODY, True, second[7:]),
        Event(C, EV_LOGIN, False, b"HeaderDigest=CRC32C\0", 0x40, 20),
        Event(C, EV_LOGIN, False, b"DataDigest=None\0", 0x87, 16),
        Event(N, EV_CONNECT, True, bytes(hostdata[:600]), 0, 1024),
        Event(N, EV_BODY, True, bytes(hostdata[600:])),
    ]
    w.sums[C, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    w.sums[N, 1] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    ks.take_tick()
    assert ks.initiator_names() == {"10.0.0.2": (HOST,), "10.0.0.3": (HOSTNQN,)}
    assert ks.targets()[("10.0.0.2", 51000, "10.0.0.11", 3260)] == ARRAY
    assert w.digests[C] == (True, False)
    # garbage counted; a connection that logged in but did nothing is not live
    quiet = Conn("10.0.0.9", "10.0.0.11", 53000, 3260)
    w.queued = [Event(quiet, EV_LOGIN, True, b"InitiatorName=\xff\0", 0x87, 16),
                Event(quiet, EV_LOGIN, True, b"InitiatorName=iqn.x:q\0", 0x87, 22)]  # fmt: skip
    ks.take_tick()
    assert ks.counters.bad_names == 1 and "10.0.0.9" not in ks.initiator_names()


def test_the_kernels_names_are_bounded_and_restored_by_known_initiators(monkeypatch):
    from santhrottle.bridge import ksums

    monkeypatch.setattr(ksums, "MAX_CONNS", 4)
    w = FakeWire()
    ks = KernelSums(w, known_initiators={("10.0.0.2", 51000, "10.0.0.11", 3260): HOST})  # type: ignore[arg-type]
    w.sums[C, 0] = VolumeSums(reads=1, read_ns=1000, write_bytes=0)
    ks.take_tick()
    assert ks.initiator_names() == {"10.0.0.2": (HOST,)}  # from before the restart
    for i in range(10):  # logins that never send a command
        c = Conn("10.0.1.1", "10.0.0.11", 50000 + i, 3260)
        text = f"InitiatorName=iqn.x:{i}\0".encode()
        w.queued.append(Event(c, EV_LOGIN, True, text, 0x87, len(text)))
    ks.take_tick()
    assert len(ks.initiators) <= 4 and len(ks._logins) <= 4 and ks.counters.evicted >= 12


def test_hostile_login_text_never_raises():
    rnd = random.Random(7143)
    tr = T.Tracker()
    keys = [b"InitiatorName=", b"TargetName=", b"HeaderDigest=", b"=", b"", b"\0"]
    for i in range(3000):
        text = b"".join(rnd.choice(keys) + rnd.randbytes(rnd.randrange(300)) for _ in range(4))
        c = Wire(tr, rnd.choice((3260, 4420)), sport=30000 + i % 500, ini=f"10.1.0.{i % 50}")
        if c.port == 3260:
            pdu = _login(text, flags=rnd.choice((0x40, 0x87, 0xFF)))
        else:
            pdu = B.capsule_cmd(1, opcode=0x7F, nsid=0, data=text.ljust(1024, b"\0")[:1100])
            pdu = pdu[:12] + b"\x01" + pdu[13:]  # fctype: connect
        cut = rnd.randrange(len(pdu) + 1)
        c.send(0.0, pdu[:cut], True)
        c.send(0.0, pdu[cut:], True)
        login = L.Login()
        total = rnd.choice((None, rnd.randrange(2000)))
        login.start(rnd.random() < 0.5, True, rnd.randrange(256), total, text)
        login.more(True, rnd.randbytes(rnd.randrange(200)))
    for names in tr.initiator_names().values():
        assert all(L.wire_name(n.encode()) == n for n in names)
    assert tr.counters.bad_names > 0


@pytest.mark.parametrize("flags", [0x40, 0x87])
def test_a_python_and_a_kernel_reading_of_one_login_agree(flags):
    """The same text through the tracker (whole PDUs) and through KernelSums (parts)."""
    text = b"InitiatorName=" + HOST.encode() + b"\0TargetName=" + ARRAY.encode() + b"\0"
    tr = T.Tracker()
    Wire(tr, 3260, sport=51000).send(0.0, _login(text, flags=flags), True)
    w = FakeWire()
    ks = KernelSums(w)  # type: ignore[arg-type]
    c = Conn(INI, TGT, 51000, 3260)
    w.queued = [Event(c, EV_LOGIN, True, text[:5], flags, len(text)),
                Event(c, EV_BODY, True, text[5:])]  # fmt: skip
    w.sums[c, 0] = VolumeSums(reads=1, read_ns=1, write_bytes=0)
    ks.take_tick()
    assert ks.initiator_names() == tr.initiator_names() == {INI: (HOST,)}
