"""santhrottled: the daemon's command line (`santhrottled [--config F] [--check] [--version]`).

Builds the real adapters from the config (TargetSensor, the Datapath on
every egress device), installs or adopts the data path, serves the control
socket and the metrics, runs the loop until SIGTERM/SIGINT, then removes
every delay (and the static state unless daemon.keep_static_state).
SIGHUP reloads.  Exit status 2 for a bad config or command line.
Nothing imports this module: it is the process's entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from typing import Any

from santhrottle.appliance.config import DEFAULT_PATH, Config, ConfigError, load_config
from santhrottle.appliance.daemon.sdnotify import notify
from santhrottle.appliance.version import version_line

log = logging.getLogger("santhrottled")
EXIT_USAGE = 2
REQUIRED_MODULES = (
    "sch_htb", "sch_netem", "ip_set", "ip_set_hash_ip", "xt_set", "xt_bpf", "xt_multiport"
)  # fmt: skip
REQUIRED_TOOLS = ("tc", "ipset", "iptables", "iptables-restore")

EPILOG = """\
examples:
  santhrottled --check                          # preflight: root, tools, modules, devices
  santhrottled --config /etc/santhrottle/santhrottle.toml
  systemctl start santhrottled                  # what the unit runs (santhrottled(8))

The configuration keys are in santhrottle.toml(5) and docs/configure.md.
"""


def build_datapath(cfg: Config) -> Any:
    from santhrottle.appliance.datapath import Datapath, DatapathSpec

    return Datapath(DatapathSpec.from_config(cfg), netns=cfg.netns)


def build_sensors(cfg: Config) -> Any:
    from santhrottle.appliance.sensing.target import TargetSensor

    return TargetSensor(
        ports=cfg.ports,
        netns=cfg.netns,
        declared={n: r.devices for n, r in cfg.resources.items() if r.devices},
        static_map=cfg.static_map,
        snapshot_reuse_s=cfg.controller.tick_s,
    )


def check(cfg: Config) -> int:
    """Preflight: permissions, tools, kernel modules, devices. 0 = ready."""
    from santhrottle.appliance.datapath import module_available

    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("not root: needs CAP_NET_ADMIN for tc/ipset/iptables and configfs")
    for tool in REQUIRED_TOOLS:
        if not shutil.which(tool):
            problems.append(f"{tool} not found in PATH")
    for mod in REQUIRED_MODULES:
        if mod == "sch_netem" and cfg.leaf != "netem":
            continue
        have = module_available(mod)
        if have is False:
            problems.append(f"kernel module {mod} is not available")
        elif have is None:
            print(f"santhrottled --check: cannot tell whether {mod} is available (no module tree)")
    if not cfg.devices:
        problems.append(f"{cfg.path}: datapath.devices is empty: name the egress device(s)")
    for dev in cfg.devices:
        if not cfg.netns and not os.path.exists(f"/sys/class/net/{dev}"):
            problems.append(f"datapath.devices: no network device {dev!r}")
    for p in problems:
        print(f"santhrottled --check: {p}", file=sys.stderr)
    if not problems:
        print(f"santhrottled --check: ready ({cfg.path}, devices {', '.join(cfg.devices)})")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="santhrottled",
        description="Keep shared storage read latency under its threshold by delaying the "
        "packets of write-heavy initiators.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--config", default=DEFAULT_PATH, help="configuration file (default %(default)s)"
    )
    ap.add_argument("--check", action="store_true", help="verify modules, permissions, config")
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    ap.add_argument("--version", action="version", version=version_line("santhrottled"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"santhrottled: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        return check(cfg)
    if not cfg.devices:
        print(f"santhrottled: {cfg.path}: datapath.devices is empty", file=sys.stderr)
        return EXIT_USAGE
    return serve(cfg)


def serve(cfg: Config) -> int:
    from prometheus_client import start_http_server

    from santhrottle.appliance.daemon.control import ControlServer
    from santhrottle.appliance.daemon.loop import Daemon
    from santhrottle.appliance.daemon.member_counters import MemberCounterReader
    from santhrottle.appliance.daemon.metrics import registry_for
    from santhrottle.appliance.datapath import DatapathError

    try:
        datapath = build_datapath(cfg)
        log.info("datapath: %s", datapath.apply().summary())
    except DatapathError as e:
        print(f"santhrottled: {e}", file=sys.stderr)
        return 1
    daemon = Daemon(cfg, build_sensors(cfg), datapath, load_config=load_config, notify=notify)
    server = ControlServer(cfg.control_socket, daemon.handle, cfg.socket_mode)
    server.start()
    if cfg.metrics_port:
        # the member counters through their own read-only netlink socket, per scrape
        registry = registry_for(daemon, MemberCounterReader(cfg.netns))
        start_http_server(cfg.metrics_port, cfg.metrics_address, registry=registry)

    def on_term(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        daemon.stop()

    def on_hup(_signum: int, _frame: Any) -> None:
        def reload() -> None:
            try:
                daemon.reload()
            except Exception as e:
                log.error("%s", e)

        threading.Thread(target=reload, name="reload", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_hup)
    try:
        daemon.run()
    finally:
        daemon.shutdown()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
