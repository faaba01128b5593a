"""The wire sensor in the kernel: load bridge/bpf/wire.bpf.o, attach it to a port, read its sums.

Problem
    A Python capture walks a frame at several times the CPU of a tc program
    (docs/bridge.md, "Cost"), and a 10 Gbit/s storage link carries hundreds
    of thousands of frames a second. The walk of each stream, the match of
    commands to completions and the sums per volume run in a tc program
    instead (bridge/bpf/wire.bpf.c, its header has the law); userspace reads
    a few hundred bytes per volume once a tick and the names of the targets
    from the logins and connects the program passes up.

What it owns
    KernelWire: the loaded object (libbpf through ctypes: kmaps.libbpf()),
    its tc filters on one device (a clsact qdisc, ingress and egress: the
    commands leave by the array-side port, the completions arrive by it),
    and reads of its maps:
    counters() (the global counts), volume_sums() (per connection and
    volume: reads, their latency in ns, write bytes, all since the
    load, and its busy time's state: kbusy.py), retire() (the commands
    aged out or lost, for the program's count in flight), events()
    (login and connect text, per connection, with the PDU's flags and
    its text's length), inflight() (the commands in flight, for ageing).
    close() detaches and unloads.

Bounds
    The maps are fixed in size (wire.bpf.c): 65,536 connection
    directions and volumes per connection, 2^20 commands in flight (LRU:
    the oldest go first), 256 KiB of events. A failure to load or attach
    raises KernelWireError with one line (the verifier's last line).

Worked example
    with KernelWire("eth2") as w: ... (in the bridge's namespace); w.volume_sums() ->
    {(Conn("10.0.0.2", "10.0.0.11", 51000, 3260), 0): VolumeSums(reads=120,
    read_ns=2_400_000_000, write_bytes=0)}: 120 reads of LUN 0 on that
    connection, 20 ms each on average, since the program was loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .kmaps import PRINT_FN, SAMPLE_FN, MapReader, libbpf

OBJECT = Path(__file__).with_name("bpf") / "wire.bpf.o"
PROGRAM = "wire_sensor"
FILTER_NAME = "santhrottle-wire"
FILTER_PRIO = 0xC0DE  # the filter's preference on the clsact hooks: ours, by number
INGRESS, EGRESS = "ffff:fff2", "ffff:fff3"
# the program's maps (wire.bpf.c's), by name
MAPS = (
    "counters",
    "stats",
    "inflight",
    "events",
    "flows",
    "settings",
    "esp",
    "retired",
    "retired_gen",
)
# the program's global counters, in the order of wire.bpf.c's enum (C_FRAMES ...)
COUNTER_NAMES = (
    "frames",
    "segments",
    "pdus",
    "commands",
    "completions",
    "unmatched",
    "replaced",
    "retransmitted",
    "gaps",
    "desyncs",
    "resyncs",
    "carried",
    "events_lost",
    "truncated_walks",
    "retracted",
    "unmeasurable",
    "flows_added",  # connection directions the flow map took in
    "flows_removed",  # ... and the program took out (a connection's SYN, FIN or RST)
)
EV_LOGIN, EV_CONNECT, EV_BODY = 1, 2, 3  # EV_BODY: more of the last one's text
NAME_BYTES = 1024
_CONN = struct.Struct("=16s16sHH")  # conn_key: initiator, target, their ports
_VOL_KEY = struct.Struct("=16s16sHH4xQ")  # vol_key (the u64 aligned to 8)
# vol_stats: reads, read ns, write bytes, writes; busy_ns, since, retired, (its gen),
# outstanding, (the lock)
_VOL_STATS = struct.Struct("=QQQQQQQ8xI4x")
_RETIRED = struct.Struct("=QQ")  # struct retired_val: count, at (ns)
_TAG_KEY = struct.Struct("=16s16sHHI")
_INFLIGHT = struct.Struct("=QQIBB2x")  # start, volume, held bytes, op, provisional
_EVENT_HEAD = struct.Struct("=16s16sHHIIIII")  # conn, kind, to_target, len, flags, total
_U64 = struct.Struct("=Q")
_U32 = struct.Struct("=I")
_MAPPED = b"\0" * 10 + b"\xff\xff"
# struct bpf_prog_info (linux/bpf.h, append-only): run_time_ns and run_cnt at 192
PROG_INFO_BYTES, PROG_INFO_RUN_TIME = 232, 192
# struct flow (wire.bpf.c): what userspace reads of it -- desyncs, resyncs, retracted at
# 36; lost since (ns), out of sync (ns), out of sync bytes at 48; state at 120, reason 129;
# next_seq, the first u32
FLOW_BYTES = 264
_FLOW_COUNTS = struct.Struct("=IIIQQQ")
FLOW_COUNTS_AT, FLOW_STATE, FLOW_REASON = 36, 120, 129
_FLOW_KEY = struct.Struct("=16s16sHHI")
_ESP_KEY = struct.Struct("=16s16sI")  # struct esp_key: source, destination, SPI
_ESP_STATS = struct.Struct("=QQQQ")  # first and last ns, frames, bytes
_SETTING = struct.Struct("=BBBxI")  # header digest, data digest, digests said, limit
BPF_EXIST = 2
BPF_STATS_RUN_TIME = 0
VERIFIER_LOG_BYTES = 16 << 20  # libbpf's largest log buffer


class KernelWireError(Exception):
    """One line: why the in-kernel sensor cannot run."""


class Conn(NamedTuple):
    initiator: str
    target: str
    initiator_port: int
    target_port: int


@dataclass(frozen=True, slots=True)
class VolumeSums:
    reads: int
    read_ns: int
    write_bytes: int
    writes: int = 0  # write commands completed
    # its busy time (wire.bpf.c's busy_move, kbusy.py): closed spans' ns, the open
    # span's start (CLOCK_MONOTONIC ns), aged-out commands taken off, commands in flight
    busy_ns: int = 0
    since_ns: int = 0
    retired: int = 0
    outstanding: int = 0


class EspState(NamedTuple):
    """An IPsec security association the program saw (esp.py; map esp)."""

    src: str
    dst: str
    spi: int
    seconds: float  # from its first frame to its last
    frames: int
    bytes: int


class FlowState(NamedTuple):
    """One connection direction as the program walks it (flow.py's states: 0 in sync,
    1 provisional, 2 out of sync, 3 not measurable; reason 1 TLS, 2 another protocol)."""

    conn: Conn
    to_target: bool
    state: int
    reason: int
    desyncs: int
    resyncs: int
    retracted: int
    out_of_sync_s: float
    out_of_sync_bytes: int
    next_seq: int = 0  # the sequence number the walk expects next: moves with each segment


@dataclass(frozen=True, slots=True)
class Event:
    conn: Conn
    kind: int  # EV_LOGIN, EV_CONNECT, EV_BODY
    to_target: bool
    data: bytes
    flags: int = 0  # EV_LOGIN: the PDU's flags (C, 0x40: its text goes on in the next)
    total: int | None = None  # EV_LOGIN, EV_CONNECT: the PDU's text bytes (None: unknown)


@functools.lru_cache(maxsize=65536)  # the map's keys name few addresses, many times
def _addr(raw: bytes) -> str:
    if raw[:12] == _MAPPED:
        return str(ipaddress.IPv4Address(raw[12:]))
    return str(ipaddress.IPv6Address(raw))


def conn_of(ini: bytes, tgt: bytes, ini_port: int, tgt_port: int) -> Conn:
    return Conn(_addr(ini), _addr(tgt), ini_port, tgt_port)


class KernelWire:
    """The program loaded and attached to `device` (in `netns`), until close()."""

    def __init__(self, device: str, obj: Path = OBJECT) -> None:
        """Load and attach in the calling thread's network namespace (its netlink socket
        is opened here, and kept for close())."""
        if not obj.exists():
            raise KernelWireError(f"{obj} is missing: build it with `make bpf`")
        self.device = device
        self._ipr: Any = None
        self._retired_gen = 0  # the map retired_gen's value: written here only
        try:
            self._lib = libbpf()
        except OSError as e:
            raise KernelWireError(f"libbpf.so.1 not found (Debian: libbpf1): {e}") from None
        self._maps = MapReader(self._lib, _CONN.size, lambda k: conn_of(*_CONN.unpack(k)))
        self._log: list[str] = []
        self._printer = PRINT_FN(self._keep_log)  # held: libbpf calls it
        self._lib.libbpf_set_print(self._printer)
        self._obj = self._lib.bpf_object__open_file(str(obj).encode(), None)
        if not self._obj or self._lib.libbpf_get_error(self._obj):
            self._obj = None
            raise KernelWireError(f"cannot open {obj}: {self._last_log()}")
        self._events: list[Event] = []
        self._rb: Any = None
        self._attached = False
        try:
            if self._lib.bpf_object__load(self._obj):
                raise KernelWireError(f"the kernel refused {obj.name}: {self._last_log()}")
            prog = self._lib.bpf_object__find_program_by_name(self._obj, PROGRAM.encode())
            self.prog_fd = self._lib.bpf_program__fd(prog)
            self.maps = {
                name: self._lib.bpf_object__find_map_fd_by_name(self._obj, name.encode())
                for name in MAPS
            }
            self.ncpus = self._lib.libbpf_num_possible_cpus()
            self._sample = SAMPLE_FN(self._on_event)
            self._rb = self._lib.ring_buffer__new(self.maps["events"], self._sample, None, None)
            self._attach()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> KernelWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def attached(self) -> bool:
        """The device is still the one the filters went on (not removed, not made anew)."""
        try:
            (link,) = self._ipr.get_links(self._index)
        except Exception:  # gone: netlink says no such device
            return False
        return bool(link.get_attr("IFLA_IFNAME") == self.device)

    def reattach(self) -> None:
        """The filters on the device again (it was made anew): KernelWireError if it
        cannot be."""
        self._attached = False
        self._attach()

    def _attach(self) -> None:
        from pyroute2 import IPRoute

        if self._ipr is None:
            self._ipr = IPRoute()
        ipr = self._ipr
        idx = ipr.link_lookup(ifname=self.device)
        if not idx:
            raise KernelWireError(f"no device {self.device}")
        self._index = idx[0]
        with contextlib.suppress(Exception):  # there already: an admin's, or ours
            ipr.tc("add", "clsact", self._index)
        for parent in (INGRESS, EGRESS):  # ours, left by a run that died: replaced
            with contextlib.suppress(Exception):
                ipr.tc("del-filter", "bpf", self._index, ":1", parent=parent, prio=FILTER_PRIO)
        try:
            for parent in (INGRESS, EGRESS):
                ipr.tc(
                    "add-filter",
                    "bpf",
                    self._index,
                    ":1",
                    fd=self.prog_fd,
                    name=FILTER_NAME,
                    parent=parent,
                    prio=FILTER_PRIO,
                    classid=1,
                    direct_action=True,
                )
        except Exception as e:
            raise KernelWireError(f"cannot attach to {self.device}: {e}") from None
        self._attached = True

    def close(self) -> None:
        if self._attached:
            for parent in (INGRESS, EGRESS):
                with contextlib.suppress(Exception):
                    self._ipr.tc(
                        "del-filter", "bpf", self._index, ":1", parent=parent, prio=FILTER_PRIO
                    )
            self._attached = False
        if self._ipr is not None:
            with contextlib.suppress(Exception):
                self._ipr.close()
            self._ipr = None
        if self._rb:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None

    # ------------------------------------------------------------ reading
    def counters(self) -> dict[str, int]:
        """The global counts since the load, summed over the CPUs."""
        fd = self.maps["counters"]
        out = {}
        val = ctypes.create_string_buffer(8 * self.ncpus)
        for i, name in enumerate(COUNTER_NAMES):
            key = ctypes.c_uint32(i)
            if self._lib.bpf_map_lookup_elem(fd, ctypes.byref(key), val) == 0:
                out[name] = sum(x for (x,) in _U64.iter_unpack(val.raw))
        return out

    def volume_sums(self) -> dict[tuple[Conn, int], VolumeSums]:
        """(connection, volume) -> its sums since the load (LUN as the 8 bytes' number,
        or NSID)."""
        out = {}
        entries = self._maps.entries(self.maps["stats"], _VOL_KEY.size, _VOL_STATS.size, True)
        for raw, val in entries:
            vol = _U64.unpack_from(raw, 40)[0]
            out[self._maps.conn(raw), vol] = VolumeSums(*_VOL_STATS.unpack(val))
        return out

    def inflight(self) -> dict[tuple[Conn, int], tuple[int, int, int]]:
        """(connection, tag) -> (the command's start in CLOCK_MONOTONIC ns, its op: READ,
        WRITE or 0, its volume as the wire has it)."""
        out = {}
        for raw, val in self._maps.entries(self.maps["inflight"], _TAG_KEY.size, _INFLIGHT.size):
            tag = _U32.unpack_from(raw, 36)[0]
            start, volume, _held, op, _prov = _INFLIGHT.unpack(val)
            out[self._maps.conn(raw), tag] = (start, op, volume)
        return out

    def set_login(
        self, conn: Conn, digests: tuple[bool, bool] | None, limits: dict[bool, int]
    ) -> None:
        """What a login that reached full feature negotiated: its digests (None: not
        said) and each receiver's MaxRecvDataSegmentLength (to_target -> bytes), for
        the program's walks of that connection (it takes them at their next segment)."""
        fd = self.maps["settings"]
        for to_target in (False, True):
            hd, dd = digests or (False, False)
            val = _SETTING.pack(int(hd), int(dd), digests is not None, limits.get(to_target, 0))
            key = _conn_raw(conn) + struct.pack("=I", int(to_target))  # flow_key
            self._lib.bpf_map_update_elem(fd, key, val, 0)

    def flows(self) -> list[FlowState]:
        """Every connection direction the program walks: its state and how long it was
        not in sync (wire.bpf.c's struct flow)."""
        out = []
        now = time.monotonic_ns()
        for raw, b in self._maps.entries(self.maps["flows"], _FLOW_KEY.size, FLOW_BYTES):
            to_target = _U32.unpack_from(raw, 36)[0]
            desyncs, resyncs, retracted, since, out_ns, out_bytes = _FLOW_COUNTS.unpack_from(
                b, FLOW_COUNTS_AT
            )
            state = b[FLOW_STATE]
            if state != 0 and since:  # the current stretch out of sync
                out_ns += max(0, now - since)
            flow = FlowState(
                conn=self._maps.conn(raw),
                to_target=bool(to_target),
                state=state,
                reason=b[FLOW_REASON],
                desyncs=desyncs,
                resyncs=resyncs,
                retracted=retracted,
                out_of_sync_s=out_ns / 1e9,
                out_of_sync_bytes=out_bytes,
                next_seq=_U32.unpack_from(b)[0],
            )
            out.append(flow)
        return out

    def esp_flows(self) -> list[EspState]:
        """The IPsec security associations seen on the port (not measurable)."""
        fd = self.maps["esp"]
        out = []
        val = ctypes.create_string_buffer(_ESP_STATS.size)
        for raw in list(self._maps.keys(fd, _ESP_KEY.size)):
            if self._lib.bpf_map_lookup_elem(fd, raw, val):
                continue
            src, dst, spi = _ESP_KEY.unpack(raw)
            first, last, frames, nbytes = _ESP_STATS.unpack(val.raw)
            out.append(EspState(_addr(src), _addr(dst), spi, (last - first) / 1e9, frames, nbytes))
        return out

    def forget_sums(self, conn: Conn, volume: int) -> None:
        """Drop a connection's sums of one volume (it ended or went idle): the map is a
        plain hash of 65,536, which connections that came and went would fill."""
        key = _VOL_KEY.pack(*_CONN.unpack(_conn_raw(conn)), volume)
        self._lib.bpf_map_delete_elem(self.maps["retired"], key)
        self._lib.bpf_map_delete_elem(self.maps["stats"], key)

    def forget_inflight(self, conn: Conn, tag: int) -> bool:
        """Age one command out (it never completed); False: its completion took it."""
        key = _conn_raw(conn) + struct.pack("=I", tag)  # tag_key
        return self._lib.bpf_map_delete_elem(self.maps["inflight"], key) == 0

    def retire(self, conn: Conn, volume: int, count: int, at_ns: int) -> None:
        """The commands of (conn, volume) aged out so far, in all, and when the last of
        them was (CLOCK_MONOTONIC ns): the program takes them off its count in flight at
        the volume's next move (it looks once the map retired_gen has moved past the
        value it saw last)."""
        key = _VOL_KEY.pack(*_CONN.unpack(_conn_raw(conn)), volume)
        self._lib.bpf_map_update_elem(self.maps["retired"], key, _RETIRED.pack(count, at_ns), 0)
        self._retired_gen += 1  # after the entry: a volume that sees the new one finds it
        gen = _U64.pack(self._retired_gen)
        self._lib.bpf_map_update_elem(self.maps["retired_gen"], _U32.pack(0), gen, 0)

    def events(self) -> list[Event]:
        """The logins and connects passed up since the last call."""
        if self._rb:
            self._lib.ring_buffer__consume(self._rb)
        out, self._events = self._events, []
        return out

    def run_time(self) -> tuple[int, int]:
        """(ns the program ran, its runs) since run-time statistics were enabled
        (enable_run_stats(); 0, 0 otherwise)."""
        info = ctypes.create_string_buffer(PROG_INFO_BYTES)
        size = ctypes.c_uint32(PROG_INFO_BYTES)
        if self._lib.bpf_obj_get_info_by_fd(self.prog_fd, info, ctypes.byref(size)):
            return 0, 0
        ns, runs = struct.unpack_from("=QQ", info.raw, PROG_INFO_RUN_TIME)
        return ns, runs

    def enable_run_stats(self) -> int:
        """Have the kernel time every run of the program while the returned fd is open
        (BPF_ENABLE_STATS: for a bench; costs two clock reads a run)."""
        fd = self._lib.bpf_enable_stats(BPF_STATS_RUN_TIME)
        if fd < 0:
            raise KernelWireError(f"cannot enable run-time statistics: {os.strerror(-fd)}")
        return int(fd)

    # ------------------------------------------------------------ internal
    def _on_event(self, _ctx: int, data: int, size: int) -> int:
        raw = ctypes.string_at(data, size)
        ini, tgt, ip, tp, kind, to_target, n, flags, total = _EVENT_HEAD.unpack_from(raw)
        body = raw[_EVENT_HEAD.size : _EVENT_HEAD.size + min(n, NAME_BYTES)]
        conn = conn_of(ini, tgt, ip, tp)
        self._events.append(Event(conn, kind, bool(to_target), body, flags, total))
        return 0

    def _keep_log(self, _level: int, fmt: bytes, args: int) -> int:
        # libbpf's messages are a printf format and its va_list (a pointer on the ABIs
        # Linux runs BPF on): formatted with libc's vsnprintf, its lines kept
        if fmt:
            # the verifier's log comes whole in one message, its reason at the end
            buf = ctypes.create_string_buffer(VERIFIER_LOG_BYTES if b"LOAD LOG" in fmt else 4096)
            _vsnprintf(buf, len(buf), fmt, args)
            self._log += [x.strip() for x in buf.value.decode(errors="replace").splitlines()]
        return 0

    def _last_log(self) -> str:
        """The verifier's reason when it refused (the line before its counts), else the
        last line libbpf printed."""
        lines = [x for x in self._log if x]
        if "-- END PROG LOAD LOG --" in lines:
            head = lines[: lines.index("-- END PROG LOAD LOG --")]
            reasons = [x for x in head if not x.startswith(("processed ", "verification time"))]
            if reasons:
                return reasons[-1]
        return (
            lines[-1] if lines else f"errno {ctypes.get_errno()}: {os.strerror(ctypes.get_errno())}"
        )


_vsnprintf = ctypes.CDLL(None).vsnprintf
_vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_vsnprintf.restype = ctypes.c_int


def _conn_raw(conn: Conn) -> bytes:
    """A connection as the program's conn_key (the start of its flow and tag keys)."""
    return _CONN.pack(
        _raw(conn.initiator), _raw(conn.target), conn.initiator_port, conn.target_port
    )


def _raw(addr: str) -> bytes:
    ip = ipaddress.ip_address(addr)
    return _MAPPED + ip.packed if ip.version == 4 else ip.packed
