"""santhrottled: the daemon's command line (`santhrottled [--config F] [--check] [--version]`).

Builds the real adapters from the config (TargetSensor, the Datapath on
every egress device), takes the control socket and the metrics port,
installs or adopts the data path, restores the runtime state of the last
run (daemon/core/runtime.py), runs the loop until SIGTERM/SIGINT, then removes
every delay (and the static state unless daemon.keep_static_state).
SIGHUP reloads.

The start is all or nothing: the socket and the port are taken before the
kernel is touched (another santhrottled on the socket, or the port in use,
stops the start with the kernel as it was), and a failure once the data
path is applied removes what this start installed.  One line on stderr.

Exit status: 0 stopped cleanly, or --check found it ready; 1 the start
failed (the kernel, the socket, the port) or --check found a problem;
2 a bad configuration or command line.
Nothing imports this module: it is the process's entry point.
"""

from __future__ import annotations

import argparse
import datetime
import grp
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import time
from typing import TYPE_CHECKING, Any

from santhrottle.appliance.config import DEFAULT_PATH, Config, ConfigError, load_config
from santhrottle.appliance.daemon.sdnotify import notify
from santhrottle.appliance.textfile import printable, unsafe_directory
from santhrottle.appliance.version import version_line

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.fleetmode import FleetMode
    from santhrottle.appliance.daemon.core.metering import Metering
    from santhrottle.appliance.daemon.core.sensors import BridgeSensors, Sensors
    from santhrottle.appliance.daemon.status.build import StatusCache
    from santhrottle.appliance.daemon.status.exporter import BasicAuth, MetricsServer
    from santhrottle.appliance.datapath import Datapath

log = logging.getLogger("santhrottled")
EXIT_FAILED = 1
EXIT_USAGE = 2
# per daemon.mode: the target host's gate is ipset + iptables, the bridge's nftables
REQUIRED_TOOLS = {
    "target": ("tc", "ipset", "iptables", "iptables-restore"),
    "bridge": ("tc", "nft"),
}

EPILOG = """\
examples:
  santhrottled --check                          # would it start? config, devices, kernel
  santhrottled --config /etc/santhrottle/santhrottle.toml
  systemctl start santhrottled                  # what the unit runs (santhrottled(8))

exit status:
  0  stopped cleanly (--check: ready to start)
  1  the start failed: the kernel, the control socket or the metrics port
     refused (--check: a problem, each on its own line)
  2  a bad configuration file or command line

The configuration keys are in santhrottle.toml(5) and docs/configure.md.
"""


def build_datapath(cfg: Config) -> Datapath:
    from santhrottle.appliance.datapath import Datapath, DatapathSpec

    return Datapath(DatapathSpec.from_config(cfg), netns=cfg.netns)


def build_sensors(cfg: Config) -> tuple[Sensors, BridgeSensors | None]:
    """The sensors, and in bridge mode the same object as the wire's extension."""
    if cfg.bridge_mode:  # the wire on the array-side port (started by serve())
        from santhrottle.appliance.sensing.bridge import BridgeSensor
        from santhrottle.appliance.sensing.wirenames import NAMES_FILE

        assert cfg.array_port is not None  # the parser's rule in bridge mode
        wire = BridgeSensor(
            port=cfg.array_port,
            resources=cfg.volumes(),
            netns=cfg.netns,
            names_path=os.path.join(cfg.state_dir, NAMES_FILE),
            sensor=cfg.bridge_sensor,
        )
        return wire, wire
    from santhrottle.appliance.sensing.target import TargetSensor

    return TargetSensor(
        ports=cfg.ports,
        netns=cfg.netns,
        declared={n: r.devices for n, r in cfg.resources.items() if r.devices},
        static_map=cfg.static_map,
        snapshot_reuse_s=cfg.controller.tick_s,
    ), None


def check(cfg: Config) -> int:
    """Would santhrottled start with this config?  The same validation (the
    config is loaded by the start's code), the devices, the socket, the
    port, and the kernel asked for real (datapath/probe.py).  0 = ready."""
    problems = preflight(cfg)
    for p in problems:
        print(f"santhrottled --check: {p}", file=sys.stderr)
    if not problems:
        print(f"santhrottled --check: ready ({cfg.path}, devices {', '.join(cfg.devices)})")
    return EXIT_FAILED if problems else 0


