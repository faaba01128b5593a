"""`santhrottle resources` and `santhrottle initiators` in bridge mode: what the wire shows.

On a bridge the resources are groups of volumes named in the configuration,
and the admin writes them from what this lists: every volume the wire has
shown (iscsi://PORTAL/IQN/LUN, nvme://PORTAL/NQN/NSID, as the file takes
them), the resources it is in, its initiators, its reads and their latency;
per resource also its utilization (the share of the time its busiest volume had a
command in flight).

Where the figures come from
    When santhrottled answers on the configuration's control socket, from
    it: it has watched the wire since its start, so it has seen the logins
    that name each volume's target (source "santhrottled"). Otherwise the
    CLI reads the array-side port itself for --interval seconds (root, the
    same sensor as the daemon's: source "measured"), with the target names a
    daemon saved before (daemon.state_dir); a session that logged in before
    and is named nowhere shows its target as "*", which the configuration
    accepts too ("any target at that portal").

Worked example
    `santhrottle resources --json` on a bridge with santhrottled running:
    {"protocol": 2, "data": {"source": "santhrottled", "resources": [{"resource":
    "array1", ...}], "volumes": [{"volume": "iscsi://10.0.0.5:3260/iqn...:sn1/0",
    "resources": ["array1"], "initiators": ["10.0.0.21"], "reads_per_s": 812.0,
    "read_latency_s": 0.0041}]}}.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from santhrottle.appliance.cli.common import Failed, column_width, ip_key
from santhrottle.appliance.config import Config
from santhrottle.appliance.daemon.control.client import request
from santhrottle.appliance.daemon.control.requests import (
    DaemonAbsent,
    DaemonUnavailable,
    RemoteError,
)
from santhrottle.appliance.units import fmt_mb, fmt_ms


def measure(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    """The daemon's view when it answers, else one pass over --interval."""
    try:
        return _from_daemon(cfg)
    except DaemonAbsent:
        pass
    except (DaemonUnavailable, RemoteError) as e:
        raise Failed(str(e)) from None
    try:
        return _measured(args, cfg)
    except OSError as e:
        raise Failed(f"cannot capture on {cfg.array_port}: {e.strerror or e}") from None


def _from_daemon(cfg: Config) -> dict[str, Any]:
    volumes = request(cfg.control_socket, "volumes")
    st = request(cfg.control_socket, "status")
    tick_s = st["tick_s"]
    configured = cfg.volumes()
    resources = [
        {
            "resource": r["resource"],
            "volumes": list(configured.get(r["resource"], ())),
            "reads_per_s": r["reads"] / tick_s,
            "read_latency_s": r["read_latency_s"],
            "write_bytes_per_second": r["write_bytes_per_second"] or 0.0,
            "utilization": r.get("utilization"),  # its last convergence's
            "initiators": sorted(  # every address, a [hosts.NAME]'s too
                (
                    a
                    for i in st["initiators"]
                    if r["resource"] in i["resources"]
                    for a in i.get("addresses") or [i["initiator"]]
                ),
                key=ip_key,
            ),
        }
        for r in st["resources"]
    ]
    initiators = [
        {
            "initiator": i["initiator"],
            "addresses": i.get("addresses") or [i["initiator"]],
            "resources": i["resources"],
            "volumes": sorted(  # a [hosts.NAME]'s row: the volumes of any of its addresses
                v["volume"]
                for v in volumes
                if set(i.get("addresses") or [i["initiator"]]) & set(v["initiators"])
            ),
            "write_bytes_per_second": i["write_bytes_per_second"],
        }
        for i in st["initiators"]
    ]
    wire = st.get("wire") or {}
    held = set(wire.get("held") or ())
    for r in resources:
        r["held"] = r["resource"] in held
    return {
        "source": "santhrottled",
        "interval_s": tick_s,
        "resources": resources,
        "volumes": volumes,
        "initiators": initiators,
        "sync": wire.get("sync") or [],
        "wire": st.get("wire"),
    }


