"""The data path on the real kernel (Debian 6.1 under QEMU: netem, LIO, open-iscsi).

The lab tier (`pytest -m lab`, one guest boot for the whole tier): the data
path builds with real netem leaves and cleans up without a trace; the time to
move a fixed amount of data grows linearly with the delay for reads (`read`
mode) and writes (`all` mode) on one initiator, 64k qd1, three delays, with
no target retransmission; and a lowered delay keeps each initiator's packets
in order (glide leaves).  Short on purpose (tens of seconds each).  The full
curves and the idle cost are vagrant/experiments/datapath_lab.py's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labkit import fio, probes, speed, topology
from labkit.curves import DEVICE, NETNS, PORTS, WARMUP_SIZE, curve, diff, fit
from labkit.curves import counters as tcp_counters

pytestmark = pytest.mark.lab

sh = topology.sh

# CI subset: one initiator, 64k qd1, these delays (ms); R^2 floor from the issue.
# The lab's shared disk is QEMU-throttled and the host's other guests share
# the CPUs: the 0 ms point varies by up to 2x, so the CI delays reach 40 ms
# where the delay dominates: at 0, 10 and 20 ms beside two busy loops, the reads took
# 3.13, 3.80 and 5.42 s at best, the 20 ms adding 2.3 s to a base that moves by more
# than 0.5 s, and R^2 was 0.945
CI_DELAYS_MS = (0.0, 20.0, 40.0)
CI_SIZE = 8 << 20
R2_MIN = 0.95
# each point the fastest of three transfers, one per round over the delays: a busy host
# stalls the emulated CPU for part of one (R^2 0.939 once at a load of 9), or for a
# stretch of several (0.934 with three guests on the two cores), which is the host's,
# not the delay's
CI_REPEAT = 3


def kernel_text(netns: str = NETNS, device: str = DEVICE) -> dict[str, str]:
    def ns(*cmd):
        return sh(["ip", "netns", "exec", netns, *cmd])

    return {
        "tc qdisc": ns("tc", "qdisc", "show", "dev", device),
        "ipset list": ns("ipset", "list"),
        "iptables mangle": ns("iptables", "-t", "mangle", "-S"),
    }


# ============================================================== CI tests
@pytest.fixture
def datapath(topology):
    """The data path on the lab target's egress veth, real netem leaves;
    cleaned up whatever the test does."""
    from santhrottle.appliance.datapath import Datapath, DatapathSpec

    d = Datapath(DatapathSpec((DEVICE,), ports=PORTS), netns=topology["netns"])
    try:
        yield d
    finally:
        try:
            d.cleanup()
        finally:
            d.close()


def test_datapath_builds_with_netem_and_cleans_up(topology, datapath):
    before = kernel_text(topology["netns"])
    t0 = time.monotonic()
    rep = datapath.apply()
    build_s = time.monotonic() - t0
    assert rep.tc_fresh and rep.backend in ("nf_tables", "legacy")
    qd = sh(["ip", "netns", "exec", NETNS, "tc", "qdisc", "show", "dev", DEVICE])
    assert "qdisc htb 5374: root" in qd
    # sized for the default link speed; 500us is kept as 7812 ticks of 64 ns
    # (499.968 us): tc prints 499us
    from santhrottle.appliance.datapath.tctree import netem_limit

    link = datapath.spec.link_bits_s
    # the default ladder: 0.5 ms steps to 10 ms (class 20), x1.05 above, 250 ms (class 88)
    lim = {k: netem_limit(link, datapath.spec.delay_us(k)) for k in (1, 20, 44, 88)}
    assert re.search(rf"qdisc netem 1: parent 5374:1 limit {lim[1]} delay (499|500)us", qd), qd
    assert f"qdisc netem 20: parent 5374:20 limit {lim[20]} delay 10ms" in qd, qd
    assert f"qdisc netem 44: parent 5374:44 limit {lim[44]} delay 30.5ms" in qd, qd
    assert f"qdisc netem 88: parent 5374:88 limit {lim[88]} delay 250ms" in qd, qd
    assert "parent 5374:89 " not in qd, qd
    from santhrottle.appliance.datapath import discover
    from santhrottle.appliance.datapath.rules import jump_rule

    rules = sh(["ip", "netns", "exec", NETNS, "iptables", "-t", "mangle", "-S"])
    assert "--map-set santhrottle-ack dst --map-prio" in rules
    assert "POSTROUTING" not in rules.replace("-P POSTROUTING ACCEPT", "")  # idle: no jump
    # the tree read back through pyroute2 (netem's delay field) is what we asked
    with discover(netns=NETNS) as found:
        s = found.spec
        assert (s.devices, s.ports) == ((DEVICE,), PORTS)
        assert s.ladder == datapath.spec.ladder and s.max_class == 88
    datapath.set_classes({"192.0.2.250": 1})  # the first member brings the jump
    assert jump_rule(DEVICE) in sh(["ip", "netns", "exec", NETNS, "iptables", "-t", "mangle", "-S"])
    datapath.set_classes({"192.0.2.250": 0}, ordered=False)
    steps = ", ".join(f"{k} {v:.2f} s" for k, v in rep.timings_s.items())
    print(
        f"{datapath.spec.max_class} netem classes + sets + rules applied in {build_s:.2f} s "
        f"({steps}; {rep.summary()})"
    )
    t0 = time.monotonic()
    again = datapath.apply()
    print(f"apply again (adopt): {time.monotonic() - t0:.2f} s")
    assert again.tc_lines == 0 and not again.rules_changed
    datapath.cleanup()
    assert kernel_text(topology["netns"]) == before


def test_time_grows_linearly_with_delay(topology, datapath):
    """Paper figs 8/9 in small: seconds per GB vs delay for 64k qd1 reads
    (`read` mode) and writes (`all` mode) of one initiator, each point the fastest of
    CI_REPEAT transfers in rounds over the delays; R^2 >= 0.95 and
    the target never loses a segment: every retransmission it makes is one the
    initiator reports as a duplicate (D-SACK), a tail-loss probe or timeout of a
    stalled emulated vCPU, never the repair of a drop."""
    ini = topology["iscsi"][0]
    datapath.apply()
    out = {}
    for mode, rw in (("read", "read"), ("all", "write")):
        pts = curve(
            datapath, ini["initiator_ip"], ini["device"], mode, rw, "64k", 1, CI_SIZE,
            CI_DELAYS_MS, repeat=CI_REPEAT,
        )  # fmt: skip
        out[mode] = s = fit(pts)
        print(
            f"{mode}/{rw}: {[round(p['mb_s'], 1) for p in pts]} MB/s at {CI_DELAYS_MS} ms; "
            f"fit {s['intercept_s_per_gb']:.1f} + {s['slope_s_per_gb_per_ms']:.1f} s/GB per ms, "
            f"R^2 {s['r2']:.3f}; target retrans {s['retrans']} ({s['dsack']} D-SACKed, "
            f"{s['tlp']} tail-loss probes; at the class changes: "
            f"{s['transition_retrans']}, {s['transition_tlp']} tail-loss probes)"
        )
    for mode, s in out.items():
        assert s["slope_s_per_gb_per_ms"] > 0, mode
        assert s["r2"] >= R2_MIN, f"{mode}: R^2 {s['r2']:.3f}"
        assert s["retrans"] <= s["dsack"], (
            f"{mode}: the target retransmitted {s['retrans']} segments, only {s['dsack']} "
            "of them reported as duplicates: a segment was lost"
        )


DESCENTS = 4  # the glide leaf's descents
# The control run descends until the target has seen reordering or retransmitted, up
# to this many times: one descent reorders often, not always (the reads can fall into step).
MAX_CONTROL_DESCENTS = 16
READER_START_S = 30.0  # fio on the two-vCPU guest can take seconds to issue its first read
READER_RUNTIME_S = 600  # longer than any run of descents (a glide one: ~35 s); stopped after them
# after the reader stops, its glide leaf hands it out of the set within this
SETTLE_AFTER_READER_S = 20.0


def _reads_done(device: str) -> int:
    """Reads completed on the initiator's block device."""
    return probes.all_diskstats()[Path(device).resolve().name][0]


