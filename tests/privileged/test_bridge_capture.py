"""bridge/capture.py + tracker.py on real TCP: a ring on the target's veth in a namespace
this test owns sees an initiator's iSCSI reads and NVMe/TCP reads, and the tracker
measures their latency as the server made it, on the sensor's clock."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from santhrottle.appliance.netns import entered
from santhrottle.bridge.capture import Ring
from santhrottle.bridge.tracker import Tracker

pytestmark = pytest.mark.privileged

# The addresses and device conftest.netns_pair builds.
TARGET_DEV, TARGET_IP, MEMBER_IP = "st-tgt", "192.0.2.1", "192.0.2.2"
DELAY_S = 0.02
READS = 20

# Both ends read whole PDUs.
EXACT = r"""
def exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
"""

# A storage server that answers each read after DELAY_S: iSCSI (a Data-In with
# the status, F|S) on 3260, NVMe/TCP (a C2HData then a CapsuleResp) on 4420.
SERVER = (
    r"""
import socket, struct, sys, threading, time
"""
    + EXACT
    + r"""
delay = float(sys.argv[2])
def iscsi(c):
    while True:
        bhs = exact(c, 48)
        itt = struct.unpack_from(">I", bhs, 16)[0]
        time.sleep(delay)
        data = b"r" * 4096
        hdr = bytearray(48); hdr[0] = 0x25; hdr[1] = 0x81
        hdr[5:8] = len(data).to_bytes(3, "big"); struct.pack_into(">I", hdr, 16, itt)
        c.sendall(bytes(hdr) + data)
def nvme(c):
    while True:
        pdu = exact(c, 72)
        cid = struct.unpack_from("<H", pdu, 10)[0]
        time.sleep(delay)
        data = b"r" * 4096
        c2h = struct.pack("<BBBBIHHIIxxxx", 7, 0x04, 24, 24, 24 + len(data), cid, 0, 0, len(data))
        resp = struct.pack("<BBBBI", 5, 0, 24, 0, 24) + bytes(12) + struct.pack("<HH", cid, 1)
        c.sendall(c2h + data + resp)
def serve(s, fn):
    while True:
        c, _ = s.accept()
        threading.Thread(target=quietly, args=(fn, c), daemon=True).start()
def quietly(fn, c):
    try:
        fn(c)
    except EOFError:  # the client is done
        pass
socks = []
for port, fn in ((3260, iscsi), (4420, nvme)):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], port)); s.listen(4)
    threading.Thread(target=serve, args=(s, fn), daemon=True).start()
print("ready", flush=True)
time.sleep(120)
"""
)

# n reads, one at a time, over each protocol.
CLIENT = (
    r"""
import socket, struct, sys
"""
    + EXACT
    + r"""
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = socket.socket(); c.bind((src, 0)); c.connect((dst, 3260))
for i in range(n):
    bhs = bytearray(48); bhs[0] = 0x01; bhs[1] = 0xC0
    struct.pack_into(">QII", bhs, 8, 1 << 48, 100 + i, 4096); bhs[32] = 0x28
    c.sendall(bytes(bhs)); exact(c, 48 + 4096)
c.close()
c = socket.socket(); c.bind((src, 0)); c.connect((dst, 4420))
for i in range(n):
    sqe = bytearray(64); sqe[0] = 0x02; struct.pack_into("<HI", sqe, 2, 0x1000 + i, 1)
    c.sendall(struct.pack("<BBBBI", 4, 0, 72, 0, 72) + bytes(sqe)); exact(c, 24 + 4096 + 24)
c.close()
print("done", flush=True)
"""
)


def test_the_ring_and_the_tracker_measure_reads_on_a_veth(netns_pair):
    pair = netns_pair
    srv = subprocess.Popen(
        ["ip", "netns", "exec", pair.target, sys.executable, "-c", SERVER, TARGET_IP,
         str(DELAY_S)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    pair.procs.append(srv)
    assert srv.stdout.readline().strip() == "ready"
    tracker = Tracker()
    stamps: list[float] = []

    def segment(now_s, *rest):
        stamps.append(now_s)
        tracker.segment(now_s, *rest)

    busy_s: dict = {}

    def poll():  # and, as the sensor's tick does, the busy time up to now
        ring.poll(50, segment)
        for v, s in tracker.busy.take(time.monotonic()).items():
            busy_s[v] = busy_s.get(v, 0.0) + s

    with entered(f"/run/netns/{pair.target}"):
        ring = Ring(TARGET_DEV, block_bytes=1 << 20, blocks=8)
    t0 = time.monotonic()
    with ring:
        cli = subprocess.Popen(
            ["ip", "netns", "exec", pair.initiator, sys.executable, "-c", CLIENT, MEMBER_IP,
             TARGET_IP, str(READS)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        pair.procs.append(cli)
        deadline = time.monotonic() + 60
        while cli.poll() is None and time.monotonic() < deadline:
            poll()
        poll()  # what the last block holds
        assert cli.wait(timeout=5) == 0
        _, drops = ring.kernel_stats()
    reads = tracker.take_tick()[0]
    by_proto = {v.proto: r for v, r in reads.items()}
    assert set(by_proto) == {"iscsi", "nvme"}, reads
    for proto, r in by_proto.items():
        assert r.reads == READS, (proto, r)
        # the server's delay, plus scheduling on a busy machine; never less
        assert DELAY_S <= r.mean_s < DELAY_S + 0.2, (proto, r.mean_s)
    assert tracker.counters.unmatched == 0 and drops == 0
    assert ring.counters.truncated == 0 and ring.counters.segments > 4 * READS
    # the frames' times are on the monotonic clock (the kernel stamps them on the wall
    # clock): a busy span closed at a tick's time is as long as the volume was busy
    took = time.monotonic() - t0
    assert stamps and t0 <= min(stamps) and max(stamps) <= t0 + took, (t0, stamps[:3])
    assert len(busy_s) == 2, busy_s  # one volume per protocol
    for v, s in busy_s.items():  # READS reads of at least DELAY_S, one at a time
        assert READS * DELAY_S <= s <= took, (v, s, took)
