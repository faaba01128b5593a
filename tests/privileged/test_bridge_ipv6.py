"""Bridge mode with IPv6 initiators on the host kernel: three namespaces this test owns (an
initiator and a target, each with an IPv4 and an IPv6 address, and the bridge host between
them), real TCP over the bridge it makes, the data path (nftables' bridge family) on the
initiator-side port.

  * An IPv6 initiator in a class: the target's data to it from a storage port goes
    through the class (the HTB class's packets and bytes grow) and is counted on
    santhrottle-counted6; its IPv4 address, not a member, stays out of every class.
    Read mode on IPv6 gives the data a class and leaves the pure ACKs alone; ack mode
    the other way round (the payload test of the rules on an IPv6 packet).
  * A mixed batch: an IPv4 and an IPv6 member move between classes in one set_classes
    call, each ends in its class (its traffic goes through that class and no other),
    and their counters go on.

The host kernel has no sch_netem: the classes get pfifo leaves (classified, not delayed).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.privileged.bridge_ns import INI6, INI_IP, TGT6, TGT_IP

pytestmark = pytest.mark.privileged

INI4, TGT4 = INI_IP, TGT_IP
MIB = 1 << 20

# The target: one connection on port 3260 of its address, then `down` bytes to the
# initiator (data) or everything the initiator uploads read (the target sends pure ACKs).
SERVE = r"""
import socket, sys
addr, how, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, 3260)); s.listen(1); print("ready", flush=True)
c, _ = s.accept()
if how == "down":
    c.sendall(b"r" * n)
else:
    while c.recv(1 << 16):
        pass
c.close()
"""
CLIENT = r"""
import socket, sys
src, dst, how, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
c.settimeout(30); c.bind((src, 0)); c.connect((dst, 3260))
if how == "down":
    got = 0
    while d := c.recv(1 << 16):
        got += len(d)
    assert got == n, (got, n)
else:
    c.sendall(b"w" * n); c.shutdown(socket.SHUT_WR); c.recv(1)
print("done")
"""


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60)


def _tcp(ini: str, tgt: str, src: str, dst: str, how: str, nbytes: int) -> None:
    """One TCP connection from src to dst:3260 through the bridge: the target sends
    nbytes (how="down") or the initiator does ("up")."""
    srv = subprocess.Popen(
        ["ip", "netns", "exec", tgt, sys.executable, "-c", SERVE, dst, how, str(nbytes)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready", (
            srv.stderr.read() if srv.stderr else ""
        )
        out = _sh("ip", "netns", "exec", ini, sys.executable, "-c", CLIENT, src, dst, how,
                  str(nbytes), check=False)  # fmt: skip
        assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    finally:
        srv.kill()  # our own child, by PID
        srv.wait()
        for f in (srv.stdout, srv.stderr):
            if f:
                f.close()


def _nft(mid: str) -> str:
    return _sh("ip", "netns", "exec", mid, "nft", "list", "table", "bridge", "santhrottle",
               check=False).stdout  # fmt: skip


@pytest.fixture
def gate(dual_stack):
    """The data path on the bridge's initiator-side port (pfifo leaves), applied."""
    from santhrottle.appliance import datapath as dp

    ini, mid, tgt = dual_stack
    spec = dp.with_gate(dp.DatapathSpec(("st-bi",), leaf="pfifo", ladder_ratio=1.0,
                                        max_delay_us=10_000), mid)  # fmt: skip
    assert spec.bridged, "st-bi is a bridge port: nftables' gate"
    with dp.Datapath(spec, netns=mid) as d:
        d.apply()
        yield ini, mid, tgt, d
        d.cleanup()


Counters = dict[int, tuple[int, int]]


def _through(d, move: Callable[[], None]) -> Counters:
    """Per class: the (packets, bytes) the port's HTB sent while `move` ran."""
    before = d.device().class_counters()
    move()
    after = d.device().class_counters()
    return {
        k: (p - before.get(k, (0, 0))[0], b - before.get(k, (0, 0))[1])
        for k, (p, b) in after.items()
        if k and (p, b) != before.get(k, (0, 0))
    }


