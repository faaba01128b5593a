"""Names in the engine's keys and the engine's endpoints, checked without the engine's client.

check_name(what, name): a name that is one key segment (an array, an
appliance): non-empty, printable, no '/'.  Resource names may hold '/'
(bridge resources name volumes): they are quoted into one segment
(resource_key) and unquoted back (resource_of).
parse_endpoint(text): config/kinds.py's, 'host:port', '[v6]:port' or
'http[s]://host:port' -> (protocol, host, port), the port 2379 when absent.
Both raise ValueError with the bad text.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

# the config's check of an endpoint is the adapter's (a value of the file)
from santhrottle.appliance.config.kinds import parse_endpoint as parse_endpoint


def check_name(what: str, name: str) -> str:
    """A name that is one key segment: non-empty, no '/', printable."""
    if not isinstance(name, str) or not name or "/" in name or not name.isprintable():
        raise ValueError(f"{what} must be a non-empty printable name without '/', got {name!r}")
    return name


def resource_key(resource: str) -> str:
    """A resource's name as one key segment ('/' and '%' quoted)."""
    return quote(resource, safe="")


def resource_of(key: str) -> str:
    return unquote(key)
