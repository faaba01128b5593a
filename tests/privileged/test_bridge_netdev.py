"""bridge/netdev.py on the host kernel: a bridge made between two veths in a namespace this
test owns forwards TCP between an initiator's and a target's namespaces at once, with STP off;
made again it is adopted unchanged; what is someone else's is refused. And the data path on
its initiator-side port classifies the bridged packets (nftables' bridge family)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from santhrottle.appliance.netns import entered
from santhrottle.bridge import netdev
from tests.privileged.bridge_ns import INI_IP, TGT_IP

pytestmark = pytest.mark.privileged

ECHO = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 3260)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.sendall(c.recv(100)); c.close()
"""
CALL = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 3260), timeout=10); c.sendall(b"ping")
print(c.recv(100).decode())
"""


def _tcp_through(ini: str, tgt: str) -> str:
    srv = subprocess.Popen(["ip", "netns", "exec", tgt, sys.executable, "-c", ECHO, TGT_IP],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        out = subprocess.run(["ip", "netns", "exec", ini, sys.executable, "-c", CALL, TGT_IP],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        return out.stdout.strip()
    finally:
        srv.kill()  # our own child, by PID
        srv.wait()


def test_a_bridge_made_then_adopted_forwards_at_once(three_namespaces):
    from pyroute2 import IPRoute

    ini, mid, tgt = three_namespaces
    with entered(f"/run/netns/{mid}"):
        ipr = IPRoute()
    with ipr:
        made = netdev.ensure(ipr, "st-br0", "st-bi", "st-ba")
        assert made.created and made.ports == ("st-ba", "st-bi")
        assert (made.stp_state, made.forward_delay_cs) == (0, 0)
        assert _tcp_through(ini, tgt) == "ping"  # no listening and learning first
        again = netdev.ensure(ipr, "st-br0", "st-bi", "st-ba")
        assert not again.created and again.ports == made.ports and again.index == made.index
        assert _tcp_through(ini, tgt) == "ping"


def test_what_is_someone_elses_is_refused(three_namespaces):
    from pyroute2 import IPRoute

    _, mid, _ = three_namespaces
    with entered(f"/run/netns/{mid}"):
        ipr = IPRoute()
    with ipr:
        ipr.link("add", ifname="st-other", kind="bridge")
        (other,) = ipr.link_lookup(ifname="st-other")
        (x,) = ipr.link_lookup(ifname="st-x")
        ipr.link("set", index=x, master=other)
        with pytest.raises(netdev.BridgeError, match="port st-x already belongs to st-other"):
            netdev.ensure(ipr, "st-br0", "st-bi", "st-x")
        with pytest.raises(netdev.BridgeError, match="st-y exists and is a veth device"):
            netdev.ensure(ipr, "st-y", "st-bi", "st-ba")
        with pytest.raises(netdev.BridgeError, match="no array-side device st-nope"):
            netdev.ensure(ipr, "st-br0", "st-bi", "st-nope")
        with pytest.raises(netdev.BridgeError, match="both st-bi"):
            netdev.ensure(ipr, "st-br0", "st-bi", "st-bi")


def test_an_admins_bridge_with_stp_on_is_adopted_with_stp_off(three_namespaces):
    from pyroute2 import IPRoute

    ini, mid, tgt = three_namespaces
    with entered(f"/run/netns/{mid}"):
        ipr = IPRoute()
    with ipr:
        ipr.link("add", ifname="st-br0", kind="bridge", br_stp_state=1, br_forward_delay=1500)
        got = netdev.ensure(ipr, "st-br0", "st-bi", "st-ba")
        assert not got.created and (got.stp_state, got.forward_delay_cs) == (0, 0)
        assert _tcp_through(ini, tgt) == "ping"


DOWNLOAD = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 3260)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.sendall(b"r" * int(sys.argv[2])); c.close()
"""
FETCH = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 3260), timeout=30); n = 0
while d := c.recv(1 << 16):
    n += len(d)