def preflight(cfg: Config) -> list[str]:
    from santhrottle.appliance.daemon.control.client import socket_in_use
    from santhrottle.appliance.datapath import DatapathError, DatapathSpec, Host
    from santhrottle.appliance.datapath.bridged import nft_bridge_problem
    from santhrottle.appliance.datapath.probe import probe

    problems: list[str] = directory_problems(cfg)
    root = os.geteuid() == 0
    if not root:
        problems.append("not root: needs CAP_NET_ADMIN for tc/ipset/iptables and configfs")
    for tool in REQUIRED_TOOLS[cfg.mode]:
        if not shutil.which(tool):
            problems.append(f"{tool} not found in PATH")
    if cfg.netns and not os.path.exists(f"/run/netns/{cfg.netns}"):
        problems.append(f"daemon.netns: no network namespace {cfg.netns!r} (/run/netns)")
    elif root:
        host = Host(cfg.netns)
        try:
            for key, dev in _devices_to_check(cfg):
                try:
                    host.ifindex(dev)
                except DatapathError as e:
                    problems.append(f"{key}: {e}")
            nft = nft_bridge_problem(host) if cfg.bridge_mode and shutil.which("nft") else None
            if nft:
                problems.append(nft)
        finally:
            host.close()
    else:
        for key, dev in _devices_to_check(cfg):
            if not cfg.netns and not os.path.exists(f"/sys/class/net/{dev}"):
                problems.append(f"{key}: no network device {dev!r}")
    if cfg.socket_group:
        try:
            grp.getgrnam(cfg.socket_group)
        except KeyError:
            problems.append(f"daemon.socket_group: no group {cfg.socket_group!r}")
    if socket_in_use(cfg.control_socket):
        problems.append(f"{cfg.control_socket}: another santhrottled answers there")
    if cfg.metrics_port:
        err = _port_taken(cfg.metrics_address, cfg.metrics_port)
        if err:
            problems.append(f"metrics {cfg.metrics_address}:{cfg.metrics_port}: {err}")
        try:
            exporter_guards(cfg)
        except ValueError as e:
            problems.append(str(e))
    if cfg.fleet:
        from santhrottle.appliance.fleet.start import problems as fleet_problems

        problems += fleet_problems(cfg)
    if root:
        spec = DatapathSpec.from_config(cfg)
        problems += probe(spec)
    return problems


def directory_problems(cfg: Config) -> list[str]:
    """The directories santhrottled keeps its word in (the state it restores, the
    socket it answers on) must be root's alone: textfile.unsafe_directory()."""
    out = []
    for key, d in (
        ("daemon.state_dir", cfg.state_dir),
        ("daemon.control_socket", os.path.dirname(cfg.control_socket) or "."),
    ):
        why = unsafe_directory(d)
        if why is not None:
            out.append(f"{key}: {why}: another user could plant what santhrottled reads back")
    return out


def _devices_to_check(cfg: Config) -> list[tuple[str, str]]:
    """(key, device) of every device the start needs."""
    if cfg.bridge_mode:
        return [
            ("bridge.initiator_port", str(cfg.initiator_port)),
            ("bridge.array_port", str(cfg.array_port)),
        ]
    return [("datapath.devices", d) for d in cfg.devices]


def _port_taken(address: str, port: int) -> str | None:
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


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


class OneLineFormatter(logging.Formatter):
    """Every log record's message on one line: what a client, a file or the kernel
    put into it (a key with a newline, a NUL) is escaped (appliance/textfile.py
    printable), so nobody can forge a line of the daemon's log.  Its time, when the
    format asks for it (%(asctime)s), in ISO 8601 with milliseconds and the UTC
    offset: 2026-11-28T11:30:05.123+01:00."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created).astimezone()
        return stamp.isoformat(timespec="milliseconds")


class SyslogPrefixFormatter(OneLineFormatter):
    """journald's stream without python-systemd: each line starts with its syslog
    priority, <3> to <7> (sd-daemon(3)), which journald takes off and keeps."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


