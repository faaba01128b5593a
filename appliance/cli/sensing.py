"""`santhrottle resources` and `santhrottle initiators`: what discovery sees, measured now.

They run one sensing pass over --interval seconds on this host (no daemon
needed), so an admin can check discovery before enabling throttling.  They
see what the daemon would: the configuration file, when there is one, gives
the storage ports, the declared resources, the static map and the target's
network namespace (sock_diag runs inside it).  In bridge mode (the
configuration's daemon.mode) they list what the wire shows instead: cli/wire.py.

A bad --interval or --config is exit 2; kernel state that cannot be read is
exit 1 (cli/common.py, EXIT_CODES).

Worked example
    `santhrottle resources --interval 0.5 --json` measures for 0.5 s and prints
    {"protocol": 2, "data": [{"resource": "vg0", "devices": ["dm-0"], ...}]}.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from santhrottle.appliance.cli import wire
from santhrottle.appliance.cli.common import (
    JSON_HELP,
    CliError,
    Failed,
    column_width,
    emit,
    ip_key,
    number,
    path_arg,
    verb,
)
from santhrottle.appliance.config import DEFAULT_PATH, Config, ConfigError, load_config
from santhrottle.appliance.sensing.target import TargetSensor
from santhrottle.appliance.units import fmt_mb, fmt_ms

EPILOG = """\
examples:
  santhrottle resources                 # VGs, their devices, read latency, write rate
  santhrottle initiators --interval 2   # who loads which VG, and how much they write
  santhrottle initiators --json | jq '.data[] | select(.resources | length > 1)'
  santhrottle resources --config /etc/santhrottle/santhrottle.toml
                                        # ports, declared resources, static map, netns from it
  santhrottle resources --json | jq '.data[].resource'

