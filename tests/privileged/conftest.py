"""Privileged tier: real kernel objects in network namespaces this test creates.

Every test gets a fresh pair of namespaces (`netns_pair`): a "target" side
and an "initiator" side joined by a veth pair, addresses in 192.0.2.0/24
(TEST-NET-1) that exist only inside them.  Both namespaces are deleted in a
finally, so a failing test leaves nothing behind; every process the helpers
start is ended by its PID.

Skips (never passes) when not root or when the kernel/tools lack a feature,
with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.privileged.bridge_ns import (  # noqa: F401 (the bridge tests' fixtures)
    dual_stack,
    three_namespaces,
)

TARGET_IP = "192.0.2.1"
MEMBER_IP = "192.0.2.2"
OTHER_IP = "192.0.2.3"
# netns_pair6's IPv6 side (a ULA prefix that exists only inside the namespaces)
TARGET_IP6 = "fd00:5374::1"
MEMBER_IP6 = "fd00:5374::2"
OTHER_IP6 = "fd00:5374::3"
TARGET_DEV = "st-tgt"
INITIATOR_DEV = "st-ini"
TARGET_MAC = "02:00:00:00:00:01"
INITIATOR_MAC = "02:00:00:00:00:02"
_counter = itertools.count()

# A tiny storage-like TCP server: per connection the client sends a 16-byte
# header (bytes it will upload, bytes it wants back), uploads, then the
# server sends the download and closes.  One listening socket per port.
SERVER = r"""
import socket, struct, sys, threading
def serve(c):
    with c:
        hdr = b""
        while len(hdr) < 16:
            d = c.recv(16 - len(hdr))
            if not d:
                return
            hdr += d
        up, down = struct.unpack("!QQ", hdr)
        while up > 0:
            d = c.recv(min(up, 1 << 16))
            if not d:
                return
            up -= len(d)
        chunk = b"r" * 65536
        while down > 0:
            n = min(down, len(chunk))
            c.sendall(chunk[:n])
            down -= n
def listen(addr, port):
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(16)
    return s
def loop(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
socks = [listen(sys.argv[1], int(p)) for p in sys.argv[2:]]
for s in socks[1:]:
    threading.Thread(target=loop, args=(s,), daemon=True).start()
print("ready", flush=True)
loop(socks[0])
"""

CLIENT = r"""
import socket, struct, sys
src, dst = sys.argv[1], sys.argv[2]
port, up, down = (int(x) for x in sys.argv[3:6])
c = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
c.bind((src, 0))
c.connect((dst, port))
c.sendall(struct.pack("!QQ", up, down))
chunk = b"w" * 65536
left = up
while left > 0:
    n = min(left, len(chunk))
    c.sendall(chunk[:n])
    left -= n
got = 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    got += len(d)
c.close()
assert got == down, (got, down)
print(got)
"""


def _run(*cmd, input=None, check=True, timeout=60):
    p = subprocess.run(
        [str(c) for c in cmd],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and p.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {p.stderr}")
    return p


@dataclass
class NetnsPair:
    """Two namespaces joined by a veth pair; the target's side is TARGET_DEV."""

    target: str
    initiator: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    target_ips: tuple[str, ...] = (TARGET_IP,)  # a server listens on each

    def sh(self, ns: str, *cmd, **kw) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", ns, *cmd, **kw)

    def tsh(self, *cmd, **kw) -> str:
        return self.sh(self.target, *cmd, **kw).stdout

    def start_server(self, ports=(3260, 4420, 5201)) -> None:
        for addr in self.target_ips:
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.target, sys.executable, "-c", SERVER, addr]
                + [str(x) for x in ports],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self.procs.append(p)
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise AssertionError(f"test server did not start: {p.stderr.read()}")

    def transfer(self, src: str, port: int, up: int, down: int) -> None:
        """One TCP connection from src (an initiator address) to the target
        address of src's family."""
        dst = next(a for a in self.target_ips if (":" in a) == (":" in src))
        self.sh(
            self.initiator, sys.executable, "-c", CLIENT, src, dst, port, up, down,
            timeout=120,
        )  # fmt: skip

    def snapshot(self) -> dict[str, str]:
        """What an admin would look at, as text: the cleanup test diffs these."""
        return {
            "tc qdisc": self.tsh("tc", "qdisc", "show"),
            "tc class": self.tsh("tc", "class", "show", "dev", TARGET_DEV),
            "ipset list": self.tsh("ipset", "list"),
            "iptables mangle": self.tsh("iptables", "-t", "mangle", "-S"),
            "ip6tables mangle": self.tsh("ip6tables", "-t", "mangle", "-S"),
        }

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                # `ip netns exec` execs python: the PID we started is the server
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            for s in (p.stdout, p.stderr):
                if s:
                    s.close()
        self.procs.clear()


def _missing_feature() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "tc", "ipset", "iptables", "iptables-restore", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} not installed"
    return None