def test_an_ipv6_initiator_in_a_class_is_classified_and_counted(gate):
    ini, mid, tgt, d = gate
    assert "santhrottle-all6" in _nft(mid) and "santhrottle-counted6" in _nft(mid)
    assert "chain postrouting" not in _nft(mid), "idle: no hook chain"

    assert d.set_classes({INI6: 3}, "all", ordered=False) == 1
    listed = _nft(mid)
    assert f"{INI6} : 5374:3" in listed and 'oifname "st-bi" meta l4proto tcp jump delay' in (
        listed
    )
    sent = _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "down", 4 * MIB))
    assert set(sent) == {3}, f"only class 3 sends: {sent}"
    packets, nbytes = sent[3]
    assert packets > 0 and nbytes >= 4 * MIB, sent
    print(_nft(mid))  # what docs/bridge.md shows
    m = d.current()[INI6]
    assert (m.mode, m.klass) == ("all", 3)
    assert m.packets > 0 and m.bytes >= 4 * MIB, "santhrottle-counted6 counts the class's packets"
    # the initiator's IPv4 address is no member: its traffic takes no class, nor is counted
    assert _through(d, lambda: _tcp(ini, tgt, INI4, TGT4, "down", 2 * MIB)) == {}
    assert d.current()[INI6].bytes == m.bytes and set(d.current()) == {INI6}

    # read mode (a whole map replaced: the IPv6 member leaves santhrottle-all6): the
    # data goes through the class, the pure ACKs of an upload do not
    d.replace_members("read", {INI6: 4})
    assert d.current()[INI6].mode == "read" and f"{INI6} : 5374:4" in _nft(mid)
    data = _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "down", 2 * MIB))
    assert data.get(4, (0, 0))[1] >= 2 * MIB, data
    acks = _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "up", 2 * MIB)).get(4, (0, 0))[1]
    assert acks < 2000, f"read mode left pure ACKs alone ({acks} B through the class)"
    # ack mode: the pure ACKs go through, the data does not
    d.replace_members("ack", {INI6: 6})
    assert d.current()[INI6].mode == "ack"
    assert _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "up", 4 * MIB)).get(6, (0, 0))[0] > 0
    data6 = _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "down", 2 * MIB)).get(6, (0, 0))[1]
    assert data6 < 10_000, f"ack mode left the data alone ({data6} B through the class)"

    d.replace_members("ack", {})
    assert d.current() == {} and "chain postrouting" not in _nft(mid), "idle again"
    assert f"{INI6}" not in _nft(mid)


def test_a_mixed_batch_moves_an_ipv4_and_an_ipv6_member_each_into_its_class(gate):
    ini, mid, tgt, d = gate
    assert d.set_classes({INI4: 3, INI6: 3}, "all", ordered=False) == 2
    first = _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "down", 2 * MIB))
    assert set(first) == {3} and first[3][1] >= 2 * MIB, first
    was = d.current()

    # one call, one transaction: the IPv4 member to class 5, the IPv6 one to class 7
    assert d.set_classes({INI4: 5, INI6: 7}, "all", ordered=False) == 2
    now = d.current()
    assert {ip: (m.mode, m.klass) for ip, m in now.items()} == {
        INI4: ("all", 5), INI6: ("all", 7)}  # fmt: skip
    listed = _nft(mid)
    assert f"{INI4} : 5374:5" in listed and f"{INI6} : 5374:7" in listed
    assert now[INI6].bytes >= was[INI6].bytes >= 2 * MIB, "the counters survive a class change"

    v4 = _through(d, lambda: _tcp(ini, tgt, INI4, TGT4, "down", 2 * MIB))
    assert set(v4) == {5} and v4[5][1] >= 2 * MIB, f"the IPv4 member's data in class 5: {v4}"
    v6 = _through(d, lambda: _tcp(ini, tgt, INI6, TGT6, "down", 2 * MIB))
    assert set(v6) == {7} and v6[7][1] >= 2 * MIB, f"the IPv6 member's data in class 7: {v6}"
    end = d.current()
    assert end[INI4].bytes >= 2 * MIB and end[INI4].packets > was[INI4].packets
    assert end[INI6].bytes >= now[INI6].bytes + 2 * MIB
