"""[fleet]: the etcd cluster, the array, this appliance, TLS and the etcd user, read from the file.

What it owns
    fleet_fields(r, data): the [fleet] table's values as Config's fleet_*
    fields, checked beyond each key's kind: an array with endpoints, a
    lease TTL in whole seconds (etcd's unit), cert with key and user with
    password_file (each pair both or neither), and https:// endpoints with a
    CA or a client certificate.  A problem is one ConfigError naming the
    file, the line and the key.  The files themselves are read at the start
    (fleet/start.py), not here: a configuration parses on any host.

Worked example
    [fleet]
    endpoints = ["10.77.0.1:2379"]
    array = "array1"
    ca = "/etc/santhrottle/etcd/ca.pem"
    -> "santhrottle.toml:2: fleet.endpoints: must be https://host:port with
    fleet.ca or fleet.cert, got '10.77.0.1:2379'"
"""

from __future__ import annotations

from typing import Any

from santhrottle.appliance.config.hosts import Reader

# [fleet] keys kept as Config.fleet_<key> (lease_ttl: Config.fleet_lease_ttl_s)
FIELDS = ("endpoints", "array", "appliance", "lead", "ca", "cert", "key", "user", "password_file")
# keys that go in pairs: the first set asks for the second
PAIRS = (("cert", "key"), ("key", "cert"), ("user", "password_file"), ("password_file", "user"))


def fleet_fields(r: Reader, data: dict[str, Any]) -> dict[str, Any]:
    """Config's fleet_* fields from the file's [fleet] table, checked."""
    f = r.table(data, "fleet", "fleet")
    if f["endpoints"] and not f["array"]:
        raise r.fail("fleet.array", "is required with fleet.endpoints")
    if f["lease_ttl"] != int(f["lease_ttl"]):
        raise r.fail("fleet.lease_ttl", 'must be whole seconds (etcd\'s unit), e.g. "2s"')
    for a, b in PAIRS:
        if f[a] is not None and f[b] is None:
            raise r.fail(f"fleet.{b}", f"is required with fleet.{a}")
    if f["ca"] is not None or f["cert"] is not None:
        plain = [e for e in f["endpoints"] if not e.startswith("https://")]
        if plain:
            raise r.fail(
                "fleet.endpoints",
                f"must be https://host:port with fleet.ca or fleet.cert, got {plain[0]!r}",
            )
    return {f"fleet_{k}": f[k] for k in FIELDS} | {"fleet_lease_ttl_s": int(f["lease_ttl"])}
