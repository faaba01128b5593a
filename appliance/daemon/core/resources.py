"""Which resources the daemon knows and controls, and the one place their thresholds are decided.

What it owns
    known(): the resources the file names and those discovery sees.
    threshold_of(): the threshold asked for, a runtime override (`threshold
    set`, core/runtime.py) over the file's (config threshold_of: its own, or
    controller.default_threshold): seconds, "auto" (fitted) or None
    (observed).  Everything that shows or uses a threshold asks here: the
    controller's Resource is made from it, status/build.py's ThresholdView
    shows it beside the file's.
    reconcile(): the controller's resources = the known resources that have
    a threshold or are grouped (a grouped resource's PID only observes,
    math.inf: its groups decide); each new one starts from the last run's
    class when there is one (the seeds, core/runtime.py recent_classes).

Worked example
    [resources.vg0] threshold = "10ms", discovery sees vg0 and vg1, no default
    threshold: known() = {vg0, vg1}; threshold_of("vg0") = 0.01, of "vg1" None;
    after `threshold set vg1 20ms` the runtime holds {"vg1": 0.02} and
    reconcile() gives the controller vg0 at 10 ms and vg1 at 20 ms.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, MutableMapping

from santhrottle.appliance.config import Config
from santhrottle.appliance.config.kinds import AUTO
from santhrottle.appliance.daemon.core.runtime import Runtime
from santhrottle.appliance.daemon.core.sensors import Discovery
from santhrottle.controller.domain import Resource
from santhrottle.controller.restate import remove_resource, seed_class
from santhrottle.controller.state import ControllerState

log = logging.getLogger("santhrottled")


def known(config: Config, discovery: Discovery | None) -> set[str]:
    names = set(config.resources)
    if discovery is not None:
        names |= set(discovery.resources)
    return names


def threshold_of(config: Config, runtime: Runtime, name: str) -> float | str | None:
    """The threshold asked for: seconds, "auto" (fitted), None (observed)."""
    return runtime.thresholds.get(name, config.threshold_of(name))


def controller_resource(config: Config, name: str, thr: float | str) -> Resource:
    if thr == AUTO:  # the fallback until the fit is confident; inf observes
        fallback = config.fallback_of(name)
        return Resource(name, math.inf if fallback is None else fallback, auto=True)
    return Resource(name, float(thr))


def reconcile(
    ctl: ControllerState,
    config: Config,
    runtime: Runtime,
    known_names: Iterable[str],
    grouped: Iterable[str],
    seeds: MutableMapping[str, int],
) -> Mapping[str, int]:
    """The controller's resources made the known ones with a threshold, and the grouped
    ones; returns the initiator classes that changed (resources removed)."""
    want = {n: t for n in known_names if (t := threshold_of(config, runtime, n)) is not None}
    for n in grouped:
        want.setdefault(n, math.inf)  # its groups decide; its PID only observes
    changed: dict[str, int] = {}
    for name in list(ctl.resources):
        if name not in want:
            changed.update(remove_resource(ctl, name))
    for name, thr in want.items():
        ctl.set_resource(controller_resource(config, name, thr))
        if name in seeds:  # the last run's class: continue from it
            seed_class(ctl, name, seeds.pop(name))
    if changed:
        log.info("resources removed; %d initiator class(es) changed", len(changed))
    return changed
