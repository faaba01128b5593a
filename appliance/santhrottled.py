"""santhrottled: the daemon's command line (`santhrottled [--config F] [--check]`).

Builds the real adapters from the config (TargetSensor, one Datapath per
egress device), installs or adopts the data path, serves the control
socket and the metrics, runs the loop until SIGTERM/SIGINT, then removes
every delay (and the static state unless daemon.keep_static_state).
SIGHUP reloads. Exit status 2 for a bad config or command line.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from santhrottle.appliance.config import DEFAULT_PATH, Config, ConfigError, load_config
from santhrottle.appliance.sdnotify import notify

log = logging.getLogger("santhrottled")
EXIT_USAGE = 2
REQUIRED_MODULES = ("sch_htb", "sch_netem", "ip_set", "ip_set_hash_ip", "xt_set")
REQUIRED_TOOLS = ("tc", "ipset", "iptables", "iptables-restore")


class Actuators:
    """The data path on every configured egress device; the sets and rules are shared."""

    def __init__(self, datapaths: list[Any]) -> None:
        self.datapaths = datapaths
        if datapaths:  # the first one drives the shared sets and every device's glide leaves
            datapaths[0].glide_devices = [dp.device for dp in datapaths]

    def apply(self) -> Any:
        return [dp.apply() for dp in self.datapaths]

    def set_classes(
        self, classes: Mapping[str, int], mode: str | None = None, *, ordered: bool = True
    ) -> int:
        n: int = self.datapaths[0].set_classes(classes, mode, ordered=ordered)
        return n

    def settle(self) -> int:
        n: int = self.datapaths[0].settle()
        return n

    @property
    def glided(self) -> int:
        return int(self.datapaths[0].glided)

    @property
    def unordered_moves(self) -> int:
        return int(self.datapaths[0].unordered_moves)

    def cleanup(self) -> Any:
        return [dp.cleanup() for dp in self.datapaths]


def build_datapaths(cfg: Config) -> Actuators:
    from santhrottle.appliance.datapath import Datapath, parse_rate_bits

    return Actuators(
        [
            Datapath(
                dev,
                cfg.ports,
                cfg.step_s,
                cfg.max_class,
                parse_rate_bits(cfg.link_speed),
                cfg.write_mode,
                netns=cfg.netns,
                leaf=cfg.leaf,
                glide_leaves=cfg.glide_leaves,
            )
            for dev in cfg.devices
        ]
    )


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="santhrottled",
        description="Keep shared storage read latency under its threshold by delaying the "
        "packets of write-heavy initiators.",
    )
    ap.add_argument("--config", default=str(DEFAULT_PATH), help=f"default {DEFAULT_PATH}")
    ap.add_argument("--check", action="store_true", help="verify modules, permissions, config")
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = ap.parse_args(argv)
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

    from santhrottle.appliance.control import ControlServer
    from santhrottle.appliance.daemon import Daemon
    from santhrottle.appliance.datapath import DatapathError
    from santhrottle.appliance.metrics import registry_for

    actuators = build_datapaths(cfg)
    try:
        for report in actuators.apply():
            log.info("datapath: %s", report.summary())
    except DatapathError as e:
        print(f"santhrottled: {e}", file=sys.stderr)
        return 1
    daemon = Daemon(cfg, build_sensors(cfg), actuators, load_config=load_config, notify=notify)
    server = ControlServer(cfg.control_socket, daemon.handle, cfg.socket_mode)
    server.start()
    if cfg.metrics_port:
        start_http_server(cfg.metrics_port, cfg.metrics_address, registry=registry_for(daemon))

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
