"""The one home of santhrottle's configuration: the schema (every key, default and
bound, schema.py) and the file parser (parse.py).  `python -m
santhrottle.appliance.config` prints the reference table docs/configure.md holds."""

from santhrottle.appliance.config.parse import (
    Config,
    ConfigError,
    ResourceConfig,
    defaults,
    load_config,
    parse_config,
)
from santhrottle.appliance.config.schema import DEFAULT_PATH, KEYS, Key, default

__all__ = [
    "DEFAULT_PATH",
    "KEYS",
    "Config",
    "ConfigError",
    "Key",
    "ResourceConfig",
    "default",
    "defaults",
    "load_config",
    "parse_config",
]
