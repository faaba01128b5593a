"""A restart picks up where the last run stopped (daemon/core/state.py, daemon/core/runtime.py).

Virtual time and the fakes of test_daemon.py; the store writes real files
in tmp_path.  What a kill -9 leaves is the kernel's members (the fake
actuator's `kernel`) and state.json.
"""

from __future__ import annotations

import itertools
import json
import os
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance.config.schema import PIN_MODES
from santhrottle.appliance.daemon.core.loop import CommandError
from santhrottle.appliance.daemon.core.runtime import ADOPT_HOLD_CONVERGES
from santhrottle.appliance.daemon.core.state import Saved, StateError, StateStore, decode, encode
from santhrottle.appliance.datapath.names import is_canonical_ip
from santhrottle.controller.decide import decide
from santhrottle.controller.domain import (
    ControllerConfig,
    ReadSample,
    Resource,
    Samples,
    WriteSample,
)
from santhrottle.controller.restate import reconfigure, seed_class
from santhrottle.controller.state import new_state
from tests.unit.test_daemon import handle, status_of

from .test_daemon import CONF, make, run_for


def _restart(tmp_path, kernel, conf=CONF):
    """A new daemon on the same store and what the kernel still holds."""
    d, vt, s, act = make(conf, store=StateStore(tmp_path))
    act.kernel = dict(kernel)
    d.restore(vt.now)
    return d, vt, s, act


# ------------------------------------------------------------ the store
def test_save_load_round_trip_and_atomic_file(tmp_path):
    store = StateStore(tmp_path, clock=lambda: 1234.5)
    s = Saved(True, {"10.0.0.3": (10, "all")}, {"vg0": 0.01}, {"vg0": 12})
    store.save(s)
    assert oct(os.stat(tmp_path).st_mode & 0o777) and store.path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left
    back = store.load(max_class=100)
    assert (back.paused, back.pins, back.thresholds, back.resource_classes, back.saved_at) == (
        True, {"10.0.0.3": (10, "all")}, {"vg0": 0.01}, {"vg0": 12}, 1234.5)  # fmt: skip


def test_no_file_is_an_empty_state(tmp_path):
    assert StateStore(tmp_path / "missing").load(100) == Saved()