def _start_reader(device: str) -> subprocess.Popen:
    """A 64k qd4 random read on device, once it is reading."""
    cmd = fio.argv(
        "descent", device, "--rw=randread", "--bs=64k", "--iodepth=4", runtime=READER_RUNTIME_S
    )
    before = _reads_done(device)
    reader = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + speed.budget(READER_START_S)
    while _reads_done(device) == before:
        if reader.poll() is not None or time.monotonic() > deadline:
            _stop(reader)
            pytest.fail(f"fio on {device} did not read within {READER_START_S:.0f} s")
        time.sleep(0.05)
    return reader


def _stop(reader: subprocess.Popen) -> None:
    if reader.poll() is None:
        reader.terminate()  # fio ends its jobs on SIGTERM
    reader.wait(timeout=speed.budget(60))


def _climb(d, ip, to_class: int, ordered: bool) -> None:
    """Back up from 0 the way the controller's ramp goes (x1.25 per tick, at
    least 2 classes): going up does not reorder by itself, but a jump past the target's
    tail-loss probe timer (2 x srtt + 2 jiffies) makes it send a spurious
    probe, which would count here against the descent under test."""
    from santhrottle.controller.domain import ControllerConfig
    from santhrottle.controller.ramp import rise

    cfg = ControllerConfig()
    k = 0
    while k < to_class:
        k = min(to_class, rise(k, cfg))
        d.set_classes({ip: k}, mode="read", ordered=ordered)
        time.sleep(cfg.tick_s)


