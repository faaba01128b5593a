"""bridge/netdev.py on the host kernel: a bridge made between two veths in a namespace this
test owns forwards TCP between an initiator's and a target's namespaces at once, with STP off;
made again it is adopted unchanged; what is someone else's is refused. And the data path on
its initiator-side port classifies the bridged packets (the physdev jump)."""

from __future__ import annotations

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


@pytest.mark.parametrize("bridged", [True, False])
def test_bridged_traffic_is_classified_on_the_initiator_side_port(three_namespaces, bridged):
    """With bridged, the target's packets to a member, forwarded by the bridge, go
    to its class on the initiator-side port's HTB; with the target host's jump (-o)
    they do not: br_netfilter shows them to POSTROUTING leaving the bridge."""
    from pyroute2 import IPRoute

    from santhrottle.appliance import datapath as dp

    ini, mid, tgt = three_namespaces
    nf = ["ip", "netns", "exec", mid, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"]
    if subprocess.run(nf, capture_output=True).returncode:
        pytest.skip("no br_netfilter (net.bridge.bridge-nf-call-iptables) in a namespace")
    with entered(f"/run/netns/{mid}"):
        ipr = IPRoute()
    with ipr:
        netdev.ensure(ipr, "st-br0", "st-bi", "st-ba")
    spec = dp.DatapathSpec(("st-bi",), leaf="pfifo", ladder_ratio=1.0, max_delay_us=10_000,
                           bridged=bridged)  # fmt: skip
    with dp.Datapath(spec, netns=mid) as d:
        d.apply()
        d.set_classes({INI_IP: 3})
        rules = subprocess.run(["ip", "netns", "exec", mid, "iptables", "-t", "mangle", "-S",
                                "POSTROUTING"], capture_output=True, text=True).stdout  # fmt: skip
        assert [r for r in rules.splitlines() if r.endswith("-j SANTHROTTLE")] == [
            dp.rules.jump_rule("st-bi", bridged)
        ]
        before = d.device().class_counters()
        assert _download(ini, tgt, 4 << 20) == 4 << 20
        after = d.device().class_counters()
        if bridged:
            assert dp.discover(netns=mid).spec.bridged
        d.cleanup()
    got = after[3][1] - before.get(3, (0, 0))[1]
    if bridged:
        assert got >= 4 << 20, "the download went through class 3"
    else:
        assert got == 0, "an -o jump does not see bridged packets"
