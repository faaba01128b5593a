"""santhrottled's configuration file: TOML (stdlib tomllib), validated whole against the schema.

Every key, its default and its bounds are in schema.py; this module reads
a file into a Config, adding what no single key can check (a ladder that
can be built, converge at least tick, leave below enter).  An invalid
file raises ConfigError naming the file, the line and the key
(`santhrottle.toml:12: resources.vg0.threshold: '15' is not a duration...`);
the daemon keeps its last good config when a reload fails.

Worked example
    parse_config('[datapath]\\ndevices = ["eth1"]\\n') -> Config with
    devices ("eth1",), step_us 500, max_delay_us 250000, ladder_ratio 1.05
    (the ladder's max_class 88),
    link_bits_s 25e9 and every other key at its default.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from santhrottle.appliance.addresses import AddressError, initiator_network
from santhrottle.appliance.config.controller import controller_config
from santhrottle.appliance.config.fleet import FIELDS as FLEET_FIELDS
from santhrottle.appliance.config.fleet import fleet_fields
from santhrottle.appliance.config.hosts import HostConfig, hosts
from santhrottle.appliance.config.kinds import AUTO, NAME_RE, KindError, quote
from santhrottle.appliance.config.metrics import FIELDS as METRICS_FIELDS
from santhrottle.appliance.config.metrics import metrics_fields
from santhrottle.appliance.config.schema import DEFAULT_PATH, KEYS, TABLES
from santhrottle.appliance.config.tenancy import (
    MeteringConfig,
    group_levels,
    metering,
    over_reserved,
)
from santhrottle.appliance.textfile import printable, read_text_file
from santhrottle.controller.domain import ControllerConfig
from santhrottle.controller.ladder import Ladder
from santhrottle.controller.levels import Levels

# No configuration is near this; a bigger file is a mistake (or /dev/zero).
MAX_CONFIG_BYTES = 1024 * 1024


class ConfigError(ValueError):
    """One line: file, line, key, problem (what the file wrote made printable: a key
    with a newline or a NUL cannot forge a second line of the log)."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


@dataclass(frozen=True)
class ResourceConfig:
    name: str
    threshold_s: float | str | None  # None: measured, never throttled; "auto": fitted
    devices: tuple[str, ...] = ()  # declared resource: these block devices
    fallback_s: float | None = None  # "auto": held until the fit is confident
    volumes: tuple[str, ...] = ()  # bridge mode: iscsi://... and nvme://... names
    utilization_threshold: float | None = None  # None: controller.utilization_threshold


@dataclass(frozen=True)
class GroupConfig:
    """[groups.NAME]: an initiator group's members, targets and priority (docs/groups.md)."""

    name: str
    members: tuple[str, ...]
    priority: float = 1.0
    latency_target_s: float | None = None
    throughput_target_bps: float | None = None
    throughput_target_iops: float | None = None
    resources: tuple[str, ...] = ()  # empty: every resource its members load
    utilization_target: float | None = None  # a disk-time reservation (docs/levels.md)
    levels: tuple[Levels, ...] = ()  # elastic levels (controller/levels.py)


