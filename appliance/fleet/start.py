"""From [fleet] to the fleet's agent: the optional etcd client, the TLS files, the etcd user.

Problem
    The fleet's etcd client (etcd3gw, with requests) is an optional
    dependency: santhrottled runs in every mode without it, and only a
    configuration with [fleet] endpoints needs it.  Such a configuration on a
    host without it, or naming a certificate or a password file that cannot
    be read, must stop the start with one line naming what is missing, not a
    traceback and not an agent that fails every round.

What it does
    agent_for(cfg): the FleetAgent of cfg's [fleet] on an EtcdCoordinator, or
        FleetSetupError (a ValueError) with one line.  Nothing is asked of
        etcd here: a start never waits for it (the agent joins in its
        thread).  The password is read once, from the first line of
        fleet.password_file.
    problems(cfg): the same checks as lines, for `santhrottled --check`; also
        a key or password file that others may read.

Worked example
    [fleet] endpoints = ["https://10.77.0.1:2379"], user = "gw-a",
    password_file = "/etc/santhrottle/etcd/gw-a.password" (missing):
    agent_for(cfg) -> FleetSetupError("fleet.password_file:
    /etc/santhrottle/etcd/gw-a.password: No such file or directory")
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from typing import TYPE_CHECKING

from santhrottle.appliance.fleet.agent import FleetAgent

if TYPE_CHECKING:
    from santhrottle.appliance.config import Config
    from santhrottle.appliance.fleet.etcd import EtcdCoordinator

log = logging.getLogger("santhrottled.fleet")
INSTALL_HINT = "apt install python3-etcd3gw, or pip install 'santhrottle[fleet]'"


class FleetSetupError(ValueError):
    """[fleet] cannot be started on this host (one line, naming the key)."""


def _client_missing() -> str | None:
    try:
        import etcd3gw.client  # noqa: F401
        import requests  # noqa: F401
    except ImportError as e:
        return (
            f"[fleet] needs the etcd client etcd3gw, which is not installed ({e}): {INSTALL_HINT}"
        )
    return None


def _files(cfg: Config) -> list[tuple[str, str]]:
    keys = (
        ("ca", cfg.fleet_ca),
        ("cert", cfg.fleet_cert),
        ("key", cfg.fleet_key),
        ("password_file", cfg.fleet_password_file),
    )
    return [(f"fleet.{k}", p) for k, p in keys if p is not None]


def _read_password(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        line = f.readline().rstrip("\r\n")
    if not line:
        raise FleetSetupError(f"fleet.password_file: {path}: the first line is empty")
    return line


def _unreadable(key: str, path: str) -> str | None:
    try:
        with open(path, "rb"):
            return None
    except OSError as e:
        return f"{key}: {path}: {e.strerror or e}"


def problems(cfg: Config) -> list[str]:
    """What stops agent_for(cfg), and secrets others may read; one line each."""
    if not cfg.fleet:
        return []
    out = [p for p in [_client_missing()] if p]
    for key, path in _files(cfg):
        why = _unreadable(key, path)
        if why:
            out.append(why)
        elif key in ("fleet.key", "fleet.password_file") and os.stat(path).st_mode & 0o077:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            out.append(f"{key}: {path}: mode {mode:04o}, readable by others: chmod 600")
    return out


def coordinator_for(cfg: Config) -> EtcdCoordinator:
    """The EtcdCoordinator of cfg's [fleet] (FleetSetupError if it cannot be made)."""
    missing = _client_missing()
    if missing:
        raise FleetSetupError(missing)
    from santhrottle.appliance.fleet.etcd import EtcdCoordinator
    from santhrottle.appliance.fleet.gateway import Security

    for key, path in _files(cfg):
        why = _unreadable(key, path)
        if why:
            raise FleetSetupError(why)
    try:
        password = (
            None if cfg.fleet_password_file is None else _read_password(cfg.fleet_password_file)
        )
        security = Security(cfg.fleet_ca, cfg.fleet_cert, cfg.fleet_key, cfg.fleet_user, password)
        return EtcdCoordinator(
            str(cfg.fleet_array),
            cfg.fleet_endpoints,
            ttl_s=cfg.fleet_lease_ttl_s,
            security=security,
        )
    except UnicodeDecodeError as e:
        raise FleetSetupError(f"fleet.password_file: not UTF-8 text ({e.reason})") from None
    except ValueError as e:
        if isinstance(e, FleetSetupError):
            raise
        raise FleetSetupError(f"[fleet]: {e}") from None


def agent_for(cfg: Config) -> FleetAgent:
    """[fleet]'s agent (not started), or FleetSetupError."""
    coord = coordinator_for(cfg)
    name = cfg.fleet_appliance or socket.gethostname().split(".")[0]
    ttl = cfg.fleet_lease_ttl_s
    agent = FleetAgent(
        coord,
        name,
        {"mode": cfg.mode},
        ttl_s=ttl,
        degraded_after_s=float(ttl),  # past it, the engine has ended the lease anyway
        tick_s=cfg.controller.tick_s,
        max_class=cfg.max_class,
        lead=cfg.fleet_lead,
    )
    how = [f"user {cfg.fleet_user}"] if cfg.fleet_user else []
    how += ["TLS"] if coord.gateway.security.tls else []
    how += [] if cfg.fleet_lead else ["follower only"]
    log.info(
        "fleet: %s as %s on %s%s",
        cfg.fleet_array,
        name,
        ", ".join(cfg.fleet_endpoints),
        f" ({', '.join(how)})" if how else "",
    )
    for p in problems(cfg):  # secrets others may read: started, but said
        log.warning("fleet: %s", p)
    return agent
