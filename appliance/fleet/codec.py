"""The controller's Samples as JSON-able dicts, for the engine's samples/<appliance> keys.

Problem
    The leader runs the controller on the samples of every appliance, so each
    appliance publishes its Samples (controller/domain.py) through the engine
    (fleet/engine.py) as JSON.  What comes back was written by another
    appliance -- maybe another version, maybe a bug: decoding must validate
    every field and fail with one exception type that names the bad field,
    never crash the daemon with a KeyError or a TypeError.

What it does
    encode(batch) -> dict; decode(dict) -> SampleBatch, or BadSamples naming
    the field ("ios[2].read_latency_s: not a finite number >= 0").  A record
    is a list of its fields in a fixed order (10,000s of writes per
    convergence: names per record would triple the bytes):

        reads    [resource, reads, read_latency_s, write_bps|null, reads_in_flight|null]
        writes   [resource, initiator, write_bps]
        devices  [resource, ios, latency_s, in_flight]
        ios      [resource, initiator, ios, bytes, reads, read_latency_s|null, latency_s|null]

    around them: v (FORMAT, a decoder refuses others), appliance, seq (the
    publisher's counter: a reader sees whether it is new) and at_s (the
    publisher's clock when the samples ended).

Bounds
    Counts are ints >= 0 (reads, reads_in_flight, ios of devices) or numbers
    >= 0 (ios' fields are rates folded over an interval); every number is
    finite; names are non-empty strings.  A list may be empty.  Size: 10,000
    write records with IPv4 initiators encode to 0.40 MB, 10,000 IO records to
    0.70 MB; etcd refuses a request over --max-request-bytes (1.5 MiB by
    default, docs/fleet.md).

Worked example
    encode(SampleBatch("gw-a", 7, 12.3, Samples(reads=[ReadSample("vg0", 6, 0.004)])))
    -> {"v": 1, "appliance": "gw-a", "seq": 7, "at_s": 12.3,
        "reads": [["vg0", 6, 0.004, null, null]], "writes": [], "devices": [], "ios": []}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from santhrottle.appliance.addresses import AddressError, initiator_address
from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    Samples,
    WriteSample,
)

FORMAT = 1


class BadSamples(ValueError):
    """A published samples payload that does not decode; .field names the place,
    .why what is wrong there."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field, self.why = field, why


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """One appliance's samples of one interval."""

    appliance: str
    seq: int
    at_s: float
    samples: Samples


def encode(batch: SampleBatch) -> dict[str, Any]:
    s = batch.samples
    return {
        "v": FORMAT,
        "appliance": batch.appliance,
        "seq": batch.seq,
        "at_s": batch.at_s,
        "reads": [
            [r.resource, r.reads, r.read_latency_s, r.write_bps, r.reads_in_flight] for r in s.reads
        ],
        "writes": [list(w) for w in s.writes],
        "devices": [list(d) for d in s.devices],
        # busy_s stays home: a LUN's own io_ticks are a target host's (and this format's
        # seven fields are what every peer reads)
        "ios": [list(i)[:7] for i in s.ios],
    }


# -- field checks: each returns the value or raises BadSamples(field, why) --------


