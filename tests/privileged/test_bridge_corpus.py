"""The in-kernel wire sensor and the Python tracker give the same counts on the corpus.

Each capture of tests/fixtures/wire/ (the lab's real iSCSI and NVMe/TCP traffic,
tests/wire), whole, cut at two byte offsets (the sensor starts mid-PDU) and with the
seeded damage of tests/wire (flipped bytes, dropped frames, swapped pairs, all at once),
is replayed with tcpreplay into a veth in a namespace this test owns, the program
(bridge/kernel.py) on its other end; the Python tracker walks the same frames from
memory. Equal: the commands, completions, completions of nothing, tags reused, the
walks' desyncs, resyncs, retracted headers, PDUs and gaps, the reads, and the IPsec
security associations seen (frames and bytes).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from santhrottle.appliance.netns import entered
from tests.privileged.bridge_ns import veth_pair
from tests.wire import oracle as O
from tests.wire.test_corpus import CAPTURES, DAMAGE, SEED, capture_name

pytestmark = pytest.mark.privileged

# the rate of the replay: the veth's backlog takes it without a drop on a loaded host
REPLAY_PPS = 20_000
COUNTS = ("commands", "completions", "unmatched", "replaced", "desyncs", "resyncs",
          "retracted", "pdus", "gaps")  # fmt: skip


@pytest.fixture(scope="module")
def veth() -> Iterator[tuple[str, object]]:
    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace)")
    if not shutil.which("tcpreplay"):
        pytest.skip("tcpreplay is not installed (make setup)")
    from santhrottle.bridge import kernel

    if not kernel.OBJECT.exists():
        pytest.skip(f"{kernel.OBJECT} is not built (make bpf)")
    with veth_pair("stc", mtu=65535) as ns:  # the captures hold GRO'd frames up to 64 KiB
        yield ns, kernel


def _kernel_counts(ns: str, kernel, frames: list[O.Frame], linktype: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with entered(ns):
        w = kernel.KernelWire("stc1")
    with w, tempfile.TemporaryDirectory() as tmp:
        pcap = Path(tmp) / "replay.pcap"
        O.write_pcap(pcap, frames, linktype)
        subprocess.run(["ip", "netns", "exec", ns, "tcpreplay", "-i", "stc0",
                        f"--pps={REPLAY_PPS}", str(pcap)], check=True,
                       capture_output=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while w.counters()["frames"] < len(frames) and time.monotonic() < deadline:
            time.sleep(0.05)
        k = w.counters()
        assert k["frames"] == len(frames), f"the program saw {k['frames']} of {len(frames)}"
        k["reads"] = sum(v.reads for v in w.volume_sums().values())
        k["esp"] = sorted((e.src, e.dst, e.spi, e.frames, e.bytes) for e in w.esp_flows())
    return k


def _python_counts(frames: list[O.Frame]) -> dict[str, int]:
    # the login's digests found by the walk, as the kernel's does until userspace has read
    # the login (no userspace here: bridge/ksums.py does that in the daemon)
    run = O.walk(frames, learn_logins=False)
    tr, walk = run.tracker, run.tracker.walk_totals()
    out = {n: getattr(tr.counters, n) for n in ("commands", "completions", "unmatched",
                                                 "replaced")}  # fmt: skip
    out.update({n: getattr(walk, n) for n in ("desyncs", "resyncs", "retracted", "pdus",
                                              "gaps")})  # fmt: skip
    out["reads"] = sum(1 for io in run.ios if io.op == 1)
    out["esp"] = sorted((src, dst, spi, f.frames, f.bytes)
                        for (src, dst, spi), f in tr.esp.flows.items())  # fmt: skip
    return out


def _variants(frames: list[O.Frame]) -> Iterator[tuple[str, list[O.Frame]]]:
    yield "whole", frames
    rnd = random.Random(SEED)
    total = O.payload_bytes(frames)
    for _ in range(2):
        at = rnd.randrange(total // 4)
        yield f"from byte {at}", O.cut_frames(frames, at)
    for kind, kw in DAMAGE.items():
        yield kind, O.damage(frames, SEED, **kw)[0]


@pytest.mark.parametrize("path", CAPTURES, ids=capture_name)
def test_the_kernel_counts_as_the_python_tracker(veth, path: Path) -> None:  # type: ignore[no-untyped-def]
    if not path.exists():
        pytest.skip(f"{path} is missing (make lab-wire-corpus)")
    ns, kernel = veth
    linktype, frames = O.read_pcap(path)
    for name, variant in _variants(frames):
        py = _python_counts(variant)
        k = _kernel_counts(ns, kernel, variant, linktype)
        diff = {n: (py[n], k.get(n)) for n in (*COUNTS, "reads", "esp") if py[n] != k.get(n)}
        assert not diff, f"{path.name}, {name}: (python, kernel) {diff}"
