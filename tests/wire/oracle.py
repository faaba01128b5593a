"""The wire sensor against Wireshark: the corpus's captures, cut and damaged, both walked.

Wireshark (tshark, Debian's package) is the reference: its iSCSI and NVMe/TCP
dissectors match each command to its completion (iscsi.request_frame with
iscsi.time on the PDU that completes it, the SCSI CDB's opcode after it;
nvme.cmd_pkt on the CQE, the command's nvme.cmd.opc in its own frame).
Those are Wireshark's timed reads and writes: (connection, tag, the
command's frame time, the completion's). The tracker (bridge/tracker.py)
walks the same frames and reports its own through Tracker.on_io; a read
matches when the connection and tag are the same and both times agree
within TOLERANCE_S.

What the tracker could know
    From a cut (start_at): an IO whose command is in a frame after the one
    the cut falls in (the walk cannot know a command it never saw).
    After damage: an IO whose command and completion frames were neither
    dropped nor flipped (Wireshark on the damaged capture is compared as
    well: tshark_ios of the damaged pcap).

Damage (damage(), seeded): a fraction of the payloads with one byte flipped,
of the frames dropped, of the adjacent pairs of frames swapped.

Only the standard library and tshark; the frames' Ethernet, IP and TCP are
read here (not by the sensor's decoder), so that both sides see the capture
as it is.
"""

from __future__ import annotations

import gzip
import random
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from santhrottle.bridge.conns import Connection, ConnKey
from santhrottle.bridge.pdu import ISCSI_PORT, NVME_TCP_PORT, READ, WRITE
from santhrottle.bridge.tracker import Tracker

TOLERANCE_S = 10e-6
STORAGE_PORTS = (ISCSI_PORT, NVME_TCP_PORT)
SCSI_READS = {0x08, 0x28, 0x88, 0xA8}
SCSI_WRITES = {0x0A, 0x2A, 0x8A, 0xAA}
NVME_OPS = {0x02: READ, 0x01: WRITE}

_PCAP_HEAD = struct.Struct("<IHHiIII")
_REC = struct.Struct("<IIII")


@dataclass
class Frame:
    ts: float
    data: bytes
    index: int  # its place in the original capture (0-based)


@dataclass(frozen=True)
class Io:
    conn: ConnKey
    tag: int
    op: int
    start: float
    end: float
    frames: tuple[int, int] = field(default=(-1, -1), compare=False)  # Wireshark's: the
    # command's and the completion's frames (original indices)


@dataclass
class Flow:
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int
    payload_at: int  # the payload's offset in the frame
    payload_end: int


# link types read (pcap LINKTYPE_*): each frame becomes an Ethernet frame of its IP packet
_ETHERNET, _NULL, _LOOP, _SLL, _SLL2 = 1, 0, 108, 113, 276
_RAW, _RAW_BSD, _RAW_OPENBSD, _IPV4, _IPV6 = 101, 12, 14, 228, 229
_ETH_HEAD = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01"  # dst, src MACs


def _ethernet(linktype: int, data: bytes) -> bytes | None:
    """The frame as Ethernet (module header: any capture's link type), or None."""
    if linktype == _ETHERNET:
        return data
    if linktype in (_NULL, _LOOP):  # a 4-byte address family, host or network order
        ip = data[4:]
    elif linktype in (_RAW, _RAW_BSD, _RAW_OPENBSD, _IPV4, _IPV6):
        ip = data
    elif linktype == _SLL and len(data) >= 16:
        et = struct.unpack_from("!H", data, 14)[0]
        return _ETH_HEAD + data[14:16] + data[16:] if et in (0x0800, 0x86DD, 0x8100) else None
    elif linktype == _SLL2 and len(data) >= 20:
        et = struct.unpack_from("!H", data, 0)[0]
        return _ETH_HEAD + data[0:2] + data[20:] if et in (0x0800, 0x86DD, 0x8100) else None
    else:
        return None
    if not ip:
        return None
    version = ip[0] >> 4
    if version not in (4, 6):
        return None
    return _ETH_HEAD + (b"\x08\x00" if version == 4 else b"\x86\xdd") + ip