def _probe_kernel(ns: str) -> str | None:
    """The kernel pieces the data path needs, tried in a scratch namespace."""
    probes = [
        (["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"], "sch_htb"),
        (["ipset", "create", "probe", "hash:ip", "counters", "skbinfo"], "ipset hash:ip skbinfo"),
        (
            shlex.split(
                'iptables -t mangle -A OUTPUT -p tcp -m bpf --bytecode "1,6 0 0 0" '
                "-j SET --map-set probe dst --map-prio"
            ),
            "xt_bpf / xt_set SET --map-prio",
        ),
    ]
    for cmd, what in probes:
        p = _run("ip", "netns", "exec", ns, *cmd, check=False)
        if p.returncode:
            return f"kernel lacks {what}: {p.stderr.strip().splitlines()[-1:]}"
    return None


@pytest.fixture(scope="session")
def kernel_ok():
    why = _missing_feature()
    if why:
        pytest.skip(why)
    ns = f"stp-probe-{os.getpid()}"
    p = _run("ip", "netns", "add", ns, check=False)
    if p.returncode:
        pytest.skip(f"cannot create a network namespace: {p.stderr.strip()}")
    try:
        why = _probe_kernel(ns)
    finally:
        _run("ip", "netns", "del", ns, check=False)
    if why:
        pytest.skip(why)


@pytest.fixture
def netns_pair(kernel_ok):
    yield from _pair(ipv6=False)


@pytest.fixture
def netns_pair6(kernel_ok):
    """netns_pair with IPv6 as well: TARGET_IP6, MEMBER_IP6 and OTHER_IP6 beside
    the IPv4 addresses (no duplicate address detection, no link-local
    addresses, no router solicitations, static neighbours).  The kernel may
    still send an MLD report when an address goes up: ICMPv6, which no
    delay class ever takes."""
    yield from _pair(ipv6=True)


def _pair(ipv6: bool):
    n = next(_counter)
    tgt, ini = f"stp-{os.getpid()}-{n}-t", f"stp-{os.getpid()}-{n}-i"
    pair = NetnsPair(tgt, ini)
    try:
        _run("ip", "netns", "add", tgt)
        _run("ip", "netns", "add", ini)
        # No IPv6 and static neighbours: the only packets on the wire are
        # the test's own TCP (so "nothing else lands in a class" is exact).
        for ns in (tgt, ini):
            for k in ("all", "default"):
                if not ipv6:
                    pair.sh(ns, "sysctl", "-qw", f"net.ipv6.conf.{k}.disable_ipv6=1")
                    continue
                for setting in ("accept_ra=0", "router_solicitations=0", "addr_gen_mode=1"):
                    pair.sh(ns, "sysctl", "-qw", f"net.ipv6.conf.{k}.{setting}")
        v6_tgt, v6_ini = [], []
        if ipv6:
            pair.target_ips = (TARGET_IP, TARGET_IP6)
            v6_tgt = [
                f"addr add {TARGET_IP6}/64 dev {TARGET_DEV} nodad",
                f"neigh replace {MEMBER_IP6} lladdr {INITIATOR_MAC} dev {TARGET_DEV} nud permanent",
                f"neigh replace {OTHER_IP6} lladdr {INITIATOR_MAC} dev {TARGET_DEV} nud permanent",
            ]
            v6_ini = [
                f"addr add {MEMBER_IP6}/64 dev {INITIATOR_DEV} nodad",
                f"addr add {OTHER_IP6}/64 dev {INITIATOR_DEV} nodad",
                f"neigh replace {TARGET_IP6} lladdr {TARGET_MAC} dev {INITIATOR_DEV} nud permanent",
            ]
        batch = "\n".join(
            [
                f"link add {TARGET_DEV} address {TARGET_MAC} type veth peer name {INITIATOR_DEV}"
                f" address {INITIATOR_MAC} netns {ini}",
                f"addr add {TARGET_IP}/24 dev {TARGET_DEV}",
                "link set lo up",
                f"link set {TARGET_DEV} up",
                f"neigh replace {MEMBER_IP} lladdr {INITIATOR_MAC} dev {TARGET_DEV} nud permanent",
                f"neigh replace {OTHER_IP} lladdr {INITIATOR_MAC} dev {TARGET_DEV} nud permanent",
                # One skb per TCP segment on the target side: the HTB class and
                # the ipset member then count the very same packets (GSO would
                # make HTB count segments and ipset super-packets).
                f"link set {TARGET_DEV} gso_max_segs 1",
                *v6_tgt,
            ]
        )
        _run("ip", "-n", tgt, "-batch", "-", input=batch + "\n")
        batch = "\n".join(
            [
                f"addr add {MEMBER_IP}/24 dev {INITIATOR_DEV}",
                f"addr add {OTHER_IP}/24 dev {INITIATOR_DEV}",
                "link set lo up",
                f"link set {INITIATOR_DEV} up",
                f"neigh replace {TARGET_IP} lladdr {TARGET_MAC} dev {INITIATOR_DEV} nud permanent",
                *v6_ini,
            ]
        )
        _run("ip", "-n", ini, "-batch", "-", input=batch + "\n")
        yield pair
    finally:
        pair.stop()
        for ns in (tgt, ini):
            if Path(f"/run/netns/{ns}").exists():
                _run("ip", "netns", "del", ns, check=False)
        deadline = time.monotonic() + 5
        while Path(f"/run/netns/{tgt}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
