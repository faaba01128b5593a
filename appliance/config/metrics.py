"""[metrics]: where the Prometheus exporter listens, and what guards it off the loopback.

What it owns
    metrics_fields(r, data): the [metrics] table's values as Config's metrics_*
    fields, checked beyond each key's kind: tls_cert_file with tls_key_file
    (both or neither), tls_client_ca_file only with them, and an address that
    is not a loopback one only with TLS and basic_auth_users (the exporter
    then serves HTTPS and asks every scrape for a user; the names follow the
    Prometheus exporter-toolkit's web configuration: cert_file, key_file,
    client_ca_file, basic_auth_users with bcrypt hashes).  A problem is one
    ConfigError naming the file, the line and the key.  The files are read at
    the start (daemon/status/exporter.py), not here: a configuration parses
    on any host.

Worked example
    [metrics]
    address = "0.0.0.0"
    -> "santhrottle.toml:2: metrics.address: 0.0.0.0 is not a loopback address:
    give metrics.tls_cert_file, metrics.tls_key_file and metrics.basic_auth_users
    (docs/monitor.md, "Scraping from another host")"
"""

from __future__ import annotations

import ipaddress
from typing import Any

from santhrottle.appliance.config.hosts import Reader

# [metrics] keys kept as Config.metrics_<key>
FIELDS = (
    "address",
    "port",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "basic_auth_users",
    "initiator_series",
)


def metrics_fields(r: Reader, data: dict[str, Any]) -> dict[str, Any]:
    """Config's metrics_* fields from the file's [metrics] table, checked."""
    m = r.table(data, "metrics", "metrics")
    cert, key, ca = m["tls_cert_file"], m["tls_key_file"], m["tls_client_ca_file"]
    if (cert is None) != (key is None):
        given, missing = (
            ("tls_cert_file", "tls_key_file") if key is None else ("tls_key_file", "tls_cert_file")
        )
        raise r.fail(f"metrics.{missing}", f"is required with metrics.{given}")
    if ca is not None and cert is None:
        raise r.fail("metrics.tls_client_ca_file", "needs metrics.tls_cert_file and tls_key_file")
    guarded = cert is not None and m["basic_auth_users"]
    if m["port"] and not ipaddress.ip_address(m["address"]).is_loopback and not guarded:
        raise r.fail(
            "metrics.address",
            f"{m['address']} is not a loopback address: give metrics.tls_cert_file, "
            "metrics.tls_key_file and metrics.basic_auth_users (docs/monitor.md, "
            '"Scraping from another host")',
        )
    return {f"metrics_{k}": m[k] for k in FIELDS}
