"""A bench's scratch network namespace, and the record of a bench that could not run.

veth_netns(prefix) makes the namespace PREFIX-PID with the veth pair PREFIX0-PREFIX1
(PREFIX0 up), yields its name and deletes it at the end, whatever happened; a host
that cannot make one raises NoNetns (its message is ip's).  skipped() is the record
tests/bench/run.py prints for a bench that did not run, and why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class NoNetns(Exception):
    """ip could not make the namespace (not root, no netns support)."""


@contextmanager
def veth_netns(prefix: str) -> Iterator[str]:
    ns = f"{prefix}-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, check=False)
    if r.returncode:
        raise NoNetns(f"cannot create a network namespace: {r.stderr.strip()}")
    try:
        dev, peer = f"{prefix}0", f"{prefix}1"
        subprocess.run(
            ["ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", peer], check=True
        )
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def skipped(name: str, why: str, goal_ms: float | None) -> dict[str, Any]:
    return {
        "name": name,
        "skipped": why,
        "summary": f"skipped ({why})",
        "met": False,
        "goal_ms": goal_ms,
    }
