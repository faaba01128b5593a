"""`santhrottle meter`: what each group used, per period, and what it costs.

What it owns
    The report of the meter the daemon keeps in daemon.state_dir
    (daemon/core/meterstore.py): per group and per period (the store's,
    `[metering] period`, or a day, a month, or everything: --by), the seconds
    at each level of each of its Levels, its IOs and bytes, the
    initiator-seconds it was delayed, and the cost: each level-second at the
    level's cap times `[metering] price_per_iops_hour` / 3600 (IOPS levels)
    or its cap in MiB/s times `price_per_mib_s_hour` / 3600 (bandwidth
    levels). It reads the files, not the daemon: a report works with the
    daemon stopped; the current period is the last convergence's.
    --since T: periods that end after T (an ISO date or time, UTC unless it
    says otherwise, or a duration before now: 24h, 90m).

Worked example
    [metering] price_per_iops_hour = 0.0001; gold spent 2,950 s at 600 IOPS and
    650 s at 1,200 in the hour from 09:00: its cost is (2950 x 600 + 650 x
    1200) x 0.0001 / 3600 = 0.0708, printed as
      2026-11-28 09:00  gold  iops 600:2950s 1200:650s  ...  0.0708
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from santhrottle.appliance.cli.common import JSON_HELP, CliError, Failed, emit, path_arg, verb
from santhrottle.appliance.config import DEFAULT_PATH, Config, ConfigError, defaults, load_config
from santhrottle.appliance.daemon.core.meter import Usage
from santhrottle.appliance.daemon.core.meterstore import MeterStore
from santhrottle.appliance.units import UnitError, parse_duration_s

MIB = 1024.0 * 1024.0
BY = ("period", "day", "month", "all")

EPILOG = """\
examples:
  santhrottle meter                         # every period kept, per group
  santhrottle meter --since 24h             # the last day
  santhrottle meter --since 2026-11-01 --by month --csv > november.csv
  santhrottle meter --json | jq '.data.totals'

