"""The configuration schema: every key, its default and its bounds, defined once.

What it owns
    KEYS, one Key per configuration key of /etc/santhrottle/santhrottle.toml:
    its table, type (a Kind that parses and checks a TOML value, kinds.py), default
    as written in the file, documentation, and whether a change takes
    effect on reload or needs a restart.  The config parser (parse.py), the
    CLI's option defaults (`datapath apply --link-speed`, ...), the data
    path's defaults (DatapathSpec) and the reference table in
    docs/configure.md all come from here; a unit test holds the docs to it.

Bounds that are facts of the kernel or the tools, not choices
    MAX_PORTS      iptables multiport takes at most 15 ports (kinds.py).
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

from dataclasses import dataclass
from typing import Any

from santhrottle.appliance.config.initiators import group_members, host_addresses
from santhrottle.appliance.config.kinds import (
    IFNAME_MAX_CHARS,
    MAX_THRESHOLD_S,
    Kind,
    abs_path,
    bcrypt_users,
    bit_rate,
    boolean,
    byte_rate,
    choice,
    delay_us,
    duration_s,
    endpoints,
    integer,
    ip_address,
    name,
    names,
    number,
    ports,
    socket_mode,
    tcp_port_or_0,
    threshold,
    throughput,
    volume_names,
)
from santhrottle.appliance.config.tenancy import LEVEL_KEYS, levels
from santhrottle.appliance.units import (
    fmt_byte_rate,
    fmt_duration,
    fmt_us,
)
from santhrottle.controller.domain import LAWS, OFFSET_X_THRESHOLD_MAX, ControllerConfig
from santhrottle.controller.ladder import MAX_CLASSES as MAX_CLASSES
from santhrottle.controller.ladder import Ladder

DEFAULT_PATH = "/etc/santhrottle/santhrottle.toml"

# ------------------------------------------------------------ kernel bounds
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
# The most initiators metrics.initiator_series lets keep their own series.
MAX_INITIATOR_SERIES = 1_000_000
# A group's priority: a positive weight; 1000 to 1 is already "absolute priority".
MIN_PRIORITY = 0.001
MAX_PRIORITY = 1000.0
# sun_path of a Unix socket holds 107 bytes and the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# The modes a write-heavy initiator's packets can be delayed in (docs/datapath.md):
# every packet, or pure ACKs only (the 2010 method).  `read` exists for pins.
WRITE_MODES = ("all", "ack")
PIN_MODES = ("all", "ack", "read")
LEAVES = ("netem", "pfifo")
# The meter's period: a minute to a month; its log kept up to ten years.
MIN_METER_PERIOD_S = 60.0
MAX_METER_PERIOD_S = 31 * 86400.0
MAX_METER_RETENTION_S = 3660 * 86400.0
# Where santhrottle stands: on the target host, or on a bridge in front of any array.
MODES = ("target", "bridge")
WIRE_SENSORS = ("auto", "kernel", "capture")

_DC = ControllerConfig()
_LADDER = Ladder()


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
    Key(
        "daemon",
        "control_socket",
        abs_path(MAX_SOCKET_PATH_BYTES),
        "/run/santhrottle/control.sock",
        "the CLI's Unix socket",
        restart=True,
    ),
    Key(
        "daemon",
        "socket_mode",
        socket_mode(),
        "0600",
        "permissions of the control socket: 0600 root only, 0660 root and socket_group",
        restart=True,
    ),
    Key(
        "daemon",
        "socket_group",
        name("group"),
        None,
        "a group whose members may use the control socket (with socket_mode 0660); "
        "unset: root only",
        restart=True,
    ),
    Key(
        "daemon",
        "state_dir",
        abs_path(),
        "/var/lib/santhrottle",
        "where the runtime state (pins, pause, threshold overrides, classes) survives a restart",
        restart=True,
    ),
    Key(
        "daemon",
        "netns",
        name("network namespace"),
        None,
        "network namespace of the target (sock_diag, tc, ipset, iptables); unset: the daemon's own",
        restart=True,
    ),
    Key(
        "daemon",
        "keep_static_state",
        boolean(),
        False,
        "on stop, keep the tc tree, sets and chain (delays are always removed)",
    ),
    Key(
        "daemon",
        "mode",
        choice(MODES),
        "target",
        '"target": on the iSCSI / NVMe-oF target host (diskstats, LIO, nvmet); "bridge": '
        "a transparent bridge in front of any array, latency measured from the wire",
        restart=True,
    ),
    # [bridge]
    Key(
        "bridge",
        "name",
        name("bridge"),
        "br-santhrottle",
        "bridge mode: the bridge between the two ports (created when absent)",
        restart=True,
    ),
    Key(
        "bridge",
        "initiator_port",
        name("interface", IFNAME_MAX_CHARS),
        None,
        "bridge mode: the port facing the initiators, where the delays sit (required)",
        restart=True,
    ),
    Key(
        "bridge",
        "array_port",
        name("interface", IFNAME_MAX_CHARS),
        None,
        "bridge mode: the port facing the array, where the wire is read (required)",
        restart=True,
    ),
    Key(
        "bridge",
        "sensor",
        choice(WIRE_SENSORS),
        "auto",
        'bridge mode: where the wire is walked: "kernel" (a tc program, bridge/bpf), '
        '"capture" (a capture read in Python, several times the CPU a frame: bridge.md, '
        '"Cost") or "auto" (the kernel, else the capture)',
        restart=True,
    ),
    # [datapath]
    Key(
        "datapath",
        "devices",
        names("interface", '"eth1"', IFNAME_MAX_CHARS),
        [],
        "egress devices facing the initiators (required in target mode; in bridge mode "
        "bridge.initiator_port)",
        restart=True,
    ),
    Key(
        "datapath",
        "ports",
        ports(),
        [3260, 4420],
        "storage ports whose packets are delayed (iSCSI 3260, NVMe/TCP 4420)",
        restart=True,
    ),
    Key(
        "datapath",
        "write_mode",
        choice(WRITE_MODES),
        "all",
        "what is delayed for a write-heavy initiator: every packet, or pure ACKs only",
        restart=True,
    ),
    Key(
        "datapath",
        "step",
        delay_us(MIN_STEP_US, MAX_STEP_US),
        fmt_us(_LADDER.step_us),
        "delay of class 1, and the ladder's step near 0",
        restart=True,
    ),
    Key(
        "datapath",
        "max_delay",
        delay_us(MIN_STEP_US, MAX_DELAY_US),
        fmt_us(_LADDER.max_delay_us),
        f"largest delay (the last class), at most {fmt_us(MAX_DELAY_US)}",
        restart=True,
    ),
    Key(
        "datapath",
        "ladder_ratio",
        number(1.0, 2.0),
        _LADDER.ratio,
        "each class delays this much more than the one below it, in whole steps "
        "(1.0: a linear ladder of step)",
        restart=True,
    ),
    Key(
        "datapath",
        "link_speed",
        bit_rate(),
        "25gbit",
        "link speed: sizes HTB bursts and netem queue limits",
        restart=True,
    ),
    Key(
        "datapath",
        "leaf",
        choice(LEAVES),
        "netem",
        '"pfifo": classify without delaying (kernels without sch_netem, tests)',
        restart=True,
    ),
    Key(
        "datapath",
        "glide_leaves",
        integer(0, MAX_GLIDE_LEAVES),
        8,
        "netem leaves whose delay moves in place, so that a lowered delay keeps an "
        "initiator's packets in order; 0 = none",
        restart=True,
    ),
    # [controller]
    _ctl("tick", duration_s(0.01, 10.0), fmt_duration(_DC.tick_s), "the PID's period (fixed rate)"),
    _ctl(
        "converge",
        duration_s(0.01, 60.0),
        fmt_duration(_DC.converge_s),
        "period of discovery and of the write-heavy sets; at least tick",
    ),
    _ctl(
        "law",
        choice(LAWS),
        _DC.law,
        '"log": the PID acts on the logarithm of the delay; "paper": on the class index',
    ),
    _ctl(
        "kp_log_per_rel_error",
        number(0.0, 1e3),
        _DC.log_gains.kp_log_per_rel_error,
        'law "log": proportional gain, ln(delay) per unit of relative latency error',
    ),
    _ctl(
        "ti_log",
        duration_s(positive=True),
        fmt_duration(_DC.log_gains.ti_s),
        'law "log": integral time',
    ),
    _ctl(
        "td_log",
        duration_s(),
        fmt_duration(_DC.log_gains.td_s) if _DC.log_gains.td_s else "0",
        'law "log": derivative time (0: off)',
    ),
    _ctl(
        "offset_log_x_threshold",
        number(0.0, OFFSET_X_THRESHOLD_MAX),
        _DC.log_gains.offset_x_threshold,
        'law "log": it acts on ln(delay + this x the threshold); 0: on ln(delay)',
    ),
    _ctl(
        "kp_class_per_rel_error",
        number(0.0, 1e6),
        _DC.gains.kp_class_per_rel_error,
        'law "paper": proportional gain, classes per unit of relative latency error',
    ),
    _ctl(
        "ti", duration_s(positive=True), fmt_duration(_DC.gains.ti_s), 'law "paper": integral time'
    ),
    _ctl(
        "td",
        duration_s(),
        fmt_duration(_DC.gains.td_s) if _DC.gains.td_s else "0",
        'law "paper": derivative time (0: off)',
    ),
    _ctl(
        "setpoint_fraction",
        number(0.1, 1.0),
        _DC.setpoint_fraction,
        "the PID regulates to this fraction of the threshold (the least)",
    ),
    _ctl(
        "setpoint_quiet_fraction",
        number(0.0, 1.0),
        _DC.setpoint_quiet_fraction,
        "... and up to this one where the 1 s latency scatters little "
        "(<= setpoint_fraction: fixed)",
    ),
    _ctl(
        "setpoint_noise_z",
        number(0.0, 10.0),
        _DC.setpoint_noise_z,
        "the setpoint is 1 - z x the 1 s latency's relative sd, within those two",
    ),
    _ctl(
        "class_hysteresis",
        number(0.0, 1000.0),
        _DC.class_hysteresis,
        "classes the PID's output must fall before the class goes down",
    ),
    _ctl(
        "class_decrease_max_per_tick",
        integer(0, 1000),
        _DC.class_decrease_max_per_tick,
        "classes a delay may go down per tick (0: no limit)",
    ),
    _ctl(
        "class_increase_max_ratio_per_tick",
        number(0.0, 100.0),
        _DC.class_increase_max_ratio_per_tick,
        "factor a delay may grow by per tick (0: no limit, else >= 1)",
    ),
    _ctl(
        "delay_increase_min",
        duration_s(0.0, 1.0),
        fmt_duration(_DC.delay_increase_min_s_per_tick),
        "a rise of this much delay per tick is always allowed",
    ),
    _ctl(
        "read_ewma_tau",
        duration_s(),
        fmt_duration(_DC.read_ewma_tau_s),
        "time constant of the read-latency EWMA",
    ),
    _ctl(
        "write_ewma_tau",
        duration_s(positive=True),
        fmt_duration(_DC.write_ewma_tau_s),
        "time constant of the write-rate EWMA",
    ),
    _ctl(
        "write_heavy_enter",
        byte_rate(),
        fmt_byte_rate(_DC.write_heavy_enter_bps),
        "write rate that makes an initiator write-heavy on a resource",
    ),
    _ctl(
        "write_heavy_leave",
        byte_rate(),
        fmt_byte_rate(_DC.write_heavy_leave_bps),
        "write rate under which it leaves the set; below write_heavy_enter",
    ),
    _ctl(
        "write_heavy_share",
        number(0.0, 1.0),
        _DC.write_heavy_share,
        "also write-heavy: an initiator writing this share of its resource's fair share "
        "while the resource writes more than write_heavy_enter (0: off)",
    ),
    _ctl(
        "read_idle_release",
        duration_s(),
        fmt_duration(_DC.read_idle_release_s),
        "no reads for this long releases the resource's class",
    ),
    _ctl(
        "default_threshold",
        threshold(),
        None,
        "threshold of every discovered resource without its own; unset: observe them",
    ),
    _ctl(
        "utilization_threshold",
        number(0.01, 1.0),
        None,
        "a resource busy more than this share of a convergence counts as over its latency "
        "threshold (resources.NAME.utilization_threshold for one); unset: latency only",
    ),
    _ctl(
        "promote_below_utilization",
        number(0.01, 1.0),
        _DC.promote_below_utilization,
        "a group with levels is promoted only while its resources are busy less than this "
        "share of the time (and under their thresholds); 1: the latency alone decides",
    ),
    _ctl(
        "auto_alpha",
        number(0.5, 0.99),
        _DC.auto_alpha,
        'threshold "auto": the latency at this fraction of the device\'s peak throughput',
    ),
    # [resources.NAME]
    Key(
        "resources.NAME",
        "threshold",
        threshold(),
        None,
        'the resource\'s read-latency threshold; "auto": fitted from its devices (Pesto); '
        "unset: observed, never throttled",
    ),
    Key(
        "resources.NAME",
        "fallback_threshold",
        duration_s(0.0, MAX_THRESHOLD_S, positive=True),
        None,
        'threshold "auto": held until the fit is confident; unset: observed until then',
    ),
    Key(
        "resources.NAME",
        "devices",
        names("block device", '"sdb", "dm-3"'),
        [],
        "target mode: declare a resource as these block devices (a VG is discovered)",
    ),
    Key(
        "resources.NAME",
        "utilization_threshold",
        number(0.01, 1.0),
        None,
        "busy more than this share of a convergence, the resource counts as over its "
        "latency threshold (controller.utilization_threshold for all); unset: that one",
    ),
    Key(
        "resources.NAME",
        "volumes",
        volume_names(),
        [],
        "bridge mode: the volumes the resource is made of, as `santhrottle resources` names them",
    ),
    # [groups.NAME]
    Key(
        "groups.NAME",
        "members",
        group_members(),
        None,
        "the group's initiators: addresses, networks (10.0.1.0/24), host names, the names "
        "they log in with (iqn.*, nqn.*) (required)",
    ),
    Key(
        "groups.NAME",
        "priority",
        number(MIN_PRIORITY, MAX_PRIORITY),
        1.0,
        "how much a shortfall of this group weighs against the others' (docs/groups.md)",
    ),
    Key(
        "groups.NAME",
        "latency_target",
        duration_s(0.0, MAX_THRESHOLD_S, positive=True),
        None,
        "the mean read latency the group's initiators should see, the delay included; unset: none",
    ),
    Key(
        "groups.NAME",
        "throughput_target",
        throughput(),
        None,
        'the throughput the group should get, "200MB/s" or "5000iops"; unset: none',
    ),
    Key(
        "groups.NAME",
        "resources",
        names("resource", '"vg0"'),
        [],
        "the resources the group is arbitrated on; empty: every resource its members load",
    ),
    Key(
        "groups.NAME",
        "utilization_target",
        number(0.001, 1.0),
        None,
        "the share of its resources' busy time the group is guaranteed when it wants it "
        "(a disk-time reservation, docs/levels.md); the reservations on a resource sum to "
        "at most 1; unset: none",
    ),
    *(
        Key(
            "groups.NAME",
            k,
            levels(measure),
            None,
            f"elastic levels of the group's {'' if d == 'all' else d + ' '}"
            f"{'IOPS' if measure == 'iops' else 'bandwidth'}, lowest first: its cap rises a "
            "level while it is at it and its resources have room (docs/levels.md); unset: none",
        )
        for k, measure, d in LEVEL_KEYS
    ),
    # [hosts.NAME]
    Key(
        "hosts.NAME",
        "addresses",
        host_addresses(),
        None,
        "the addresses one initiator host connects from (IPv4 and IPv6): judged write-heavy "
        "on their summed writes, shown and counted as one initiator, delayed alike "
        "(required)",
    ),
    # [fleet]
    Key(
        "fleet",
        "endpoints",
        endpoints(),
        [],
        "etcd endpoints of the fleet's engine; empty: no fleet, this appliance controls alone",
        restart=True,
    ),
    Key(
        "fleet",
        "array",
        name("array"),
        None,
        "the array the fleet's appliances share (required with endpoints; the same on every "
        "appliance of it)",
        restart=True,
    ),
    Key(
        "fleet",
        "appliance",
        name("appliance"),
        None,
        "this appliance's name in the fleet, unique in it; unset: the host name",
        restart=True,
    ),
    Key(
        "fleet",
        "lease_ttl",
        duration_s(1.0, 60.0),
        "1s",
        "whole seconds: a dead appliance's leaderships end this long after its last "
        "refresh, and an appliance without an answer from etcd for this long controls "
        "alone; longer rides out longer stalls and a slower etcd (the engine's "
        "timeouts grow with it), at a slower failover",
        restart=True,
    ),
    Key(
        "fleet",
        "lead",
        boolean(),
        True,
        "whether this appliance may lead a resource; false: it only follows (its etcd "
        "user then needs no write right on leaders and decisions)",
        restart=True,
    ),
    Key(
        "fleet",
        "ca",
        abs_path(),
        None,
        "PEM file of the CA that signed the etcd members' certificates (with https:// "
        "endpoints); unset: the system's CAs",
        restart=True,
    ),
    Key(
        "fleet",
        "cert",
        abs_path(),
        None,
        "this appliance's client certificate (PEM), for members run with "
        "--client-cert-auth; with fleet.key",
        restart=True,
    ),
    Key(
        "fleet",
        "key",
        abs_path(),
        None,
        "the private key of fleet.cert (PEM, readable by root only)",
        restart=True,
    ),
    Key(
        "fleet",
        "user",
        name("etcd user"),
        None,
        "this appliance's etcd user, for a cluster with authentication on; with "
        "fleet.password_file",
        restart=True,
    ),
    Key(
        "fleet",
        "password_file",
        abs_path(),
        None,
        "file holding fleet.user's password (its first line; readable by root only)",
        restart=True,
    ),
    # [metering]
    Key(
        "metering",
        "period",
        duration_s(MIN_METER_PERIOD_S, MAX_METER_PERIOD_S),
        "1h",
        "the groups' usage is kept per period of this length, aligned to the clock "
        "(santhrottle meter; docs/levels.md)",
    ),
    Key(
        "metering",
        "retention",
        duration_s(MIN_METER_PERIOD_S, MAX_METER_RETENTION_S),
        "9600h",
        "closed periods older than this (9600h: 400 days) are deleted, a month at a time",
    ),
    Key(
        "metering",
        "price_per_iops_hour",
        number(0.0, 1e9),
        0.0,
        "the price of one IOPS of a level for an hour (a level of 600 IOPS for an hour costs "
        "600 times it)",
    ),
    Key(
        "metering",
        "price_per_mib_s_hour",
        number(0.0, 1e9),
        0.0,
        "the price of one MiB/s of a bandwidth level for an hour",
    ),
    # [metrics]
    Key(
        "metrics",
        "address",
        ip_address(),
        "127.0.0.1",
        "address of the Prometheus exporter",
        restart=True,
    ),
    Key(
        "metrics",
        "port",
        tcp_port_or_0(),
        9753,
        "port of the Prometheus exporter; 0 disables it",
        restart=True,
    ),
    Key(
        "metrics",
        "tls_cert_file",
        abs_path(),
        None,
        "the exporter serves HTTPS with this certificate (PEM; a chain after it); needed "
        "off the loopback",
        restart=True,
    ),
    Key(
        "metrics",
        "tls_key_file",
        abs_path(),
        None,
        "the certificate's private key (PEM), with tls_cert_file",
        restart=True,
    ),
    Key(
        "metrics",
        "tls_client_ca_file",
        abs_path(),
        None,
        "scrapes must show a client certificate this CA signed (PEM); unset: none asked",
        restart=True,
    ),
    Key(
        "metrics",
        "basic_auth_users",
        bcrypt_users(),
        None,
        "user = bcrypt hash (htpasswd -nBC 10 USER): every scrape gives one user and its "
        "password; needed off the loopback",
        restart=True,
    ),
    Key(
        "metrics",
        "initiator_series",
        integer(0, MAX_INITIATOR_SERIES),
        100,
        "initiators that keep their own series (santhrottle_initiator_*, 2 per resource "
        "written, 2 for the delay, 2 per address while delayed): those with the largest "
        "delay, then write rate; santhrottle_initiators_omitted counts the others; 0: none",
    ),
)

BY_NAME = {k.dotted: k for k in KEYS}
TABLES = (
    "daemon",
    "bridge",
    "datapath",
    "controller",
    "resources",
    "static_map",
    "groups",
    "hosts",
    "fleet",
    "metering",
    "metrics",
)


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
