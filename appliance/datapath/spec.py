"""What the data path looks like: devices, ports, the delay ladder, the link, the leaves.

What it owns
    DatapathSpec, the validated shape the actuator builds, with every
    default read from the configuration schema (config/schema.py): the
    daemon builds it from its config (from_config), the CLI from its
    options, discover() from what is installed.

Worked example
    DatapathSpec(("eth1",)) -> ports (3260, 4420), the default ladder (0.5
    ms steps to 10 ms, x1.05 above, 250 ms: max_class 88), 25 Gbit/s, write
    mode all, netem leaves, 8 glide leaves; DatapathSpec(("eth1",),
    step_us=1) fails naming the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from santhrottle.appliance.config import Config, default
from santhrottle.appliance.config.kinds import KindError, check_ports
from santhrottle.appliance.config.schema import (
    LEAVES,
    MAX_CLASSES,
    MAX_GLIDE_LEAVES,
    MAX_STEP_US,
    MIN_STEP_US,
    WRITE_MODES,
)
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.units import fmt_us
from santhrottle.controller.ladder import Ladder, LadderError


@dataclass(frozen=True)
class DatapathSpec:
    devices: tuple[str, ...] = ()
    ports: tuple[int, ...] = default("datapath.ports")
    step_us: int = default("datapath.step")
    max_delay_us: int = default("datapath.max_delay")
    ladder_ratio: float = default("datapath.ladder_ratio")
    link_bits_s: int = default("datapath.link_speed")
    write_mode: str = default("datapath.write_mode")
    leaf: str = default("datapath.leaf")
    glide_leaves: int = default("datapath.glide_leaves")
    # the devices are ports of a bridge (bridge mode): the gate is nftables' bridge
    # family (datapath/nftrules.py), not ipset + iptables
    bridged: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "ports", check_ports(list(self.ports)))
        except KindError as e:
            raise DatapathError(str(e)) from None
        object.__setattr__(self, "devices", tuple(self.devices))
        if type(self.step_us) is not int or not MIN_STEP_US <= self.step_us <= MAX_STEP_US:
            lo, hi = fmt_us(MIN_STEP_US), fmt_us(MAX_STEP_US)
            raise DatapathError(f"bad step {self.step_us!r} us: must be {lo}..{hi}")
        try:
            ladder = Ladder(self.step_us, self.max_delay_us, self.ladder_ratio)
        except LadderError as e:
            raise DatapathError(str(e)) from None
        if ladder.max_class > MAX_CLASSES:
            raise DatapathError(f"bad ladder: {ladder.max_class} classes, at most {MAX_CLASSES}")
        object.__setattr__(self, "_ladder", ladder)
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
    def ladder(self) -> Ladder:
        lad: Ladder = self.__dict__["_ladder"]
        return lad

    @property
    def max_class(self) -> int:
        return self.ladder.max_class

    @property
    def step_s(self) -> float:
        return self.step_us / 1e6

    def delay_us(self, k: int) -> int:
        return self.ladder.delay_us(k)

    @classmethod
    def linear(
        cls, devices: tuple[str, ...], step_us: int, max_class: int, **kw: object
    ) -> DatapathSpec:
        """The method paper's ladder: class k delays by k * step."""
        return cls(
            devices, step_us=step_us, max_delay_us=step_us * max_class, ladder_ratio=1.0, **kw
        )  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, cfg: Config) -> DatapathSpec:
        return cls(
            devices=cfg.devices,
            ports=cfg.ports,
            step_us=cfg.step_us,
            max_delay_us=cfg.max_delay_us,
            ladder_ratio=cfg.ladder_ratio,
            link_bits_s=cfg.link_bits_s,
            write_mode=cfg.write_mode,
            leaf=cfg.leaf,
            glide_leaves=cfg.glide_leaves,
            bridged=cfg.bridge_mode,
        )
