"""A member the kernel refuses never blocks the others (datapath/reconcile.py; issue 46 item 2).

Before: the daemon sent each mode's changes as one batch, retried the whole batch
every tick when the kernel refused one member, and applied no other member (179
errors for one pin of 0.0.0.0; six other pins never reached the kernel).  Now the
batch falls back to one member at a time, the member is quarantined (status,
metrics), retried on its own with a doubling wait, and the rest goes in at once.
The real kernel's refusals: tests/privileged/test_actuator_isolation_netns.py."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import generate_latest

from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.appliance.datapath.names import ObjectError
from santhrottle.appliance.datapath.reconcile import QUARANTINE_FIRST_S, QUARANTINE_MAX_S

from .test_daemon import handle, make, run_for, status_of

PINS = {f"10.0.0.{i}": (5 + i, "all") for i in range(1, 7)}


def _pin_all(d, pins):
    for ip, (k, mode) in pins.items():
        handle(d, "pin", {"initiator": ip, "class": k, "mode": mode})


def test_one_refused_member_leaves_the_six_others_applied_in_the_same_tick():
    d, _vt, _s, act = make()
    act.refuse = {"10.0.0.4"}
    _pin_all(d, PINS)
    d.run_once()
    assert {ip for ip in PINS if ip != "10.0.0.4"} <= set(act.kernel)
    assert "10.0.0.4" not in act.kernel
    (q,) = status_of(d)["quarantine"]
    assert (q["object"], q["kind"], q["retries"]) == ("10.0.0.4", "member", 0)
    assert "ipset add 10.0.0.4: refused" in q["error"] and q["retry_in_s"] == QUARANTINE_FIRST_S


def test_an_address_no_initiator_has_is_never_sent_and_blocks_nobody():
    """A 0.0.0.0 that got in before the entries checked it (an old state file, a
    discovery): quarantined without a try, the other pins applied."""
    d, vt, _s, act = make()
    _pin_all(d, PINS)
    with d.lock:
        d.runtime.pins = {"0.0.0.0": (5, "all"), **d.runtime.pins}  # first in the batch
    sent_before = act.calls
    run_for(d, vt, 3.0)
    assert set(PINS) <= set(act.kernel) and "0.0.0.0" not in act.kernel
    q = {r["object"]: r for r in status_of(d)["quarantine"]}["0.0.0.0"]
    assert q["retry_in_s"] is None and "unspecified" in q["error"]
    assert act.calls - sent_before <= 2  # one batch of six (and nothing per tick after)
    assert d.counters.actuator_errors == 0  # never sent: no kernel error


def test_a_quarantined_member_is_retried_with_a_doubling_wait_not_every_tick():
    d, vt, _s, act = make()
    act.refuse = {"10.0.0.4"}
    _pin_all(d, PINS)
    tries: list[float] = []
    real = act._send

    def counting(classes, mode, ordered):
        if "10.0.0.4" in classes:
            tries.append(vt.now)
        return real(classes, mode, ordered)

    act.reconciler.send = counting
    run_for(d, vt, 40.0)
    gaps = [b - a for a, b in itertools.pairwise(tries[1:])]  # the first: batch, then alone
    assert len(tries) <= 8, tries  # 400 ticks, not 400 tries
    assert gaps == sorted(gaps) and gaps[0] >= QUARANTINE_FIRST_S
    assert max(gaps) <= QUARANTINE_MAX_S + 0.2
    act.refuse = set()  # the kernel takes it now: in at its next retry
    run_for(d, vt, QUARANTINE_MAX_S + 1.0)
    assert "10.0.0.4" in act.kernel and status_of(d)["quarantine"] == []
    assert d.counters.actuator_errors == len(tries) - 1  # every try but the last refused


def test_an_unwanted_quarantined_member_leaves_the_quarantine():
    d, _vt, _s, act = make()
    act.refuse = {"10.0.0.4"}
    _pin_all(d, PINS)
    d.run_once()
    handle(d, "unpin", {"initiator": "10.0.0.4"})
    d.run_once()
    assert status_of(d)["quarantine"] == []


def test_the_quarantine_is_counted_in_the_metrics():
    d, _vt, _s, act = make()
    act.refuse = {"10.0.0.4"}
    _pin_all(d, PINS)
    d.run_once()
    text = generate_latest(registry_for(StatusCache(d))).decode()
    assert 'santhrottle_quarantined{kind="member"} 1.0' in text
    assert 'santhrottle_quarantines_total{kind="member"} 1.0' in text
    assert 'santhrottle_quarantined{kind="jumps"} 0.0' in text


def test_a_refused_shared_object_waits_with_backoff_and_blames_no_member():
    d, vt, _s, act = make()
    real = act._send
    broken = {"on": True}

    def jumps_refused(classes, mode, ordered):
        if broken["on"]:
            raise ObjectError("jumps", "iptables-restore: line 2 failed")
        return real(classes, mode, ordered)

    act.reconciler.send = jumps_refused
    _pin_all(d, PINS)
    run_for(d, vt, 2.0)
    rows = status_of(d)["quarantine"]
    assert [r["kind"] for r in rows] == ["jumps"] and not act.kernel
    broken["on"] = False
    run_for(d, vt, 5.0)
    assert set(PINS) <= set(act.kernel) and status_of(d)["quarantine"] == []


def test_a_failing_advance_glides_is_quarantined_and_the_members_still_move():
    d, vt, _s, act = make()
    calls = []

    def refused():
        calls.append(vt.now)
        raise OSError("tc: RTNETLINK answers: No such device")

    act.advance_glides = lambda: act.reconciler.guard("glide leaves", "leaf", refused)
    _pin_all(d, PINS)
    run_for(d, vt, 5.0)
    assert set(PINS) <= set(act.kernel)
    assert [r["kind"] for r in status_of(d)["quarantine"]] == ["leaf"]
    assert len(calls) <= 4  # 1 s, 2 s, ...: not every tick


@pytest.mark.parametrize("n", [1, 50])
def test_a_batch_of_n_changes_with_no_refusal_is_one_send(n):
    d, _vt, _s, act = make()
    pins = {f"10.1.{i // 250}.{i % 250 + 1}": (3, "all") for i in range(n)}
    _pin_all(d, pins)
    before = act.calls
    d.run_once()
    assert act.calls - before == 1 and set(pins) <= set(act.kernel)


def test_status_prints_the_quarantine(capsys):
    from santhrottle.appliance.cli.statusview import print_status

    d, _vt, _s, act = make()
    act.refuse = {"10.0.0.4"}
    _pin_all(d, PINS)
    d.run_once()
    print_status(status_of(d))
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "QUARANTINED" in ln]
    assert line.startswith("QUARANTINED 10.0.0.4: ipset add 10.0.0.4: refused")
    assert "next try in 1 s, 0 tries so far" in line
