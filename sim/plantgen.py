"""Plant generator: seeded random simulator scenarios for the robustness sweep.

Problem
    One shipped scenario (sim/scenarios/paper.toml) says little about
    the arrays and initiators the appliance meets: intercepts from NVMe to
    disk, one heavy host or forty light ones, joins all at once or one by
    one. `santhrottle-simulate --sweep` (sim/sweep.py) judges the
    controller on hundreds of plants drawn here; each is plain scenario TOML,
    so any one replays with `santhrottle-simulate FILE`.

Law (what one plant is; all draws from random.Random(f"plantgen:{seed}:{index}"))
    resource 0: intercept C log-uniform 0.1-10 ms, LQ-slope m log-uniform
        0.05-10 ms/IO, read noise uniform 0-0.5; an open-loop random 4 KiB
        reader at log-uniform 64 KiB/s-1 MiB/s, capped so that m * read
        IOPS <= 0.45 (the reader alone never saturates).
    idle latency L0 = C / (1 - m * read IOPS) (the reader alone, the LQ line's
        fixed point); threshold T = r * L0, r log-uniform 1.5-10.
    writers, one family per plant:
        heavy  1 host;   few 2-8 hosts;   many 9-40 hosts (log-uniform);
        light  20-40 hosts that each write under LIGHT_HOST_MAX_BPS at zero
               delay (below the default write-heavy enter threshold of
               1 MiB/s) and together push the array past T and past half
               its peak IOPS; they switch on together (simultaneous or
               onoff: one alone would write more).
        Per host: threads 1-8 and depth 1-32 (log-uniform integers), one
        closed stream of depth threads * depth (identical in the fluid
        model), size a power of two 4 KiB-1 MiB (log-uniform).
    schedule, one kind per plant (start s0 uniform 2-10 s, duration 60-90 s):
        simultaneous     all hosts on at s0, to the end
        onoff            all hosts on together for 10-30 s, off for 3-10 s
                         (the paper's 20 s / 5 s)
        staggered        host i on at s0 + i * gap, to the end
        staggered_onoff  on/off as above, host i's cycle shifted by i * gap
    second resource (probability TWO_RESOURCE_P): own C, m, noise, reader,
        idle latency within T/10-T/1.5; 1-all of resource 0's hosts also
        write to it (the same initiators: one delay for both), plus 0-3 own
        hosts.
    settle (statistics start): the end of the first host's first on-period,
        or s0 + ALWAYS_ON_SETTLE_S for writers that stay on.

Bounds (rejection: a draw that misses one is redrawn whole, so the ranges
above are those of the accepted plants, conditioned on)
    - with every writer on undelayed, resource 0's fluid latency is at least
      NEEDS_THROTTLE_RATIO * T (the plant needs a delay);
    - with every writer at the ladder's maximum delay it is at most
      FEASIBLE_MARGIN * T (a constant delay within the ladder can hold T,
      leaving room for the read noise; the sweep checks it for real);
    - resource 1 (if any) is at most FEASIBLE_MARGIN * T at the uniform
      delay that holds resource 0 at 0.9 T: a constant delay that holds
      resource 0 holds it too, so the sweep's best constant delay (judged
      on resource 0, where the simulator measures) is a fair reference.

Worked example
    generate(1, 0) is one scenario's TOML (its parameters in a comment at
    the top); draw(1, 0).describe() is the same in one line:
    "few: 2 hosts (depth 1-22, 64-256 KiB), staggered_onoff on 27.3 s off
    5.5 s gap 9 s; C 0.126 ms m 0.161 ms/IO noise 0.05; read 252 KiB/s;
    T 0.2198 ms (1.7x idle); 2nd resource: 2 shared + 2 own hosts":
    two hosts of 1 and 22 IOs in flight take turns, 27.3 s on and 5.5 s
    off each, the second 9 s after the first, and both also write to a
    second array that has two writers of its own.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from santhrottle.controller.ladder import Ladder

from .plant import Device, solve_latency

KIB = 1024.0
MIB = 1024.0 * 1024.0
FAMILIES = ("heavy", "few", "many", "light")
FAMILY_WEIGHTS = (0.2, 0.3, 0.25, 0.25)
SCHEDULES = ("simultaneous", "onoff", "staggered", "staggered_onoff")
INTERCEPT_MS = (0.1, 10.0)
SLOPE_MS_PER_IO = (0.05, 10.0)
NOISE = (0.0, 0.5)
READ_KIB_PER_S = (64.0, 1024.0)
READ_SIZE_KIB = 4.0
# m * read IOPS at most this: the reader alone stays far from saturation (< 0.5).
READ_UTILIZATION_MAX = 0.45
THRESHOLD_RATIO = (1.5, 10.0)
THREADS = (1, 8)
DEPTH = (1, 32)
SIZE_KIB = (4, 1024)
HOSTS = {"heavy": (1, 1), "few": (2, 8), "many": (9, 40), "light": (20, 40)}
# Under the controller's default write-heavy enter threshold (1 MiB/s) with margin.
LIGHT_HOST_MAX_BPS = 0.95 * MIB
# The light hosts together: m * (their IOPS) at least this (the array is busy).
LIGHT_UTILIZATION_MIN = 0.5
DURATION_S = (60.0, 90.0)
START_S = (2.0, 10.0)
ON_S = (10.0, 30.0)
OFF_S = (3.0, 10.0)
# Staggered joins: hosts join within this long of the first one.
STAGGER_SPAN_S = 40.0
STAGGER_GAP_S = (0.5, 5.0)
# Writers that stay on: statistics start this long after they switch on
# (the write-heavy sets learn who writes meanwhile).
ALWAYS_ON_SETTLE_S = 15.0
# Statistics run at least this long after the settle time.
MIN_MEASURED_S = 30.0
TWO_RESOURCE_P = 0.3
NEEDS_THROTTLE_RATIO = 1.2
FEASIBLE_MARGIN = 0.8
MAX_ATTEMPTS = 10_000
# A plant with a second resource redraws that resource alone this often first.
SECOND_ATTEMPTS = 200


@dataclass(frozen=True, slots=True)
class Host:
    initiator: str
    threads: int
    depth: int  # per thread; the stream's depth is threads * depth
    size_kib: int
    start_s: float
    depth_r1: int = 0  # its stream's depth on resource 1 (0: does not write there)


@dataclass(frozen=True, slots=True)
class ResourceDraw:
    name: str
    intercept_ms: float
    slope_ms_per_io: float
    noise: float
    read_kib_per_s: float

    @property
    def read_iops(self) -> float:
        return self.read_kib_per_s / READ_SIZE_KIB

    @property
    def device(self) -> Device:
        return Device(self.intercept_ms / 1000.0, self.slope_ms_per_io / 1000.0)

    @property
    def idle_s(self) -> float:
        """The reader's latency with no writers: C / (1 - m * read IOPS)."""
        return solve_latency(self.device, self.read_iops, [])