@pytest.mark.parametrize(
    "doc, words",
    [
        ({"version": 1, "pins": {"bogus": [5, "all"]}}, "'bogus' is not an IPv4 or IPv6 address"),
        ({"version": 1, "pins": {"fd00::/64": [5, "all"]}}, "is not an IPv4 or IPv6 address"),
        ({"version": 1, "pins": {"10.0.0.3": [True, "all"]}}, "not a delay class"),
        ({"version": 1, "pins": {"10.0.0.3": [5, "sideways"]}}, "mode"),
        ({"version": 1, "thresholds": {"vg0": -1}}, "not a threshold"),
        ({"version": 1, "thresholds": {"vg0": "10ms"}}, "not a threshold"),
        ({"version": 1, "thresholds": {"vg0": 90}}, "not a threshold"),
        ({"version": 1, "paused": "yes"}, "true or false"),
        ({"version": 2}, "version 2"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_an_invalid_state_file_is_one_line(doc, words):
    with pytest.raises(StateError) as e:
        decode(json.dumps(doc), 100)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_infinity_is_not_a_threshold():
    with pytest.raises(StateError, match="not valid JSON"):
        decode('{"version": 1, "thresholds": {"vg0": Infinity}}', 100)


def test_a_class_above_max_class_is_clamped():
    s = decode(encode(Saved(pins={"10.0.0.3": (500, "all")}), 1.0).decode(), 100)
    assert s.pins == {"10.0.0.3": (100, "all")}


def test_an_invalid_file_is_set_aside_and_the_daemon_starts_empty(tmp_path):
    (tmp_path / "state.json").write_text('{"version": 1, "pins": {"bogus": [5, "all"]}}')
    d, _vt, _s, _act = _restart(tmp_path, {})
    assert d.runtime.pins == {} and (tmp_path / "state.json.invalid").exists()


# ------------------------------------------------------------ the restart
def test_pause_pins_and_overrides_survive_a_restart(tmp_path):
    d, _vt, _s, _act = make(store=StateStore(tmp_path))
    handle(d, "pin", {"initiator": "10.0.0.9", "class": 10, "mode": "read"})
    handle(d, "threshold_set", {"resource": "vg0", "threshold_s": 0.02})
    handle(d, "pause", {})
    d2, vt2, _s2, act2 = _restart(tmp_path, {})
    assert d2.runtime.paused and d2.runtime.pins == {"10.0.0.9": (10, "read")}
    assert d2.threshold_of("vg0") == 0.02
    run_for(d2, vt2, 1.0)
    assert act2.kernel == {}  # paused stays paused
    handle(d2, "resume", {})
    run_for(d2, vt2, 0.5)
    assert act2.kernel["10.0.0.9"] == (10, "read")


def test_a_member_left_by_kill_9_shows_is_held_then_lowered_to_zero(tmp_path):
    """Nothing wants 10.0.0.7 any more: status shows it, it is held while the
    controller looks, then lowered a class per tick until it is out."""
    d, vt, s, act = _restart(tmp_path, {"10.0.0.7": (100, "all")})
    s.latency_s = 0.001  # readers fine: nobody needs a delay
    ini = {i["initiator"]: i for i in status_of(d)["initiators"]}
    assert ini["10.0.0.7"]["class"] == 100 and ini["10.0.0.7"]["adopted"]
    hold_s = ADOPT_HOLD_CONVERGES * d.config.controller.converge_s
    run_for(d, vt, hold_s - 0.2)
    assert act.kernel["10.0.0.7"] == (100, "all")
    seen = []
    for _ in range(130):
        run_for(d, vt, 0.1)
        seen.append(act.kernel.get("10.0.0.7", (0, "all"))[0])
    assert seen[-1] == 0 and "10.0.0.7" not in d.runtime.adopted
    assert all(b <= a for a, b in itertools.pairwise(seen))  # only down
    assert max(a - b for a, b in itertools.pairwise(seen)) <= 1  # one class a tick
    assert "10.0.0.7" not in {i["initiator"] for i in status_of(d)["initiators"] if i["class"]}


def test_a_pinned_member_left_in_the_kernel_is_the_pin_and_unpin_works(tmp_path):
    d, vt, _s, _act = make(store=StateStore(tmp_path))
    handle(d, "pin", {"initiator": "10.0.0.9", "class": 88, "mode": "all"})
    run_for(d, vt, 0.3)
    d2, vt2, _s2, act2 = _restart(tmp_path, {"10.0.0.9": (88, "all")})
    assert "10.0.0.9" not in d2.runtime.adopted
    handle(d2, "unpin", {"initiator": "10.0.0.9"})
    run_for(d2, vt2, 0.5)
    assert "10.0.0.9" not in act2.kernel


def test_a_throttled_writer_keeps_its_class_across_a_restart(tmp_path):
    """The controller held 10.0.0.3 at some class; after kill -9 and a start
    it never falls to 0 in between (seeded resource class + adoption)."""
    d, vt, s, act = make(store=StateStore(tmp_path))
    s.latency_s = 0.030
    run_for(d, vt, 6.0)
    k = act.kernel["10.0.0.3"][0]
    assert k > 0
    d2, vt2, s2, act2 = _restart(tmp_path, act.kernel)
    s2.latency_s = 0.010  # at the threshold: the class stays about where it was
    low = k
    for _ in range(60):
        run_for(d2, vt2, 0.1)
        low = min(low, act2.kernel.get("10.0.0.3", (0, "all"))[0])
    assert low >= k - 3, (k, low)


def test_save_failure_is_counted_not_raised(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "state.json").mkdir()  # rename over a directory fails
    d, _vt, _s, _act = make(store=StateStore(ro))
    handle(d, "pause", {})
    assert d.runtime.paused and d.counters.state_save_errors == 1


# ------------------------------------------------------------ reload
def test_a_controller_change_on_reload_keeps_every_class(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(CONF)
    from santhrottle.appliance.config import load_config

    d, vt, _s, act = make(load_config=load_config)
    d.config = load_config(f)
    run_for(d, vt, 6.0)
    before = dict(act.kernel)
    assert before
    f.write_text(
        CONF.replace("class_hysteresis = 0", "class_hysteresis = 0\nkp_class_per_rel_error = 3.5")
    )
    handle(d, "reload", {})
    assert d.config.controller.gains.kp_class_per_rel_error == 3.5
    assert {ip: k for ip, (k, _m) in before.items()} == dict(d.ctl.effective)
    d.tick(vt.now)
    assert act.kernel == before or all(
        abs(act.kernel[ip][0] - k) <= 2 for ip, (k, _m) in before.items()
    )


def test_threshold_override_survives_reload_and_reset_returns_to_the_file(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(CONF)
    from santhrottle.appliance.config import load_config

    d, _vt, _s, _a = make(load_config=load_config)
    d.config = load_config(f)
    handle(d, "threshold_set", {"resource": "vg0", "threshold_s": 0.01})
    f.write_text(CONF.replace('"10ms"', '"30ms"'))
    handle(d, "reload", {})
    vg0 = next(r for r in status_of(d)["resources"] if r["resource"] == "vg0")
    th = vg0["threshold"]  # the ThresholdView threshold show answers too
    assert (th["threshold_s"], th["configured_s"], th["override"]) == (0.01, 0.03, True)
    handle(d, "threshold_reset", {"resource": "vg0"})
    assert d.threshold_of("vg0") == 0.03


# ------------------------------------------------------------ controller
def test_reconfigure_and_seed_are_bumpless():
    c = ControllerConfig()
    st = new_state(c, [Resource("vg0", 0.01)])
    st.write_sets.observe("vg0", "A", 50e6, 0.0)
    for t in range(1, 40):
        st, _ = decide(
            st,
            Samples([ReadSample("vg0", 5, 0.03, 50e6)], [WriteSample("vg0", "A", 50e6)]),
            t * 0.1,
        )
    k = st.resources["vg0"].delay_class
    assert k > 0 and st.effective.get("A")
    st2 = reconfigure(st, ControllerConfig(write_heavy_enter_bps=2e6, write_heavy_leave_bps=1e6))
    assert st2.resources["vg0"].delay_class == k and st2.effective == st.effective
    assert st2.resources["vg0"].rhythm == st.resources["vg0"].rhythm  # the writers' rhythm too
    assert st2.resources["vg0"].rhythm.last_s is not None
    st3 = new_state(c, [Resource("vg0", 0.01)])
    seed_class(st3, "vg0", 17)
    assert st3.resources["vg0"].delay_class == 17 and st3.resources["vg0"].pid.delay_class == 17


def test_a_reload_of_max_delay_waits_for_the_restart_in_the_controller_too(tmp_path):
    """datapath.max_delay needs a restart: the data path keeps its classes, so the
    controller must keep its max_class too (it would ask for classes the tree lacks)."""
    f = tmp_path / "s.toml"
    f.write_text(CONF)
    from santhrottle.appliance.config import load_config

    d, _vt, _s, _a = make(load_config=load_config)
    d.config = load_config(f)
    f.write_text(CONF.replace('devices = ["eth1"]', 'devices = ["eth1"]\nmax_delay = "100ms"'))
    out = handle(d, "reload", {})
    assert out["restart_needed"] == ["datapath.max_delay"]
    assert d.config.max_class == 88 and d.config.controller.max_class == 88


def test_reload_names_metrics_and_socket_keys_and_counts_a_nested_file(tmp_path):
    """Issue 17: metrics address/port and the socket mode were read once at start while
    reload said "reloaded"; a TOML nested 500 deep was a RecursionError not counted."""
    f = tmp_path / "s.toml"
    f.write_text(CONF)
    from santhrottle.appliance.config import load_config

    d, _vt, _s, _a = make(load_config=load_config)
    d.config = load_config(f)
    f.write_text(CONF + '[metrics]\nport = 9999\naddress = "::1"\n')
    assert handle(d, "reload", {})["restart_needed"] == ["metrics.address", "metrics.port"]
    assert (d.config.metrics_address, d.config.metrics_port) == ("127.0.0.1", 9753)
    f.write_text("a = " + "[" * 600 + "]" * 600 + "\n")
    with pytest.raises(CommandError, match="nested too deep"):
        handle(d, "reload", {})
    assert d.counters.reload_failures == 1


SIXTEEN_PORTS = ", ".join(str(1000 + i) for i in range(16))


@pytest.mark.parametrize(
    "text, named",
    [
        ('[daemon]\nnetns = "tgt"\n[datapath]\nports = [3260, 3260]\n', "tgt"),
        ('[daemon]\nnetns = "tgt"\n[datapath]\nports = [' + SIXTEEN_PORTS + "]\n", "tgt"),
        ('[daemon]\nnetns = "tgt"\n[datapath]\nstep = "10.5us"\n', "tgt"),
        ('[datapath]\nstep = "10.5us"\n', None),  # no netns line: the initial namespace
    ],
)
def test_cleanup_finds_the_namespace_in_a_config_that_does_not_load(tmp_path, text, named):
    """Issue 17: `cleanup --delays-only` (ExecStopPost) failed on these files."""
    import argparse

    from santhrottle.appliance.cli.cleanup import cleanup_namespaces

    f = tmp_path / "s.toml"
    f.write_text(text)
    spaces, warning = cleanup_namespaces(argparse.Namespace(netns=None, config=str(f)))
    assert spaces == [named] and warning and "\n" not in warning


def test_cleanup_without_a_readable_namespace_cleans_every_one(tmp_path, monkeypatch):
    import argparse

    from santhrottle.appliance.cli import cleanup

    (tmp_path / "netns").mkdir()
    for ns in ("a", "b"):
        (tmp_path / "netns" / ns).touch()
    monkeypatch.setattr(cleanup, "NETNS_DIR", str(tmp_path / "netns"))
    f = tmp_path / "s.toml"
    f.write_text("[daemon]\nnetns = 5\n[[[")
    spaces, warning = cleanup.cleanup_namespaces(argparse.Namespace(netns=None, config=str(f)))
    assert spaces == [None, "a", "b"] and "every network namespace" in warning


class _LeafDatapath:
    """What remove_delays sees of a data path: members, glide leaves that empty
    after `drain_s`, and whether each move was ordered."""

    def __init__(self, members, drain_s, vt):
        self.members = dict(members)
        self.spec = SimpleNamespace(max_delay_us=50_000)
        self.drain_s, self.vt, self.moves = drain_s, vt, []
        self.t0 = None

    def current(self):
        return dict(self.members)

    def set_classes(self, classes, mode=None, *, ordered=True):
        self.moves.append((sorted(classes), ordered))
        if ordered:
            self.t0 = self.vt.now
        else:
            for ip in classes:
                self.members.pop(ip)

    def advance_glides(self):
        if self.vt.now - self.t0 >= self.drain_s:
            self.members.clear()


@pytest.mark.parametrize("drain_s, unordered", [(0.08, False), (5.0, True)])
def test_cleanup_removes_delays_in_order_then_the_rest(drain_s, unordered):
    """ExecStopPost's removal goes through the glide leaves like the daemon's
    descents; only what is still in a leaf after 2 x max_delay + a margin (a
    member whose traffic never pauses rides a leaf at delay 0) leaves unordered."""
    from santhrottle.appliance.cli.cleanup import remove_delays

    from .test_daemon import VirtualTime

    vt = VirtualTime()
    d = _LeafDatapath({"10.0.0.3": SimpleNamespace(klass=40, mode="all")}, drain_s, vt)
    remove_delays(d, clock=vt.clock, sleep=vt.sleep)
    assert d.moves[0] == (["10.0.0.3"], True)
    assert (len(d.moves) == 2 and d.moves[1] == (["10.0.0.3"], False)) == unordered
    assert d.members == {}


def test_status_is_built_once_per_tick_or_change():
    """A burst of status calls between two ticks builds the view once (the lock the
    tick needs is held once), and a command or a tick builds it again."""
    from santhrottle.appliance.daemon.control.commands import Commands
    from santhrottle.appliance.daemon.status.build import StatusCache

    d, vt, _s, _act = make()
    run_for(d, vt, 1.0)
    views = StatusCache(d)
    commands = Commands(d, views)
    a = views.status()
    assert views.status() is a
    commands.handle("pin", {"initiator": "10.0.0.9", "class": 3, "mode": "all"})
    b = views.status()
    assert b is not a and any(i.initiator == "10.0.0.9" for i in b.initiators)
    d.tick(vt.now)
    assert views.status() is not b


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_STATE_KEYS = st.sampled_from(
    ["version", "saved_at", "paused", "pins", "thresholds", "resource_classes", "group_overrides"]
)


@settings(derandomize=True, max_examples=400, deadline=None)
@given(st.dictionaries(_STATE_KEYS, _JSON, max_size=6), st.booleans())
def test_fuzz_the_state_file(doc, versioned):
    """Any JSON in state.json: a Saved whose every value the daemon can use, or
    StateError with one line; nothing else escapes."""
    if versioned:
        doc["version"] = 1
    try:
        s = decode(json.dumps(doc, allow_nan=True), max_class=100)
    except StateError as e:
        assert "\n" not in str(e)
        return
    for ip, (k, mode) in s.pins.items():
        assert is_canonical_ip(ip) and 0 <= k <= 100 and mode in PIN_MODES
    assert all(0 < t <= 60 for t in s.thresholds.values())
    assert all(0 <= k <= 100 for k in s.resource_classes.values())
    for o in s.group_overrides.values():
        assert o.priority is None or 0.001 <= o.priority <= 1000
        assert o.latency_target_s is None or 0 < o.latency_target_s <= 60
        assert o.throughput_target is None or o.throughput_target[0] > 0
