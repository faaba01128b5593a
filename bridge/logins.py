"""The names a connection's first PDUs carry: who the target is, who the initiator is.

Problem
    A volume on a bridge is named by its target (tracker.py's Volume), and
    an initiator group may name its members by the name they log in with
    (appliance/daemon/core/groupmap.py). Both names are on the wire once per
    connection, at its start: the iSCSI login's text and the NVMe/TCP
    fabrics connect's data. A sensor sees them in pieces -- the Python
    walker (flow.py) a whole PDU or its first 4 KiB, the kernel program
    (bpf/wire.bpf.c) a PDU's text in parts of up to 1 KiB as its segments
    pass -- and a login's text may itself span several PDUs. Login reads
    them part by part and says what each part taught.

Layouts
    iSCSI Login Request and Response (RFC 7143 sections 6.1, 11.12-11.13):
    the data segment is key=value pairs, each ended by a NUL. Flag 0x40
    (C) of byte 1: the text goes on in the next Login PDU of that
    direction, and a pair may be cut at the PDU's end. InitiatorName (13.6)
    is in the first Login Request of every connection, TargetName in that
    of a normal session; the target's answers carry the negotiated
    HeaderDigest and DataDigest; each side declares the longest data
    segment it takes (MaxRecvDataSegmentLength, 13.12).
    NVMe over Fabrics Connect command data (1,024 bytes): HOSTID at 0 (16
    bytes), CNTLID at 16, SUBNQN at 256 and HOSTNQN at 512 (256 bytes each,
    NUL-ended). Every queue (each its own TCP connection) connects.

Law
    Login per connection: a LoginText per direction (iSCSI) or a
    ConnectData (NVMe). LoginText.pdu() starts a Login PDU: its flags, its
    data segment's length (None: not known; then the text ends only at a
    NUL) and the first part of its text; part() adds the next part. A pair
    is read once its NUL (or the end of the PDU's text, without C) is seen;
    a pair cut at the end of a PDU with C goes on in the next one; a PDU
    cut short (its text longer than the sensor passes up, or a part lost)
    ends its last pair unread. ConnectData reads each NQN once its NUL, its
    256 bytes or the end of the data is there.

Bounds
    A name is 1 to NAME_MAX_BYTES bytes (223: RFC 7143's iSCSI name and the
    NVMe base specification's NQN) of printable ASCII (0x20-0x7e); an
    initiator name that is not -- empty, too long, a control or non-ASCII
    byte -- is garbage: ignored and counted (Said.bad_names; the trackers
    add it to Counters.bad_names). A target name is read as before: cut at
    NAME_MAX_BYTES, undecodable bytes replaced. A pair held across parts
    is at most MAX_PAIR_BYTES: a longer one is read as its start (a name
    that long is garbage) and its rest skipped to its NUL. by_address()
    keeps at most MAX_NAMES_PER_INITIATOR names per address, the latest
    logins'; put_bounded() is the trackers' bound on names per connection.

Worked example
    login = Login(); login.start(False, True, 0x40, 20, b"InitiatorName=iqn.20")
    -> Said() (its 20 bytes of text end inside a pair, and C says it goes on);
    login.start(False, True, 0x87, 43, b"26-11.lab:db1\\0TargetName=iqn.2026-11.lab:a\\0")
    -> Said(target="iqn.2026-11.lab:a", initiator="iqn.2026-11.lab:db1").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

NAME_MAX_BYTES = 223  # an iSCSI name's and an NQN's limit
CONTINUES = 0x40  # a Login PDU's C flag: its text goes on in the next one
MAX_PAIR_BYTES = 1024  # the longest key=value held across parts
CONNECT_DATA_BYTES = 1024
SUBNQN = slice(256, 512)
HOSTNQN = slice(512, 768)
MAX_NAMES_PER_INITIATOR = 16  # per address (an address may host several initiators)

TARGET_NAME, INITIATOR_NAME = b"TargetName", b"InitiatorName"
HEADER_DIGEST, DATA_DIGEST = b"HeaderDigest", b"DataDigest"
MAX_RECV = b"MaxRecvDataSegmentLength"
_LOGIN_KEYS = frozenset({TARGET_NAME, INITIATOR_NAME, HEADER_DIGEST, DATA_DIGEST, MAX_RECV})
SEGMENT_LIMIT_MAX = (1 << 24) - 1  # RFC 7143 13.12: 512 to 2^24 - 1
_CRC32C = b"CRC32C"


def wire_name(raw: bytes) -> str | None:
    """raw as a name (module header, Bounds), or None for garbage."""
    if not 0 < len(raw) <= NAME_MAX_BYTES or not all(0x20 <= b <= 0x7E for b in raw):
        return None
    return raw.decode("ascii")


def target_name(raw: bytes) -> str | None:
    """A target's name as the volumes take it (None: empty)."""
    return raw[:NAME_MAX_BYTES].decode("ascii", "replace") if raw else None


