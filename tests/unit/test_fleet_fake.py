"""The fake coordinator passes the shared behaviour suite (tests/unit/fleet_contract.py)
and expires leases on its clock, as etcd does on its own."""

import itertools

import pytest

from santhrottle.appliance.fleet.engine import EngineUnavailable, LeaseLost
from tests.unit.fleet_contract import CHECKS, FORGERY_CHECKS
from tests.unit.fleet_fake import FakeCoordinator, FakeEngine

pytestmark = pytest.mark.unit
_arrays = itertools.count()


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
def test_fake_meets_the_contract(check):
    engine, array = FakeEngine(), f"arr{next(_arrays)}"
    check(lambda: FakeCoordinator(engine, array))


class FakeForger:
    def __init__(self, engine: FakeEngine, array: str) -> None:
        self.engine, self.prefix = engine, f"/santhrottle/{array}/"

    def put(self, key, value, lease=0):
        self.engine.put(self.prefix + key, value, lease)

    def delete(self, key):
        self.engine.delete(self.prefix + key)


@pytest.mark.parametrize("check", FORGERY_CHECKS, ids=lambda f: f.__name__)
def test_fake_binds_decisions_as_the_contract_says(check):
    engine, array = FakeEngine(), f"arr{next(_arrays)}"
    check(lambda: FakeCoordinator(engine, array), FakeForger(engine, array))


def test_fake_leases_expire_without_refresh():
    engine = FakeEngine()
    a, b = FakeCoordinator(engine, "arr", ttl_s=1), FakeCoordinator(engine, "arr", ttl_s=1)
    a.join("a", {})
    b.join("b", {})
    assert a.campaign("vg0") is not None
    engine.advance(0.6)
    b.refresh()
    engine.advance(0.6)  # a's lease ended at 1.0, b's lives until 1.6
    assert b.leader("vg0") is None
    assert b.campaign("vg0") is not None
    with pytest.raises(LeaseLost):
        a.refresh()


def test_fake_engine_down():
    engine = FakeEngine()
    a = FakeCoordinator(engine, "arr")
    a.join("a", {})
    engine.down = True
    for call in (a.refresh, a.snapshot, lambda: a.campaign("vg0"), a.appliances):
        with pytest.raises(EngineUnavailable):
            call()
    engine.down = False
    a.refresh()