# logging's levels as syslog priorities (journald's PRIORITY)
SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
LINE = "%(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """Under systemd with python-systemd (Debian's python3-systemd): straight to
    journald, each record's structured fields (the audit trail's SANTHROTTLE_*,
    core/audit.py) kept as journal fields.  Else stderr, one line per record: on
    journald's stream, with the syslog priority in front and no time (the journal
    has it); anywhere else (a terminal, a file, the lab), with the time first."""
    journald = under_journald(sys.stderr)
    handler = (journal_handler() if journald else None) or logging.StreamHandler()
    formatter: logging.Formatter
    if handler.name == JOURNAL:
        formatter = OneLineFormatter("%(name)s: %(message)s")
    elif journald:
        formatter = SyslogPrefixFormatter(LINE)
    else:
        formatter = OneLineFormatter(f"%(asctime)s {LINE}")
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler])


JOURNAL = "journal"


def under_journald(stream: Any) -> bool:
    """The stream is journald's: systemd sets JOURNAL_STREAM to the device and inode
    ("DEVICE:INODE") of the stream it connected stdout/stderr to, and a program
    compares them with its own (systemd.exec(5)); inherited by a process whose
    stderr goes elsewhere, it does not match."""
    dev, sep, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (ValueError, OSError, AttributeError):  # not a number; no descriptor
        return False


def journal_handler() -> logging.Handler | None:
    """python-systemd's JournalHandler when the module is there; None otherwise."""
    try:
        from systemd.journal import JournalHandler  # type: ignore[import-not-found]
    except ImportError:
        return None
    handler: logging.Handler = JournalHandler(SYSLOG_IDENTIFIER="santhrottled")
    handler.name = JOURNAL
    return handler