In bridge mode (daemon.mode = "bridge" in the configuration) they list what
the wire shows: resources, every volume as the configuration names it
(iscsi://PORTAL/IQN/LUN, nvme://PORTAL/NQN/NSID), its initiators and read
latency; from santhrottled when it runs, else measured on the array-side
port over --interval (docs/bridge.md).

Read latency is the read-weighted mean over the resource's devices that had
reads in the interval; write rates come from LIO's per-ACL counters or from
the LUN's block device (docs/sensing.md, "Write-rate sources").  --json prints
{"protocol": N, "data": [...]}, N the control protocol's version.
"""
# The longest --interval: one sensing pass, not a monitoring loop.
MAX_INTERVAL_S = 60.0


def _measure(args: argparse.Namespace, cfg: Config | None) -> dict[str, Any]:
    try:
        return _measure_once(args, cfg)
    except OSError as e:
        raise Failed(f"cannot read {e.filename or 'kernel state'}: {e.strerror or e}") from None


def _config(path: str) -> Config | None:
    """The configuration file, when there is one."""
    if not os.path.exists(path):
        return None
    try:
        return load_config(path)
    except ConfigError as e:
        raise CliError(str(e)) from None


def _from_config(cfg: Config | None) -> dict[str, Any]:
    """What the configuration tells the sensors (nothing when there is no file)."""
    if cfg is None:
        return {}
    return {
        "ports": cfg.ports,
        "netns": cfg.netns,
        "declared": {n: r.devices for n, r in cfg.resources.items() if r.devices},
        "static_map": cfg.static_map,
    }


def _measure_once(args: argparse.Namespace, cfg: Config | None) -> dict[str, Any]:
    sensor = TargetSensor(
        proc_root=args.proc_root,
        sys_root=args.sys_root,
        configfs_root=args.configfs_root,
        **_from_config(cfg),
    )
    sensor.converge()
    sensor.read_samples()
    time.sleep(args.interval)
    disc, writes = sensor.converge()
    reads = {r.resource: r for r in sensor.read_samples()}
    util = {u.resource: min(1.0, u.utilization) for u in sensor.utilization_samples()}
    rates = {(w.resource, w.initiator): w.write_bps for w in writes}
    resources = []
    for name, devs in sorted(disc.resources.items()):
        r = reads.get(name)
        resources.append(
            {
                "resource": name,
                "devices": list(devs),
                "reads_per_s": (r.reads / args.interval) if r else 0.0,
                "read_latency_s": (r.read_latency_s if r and r.reads else None),
                "write_bytes_per_second": r.write_bps if r and r.write_bps is not None else 0.0,
                "utilization": util.get(name),  # its busiest PV's io_ticks share
                "initiators": sorted(
                    (a for a, v in disc.initiators.items() if name in v.resources),
                    key=ip_key,
                ),
            }
        )
    host_of = {a: h.name for h in (cfg.hosts if cfg else {}).values() for a in h.addresses}
    initiators = []
    for addr, v in sorted(disc.initiators.items(), key=lambda kv: ip_key(kv[0])):
        initiators.append(
            {
                "initiator": addr,
                "host": host_of.get(addr),  # the [hosts.NAME] it is one address of
                "names": sorted(v.names),
                "resources": sorted(v.resources),
                "exports": [
                    {"protocol": e.protocol, "target": e.target, "lun": e.lun, "device": e.device}
                    for e in v.exports
                ],
                "write_bytes_per_second": {
                    res: rates.get((res, addr)) for res in sorted(v.resources)
                },
                "write_sources": dict(sorted(v.write_sources.items())),
            }
        )
    return {
        "interval_s": args.interval,
        "resources": resources,
        "initiators": initiators,
        "ambiguous": disc.ambiguous,
        "warnings": {
            "malformed_diskstats_lines": sensor.warnings.malformed_diskstats_lines,
            "lio_errors": sensor.warnings.lio_errors,
            "lio_skipped": sensor.warnings.lio_skipped,
        },
    }


def _print_resources(resources: list[dict[str, Any]], ambiguous: list[str]) -> None:
    head = ("RESOURCE", "DEVICES", "READS/s", "READ_LAT", "WR_MB/s", "UTIL")
    print(
        f"{head[0]:<16} {head[1]:<20} {head[2]:>8} {head[3]:>9} {head[4]:>8} {head[5]:>5}  "
        "INITIATORS"
    )
    for r in resources:
        u = r["utilization"]
        print(
            f"{r['resource']:<16} {','.join(r['devices']):<20} {r['reads_per_s']:>8.1f} "
            f"{fmt_ms(r['read_latency_s']):>9} {fmt_mb(r['write_bytes_per_second']):>8} "
            f"{'-' if u is None else f'{u * 100:.0f}%':>5}  {','.join(r['initiators']) or '-'}"
        )
    if not resources:
        print("no resources: no LVM volume group and none declared in config")
    for a in ambiguous:
        print(f"ambiguous: {a} (add a static map)")


def _print_initiators(initiators: list[dict[str, Any]]) -> None:
    """One line per (initiator, resource), IPv4 then IPv6; the initiator column as
    wide as its longest address; HOST (with [hosts.NAME] only) the host an address is
    one of."""
    rows = sorted(initiators, key=lambda i: ip_key(i["initiator"]))
    wa = column_width((i["initiator"] for i in rows), "INITIATOR", 18)
    wr = column_width((r for i in rows for r in i["resources"]), "RESOURCE", 16)
    hosts = any(i.get("host") for i in rows)
    wh = column_width((i.get("host") or "-" for i in rows), "HOST")
    host_head = f"{'HOST':<{wh}} " if hosts else ""
    print(f"{'INITIATOR':<{wa}} {host_head}{'RESOURCE':<{wr}} {'WR_MB/s':>8} {'SOURCE':<7} EXPORTS")
    for i in rows:
        exports = ",".join(f"{e['target']}/{e['lun']}" for e in i["exports"]) or "-"
        host = f"{i.get('host') or '-':<{wh}} " if hosts else ""
        for res in i["resources"] or ["-"]:
            rate = i["write_bytes_per_second"].get(res)
            print(
                f"{i['initiator']:<{wa}} {host}{res:<{wr}} "
                f"{fmt_mb(rate):>8} {i['write_sources'].get(res, '-'):<7} {exports}"
            )
    if not initiators:
        print("no initiators connected on the storage ports")


def cmd_resources(args: argparse.Namespace) -> int:
    """--json: {"resources": [...], "ambiguous": [...], "warnings": {...}}; in bridge
    mode {"source", "resources", "volumes", "wire"} (cli/wire.py)."""
    cfg = _config(args.config)
    if cfg is not None and cfg.bridge_mode:
        doc = wire.measure(args, cfg)
        doc.pop("initiators")
        return emit(args, doc, wire.print_resources)
    data = _measure(args, cfg)
    doc = {k: data[k] for k in ("interval_s", "resources", "ambiguous", "warnings")}
    return emit(args, doc, lambda d: _print_resources(d["resources"], d["ambiguous"]))


def cmd_initiators(args: argparse.Namespace) -> int:
    """--json: {"initiators": [...], "warnings": {...}}; in bridge mode
    {"source", "initiators", "wire"} (cli/wire.py)."""
    cfg = _config(args.config)
    if cfg is not None and cfg.bridge_mode:
        doc = wire.measure(args, cfg)
        doc.pop("resources")
        doc.pop("volumes")
        return emit(args, doc, wire.print_initiators)
    data = _measure(args, cfg)
    doc = {k: data[k] for k in ("interval_s", "initiators", "warnings")}
    return emit(args, doc, lambda d: _print_initiators(d["initiators"]))


def add_commands(sub: Any) -> None:
    for name, func, help_ in (
        ("resources", cmd_resources, "shared resources (VGs), their read latency and write rate"),
        ("initiators", cmd_initiators, "connected initiators, their resources and write rates"),
    ):
        p = verb(sub, name, help_, EPILOG, help_[:1].upper() + help_[1:] + ", over --interval s.")
        p.add_argument(
            "--interval",
            type=number("--interval", hi=MAX_INTERVAL_S, positive=True),
            default=1.0,
            metavar="S",
            help=f"seconds, above 0 and at most {MAX_INTERVAL_S:g} (default 1)",
        )
        p.add_argument("--json", action="store_true", help=JSON_HELP)
        p.add_argument(
            "--config",
            default=DEFAULT_PATH,
            type=path_arg("--config"),
            help="configuration to read ports, declared resources, static map and netns from "
            "(default %(default)s, when it exists)",
        )
        p.add_argument(
            "--proc-root", type=path_arg("--proc-root"), default="/proc", help=argparse.SUPPRESS
        )
        p.add_argument(
            "--sys-root", type=path_arg("--sys-root"), default="/sys", help=argparse.SUPPRESS
        )
        p.add_argument(
            "--configfs-root",
            type=path_arg("--configfs-root"),
            default="/sys/kernel/config",
            help=argparse.SUPPRESS,
        )
        p.set_defaults(func=func)
