"""[controller] and the ladder of [datapath]: the controller's configuration, checked whole.

Who reads it
    parse_config (santhrottle.toml) and the simulator's scenarios
    (sim/scenario.py, through parse.parse_controller): a scenario's
    [controller] and [datapath] tables are these, key for key and in the same
    units, so a tuning tried in the simulator is the text the daemon reads.

Checks no single key can make (one ConfigError naming the key)
    datapath.max_delay at least datapath.step, and a ladder that can be
    built (controller/ladder.py); controller.converge at least
    controller.tick; write_heavy_leave below write_heavy_enter;
    class_increase_max_ratio_per_tick 0 (no limit) or at least 1.

Worked example
    [datapath] step = "250us" and [controller] ti_log = "1s" -> a
    ControllerConfig whose ladder's class 1 is 0.25 ms and whose
    log_gains.ti_s is 1.0, every other value its default; [controller]
    converge = "50ms" -> "controller.converge: must be at least
    controller.tick".
"""

from __future__ import annotations

from typing import Any

from santhrottle.appliance.config.hosts import Reader
from santhrottle.controller.domain import ControllerConfig, LogGains, PidGains
from santhrottle.controller.ladder import Ladder, LadderError


def controller_config(
    r: Reader, p: dict[str, Any], data: dict[str, Any]
) -> tuple[ControllerConfig, dict[str, Any]]:
    """The ControllerConfig of [datapath]'s values p (parsed) and data's [controller]
    table, and that table's values (its default_threshold is the caller's)."""
    if p["max_delay"] < p["step"]:
        raise r.fail("datapath.max_delay", "must be at least datapath.step")
    try:
        ladder = Ladder(p["step"], p["max_delay"], p["ladder_ratio"])
    except LadderError as e:
        raise r.fail("datapath.max_delay", str(e)) from None
    c = r.table(data, "controller", "controller")
    if c["converge"] < c["tick"]:
        raise r.fail("controller.converge", "must be at least controller.tick")
    if not c["write_heavy_leave"] < c["write_heavy_enter"]:
        raise r.fail("controller.write_heavy_leave", "must be below write_heavy_enter")
    if 0.0 < c["class_increase_max_ratio_per_tick"] < 1.0:
        raise r.fail("controller.class_increase_max_ratio_per_tick", "must be 0 (no limit) or >= 1")
    config = ControllerConfig(
        tick_s=c["tick"],
        converge_s=c["converge"],
        ladder=ladder,
        law=c["law"],
        log_gains=LogGains(
            kp_log_per_rel_error=c["kp_log_per_rel_error"],
            ti_s=c["ti_log"],
            td_s=c["td_log"],
            offset_x_threshold=c["offset_log_x_threshold"],
        ),
        gains=PidGains(
            kp_class_per_rel_error=c["kp_class_per_rel_error"], ti_s=c["ti"], td_s=c["td"]
        ),
        setpoint_fraction=c["setpoint_fraction"],
        setpoint_quiet_fraction=c["setpoint_quiet_fraction"],
        setpoint_noise_z=c["setpoint_noise_z"],
        class_hysteresis=c["class_hysteresis"],
        class_decrease_max_per_tick=c["class_decrease_max_per_tick"],
        class_increase_max_ratio_per_tick=c["class_increase_max_ratio_per_tick"],
        delay_increase_min_s_per_tick=c["delay_increase_min"],
        read_ewma_tau_s=c["read_ewma_tau"],
        write_ewma_tau_s=c["write_ewma_tau"],
        write_heavy_enter_bps=c["write_heavy_enter"],
        write_heavy_leave_bps=c["write_heavy_leave"],
        read_idle_release_s=c["read_idle_release"],
        auto_alpha=c["auto_alpha"],
        write_heavy_share=c["write_heavy_share"],
        promote_below_utilization=c["promote_below_utilization"],
    )
    return config, c
