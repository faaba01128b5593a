"""santhrottled's configuration: TOML (stdlib tomllib), validated whole, errors with key and line.

Default path /etc/santhrottle/santhrottle.toml. Every value with a unit is
written with it (`threshold = "15ms"`, `write_heavy_enter = "1MiB/s"`). An
invalid file raises ConfigError naming the key and its line
(`santhrottle.toml:12: resources.vg0.threshold: '15' is not a duration...`);
the daemon keeps its last good config when a reload fails.

Example (docs/daemon.md has every key with its default):

    [datapath]
    devices = ["eth1"]
    write_mode = "all"
    max_delay = "50ms"

    [resources.vg_aic]
    threshold = "15ms"
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from santhrottle.appliance.datapath import (
    DEFAULT_GLIDE_LEAVES,
    MAX_GLIDE_LEAVES,
    DatapathError,
    parse_rate_bits,
)
from santhrottle.appliance.units import UnitError, parse_duration_s, parse_rate_bps
from santhrottle.controller.domain import ControllerConfig, PidGains

DEFAULT_PATH = Path("/etc/santhrottle/santhrottle.toml")
WRITE_MODES = ("all", "ack")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class ConfigError(ValueError):
    """One line: file, line, key, problem."""


@dataclass(frozen=True)
class ResourceConfig:
    name: str
    threshold_s: float | None  # None: measured, never throttled
    devices: tuple[str, ...] = ()  # declared resource: these block devices


@dataclass(frozen=True)
class Config:
    path: str = str(DEFAULT_PATH)
    # [daemon]
    control_socket: str = "/run/santhrottle/control.sock"
    socket_mode: int = 0o600
    netns: str | None = None
    keep_static_state: bool = False
    # [datapath]
    devices: tuple[str, ...] = ()
    ports: tuple[int, ...] = (3260, 4420)
    write_mode: str = "all"
    step_s: float = 0.0005
    max_delay_s: float = 0.050
    link_speed: str = "25gbit"
    leaf: str = "netem"
    glide_leaves: int = DEFAULT_GLIDE_LEAVES
    # [controller]
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    default_threshold_s: float | None = None
    # [resources.NAME], [static_map]
    resources: dict[str, ResourceConfig] = field(default_factory=dict)
    static_map: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # [metrics]
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9753

    @property
    def max_class(self) -> int:
        return round(self.max_delay_s / self.step_s)

    def threshold_of(self, resource: str) -> float | None:
        rc = self.resources.get(resource)
        if rc is not None and rc.threshold_s is not None:
            return rc.threshold_s
        return self.default_threshold_s


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

    def table(self, data: dict[str, Any], key: str, allowed: set[str]) -> dict[str, Any]:
        t = data.get(key, {})
        if not isinstance(t, dict):
            raise self.fail(key, "must be a table")
        for k in t:
            if k not in allowed:
                raise self.fail(f"{key}.{k}", f"unknown key (known: {', '.join(sorted(allowed))})")
        return t

    def duration(self, t: dict[str, Any], table: str, key: str, default: float) -> float:
        if key not in t:
            return default
        try:
            v = parse_duration_s(t[key]) if isinstance(t[key], str) else None
        except UnitError as e:
            raise self.fail(f"{table}.{key}", str(e)) from None
        if v is None:
            raise self.fail(f"{table}.{key}", f'{t[key]!r} is not a duration: write e.g. "15ms"')
        return v

    def rate(self, t: dict[str, Any], table: str, key: str, default: float) -> float:
        if key not in t:
            return default
        if not isinstance(t[key], str):
            raise self.fail(f"{table}.{key}", f'{t[key]!r} is not a rate: write e.g. "1MiB/s"')
        try:
            return parse_rate_bps(t[key])
        except UnitError as e:
            raise self.fail(f"{table}.{key}", str(e)) from None

    def number(
        self, t: dict[str, Any], table: str, key: str, default: float, lo: float, hi: float
    ) -> float:
        v = t.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise self.fail(f"{table}.{key}", f"must be a number within [{lo:g}, {hi:g}]")
        return float(v)

    def integer(
        self, t: dict[str, Any], table: str, key: str, default: int, lo: int, hi: int
    ) -> int:
        v = t.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(f"{table}.{key}", f"must be a whole number within [{lo}, {hi}]")
        return v


def parse_config(text: str, path: str = str(DEFAULT_PATH)) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    r = _Reader(text, path)
    top_keys = {"daemon", "datapath", "controller", "resources", "static_map", "metrics"}
    for k in data:
        if k not in top_keys:
            raise r.fail(k, f"unknown table (known: {', '.join(sorted(top_keys))})")

    d = r.table(data, "daemon", {"control_socket", "socket_mode", "netns", "keep_static_state"})
    mode = d.get("socket_mode", "0600")
    if not isinstance(mode, str) or not re.fullmatch(r"0?[0-7]{3}", mode):
        raise r.fail("daemon.socket_mode", 'must be an octal string such as "0600"')
    sock = d.get("control_socket", Config.control_socket)
    if not isinstance(sock, str) or not sock.startswith("/"):
        raise r.fail("daemon.control_socket", "must be an absolute path")
    netns = d.get("netns")
    if netns is not None and (not isinstance(netns, str) or not NAME.match(netns)):
        raise r.fail("daemon.netns", "must be a network namespace name")
    keep = d.get("keep_static_state", False)
    if not isinstance(keep, bool):
        raise r.fail("daemon.keep_static_state", "must be true or false")

    p = r.table(
        data,
        "datapath",
        {
            "devices",
            "ports",
            "write_mode",
            "step",
            "max_delay",
            "link_speed",
            "leaf",
            "glide_leaves",
        },
    )
    devices = p.get("devices", [])
    if not isinstance(devices, list) or not all(
        isinstance(x, str) and NAME.match(x) for x in devices
    ):
        raise r.fail("datapath.devices", "must be a list of interface names")
    ports = p.get("ports", [3260, 4420])
    if (
        not isinstance(ports, list)
        or not ports
        or not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 65536 for x in ports)
    ):
        raise r.fail("datapath.ports", "must be a list of TCP ports (1-65535)")
    wmode = p.get("write_mode", "all")
    if wmode not in WRITE_MODES:
        raise r.fail("datapath.write_mode", f"must be one of {', '.join(WRITE_MODES)}")
    step_s = r.duration(p, "datapath", "step", 0.0005)
    max_delay_s = r.duration(p, "datapath", "max_delay", 0.050)
    if not 1e-5 <= step_s <= 0.1:
        raise r.fail("datapath.step", "must be within 10us..100ms")
    if not step_s <= max_delay_s <= 2.0 or round(max_delay_s / step_s) > 4000:
        raise r.fail("datapath.max_delay", "must be within step..2s and at most 4000 steps")
    leaf = p.get("leaf", "netem")
    if leaf not in ("netem", "pfifo"):
        raise r.fail("datapath.leaf", 'must be "netem" (or "pfifo": classify without delay)')
    glides = r.integer(p, "datapath", "glide_leaves", DEFAULT_GLIDE_LEAVES, 0, MAX_GLIDE_LEAVES)
    link = p.get("link_speed", "25gbit")
    try:
        parse_rate_bits(link if isinstance(link, str) else "")
    except DatapathError as e:
        raise r.fail("datapath.link_speed", str(e)) from None

    c = r.table(
        data,
        "controller",
        {
            "tick",
            "converge",
            "kp_class_per_rel_error",
            "ti",
            "td",
            "setpoint_fraction",
            "class_hysteresis",
            "class_decrease_max_per_tick",
            "class_increase_max_ratio_per_tick",
            "class_increase_min_per_tick",
            "read_ewma_tau",
            "write_ewma_tau",
            "write_heavy_enter",
            "write_heavy_leave",
            "read_idle_release",
            "default_threshold",
        },
    )
    dc = ControllerConfig()
    tick_s = r.duration(c, "controller", "tick", dc.tick_s)
    if not 0.01 <= tick_s <= 10.0:
        raise r.fail("controller.tick", "must be within 10ms..10s")
    converge_s = r.duration(c, "controller", "converge", dc.converge_s)
    if not tick_s <= converge_s <= 60.0:
        raise r.fail("controller.converge", "must be within tick..60s")
    ti_s = r.duration(c, "controller", "ti", dc.gains.ti_s)
    if ti_s <= 0:
        raise r.fail("controller.ti", "must be > 0")
    enter = r.rate(c, "controller", "write_heavy_enter", dc.write_heavy_enter_bps)
    leave = r.rate(c, "controller", "write_heavy_leave", dc.write_heavy_leave_bps)
    if not leave < enter:
        raise r.fail("controller.write_heavy_leave", "must be below write_heavy_enter")
    wtau = r.duration(c, "controller", "write_ewma_tau", dc.write_ewma_tau_s)
    if wtau <= 0:
        raise r.fail("controller.write_ewma_tau", "must be > 0")
    ratio = r.number(
        c,
        "controller",
        "class_increase_max_ratio_per_tick",
        dc.class_increase_max_ratio_per_tick,
        0.0,
        100.0,
    )
    if 0.0 < ratio < 1.0:
        raise r.fail("controller.class_increase_max_ratio_per_tick", "must be 0 (no limit) or >= 1")
    controller = ControllerConfig(
        tick_s=tick_s,
        converge_s=converge_s,
        max_class=round(max_delay_s / step_s),
        gains=PidGains(
            kp_class_per_rel_error=r.number(
                c, "controller", "kp_class_per_rel_error", dc.gains.kp_class_per_rel_error, 0.0, 1e6
            ),
            ti_s=ti_s,
            td_s=r.duration(c, "controller", "td", dc.gains.td_s),
        ),
        setpoint_fraction=r.number(
            c, "controller", "setpoint_fraction", dc.setpoint_fraction, 0.1, 1.0
        ),
        class_hysteresis=r.number(
            c, "controller", "class_hysteresis", dc.class_hysteresis, 0.0, 1000.0
        ),
        class_decrease_max_per_tick=r.integer(
            c, "controller", "class_decrease_max_per_tick", dc.class_decrease_max_per_tick, 0, 1000
        ),
        class_increase_max_ratio_per_tick=ratio,
        class_increase_min_per_tick=r.integer(
            c, "controller", "class_increase_min_per_tick", dc.class_increase_min_per_tick, 1, 1000
        ),
        read_ewma_tau_s=r.duration(c, "controller", "read_ewma_tau", dc.read_ewma_tau_s),
        write_ewma_tau_s=wtau,
        write_heavy_enter_bps=enter,
        write_heavy_leave_bps=leave,
        read_idle_release_s=r.duration(
            c, "controller", "read_idle_release", dc.read_idle_release_s
        ),
    )
    default_thr = (
        r.duration(c, "controller", "default_threshold", 0.0) if "default_threshold" in c else None
    )
    if default_thr is not None and default_thr <= 0:
        raise r.fail("controller.default_threshold", "must be > 0")

    res_table = data.get("resources", {})
    if not isinstance(res_table, dict):
        raise r.fail("resources", "must be a table of [resources.NAME] tables")
    resources: dict[str, ResourceConfig] = {}
    for name, rt in res_table.items():
        key = f"resources.{name}"
        if not NAME.match(name):
            raise r.fail(key, "resource names are letters, digits and _ . + -")
        if not isinstance(rt, dict):
            raise r.fail(key, "must be a table with threshold and optional devices")
        for k in rt:
            if k not in ("threshold", "devices"):
                raise r.fail(f"{key}.{k}", "unknown key (known: devices, threshold)")
        thr = None
        if "threshold" in rt:
            try:
                thr = parse_duration_s(rt["threshold"]) if isinstance(rt["threshold"], str) else -1
            except UnitError as e:
                raise r.fail(f"{key}.threshold", str(e)) from None
            if thr <= 0:
                raise r.fail(f"{key}.threshold", 'must be a positive duration such as "15ms"')
        devs = rt.get("devices", [])
        if not isinstance(devs, list) or not all(
            isinstance(x, str) and NAME.match(x) for x in devs
        ):
            raise r.fail(f"{key}.devices", 'must be a list of block device names ("sdb", "dm-3")')
        resources[name] = ResourceConfig(name, thr, tuple(devs))

    sm = data.get("static_map", {})
    if not isinstance(sm, dict):
        raise r.fail("static_map", 'must be a table: "10.0.0.0/24" = ["vg0"]')
    static_map: dict[str, tuple[str, ...]] = {}
    for spec, names in sm.items():
        key = f'static_map."{spec}"'
        try:
            ipaddress.ip_network(spec, strict=False)
        except ValueError:
            raise r.fail(key, f"{spec!r} is not an address or subnet") from None
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise r.fail(key, "must be a list of resource names")
        static_map[spec] = tuple(names)

    m = r.table(data, "metrics", {"address", "port"})
    addr = m.get("address", "127.0.0.1")
    try:
        ipaddress.ip_address(addr)
    except (ValueError, TypeError):
        raise r.fail("metrics.address", f"{addr!r} is not an IP address") from None
    port = m.get("port", 9753)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise r.fail("metrics.port", "must be a TCP port (0 disables the exporter)")

    return Config(
        path=path,
        control_socket=sock,
        socket_mode=int(mode, 8),
        netns=netns,
        keep_static_state=keep,
        devices=tuple(devices),
        ports=tuple(ports),
        write_mode=wmode,
        step_s=step_s,
        max_delay_s=max_delay_s,
        link_speed=link,
        leaf=leaf,
        glide_leaves=glides,
        controller=controller,
        default_threshold_s=default_thr,
        resources=resources,
        static_map=static_map,
        metrics_address=addr,
        metrics_port=port,
    )


def load_config(path: str | Path = DEFAULT_PATH) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file (see docs/daemon.md for an example)") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    return parse_config(text, str(p))
