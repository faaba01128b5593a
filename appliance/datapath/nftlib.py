"""nftables' transactions run in the daemon's own process: libnftables through ctypes.

Problem
    Bridge mode's gate (datapath/nftgate.py) changes a map element at every class
    change, a glide's handoff and the first and last member, and reads the ruleset
    back. Run as `nsenter --net=NS nft -f -`, each is two processes: 4.6 ms of CPU
    and 21 ms of wall on a fast host (2026-11-28), some tens of times that under the
    lab's emulation, several a second while classes move -- on a host that also
    forwards the storage traffic, and in the lab on the one emulated CPU the
    target's own path needs (docs/bridge.md, "The wire's latency and the array's").
    The `nft` program is a thin front end of libnftables (Debian's libnftables1,
    a dependency of the nftables package): the same parser, the same netlink
    transaction, the same output.

What it owns
    Library(netns): one libnftables context; run(text, json_out=False) runs the
    commands of `text` as one `nft -f` would (one transaction, all or nothing)
    inside the namespace and returns what nft would print, or raises
    DatapathError with nft's last error line. load(netns) -> Library | None:
    the namespace's context, made at its first use and kept (keyed by the
    namespace's inode, not its name; at most MAX_CONTEXTS), or None where
    libnftables.so.1 cannot be loaded (the caller runs the `nft` program).

Run time
    About 0.08 ms of CPU for a map element's replace (a fast host), against 4.6 ms
    for the two processes; making a context costs 0.6 ms, hence one kept per
    namespace (the drift check and the counters' reader make their NftSets anew
    each time). The context is made inside the namespace (libnftables
    1.0.6 opens its netlink socket there, and keeps it), and each run is inside it
    too (a version that opens a socket per command): appliance/netns.py's
    entered(), short, one thread at a time.

Why not python3-nftables
    Debian packages the nftables project's own binding of the same library
    (python3-nftables), but it is not on PyPI and a virtual environment does not
    see it: the wheel, its venv and the tests would all run the program instead.
    The few libnftables calls made here are the ones that binding makes.

Worked example
    lib = load("/run/netns/br"); lib.run("add element bridge santhrottle "
    "santhrottle-all { 10.0.0.3 : 5374:20 }") -> ""; lib.run("list ruleset bridge",
    json_out=True) -> '{"nftables": [...]}'.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.netns import entered

SONAME = "libnftables.so.1"
OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON (nftables/libnftables.h)

MAX_CONTEXTS = 8  # namespaces whose context is kept

_lib: Any = None
_lib_lock = threading.Lock()
_contexts: dict[tuple[int, int], Library] = {}


def _library() -> Any:
    """libnftables with its prototypes, loaded once (OSError where it cannot be)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL(SONAME, use_errno=True)
            vp, cp = ctypes.c_void_p, ctypes.c_char_p
            lib.nft_ctx_new.restype = vp
            lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
            lib.nft_ctx_free.argtypes = [vp]
            lib.nft_ctx_buffer_output.argtypes = [vp]
            lib.nft_ctx_buffer_error.argtypes = [vp]
            lib.nft_ctx_get_output_buffer.restype = cp
            lib.nft_ctx_get_output_buffer.argtypes = [vp]
            lib.nft_ctx_get_error_buffer.restype = cp
            lib.nft_ctx_get_error_buffer.argtypes = [vp]
            lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
            lib.nft_ctx_output_get_flags.argtypes = [vp]
            lib.nft_ctx_output_set_flags.argtypes = [vp, ctypes.c_uint]
            lib.nft_run_cmd_from_buffer.argtypes = [vp, cp]
            _lib = lib
        return _lib


def _last_line(text: str) -> str:
    """nft's own error line ("Error: ..."; after it come the command and a line of
    carets under the culprit), else the last line."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("Error:")]
    return errors[-1] if errors else lines[-1] if lines else "(no output)"


class Library:
    """One libnftables context for the namespace `netns` (a path, or None: ours)."""

    def __init__(self, lib: Any, netns: str | None) -> None:
        self._lib = lib
        self.netns = netns
        with entered(netns):  # its netlink socket belongs to the namespace it opens in
            self._ctx = lib.nft_ctx_new(0)
        if not self._ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)
        self._flags = lib.nft_ctx_output_get_flags(self._ctx)
        self._lock = threading.Lock()  # a context runs one command at a time

    def run(self, text: str, json_out: bool = False, what: str = "nft -f") -> str:
        lib, ctx = self._lib, self._ctx
        with self._lock:
            lib.nft_ctx_output_set_flags(ctx, self._flags | (OUTPUT_JSON if json_out else 0))
            with entered(self.netns):  # where a version opens its socket for each run
                rc = lib.nft_run_cmd_from_buffer(ctx, text.encode())
            out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
            err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        if rc != 0:
            raise DatapathError(f"{what} failed: {_last_line(err or out)}")
        return out

    def __del__(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx:
            self._lib.nft_ctx_free(ctx)


def _identity(netns: str | None) -> tuple[int, int]:
    """The namespace itself (its nsfs inode), not its name: one made again under the same
    name is another. A kept context's socket keeps its namespace, and so its inode, alive."""
    st = os.stat(netns if netns is not None else "/proc/self/ns/net")
    return st.st_dev, st.st_ino


def load(netns: str | None) -> Library | None:
    """The context for netns (made once per namespace and kept, at most MAX_CONTEXTS:
    making one costs 0.6 ms of CPU, eight times a transaction), or None where
    libnftables cannot be loaded."""
    try:
        key = _identity(netns)
        with _lib_lock:
            got = _contexts.pop(key, None)
        if got is None:
            got = Library(_library(), netns)
        with _lib_lock:
            _contexts[key] = got  # the most recently used last
            while len(_contexts) > MAX_CONTEXTS:
                del _contexts[next(iter(_contexts))]
        return got
    except (OSError, AttributeError):  # no library, or one without these symbols
        return None
