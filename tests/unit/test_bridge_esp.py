"""bridge/esp.py: IPsec ESP on the array-side port shown not measurable, per security
association; the capture's decoder hands its frames on (capture.py's FrameDecoder)."""

from __future__ import annotations

import struct

from santhrottle.bridge import esp as E
from santhrottle.bridge import tracker as T
from santhrottle.bridge.capture import STORAGE_FILTER, CaptureCounters, FrameDecoder

MACS = b"\x02" * 12


def _ipv4(proto: int, payload: bytes, src: bytes = b"\x0a\x00\x00\x03",
          dst: bytes = b"\x0a\x00\x00\x0c", frag: int = 0) -> bytes:  # fmt: skip
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, frag, 64, proto, 0,
                     src, dst)  # fmt: skip
    return MACS + b"\x08\x00" + ip + payload


def _decode(frame: bytes) -> tuple[list, CaptureCounters]:
    seen: list = []
    c = CaptureCounters()
    dec = FrameDecoder(c, lambda *a: seen.append(a))
    dec.frame(memoryview(frame), 0, len(frame), 1.5, lambda *a: None)
    return seen, c


def test_an_esp_frame_goes_on_with_its_spi_and_bytes():
    seen, c = _decode(_ipv4(E.IPPROTO_ESP, struct.pack("!II", 0x5301, 7) + b"x" * 100))
    assert seen == [(1.5, "10.0.0.3", "10.0.0.12", 0x5301, 108)] and c.esp == 1


def test_esp_in_udp_4500_but_not_ike():
    udp = struct.pack("!HHHH", 4500, 4500, 8 + 24, 0)
    seen, _ = _decode(_ipv4(E.IPPROTO_UDP, udp + struct.pack("!II", 0x77, 1) + b"y" * 16))
    assert seen == [(1.5, "10.0.0.3", "10.0.0.12", 0x77, 24)]
    seen, c = _decode(_ipv4(E.IPPROTO_UDP, udp + b"\0\0\0\0" + b"y" * 20))  # IKE's marker
    assert seen == [] and c.not_tcp == 1
    seen, _ = _decode(_ipv4(E.IPPROTO_ESP, struct.pack("!II", 9, 1), frag=0x2000))  # fragment
    assert seen == []


def test_each_security_association_is_a_row_not_measurable():
    tr = T.Tracker()
    for t in range(5):
        tr.encrypted(float(t), "10.0.0.3", "10.0.0.12", 0x5301, 100)
        tr.encrypted(float(t), "10.0.0.12", "10.0.0.3", 0x5302, 200)
    rows = tr.sync_rows(5.0)
    assert [(r.initiator, r.portal, r.direction, r.state) for r in rows] == [
        ("10.0.0.3", "10.0.0.12", "esp", "not measurable"),
        ("10.0.0.12", "10.0.0.3", "esp", "not measurable"),
    ]
    assert rows[0].out_of_sync_bytes == 500 and rows[0].out_of_sync_s == 4.0
    assert rows[0].reason == "ipsec esp spi 0x00005301"
    assert tr.counters.unmeasurable == 2, "each association counted once"
    assert tr.out_of_sync() == {}, "never part of a resource's share"
    tr.segment(5.0 + T.CONN_IDLE_S + 1, "10.0.0.2", 40000, "10.0.0.9", 3260, 1, b"")
    assert [r for r in tr.sync_rows(700.0) if r.direction == "esp"] == [], "forgotten when silent"


def test_the_associations_are_bounded():
    flows = E.EspFlows()
    for spi in range(E.MAX_ESP_FLOWS + 10):
        flows.frame(0.0, "a", "b", spi, 1)
    assert len(flows.flows) == E.MAX_ESP_FLOWS and ("a", "b", 0) not in flows.flows


def test_the_filter_keeps_esp_short_and_storage_whole():
    assert STORAGE_FILTER[-2] == (0x06, 0, 0, E.ESP_SNAP_BYTES)
    assert (0x06, 0, 0, 0x00040000) in STORAGE_FILTER


def test_the_decoder_names_at_most_names_max_addresses(monkeypatch):
    """Churning or forged sources cannot grow the decoder's names without bound."""
    from santhrottle.bridge import capture

    monkeypatch.setattr(capture, "NAMES_MAX", 8)
    dec = FrameDecoder(CaptureCounters())
    names = [dec.name(bytes([10, 0, 0, i])) for i in range(1, 30)]
    assert names[-1] == "10.0.0.29" and names[0] == "10.0.0.1"
    assert 1 <= len(dec._names) <= 8
    assert dec.name(b"\x0a\x00\x00\x1d") == "10.0.0.29"  # named again after a clear
