"""[hosts.NAME]: the addresses that are one host (a dual-stack initiator), read from the file.

What it owns
    HostConfig (a host's name and its addresses) and hosts(), which reads
    the [hosts] table into them: NAME follows the name rule of every other
    table (letters, digits and _ . + -) and is not itself an address;
    `addresses` is a non-empty list of IPv4 and IPv6 addresses (kinds.py
    host_address: no zone, no prefix, an IPv4-mapped address written as its
    IPv4 address), each given once and in at most one host.  A problem is
    one ConfigError naming the file, the line and the key.  What the daemon
    does with a host (its addresses judged on their summed writes, one row,
    one delay class) is daemon/core/hosts.py's.

Worked example
    [hosts.db1]
    addresses = ["10.0.1.5", "FD00:1::5"]
    -> {"db1": HostConfig("db1", ("10.0.1.5", "fd00:1::5"))}; a [hosts.db2]
    with "fd00:1::5" too -> "santhrottle.toml:5: hosts.db2.addresses:
    fd00:1::5 is already an address of hosts.db1".
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Protocol

from santhrottle.appliance.config.kinds import NAME_RE


@dataclass(frozen=True)
class HostConfig:
    """[hosts.NAME]: the addresses one initiator host connects from."""

    name: str
    addresses: tuple[str, ...]


class Reader(Protocol):
    """What hosts() needs of the file's reader (parse.py _Reader)."""

    def fail(self, key: str, msg: str) -> Exception: ...

    def table(self, data: dict[str, Any], name: str, schema_table: str) -> dict[str, Any]: ...


def hosts(r: Reader, data: dict[str, Any]) -> dict[str, HostConfig]:
    """The file's [hosts.NAME] tables, checked; r.fail's error otherwise."""
    table = data.get("hosts", {})
    if not isinstance(table, dict):
        raise r.fail("hosts", 'must be a table of [hosts.NAME] tables with "addresses"')
    out: dict[str, HostConfig] = {}
    owner: dict[str, str] = {}  # address -> its host
    for name, ht in table.items():
        key = f"hosts.{name}"
        if not NAME_RE.match(name):
            raise r.fail(key, "host names are letters, digits and _ . + -")
        if _is_address(name):
            raise r.fail(key, f"{name!r} is an address: name the host (e.g. db1)")
        if not isinstance(ht, dict):
            raise r.fail(key, 'must be a table with addresses = ["10.0.1.5", "fd00::5"]')
        v = r.table({key: ht}, key, "hosts.NAME")
        if v["addresses"] is None:
            raise r.fail(f"{key}.addresses", "is required")
        for a in v["addresses"]:
            other = owner.setdefault(a, name)
            if other != name:
                raise r.fail(f"{key}.addresses", f"{a} is already an address of hosts.{other}")
        out[name] = HostConfig(name, v["addresses"])
    return out


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
