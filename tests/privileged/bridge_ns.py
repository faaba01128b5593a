"""Three network namespaces this test owns: an initiator, a bridge host between two veths,
a target; removed when the test ends, whatever happened.  three_namespaces: IPv4 only,
no bridge yet; dual_stack: IPv4 and IPv6, the bridge made.  veth_pair(): one namespace
with a veth pair for replays into the wire sensor (frames sent on one end, the sensor on
the other)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from santhrottle.appliance.netns import entered
from santhrottle.bridge import netdev

INI_IP, TGT_IP = "192.0.2.2", "192.0.2.1"
INI6, TGT6 = "fd00:5374::2", "fd00:5374::1"  # dual_stack's IPv6 (ULA, inside the namespaces)


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture
def three_namespaces():
    """initiator -- (st-bi) (st-ba) -- target on IPv4 alone, the ports not yet bridged,
    and a spare veth pair st-x/st-y in the middle."""
    yield from _namespaces("stb", ipv6=False)


@pytest.fixture
def dual_stack() -> Iterator[tuple[str, str, str]]:
    """initiator -- (st-bi) bridge st-br0 (st-ba) -- target, IPv4 and IPv6 (nodad: usable
    at once) on both ends; the bridge host has no IPv6 of its own."""
    if not shutil.which("nft"):
        pytest.skip("no nft (nftables): bridge mode's gate")
    yield from _namespaces("st6", ipv6=True)


def _namespaces(prefix: str, ipv6: bool) -> Iterator[tuple[str, str, str]]:
    """The three namespaces (initiator, middle, target), removed whatever happens."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    tag = os.getpid()
    ini, mid, tgt = f"{prefix}-{tag}-i", f"{prefix}-{tag}-m", f"{prefix}-{tag}-t"
    made = []
    try:
        for ns in (ini, mid, tgt):
            _run("ip", "netns", "add", ns)
            made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            for k in ("all", "default"):  # IPv6 at the ends only, without DAD
                off = ns == mid or not ipv6
                setting = "disable_ipv6=1" if off else "accept_dad=0"
                _run("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{k}.{setting}")
        _run("ip", "-n", mid, "link", "add", "st-bi", "type", "veth", "peer", "name", "st-i",
             "netns", ini)  # fmt: skip
        _run("ip", "-n", mid, "link", "add", "st-ba", "type", "veth", "peer", "name", "st-t",
             "netns", tgt)  # fmt: skip
        if not ipv6:
            _run("ip", "-n", mid, "link", "add", "st-x", "type", "veth", "peer", "name", "st-y")
        for ns, dev, ip4, ip6 in ((ini, "st-i", INI_IP, INI6), (tgt, "st-t", TGT_IP, TGT6)):
            _run("ip", "-n", ns, "addr", "add", f"{ip4}/24", "dev", dev)
            if ipv6:
                _run("ip", "-n", ns, "-6", "addr", "add", f"{ip6}/64", "dev", dev, "nodad")
            _run("ip", "-n", ns, "link", "set", dev, "up")
        if ipv6:
            from pyroute2 import IPRoute

            with entered(f"/run/netns/{mid}"):
                ipr = IPRoute()
            with ipr:
                netdev.ensure(ipr, "st-br0", "st-bi", "st-ba")
        yield ini, mid, tgt
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextmanager
def veth_pair(prefix: str, mtu: int | None = None) -> Iterator[str]:
    """A namespace (its name) with the veth pair PREFIX0-PREFIX1 up, no IPv6 chatter on
    it, MTU mtu (a capture's GRO'd frames need 65,535); deleted at the end."""
    ns = f"{prefix}-{os.getpid()}"
    _run("ip", "netns", "add", ns)
    try:
        ip = ("ip", "-n", ns)
        _run(*ip, "link", "add", f"{prefix}0", "type", "veth", "peer", "name", f"{prefix}1")
        for k in ("all", "default"):
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{k}.disable_ipv6=1")
        for dev in (f"{prefix}0", f"{prefix}1"):
            _run(*ip, "link", "set", dev, *(("mtu", str(mtu)) if mtu else ()), "up")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
