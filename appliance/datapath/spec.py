"""What the data path looks like: devices, ports, the delay ladder, the link, the leaves.

What it owns
    DatapathSpec, the validated shape the actuator builds, with every
    default read from the configuration schema (config/schema.py): the
    daemon builds it from its config (from_config), the CLI from its
    options, discover() from what is installed.

Worked example
    DatapathSpec(("eth1",)) -> ports (3260, 4420), step 500 us, max_class
    100 (50 ms), 25 Gbit/s, write mode all, netem leaves, 8 glide leaves;
    DatapathSpec(("eth1",), step_us=1, max_class=5001) fails naming the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from santhrottle.appliance.config import Config, default
from santhrottle.appliance.config.schema import (
    LEAVES,
    MAX_CLASSES,
    MAX_GLIDE_LEAVES,
    MAX_STEP_US,
    MIN_STEP_US,
    WRITE_MODES,
    KindError,
    check_ports,
)
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.units import fmt_us

_STEP_US: int = default("datapath.step")


@dataclass(frozen=True)
class DatapathSpec:
    devices: tuple[str, ...] = ()
    ports: tuple[int, ...] = default("datapath.ports")
    step_us: int = _STEP_US
    max_class: int = default("datapath.max_delay") // _STEP_US
    link_bits_s: int = default("datapath.link_speed")
    write_mode: str = default("datapath.write_mode")
    leaf: str = default("datapath.leaf")
    glide_leaves: int = default("datapath.glide_leaves")

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "ports", check_ports(list(self.ports)))
        except KindError as e:
            raise DatapathError(str(e)) from None
        object.__setattr__(self, "devices", tuple(self.devices))
        if type(self.step_us) is not int or not MIN_STEP_US <= self.step_us <= MAX_STEP_US:
            lo, hi = fmt_us(MIN_STEP_US), fmt_us(MAX_STEP_US)
            raise DatapathError(f"bad step {self.step_us!r} us: must be {lo}..{hi}")
        if not 1 <= self.max_class <= MAX_CLASSES:
            raise DatapathError(f"bad maximum class {self.max_class}: must be 1-{MAX_CLASSES}")
        if self.write_mode not in WRITE_MODES:
            raise DatapathError(
                f"bad write mode {self.write_mode!r}: expected {' or '.join(WRITE_MODES)}"
            )
        if self.leaf not in LEAVES:
            raise DatapathError(f"bad leaf {self.leaf!r}: expected netem (or pfifo for tests)")
        if not 0 <= self.glide_leaves <= MAX_GLIDE_LEAVES:
            raise DatapathError(
                f"bad glide leaf count {self.glide_leaves}: must be 0-{MAX_GLIDE_LEAVES}"
            )

    @property
    def step_s(self) -> float:
        return self.step_us / 1e6

    @property
    def max_delay_us(self) -> int:
        return self.max_class * self.step_us

    @classmethod
    def from_config(cls, cfg: Config) -> DatapathSpec:
        return cls(
            devices=cfg.devices,
            ports=cfg.ports,
            step_us=cfg.step_us,
            max_class=cfg.max_class,
            link_bits_s=cfg.link_bits_s,
            write_mode=cfg.write_mode,
            leaf=cfg.leaf,
            glide_leaves=cfg.glide_leaves,
        )
