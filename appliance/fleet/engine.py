"""The coordination engine as the appliances of one array see it: the interface.

Problem
    Several appliances (bridges or LIO gateways) in front of one array each see
    only their own initiators.  Per shared resource one of them -- the leader --
    runs the controller on the merged samples of all, and every appliance applies
    the classes it publishes.  Who belongs, who leads and which decisions count
    must be agreed on by a proven engine (etcd, fleet/etcd.py; docs/fleet.md),
    never by a home-made protocol, and a deposed leader's late write must be
    refused by the engine itself, not by the readers' good manners.

What lives in the engine (keys under /santhrottle/<array>/)
    appliances/<appliance>  the appliance's info          under its lease
    samples/<appliance>     its latest samples (codec.py)  under its lease
    leader/<resource>       the leading appliance's name   under its lease
    decisions/<resource>    {epoch, appliance, payload}    under the leader's lease
    A lease lives ttl_s after the last refresh(); when it ends (leave(), a
    crash, a partition longer than ttl_s) every key above of that appliance
    goes at once: the engine only ever holds live state.

Epochs (fencing)
    A leadership's epoch is the create_revision of its leader key: the engine's
    global revision when the key was made, so a later leader always has a
    higher epoch.  publish_decisions(resource, epoch, ...) writes only if the
    leader key still has that create_revision and the caller's lease (one
    compare-and-put in the engine), and puts the decision under that lease: a
    leader deposed while it computed gets False, and its decisions never land.

A decision bound to its leader (what a follower applies)
    Snapshot.current(resource) is the decision only when the engine's own
    records say the current leader wrote it: the decision key is under the
    leader key's lease and was last written after the leader key was made
    (its mod_revision above the epoch), both read at one revision.  Nothing
    inside the value counts (its epoch and seq are what the writer says): a
    value put by hand, without the leader's lease or before its leadership,
    is never current, and one put under the leader's lease lasts until the
    leader's next write.  A follower applies a current decision whose
    (epoch, revision) differs from the last it applied: the engine's
    revisions, not a payload's number, so nobody can make it wait for a seq
    that never comes.

Failures
    Every method that talks to the engine raises EngineUnavailable (and nothing
    else) when the engine cannot answer in its bounded time: the caller falls
    back to local control.  LeaseLost (an EngineUnavailable) says the engine
    answered but the caller's lease is gone (expired, revoked, or join() never
    ran): it must join() again.  No method blocks longer than the adapter's
    call budget (EtcdCoordinator: CALL_BUDGET_S).

Worked example (two appliances a and b, resource vg0)
    a.join("a", {"addr": "10.0.0.1"}); b.join("b", {})
    a.campaign("vg0")          -> Leadership("vg0", "a", epoch=17)
    b.campaign("vg0")          -> None  (a leads)
    a.publish_decisions("vg0", 17, {"classes": {...}})  -> True
    a dies; 1-1.5 s later its lease ends; b.campaign("vg0") -> Leadership(.., "b", 23)
    a comes back, publish_decisions("vg0", 17, ...)     -> LeaseLost (its lease is gone)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# A payload: what json.dumps takes (a dict of str keys); codec.py encodes Samples.
Payload = Mapping[str, Any]


class EngineUnavailable(Exception):
    """The engine could not answer in time (names the endpoint(s) and the cause)."""


class LeaseLost(EngineUnavailable):
    """The engine answered, but this appliance's lease is gone: join() again."""


@dataclass(frozen=True, slots=True)
class Registration:
    """An appliance registered for the array (its key under its lease)."""

    appliance: str
    info: Payload = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Leadership:
    """resource is led by appliance since the engine's revision epoch, under
    the engine's lease id lease (0: none, the key was not made by campaign())."""

    resource: str
    appliance: str
    epoch: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """A decisions key: epoch and appliance as its value states them (informative),
    payload; lease and revision are the engine's: the key's lease and mod_revision."""

    resource: str
    epoch: int
    appliance: str
    payload: Payload = field(default_factory=dict)
    lease: int = 0
    revision: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything of one array at one engine revision (one range request)."""

    revision: int
    appliances: Mapping[str, Registration] = field(default_factory=dict)
    leaders: Mapping[str, Leadership] = field(default_factory=dict)
    samples: Mapping[str, Payload] = field(default_factory=dict)
    decisions: Mapping[str, Decision] = field(default_factory=dict)

    def current(self, resource: str) -> Decision | None:
        """The decision the current leader of resource wrote during its
        leadership: under the leader key's lease and written after it was made
        (mod_revision > epoch).  None otherwise (no leader, no decision, or a
        decision the engine says the leader did not write: see bound())."""
        got = self.decisions.get(resource)
        return got if got is not None and self.bound(resource, got) else None

    def bound(self, resource: str, d: Decision) -> bool:
        """d is written under resource's current leadership (engine's records only)."""
        lead = self.leaders.get(resource)
        if lead is None or lead.lease == 0:
            return False
        return d.lease == lead.lease and d.revision > lead.epoch


class Coordinator(Protocol):
    """One appliance's handle on its array's coordination (not thread-safe:
    one caller, the daemon's loop)."""

    @property
    def array(self) -> str: ...

    @property
    def appliance(self) -> str | None:
        """The name given to join(); None before."""
        ...

    @property
    def lease(self) -> int | None:
        """The engine's id of this appliance's lease; None without one."""
        ...

    def join(self, appliance: str, info: Payload) -> None:
        """Register under a new lease of the adapter's ttl_s (a previous one of
        this handle is revoked first)."""
        ...

    def refresh(self) -> None:
        """Keep the lease alive; call it at least every ttl_s / 3 (the agent
        does every ttl_s / 4).  LeaseLost if it has ended."""
        ...

    def leave(self) -> None:
        """Revoke the lease: registration, samples, leaderships and decisions of
        this appliance vanish at once.  Idempotent."""
        ...

    def appliances(self) -> list[Registration]: ...

    def campaign(self, resource: str) -> Leadership | None:
        """Become resource's leader if nobody is (a leader key without a lease,
        put by hand, is nobody's); my Leadership if I lead (now or already),
        None if another appliance does."""
        ...

    def resign(self, resource: str) -> bool:
        """Stop leading resource (its leader key and decisions go); False if I
        did not lead it."""
        ...

    def leader(self, resource: str) -> Leadership | None: ...

    def publish_samples(self, payload: Payload) -> None: ...

    def samples(self) -> dict[str, Payload]: ...

    def publish_decisions(self, resource: str, epoch: int, payload: Payload) -> bool:
        """Write resource's decisions if I still lead it at epoch (checked in
        the engine); False if not."""
        ...

    def decisions(self, resource: str) -> Decision | None: ...

    def snapshot(self) -> Snapshot:
        """Everything under the array's prefix, in one request."""
        ...
