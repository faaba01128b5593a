"""EtcdCoordinator: fleet/engine.py's Coordinator over etcd's v3 API (etcd3gw).

Problem
    The appliances of one array agree through etcd (docs/fleet.md: why etcd, and
    what it costs): leases for registration, a create-if-absent transaction for
    leadership, a transaction guarded by the leader key's create_revision for
    the decisions.  The daemon calls this every 100 ms tick, so a call must
    never hang: an engine that does not answer within its budget is an
    EngineUnavailable, and the daemon controls locally until it answers again.

What it does
    The Coordinator's calls as etcd requests (docs/fleet.md, "Keys"), each
    sent by fleet/gateway.py's Gateway: over the endpoints in turn within a
    call budget, with TLS and the appliance's etcd user when [fleet] names
    them.  The budget and each attempt's timeout are for the default 1 s
    lease and scale with the lease's TTL (a 3 s lease: 1.5 s and 3 s), so a
    longer lease also gives a slow engine longer to answer.  A value in the
    engine that is not JSON of the expected shape is skipped and counted
    (bad_values), never raised.  A decision is read with the engine's own
    records of it (its key's lease and mod_revision), which is what binds it
    to its leader (engine.Snapshot.current).

    A leader key without a lease (put by hand: campaign() never makes one) is
    nobody's leadership and would never end: campaign() deletes that version of
    it (a transaction on its mod_revision) and campaigns again.

    Operations that retry on another endpoint may have been applied by the
    first one (its answer lost): each is idempotent.  campaign() returns my
    leadership if the leader key already has my lease; a repeated put writes
    the same value; join() may leave an orphan lease, which ends by itself.

Bounds
    A call lasts at most CALL_BUDGET_S + REQUEST_TIMEOUT_S (the last attempt's
    connect and read each get at most the budget left).  Lease TTLs are whole
    seconds, at least etcd's minimum (1.5 x election timeout, rounded up:
    1 s with --heartbeat-interval 50 --election-timeout 500); granted_ttl_s is
    what etcd granted.  Not thread-safe: one caller.

Worked example
    c = EtcdCoordinator("array1", ["10.77.0.1:2379", "10.77.0.2:2379"], ttl_s=1)
    c.join("gw-a", {"addr": "10.0.0.5"})
    lead = c.campaign("vg0")               # Leadership("vg0", "gw-a", 42) or None
    if lead:
        c.publish_decisions("vg0", lead.epoch, {"classes": {"10.1.1.9": 12}})
    snap = c.snapshot()                    # one range request, every key of array1
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from etcd3gw.client import Etcd3Client

from santhrottle.appliance.fleet.engine import (
    Decision,
    EngineUnavailable,
    Leadership,
    LeaseLost,
    Payload,
    Registration,
    Snapshot,
)
from santhrottle.appliance.fleet.gateway import Gateway, Security, b64, unb64
from santhrottle.appliance.fleet.names import check_name

# One attempt on one endpoint: connect within this, then the answer within this
# (for DEFAULT_TTL_S; x ttl_s / DEFAULT_TTL_S for a longer lease).
REQUEST_TIMEOUT_S = 0.5
# One call, over all the endpoints it tries (scaled the same way).
CALL_BUDGET_S = 1.0
# The lease: whole seconds (etcd's unit); etcd raises a smaller one to its minimum.
DEFAULT_TTL_S = 1
ROOT = "/santhrottle"
KINDS = ("appliances", "samples", "leader", "decisions")

T = TypeVar("T")


class EtcdCoordinator:
    def __init__(
        self,
        array: str,
        endpoints: Sequence[str],
        ttl_s: int = DEFAULT_TTL_S,
        request_timeout_s: float | None = None,
        call_budget_s: float | None = None,
        security: Security | None = None,
    ) -> None:
        if int(ttl_s) != ttl_s or ttl_s < 1:
            raise ValueError(f"lease TTL must be a whole number of seconds >= 1, got {ttl_s}")
        self._array = check_name("array", array)
        self.prefix = f"{ROOT}/{array}/"
        self.ttl_s = int(ttl_s)
        scale = self.ttl_s / DEFAULT_TTL_S
        self.request_timeout_s = (
            REQUEST_TIMEOUT_S * scale if request_timeout_s is None else request_timeout_s
        )
        self.call_budget_s = CALL_BUDGET_S * scale if call_budget_s is None else call_budget_s
        self.gateway = Gateway(endpoints, self.request_timeout_s, self.call_budget_s, security)
        self._appliance: str | None = None
        self._lease: int | None = None
        self.granted_ttl_s: int | None = None
        self.bad_values = 0

    # -- the interface ----------------------------------------------------------

    @property
    def array(self) -> str:
        return self._array

    @property
    def appliance(self) -> str | None:
        return self._appliance

    @property
    def lease(self) -> int | None:
        return self._lease

    def join(self, appliance: str, info: Payload) -> None:
        check_name("appliance", appliance)
        value = json.dumps(dict(info)).encode()
        if self._lease is not None:
            self.leave()

        def grant(c: Etcd3Client) -> tuple[int, int]:
            got = c.post(c.get_url("/lease/grant"), json={"TTL": self.ttl_s})
            if int(got.get("TTL", 0)) <= 0:
                raise EngineUnavailable(f"etcd granted no lease: {got.get('error', got)}")
            return int(got["ID"]), int(got["TTL"])

        lease, ttl = self._call(grant)
        self._appliance, self._lease, self.granted_ttl_s = appliance, lease, ttl
        self._put(self._key("appliances", appliance), value)

    def refresh(self) -> None:
        lease = self._my_lease()

        def keepalive(c: Etcd3Client) -> None:
            got = c.post(c.get_url("/lease/keepalive"), json={"ID": lease})
            if int(got.get("result", {}).get("TTL", 0)) <= 0:
                raise LeaseLost(f"lease {lease:x} of {self._appliance} has ended")

        self._call(keepalive)

    def leave(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        with contextlib.suppress(LeaseLost):  # already gone: what leave() wants
            self._call(lambda c: c.post(c.get_url("/lease/revoke"), json={"ID": lease}))

    def appliances(self) -> list[Registration]:
        return list(self._read("appliances").appliances.values())

    def campaign(self, resource: str) -> Leadership | None:
        key = self._enc(self._key("leader", check_name("resource", resource)))
        lease, me = self._my_lease(), self._appliance or ""
        txn = {
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": b64(me.encode()), "lease": lease}}],
            "failure": [{"request_range": {"key": key}}],
        }

        def interpret(c: Etcd3Client) -> Leadership | int | None:
            got = c.transaction(txn)
            if got.get("succeeded"):
                return Leadership(resource, me, int(got["header"]["revision"]), lease)
            kvs = got["responses"][0]["response_range"].get("kvs", [])
            held = int(kvs[0].get("lease", 0)) if kvs else -1
            if held == lease:
                return Leadership(resource, me, int(kvs[0]["create_revision"]), lease)
            return int(kvs[0]["mod_revision"]) if held == 0 else None

        got = self._call(interpret)
        if isinstance(got, int):  # a leader key without a lease: nobody's leadership
            orphan = {"key": key, "result": "EQUAL", "target": "MOD", "mod_revision": got}
            self._txn_ok(
                {
                    "compare": [orphan],
                    "success": [{"request_delete_range": {"key": key}}],
                    "failure": [],
                }
            )
            got = self._call(interpret)
        return got if isinstance(got, Leadership) else None

    def resign(self, resource: str) -> bool:
        key = self._enc(self._key("leader", check_name("resource", resource)))
        txn = {
            "compare": [self._leased_by_me(key)],
            "success": [
                {"request_delete_range": {"key": key}},
                {"request_delete_range": {"key": self._enc(self._key("decisions", resource))}},
            ],
            "failure": [],
        }
        return self._txn_ok(txn)

    def leader(self, resource: str) -> Leadership | None:
        snap = self._read("leader", check_name("resource", resource))
        return snap.leaders.get(resource)

    def publish_samples(self, payload: Payload) -> None:
        self._my_lease()
        self._put(self._key("samples", self._appliance or ""), json.dumps(dict(payload)).encode())

    def samples(self) -> dict[str, Payload]:
        return dict(self._read("samples").samples)

    def publish_decisions(self, resource: str, epoch: int, payload: Payload) -> bool:
        key = self._enc(self._key("leader", check_name("resource", resource)))
        value = {"epoch": int(epoch), "appliance": self._appliance, "payload": dict(payload)}
        txn = {
            "compare": [
                {"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": int(epoch)},
                self._leased_by_me(key),
            ],
            "success": [
                {
                    "request_put": {
                        "key": self._enc(self._key("decisions", resource)),
                        "value": b64(json.dumps(value).encode()),
                        "lease": self._lease,
                    }
                }
            ],
            "failure": [],
        }
        return self._txn_ok(txn)

    def decisions(self, resource: str) -> Decision | None:
        snap = self._read("decisions", check_name("resource", resource))
        return snap.decisions.get(resource)

    def snapshot(self) -> Snapshot:
        return self._parse(self._range(self.prefix))

    def close(self) -> None:
        self.gateway.close()

    # -- keys and values --------------------------------------------------------

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}/{name}"

    @staticmethod
    def _enc(key: str) -> str:
        return b64(key.encode())

    def _my_lease(self) -> int:
        if self._lease is None:
            raise LeaseLost(f"{self._appliance or 'this appliance'} has no lease: join() first")
        return self._lease

    def _leased_by_me(self, key: str) -> dict[str, Any]:
        return {"key": key, "result": "EQUAL", "target": "LEASE", "lease": self._my_lease()}

    def _put(self, key: str, value: bytes) -> None:
        body = {"key": self._enc(key), "value": b64(value), "lease": self._my_lease()}
        self._call(lambda c: c.post(c.get_url("/kv/put"), json=body))

    def _txn_ok(self, txn: dict[str, Any]) -> bool:
        return self._call(lambda c: bool(c.transaction(txn).get("succeeded")))

    def _range(self, start: str, single: bool = False) -> tuple[int, list[dict[str, Any]]]:
        body = {"key": self._enc(start)}
        if not single:
            end = bytearray(start.encode())
            end[-1] += 1  # start ends with '/': '/' + 1 = '0'
            body["range_end"] = b64(bytes(end))

        def read(c: Etcd3Client) -> tuple[int, list[dict[str, Any]]]:
            got = c.post(c.get_url("/kv/range"), json=body)
            return int(got["header"]["revision"]), list(got.get("kvs", []))

        return self._call(read)

    def _read(self, kind: str, name: str | None = None) -> Snapshot:
        if name is None:
            return self._parse(self._range(f"{self.prefix}{kind}/"))
        return self._parse(self._range(self._key(kind, name), single=True))

    def _parse(self, got: tuple[int, list[dict[str, Any]]]) -> Snapshot:
        revision, kvs = got
        found: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
        for kv in kvs:
            try:
                kind, name, value = self._parse_one(kv)
            except (ValueError, KeyError, TypeError, AttributeError):
                self.bad_values += 1
                continue
            found[kind][name] = value
        return Snapshot(
            revision, found["appliances"], found["leader"], found["samples"], found["decisions"]
        )

    def _parse_one(self, kv: dict[str, Any]) -> tuple[str, str, Any]:
        key = unb64(kv["key"]).decode()
        kind, _, name = key.removeprefix(self.prefix).partition("/")
        if kind not in KINDS or not name or "/" in name:
            raise ValueError(key)
        raw = unb64(kv.get("value", ""))
        lease = int(kv.get("lease", 0))
        if kind == "leader":
            return kind, name, Leadership(name, raw.decode(), int(kv["create_revision"]), lease)
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError(key)
        if kind == "appliances":
            return kind, name, Registration(name, value)
        if kind == "samples":
            return kind, name, value
        payload = value["payload"]
        if not isinstance(payload, dict):
            raise ValueError(key)
        epoch, who, revision = int(value["epoch"]), str(value["appliance"]), int(kv["mod_revision"])
        return kind, name, Decision(name, epoch, who, payload, lease, revision)

    def _call(self, fn: Callable[[Etcd3Client], T]) -> T:
        try:
            return self.gateway.call(fn)
        except LeaseLost:
            self._lease = None
            raise
