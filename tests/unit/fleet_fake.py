"""FakeCoordinator: fleet/engine.py's Coordinator in memory, for other rooms' unit tests.

One FakeEngine stands for the etcd cluster (one revision counter, leases with
TTLs on an injectable clock); each appliance has its own FakeCoordinator on it.
It keeps the real adapter's rules -- leases own keys, epoch = the leader key's
create revision, publish_decisions fenced on epoch and lease, LeaseLost without
a lease -- and tests/unit/fleet_contract.py proves it: the same suite runs against
this (tests/unit/test_fleet_fake.py) and against EtcdCoordinator on a real
3-member cluster (tests/privileged/test_fleet_etcd.py).

    engine = FakeEngine()                      # engine.now_s = 0.0; advance(s)
    a, b = FakeCoordinator(engine, "arr"), FakeCoordinator(engine, "arr")
    engine.down = True                         # every call: EngineUnavailable
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from santhrottle.appliance.fleet.engine import (
    Decision,
    EngineUnavailable,
    Leadership,
    LeaseLost,
    Payload,
    Registration,
    Snapshot,
)
from santhrottle.appliance.fleet.names import check_name


@dataclass
class _Kv:
    value: Any
    create_revision: int
    lease: int
    mod_revision: int = 0


@dataclass
class FakeEngine:
    now_s: float = 0.0
    down: bool = False
    revision: int = 1
    kv: dict[str, _Kv] = field(default_factory=dict)
    leases: dict[int, float] = field(default_factory=dict)  # id -> expires at
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(0x1000))

    def advance(self, s: float) -> None:
        self.now_s += s
        self._expire()

    def _expire(self) -> None:
        for lease in [i for i, t in self.leases.items() if t <= self.now_s]:
            self.revoke(lease)

    def check(self) -> None:
        if self.down:
            raise EngineUnavailable("fake engine: down")
        self._expire()

    def revoke(self, lease: int) -> None:
        self.leases.pop(lease, None)
        gone = [k for k, v in self.kv.items() if v.lease == lease]
        for k in gone:
            del self.kv[k]
        if gone:
            self.revision += 1

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        """A plain put, as etcd's: lease 0 is none (the key stays until deleted)."""
        if lease and lease not in self.leases:
            raise LeaseLost("fake engine: requested lease not found")
        self.revision += 1
        old = self.kv.get(key)
        created = old.create_revision if old else self.revision
        self.kv[key] = _Kv(copy.deepcopy(value), created, lease, self.revision)
        return self.revision

    def delete(self, key: str) -> None:
        """A plain delete, as etcd's (anyone with write access to the key)."""
        if self.kv.pop(key, None) is not None:
            self.revision += 1


class FakeCoordinator:
    def __init__(self, engine: FakeEngine, array: str, ttl_s: int = 1) -> None:
        self.engine = engine
        self._array = check_name("array", array)
        self.prefix = f"/santhrottle/{array}/"
        self.ttl_s = ttl_s
        self._appliance: str | None = None
        self._lease: int | None = None

    @property
    def array(self) -> str:
        return self._array

    @property
    def appliance(self) -> str | None:
        return self._appliance

    @property
    def lease(self) -> int | None:
        return self._lease

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}/{name}"

    def _my_lease(self) -> int:
        self.engine.check()
        if self._lease is None or self._lease not in self.engine.leases:
            self._lease = None
            raise LeaseLost(f"{self._appliance or 'this appliance'} has no lease")
        return self._lease

    def join(self, appliance: str, info: Payload) -> None:
        check_name("appliance", appliance)
        if self._lease is not None:
            self.leave()
        self.engine.check()
        lease = next(self.engine._ids)
        self.engine.leases[lease] = self.engine.now_s + self.ttl_s
        self._appliance, self._lease = appliance, lease
        self.engine.put(self._key("appliances", appliance), dict(info), lease)

    def refresh(self) -> None:
        lease = self._my_lease()
        self.engine.leases[lease] = self.engine.now_s + self.ttl_s

    def leave(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            self.engine.check()
            self.engine.revoke(lease)

    def appliances(self) -> list[Registration]:
        return list(self.snapshot().appliances.values())

    def campaign(self, resource: str) -> Leadership | None:
        key = self._key("leader", check_name("resource", resource))
        lease = self._my_lease()
        held = self.engine.kv.get(key)
        if held is not None and held.lease == 0:  # put by hand: nobody's leadership
            self.engine.delete(key)
            held = None
        if held is None:
            epoch = self.engine.put(key, self._appliance, lease)
            return Leadership(resource, self._appliance or "", epoch, lease)
        if held.lease == lease:
            return Leadership(resource, self._appliance or "", held.create_revision, lease)
        return None

    def resign(self, resource: str) -> bool:
        key = self._key("leader", check_name("resource", resource))
        lease = self._my_lease()
        held = self.engine.kv.get(key)
        if held is None or held.lease != lease:
            return False
        del self.engine.kv[key]
        self.engine.kv.pop(self._key("decisions", resource), None)
        self.engine.revision += 1
        return True

    def leader(self, resource: str) -> Leadership | None:
        return self.snapshot().leaders.get(check_name("resource", resource))

    def publish_samples(self, payload: Payload) -> None:
        lease = self._my_lease()
        self.engine.put(self._key("samples", self._appliance or ""), dict(payload), lease)

    def samples(self) -> dict[str, Payload]:
        return dict(self.snapshot().samples)

    def publish_decisions(self, resource: str, epoch: int, payload: Payload) -> bool:
        key = self._key("leader", check_name("resource", resource))
        lease = self._my_lease()
        held = self.engine.kv.get(key)
        if held is None or held.create_revision != epoch or held.lease != lease:
            return False
        value = {"epoch": epoch, "appliance": self._appliance, "payload": dict(payload)}
        self.engine.put(self._key("decisions", resource), value, lease)
        return True

    def decisions(self, resource: str) -> Decision | None:
        return self.snapshot().decisions.get(check_name("resource", resource))

    def snapshot(self) -> Snapshot:
        self.engine.check()
        appliances, leaders, samples, decisions = {}, {}, {}, {}
        for key, kv in sorted(self.engine.kv.items()):
            if not key.startswith(self.prefix):
                continue
            kind, _, name = key.removeprefix(self.prefix).partition("/")
            value = copy.deepcopy(kv.value)
            if kind == "appliances":
                appliances[name] = Registration(name, value)
            elif kind == "samples":
                samples[name] = value
            elif kind == "leader":
                leaders[name] = Leadership(name, value, kv.create_revision, kv.lease)
            else:
                decisions[name] = Decision(
                    name, value["epoch"], value["appliance"], value["payload"], kv.lease,
                    kv.mod_revision,
                )  # fmt: skip
        return Snapshot(self.engine.revision, appliances, leaders, samples, decisions)
