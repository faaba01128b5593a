"""What a provisional header did to a connection, kept or undone when its walk decides.

A resync takes a header whose successor lies beyond the bytes at hand before it is
proven (belief.py): the tracker acts on it at once -- a command goes in flight, a
completion completes its command -- and confirm() or retract() keeps or undoes it when
the next segment shows the successor, or not. Side is one direction's flow.Hooks for
tracker.py's Tracker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .belief import Hooks
from .conns import Command, Connection
from .pdu import CMD, DATA_OUT, DONE, Pdu
from .sums import NVME

if TYPE_CHECKING:
    from .tracker import Tracker


class Side(Hooks):
    """One direction's hooks (flow.Hooks): what its provisional header did, kept or
    undone when the walk decides. A command goes in flight at once (its write bytes
    held until it holds); a completion of a command in flight completes it (the
    match proves both), one of nothing is counted only if it holds; NVMe write data
    waits; a login's or connect's names are taken at once."""

    __slots__ = ("conn", "held", "to_target", "tracker")

    def __init__(self, tracker: Tracker, conn: Connection, to_target: bool) -> None:
        self.tracker, self.conn, self.to_target = tracker, conn, to_target
        # (the command it put in flight, its tag) | (NVMe write data: tag, bytes) |
        # "unmatched" | None
        self.held: tuple[int, Command] | tuple[int, int] | str | None = None

    def provisional(self, pdu: Pdu, body: bytes) -> None:
        tr, conn, kind = self.tracker, self.conn, pdu.kind
        self.held = None
        if conn.unmeasurable:
            return
        if kind == CMD and self.to_target:
            cmd = tr._command(conn, pdu, True)
            if cmd is not None:
                self.held = (pdu.tag, cmd)
        elif kind == DONE and not self.to_target:
            cmd = conn.inflight.pop(pdu.tag, None)
            if cmd is None:
                self.held = "unmatched"
            else:
                tr._completed(conn, cmd, pdu.tag)
        elif kind == DATA_OUT and self.to_target and conn.proto == NVME:
            self.held = (pdu.tag, pdu.data_bytes)
        else:
            tr._pdu(conn, self.to_target, pdu, body)

    def confirm(self) -> None:
        held, self.held, tr = self.held, None, self.tracker
        if held == "unmatched":
            tr.counters.unmatched += 1
        elif isinstance(held, tuple) and isinstance(held[1], Command):
            cmd = held[1]
            if cmd.held_bytes and cmd.volume is not None:
                tr.sums.wrote(cmd.volume, self.conn.initiator, cmd.held_bytes)
                cmd.held_bytes = 0
        elif isinstance(held, tuple):
            tr._pdu(self.conn, True, Pdu(DATA_OUT, held[0], 0, 0, 0, held[1]), b"")

    def retract(self) -> None:
        held, self.held, tr = self.held, None, self.tracker
        if isinstance(held, tuple) and isinstance(held[1], Command):
            tag, cmd = held
            if self.conn.inflight.get(tag) is cmd:  # not completed: never a command
                del self.conn.inflight[tag]
                tr.inflight_total -= 1
                tr.counters.commands -= 1
                tr.busy.down(cmd.volume, tr._now)

    def unmeasurable(self, reason: str) -> None:
        self.tracker._unmeasurable(self.conn, reason)