print(n)
"""


def _download(ini: str, tgt: str, nbytes: int) -> int:
    srv = subprocess.Popen(
        ["ip", "netns", "exec", tgt, sys.executable, "-c", DOWNLOAD, TGT_IP, str(nbytes)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        out = subprocess.run(["ip", "netns", "exec", ini, sys.executable, "-c", FETCH, TGT_IP],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return int(out.stdout)
    finally:
        srv.kill()  # our own child, by PID
        srv.wait()


UPLOAD = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 3260)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while d := c.recv(1 << 16):
    n += len(d)
c.close()
"""
PUSH = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 3260), timeout=30)
c.sendall(b"w" * int(sys.argv[2])); c.shutdown(socket.SHUT_WR); c.recv(1); print("done")
"""


def _upload(ini: str, tgt: str, nbytes: int) -> None:
    """The initiator writes: the target's packets back are pure ACKs."""
    srv = subprocess.Popen(["ip", "netns", "exec", tgt, sys.executable, "-c", UPLOAD, TGT_IP],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        push = [sys.executable, "-c", PUSH, TGT_IP, str(nbytes)]
        subprocess.run(["ip", "netns", "exec", ini, *push], capture_output=True, text=True,
                       timeout=60, check=True)  # fmt: skip
    finally:
        srv.kill()  # our own child, by PID
        srv.wait()


def _nft(mid: str) -> str:
    return subprocess.run(["ip", "netns", "exec", mid, "nft", "list", "table", "bridge",
                           "santhrottle"], capture_output=True, text=True).stdout  # fmt: skip


@pytest.fixture
def bridge_gate(three_namespaces):
    """The bridge, and the data path on its initiator-side port (pfifo leaves: classified,
    not delayed); cleaned up by the test, and by the namespaces' removal whatever happens."""
    from pyroute2 import IPRoute

    from santhrottle.appliance import datapath as dp

    ini, mid, tgt = three_namespaces
    if not shutil.which("nft"):
        pytest.skip("no nft (nftables) on this host")
    with entered(f"/run/netns/{mid}"):
        ipr = IPRoute()
    with ipr:
        netdev.ensure(ipr, "st-br0", "st-bi", "st-ba")
    spec = dp.with_gate(dp.DatapathSpec(("st-bi",), leaf="pfifo", ladder_ratio=1.0,
                                        max_delay_us=10_000), mid)  # fmt: skip
    assert spec.bridged, "st-bi is a bridge port: the CLI's spec takes nftables' gate"
    with dp.Datapath(spec, netns=mid) as d:
        yield ini, mid, tgt, d


def test_the_nft_gate_classifies_bridged_traffic_by_mode_and_counts_it(bridge_gate):
    """all: the target's data to a member goes through its class on the initiator-side
    port; read: the data, not the pure ACKs; ack: the pure ACKs, not the data. The
    member's counters survive a class change; idle, no hook of ours is left."""
    from santhrottle.appliance import datapath as dp

    ini, mid, tgt, d = bridge_gate
    d.apply()
    assert "chain postrouting" not in _nft(mid), "idle: no hook chain"

    def through(k: int, move) -> int:
        before = d.device().class_counters()
        move()
        return d.device().class_counters().get(k, (0, 0))[1] - before.get(k, (0, 0))[1]

    d.set_classes({INI_IP: 3}, "all")
    assert 'oifname "st-bi" meta l4proto tcp jump delay' in _nft(mid)
    assert through(3, lambda: _download(ini, tgt, 4 << 20)) >= 4 << 20
    print(_nft(mid))  # what docs/bridge.md shows
    counted = d.current()[INI_IP]
    assert (counted.mode, counted.klass) == ("all", 3) and counted.bytes >= 4 << 20
    d.set_classes({INI_IP: 5}, "all", ordered=False)
    assert d.current()[INI_IP].bytes >= counted.bytes, "the counters survive a class change"

    d.set_classes({INI_IP: 4}, "read", ordered=False)
    assert d.current()[INI_IP].mode == "read"
    assert through(4, lambda: _download(ini, tgt, 2 << 20)) >= 2 << 20
    acks = through(4, lambda: _upload(ini, tgt, 2 << 20))
    assert acks < 2000, f"read mode left pure ACKs alone ({acks} B through the class)"

    d.set_classes({INI_IP: 6}, "ack", ordered=False)
    assert through(6, lambda: _upload(ini, tgt, 4 << 20)) > 0, "the pure ACKs go through"
    data = through(6, lambda: _download(ini, tgt, 2 << 20))
    assert data < 10_000, f"ack mode left the data alone ({data} B through the class)"

    d.set_classes({INI_IP: 0}, ordered=False)
    assert d.current() == {} and "chain postrouting" not in _nft(mid)
    assert dp.discover(netns=mid).spec.bridged
    rep = d.cleanup()
    assert rep.bridge_table and "table bridge santhrottle" in rep.summary()
    assert _nft(mid) == ""


def test_the_presence_read_sees_any_change_to_nftables_and_the_table_going(bridge_gate):
    """The drift check's presence read on a bridge (datapath/drift.py): quiet after the
    gate's own transactions; any other transaction in nftables sends it to the full
    comparison, which says whether the table is still as left and, when it is, keeps
    the presence read quiet; a removed table is named without a listing."""
    from santhrottle.appliance.datapath import drift

    _ini, mid, _tgt, d = bridge_gate
    d.apply()
    d.set_classes({INI_IP: 3}, "all")
    w = drift.Watch(mid)
    try:
        left = d.expected()
        assert left.rules_gen is not None
        assert drift.find_missing(d.spec, left, w) == []
        nft = ("ip", "netns", "exec", mid, "nft")
        subprocess.run([*nft, "add", "table", "inet", "someone-elses"], check=True)
        assert drift.find_missing(d.spec, left, w) == [drift.NFT_CHANGED]
        assert drift.find_drift(d.spec, left, w) == []  # ours is as left
        assert drift.find_missing(d.spec, left, w) == []
        subprocess.run([*nft, "delete", "element", "bridge", "santhrottle", "santhrottle-all",
                        f"{{ {INI_IP} }}"], check=True)  # fmt: skip
        assert drift.find_missing(d.spec, left, w) == [drift.NFT_CHANGED]
        assert drift.find_drift(d.spec, left, w) == [
            "nft: table bridge santhrottle: 1 member(s) not as left"
        ]
        subprocess.run([*nft, "delete", "table", "bridge", "santhrottle"], check=True)
        assert drift.find_missing(d.spec, left, w) == [drift.NFT_TABLE_MISSING]
        d.apply()  # the repair
        d.set_classes({INI_IP: 3}, "all")
        again = d.expected()
        assert again.rules_gen is not None and again.rules_gen != left.rules_gen
        assert drift.find_missing(d.spec, again, w) == []
        assert drift.find_drift(d.spec, again, w) == []
    finally:
        w.close()