@dataclass(frozen=True)
class Config:
    """A validated configuration (parse_config("") is every default)."""

    path: str
    # [daemon]
    control_socket: str
    socket_mode: int
    netns: str | None
    keep_static_state: bool
    # [datapath]
    devices: tuple[str, ...]
    ports: tuple[int, ...]
    write_mode: str
    step_us: int
    max_delay_us: int
    ladder_ratio: float
    link_bits_s: int
    leaf: str
    glide_leaves: int
    # [controller]
    controller: ControllerConfig
    default_threshold_s: float | str | None
    # [resources.NAME], [static_map]
    resources: dict[str, ResourceConfig] = field(default_factory=dict)
    static_map: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # [groups.NAME]
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    # [metrics]
    metrics_address: str = ""
    metrics_port: int = 0
    # off the loopback: HTTPS and users (config/metrics.py)
    metrics_tls_cert_file: str | None = None
    metrics_tls_key_file: str | None = None
    metrics_tls_client_ca_file: str | None = None
    metrics_basic_auth_users: dict[str, str] | None = None  # user -> bcrypt hash
    metrics_initiator_series: int = 100  # initiators that keep their own series
    # [daemon], later additions
    socket_group: str | None = None
    state_dir: str = "/var/lib/santhrottle"
    mode: str = "target"  # or "bridge"
    # [bridge]
    bridge_name: str = "br-santhrottle"
    initiator_port: str | None = None
    array_port: str | None = None
    bridge_sensor: str = "auto"
    # [hosts.NAME]: addresses that are one initiator (config/hosts.py)
    hosts: dict[str, HostConfig] = field(default_factory=dict)
    # [fleet]: empty endpoints, no fleet
    fleet_endpoints: tuple[str, ...] = ()
    fleet_array: str | None = None
    fleet_appliance: str | None = None
    fleet_lease_ttl_s: int = 1
    fleet_lead: bool = True
    fleet_ca: str | None = None  # TLS and the etcd user (fleet/gateway.py Security)
    fleet_cert: str | None = None
    fleet_key: str | None = None
    fleet_user: str | None = None
    fleet_password_file: str | None = None
    # [controller] utilization_threshold, [metering] (docs/levels.md)
    utilization_threshold: float | None = None
    metering: MeteringConfig = field(default_factory=MeteringConfig)

    @property
    def fleet(self) -> bool:
        return bool(self.fleet_endpoints)

    @property
    def bridge_mode(self) -> bool:
        return self.mode == "bridge"

    def volumes(self) -> dict[str, tuple[str, ...]]:
        """Bridge mode: resource -> its volume names."""
        return {n: r.volumes for n, r in self.resources.items()}

    @property
    def step_s(self) -> float:
        return self.step_us / 1e6

    @property
    def ladder(self) -> Ladder:
        return self.controller.ladder

    @property
    def max_class(self) -> int:
        return self.controller.ladder.max_class

    def fallback_of(self, resource: str) -> float | None:
        rc = self.resources.get(resource)
        return rc.fallback_s if rc is not None else None

    def utilization_threshold_of(self, resource: str) -> float | None:
        rc = self.resources.get(resource)
        if rc is not None and rc.utilization_threshold is not None:
            return rc.utilization_threshold
        return self.utilization_threshold

    def threshold_of(self, resource: str) -> float | str | None:
        rc = self.resources.get(resource)
        if rc is not None and rc.threshold_s is not None:
            return rc.threshold_s
        return self.default_threshold_s

    def restart_changes(self, other: Config) -> list[str]:
        """The keys (dotted) that differ from `other` and need a restart."""
        return [
            dotted
            for dotted, attr in RESTART_FIELDS.items()
            if getattr(self, attr) != getattr(other, attr)
        ]

    def keeping_restart_keys_of(self, running: Config) -> Config:
        """This config with the restart keys' values of the running one (what a
        reload can take effect with; the controller's ladder is the data path's,
        whose keys are restart keys)."""
        kept = replace(self, **{a: getattr(running, a) for a in RESTART_FIELDS.values()})
        return replace(kept, controller=replace(kept.controller, ladder=running.ladder))


# Config attribute of each key that needs a restart (schema: Key.restart).
_FIELD = {
    "datapath.step": "step_us",
    "datapath.max_delay": "max_delay_us",
    "datapath.link_speed": "link_bits_s",
    **{f"metrics.{k}": f"metrics_{k}" for k in METRICS_FIELDS},
    "bridge.name": "bridge_name",
    "bridge.sensor": "bridge_sensor",
    **{f"fleet.{k}": f"fleet_{k}" for k in FLEET_FIELDS},
    "fleet.lease_ttl": "fleet_lease_ttl_s",
}
RESTART_FIELDS = {k.dotted: _FIELD.get(k.dotted, k.name) for k in KEYS if k.restart}
assert set(RESTART_FIELDS.values()) <= {f.name for f in fields(Config)}


def _line_of(text: str, dotted: str) -> int | None:
    """Best-effort line number of a key: its table header, then `key =` in it."""
    parts = dotted.split(".")
    key = parts[-1]
    table = ".".join(parts[:-1])
    current = ""
    hit = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if m:
            current = m.group(1).replace('"', "").replace(" ", "")
            if current == dotted:
                hit = hit or n
            continue
        if current == table and re.match(rf'^"?{re.escape(key)}"?\s*=', line):
            return n
    return hit


