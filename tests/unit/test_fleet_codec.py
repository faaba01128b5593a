"""fleet/codec.py: Samples round-trip through JSON; every bad field is named, with one
exception type (BadSamples, a ValueError)."""

import copy
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from santhrottle.appliance.fleet.codec import (
    FORMAT,
    BadSamples,
    SampleBatch,
    decode,
    decode_classes,
    encode,
    encode_classes,
)
from santhrottle.controller.domain import DeviceSample, IoSample, ReadSample, Samples, WriteSample

SAMPLES = Samples(
    reads=[ReadSample("vg0", 6, 0.004), ReadSample("vg1", 0, 0.0, 1e6, 2)],
    writes=[WriteSample("vg0", "10.0.0.7", 2.5e6), WriteSample("vg0", "fd00::7", 0.0)],
    devices=[DeviceSample("vg0", 120, 0.003, 1.5)],
    ios=[
        IoSample("vg0", "10.0.0.7", 30.0, 1.2e6, 2.0),
        IoSample("vg0", "h", 1, 2, 0, 0.002, 0.003),
    ],
)
BATCH = SampleBatch("gw-a", 7, 12.5, SAMPLES)


def _as_lists(s: Samples) -> tuple:
    return tuple(list(x) for x in (s.reads, s.writes, s.devices, s.ios))


def test_round_trip_through_json():
    wire = json.loads(json.dumps(encode(BATCH)))
    got = decode(wire)
    assert (got.appliance, got.seq, got.at_s) == ("gw-a", 7, 12.5)
    assert _as_lists(got.samples) == _as_lists(SAMPLES)
    assert isinstance(got.samples.writes[0], WriteSample)
    assert isinstance(got.samples.reads[0], ReadSample)


def test_the_worked_example():
    one = SampleBatch("gw-a", 7, 12.3, Samples(reads=[ReadSample("vg0", 6, 0.004)]))
    assert encode(one) == {
        "v": 1, "appliance": "gw-a", "seq": 7, "at_s": 12.3,
        "reads": [["vg0", 6, 0.004, None, None]], "writes": [], "devices": [], "ios": [],
    }  # fmt: skip


def test_empty_batch():
    got = decode(encode(SampleBatch("a", 0, 0.0, Samples())))
    assert _as_lists(got.samples) == ([], [], [], [])


names = st.text(min_size=1, max_size=8)
nums = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=10**9)


@given(
    reads=st.lists(
        st.builds(ReadSample, names, counts, nums, st.none() | nums, st.none() | counts)
    ),
    writes=st.lists(st.builds(WriteSample, names, names, nums)),
    devices=st.lists(st.builds(DeviceSample, names, counts, nums, nums)),
    ios=st.lists(
        st.builds(
            IoSample,
            names,
            names,
            nums,
            nums,
            nums,
            st.none() | nums,
            st.none() | nums,
            busy_s=st.none(),  # a target host's LUN counter: not in the fleet's format
        )
    ),
)
def test_round_trip_any(reads, writes, devices, ios):
    s = Samples(reads, writes, devices, ios)
    got = decode(json.loads(json.dumps(encode(SampleBatch("x", 1, 0.5, s)))))
    assert _as_lists(got.samples) == _as_lists(s)


def _with(path: tuple, value) -> dict:
    wire = copy.deepcopy(encode(BATCH))
    at = wire
    for step in path[:-1]:
        at = at[step]
    if value is _DELETE:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return wire


_DELETE = object()
BAD = [
    # (where, bad value, the field the error names)
    (("v",), 2, "v"),
    (("appliance",), "", "appliance"),
    (("appliance",), 3, "appliance"),
    (("seq",), -1, "seq"),
    (("seq",), 1.5, "seq"),
    (("seq",), True, "seq"),
    (("at_s",), "now", "at_s"),
    (("at_s",), math.inf, "at_s"),
    (("reads",), {}, "reads"),
    (("reads", 0), "vg0", "reads[0]"),
    (("reads", 0), ["vg0", 6], "reads[0]"),
    (("reads", 1, 0), None, "reads[1].resource"),
    (("reads", 0, 1), -1, "reads[0].reads"),
    (("reads", 0, 1), 6.0, "reads[0].reads"),
    (("reads", 0, 2), math.nan, "reads[0].read_latency_s"),
    (("reads", 0, 2), None, "reads[0].read_latency_s"),
    (("reads", 1, 3), -5.0, "reads[1].write_bps"),
    (("reads", 1, 4), 0.5, "reads[1].reads_in_flight"),
    (("writes", 1, 1), "", "writes[1].initiator"),
    (("writes", 0, 2), "fast", "writes[0].write_bps"),
    (("devices", 0, 1), 1.5, "devices[0].ios"),
    (("devices", 0, 2), -0.001, "devices[0].latency_s"),
    (("devices", 0, 3), None, "devices[0].in_flight"),
    (("ios", 1, 2), -1, "ios[1].ios"),
    (("ios", 0, 3), None, "ios[0].bytes"),
    (("ios", 0, 4), [], "ios[0].reads"),
    (("ios", 1, 5), "x", "ios[1].read_latency_s"),
    (("ios", 1, 6), math.inf, "ios[1].latency_s"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD, ids=lambda x: str(x))
def test_every_bad_field_is_named(path, value, field):
    with pytest.raises(BadSamples) as e:
        decode(_with(path, value))
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ")
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "key", ["v", "appliance", "seq", "at_s", "reads", "writes", "devices", "ios"]
)
def test_a_missing_key_is_named(key):
    with pytest.raises(BadSamples) as e:
        decode(_with((key,), _DELETE))
    assert e.value.field == key


@pytest.mark.parametrize("raw", [None, [], "x", 3, json.dumps(encode(BATCH))])
def test_not_an_object(raw):
    with pytest.raises(BadSamples) as e:
        decode(raw)
    assert e.value.field == "payload"


def test_format_is_the_encoders():
    assert encode(BATCH)["v"] == FORMAT


def test_decision_members_go_through_the_one_address_check():
    """appliance/addresses.py: canonical forms kept, what no initiator has dropped
    with why, the rest of the decision holds."""
    raw = {"v": 1, "seq": 3, "class": 7, "members": {
        "FD00:0::2": 5, "::ffff:10.0.0.3": 6, "10.0.0.3": 4, "0.0.0.0": 7, "224.0.0.1": 7,
        "fe80::1%eth1": 7, "10.0.0.9": 2,
    }}  # fmt: skip
    got = decode_classes(raw, 88)
    assert got.members == {"fd00::2": 5, "10.0.0.3": 6, "10.0.0.9": 2}
    assert len(got.refused) == 3
    assert "'0.0.0.0' is unspecified" in got.refused[0]
    assert "multicast" in got.refused[1] and "link-local" in got.refused[2]
    assert encode_classes(got) == {"v": 1, "seq": 3, "class": 7, "members": got.members}