def _descend(
    d, ip, device, ordered: bool, start_class: int, step_classes: int, descents: int | None
) -> dict:
    """A 64k qd4 read runs while the member's delay goes down from start_class to 0
    in steps, `descents` times, or (None) until a descent made the target see
    reordering or retransmit, at most MAX_CONTROL_DESCENTS (back up by the
    controller's ramp between them); returns the target's TCP counters over it."""
    from santhrottle.appliance.datapath import glide_status

    d.set_classes({ip: start_class}, mode="read", ordered=ordered)
    fio.once(device, "read", "64k", 4, WARMUP_SIZE, offset=CI_SIZE)  # RTT settles
    c0 = tcp_counters()
    reader = _start_reader(device)
    delays = []
    # where the target saw reordering / retransmitted: (after what, how many)
    seen: list[tuple[str, int, int]] = []
    last = c0

    def look(what: str) -> None:
        nonlocal last
        now = tcp_counters()
        reorder = now["TcpExtTCPSACKReorder"] - last["TcpExtTCPSACKReorder"]
        retrans = now["TcpRetransSegs"] - last["TcpRetransSegs"]
        if reorder or retrans:
            seen.append((what, reorder, retrans))
        last = now

    n = 0
    try:
        time.sleep(1.0)
        while n < (descents or MAX_CONTROL_DESCENTS):
            if n:
                _climb(d, ip, start_class, ordered)
                time.sleep(0.3)
                look(f"climb {n}")
            for k in range(start_class - step_classes, -1, -step_classes):
                d.set_classes({ip: k}, mode="read", ordered=ordered)
                if ordered:
                    if any(g["lowering_to_us"] is not None for g in glide_status(d)):
                        # just moved in: lowered once its older packets have left
                        time.sleep(start_class * d.spec.step_s + 0.005)
                        d.advance_glides()
                    delays.append([g["delay_us"] for g in glide_status(d) if g["members"]])
                time.sleep(0.3)
                d.advance_glides()
                look(f"descent {n} to class {k}")
            n += 1
            if descents is None and any(w.startswith("descent") for w, _, _ in seen):
                break
        assert reader.poll() is None, "the reader ended before the descents did"
    finally:
        _stop(reader)
    # advance_glides() hands the leaf's member out of the set once a look saw the leaf
    # quiet since the one before: the reader has stopped (a pair of looks that saw it
    # still reading waits up to LOOK_GAP_MAX_S for the next): two looks, a gap
    # apart. Under TCG one advance_glides() there (ipset and qdisc dumps) took about 2 s
    # (2 calls in 4.2 s), and 6 s with two busy loops on the host: every gap then holds
    # the session's keepalive (NOP-Out/NOP-In every 5 s), which the planner counts as
    # quiet (under a packet a tick). It is the handoff, not its speed, that the test
    # asserts.
    t0 = time.monotonic()
    deadline = t0 + speed.budget(SETTLE_AFTER_READER_S)
    rounds = 0
    while True:
        time.sleep(start_class * d.spec.step_s)
        d.advance_glides()
        rounds += 1
        if ip not in d.current() or time.monotonic() > deadline:
            break
    elapsed = time.monotonic() - t0
    print(f"handed out after the reader: {elapsed:.2f} s, {rounds} advance_glides() calls")
    look("after the reader")
    out = diff(c0, tcp_counters())
    out["descents"] = n
    out["glide_delays_us"] = delays
    out["seen_after"] = seen
    return out


