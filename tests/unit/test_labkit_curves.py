"""labkit.curves: a curve's repeats go in rounds over the delays, so a starved stretch of
the host slows one round and each point keeps its fastest transfer; on a made-up plant
(fio's transfers and the target's counters replaced, the product's Ladder real)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from labkit import curves

from santhrottle.controller.ladder import Ladder

SIZE = 8 << 20
BASE_S = 0.8  # one transfer undelayed
PER_MS_S = 0.128  # 128 IOs of 64k, each delayed once


class Plant:
    """Transfers take BASE_S + delay x PER_MS_S, and STALL_S more from the `stall`-th
    transfer on for `stall_len` of them; each measured transfer retransmits once, and
    the initiator reports it (a D-SACK)."""

    STALL_S = 2.5

    def __init__(self, stall: int, stall_len: int) -> None:
        ladder = Ladder.linear(500, 100)  # 0.5 ms a class
        self.spec = SimpleNamespace(ladder=ladder, delay_us=ladder.delay_us)
        self.ms = 0.0
        self.transfers: list[float] = []  # delays of the measured transfers, in order
        self.stall = range(stall, stall + stall_len)
        self.retrans = self.dsack = self.tlp = 0

    def set_classes(self, classes: dict, mode: str | None = None) -> None:
        (k,) = classes.values()
        self.ms = self.spec.delay_us(k) / 1000

    def once(self, device, rw, bs, qd, size, offset=0, timeout_s=600) -> float:
        if size != SIZE:  # the warm-up
            self.tlp += 1
            return 0.1
        n = len(self.transfers)
        self.transfers.append(self.ms)
        self.retrans += 1
        self.dsack += 1
        return BASE_S + self.ms * PER_MS_S + (self.STALL_S if n in self.stall else 0.0)

    def counters(self) -> dict[str, int]:
        return {"TcpRetransSegs": self.retrans, "TcpExtTCPDSACKRecv": self.dsack,
                "TcpExtTCPLossProbes": self.tlp}  # fmt: skip


@pytest.fixture
def plant(monkeypatch):
    def make(stall: int, stall_len: int) -> Plant:
        p = Plant(stall, stall_len)
        monkeypatch.setattr(curves.fio, "once", p.once)
        monkeypatch.setattr(curves, "counters", p.counters)
        return p

    return make


def test_the_repeats_go_in_rounds_over_the_delays(plant):
    p = plant(stall=99, stall_len=0)
    pts = curves.curve(p, "10.0.0.2", "/dev/sdb", "read", "read", "64k", 1, SIZE, (0, 10, 20),
                       log=lambda _: None, repeat=3)  # fmt: skip
    assert p.transfers == [0, 10, 20] * 3
    assert [pt["delay_ms"] for pt in pts] == [0, 10, 20]
    assert [len(pt["runs_s"]) for pt in pts] == [3, 3, 3]
    assert [pt["target_retrans"] for pt in pts] == [3, 3, 3]  # summed over the rounds
    assert [pt["measured"]["TcpExtTCPDSACKRecv"] for pt in pts] == [3, 3, 3]
    assert [pt["transition"]["TcpExtTCPLossProbes"] for pt in pts] == [3, 3, 3]
    f = curves.fit(pts)
    assert f["retrans"] == f["dsack"] == 9 and f["transition_tlp"] == 9


@pytest.mark.parametrize("stall", [0, 1, 2, 3, 4, 5, 6])
def test_a_starved_stretch_of_three_transfers_leaves_the_line_straight(plant, stall):
    """Three slow transfers in a row, wherever they fall: one run per point at most
    (with the repeats back to back, a stretch like it took every run of one point)."""
    p = plant(stall=stall, stall_len=3)
    pts = curves.curve(p, "10.0.0.2", "/dev/sdb", "read", "read", "64k", 1, SIZE, (0, 10, 20),
                       log=lambda _: None, repeat=3)  # fmt: skip
    fastest = [BASE_S + ms * PER_MS_S for ms in (0, 10, 20)]
    assert [pt["seconds"] for pt in pts] == pytest.approx(fastest)
    assert curves.fit(pts)["r2"] == pytest.approx(1.0)
    assert [pt["mb_s"] for pt in pts] == pytest.approx([SIZE / pt["seconds"] / 1e6 for pt in pts])