class _Reader:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path

    def fail(self, key: str, msg: str) -> ConfigError:
        line = _line_of(self.text, key)
        where = f"{self.path}:{line}" if line else self.path
        return ConfigError(f"{where}: {key}: {msg}")

    def table(self, data: dict[str, Any], name: str, schema_table: str) -> dict[str, Any]:
        """The values of one table's keys (defaults filled in), by key name."""
        t = data.get(name, {})
        if not isinstance(t, dict):
            raise self.fail(name, "must be a table")
        known = {k.name: k for k in KEYS if k.table == schema_table}
        for k in t:
            if k not in known:
                raise self.fail(f"{name}.{k}", f"unknown key (known: {', '.join(sorted(known))})")
        out = {}
        for kname, k in known.items():
            raw = t.get(kname, k.default)
            try:
                out[kname] = None if raw is None else k.kind.parse(raw)
            except KindError as e:
                raise self.fail(f"{name}.{kname}", str(e)) from None
        return out


def parse_config(text: str, path: str = DEFAULT_PATH) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {_one_line(e)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deep") from None
    r = _Reader(text, path)
    for k in data:
        if k not in TABLES:
            raise r.fail(k, f"unknown table (known: {', '.join(sorted(TABLES))})")

    d = r.table(data, "daemon", "daemon")
    if d["socket_mode"] == 0o660 and not d["socket_group"]:
        raise r.fail("daemon.socket_mode", '"0660" needs daemon.socket_group')
    if d["socket_group"] and d["socket_mode"] != 0o660:
        raise r.fail("daemon.socket_group", 'needs socket_mode = "0660"')
    p = r.table(data, "datapath", "datapath")
    controller, c = controller_config(r, p, data)
    b = r.table(data, "bridge", "bridge")
    resources = _resources(r, data)
    static_map = _static_map(r, data)
    groups = _groups(r, data)
    devices = p["devices"]
    if d["mode"] == "bridge":
        devices = _bridge_checks(r, b, devices, resources, static_map, c["default_threshold"])
    else:
        for name, rc in resources.items():
            if rc.volumes:
                raise r.fail(f"resources.{name}.volumes", 'needs daemon.mode = "bridge"')
    return Config(
        path=path,
        control_socket=d["control_socket"],
        socket_mode=d["socket_mode"],
        netns=d["netns"],
        keep_static_state=d["keep_static_state"],
        devices=devices,
        ports=p["ports"],
        write_mode=p["write_mode"],
        step_us=p["step"],
        max_delay_us=p["max_delay"],
        ladder_ratio=p["ladder_ratio"],
        link_bits_s=p["link_speed"],
        leaf=p["leaf"],
        glide_leaves=p["glide_leaves"],
        controller=controller,
        default_threshold_s=c["default_threshold"],
        resources=resources,
        static_map=static_map,
        groups=groups,
        **metrics_fields(r, data),
        socket_group=d["socket_group"],
        state_dir=d["state_dir"],
        mode=d["mode"],
        bridge_name=b["name"],
        initiator_port=b["initiator_port"],
        array_port=b["array_port"],
        bridge_sensor=b["sensor"],
        hosts=hosts(r, data),
        **fleet_fields(r, data),
        utilization_threshold=c["utilization_threshold"],
        metering=metering(r.table(data, "metering", "metering")),
    )


def _bridge_checks(
    r: _Reader,
    b: dict[str, Any],
    devices: tuple[str, ...],
    resources: dict[str, ResourceConfig],
    static_map: dict[str, tuple[str, ...]],
    default_threshold: float | str | None,
) -> tuple[str, ...]:
    """Bridge mode's own rules; the data path's devices (the initiator-side port)."""
    for k in ("initiator_port", "array_port"):
        if not b[k]:
            raise r.fail(f"bridge.{k}", 'is required with daemon.mode = "bridge"')
    if b["initiator_port"] == b["array_port"]:
        raise r.fail("bridge.array_port", "must differ from bridge.initiator_port")
    if b["name"] in (b["initiator_port"], b["array_port"]):
        raise r.fail("bridge.name", "must differ from both ports")
    if devices and devices != (b["initiator_port"],):
        raise r.fail(
            "datapath.devices", "bridge mode delays on bridge.initiator_port: leave this out"
        )
    if static_map:
        raise r.fail("static_map", "in bridge mode the wire names each initiator's volumes")
    if default_threshold == AUTO:
        raise r.fail("controller.default_threshold", _NO_AUTO)
    for name, rc in resources.items():
        if rc.devices:
            raise r.fail(f"resources.{name}.devices", "in bridge mode a resource is volumes")
        if rc.threshold_s == AUTO:
            raise r.fail(f"resources.{name}.threshold", _NO_AUTO)
    return (b["initiator_port"],)


# Pesto's fit wants every IO's latency and the queue (diskstats); the wire sensor
# measures reads only.
_NO_AUTO = '"auto" needs the devices\' counters: target mode only; give a duration'


def _resources(r: _Reader, data: dict[str, Any]) -> dict[str, ResourceConfig]:
    table = data.get("resources", {})
    if not isinstance(table, dict):
        raise r.fail("resources", "must be a table of [resources.NAME] tables")
    out: dict[str, ResourceConfig] = {}
    for name, rt in table.items():
        key = f"resources.{name}"
        if not NAME_RE.match(name):
            raise r.fail(key, "resource names are letters, digits and _ . + -")
        if not isinstance(rt, dict):
            raise r.fail(key, "must be a table with threshold and optional devices")
        v = r.table({key: rt}, key, "resources.NAME")
        out[name] = ResourceConfig(
            name,
            v["threshold"],
            v["devices"],
            v["fallback_threshold"],
            v["volumes"],
            v["utilization_threshold"],
        )
    return out


# The initiators of a grouped resource in no group (controller/groups.py DEFAULT_GROUP).
RESERVED_GROUP = "default"


def _groups(r: _Reader, data: dict[str, Any]) -> dict[str, GroupConfig]:
    table = data.get("groups", {})
    if not isinstance(table, dict):
        raise r.fail("groups", "must be a table of [groups.NAME] tables")
    out: dict[str, GroupConfig] = {}
    owner: dict[str, str] = {}  # member, as written -> its group
    for name, gt in table.items():
        key = f"groups.{name}"
        if not NAME_RE.match(name):
            raise r.fail(key, "group names are letters, digits and _ . + -")
        if name == RESERVED_GROUP:
            raise r.fail(
                key, f'"{RESERVED_GROUP}" names the initiators in no group: choose another name'
            )
        if not isinstance(gt, dict):
            raise r.fail(key, "must be a table with members and optional targets and priority")
        v = r.table({key: gt}, key, "groups.NAME")
        if v["members"] is None:
            raise r.fail(f"{key}.members", "is required")
        for m in v["members"]:
            other = owner.setdefault(m.lower(), name)
            if other != name:
                raise r.fail(f"{key}.members", f"{m} is already a member of groups.{other}")
        tp = v["throughput_target"]
        out[name] = GroupConfig(
            name,
            v["members"],
            v["priority"],
            v["latency_target"],
            tp[0] if tp is not None and tp[1] == "B/s" else None,
            tp[0] if tp is not None and tp[1] == "iops" else None,
            v["resources"],
            v["utilization_target"],
            group_levels(v),
        )
    problem = over_reserved(out.values())  # Fahrrad's feasibility (config/tenancy.py)
    if problem is not None:
        raise r.fail(*problem)
    return out


def _static_map(r: _Reader, data: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    sm = data.get("static_map", {})
    if not isinstance(sm, dict):
        raise r.fail("static_map", 'must be a table: "10.0.0.0/24" = ["vg0"]')
    out: dict[str, tuple[str, ...]] = {}
    for spec, names in sm.items():
        key = f"static_map.{quote(spec)}"
        try:  # the one check of initiators' addresses (appliance/addresses.py)
            initiator_network(spec)
        except AddressError as e:
            raise r.fail(
                key, str(e).replace("is not a network", "is not an address or subnet")
            ) from None
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise r.fail(key, "must be a list of resource names")
        out[spec] = tuple(names)
    return out


def parse_controller(data: dict[str, Any], text: str, path: str) -> ControllerConfig:
    """[datapath]'s ladder and [controller] of parsed TOML (data; text for the lines of
    the errors), checked as parse_config checks them: the simulator's scenarios."""
    r = _Reader(text, path)
    return controller_config(r, r.table(data, "datapath", "datapath"), data)[0]


def load_config(path: str | Path = DEFAULT_PATH) -> Config:
    p = Path(path)
    hint = " (see docs/configure.md for an example)"
    return parse_config(read_text_file(p, MAX_CONFIG_BYTES, ConfigError, missing_hint=hint), str(p))


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def defaults() -> Config:
    """Every key at its default (no file)."""
    return parse_config("", DEFAULT_PATH)