def read_pcap(path: Path) -> tuple[int, list[Frame]]:
    """(link type, frames) of a capture, gzipped or not: classic pcap (either byte order,
    micro- or nanoseconds) or pcapng, of Ethernet, Linux cooked (v1, v2), raw IP or BSD
    loopback frames -- all given as Ethernet (link type 1): what the sensor reads."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    packets = _pcapng(raw, path) if raw[:4] == b"\n\r\r\n" else _pcap(raw, path)
    frames = []
    for ts, linktype, data in packets:
        eth = _ethernet(linktype, data)
        if eth is not None:
            frames.append(Frame(ts, eth, len(frames)))
    return _ETHERNET, frames


def _pcap(raw: bytes, path: Path) -> Iterator[tuple[float, int, bytes]]:
    magic = raw[:4]
    orders = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
              b"\xa1\xb2\xc3\xd4": (">", 1e-6), b"\xa1\xb2\x3c\x4d": (">", 1e-9)}  # fmt: skip
    if magic not in orders:
        raise ValueError(f"{path}: neither pcap nor pcapng")
    order, scale = orders[magic]
    linktype = struct.unpack_from(order + "I", raw, 20)[0] & 0x0FFFFFFF
    rec = struct.Struct(order + "IIII")
    pos = _PCAP_HEAD.size
    while pos + rec.size <= len(raw):
        sec, frac, incl, _ = rec.unpack_from(raw, pos)
        pos += rec.size
        yield sec + frac * scale, linktype, raw[pos : pos + incl]
        pos += incl


def _pcapng(raw: bytes, path: Path) -> Iterator[tuple[float, int, bytes]]:
    """pcapng's blocks: section headers (byte order), interfaces (link type, time
    resolution), enhanced and simple packets."""
    pos, order = 0, "<"
    links: list[tuple[int, int]] = []  # (link type, time units a second)
    while pos + 12 <= len(raw):
        btype = struct.unpack_from(order + "I", raw, pos)[0]
        if btype == 0x0A0D0D0A:  # a section: its byte-order magic, new interfaces
            order = "<" if raw[pos + 8 : pos + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            links = []
        blen = struct.unpack_from(order + "I", raw, pos + 4)[0]
        if blen < 12 or pos + blen > len(raw):
            break
        body = raw[pos + 8 : pos + blen - 4]
        if btype == 1:  # interface description: link type, if_tsresol option
            linktype = struct.unpack_from(order + "H", body, 0)[0]
            links.append((linktype, _tsresol(body[8:], order)))
        elif btype == 6 and len(body) >= 20:  # enhanced packet
            iface, hi, lo, cap, _ = struct.unpack_from(order + "IIIII", body, 0)
            if iface < len(links):
                linktype, per = links[iface]
                ticks = (hi << 32) | lo
                yield ticks // per + (ticks % per) / per, linktype, body[20 : 20 + cap]
        elif btype == 3 and links and len(body) >= 4:  # simple packet: no time
            yield 0.0, links[0][0], body[4:]
        pos += blen


def _tsresol(options: bytes, order: str) -> int:
    """An interface's time units a second (if_tsresol, option 9; microseconds else)."""
    pos = 0
    while pos + 4 <= len(options):
        code, length = struct.unpack_from(order + "HH", options, pos)
        if code == 0:
            break
        if code == 9 and length >= 1:
            v = options[pos + 4]
            return 2 ** (v & 0x7F) if v & 0x80 else 10**v
        pos += 4 + ((length + 3) & ~3)
    return 10**6