@dataclass(frozen=True, slots=True)
class Plant:
    seed: int
    index: int
    family: str
    schedule: str
    duration_s: float
    settle_s: float
    on_s: float | None  # None: writers stay on
    off_s: float
    resources: tuple[ResourceDraw, ...]
    hosts: tuple[Host, ...]  # resource 0's writers, then resource 1's own
    own_r1: int  # how many of the last hosts write to resource 1 only
    threshold_ms: float

    @property
    def threshold_ratio(self) -> float:
        return self.threshold_ms / 1000.0 / self.resources[0].idle_s

    def params(self) -> dict[str, object]:
        """The plant's parameters, flat (for a sweep's report)."""
        r0 = self.resources[0]
        h0 = self.hosts[: len(self.hosts) - self.own_r1]
        return {
            "seed": self.seed,
            "index": self.index,
            "family": self.family,
            "schedule": self.schedule,
            "hosts": len(h0),
            "resources": len(self.resources),
            "stream_depth_max": max(h.threads * h.depth for h in h0),
            "stream_depth_total": sum(h.threads * h.depth for h in h0),
            "size_kib_max": max(h.size_kib for h in h0),
            "intercept_ms": r0.intercept_ms,
            "slope_ms_per_io": r0.slope_ms_per_io,
            "noise": r0.noise,
            "read_kib_per_s": r0.read_kib_per_s,
            "threshold_ms": self.threshold_ms,
            "threshold_x_idle": round(self.threshold_ratio, 2),
            "on_s": self.on_s,
            "off_s": self.off_s,
            "duration_s": self.duration_s,
        }

    def describe(self) -> str:
        r0 = self.resources[0]
        h0 = self.hosts[: len(self.hosts) - self.own_r1]
        depths = [h.threads * h.depth for h in h0]
        sizes = [h.size_kib for h in h0]
        sched = self.schedule
        if self.on_s is not None:
            sched += f" on {self.on_s:g} s off {self.off_s:g} s"
        if self.schedule.startswith("staggered") and len(h0) > 1:
            sched += f" gap {h0[1].start_s - h0[0].start_s:g} s"
        two = ""
        if len(self.resources) > 1:
            shared = sum(1 for h in h0 if h.depth_r1)
            two = f"; 2nd resource: {shared} shared + {self.own_r1} own hosts"
        return (
            f"{self.family}: {len(h0)} host{'s' if len(h0) > 1 else ''} "
            f"(depth {_span(depths)}, {_span(sizes)} KiB), {sched}; "
            f"C {r0.intercept_ms:g} ms m {r0.slope_ms_per_io:g} ms/IO noise {r0.noise:g}; "
            f"read {r0.read_kib_per_s:g} KiB/s; T {self.threshold_ms:g} ms "
            f"({self.threshold_ratio:.1f}x idle){two}"
        )

    def toml(self) -> str:
        lines = [
            f"# plantgen seed {self.seed} index {self.index} (sim/plantgen.py)",
            f"# {self.describe()}",
            "",
            "[run]",
            f"duration_s = {self.duration_s!r}",
            f"settle_s = {self.settle_s!r}",
            f"seed = {self.seed * 100_003 + self.index}",
            f"thresholds_ms = [{self.threshold_ms!r}]",
        ]
        for r in self.resources:
            lines += [
                "",
                "[[resource]]",
                f'name = "{r.name}"',
                f"intercept_ms = {r.intercept_ms!r}",
                f"slope_ms_per_io = {r.slope_ms_per_io!r}",
                f"noise = {r.noise!r}",
            ]
        for i, r in enumerate(self.resources):
            lines += _stream(f"reader{i}", "read", "open", r.name, f"10.1.0.{i + 2}", READ_SIZE_KIB)
            lines.append(f"rate_kib_per_s = {r.read_kib_per_s!r}")
        n0 = len(self.hosts) - self.own_r1
        for i, h in enumerate(self.hosts):
            sched = self._schedule(h)
            if i < n0:
                lines += _stream(f"w{i}", "write", "closed", "r0", h.initiator, h.size_kib)
                lines += [f"depth = {h.threads * h.depth}", sched]
            if h.depth_r1:
                lines += _stream(f"w{i}r1", "write", "closed", "r1", h.initiator, h.size_kib)
                lines += [f"depth = {h.depth_r1}", sched]
        lines.append("")
        return "\n".join(lines)

    def _schedule(self, h: Host) -> str:
        if self.on_s is None:
            return f"schedule = {{ start_s = {h.start_s!r} }}"
        return (
            f"schedule = {{ start_s = {h.start_s!r}, on_s = {self.on_s!r}, "
            f"off_s = {self.off_s!r} }}"
        )


