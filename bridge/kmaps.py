"""The wire program's maps read from userspace (bridge/kernel.py's KernelWire), through libbpf.

What it owns
    libbpf(): libbpf.so.1 (iproute2's own dependency) through ctypes, with the
    signatures of the functions the sensor calls;
    MapReader(lib, conn_size, make_conn): entries(fd, key_size, value_size, locked),
    every (key, value) of a hash map (locked: each value copied under its
    bpf_spin_lock, BPF_F_LOCK), BATCH a system call (BPF_MAP_LOOKUP_BATCH, Linux 5.6;
    Debian 12's 6.1 has it for hash and LRU hash maps), else -- a kernel or map that
    refuses it with EINVAL or ENOTSUPP at the first call -- a key and a lookup at a
    time; keys(fd, size) the latter's walk; conn(key), the connection a key starts
    with, made once and kept (at most MAX_CONNS_KEPT, then forgotten all at once).

Why
    The maps hold up to 65,536 flows and 2^20 commands in flight. Read a key at a time,
    with a connection made anew for each, a full flow map took seconds of the daemon's
    tick at each convergence (tests/privileged/test_bridge_hostile.py, 50,000 live
    connections).

Errors
    Any other refusal of a batch is an OSError naming it (the sensor counts it).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

BATCH = 4096  # map entries one BPF_MAP_LOOKUP_BATCH reads
BPF_F_LOCK = 4  # linux/bpf.h: a value copied under its bpf_spin_lock


class BatchOpts(ctypes.Structure):
    """libbpf's struct bpf_map_batch_opts."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def libbpf() -> Any:
    """libbpf.so.1 with the signatures of the functions the sensor calls (OSError: no
    libbpf)."""
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    sigs = {
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__load": (ci, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_program__fd": (ci, [vp]),
        "bpf_object__find_map_fd_by_name": (ci, [vp, cp]),
        "bpf_map_lookup_elem": (ci, [ci, vp, vp]),
        "bpf_map_lookup_elem_flags": (ci, [ci, vp, vp, ctypes.c_uint64]),
        "bpf_map_get_next_key": (ci, [ci, vp, vp]),
        "bpf_map_lookup_batch": (ci, [ci, vp, vp, vp, vp, vp, vp]),
        "bpf_map_delete_elem": (ci, [ci, vp]),
        "bpf_map_update_elem": (ci, [ci, vp, vp, ctypes.c_uint64]),
        "libbpf_num_possible_cpus": (ci, []),
        "libbpf_get_error": (ctypes.c_long, [vp]),
        "ring_buffer__new": (vp, [ci, SAMPLE_FN, vp, vp]),
        "ring_buffer__consume": (ci, [vp]),
        "ring_buffer__free": (None, [vp]),
        "libbpf_set_print": (vp, [PRINT_FN]),
        "bpf_obj_get_info_by_fd": (ci, [ci, vp, vp]),
        "bpf_enable_stats": (ci, [ci]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


MAX_CONNS_KEPT = 1 << 17  # both directions of a full flow map, and room
_REFUSED = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, 524)  # 524: the kernel's ENOTSUPP

C = TypeVar("C")


class MapReader(Generic[C]):
    def __init__(self, lib: Any, conn_size: int, make_conn: Callable[[bytes], C]) -> None:
        self._lib = lib
        self._batch = True  # until the kernel refuses it
        self._conn_size = conn_size
        self._make_conn = make_conn
        self._conns: dict[bytes, C] = {}

    def keys(self, fd: int, size: int) -> Iterator[bytes]:
        key = ctypes.create_string_buffer(size)
        nxt = ctypes.create_string_buffer(size)
        prev: Any = None
        while self._lib.bpf_map_get_next_key(fd, prev, nxt) == 0:
            yield nxt.raw
            ctypes.memmove(key, nxt, size)
            prev = key

    def entries(
        self, fd: int, key_size: int, value_size: int, locked: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        flags = BPF_F_LOCK if locked else 0
        if self._batch:
            yield from self._batched(fd, key_size, value_size, flags)
            if self._batch:
                return
        val = ctypes.create_string_buffer(value_size)
        for raw in list(self.keys(fd, key_size)):
            if self._lib.bpf_map_lookup_elem_flags(fd, raw, val, flags) == 0:  # else gone
                yield raw, val.raw

    def _batched(
        self, fd: int, key_size: int, value_size: int, flags: int
    ) -> Iterator[tuple[bytes, bytes]]:
        opts = BatchOpts(ctypes.sizeof(BatchOpts), flags, 0)
        keys = ctypes.create_string_buffer(key_size * BATCH)
        vals = ctypes.create_string_buffer(value_size * BATCH)
        token_in, token_out = (ctypes.create_string_buffer(max(key_size, 8)) for _ in "io")
        count, first = ctypes.c_uint32(), True
        while True:
            count.value = BATCH
            at = None if first else token_in
            rc = self._lib.bpf_map_lookup_batch(
                fd, at, token_out, keys, vals, ctypes.byref(count), ctypes.byref(opts)
            )
            err = -rc if rc < 0 else (ctypes.get_errno() if rc else 0)
            if rc and err != errno.ENOENT:
                if first and err in _REFUSED:
                    self._batch = False  # not for this kernel or map: a key at a time
                    return
                raise OSError(err, f"bpf_map_lookup_batch: {os.strerror(err)}")
            kraw, vraw = keys.raw, vals.raw
            for i in range(count.value):
                k, v = i * key_size, i * value_size
                yield kraw[k : k + key_size], vraw[v : v + value_size]
            if rc:  # ENOENT: the last of them
                return
            ctypes.memmove(token_in, token_out, len(token_out))
            first = False

    def conn(self, key: bytes) -> C:
        """The connection a map key starts with (its conn_key), made once."""
        head = key[: self._conn_size]
        c = self._conns.get(head)
        if c is None:
            if len(self._conns) >= MAX_CONNS_KEPT:
                self._conns.clear()
            c = self._conns[head] = self._make_conn(head)
        return c
