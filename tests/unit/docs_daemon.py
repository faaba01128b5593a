"""The daemons the manual's examples come from (tests/unit/test_docs_sessions.py runs
the marked examples against them): the real Daemon on the unit tests' fakes, in
virtual time from a fixed date, so every figure they print is reproducible.

"operate" (docs/operate.md): two volume groups, vg_aic with a 15 ms threshold and
vg_backup without one; four initiators, 10.0.0.2 (reads only), 10.0.0.3 and 10.0.0.4
writing to vg_aic, 10.0.0.7 to vg_backup.  vg_aic's read latency is a modelled array's:
3 ms plus 0.5 ms per MB/s its writers get through (a delayed writer gets through less,
as each of its writes waits for the delay), so the controller finds the delay that
holds it under the threshold.

"hosts" (docs/operate.md's [hosts.NAME] example): tests/unit/test_ipv6_hosts.py's
daemon, the host db1 (10.0.1.5 and fd00:1::5) and two more initiators writing to vg0.

"fleet" (docs/operate.md's fleet status): tests/unit/test_daemon_fleet.py's two
appliances a and b on a fake engine, seen from b, a follower.

"groups" (docs/groups.md, docs/operate.md's group section): tests/unit/test_group_cli.py's
daemon (on vg0, the reader group db, 10 ms target, priority 2, which sees 20 ms; backup,
a writer with nine times its IOs outstanding, priority 1).

"levels" (docs/levels.md's status): tests/unit/test_levels_daemon.py's daemon, the group
gold with `iops_levels = [100, 200, 400]` and its writer 10.0.0.3 at its top level.

Each function returns the daemon and a function that runs it one second on.
"""

from __future__ import annotations

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.daemon.core.loop import Daemon
from santhrottle.controller.domain import ReadSample, WriteSample

from .test_daemon import FakeActuator, FakeDiscovery, NoGroupSensing, View, VirtualTime, run_for

CONFIG_PATH = "/etc/santhrottle/santhrottle.toml"
START = 1_795_860_000.0  # 2026-11-28 10:00:00 UTC: the examples' day
MB = 1_000_000

OPERATE = """\
[datapath]
devices = ["eth1"]

[resources.vg_aic]
threshold = "15ms"

[resources.vg_backup]
devices = ["dm-1"]
"""
# initiator -> (resource, write rate it would have undelayed, B/s)
WRITERS = {
    "10.0.0.2": ("vg_aic", 0.0),
    "10.0.0.3": ("vg_aic", 25 * MB),
    "10.0.0.4": ("vg_aic", 9.5 * MB),
    "10.0.0.7": ("vg_backup", 2.1 * MB),
}
BASE_S = {"vg_aic": 0.003, "vg_backup": 0.004}
PER_MBPS_S = 0.0005  # vg_aic's latency per MB/s written
WRITE_S = 0.004  # a write's own time at the array, undelayed


class ArraySensors(NoGroupSensing):
    """The fakes' sensing protocol over a modelled array (above)."""

    def __init__(self, act: FakeActuator, ladder) -> None:
        self.act = act
        self.ladder = ladder

    def _rate(self, ip: str) -> float:
        """ip's write rate through its delay: each write waits for it."""
        _res, bps = WRITERS[ip]
        k = self.act.kernel.get(ip, (0, ""))[0]
        return bps * WRITE_S / (WRITE_S + self.ladder.delay_s(k))

    def read_samples(self) -> list[ReadSample]:
        out = []
        for res, base in BASE_S.items():
            written = sum(self._rate(ip) for ip, (r, _) in WRITERS.items() if r == res)
            lat = base + (PER_MBPS_S * written / MB if res == "vg_aic" else 0.0)
            out.append(ReadSample(res, 50, lat, written))
        return out

    def device_samples(self):
        return []

    def converge(self):
        d = FakeDiscovery(
            {"vg_aic": ("dm-0",), "vg_backup": ("dm-1",)},
            {ip: View({r}) for ip, (r, _) in WRITERS.items()},
        )
        return d, [WriteSample(r, ip, self._rate(ip)) for ip, (r, _) in WRITERS.items()]


def operate(seconds: float = 20.0):
    """The operate.md daemon, run `seconds` of virtual time."""
    vt = VirtualTime()
    vt.now = START
    act = FakeActuator(lambda: vt.now)
    cfg = parse_config(OPERATE, CONFIG_PATH)
    d = Daemon(
        cfg,
        ArraySensors(act, cfg.ladder),
        act,
        clock=vt.clock,
        sleep=vt.sleep,
        load_config=lambda p: parse_config(OPERATE, str(p)),
    )
    d.audit.wall = vt.clock  # `why` dates its events on the examples' day
    run_for(d, vt, seconds)
    return d, lambda: run_for(d, vt, 1.0)


def groups(seconds: float = 6.0):
    """tests/unit/test_group_cli.py's daemon."""
    from .test_daemon import make
    from .test_daemon_groups import GROUPS, GroupSensors

    conf = GROUPS.replace('members = ["10.0.0.0/24"]', 'members = ["10.0.0.3"]')
    d, vt, s, _act = make(conf)
    d.sensors = GroupSensors(s)
    run_for(d, vt, seconds)
    return d, lambda: run_for(d, vt, 1.0)


def hosts(seconds: float = 4.0):
    """tests/unit/test_ipv6_hosts.py's dual-stack host, with two more writers."""
    from .test_daemon import MIB, make
    from .test_ipv6_hosts import ABSOLUTE, HOSTS

    d, vt, s, _act = make(ABSOLUTE + HOSTS)
    long6 = "fd00:1234:5678:9abc:def0:1234:5678:9abc"
    s.writers = {"10.0.1.5": "vg0", "fd00:1::5": "vg0", "10.0.0.9": "vg0", long6: "vg0"}
    s.write_bps = 0.6 * MIB
    run_for(d, vt, seconds)
    return d, lambda: run_for(d, vt, 1.0)


def fleet(seconds: float = 2.0):
    """tests/unit/test_daemon_fleet.py's fleet of two, seen from b."""
    from .test_daemon_fleet import Fleet

    f = Fleet()
    f.run(seconds)
    return f.daemons["b"], lambda: f.run(1.0)


def levels(seconds: float = 12.0):
    """tests/unit/test_levels_daemon.py's daemon, its group at its top level."""
    from .test_daemon import make
    from .test_levels_daemon import LEVELS, LevelSensors

    d, vt, s, _act = make(LEVELS)
    d.sensors = LevelSensors(s, d)
    s.latency_s = 0.008
    run_for(d, vt, seconds)
    return d, lambda: run_for(d, vt, 1.0)