def _span(xs: list[int]) -> str:
    return f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}-{max(xs)}"


def _stream(
    name: str, kind: str, loop: str, resource: str, initiator: str, size_kib: float
) -> list[str]:
    return [
        "",
        "[[stream]]",
        f'name = "{name}"',
        f'kind = "{kind}"',
        f'loop = "{loop}"',
        f'resource = "{resource}"',
        f'initiator = "{initiator}"',
        f"size_kib = {size_kib:g}",
    ]


def generate(seed: int, index: int) -> str:
    """Plant `index` of sweep `seed`: one scenario's TOML text (reproducible)."""
    return draw(seed, index).toml()


def draw(seed: int, index: int) -> Plant:
    """Plant `index` of sweep `seed`, drawn until it meets the module's Bounds."""
    rng = random.Random(f"plantgen:{seed}:{index}")
    for _ in range(MAX_ATTEMPTS):
        plant = _attempt(rng, seed, index)
        if plant is not None:
            return plant
    raise RuntimeError(f"plantgen: no plant for seed {seed} index {index}")  # pragma: no cover


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer lo-hi, log-uniform (each octave as likely)."""
    return min(hi, int(_log_uniform(rng, lo, hi + 1)))


def _sig(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def _resource(rng: random.Random, name: str) -> ResourceDraw:
    c_ms = _sig(_log_uniform(rng, *INTERCEPT_MS))
    m_ms = _sig(_log_uniform(rng, *SLOPE_MS_PER_IO))
    cap = READ_UTILIZATION_MAX / (m_ms / 1000.0) * READ_SIZE_KIB
    read = _sig(_log_uniform(rng, READ_KIB_PER_S[0], min(READ_KIB_PER_S[1], cap)))
    noise = round(rng.uniform(*NOISE), 2)
    return ResourceDraw(name, c_ms, m_ms, noise, read)


def _latency_s(r: ResourceDraw, depths: list[int], delay_s: float) -> float:
    return solve_latency(r.device, r.read_iops, [(float(sum(depths)), delay_s)])


def _attempt(rng: random.Random, seed: int, index: int) -> Plant | None:
    family = rng.choices(FAMILIES, FAMILY_WEIGHTS)[0]
    # light hosts join together: each is under the bound only while all are on
    schedule = rng.choice(SCHEDULES[:2] if family == "light" else SCHEDULES)
    r0 = _resource(rng, "r0")
    lo, hi = THRESHOLD_RATIO
    idle_s = r0.idle_s
    thr_ms = _sig(_log_uniform(rng, lo, hi) * idle_s * 1000.0, 4)
    if not lo <= thr_ms / 1000.0 / idle_s <= hi:
        return None
    thr_s = thr_ms / 1000.0
    n = _log_int(rng, *HOSTS[family])
    if family == "light":
        threads = [rng.randint(1, 2) for _ in range(n)]
        depths = [_log_int(rng, 1, 4) for _ in range(n)]
    else:
        threads = [_log_int(rng, *THREADS) for _ in range(n)]
        depths = [_log_int(rng, *DEPTH) for _ in range(n)]
    stream_depths = [t * q for t, q in zip(threads, depths, strict=True)]
    sizes = [4 << rng.randint(0, 8) for _ in range(n)]
    unthrottled_s = _latency_s(r0, stream_depths, 0.0)
    if unthrottled_s < NEEDS_THROTTLE_RATIO * thr_s:
        return None
    max_delay_s = Ladder().max_delay_s
    if _latency_s(r0, stream_depths, max_delay_s) > FEASIBLE_MARGIN * thr_s:
        return None
    if family == "light":
        # the size is free in the LQ model (it counts IOs): the largest power
        # of two that keeps every host under the per-host bound
        sizes = [
            min(s, _pow2_floor(LIGHT_HOST_MAX_BPS * unthrottled_s / d / KIB))
            for s, d in zip(sizes, stream_depths, strict=True)
        ]
        if min(sizes) < SIZE_KIB[0]:
            return None
        util = r0.slope_ms_per_io / 1000.0 * sum(stream_depths) / unthrottled_s
        if util < LIGHT_UTILIZATION_MIN:
            return None

    duration_s = float(round(rng.uniform(*DURATION_S)))
    s0 = round(rng.uniform(*START_S), 1)
    on_s: float | None = None
    off_s = 0.0
    if schedule in ("onoff", "staggered_onoff"):
        on_s = round(rng.uniform(*ON_S), 1)
        off_s = round(rng.uniform(*OFF_S), 1)
    gap = 0.0
    if schedule == "staggered" and n > 1:
        gap = min(_log_uniform(rng, *STAGGER_GAP_S), STAGGER_SPAN_S / (n - 1))
    elif schedule == "staggered_onoff" and n > 1 and on_s is not None:
        gap = rng.uniform(0.2, 1.0) * (on_s + off_s) / n
    gap = max(round(gap, 1), 0.1) if gap else 0.0
    settle_s = round(s0 + (on_s if on_s is not None else ALWAYS_ON_SETTLE_S), 1)
    if settle_s + MIN_MEASURED_S > duration_s:
        return None
    hosts = [
        Host(f"10.0.{i // 200}.{i % 200 + 10}", threads[i], depths[i], sizes[i], s0 + i * gap)
        for i in range(n)
    ]
    hosts = [Host(h.initiator, h.threads, h.depth, h.size_kib, round(h.start_s, 1)) for h in hosts]
    resources: tuple[ResourceDraw, ...] = (r0,)
    own_r1 = 0
    if rng.random() < TWO_RESOURCE_P:
        for _ in range(SECOND_ATTEMPTS):
            second = _second_resource(
                rng, r0, stream_depths, thr_s, hosts, max_delay_s, family == "light"
            )
            if second is not None:
                break
        else:
            return None
        r1, hosts, own_r1 = second
        resources = (r0, r1)
    return Plant(
        seed=seed,
        index=index,
        family=family,
        schedule=schedule,
        duration_s=duration_s,
        settle_s=settle_s,
        on_s=on_s,
        off_s=off_s,
        resources=resources,
        hosts=tuple(hosts),
        own_r1=own_r1,
        threshold_ms=thr_ms,
    )


def _pow2_floor(x: float) -> int:
    return 0 if x < 1.0 else 1 << math.floor(math.log2(x))


def _uniform_delay_s(r: ResourceDraw, depths: list[int], target_s: float, hi_s: float) -> float:
    """The delay of every writer that puts r's fluid latency at target_s (bisection)."""
    lo = 0.0
    hi = hi_s
    for _ in range(50):
        mid = (lo + hi) / 2.0
        if _latency_s(r, depths, mid) > target_s:
            lo = mid
        else:
            hi = mid
    return hi