The daemon writes its meter after every convergence (daemon.state_dir: meter.json,
meter/YYYY-MM.jsonl): a report needs no daemon, and a kill -9 loses at most one
convergence of usage. Prices: [metering] price_per_iops_hour and price_per_mib_s_hour
(docs/levels.md). --json prints {"protocol": N, "data": {"since", "by", "prices",
"periods": [...], "totals": {...}}}.
"""


def since_of(text: str, now: float | None = None) -> float:
    """--since: an ISO date or time (UTC unless it says otherwise) or a duration ago."""
    now = time.time() if now is None else now
    try:
        return now - parse_duration_s(text)
    except UnitError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: an ISO date or time (2026-11-28, 2026-11-28T09:00) "
            "or a duration before now (24h, 90m)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def _config(path: str) -> Config:
    if path == DEFAULT_PATH and not os.path.lexists(path):
        return defaults()
    try:
        return load_config(path)
    except ConfigError as e:
        raise CliError(str(e)) from None


def cost_of(u: Usage, cfg: Config) -> float:
    """The level-seconds at the prices of [metering]."""
    m = cfg.metering
    total = 0.0
    for name, caps in u.level_s.items():
        per_hour = m.price_per_mib_s_hour / MIB if "bandwidth" in name else m.price_per_iops_hour
        total += sum(float(cap) * s for cap, s in caps.items()) * per_hour / 3600.0
    return total


def _bucket(start: float, end: float, by: str) -> tuple[float, float]:
    if by == "period":
        return start, end
    if by == "all":
        return -math.inf, math.inf
    t = dt.datetime.fromtimestamp(start, dt.UTC)
    lo = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if by == "month":
        lo = lo.replace(day=1)
        hi = (lo + dt.timedelta(days=32)).replace(day=1)
    else:
        hi = lo + dt.timedelta(days=1)
    return lo.timestamp(), hi.timestamp()


def report(
    cfg: Config, since: float, by: str, rows: Iterable[tuple[float, float, str, Usage]]
) -> dict[str, Any]:
    """The data --json prints: periods (per bucket and group) and totals per group."""
    buckets: dict[tuple[float, float, str], Usage] = {}
    totals: dict[str, Usage] = {}
    for start, end, g, u in rows:
        key = (*_bucket(start, end, by), g)
        for target in (buckets.setdefault(key, Usage()), totals.setdefault(g, Usage())):
            target.add(u)
    periods = [
        {"start": _iso(a), "end": _iso(b), "group": g, **u.to_json(), "cost": cost_of(u, cfg)}
        for (a, b, g), u in sorted(buckets.items())
    ]
    return {
        "since": _iso(since),
        "by": by,
        "prices": {
            "per_iops_hour": cfg.metering.price_per_iops_hour,
            "per_mib_s_hour": cfg.metering.price_per_mib_s_hour,
        },
        "periods": periods,
        "totals": {g: {**u.to_json(), "cost": cost_of(u, cfg)} for g, u in sorted(totals.items())},
    }


def _iso(t: float) -> str | None:
    if not math.isfinite(t) or t <= 0:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _levels_text(doc: dict[str, Any]) -> str:
    parts = []
    for name, caps in doc["level_seconds"].items():
        items = sorted(caps.items(), key=lambda kv: float(kv[0]))
        cells = " ".join(f"{_cap(name, c)}:{s:.0f}s" for c, s in items)
        parts.append(f"{name} {cells}")
    return "; ".join(parts) or "-"


def _cap(name: str, cap: str) -> str:
    return f"{float(cap) / 1e6:g}MB/s" if "bandwidth" in name else f"{float(cap):g}"


def _row(when: str, g: str, doc: dict[str, Any]) -> str:
    delayed = sum(doc["delay_seconds"].values())
    return (
        f"{when:<17} {g:<16} {doc['ios']:>12.0f} {doc['bytes'] / 1e9:>9.2f} "
        f"{delayed:>10.1f} {doc['cost']:>10.4f}  {_levels_text(doc)}"
    )


def print_report(data: dict[str, Any]) -> None:
    if not data["periods"]:
        print("no usage metered" + (f" since {data['since']}" if data["since"] else ""))
        return
    print(
        f"{'PERIOD (UTC)':<17} {'GROUP':<16} {'IOS':>12} {'GB':>9} {'DELAYED_S':>10} "
        f"{'COST':>10}  LEVEL-SECONDS"
    )
    for p in data["periods"]:
        when = "all" if p["start"] is None else p["start"][:16].replace("T", " ")
        print(_row(when, p["group"], p))
    for g, t in data["totals"].items():
        print(_row("total", g, t))
    print(
        "DELAYED_S: initiator-seconds at any class above 0; COST: the level-seconds at "
        f"{data['prices']['per_iops_hour']:g} per IOPS-hour and "
        f"{data['prices']['per_mib_s_hour']:g} per MiB/s-hour ([metering])"
    )


def write_csv(data: dict[str, Any]) -> None:
    """One row per period and group; a column per (levels, cap) seen."""
    keys = sorted(
        {(n, c) for p in data["periods"] for n, caps in p["level_seconds"].items() for c in caps},
        key=lambda k: (k[0], float(k[1])),
    )
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(
        ["start", "end", "group", "ios", "bytes", "delayed_seconds", "cost"]
        + [f"{n}@{c}_seconds" for n, c in keys]
    )
    for p in data["periods"]:
        w.writerow(
            [
                p["start"] or "",
                p["end"] or "",
                p["group"],
                round(p["ios"]),
                round(p["bytes"]),
                round(sum(p["delay_seconds"].values()), 3),
                round(p["cost"], 6),
            ]
            + [round(p["level_seconds"].get(n, {}).get(c, 0.0), 3) for n, c in keys]
        )


def cmd_meter(args: argparse.Namespace) -> int:
    cfg = _config(args.config)
    store = MeterStore(args.state_dir or cfg.state_dir)
    if not store.dir.is_dir():  # a mistyped --state-dir is not "no usage"
        raise Failed(f"cannot read the meter in {store.dir}: no such directory")
    try:
        rows = list(store.periods(args.since))
    except OSError as e:
        raise Failed(f"cannot read the meter in {store.dir}: {e.strerror or e}") from None
    except ValueError as e:  # meter.json that does not read (MeterError: one line)
        raise Failed(str(e)) from None
    data = report(cfg, args.since, args.by, rows)
    if store.skipped:
        print(f"santhrottle: {store.skipped} line(s) of the meter's log skipped", file=sys.stderr)
    if args.csv:
        write_csv(data)
        return 0
    return emit(args, data, print_report)


def add_commands(sub: Any) -> None:
    p = verb(sub, "meter", "what each group used per period, and its cost", EPILOG)
    p.add_argument(
        "--since",
        type=since_of,
        default=0.0,
        metavar="T",
        help="periods ending after T: 2026-11-28, 2026-11-28T09:00 (UTC), 24h",
    )
    p.add_argument(
        "--by",
        choices=BY,
        default="period",
        help="one row per group and period (default), day, month, or all",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help=JSON_HELP)
    out.add_argument("--csv", action="store_true", help="print CSV, one row per period and group")
    p.add_argument(
        "--config",
        default=DEFAULT_PATH,
        type=path_arg("--config"),
        help="configuration: daemon.state_dir and [metering]'s prices (default "
        "%(default)s, when it exists)",
    )
    p.add_argument(
        "--state-dir",
        type=path_arg("--state-dir"),
        default=None,
        help="read the meter here, not in the configuration's daemon.state_dir",
    )
    p.set_defaults(func=cmd_meter)
