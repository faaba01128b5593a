"""A live bridge-mode santhrottled under hostile traffic, in three namespaces this test
owns (an initiator, the bridge host, a target): a real iSCSI session reads through the
bridge the daemon made, the target answering each read after READ_DELAY_S, while
100,000 hostile segments are sent into the bridge (random bytes, headers that lie about
their lengths, tag reuse, completions of nothing, SYN/FIN/RST at random, on 80
connections to the target's storage ports): the real session is measured again (its
reads at the target's 20 ms) once they stop -- the connections that fell silent have no
say in the resource's hold (bridge/volumes.py) -- and the daemon's bounds hold: its
threads, descriptors, memory, no sensor error, no traceback.

Each runs with the wire walked in the kernel and in Python. The host kernel has no
sch_netem: the classes get pfifo leaves (classified, not delayed). Whatever fails, the
namespaces and the processes this test started (by PID) go.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from santhrottle.appliance.daemon.control import request
from santhrottle.appliance.netns import entered
from santhrottle.bridge.tracker import MAX_CONNS
from tests.privileged.bridge_ns import INI_IP, TGT_IP
from tests.privileged.test_bridge_daemon import READ_DELAY_S, Reader, Target, bridge_config
from tests.privileged.test_bridge_kernel import _hostile
from tests.privileged.test_daemon_netns import _start, _stop, sh

pytestmark = pytest.mark.privileged

HOSTILE = 100_000
# what the daemon may grow by, in resident memory, under the flood (its own figure is
# printed)
RSS_GROWTH_MAX_BYTES = 96 << 20


@dataclass
class Live:
    ini: str
    mid: str
    tgt: str
    conf: Path
    sock: str
    proc: subprocess.Popen
    reader: Reader


@pytest.fixture(params=["kernel", "capture"])
def live(three_namespaces, tmp_path, request) -> Iterator[Live]:
    """The daemon in bridge mode (its wire in the kernel or in Python), the target, and
    a real session reading through the bridge; all ended whatever happens."""
    ini, mid, tgt = three_namespaces
    if not shutil.which("nft"):
        pytest.skip("no nft (nftables): bridge mode's gate")
    if request.param == "kernel":
        from santhrottle.bridge import kernel

        if not kernel.OBJECT.exists():
            pytest.skip(f"{kernel.OBJECT} is not built (make bpf)")
    conf = bridge_config(tmp_path, mid, request.param, f"iscsi://{TGT_IP}/*/*", "1s")
    sock = str(tmp_path / "control.sock")
    target = Target(tgt)
    target.start()
    proc = reader = None
    try:
        proc = _start(conf, sock, log=tmp_path / "log")
        reader = Reader(ini)
        reader.start()
        yield Live(ini, mid, tgt, conf, sock, proc, reader)
    finally:
        if reader is not None:
            reader.stop.set()
        if proc is not None:
            _stop(proc)
            if proc.poll() is None:
                proc.kill()  # our own child, by PID
                proc.wait()
        if reader is not None:
            reader.join(timeout=15)
        target.close()


# ------------------------------------------------------------------------------ helpers
def _rss(pid: int) -> int:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _threads_fds(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def _status(live: Live) -> dict:
    return request(live.sock, "status", timeout_s=30)


def _measured(live: Live, timeout_s: float = 30.0) -> float:
    """The real session's read latency, once a tick shows reads of it again (after what
    the test did): the target's READ_DELAY_S plus the hop."""
    done = live.reader.done
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (r,) = _status(live)["resources"]
        if r["reads"] and live.reader.done > done:
            return r["read_latency_s"]
        time.sleep(0.1)
    st = _status(live)
    mine = [r for r in st["wire"]["sync"] if r["initiator"] == INI_IP]
    raise AssertionError(
        f"the session's reads were not measured ({live.reader.error}): held "
        f"{st['wire']['held']}, {st['resources']}, its directions {mine}"
    )