def _measured(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    from santhrottle.appliance.sensing.bridge import BridgeSensor
    from santhrottle.appliance.sensing.wirenames import NAMES_FILE

    sensor = BridgeSensor(
        port=str(cfg.array_port),
        resources=cfg.volumes(),
        netns=cfg.netns,
        # the names santhrottled learnt from the logins, read only
        names_path=os.path.join(cfg.state_dir, NAMES_FILE),
        save_names=False,
        sensor=cfg.bridge_sensor,
    )
    sensor.start()
    try:
        sensor.read_samples()
        sensor.converge()
        time.sleep(args.interval)
        reads = {r.resource: r for r in sensor.read_samples(hold=False)}
        util = {u.resource: min(1.0, u.utilization) for u in sensor.utilization_samples()}
        disc, writes = sensor.converge()
        rows = sensor.volume_rows()
        counters = sensor.counters()
        sync = [dataclasses.asdict(r) for r in sensor.sync()]
        held = sensor.held
    finally:
        sensor.close()
    rates = {(w.resource, w.initiator): w.write_bps for w in writes}
    resources = []
    for name, vols in sorted(cfg.volumes().items()):
        r = reads.get(name)
        resources.append(
            {
                "resource": name,
                "volumes": list(vols),
                "reads_per_s": r.reads / args.interval if r else 0.0,
                "read_latency_s": r.read_latency_s if r and r.reads else None,
                "write_bytes_per_second": (r.write_bps or 0.0) if r else 0.0,
                "utilization": util.get(name),  # its busiest volume's, over the interval
                "initiators": sorted(a for a, v in disc.initiators.items() if name in v.resources),
                "held": name in held,
            }
        )
    volumes = [
        {
            "volume": row.name,
            "resources": list(row.resources),
            "initiators": list(row.initiators),
            "reads_per_s": row.reads / args.interval,
            "read_latency_s": row.read_latency_s,
        }
        for row in rows
    ]
    initiators = [
        {
            "initiator": ip,
            "resources": sorted(v.resources),
            "volumes": sorted(x["volume"] for x in volumes if ip in x["initiators"]),
            "write_bytes_per_second": {res: rates.get((res, ip)) for res in sorted(v.resources)},
        }
        for ip, v in sorted(disc.initiators.items(), key=lambda kv: ip_key(kv[0]))
    ]
    return {
        "source": "measured",
        "interval_s": args.interval,
        "resources": resources,
        "volumes": volumes,
        "initiators": initiators,
        "sync": sync,
        "wire": {"capturing": True, "sensor": sensor.kind, **counters},
    }


def print_resources(d: dict[str, Any]) -> None:
    print(f"from {_source(d)}")
    print(
        f"{'RESOURCE':<16} {'VOLUMES':>7} {'READS/s':>8} {'READ_LAT':>9} {'WR_MB/s':>8} "
        f"{'UTIL':>5} {'SYNC':<5} INITIATORS"
    )
    for r in d["resources"]:
        u = r.get("utilization")
        print(
            f"{r['resource']:<16} {len(r['volumes']):>7} {r['reads_per_s']:>8.1f} "
            f"{fmt_ms(r['read_latency_s']):>9} {fmt_mb(r['write_bytes_per_second']):>8} "
            f"{'-' if u is None else f'{u * 100:.0f}%':>5} "
            f"{'held' if r.get('held') else 'ok':<5} {','.join(r['initiators']) or '-'}"
        )
    if not d["resources"]:
        print("no resources configured: name them from the volumes below ([resources.NAME])")
    print()
    print(f"{'READS/s':>8} {'READ_LAT':>9}  {'RESOURCES':<16} {'INITIATORS':<24} VOLUME")
    for v in d["volumes"]:
        print(
            f"{v['reads_per_s']:>8.1f} {fmt_ms(v['read_latency_s']):>9}  "
            f"{','.join(v['resources']) or '-':<16} {','.join(v['initiators']) or '-':<24} "
            f"{v['volume']}"
        )
    if not d["volumes"]:
        print("no volumes: no iSCSI or NVMe/TCP command crossed the bridge")
    print_sync(d.get("sync") or [], (d.get("wire") or {}).get("directions"))


def print_sync(rows: list[dict[str, Any]], directions: dict[str, int] | None = None) -> None:
    """The connection directions not in sync, and those not measurable (held: a
    resource most of whose connections are out of sync holds its class); directions:
    the daemon's count of them all by state (its status lists the first 256)."""
    off = [r for r in rows if r["state"] != "in sync"]
    total = sum(directions.values()) if directions else len(rows)
    synced = directions.get("in sync", 0) if directions else len(rows) - len(off)
    print()
    print(f"{synced} of {total} connection directions in sync")
    if total - synced > len(off):
        print(f"(the {len(off)} longest out of sync below)")
    if not off:
        return
    print(f"{'STATE':<15} {'OUT_s':>8} {'OUT_MB':>8} {'DESYNCS':>7}  CONNECTION")
    for r in sorted(off, key=lambda r: (r["state"], -r["out_of_sync_s"])):
        why = f" ({r['reason']})" if r["reason"] else ""
        port = f":{r['initiator_port']}" if r["initiator_port"] else ""  # IPsec: none
        print(
            f"{r['state']:<15} {r['out_of_sync_s']:>8.1f} {r['out_of_sync_bytes'] / 1e6:>8.2f} "
            f"{r['desyncs']:>7}  {r['initiator']}{port} -> {r['portal']} "
            f"{r['target'] or '*'} {r['direction']}{why}"
        )
    if any(r["state"] == "not measurable" for r in off):
        print(
            "not measurable: encrypted (TLS, IPsec) or not iSCSI/NVMe/TCP on the storage port; "
            "measure those volumes on the target host instead (docs/bridge.md, Sync)"
        )


def print_initiators(d: dict[str, Any]) -> None:
    print(f"from {_source(d)}")
    rows = sorted(d["initiators"], key=lambda i: ip_key(i["initiator"]))
    names = [",".join(i.get("addresses") or [i["initiator"]]) for i in rows]
    w = column_width(names, "INITIATOR", 18)
    print(f"{'INITIATOR':<{w}} {'RESOURCE':<16} {'WR_MB/s':>8}  VOLUMES")
    for i, name in zip(rows, names, strict=True):
        for res in i["resources"] or ["-"]:
            rate = i["write_bytes_per_second"].get(res)
            print(f"{name:<{w}} {res:<16} {fmt_mb(rate):>8}  {','.join(i['volumes'])}")
    if not d["initiators"]:
        print("no initiators: no iSCSI or NVMe/TCP command crossed the bridge")


def _source(d: dict[str, Any]) -> str:
    if d["source"] == "santhrottled":
        return "santhrottled (the wire since its start; rates of its last tick)"
    return f"the wire, measured over {d['interval_s']:g} s (targets logged in before: *)"
