"""The configuration schema: every key, its default and its bounds, defined once.

What it owns
    KEYS, one Key per configuration key of /etc/santhrottle/santhrottle.toml:
    its table, type (a Kind that parses and checks a TOML value), default
    as written in the file, documentation, and whether a change takes
    effect on reload or needs a restart.  The config parser (parse.py), the
    CLI's option defaults (`datapath apply --link-speed`, ...), the data
    path's defaults (DatapathSpec) and the reference table in
    docs/configure.md all come from here; a unit test holds the docs to it.

Bounds that are facts of the kernel or the tools, not choices
    MAX_PORTS      iptables multiport takes at most 15 ports.
    MAX_CLASSES    a delay class is an HTB minor written in decimal and
                   read as hex (class 20 is 5374:20), and its leaf qdisc
                   takes the same number as its handle major, which must
                   stay below the root's 5374: 5000 is the round bound.

Worked example
    Key datapath.step: Delay(MIN_STEP_US, MAX_STEP_US), default "500us":
    `step = "250us"` parses to 250 (us); `step = "0.25ms"` too; `step = 5`
    fails with "5 is not a duration: give a number and a unit, ...".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from santhrottle.appliance.units import (
    UnitError,
    fmt_byte_rate,
    fmt_duration,
    fmt_us,
    parse_bit_rate,
    parse_byte_rate,
    parse_duration_s,
    parse_duration_us,
)
from santhrottle.controller.domain import LAWS, OFFSET_X_THRESHOLD_MAX, ControllerConfig
from santhrottle.controller.ladder import MAX_CLASSES as MAX_CLASSES
from santhrottle.controller.ladder import Ladder

DEFAULT_PATH = "/etc/santhrottle/santhrottle.toml"
# Interface, namespace, resource and block device names.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")

# ------------------------------------------------------------ kernel bounds
MAX_PORTS = 15
MAX_GLIDE_LEAVES = 256
# A step finer than 10 us is below what netem's timer keeps; above 100 ms a
# class is too coarse for any threshold the controller can hold.
MIN_STEP_US = 10
MAX_STEP_US = 100_000
# The largest delay a class may have: 1 s, a fifth of the shortest initiator
# timeout a delayed response can meet (open-iscsi's NOP-Out timeout and the
# NVMe/TCP keep-alive timeout, both 5 s by default); a write through R2T
# meets the delay twice (docs/controller.md, "The ladder").
MAX_DELAY_US = 1_000_000
# A read-latency threshold above a minute is no threshold an array is held to.
MAX_THRESHOLD_S = 60.0
# The fastest link HTB's and netem's sizing is checked for (tc takes 64-bit rates).
MAX_LINK_BITS_S = 10 * 10**12
# sun_path of a Unix socket holds 107 bytes and the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# The control socket: root only, or root and one group (daemon.socket_group).
SOCKET_MODES = ("0600", "0660")
# The modes a write-heavy initiator's packets can be delayed in (docs/datapath.md):
# every packet, or pure ACKs only (the 2010 method).  `read` exists for pins.
WRITE_MODES = ("all", "ack")
PIN_MODES = ("all", "ack", "read")
LEAVES = ("netem", "pfifo")

_DC = ControllerConfig()
_LADDER = Ladder()


class KindError(ValueError):
    """A value of the wrong type or out of its bounds: the message, without the key."""


@dataclass(frozen=True)
class Kind:
    """A value type: parses a TOML value, describes itself for the docs."""

    describe: str
    parse: Callable[[Any], Any]


def _fail(value: Any, what: str) -> KindError:
    return KindError(f"{value!r} {what}")


def delay_us(lo_us: int, hi_us: int) -> Kind:
    def parse(v: Any) -> int:
        if not isinstance(v, str):
            raise _fail(v, 'is not a duration: write e.g. "500us"')
        try:
            us = parse_duration_us(v)
        except UnitError as e:
            raise KindError(str(e)) from None
        if not lo_us <= us <= hi_us:
            raise _fail(v, f"is outside {fmt_us(lo_us)}..{fmt_us(hi_us)}")
        return us

    return Kind(f"duration, {fmt_us(lo_us)}..{fmt_us(hi_us)}, whole us", parse)


def duration_s(lo_s: float = 0.0, hi_s: float | None = None, positive: bool = False) -> Kind:
    def parse(v: Any) -> float:
        if not isinstance(v, str):
            raise _fail(v, 'is not a duration: write e.g. "15ms"')
        try:
            s = parse_duration_s(v)
        except UnitError as e:
            raise KindError(str(e)) from None
        if positive and s <= 0:
            raise _fail(v, "must be above 0")
        if positive and not lo_s and hi_s is not None and s > hi_s:
            raise _fail(v, f"is above {fmt_duration(hi_s)}")
        if s < lo_s or (hi_s is not None and s > hi_s):
            raise _fail(v, f"is outside {fmt_duration(lo_s)}..{fmt_duration(hi_s or 0)}")
        return s

    if hi_s is not None and positive and not lo_s:
        desc = f"duration > 0, at most {fmt_duration(hi_s)}"
    elif hi_s is not None:
        desc = f"duration, {fmt_duration(lo_s)}..{fmt_duration(hi_s)}"
    else:
        desc = "duration > 0" if positive else "duration >= 0"
    return Kind(desc, parse)


# A threshold the daemon derives itself (Pesto's, controller/lqfit.py).
AUTO = "auto"


def threshold() -> Kind:
    """A read-latency threshold: a duration > 0 (at most MAX_THRESHOLD_S), or "auto"."""
    dur = duration_s(0.0, MAX_THRESHOLD_S, positive=True)

    def parse(v: Any) -> float | str:
        if v == AUTO:
            return AUTO
        try:
            return float(dur.parse(v))
        except KindError as e:
            raise KindError(f'{e}; or "auto"') from None

    return Kind(f'{dur.describe}, or "auto"', parse)


def byte_rate() -> Kind:
    def parse(v: Any) -> float:
        if not isinstance(v, str):
            raise _fail(v, 'is not a byte rate: write e.g. "1MiB/s"')
        try:
            return parse_byte_rate(v)
        except UnitError as e:
            raise KindError(str(e)) from None

    return Kind("byte rate (B/s, kB/s, KiB/s, MB/s, MiB/s, ...)", parse)


def bit_rate() -> Kind:
    def parse(v: Any) -> int:
        try:
            bits = parse_bit_rate(v)
        except UnitError as e:
            raise KindError(str(e)) from None
        if bits > MAX_LINK_BITS_S:
            raise _fail(v, "is above 10tbit")
        return bits

    return Kind("link speed, 1mbit..10tbit (e.g. 10gbit)", parse)


def integer(lo: int, hi: int) -> Kind:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _fail(v, f"must be a whole number within [{lo}, {hi}]")
        return v

    return Kind(f"whole number, {lo}..{hi}", parse)


def number(lo: float, hi: float) -> Kind:
    def parse(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise _fail(v, f"must be a number within [{lo:g}, {hi:g}]")
        return float(v)

    return Kind(f"number, {lo:g}..{hi:g}", parse)


def boolean() -> Kind:
    def parse(v: Any) -> bool:
        if not isinstance(v, bool):
            raise _fail(v, "must be true or false")
        return v

    return Kind("true or false", parse)


def choice(options: Sequence[str]) -> Kind:
    def parse(v: Any) -> str:
        if v not in options:
            raise _fail(v, f"must be one of {', '.join(options)}")
        return str(v)

    return Kind(" or ".join(f'"{o}"' for o in options), parse)


def abs_path(max_bytes: int = 4095) -> Kind:
    def parse(v: Any) -> str:
        if not isinstance(v, str) or not v.startswith("/") or "\0" in v:
            raise _fail(v, "must be an absolute path")
        if len(v.encode("utf-8", "surrogateescape")) > max_bytes:
            raise _fail(v, f"is longer than {max_bytes} bytes")
        return v

    return Kind("absolute path" if max_bytes == 4095 else f"absolute path, <= {max_bytes} bytes",
                parse)  # fmt: skip


def socket_mode() -> Kind:
    def parse(v: Any) -> int:
        if v not in SOCKET_MODES:
            raise _fail(
                v, f"must be {' or '.join(map(repr, SOCKET_MODES))} (0660 with socket_group)"
            )
        return int(v, 8)

    return Kind(" or ".join(f'"{m}"' for m in SOCKET_MODES), parse)


def name(what: str) -> Kind:
    def parse(v: Any) -> str:
        if not isinstance(v, str) or not NAME_RE.match(v):
            article = "an" if what[:1] in "aeiou" else "a"
            raise _fail(v, f"is not {article} {what} name (letters, digits and _ . + -)")
        return v

    return Kind(f"{what} name", parse)


def names(what: str, examples: str) -> Kind:
    one = name(what).parse

    def parse(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise _fail(v, f"must be a list of {what} names ({examples})")
        try:
            return tuple(one(x) for x in v)
        except KindError as e:
            raise KindError(f"must be a list of {what} names ({examples}): {e}") from None

    return Kind(f"list of {what} names", parse)


def ports() -> Kind:
    def parse(v: Any) -> tuple[int, ...]:
        if not isinstance(v, list):
            raise _fail(v, "must be a list of TCP ports (1-65535)")
        return check_ports(v)

    return Kind(f"list of 1..{MAX_PORTS} TCP ports", parse)


def check_ports(values: Sequence[Any]) -> tuple[int, ...]:
    """The storage ports, or a KindError: 1..MAX_PORTS distinct TCP ports."""
    if not values:
        raise KindError("no storage ports given")
    out: list[int] = []
    for p in values:
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise KindError(f"bad port {p!r}: expected 1-65535")
        if p in out:
            raise KindError(f"port {p} given twice")
        out.append(p)
    if len(out) > MAX_PORTS:
        raise KindError(f"{len(out)} storage ports: iptables multiport takes at most {MAX_PORTS}")
    return tuple(out)


def parse_ports_text(text: str) -> tuple[int, ...]:
    """'3260,4420' (the CLI's spelling) -> (3260, 4420); KindError otherwise."""
    vals: list[Any] = []
    for part in text.split(","):
        p = part.strip()
        if not p.isdigit():
            raise KindError(f"bad port {part!r} in {text!r}: expected 1-65535")
        vals.append(int(p))
    return check_ports(vals)


def ip_address() -> Kind:
    def parse(v: Any) -> str:
        if not isinstance(v, str):
            raise _fail(v, 'is not an IP address: write it as a string, e.g. "127.0.0.1"')
        try:
            return str(ipaddress.ip_address(v))
        except (ValueError, TypeError):
            raise _fail(v, "is not an IP address") from None

    return Kind("IP address", parse)


def tcp_port_or_0() -> Kind:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 65536:
            raise _fail(v, "must be a TCP port (0 disables the exporter)")
        return v

    return Kind("TCP port, 0 = off", parse)


@dataclass(frozen=True)
class Key:
    """One configuration key.  default: as written in the file (None: unset)."""

    table: str
    name: str
    kind: Kind
    default: Any
    doc: str
    restart: bool = False  # True: a change needs a restart (reload refuses it)

    @property
    def dotted(self) -> str:
        return f"{self.table}.{self.name}"

    def default_value(self) -> Any:
        """The parsed default (None when unset)."""
        return None if self.default is None else self.kind.parse(self.default)


def _ctl(key: str, kind: Kind, default: Any, doc: str) -> Key:
    return Key("controller", key, kind, default, doc)


KEYS: tuple[Key, ...] = (
    # [daemon]
    Key("daemon", "control_socket", abs_path(MAX_SOCKET_PATH_BYTES),
        "/run/santhrottle/control.sock", "the CLI's Unix socket", restart=True),
    Key("daemon", "socket_mode", socket_mode(), "0600",
        "permissions of the control socket: 0600 root only, 0660 root and socket_group",
        restart=True),
    Key("daemon", "socket_group", name("group"), None,
        "a group whose members may use the control socket (with socket_mode 0660); "
        "unset: root only", restart=True),
    Key("daemon", "state_dir", abs_path(), "/var/lib/santhrottle",
        "where the runtime state (pins, pause, threshold overrides, classes) survives a "
        "restart", restart=True),
    Key("daemon", "netns", name("network namespace"), None,
        "network namespace of the target (sock_diag, tc, ipset, iptables); unset: the "
        "daemon's own", restart=True),
    Key("daemon", "keep_static_state", boolean(), False,
        "on stop, keep the tc tree, sets and chain (delays are always removed)"),
    # [datapath]
    Key("datapath", "devices", names("interface", '"eth1"'), [],
        "egress devices facing the initiators (required)", restart=True),
    Key("datapath", "ports", ports(), [3260, 4420],
        "storage ports whose packets are delayed (iSCSI 3260, NVMe/TCP 4420)", restart=True),
    Key("datapath", "write_mode", choice(WRITE_MODES), "all",
        "what is delayed for a write-heavy initiator: every packet, or pure ACKs only",
        restart=True),
    Key("datapath", "step", delay_us(MIN_STEP_US, MAX_STEP_US),
        fmt_us(_LADDER.step_us), "delay of class 1, and the ladder's step near 0",
        restart=True),
    Key("datapath", "max_delay", delay_us(MIN_STEP_US, MAX_DELAY_US),
        fmt_us(_LADDER.max_delay_us),
        f"largest delay (the last class), at most {fmt_us(MAX_DELAY_US)}", restart=True),
    Key("datapath", "ladder_ratio", number(1.0, 2.0), _LADDER.ratio,
        "each class delays this much more than the one below it, in whole steps "
        "(1.0: a linear ladder of step)", restart=True),
    Key("datapath", "link_speed", bit_rate(), "25gbit",
        "link speed: sizes HTB bursts and netem queue limits", restart=True),
    Key("datapath", "leaf", choice(LEAVES), "netem",
        '"pfifo": classify without delaying (kernels without sch_netem, tests)', restart=True),
    Key("datapath", "glide_leaves", integer(0, MAX_GLIDE_LEAVES), 8,
        "netem leaves whose delay moves in place, so that a lowered delay keeps an "
        "initiator's packets in order; 0 = none", restart=True),
    # [controller]
    _ctl("tick", duration_s(0.01, 10.0), fmt_duration(_DC.tick_s),
         "the PID's period (fixed rate)"),
    _ctl("converge", duration_s(0.01, 60.0), fmt_duration(_DC.converge_s),
         "period of discovery and of the write-heavy sets; at least tick"),
    _ctl("law", choice(LAWS), _DC.law,
         '"log": the PID acts on the logarithm of the delay; "paper": on the class index'),
    _ctl("kp_log_per_rel_error", number(0.0, 1e3), _DC.log_gains.kp_log_per_rel_error,
         'law "log": proportional gain, ln(delay) per unit of relative latency error'),
    _ctl("ti_log", duration_s(positive=True), fmt_duration(_DC.log_gains.ti_s),
         'law "log": integral time'),
    _ctl("td_log", duration_s(), fmt_duration(_DC.log_gains.td_s) if _DC.log_gains.td_s else "0",
         'law "log": derivative time (0: off)'),
    _ctl("offset_log_x_threshold", number(0.0, OFFSET_X_THRESHOLD_MAX),
         _DC.log_gains.offset_x_threshold,
         'law "log": it acts on ln(delay + this x the threshold); 0: on ln(delay)'),
    _ctl("kp_class_per_rel_error", number(0.0, 1e6), _DC.gains.kp_class_per_rel_error,
         'law "paper": proportional gain, classes per unit of relative latency error'),
    _ctl("ti", duration_s(positive=True), fmt_duration(_DC.gains.ti_s),
         'law "paper": integral time'),
    _ctl("td", duration_s(), fmt_duration(_DC.gains.td_s) if _DC.gains.td_s else "0",
         'law "paper": derivative time (0: off)'),
    _ctl("setpoint_fraction", number(0.1, 1.0), _DC.setpoint_fraction,
         "the PID regulates to this fraction of the threshold (the least)"),
    _ctl("setpoint_quiet_fraction", number(0.0, 1.0), _DC.setpoint_quiet_fraction,
         "... and up to this one where the 1 s latency scatters little "
         "(<= setpoint_fraction: fixed)"),
    _ctl("setpoint_noise_z", number(0.0, 10.0), _DC.setpoint_noise_z,
         "the setpoint is 1 - z x the 1 s latency's relative sd, within those two"),
    _ctl("class_hysteresis", number(0.0, 1000.0), _DC.class_hysteresis,
         "classes the PID's output must fall before the class goes down"),
    _ctl("class_decrease_max_per_tick", integer(0, 1000), _DC.class_decrease_max_per_tick,
         "classes a delay may go down per tick (0: no limit)"),
    _ctl("class_increase_max_ratio_per_tick", number(0.0, 100.0),
         _DC.class_increase_max_ratio_per_tick,
         "factor a delay may grow by per tick (0: no limit, else >= 1)"),
    _ctl("delay_increase_min", duration_s(0.0, 1.0),
         fmt_duration(_DC.delay_increase_min_s_per_tick),
         "a rise of this much delay per tick is always allowed"),
    _ctl("read_ewma_tau", duration_s(), fmt_duration(_DC.read_ewma_tau_s),
         "time constant of the read-latency EWMA"),
    _ctl("write_ewma_tau", duration_s(positive=True), fmt_duration(_DC.write_ewma_tau_s),
         "time constant of the write-rate EWMA"),
    _ctl("write_heavy_enter", byte_rate(), fmt_byte_rate(_DC.write_heavy_enter_bps),
         "write rate that makes an initiator write-heavy on a resource"),
    _ctl("write_heavy_leave", byte_rate(), fmt_byte_rate(_DC.write_heavy_leave_bps),
         "write rate under which it leaves the set; below write_heavy_enter"),
    _ctl("write_heavy_share", number(0.0, 1.0), _DC.write_heavy_share,
         "also write-heavy: an initiator writing this share of its resource's fair share "
         "while the resource writes more than write_heavy_enter (0: off)"),
    _ctl("read_idle_release", duration_s(), fmt_duration(_DC.read_idle_release_s),
         "no reads for this long releases the resource's class"),
    _ctl("default_threshold", threshold(), None,
         "threshold of every discovered resource without its own; unset: observe them"),
    _ctl("auto_alpha", number(0.5, 0.99), _DC.auto_alpha,
         'threshold "auto": the latency at this fraction of the device\'s peak throughput'),
    # [resources.NAME]
    Key("resources.NAME", "threshold", threshold(), None,
        'the resource\'s read-latency threshold; "auto": fitted from its devices (Pesto); '
        "unset: observed, never throttled"),
    Key("resources.NAME", "fallback_threshold", duration_s(0.0, MAX_THRESHOLD_S, positive=True),
        None, 'threshold "auto": held until the fit is confident; unset: observed until then'),
    Key("resources.NAME", "devices", names("block device", '"sdb", "dm-3"'), [],
        "declare a resource as these block devices (a VG is discovered)"),
    # [metrics]
    Key("metrics", "address", ip_address(), "127.0.0.1",
        "address of the Prometheus exporter", restart=True),
    Key("metrics", "port", tcp_port_or_0(), 9753,
        "port of the Prometheus exporter; 0 disables it", restart=True),
)  # fmt: skip

BY_NAME = {k.dotted: k for k in KEYS}
TABLES = ("daemon", "datapath", "controller", "resources", "static_map", "metrics")


def key(dotted: str) -> Key:
    return BY_NAME[dotted]


def default(dotted: str) -> Any:
    """The parsed default of a key: default("datapath.link_speed") -> 25_000_000_000."""
    return BY_NAME[dotted].default_value()


def toml_value(v: Any) -> str:
    """A default as it is written in the file."""
    if v is None:
        return "(unset)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def reference_table() -> str:
    """The Markdown table of every key (docs/configure.md holds it; a test compares)."""
    lines = [
        "| key | default | values | takes effect | meaning |",
        "|---|---|---|---|---|",
    ]
    for k in KEYS:
        lines.append(
            f"| `{k.dotted}` | `{toml_value(k.default)}` | {k.kind.describe} | "
            f"{'restart' if k.restart else 'reload'} | {k.doc} |"
        )
    return "\n".join(lines) + "\n"
