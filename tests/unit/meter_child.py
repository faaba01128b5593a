"""A santhrottled that meters in real time, for test_meter's kill -9 (not a test itself).

    python meter_child.py STATE_DIR

Runs core/loop.py's Daemon with the unit tests' fake sensors and data path (no
kernel), tick 50 ms and convergence 100 ms, a group with levels, and its meter
(core/metering.py) in STATE_DIR, as santhrottled's main does. Around every write of
the meter it prints, flushed:
    before N LEVEL_SECONDS      (the sample's usage, about to be written)
    saved N LEVEL_SECONDS       (written)
and at the start `restored LEVEL_SECONDS` (what the store gave back).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_daemon import FakeActuator, FakeSensors

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.daemon.core.loop import Daemon
from santhrottle.appliance.daemon.core.metering import Metering
from santhrottle.appliance.daemon.core.meterstore import MeterStore

CONF = """
[datapath]
devices = ["eth1"]
[controller]
tick = "50ms"
converge = "100ms"
[resources.vg0]
threshold = "10ms"
[groups.gold]
members = ["10.0.0.3"]
iops_levels = [600, 1200]
"""


def level_seconds(m: Metering) -> float:
    u = m.meter.totals.get("gold")
    return 0.0 if u is None else sum(sum(c.values()) for c in u.level_s.values())


def main() -> int:
    d = Daemon(parse_config(CONF, "child.toml"), FakeSensors(), FakeActuator())
    d.restore(0.0)
    m = Metering(d, MeterStore(sys.argv[1]))
    kept = m.keeper.load()
    got = kept.totals.get("gold")
    print(f"restored {0.0 if got is None else sum(sum(c.values()) for c in got.level_s.values())}")
    real_save = m.keeper.save
    n = 0

    def save(snapshot, retention_s=None):
        nonlocal n
        n += 1
        print(f"before {n} {level_seconds(m)}", flush=True)
        ok = real_save(snapshot, retention_s)
        print(f"saved {n} {level_seconds(m)}", flush=True)
        return ok

    m.keeper.save = save
    m.start()
    d.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