def test_a_lowered_delay_keeps_each_initiators_packets_in_order(topology, datapath):
    """Lowering the delay under a steady 64k qd4 read, 20 ms -> 10 ms -> 0:
    moved between the shared classes, the responses sent after a change
    overtake those still in the slower class (the target sees SACKed holes
    and retransmits); gliding, the leaf's delay goes down in place and
    netem's rate keeps its queue in order."""
    from santhrottle.appliance.datapath import glide_status

    ini = topology["iscsi"][0]
    datapath.apply()
    ip, device = ini["initiator_ip"], ini["device"]
    plain = _descend(datapath, ip, device, False, start_class=40, step_classes=20, descents=None)
    glide = _descend(datapath, ip, device, True, start_class=40, step_classes=20, descents=DESCENTS)
    assert ip not in datapath.current(), (
        f"not settled out of the set at delay 0 within {SETTLE_AFTER_READER_S:g} s: "
        f"{glide_status(datapath)}"
    )
    for name, c in (("shared classes", plain), ("glide leaf", glide)):
        print(
            f"{c['descents']} x (20 ms -> 10 ms -> 0) under a 64k qd4 read, {name}: target retrans "
            f"{c['TcpRetransSegs']}, SACK reordering seen {c['TcpExtTCPSACKReorder']}, "
            f"DSACKs {c['TcpExtTCPDSACKRecv']}, TLPs {c['TcpExtTCPLossProbes']}"
        )
    print(f"glide leaf delays read back after each step (us): {glide['glide_delays_us']}")
    print(f"glide leaf: (step, reorderings, retransmissions) {glide['seen_after']}")
    print(f"all counters: shared classes {plain}; glide leaf {glide}")
    assert glide["glide_delays_us"] == [[10000], [0]] * DESCENTS
    assert plain["TcpExtTCPSACKReorder"] + plain["TcpRetransSegs"] > 0, (
        "the control run did not reorder: this test cannot tell"
    )
    # What the glide leaf removes is the overtaking: the target sees no reordering,
    # and so makes no fast retransmission.  The two-vCPU guest makes a few tail-loss
    # probes with no reordering at all, with or without a delay, more on a busy host
    # (docs/lab.md, "Controlled"): every retransmission through the glide leaf is one.
    assert glide["TcpExtTCPSACKReorder"] == 0, (glide, plain)
    assert glide["TcpRetransSegs"] <= glide["TcpExtTCPLossProbes"], (glide, plain)


def test_datapath_apply_json_from_the_cli(topology, datapath):
    """`santhrottle datapath apply --json` with real netem leaves: what it applied and
    what changed, then nothing on a second run (the privileged tier has no netem)."""

    def apply():
        p = subprocess.run(
            [sys.executable, "-m", "santhrottle.appliance.cli", "datapath", "apply",
             "--device", DEVICE, "--ports", ",".join(map(str, PORTS)), "--netns", topology["netns"],
             "--json"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert set(doc) == {"protocol", "data"}
        return doc["data"]

    first = apply()
    assert first["device"] == DEVICE and first["ports"] == list(PORTS)
    assert first["ladder"]["classes"] == datapath.spec.max_class
    assert first["report"]["tc_fresh"] and first["report"]["backend"] in ("nf_tables", "legacy")
    again = apply()
    assert again["report"]["tc_lines"] == 0 and not again["report"]["rules_changed"]