def _second_resource(
    rng: random.Random,
    r0: ResourceDraw,
    depths0: list[int],
    thr_s: float,
    hosts: list[Host],
    max_delay_s: float,
    light: bool,
) -> tuple[ResourceDraw, list[Host], int] | None:
    r1 = _resource(rng, "r1")
    if not THRESHOLD_RATIO[0] <= thr_s / r1.idle_s <= THRESHOLD_RATIO[1]:
        return None
    shared = rng.sample(range(len(hosts)), rng.randint(1, len(hosts)))
    out = list(hosts)
    for i in shared:
        h = out[i]
        # a light host stays light on resource 1 too
        d1 = h.threads * h.depth if light else _log_int(rng, *THREADS) * _log_int(rng, *DEPTH)
        out[i] = Host(h.initiator, h.threads, h.depth, h.size_kib, h.start_s, d1)
    own = rng.randint(0, 3)
    n = len(hosts)
    last = hosts[-1].start_s
    for j in range(own):
        d1 = _log_int(rng, *THREADS) * _log_int(rng, *DEPTH)
        k = n + j
        ini = f"10.0.{k // 200}.{k % 200 + 10}"
        out.append(Host(ini, 1, 0, 4 << rng.randint(0, 8), last, d1))
    depths1 = [h.depth_r1 for h in out if h.depth_r1]
    d_hold = _uniform_delay_s(r0, depths0, 0.9 * thr_s, max_delay_s)
    if _latency_s(r1, depths1, d_hold) > FEASIBLE_MARGIN * thr_s:
        return None
    return r1, out, own