def write_pcap(path: Path, frames: list[Frame], linktype: int = 1) -> None:
    out = [_PCAP_HEAD.pack(0xA1B23C4D, 2, 4, 0, 0, 262144, linktype)]
    for f in frames:
        ns = round(f.ts * 1e9)
        out.append(_REC.pack(ns // 10**9, ns % 10**9, len(f.data), len(f.data)))
        out.append(f.data)
    path.write_bytes(b"".join(out))


def flow_of(data: bytes) -> Flow | None:
    """Ethernet (802.1Q tags skipped), IPv4 or IPv6, TCP: the segment's flow, or None."""
    if len(data) < 14:
        return None
    et, p = struct.unpack_from("!H", data, 12)[0], 14
    while et in (0x8100, 0x88A8) and len(data) >= p + 4:
        et, p = struct.unpack_from("!H", data, p + 2)[0], p + 4
    if et == 0x0800 and len(data) >= p + 20:
        ihl = (data[p] & 15) * 4
        if data[p + 9] != 6 or struct.unpack_from("!H", data, p + 6)[0] & 0x3FFF:
            return None
        end = min(len(data), p + struct.unpack_from("!H", data, p + 2)[0])
        src = ".".join(map(str, data[p + 12 : p + 16]))
        dst = ".".join(map(str, data[p + 16 : p + 20]))
        t = p + ihl
    elif et == 0x86DD and len(data) >= p + 40:
        import ipaddress

        if data[p + 6] != 6:
            return None
        end = min(len(data), p + 40 + struct.unpack_from("!H", data, p + 4)[0])
        src = str(ipaddress.IPv6Address(data[p + 8 : p + 24]))
        dst = str(ipaddress.IPv6Address(data[p + 24 : p + 40]))
        t = p + 40
    else:
        return None
    if len(data) < t + 20:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", data, t)
    off = t + (data[t + 12] >> 4) * 4
    return Flow(src, sport, dst, dport, seq, data[t + 13], off, max(off, end))


def conn_key(f: Flow) -> tuple[ConnKey, bool] | None:
    """The connection (initiator first) and whether the segment goes to the target."""
    if f.dport in STORAGE_PORTS:
        return (f.src, f.sport, f.dst, f.dport), True
    if f.sport in STORAGE_PORTS:
        return (f.dst, f.dport, f.src, f.sport), False
    return None


# ---------------------------------------------------------------- Wireshark
@dataclass
class Reference:
    """What Wireshark shows of a capture: its timed IOs, and per connection the names
    its login (InitiatorName, TargetName) or connect (HOSTNQN, SUBNQN) carried, with
    the frame of that login request."""

    ios: list[Io]
    names: dict[ConnKey, tuple[str, str, int]]  # (target, initiator, frame index)


def tshark_ios(pcap: Path, frames: list[Frame]) -> list[Io]:
    """Wireshark's timed reads and writes in pcap (frames: the same capture, read here,
    for the connections and the frames' times)."""
    return reference(pcap, frames).ios


def reference(pcap: Path, frames: list[Frame]) -> Reference:
    """Wireshark's view of pcap (module header)."""
    if shutil.which("tshark") is None:
        raise FileNotFoundError("tshark (Debian: tshark) is not installed")
    cmd = ["tshark", "-n", "-r", str(pcap), "-T", "pdml", "-J", "iscsi scsi nvme-tcp nvme"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    ios: list[Io] = []
    names: dict[ConnKey, tuple[str, str, int]] = {}
    nvme_cmds: dict[tuple[int, int], int] = {}  # (frame, cid) -> opcode
    nvme_done: list[tuple[int, int, int]] = []  # (frame, cid, command frame)
    for packet in _packets(proc.stdout):
        num = int(packet.find("proto[@name='geninfo']/field[@name='num']").get("show"))  # type: ignore[union-attr]
        pending: tuple[int, int] | None = None  # an iSCSI completion: (tag, request frame)
        nvme_cid: int | None = None
        for proto in packet.findall("proto"):
            name = proto.get("name")
            f = {x.get("name"): x.get("show") for x in proto.iter("field")}
            if name == "iscsi":
                pending = None
                if "iscsi.time" in f and "iscsi.request_frame" in f:
                    pending = (int(f["iscsi.initiatortasktag"], 16), int(f["iscsi.request_frame"]))
                if f.get("iscsi.opcode") == "0x03":  # a login request: its names
                    said = dict(
                        x.get("show", "").partition("=")[::2]
                        for x in proto.iter("field")
                        if x.get("name") == "iscsi.keyvalue"
                    )
                    _name(names, frames, num - 1, said.get("TargetName", ""),
                          said.get("InitiatorName", ""))  # fmt: skip
            elif name == "scsi" and pending is not None and "scsi_sbc.opcode" in f:
                op = int(f["scsi_sbc.opcode"], 16)
                kind = READ if op in SCSI_READS else WRITE if op in SCSI_WRITES else 0
                if kind:
                    ios.append(_io(frames, pending[1] - 1, num - 1, pending[0], kind))
                pending = None
            elif name == "nvme-tcp":
                nvme_cid = None
            elif name == "nvme":
                if "nvme.fabrics.cmd.connect.data.subnqn" in f:
                    _name(
                        names,
                        frames,
                        num - 1,
                        f["nvme.fabrics.cmd.connect.data.subnqn"],
                        f.get("nvme.fabrics.cmd.connect.data.hostnqn", ""),
                    )
                if "nvme.cmd.opc" in f and "nvme.cmd.cid" in f:
                    nvme_cmds[num, int(f["nvme.cmd.cid"], 16)] = int(f["nvme.cmd.opc"], 16)
                if "nvme.cqe.cid" in f and "nvme.cmd_pkt" in f:
                    nvme_cid = int(f["nvme.cqe.cid"], 16)
                    nvme_done.append((num, nvme_cid, int(f["nvme.cmd_pkt"])))
        packet.clear()
    proc.wait()
    for num, cid, cmd_frame in nvme_done:
        kind = NVME_OPS.get(nvme_cmds.get((cmd_frame, cid), -1), 0)
        if kind:
            ios.append(_io(frames, cmd_frame - 1, num - 1, cid, kind))
    return Reference(ios, names)


def _name(names, frames, i, target, initiator) -> None:  # type: ignore[no-untyped-def]
    """A login's or connect's names, for its connection (the first login names it)."""
    f = flow_of(frames[i].data)
    key = conn_key(f) if f is not None else None
    if key is not None and (target or initiator):
        t, n, _ = names.get(key[0], ("", "", i))
        names.setdefault(key[0], (target or t, initiator or n, frames[i].index))


def _packets(stream) -> Iterator[ET.Element]:  # type: ignore[no-untyped-def]
    for event, elem in ET.iterparse(stream, events=("end",)):
        if event == "end" and elem.tag == "packet":
            yield elem


def _io(frames: list[Frame], cmd_i: int, done_i: int, tag: int, op: int) -> Io:
    f = flow_of(frames[done_i].data)
    assert f is not None
    key = conn_key(f)
    assert key is not None
    cmd, done = frames[cmd_i], frames[done_i]
    return Io(key[0], tag, op, cmd.ts, done.ts, (cmd.index, done.index))


# ---------------------------------------------------------------- the tracker
@dataclass
class Run:
    """A tracker's walk over frames: its IOs, and per frame (by its original index)
    the state of the walk of the segment's direction after it."""

    ios: list[Io] = field(default_factory=list)
    state_after: dict[int, int] = field(default_factory=dict)
    tracker: Tracker = field(default_factory=Tracker)
    # per connection the names the tracker had for it (before it forgot it)
    names: dict[ConnKey, tuple[str, str]] = field(default_factory=dict)
    # the frames (original indices) whose payload starts where the walk, in sync, had
    # its next header
    header_starts: set[int] = field(default_factory=set)
    # per connection: why it is not measurable ("" when it is), and its walks' desyncs
    conns: dict[ConnKey, tuple[str, int]] = field(default_factory=dict)


def walk(frames: list[Frame], cut: tuple[int, int] | None = None) -> Run:
    """The tracker over frames; cut: (frame, payload bytes) -- that frame's first bytes
    are not seen (the sensor starts there)."""
    run = Run()
    tr = run.tracker
    tr.on_io = lambda k, tag, op, s, e: run.ios.append(Io(k, tag, op, s, e))
    forget = tr._forget

    def note(key: ConnKey, c: Connection) -> None:
        if c.target or c.initiator_name:
            run.names[key] = (c.target, c.initiator_name)
        was = run.conns.get(key, ("", 0))
        desyncs = c.to_target.counters.desyncs + c.to_initiator.counters.desyncs
        run.conns[key] = (c.unmeasurable or was[0], desyncs + was[1])

    def forgetting(key: ConnKey) -> None:  # its names, before the tracker drops them
        c = tr.conns.get(key)
        if c is not None:
            note(key, c)
        forget(key)

    tr._forget = forgetting  # type: ignore[method-assign]
    for i, fr in enumerate(frames):
        f = flow_of(fr.data)
        if f is None:
            continue
        seq, start = f.seq, f.payload_at
        if cut is not None and i == cut[0]:
            start = min(f.payload_end, start + cut[1])
            seq = (seq + start - f.payload_at) & 0xFFFFFFFF
        payload = memoryview(fr.data)[start : f.payload_end]
        syn = bool(f.flags & 0x02) and (cut is None or i != cut[0])
        key = conn_key(f)
        if key is not None and payload and key[0] in tr.conns:
            c = tr.conns[key[0]]
            st = c.to_target if key[1] else c.to_initiator
            if st.state == 0 and st.pdu_seq == seq and not st.carry and st.expect_seq == seq:
                run.header_starts.add(fr.index)
        tr.segment(fr.ts, f.src, f.sport, f.dst, f.dport, seq, payload, syn,
                   bool(f.flags & 0x05))  # fmt: skip
        if key is not None and key[0] in tr.conns:
            c = tr.conns[key[0]]
            run.state_after[fr.index] = (c.to_target if key[1] else c.to_initiator).state
    for key, c in tr.conns.items():
        note(key, c)
    return run


def cut_at(frames: list[Frame], offset: int) -> tuple[list[Frame], tuple[int, int]]:
    """The capture from its offset-th payload byte on (storage segments' payloads in
    capture order): the frames from the one holding that byte, and the cut."""
    pos = 0
    for i, fr in enumerate(frames):
        f = flow_of(fr.data)
        n = f.payload_end - f.payload_at if f is not None else 0
        if n and pos + n > offset:
            return frames[i:], (0, offset - pos)
        pos += n
    return [], (0, 0)


def cut_frames(frames: list[Frame], offset: int) -> list[Frame]:
    """cut_at() as frames to replay: the first one's payload cut, its sequence number and
    IP length set to match (the sensor never sees a SYN there)."""
    rest, (_, k) = cut_at(frames, offset)
    if not rest:
        return []
    first = rest[0]
    f = flow_of(first.data)
    assert f is not None
    data = bytearray(first.data[: f.payload_at] + first.data[f.payload_at + k :])
    ip = 14
    et = struct.unpack_from("!H", data, 12)[0]
    while et in (0x8100, 0x88A8):
        et, ip = struct.unpack_from("!H", data, ip + 2)[0], ip + 4
    if et == 0x0800:
        struct.pack_into("!H", data, ip + 2, struct.unpack_from("!H", data, ip + 2)[0] - k)
        t = ip + (data[ip] & 15) * 4
    else:
        struct.pack_into("!H", data, ip + 4, struct.unpack_from("!H", data, ip + 4)[0] - k)
        t = ip + 40
    struct.pack_into("!I", data, t + 4, (f.seq + k) & 0xFFFFFFFF)
    data[t + 13] &= ~0x02  # no SYN
    return [Frame(first.ts, bytes(data), first.index), *rest[1:]]


def payload_bytes(frames: list[Frame]) -> int:
    total = 0
    for fr in frames:
        f = flow_of(fr.data)
        if f is not None:
            total += f.payload_end - f.payload_at
    return total


def damage(
    frames: list[Frame], seed: int, flip: float = 0.0, drop: float = 0.0, swap: float = 0.0
) -> tuple[list[Frame], set[int]]:
    """The frames with damage (module header); the original indices of the frames
    damaged (flipped, dropped, or swapped)."""
    rnd = random.Random(seed)
    hit: set[int] = set()
    out = []
    for fr in frames:
        if drop and rnd.random() < drop:
            hit.add(fr.index)
            continue
        f = flow_of(fr.data)
        if flip and f is not None and f.payload_end > f.payload_at and rnd.random() < flip:
            at = rnd.randrange(f.payload_at, f.payload_end)
            data = bytearray(fr.data)
            data[at] ^= rnd.randrange(1, 256)
            fr = Frame(fr.ts, bytes(data), fr.index)
            hit.add(fr.index)
        out.append(fr)
    if swap:
        i = 0
        while i + 1 < len(out):
            if rnd.random() < swap:
                out[i], out[i + 1] = out[i + 1], out[i]
                hit.update((out[i].index, out[i + 1].index))
                i += 2
            else:
                i += 1
    return out, hit


# ---------------------------------------------------------------- comparing
@dataclass
class Score:
    expected: int  # Wireshark's IOs the tracker could know
    matched: int  # of those, the tracker's (same connection and tag, times within TOLERANCE_S)
    extra: int  # the tracker's IOs Wireshark does not have

    @property
    def share(self) -> float:
        return self.matched / self.expected if self.expected else 1.0

    def __str__(self) -> str:
        return f"{self.matched}/{self.expected} ({self.share:.2%}), {self.extra} extra"


def score(reference: list[Io], got: list[Io], op: int, knowable=lambda io: True) -> Score:  # type: ignore[no-untyped-def]
    """How many of reference's IOs of op (those knowable) got has."""
    mine: dict[tuple[ConnKey, int], list[Io]] = {}
    for io in got:
        if io.op == op:
            mine.setdefault((io.conn, io.tag), []).append(io)
    want = [io for io in reference if io.op == op and knowable(io)]
    matched = 0
    used: set[int] = set()
    for io in want:
        for cand in mine.get((io.conn, io.tag), ()):
            if id(cand) in used:
                continue
            if abs(cand.start - io.start) <= TOLERANCE_S and abs(cand.end - io.end) <= TOLERANCE_S:
                matched += 1
                used.add(id(cand))
                break
    ref = {(io.conn, io.tag, round(io.start, 5), round(io.end, 5)) for io in reference}
    extra = sum(1 for io in got if io.op == op
                and (io.conn, io.tag, round(io.start, 5), round(io.end, 5)) not in ref)  # fmt: skip
    return Score(len(want), matched, extra)


def streams(frames: list[Frame]) -> dict[tuple[ConnKey, bool], list[Frame]]:
    """The storage segments with payload of each connection direction, in capture order."""
    out: dict[tuple[ConnKey, bool], list[Frame]] = {}
    for fr in frames:
        f = flow_of(fr.data)
        key = conn_key(f) if f is not None else None
        if key is not None and f is not None and f.payload_end > f.payload_at:
            out.setdefault(key, []).append(fr)
    return out


def resync_delays(
    original: list[Frame], damaged: list[Frame], hit: set[int], run: Run, starts: set[int]
) -> list[tuple[tuple[ConnKey, bool], int | None]]:
    """Per connection direction with damage: after its last damaged segment (flipped,
    swapped, or the one after a segment dropped), how many segments that start with a
    header (starts: from a clean walk) it took to be in sync (None: not in sync by the
    capture's end; streams with fewer than 2 such segments after the damage are left
    out)."""
    before = {k: [fr.index for fr in v] for k, v in streams(original).items()}
    out = []
    for key, segs in streams(damaged).items():
        orig = before.get(key, [])
        place = {i: n for n, i in enumerate(orig)}
        seen = {fr.index for fr in segs}
        last = None
        for pos, fr in enumerate(segs):
            at = place.get(fr.index, -1)
            dropped_before = at > 0 and orig[at - 1] not in seen
            if fr.index in hit or dropped_before:
                last = pos
        if last is None:
            continue
        after = [fr.index for fr in segs[last + 1 :] if fr.index in starts]
        if len(after) < 2:
            continue
        took = next((n for n, i in enumerate(after, 1) if run.state_after.get(i) == 0), None)
        out.append((key, took))
    return out
