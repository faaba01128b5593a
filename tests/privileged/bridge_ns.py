"""Three network namespaces this test owns: an initiator, a bridge host between two veths,
a target; removed when the test ends, whatever happened."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

INI_IP, TGT_IP = "192.0.2.2", "192.0.2.1"


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture
def three_namespaces():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    tag = f"{os.getpid()}"
    ini, mid, tgt = f"stb-{tag}-i", f"stb-{tag}-m", f"stb-{tag}-t"
    made = []
    try:
        for ns in (ini, mid, tgt):
            _run("ip", "netns", "add", ns)
            made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            for k in ("all", "default"):
                _run(
                    "ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{k}.disable_ipv6=1"
                )
        # initiator -- (st-bi) bridge (st-ba) -- target
        _run("ip", "-n", mid, "link", "add", "st-bi", "type", "veth", "peer", "name", "st-i",
             "netns", ini)  # fmt: skip
        _run("ip", "-n", mid, "link", "add", "st-ba", "type", "veth", "peer", "name", "st-t",
             "netns", tgt)  # fmt: skip
        _run("ip", "-n", mid, "link", "add", "st-x", "type", "veth", "peer", "name", "st-y")
        for ns, dev, ip in ((ini, "st-i", INI_IP), (tgt, "st-t", TGT_IP)):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
        yield ini, mid, tgt
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
