"""The control socket: server.py (the daemon's side), client.py (the CLI's),
requests.py (the protocol: commands, arguments, replies), commands.py and
group_commands.py (what each command does, through the daemon's public methods).

The client's side is importable from here without the daemon: the CLI imports
only this, client.py and requests.py."""

from santhrottle.appliance.daemon.control.client import CLIENT_TIMEOUT_S, request, socket_in_use
from santhrottle.appliance.daemon.control.requests import (
    PROTOCOL_VERSION,
    DaemonAbsent,
    DaemonUnavailable,
    RemoteError,
)

__all__ = [
    "CLIENT_TIMEOUT_S",
    "PROTOCOL_VERSION",
    "DaemonAbsent",
    "DaemonUnavailable",
    "RemoteError",
    "request",
    "socket_in_use",
]
