"""The installed version, for `--version` and santhrottle_build_info."""

from __future__ import annotations

import platform
from importlib import metadata

DISTRIBUTION = "santhrottle"


def version() -> str:
    """The distribution's version ('0+unknown' when it is not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def version_line(prog: str) -> str:
    return f"{prog} {version()} (Python {platform.python_version()})"
