"""IPsec ESP on the array-side port: storage the wire sensor cannot read, shown as such.

Problem
    iSCSI or NVMe/TCP inside IPsec (ESP, RFC 4303; or ESP in UDP on port 4500,
    RFC 3948, behind NAT) hides its TCP ports, let alone its PDUs: the sensor
    can never measure it. It is not noise either: it must not look like a
    storage connection out of sync, and it must not be fed to the controller.
    It is shown, per security association, as "not measurable", so that an
    admin sees which initiator and target talk past the sensor (and measures
    those volumes on the target host instead: docs/bridge.md, "Sync").

State
    Per security association -- (source address, destination address, SPI): one
    direction of a tunnel or transport pair -- when it was first and last seen,
    its frames and bytes. At most MAX_ESP_FLOWS (the oldest seen goes); one not
    seen for the tracker's CONN_IDLE_S is forgotten. The in-kernel program keeps
    the same in its map esp (bridge/kernel.py's esp_flows()).

Worked example
    ESP frames from 10.0.0.3 to 10.0.0.12 with SPI 0x5301, 492 of them over 15 s:
    a row "10.0.0.3 -> 10.0.0.12 esp, not measurable (ipsec esp spi 0x00005301)",
    15 s and its bytes out of sync.
"""

from __future__ import annotations

from dataclasses import dataclass

from .belief import STATE_NAMES, UNMEASURABLE
from .conns import SyncRow

MAX_ESP_FLOWS = 1024
NAT_T_PORT = 4500
IPPROTO_ESP = 50
IPPROTO_UDP = 17
ESP_SNAP_BYTES = 128  # what the capture keeps of an ESP frame: its headers and SPI


@dataclass(slots=True)
class EspFlow:
    first_s: float
    last_s: float
    frames: int = 0
    bytes: int = 0


def esp_row(src: str, dst: str, spi: int, seconds: float, nbytes: int) -> SyncRow:
    """A security association as a sync row: not measurable, for as long as it was seen."""
    return SyncRow(
        src,
        0,
        dst,
        "",
        "esp",
        STATE_NAMES[UNMEASURABLE],
        nbytes,
        round(seconds, 6),
        0,
        f"ipsec esp spi 0x{spi:08x}",
    )


class EspFlows:
    """The security associations seen (module header)."""

    def __init__(self) -> None:
        self.flows: dict[tuple[str, str, int], EspFlow] = {}

    def frame(self, now_s: float, src: str, dst: str, spi: int, nbytes: int) -> bool:
        """One ESP frame; True when its security association is new."""
        key = (src, dst, spi)
        f = self.flows.get(key)
        new = f is None
        if f is None:
            if len(self.flows) >= MAX_ESP_FLOWS:
                del self.flows[next(iter(self.flows))]
            f = self.flows[key] = EspFlow(now_s, now_s)
        f.last_s = now_s
        f.frames += 1
        f.bytes += nbytes
        return new

    def sweep(self, now_s: float, idle_s: float) -> None:
        for key in [k for k, f in self.flows.items() if now_s - f.last_s > idle_s]:
            del self.flows[key]

    def rows(self) -> list[SyncRow]:
        return [
            esp_row(src, dst, spi, f.last_s - f.first_s, f.bytes)
            for (src, dst, spi), f in self.flows.items()
        ]


def spi_of(proto: int, l4: bytes | memoryview, l4_len: int) -> tuple[int, int] | None:
    """(SPI, bytes) of an ESP packet whose IP payload is l4_len bytes, of which l4 holds
    the first (a capture may keep only ESP_SNAP_BYTES of the frame); ESP in UDP on
    NAT_T_PORT included (not its IKE: SPI 0, the non-ESP marker). None for the rest.
    The kernel's encrypted() (wire.bpf.c) reads the same."""
    if proto == IPPROTO_ESP and l4_len >= 8 and len(l4) >= 4:
        return int.from_bytes(l4[0:4], "big"), l4_len
    if proto == IPPROTO_UDP and l4_len >= 16 and len(l4) >= 12:
        sport, dport = int.from_bytes(l4[0:2], "big"), int.from_bytes(l4[2:4], "big")
        spi = int.from_bytes(l4[8:12], "big")
        if NAT_T_PORT in (sport, dport) and spi:
            return spi, l4_len - 8
    return None
