"""Initiator address churn, 1,000 new addresses a minute for 10 minutes (issue 46 item 11).

Every address writes to vg0 for a minute and is gone: what the daemon keeps per
initiator (the discovery, the write rates and sets, the classes, the kernel's
record, the bytes written, the audit trail's history and rate limits) must follow the
live ones, not grow with every address ever seen.  In virtual time with the daemon's
fake sensors and actuator (the real controller, data path record and audit trail), at
a 1 s tick so that 10 minutes stay a few seconds of test."""

from __future__ import annotations

import ipaddress

from santhrottle.appliance.daemon.core.audit import HISTORY_INITIATORS
from santhrottle.controller.domain import DeviceSample, ReadSample, WriteSample
from tests.unit.test_daemon import FakeDiscovery, NoGroupSensing, View, make, status_of

MIB = 1 << 20
CONF = """
[datapath]
devices = ["eth1"]
[controller]
tick = "5s"
converge = "5s"
class_hysteresis = 0
[resources.vg0]
threshold = "10ms"
"""
NEW_PER_MINUTE = 1000
MINUTES = 10
LIFE_S = 60.0


class ChurnSensors(NoGroupSensing):
    """A new writer every 60 ms, each writing 2 MiB/s for a minute; vg0 at 30 ms."""

    def __init__(self, vt) -> None:
        self.vt = vt
        self.start = vt.now
        self.base = int(ipaddress.ip_address("10.64.0.0"))

    def live(self) -> list[str]:
        t = self.vt.now - self.start
        born = int(t * NEW_PER_MINUTE / 60)
        gone = max(0, int((t - LIFE_S) * NEW_PER_MINUTE / 60))
        return [str(ipaddress.ip_address(self.base + i)) for i in range(gone, born)]

    def read_samples(self):
        return [ReadSample("vg0", 60, 0.030, 50 * MIB)]

    def device_samples(self):
        return [DeviceSample("vg0", 60, 0.030, 9.0)]

    def converge(self):
        ips = self.live()
        disc = FakeDiscovery({"vg0": ("dm-0",)}, {ip: View({"vg0"}) for ip in ips})
        return disc, [WriteSample("vg0", ip, 2 * MIB) for ip in ips]


def test_ten_minutes_of_churn_keep_the_daemons_state_to_the_live_initiators():
    d, vt, _s, act = make(CONF)
    sensors = ChurnSensors(vt)
    d.sensors = sensors
    peak = extra = 0
    for _ in range(MINUTES * 60 // 5):
        d.converge_once()
        d.run_once()
        live = len(sensors.live())
        peak = max(peak, len(act.kernel), len(d.ctl.effective))
        # a departed writer's rate decays a few seconds before it is forgotten
        extra = max(extra, len(d.ctl.write_sets.rates()) - live)
    d.converge_once()  # the discovery of now
    live = set(sensors.live())
    assert len(live) == NEW_PER_MINUTE  # a minute's worth, at any time
    # a departed member holds while vg0 is contended (its rate decays, tau 8 s, below
    # a tenth of leave: controller/writeheavy.py): bounded by that, not by churn
    held = set(act.kernel) - live
    assert len(held) <= NEW_PER_MINUTE, len(held)
    assert set(d.ctl.effective) - live == held
    assert {ini for ini, _r in d.written.snapshot()} <= live
    st = status_of(d)
    assert len(st["initiators"]) == len(live | held)
    assert len(d.audit._history) <= HISTORY_INITIATORS
    assert len(d.audit._last_line) <= 2 * HISTORY_INITIATORS
    assert peak <= 2 * NEW_PER_MINUTE and st["counters"]["actuator_errors"] == 0
    assert extra <= NEW_PER_MINUTE, extra  # a minute's departures at most
