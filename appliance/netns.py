"""Entering a network namespace for a while, one thread at a time.

pyroute2's pushns()/popns() keep the namespaces to return to on one
process-wide stack, and setns() moves only the calling thread: two threads
inside at once (the tick opening a socket, the convergence worker's
sock_diag dump, a metrics scrape reading the member sets) could pop each
other's saved namespace and leave a thread in the wrong one.  entered()
serialises them: a socket opened in the block belongs to the namespace for
its whole life, so the block is short (open, or open and dump).

Worked example
    with entered("/run/netns/tgt"):
        sock = socket.socket(AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG)
    # this thread is back in its namespace; sock stays in tgt's
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()


@contextlib.contextmanager
def entered(netns: str | int | None) -> Iterator[None]:
    """Run the block inside netns (a name under /run/netns, a path or an open
    fd); None: where the thread is."""
    if netns is None:
        yield
        return
    from pyroute2 import netns as pnetns

    with _LOCK:
        pnetns.pushns(netns)
        try:
            yield
        finally:
            pnetns.popns()
