"""Fuzz of the control protocol through the real server on a Unix socket: random JSON
values, random bytes, huge numbers, deep nesting, and every command with random
argument values, against a real Daemon whose actuator refuses what the kernel would.

Each reply is one line of JSON with ok (true/false) and protocol; no exception reaches
the server's loop (loop_errors, the escapes, is 0); the server still answers a ping
afterwards; and nothing invalid reached the daemon's state: pins are canonical IPv4 or
IPv6 addresses with whole classes in 0..max_class and known modes, thresholds are finite
and positive on known resources, and status still encodes as strict JSON after ticks.
CASES counts the requests sent; -s prints them with the escapes.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from santhrottle.appliance.config.schema import PIN_MODES
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.control.requests import COMMANDS
from santhrottle.appliance.daemon.control.server import ControlServer
from santhrottle.appliance.datapath.names import check_ip, is_canonical_ip
from tests.unit.test_daemon import handle, status_of

from .test_daemon import FakeActuator, make, run_for

CASES: dict[str, int] = {}
FUZZ = settings(
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

pytestmark = pytest.mark.fuzz  # every test here runs a fuzzer (its @given is inside)


class StrictActuator(FakeActuator):
    """Refuses a batch the way the kernel's sets do: an address that is not canonical,
    a class that is not a whole number in range, an unknown mode."""

    max_class = 100

    def set_classes(self, classes, mode=None, *, ordered=True):
        assert mode in PIN_MODES, mode
        for ip, k in classes.items():
            assert check_ip(ip) == ip, ip
            assert type(k) is int and 0 <= k <= self.max_class, k
        return super().set_classes(classes, mode, ordered=ordered)


@contextlib.contextmanager
def fuzzed_daemon(tmp_path):
    d, vt, _sensors, _act = make()
    d.actuator = StrictActuator()
    run_for(d, vt, 2.0)
    path = str(tmp_path / "c.sock")
    srv = ControlServer(path, Commands(d).handle)
    srv.start()
    try:
        yield d, vt, path, srv
    finally:
        srv.close()


def exchange(path: str, line: bytes) -> dict:
    """One request line on its own connection; asserts the reply's shape."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(line + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, f"closed without an answer to {line[:80]!r}"
            buf += chunk
    assert buf.count(b"\n") == 1, buf[:200]
    r = json.loads(buf, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert isinstance(r, dict) and isinstance(r["ok"], bool), r
    assert r["protocol"] == PROTOCOL_VERSION
    if not r["ok"]:
        assert isinstance(r["error"], str) and r["error"].strip() and "\n" not in r["error"]
    return r


def check_after(d, vt, path, srv, caplog, name: str, at_least: int) -> None:
    """The server answers, nothing escaped, nothing invalid is in the state."""
    assert exchange(path, b'{"cmd":"ping"}')["data"] == {"pong": True}
    # escapes: an exception in the loop, or one the dispatch raised that is not a
    # one-line refusal (logged as "request failed" with its traceback)
    escapes = srv.loop_errors + sum(r.levelname == "ERROR" for r in caplog.records)
    print(f"\ncontrol protocol fuzz, {name}: {CASES[name]} requests, {escapes} escapes")
    assert escapes == 0 and CASES[name] >= at_least
    for ip, (k, mode) in d.runtime.pins.items():
        assert is_canonical_ip(ip), ip
        assert type(k) is int and 0 <= k <= d.config.max_class and mode in PIN_MODES
    for name, thr in d.runtime.thresholds.items():
        assert name in d.known_resources()
        assert type(thr) is float and math.isfinite(thr) and thr > 0
    assert set(d.runtime.group_overrides) <= set(d.config.groups)
    handle(d, "resume", {})
    run_for(d, vt, 0.5)
    assert d.counters.actuator_errors == 0  # no batch refused by the strict actuator
    json.dumps(status_of(d), allow_nan=False)


def count(name: str) -> None:
    CASES[name] = CASES.get(name, 0) + 1


# ------------------------------------------------------------------ strategies
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
nasty = (
    json_values
    | st.ip_addresses().map(str)
    | st.sampled_from(["10.0.0.3", "vg0", "vg1", "all", "ack", "read", "", " 10.0.0.1", "1e3"])
    | st.integers(min_value=-3, max_value=6000)
    | st.floats(min_value=-1, max_value=1e6)
    | st.text(alphabet=string.printable, max_size=30)
)


# Values each argument accepts: mixed in, so that the accepted paths run too.
VALID = {
    "initiator": st.sampled_from(["10.0.0.3", "10.0.0.7", "10.0.0.9"])
    | st.ip_addresses(v=4).map(str),
    "class": st.integers(min_value=0, max_value=100),
    "mode": st.sampled_from(PIN_MODES),
    "resource": st.sampled_from(["vg0", "vg1"]),
    "threshold_s": st.floats(min_value=1e-6, max_value=10.0),
    # the fuzzed daemon has no [groups.NAME]: every group command is refused but the list
    "group": st.sampled_from(["db", "default", "backup"]),
    "priority": st.none() | st.floats(min_value=0.001, max_value=1000.0),
    "latency_target_s": st.none() | st.floats(min_value=1e-6, max_value=60.0),
    "throughput_target_bps": st.none() | st.floats(min_value=1.0, max_value=1e12),
    "throughput_target_iops": st.none() | st.floats(min_value=1.0, max_value=1e6),
}


@st.composite
def command_requests(draw):
    cmd = draw(
        st.sampled_from(sorted(COMMANDS)) if draw(st.integers(0, 9)) else st.text(max_size=12)
    )
    keys = list(COMMANDS.get(cmd, {}))
    args = {
        k: draw(VALID[k] if draw(st.integers(0, 4)) else nasty)
        for k in keys
        if draw(st.integers(0, 9))  # now and then an argument is missing
    }
    if draw(st.integers(0, 9)) == 0:
        args[draw(st.text(max_size=8))] = draw(nasty)
    req = {"cmd": cmd, "args": args}
    if draw(st.integers(0, 19)) == 0:
        req = {"cmd": cmd} if not args else {"cmd": cmd, "args": draw(json_values)}
    return json.dumps(req, allow_nan=True).encode()


# ------------------------------------------------------------------ the fuzz
def test_fuzz_every_command_with_random_arguments(tmp_path, caplog):
    with fuzzed_daemon(tmp_path) as (d, vt, path, srv):

        @settings(FUZZ, max_examples=800)
        @given(command_requests())
        def run(line):
            count("commands")
            exchange(path, line)

        run()
        check_after(d, vt, path, srv, caplog, "commands", 800)


def test_fuzz_random_json_values_and_bytes(tmp_path, caplog):
    with fuzzed_daemon(tmp_path) as (d, vt, path, srv):

        @settings(FUZZ, max_examples=450)
        @given(
            json_values.map(lambda v: json.dumps(v, allow_nan=True).encode())
            | st.binary(max_size=200).map(lambda b: b.replace(b"\n", b""))
        )
        def run(line):
            count("json values and bytes")
            r = exchange(path, line)
            assert r["ok"] is False or line.strip().startswith(b"{")

        run()
        check_after(d, vt, path, srv, caplog, "json values and bytes", 450)


def test_fuzz_huge_numbers_and_deep_nesting(tmp_path, caplog):
    with fuzzed_daemon(tmp_path) as (d, vt, path, srv):

        @settings(FUZZ, max_examples=300)
        @given(
            st.sampled_from(["threshold_s", "class"]),
            st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n)
            | st.integers(min_value=300, max_value=400).map(lambda e: f"1e{e}")
            | st.integers(min_value=300, max_value=400).map(lambda e: f"-1e{e}")
            | st.integers(min_value=1, max_value=400).map(lambda e: f"1e-{e}"),
            st.integers(min_value=1, max_value=30_000),
        )
        def run(field, number, depth):
            count("huge numbers and nesting")
            count("huge numbers and nesting")
            cmd = "threshold_set" if field == "threshold_s" else "pin"
            base = {"resource": "vg0"} if cmd == "threshold_set" else {
                "initiator": "10.0.0.7", "mode": "all"}  # fmt: skip
            head = json.dumps({"cmd": cmd, "args": base})[:-2]
            exchange(path, f'{head}, "{field}": {number}}}}}'.encode())
            nested = b'{"cmd":"ping","args":' + b"[" * depth + b"]" * depth + b"}"
            assert exchange(path, nested)["ok"] is False

        run()
        check_after(d, vt, path, srv, caplog, "huge numbers and nesting", 500)