class LoginText:
    """One direction's login text, PDU by PDU and part by part: the wanted keys' values."""

    __slots__ = ("carry", "continues", "left", "skipping")

    def __init__(self) -> None:
        self.carry = b""  # a pair not ended yet
        self.left: int | None = 0  # bytes of the current PDU's text still to come
        self.continues = False  # the current PDU's C flag
        self.skipping = False  # inside a pair longer than MAX_PAIR_BYTES: up to its NUL

    def pdu(self, flags: int, total: int | None, data: bytes) -> dict[bytes, bytes]:
        """A Login PDU: its flags, its text's length and the first part of it."""
        if not (self.continues and self.left == 0):  # no pair goes on from the last one
            self.carry, self.skipping = b"", False
        self.continues = bool(flags & CONTINUES)
        self.left = total
        return self.part(data)

    def part(self, data: bytes) -> dict[bytes, bytes]:
        """The next part of the current PDU's text; the wanted pairs it ended."""
        if self.left is not None:
            data = data[: self.left]
            self.left -= len(data)
        if self.skipping:
            nul = data.find(b"\0")
            data = b"" if nul < 0 else data[nul + 1 :]
            self.skipping = nul < 0
        pairs = (self.carry + data).split(b"\0")
        rest = pairs.pop()
        if self.left == 0 and not self.continues:  # the text's end ends its last pair
            pairs.append(b"" if self.skipping else rest)
            rest, self.skipping = b"", False
        elif len(rest) > MAX_PAIR_BYTES:
            pairs.append(rest)  # its start: a name that long is garbage
            rest, self.skipping = b"", True
        self.carry = rest
        out = {}
        for pair in pairs:
            key, eq, value = pair.partition(b"=")
            if eq and key in _LOGIN_KEYS:
                out[key] = value
        return out


class ConnectData:
    """One NVMe connect's data, part by part: SUBNQN and HOSTNQN, each once."""

    __slots__ = ("data", "read", "total")

    def __init__(self, total: int | None) -> None:
        self.data = b""
        self.total = total
        self.read: set[str] = set()

    def part(self, data: bytes) -> dict[bytes, bytes]:
        if len(self.read) == 2:
            return {}
        self.data += data[: max(0, CONNECT_DATA_BYTES - len(self.data))]
        whole = self.total is not None and len(self.data) >= min(self.total, CONNECT_DATA_BYTES)
        out = {}
        for key, where in (("SUBNQN", SUBNQN), ("HOSTNQN", HOSTNQN)):
            if key in self.read:
                continue
            field = self.data[where]
            nul = field.find(b"\0")
            if nul >= 0:
                field = field[:nul]
            elif len(field) < where.stop - where.start and not whole:
                continue  # more to come
            self.read.add(key)
            out[key.encode()] = field
        if len(self.read) == 2:
            self.data = b""  # both read: nothing more to keep
        return out


@dataclass(slots=True)
class Said:
    """What one part of a login or connect taught (None: nothing new)."""

    target: str | None = None
    initiator: str | None = None
    digests: tuple[bool, bool] | None = None  # iSCSI (header, data): CRC32C or not
    bad_names: int = 0
    # iSCSI MaxRecvDataSegmentLength its sender declared: the longest data segment it
    # takes once the login is through
    segment_limit: int | None = None


class Login:
    """What one connection's login or connect says, as its parts come (module header)."""

    __slots__ = ("_digests", "_readers")

    def __init__(self) -> None:
        self._readers: dict[bool, LoginText | ConnectData] = {}
        self._digests: dict[bytes, bytes] = {}  # the target's answers, the login through

    def start(
        self, connect: bool, to_target: bool, flags: int, total: int | None, data: bytes
    ) -> Said:
        """A Login PDU (connect False) or an NVMe connect: its first part."""
        if connect:
            reader: LoginText | ConnectData = ConnectData(total)
            self._readers[to_target] = reader
            return self._said(reader.part(data), to_target)
        text = self._readers.get(to_target)
        if not isinstance(text, LoginText):
            text = self._readers[to_target] = LoginText()
        return self._said(text.pdu(flags, total, data), to_target)

    def more(self, to_target: bool, data: bytes) -> Said:
        """The next part of the last PDU started in that direction."""
        reader = self._readers.get(to_target)
        return Said() if reader is None else self._said(reader.part(data), to_target)

    def _said(self, values: dict[bytes, bytes], to_target: bool) -> Said:
        out = Said()
        if not values:
            return out
        limit = values.get(MAX_RECV, b"")
        if limit.isdigit() and len(limit) <= 9 and int(limit) <= SEGMENT_LIMIT_MAX:
            out.segment_limit = int(limit)
        if to_target:
            for key in (TARGET_NAME, b"SUBNQN"):
                if key in values:
                    out.target = target_name(values[key]) or out.target
            for key in (INITIATOR_NAME, b"HOSTNQN"):
                if key in values:
                    name = wire_name(values[key])
                    if name is None:
                        out.bad_names += 1
                    else:
                        out.initiator = name
        elif HEADER_DIGEST in values or DATA_DIGEST in values:
            d = self._digests
            d.update((k, values[k]) for k in (HEADER_DIGEST, DATA_DIGEST) if k in values)
            out.digests = (d.get(HEADER_DIGEST) == _CRC32C, d.get(DATA_DIGEST) == _CRC32C)
        return out


def by_address(logins: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """(initiator address, name), oldest login first -> each address's names, sorted:
    at most MAX_NAMES_PER_INITIATOR, the latest logins'."""
    acc: dict[str, dict[str, None]] = {}
    for addr, name in logins:
        names = acc.setdefault(addr, {})
        names.pop(name, None)
        names[name] = None
        if len(names) > MAX_NAMES_PER_INITIATOR:
            del names[next(iter(names))]
    return {a: tuple(sorted(n)) for a, n in acc.items()}


K = TypeVar("K")
V = TypeVar("V")


def put_bounded(d: dict[K, V], key: K, value: V, cap: int) -> int:
    """d[key] = value as its newest entry, the oldest dropped when d holds cap: the
    entries dropped (0 or 1)."""
    d.pop(key, None)
    dropped = 0
    if len(d) >= cap:
        del d[next(iter(d))]
        dropped = 1
    d[key] = value
    return dropped
