"""sock_diag in a network namespace this test owns: the raw dump sees exactly the
established connections on the storage ports, IPv4 and IPv6, as pyroute2 does."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from santhrottle.appliance.sensing.conns import ConnectionSensor, dump_established

pytestmark = pytest.mark.privileged

HOLDER = r"""
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 3260)); srv.listen()
other = socket.socket(); other.bind(("127.0.0.1", 9999)); other.listen()
s6 = socket.socket(socket.AF_INET6); s6.bind(("::1", 4420)); s6.listen()
keep = []
for src in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
    c = socket.socket(); c.bind((src, 0)); c.connect(("127.0.0.1", 3260))
    keep += [c, srv.accept()[0]]
c = socket.socket(); c.connect(("127.0.0.1", 9999)); keep += [c, other.accept()[0]]
c = socket.socket(socket.AF_INET6); c.connect(("::1", 4420)); keep += [c, s6.accept()[0]]
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    if not shutil.which("ip"):
        pytest.skip("iproute2 (ip) is not installed")
    name = f"st-conns-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    proc = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", HOLDER],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        yield name
    finally:
        if proc is not None:
            proc.kill()  # our own child, by PID
            proc.wait()
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_storage_port_peers_in_a_netns(netns):
    got = ConnectionSensor([3260, 4420], netns=netns).connections()
    assert sorted((c.local_ip, c.local_port, c.peer_ip) for c in got) == [
        ("127.0.0.1", 3260, "127.0.0.2"),
        ("127.0.0.1", 3260, "127.0.0.3"),
        ("127.0.0.1", 3260, "127.0.0.4"),
        ("::1", 4420, "::1"),
    ]
    # the host's own namespace does not see them
    assert not [
        c for c in ConnectionSensor([3260]).connections() if c.peer_ip.startswith("127.0.0.")
    ]


def test_raw_dump_matches_pyroute2(netns):
    from pyroute2 import DiagSocket
    from pyroute2 import netns as pnetns

    mine = dump_established(netns)
    pnetns.pushns(netns)
    try:
        with DiagSocket() as ds:
            ds.bind()
            ref = [
                m
                for fam in (socket.AF_INET, socket.AF_INET6)
                for m in ds.get_sock_stats(family=fam, states=1 << 1)
            ]
    finally:
        pnetns.popns()

    def key(r):
        return (r.get("idiag_src"), r.get("idiag_sport"), r.get("idiag_dst"), r.get("idiag_dport"))

    assert sorted(map(key, ref)) == sorted(map(key, mine))
    assert len(mine) == 10  # 5 connections, both ends


def test_one_walk_request_matches_one_request_per_family(netns):
    from santhrottle.appliance.sensing.conns import _dump_raw

    for ports in (frozenset({3260, 4420}), None):
        one = _dump_raw(netns, ports)
        per_family = _dump_raw(netns, ports, one_walk=False)
        assert one == per_family
    assert [len(ids) for _, ids in one] == [8, 2]  # every socket: 4 IPv4 connections, 1 IPv6