def load_daemon_config(path: str) -> Config:
    """The file as the daemon takes it, at start, at --check and at every reload
    alike: the configuration's own checks, and the devices it must have (an empty
    or truncated file has none).  ConfigError (one line) otherwise."""
    cfg = load_config(path)
    if not cfg.devices:
        raise ConfigError(f"{cfg.path}: datapath.devices is empty: name the egress device(s)")
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        cfg = load_daemon_config(args.config)
    except ConfigError as e:
        print(f"santhrottled: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        return check(cfg)
    return serve(cfg)


def serve(cfg: Config) -> int:
    from santhrottle.appliance.daemon.control.commands import Commands
    from santhrottle.appliance.daemon.control.hup import HupReloads
    from santhrottle.appliance.daemon.control.requests import one_line
    from santhrottle.appliance.daemon.core.audit import Caller
    from santhrottle.appliance.daemon.core.loop import Daemon
    from santhrottle.appliance.daemon.core.metering import Metering
    from santhrottle.appliance.daemon.core.meterstore import MeterStore
    from santhrottle.appliance.daemon.core.state import StateStore
    from santhrottle.appliance.daemon.status.build import StatusCache
    from santhrottle.appliance.datapath import DatapathError
    from santhrottle.appliance.datapath.actuation import Actuation

    server = metrics = datapath = sensors = None
    applied = False
    unsafe = directory_problems(cfg)
    if unsafe:
        for p in unsafe:
            print(f"santhrottled: {p}", file=sys.stderr)
        return EXIT_FAILED

    def reload() -> None:  # the command's own path: audited as the socket's reload is
        commands.handle("reload", {}, Caller("SIGHUP"))

    def on_term(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        daemon.stop()  # before run(): run() converges once, ticks once, and returns

    hup = HupReloads(reload)  # a SIGHUP from now on is a reload once the daemon serves
    signal.signal(signal.SIGHUP, hup.signal)
    try:
        datapath = build_datapath(cfg)
        sensors, bridge = build_sensors(cfg)
        actuation = Actuation(datapath)  # the record, the quarantine, the drift check
        daemon = Daemon(
            cfg,
            sensors,
            actuation,
            bridge=bridge,
            load_config=load_daemon_config,
            notify=notify,
            store=StateStore(cfg.state_dir),
            fleet=build_fleet(cfg),
        )
        views = StatusCache(daemon)  # one view per revision: the socket's and the metrics'
        metering = Metering(daemon, MeterStore(cfg.state_dir))  # the groups' usage
        # what can be refused without touching the kernel, first
        commands = Commands(daemon, views)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        server = commands.control_server(cfg.control_socket, cfg.socket_mode, cfg.socket_group)
        metrics = start_metrics(cfg, views, metering)
        if bridge is not None:  # the ports must be the bridge's before the jumps match them
            log.info("bridge: %s", prepare(cfg))
        applied = True
        log.info("datapath: %s", actuation.apply().summary())
        if bridge is not None:
            bridge.start()
        daemon.restore(time.monotonic())  # the members apply() read back
        metering.start()
        server.start()
        hup.start()
    except (DatapathError, OSError, ValueError) as e:
        print(f"santhrottled: {one_line(str(e)) or type(e).__name__}", file=sys.stderr)
        hup.close()
        if applied and datapath is not None:
            undo(datapath, cfg)
        if metrics is not None:
            metrics.shutdown()
        if server is not None:
            server.close()
        if sensors is not None:
            sensors.close()
        return EXIT_FAILED

    try:
        daemon.run()
    finally:
        hup.close()
        sensors.close()
        metering.stop()  # the last of the usage written
        daemon.shutdown()
        server.close()
        if metrics is not None:
            metrics.shutdown()
    return 0


def build_fleet(cfg: Config) -> FleetMode | None:
    """[fleet]: the agent on the etcd cluster (None without endpoints).  Nothing
    is asked of the engine here: a start never waits for it (the agent joins
    in its thread; until it has, the appliance controls alone).  Without the
    optional etcd client, or with a TLS or password file it cannot read:
    fleet/start.py's FleetSetupError (a ValueError), one line."""
    if not cfg.fleet:
        return None
    from santhrottle.appliance.daemon.core.fleetmode import FleetMode
    from santhrottle.appliance.fleet.start import agent_for

    return FleetMode(agent_for(cfg))


def prepare(cfg: Config) -> str:
    """Bridge mode: make or adopt the bridge (one line)."""
    from santhrottle.appliance.datapath import Host
    from santhrottle.appliance.datapath.bridged import prepare_bridge

    host = Host(cfg.netns)
    try:
        st = prepare_bridge(host, cfg.bridge_name, str(cfg.initiator_port), str(cfg.array_port))
    finally:
        host.close()
    how = "created" if st.created else "adopted"
    return f"{st.name} {how}, ports {', '.join(st.ports)}, STP off, forward delay 0"


def start_metrics(
    cfg: Config, views: StatusCache, metering: Metering | None = None
) -> MetricsServer | None:
    """The Prometheus exporter (None when metrics.port is 0); OSError when the
    port is taken."""
    if not cfg.metrics_port:
        return None
    from santhrottle.appliance.daemon.status.exporter import MetricsServer
    from santhrottle.appliance.daemon.status.member_counters import MemberCounterReader
    from santhrottle.appliance.daemon.status.metrics import registry_for
    from santhrottle.appliance.daemon.status.tenancy import MeterCollector

    tls, auth = exporter_guards(cfg)
    # the member counters through their own read-only netlink socket, per scrape; the
    # per-initiator series as many as the configuration in force says (reload changes it)
    registry = registry_for(
        views,
        MemberCounterReader(cfg.netns, bridged=cfg.bridge_mode),
        lambda: views.daemon.config.metrics_initiator_series,
        None if metering is None else MeterCollector(metering, views.lock),
    )
    return MetricsServer(cfg.metrics_address, cfg.metrics_port, registry, tls=tls, auth=auth)


def exporter_guards(cfg: Config) -> tuple[ssl.SSLContext | None, BasicAuth | None]:
    """The exporter's TLS context and users ([metrics]); ExporterConfigError (a
    ValueError, one line) when a file or the bcrypt module is not there."""
    from santhrottle.appliance.daemon.status.exporter import BasicAuth, tls_context

    tls = None
    if cfg.metrics_tls_cert_file is not None and cfg.metrics_tls_key_file is not None:
        tls = tls_context(
            cfg.metrics_tls_cert_file, cfg.metrics_tls_key_file, cfg.metrics_tls_client_ca_file
        )
    users = cfg.metrics_basic_auth_users
    return tls, BasicAuth(users) if users else None


def undo(datapath: Datapath, cfg: Config) -> None:
    """A start that failed after apply(): nobody delayed, and unless the static
    state is kept, nothing of santhrottle's left in the kernel."""
    try:
        datapath.set_classes(dict.fromkeys(datapath.current(), 0), ordered=False)
        if not cfg.keep_static_state:
            datapath.cleanup()
    except Exception as e:  # the unit's ExecStopPost removes the delays by name
        log.error("undoing the start: %s", e)


if __name__ == "__main__":
    sys.exit(main())