def _daemon_ok(live: Live, errors0: int) -> dict:
    """The daemon runs, its wire captures, no sensor error since errors0; its status."""
    assert live.proc.poll() is None, "santhrottled ended"
    st = _status(live)
    assert st["wire"]["capturing"], st["wire"]
    assert st["counters"]["sensor_errors"] == errors0, st["counters"]
    return st


def _log(live: Live) -> str:
    return (live.conf.parent / "log").read_text()


def _mac(ns: str, dev: str) -> bytes:
    out = sh("ip", "-n", ns, "-o", "link", "show", dev)
    return bytes.fromhex(out.split("link/ether ")[1].split()[0].replace(":", ""))


def _ip_fixed(frame: bytes) -> bytes:
    f = bytearray(frame)
    if f[12:14] != b"\x08\x00":
        return frame
    f[16:18] = (len(f) - 14).to_bytes(2, "big")
    f[24:26] = b"\0\0"
    ihl = (f[14] & 0x0F) * 4
    total = sum(int.from_bytes(f[i : i + 2], "big") for i in range(14, 14 + ihl, 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    f[24:26] = (~total & 0xFFFF).to_bytes(2, "big")
    return bytes(f)


def _inject(ns: str, dev: str, frames: list[bytes], dst_mac: bytes) -> None:
    """Send the frames into dev in ns (the bridge's initiator side), to dst_mac, from
    dev's own address (a bridge drops a frame from 00:00:00:00:00:00), each IPv4
    header's length and checksum made right (the bridge's netfilter drops a header that
    is wrong; the TCP checksums stay wrong: the target drops the segments unanswered)."""
    src_mac = _mac(ns, dev)
    frames = [_ip_fixed(f) for f in frames]
    with entered(f"/run/netns/{ns}"):
        tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    with tx:
        tx.bind((dev, 0))
        for f in frames:
            while True:
                try:
                    tx.send(dst_mac + src_mac + f[12:])
                    break
                except BlockingIOError:  # the veth's queue is full: wait for room
                    time.sleep(0.001)


# ------------------------------------------------------------------- hostile segments
def test_hostile_segments_through_the_bridge_leave_the_session_measured(live):
    errors0 = _status(live)["counters"]["sensor_errors"]
    before = _measured(live)
    assert READ_DELAY_S * 0.95 <= before <= READ_DELAY_S + 0.08, before
    pid = live.proc.pid
    rss0, (threads0, fds0) = _rss(pid), _threads_fds(pid)
    frames0 = _status(live)["wire"]["capture_frames"]
    rnd = random.Random(46)
    frames = _hostile(HOSTILE, rnd)
    _inject(live.ini, "st-i", frames, _mac(live.tgt, "st-t"))

    def seen() -> int:  # what the wire walked or its ring dropped (counted)
        w = _status(live)["wire"]
        return w["capture_frames"] + w["capture_kernel_drops"] - frames0

    deadline = time.monotonic() + 60  # Python's walk catches up with its ring
    while seen() < HOSTILE * 0.9 and time.monotonic() < deadline:
        time.sleep(0.5)
    st = _daemon_ok(live, errors0)
    assert seen() >= HOSTILE * 0.9, st["wire"]
    after = _measured(live)
    assert READ_DELAY_S * 0.95 <= after <= READ_DELAY_S + 0.08, after
    assert live.reader.error is None, live.reader.error
    # the daemon's bounds: what the wire holds, its threads, descriptors and memory
    assert len(st["wire"]["sync"]) <= 2 * MAX_CONNS * 8, len(st["wire"]["sync"])
    threads, fds = _threads_fds(pid)
    assert threads <= threads0 + 1 and fds <= fds0 + 2, (threads0, threads, fds0, fds)
    grown = _rss(pid) - rss0
    print(f"hostile: {seen()} frames seen, RSS grew {grown / 2**20:.1f} MiB")
    assert grown < RSS_GROWTH_MAX_BYTES, grown
    assert "Traceback" not in _log(live)
