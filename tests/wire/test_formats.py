"""The oracle reads captures as they come: pcap either byte order, pcapng, and link
types other than Ethernet (Linux cooked v1 and v2, raw IP), all as the same Ethernet
frames with the same times (oracle.read_pcap)."""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.wire import oracle as O
from tests.wire.test_corpus import FIXTURES

pytestmark = pytest.mark.fuzz
LAB = FIXTURES / "lab-wire.pcap.gz"


def _classic(path: Path, frames: list[O.Frame], linktype: int, wrap, order: str = "<") -> None:  # type: ignore[no-untyped-def]
    out = [struct.pack(order + "IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, linktype)]
    for f in frames:
        data = wrap(f.data)
        ns = round(f.ts * 1e9)
        out.append(struct.pack(order + "IIII", ns // 10**9, ns % 10**9, len(data), len(data)))
        out.append(data)
    path.write_bytes(b"".join(out))


def _same(a: list[O.Frame], b: list[O.Frame]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.data == y.data and abs(x.ts - y.ts) < 1e-6


def test_link_types_and_byte_orders(tmp_path: Path) -> None:
    if not LAB.exists():
        pytest.skip(f"{LAB} is missing")
    _, base = O.read_pcap(LAB)
    base = base[:400]
    ip = [f.data[14:] for f in base]
    sll = lambda d: struct.pack("!HHH8sH", 0, 1, 6, b"\x02" * 8, 0x0800) + d[14:]  # noqa: E731
    sll2 = lambda d: struct.pack("!HHIHBB8s", 0x0800, 0, 2, 1, 0, 6, b"\x02" * 8) + d[14:]  # noqa: E731
    kinds = (
        ("be.pcap", 1, lambda d: d, ">"),
        ("sll.pcap", 113, sll, "<"),
        ("sll2.pcap", 276, sll2, "<"),
        ("raw.pcap", 101, lambda d: d[14:], "<"),
    )
    for name, lt, wrap, order in kinds:
        p = tmp_path / name
        _classic(p, base, lt, wrap, order)
        linktype, got = O.read_pcap(p)
        assert linktype == 1
        assert [g.data[14:] for g in got] == ip, name
        assert all(abs(g.ts - f.ts) < 1e-6 for g, f in zip(got, base, strict=True)), name


def test_pcapng(tmp_path: Path) -> None:
    if not LAB.exists():
        pytest.skip(f"{LAB} is missing")
    if shutil.which("editcap") is None:
        pytest.skip("editcap (Debian: wireshark-common, with tshark) is not installed")
    plain = tmp_path / "a.pcap"
    plain.write_bytes(gzip.decompress(LAB.read_bytes()))
    ng = tmp_path / "a.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(plain), str(ng)], check=True)
    _same(O.read_pcap(plain)[1], O.read_pcap(ng)[1])
