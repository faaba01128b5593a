"""Storage traffic as Ethernet frames, for the wire sensor's bench (bench_wire.py).

Connections from initiators to one target, half iSCSI and half NVMe/TCP, each doing
4 KiB reads and writes round-robin with several commands in flight: the PDUs are the
field-by-field builders of tests/unit/storage_pdus.py, cut into MSS-sized TCP
segments (a PDU's tail and the next PDU's head share a segment, as on a loaded link),
with a pure ACK for every two segments the other way. The TCP/IP headers come from
scapy, once per direction; per frame only the lengths and sequence numbers change.
Written with scapy's RawPcapWriter, replayed with tcpreplay.
"""

from __future__ import annotations

import random
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.unit import storage_pdus as B

MSS = 1448
TARGET = "192.0.2.1"
READ_FRACTION = 0.7
IN_FLIGHT = 4  # commands per connection before their completions go


@dataclass
class _Dir:
    header: bytes  # Ether + IP + TCP of this direction, from scapy
    seq: int
    pending: bytearray = field(default_factory=bytearray)
    unacked: int = 0


def _template(src: str, dst: str, sport: int, dport: int) -> bytes:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    frame = Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01")
    return bytes(frame / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags="A"))


class _Conn:
    def __init__(self, ini: str, port: int, sport: int, rng: random.Random) -> None:
        self.port = port
        self.up = _Dir(_template(ini, TARGET, sport, port), rng.randrange(1 << 32))
        self.down = _Dir(_template(TARGET, ini, port, sport), rng.randrange(1 << 32))
        self.tag = 0

    def frames(self, d: _Dir, other: _Dir, flush: bool) -> Iterator[bytes]:
        """MSS-sized segments of d's pending bytes (all of them when flush)."""
        while len(d.pending) >= MSS or (flush and d.pending):
            n = min(MSS, len(d.pending))
            yield _frame(d, other, bytes(d.pending[:n]))
            del d.pending[:n]
            other.unacked += 1
            if other.unacked >= 2:  # the other side ACKs every two segments
                other.unacked = 0
                yield _frame(other, d, b"")


def _frame(d: _Dir, other: _Dir, payload: bytes) -> bytes:
    h = bytearray(d.header)
    struct.pack_into("!H", h, 16, len(h) - 14 + len(payload))  # IP total length
    struct.pack_into("!II", h, 38, d.seq, other.seq)  # TCP seq, ack
    d.seq = (d.seq + len(payload)) % (1 << 32)
    return bytes(h) + payload


def build(n_conns: int, n_ios: int, seed: int = 1) -> tuple[list[bytes], dict[str, int]]:
    """Frames of n_ios I/Os over n_conns connections; and what they hold
    (reads, writes, completions)."""
    rng = random.Random(seed)
    conns = [
        _Conn(f"192.0.2.{10 + i}", 3260 if i % 2 == 0 else 4420, 40000 + i, rng)
        for i in range(n_conns)
    ]
    frames: list[bytes] = []
    counts = {"reads": 0, "writes": 0, "completions": 0}
    data = bytes(range(256)) * 16  # 4 KiB
    done = 0
    while done < n_ios:
        for c in conns:
            batch = []
            for _ in range(IN_FLIGHT):
                c.tag = (c.tag + 1) & 0xFFFF
                read = rng.random() < READ_FRACTION
                batch.append((c.tag, read))
                if c.port == 3260:
                    c.up.pending += (
                        B.scsi_read(c.tag)
                        if read
                        else B.scsi_write(c.tag, nbytes=4096, immediate=data)
                    )
                else:
                    c.up.pending += (
                        B.capsule_cmd(c.tag, 0x02, nlb=7)
                        if read
                        else B.capsule_cmd(c.tag, 0x01, nlb=7, data=data)
                    )
                counts["reads" if read else "writes"] += 1
            frames += c.frames(c.up, c.down, flush=True)
            for tag, read in batch:
                if c.port == 3260:
                    c.down.pending += B.data_in(tag, data) if read else B.scsi_response(tag)
                else:
                    c.down.pending += (
                        B.c2h_data(tag, data) + B.capsule_resp(tag) if read else B.capsule_resp(tag)
                    )
                counts["completions"] += 1
            frames += c.frames(c.down, c.up, flush=True)
            done += IN_FLIGHT
            if done >= n_ios:
                break
    return frames, counts


def write_pcap(path: Path, frames: list[bytes]) -> None:
    from scapy.utils import RawPcapWriter

    with RawPcapWriter(str(path), linktype=1) as w:  # Ethernet
        for f in frames:
            w.write(f)