def _name(field: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise BadSamples(field, "not a non-empty string")
    return v


def _count(field: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadSamples(field, "not an integer >= 0")
    return v


def _number(field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise BadSamples(field, "not a finite number >= 0")
    return float(v)


def _maybe(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def checked(field: str, v: Any) -> Any:
        return None if v is None else check(field, v)

    return checked


_Check = Callable[[str, Any], Any]
# Per list: the record type and its fields' names and checks, in the wire order.
_RECORDS: dict[str, tuple[Callable[..., Any], tuple[tuple[str, _Check], ...]]] = {
    "reads": (
        ReadSample,
        (
            ("resource", _name),
            ("reads", _count),
            ("read_latency_s", _number),
            ("write_bps", _maybe(_number)),
            ("reads_in_flight", _maybe(_count)),
        ),
    ),
    "writes": (
        WriteSample,
        (("resource", _name), ("initiator", _name), ("write_bps", _number)),
    ),
    "devices": (
        DeviceSample,
        (("resource", _name), ("ios", _count), ("latency_s", _number), ("in_flight", _number)),
    ),
    "ios": (
        IoSample,
        (
            ("resource", _name),
            ("initiator", _name),
            ("ios", _number),
            ("bytes", _number),
            ("reads", _number),
            ("read_latency_s", _maybe(_number)),
            ("latency_s", _maybe(_number)),
        ),
    ),
}


def _records(kind: str, raw: Any) -> list[Any]:
    make, fields = _RECORDS[kind]
    if not isinstance(raw, list):
        raise BadSamples(kind, "not a list")
    out = []
    for n, rec in enumerate(raw):
        where = f"{kind}[{n}]"
        if not isinstance(rec, list) or len(rec) != len(fields):
            raise BadSamples(where, f"not a list of {len(fields)} fields")
        values = [check(f"{where}.{name}", v) for (name, check), v in zip(fields, rec, strict=True)]
        out.append(make(*values))
    return out


def decode(raw: Any) -> SampleBatch:
    """The batch in raw (json.loads of a samples key), or BadSamples."""
    if not isinstance(raw, dict):
        raise BadSamples("payload", "not an object")
    for key in ("v", "appliance", "seq", "at_s", *_RECORDS):
        if key not in raw:
            raise BadSamples(key, "missing")
    if raw["v"] != FORMAT:
        raise BadSamples("v", f"format {raw['v']!r}, this decoder reads {FORMAT}")
    appliance = _name("appliance", raw["appliance"])
    seq = _count("seq", raw["seq"])
    at_s = _number("at_s", raw["at_s"])
    lists = {kind: _records(kind, raw[kind]) for kind in _RECORDS}
    return SampleBatch(appliance, seq, at_s, Samples(**lists))


# -- what an appliance publishes per tick, and what a leader publishes ---------------


@dataclass(frozen=True, slots=True)
class Published:
    """An appliance's samples key: its last tick's reads and devices, and its
    last convergence's writes and ios (each with its own seq)."""

    tick: SampleBatch
    conv: SampleBatch | None = None


def encode_published(p: Published) -> dict[str, Any]:
    return {"tick": encode(p.tick), "conv": None if p.conv is None else encode(p.conv)}


def decode_published(raw: Any) -> Published:
    if not isinstance(raw, dict) or "tick" not in raw or "conv" not in raw:
        raise BadSamples("payload", "not an object with tick and conv")
    tick = _nested("tick", raw["tick"])
    conv = None if raw["conv"] is None else _nested("conv", raw["conv"])
    return Published(tick, conv)


def _nested(where: str, raw: Any) -> SampleBatch:
    try:
        return decode(raw)
    except BadSamples as e:
        raise BadSamples(f"{where}.{e.field}", e.why) from None


@dataclass(frozen=True, slots=True)
class LeaderClasses:
    """A resource leader's decision: its seq (per tick), the resource's class,
    and the class of each member initiator (ramps included).  refused: what a
    decoded decision named that no initiator has (appliance/addresses.py),
    with why; dropped from members, never encoded."""

    seq: int
    delay_class: int
    members: dict[str, int]
    refused: tuple[str, ...] = ()


def encode_classes(d: LeaderClasses) -> dict[str, Any]:
    return {"v": FORMAT, "seq": d.seq, "class": d.delay_class, "members": dict(d.members)}


def decode_classes(raw: Any, max_class: int) -> LeaderClasses:
    """The decision in raw, or BadSamples; classes above max_class are refused
    (another appliance's ladder: its classes mean other delays here).  Each
    member goes through the one check of initiator addresses
    (appliance/addresses.py): in its canonical form, or dropped and said in
    .refused (0.0.0.0, a multicast address...: the rest of the decision holds)."""
    if not isinstance(raw, dict):
        raise BadSamples("decision", "not an object")
    for key in ("v", "seq", "class", "members"):
        if key not in raw:
            raise BadSamples(key, "missing")
    if raw["v"] != FORMAT:
        raise BadSamples("v", f"format {raw['v']!r}, this decoder reads {FORMAT}")
    seq = _count("seq", raw["seq"])
    k = _class("class", raw["class"], max_class)
    if not isinstance(raw["members"], dict):
        raise BadSamples("members", "not an object")
    members: dict[str, int] = {}
    refused: list[str] = []
    for ini, v in raw["members"].items():
        cls = _class(f"members.{_name('members', ini)}", v, max_class)
        try:
            addr = initiator_address(ini)
        except AddressError as e:
            refused.append(str(e))
            continue
        members[addr] = max(cls, members.get(addr, 0))
    return LeaderClasses(seq, k, members, tuple(refused))


def _class(field: str, v: Any, max_class: int) -> int:
    k = _count(field, v)
    if k > max_class:
        raise BadSamples(field, f"class {k} above this ladder's last, {max_class}")
    return k
