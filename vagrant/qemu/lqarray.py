# nbdkit python plugin: the lab's shared array as a known plant (docs/lab.md,
# "The array as a known plant").  lab.py --array nbd starts it on the host:
#
#   nbdkit -f --unix SOCK --threads 64 python vagrant/qemu/lqarray.py \
#       file=IMG size=8G model=lq c_ms=2 m_ms=5 stats=WORK/array-stats.json
#
# Data lives in a sparse file; only the timing is modelled.  Models:
#
#   lq      Pesto's LQ line on the mean queue, the simulator's plant
#           (sim/plant.py, sim/loop.py): every IO, read or write
#           of any size, takes L = C + m * Qbar, Qbar the number of IOs in
#           flight at this server averaged (exponentially, time constant
#           tau_ms) up to the IO's arrival.  In steady state the mean of
#           Qbar is the time-average queue Q, so the mean latency is C + m*Q
#           for the very Q that Little's law and diskstats measure.  The
#           device's peak is 1/m IOPS.
#   lqnow   the same line on the instantaneous queue: L = C + m * n, n the
#           other IOs in flight when the IO arrives.  A closed-loop writer
#           never sees itself, so its latency comes out below C + m*Q (the
#           lab's fit: C 1.3 ms for a configured 2 ms; docs/lab.md).
#   fifo    a FIFO server: each IO is served in arrival order for
#           m + bytes / bw (bw_mbps=0: no size term), then takes C more in
#           parallel.  L = C + m at low load, L -> m * Q at saturation
#           (Little's law): the intercept vanishes under load.
#
# Every IO sleeps until its modelled completion; nothing holds a lock while
# sleeping, so the server never serializes by accident.  noise= multiplies
# every IO's modelled latency by a mean-1 lognormal of that relative standard
# deviation (the simulator's `noise`).  Every 0.5 s the
# cumulative counters go to stats= (JSON): ios, reads, writes, bytes, the sum
# of the IOs' latencies at this server, of the queue each IO was charged for
# (Qbar, or n), and the integral of
# the number in flight over time (its mean over an interval: Q at the server).
# control= names a JSON file the guest may write ({"c_ms": 2, "m_ms": 10}: its
# /shared/work/array-control.json, labkit.plant): read with the counters, every 0.5 s,
# a new C or m applies to the IOs that arrive from then on, and the stats say which
# parameters are in force ("config") and since when ("changed_t").  A file that is not
# such an object, or a value that is not a finite number >= 0, is ignored.

import builtins
import json
import math
import os
import random
import threading
import time

import nbdkit

API_VERSION = 2

cfg = {
    "file": None,
    "size": 8 << 30,
    "model": "lq",
    "c_ms": 2.0,
    "m_ms": 5.0,
    "bw_mbps": 0.0,
    "tau_ms": 50.0,
    "noise": 0.0,
    "stats": None,
    "control": None,
}
LIVE_KEYS = ("c_ms", "m_ms")  # what control= may change
MODELS = ("lq", "lqnow", "fifo")
lock = threading.Lock()
st = {
    "ios": 0,
    "reads": 0,
    "writes": 0,
    "bytes": 0,
    "lat_sum_s": 0.0,
    "n_arrival_sum": 0,
    "inflight_s": 0.0,  # integral of the number in flight, IO-seconds
    "busy_until": 0.0,
    "inflight": 0,
    "t_last": 0.0,
    "qbar": 0.0,
    "changed_t": None,
    "control_mtime": None,
}
fd = -1


def _size(v):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    v = v.strip().lower()
    if v and v[-1] in mult:
        return int(float(v[:-1]) * mult[v[-1]])
    return int(v)


def config(key, value):
    if key not in cfg:
        raise RuntimeError(f"lqarray: unknown parameter {key}")
    if key == "size":
        cfg[key] = _size(value)
    elif key in ("c_ms", "m_ms", "bw_mbps", "tau_ms", "noise"):
        cfg[key] = float(value)
    elif key == "model":
        if value not in MODELS:
            raise RuntimeError(f"lqarray: model must be one of {', '.join(MODELS)}")
        cfg[key] = value
    else:
        cfg[key] = value


def config_complete():
    if not cfg["file"]:
        raise RuntimeError("lqarray: file= is required")


def thread_model():
    return nbdkit.THREAD_MODEL_PARALLEL


def _control():
    """The guest's new C / m (control=), if the file changed and says something valid."""
    path = cfg["control"]
    try:
        mtime = os.stat(path).st_mtime_ns
        if mtime == st["control_mtime"]:
            return None
        st["control_mtime"] = mtime
        with builtins.open(path) as f:
            want = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(want, dict):
        return None
    out = {}
    for k in LIVE_KEYS:
        v = want.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            out[k] = float(v)
    return out or None


def _dump():
    while True:
        time.sleep(0.5)
        new = _control() if cfg["control"] else None
        with lock:
            now = time.monotonic()
            _advance(now)
            if new:
                cfg.update(new)
                st["changed_t"] = now
            snap = {k: v for k, v in st.items() if k not in ("busy_until", "control_mtime")}
        snap["t"] = now
        snap["config"] = {k: v for k, v in cfg.items() if k not in ("file", "stats", "control")}
        tmp = cfg["stats"] + ".tmp"
        try:
            with builtins.open(tmp, "w") as f:
                json.dump(snap, f)
            os.replace(tmp, cfg["stats"])
        except OSError:
            pass


def get_ready():
    global fd
    fd = os.open(cfg["file"], os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, cfg["size"])
    st["t_last"] = time.monotonic()
    if cfg["stats"]:
        threading.Thread(target=_dump, daemon=True).start()


def open(readonly):  # nbdkit's name; shadows builtins.open here
    return 1


def get_size(h):
    return cfg["size"]


def can_multi_conn(h):
    return True


def can_flush(h):
    return True


def can_trim(h):
    return False


def _advance(now):
    """Integrate the in-flight count up to now (under the lock)."""
    n, dt = st["inflight"], now - st["t_last"]
    st["inflight_s"] += n * dt
    a = math.exp(-dt / (cfg["tau_ms"] / 1e3)) if cfg["tau_ms"] > 0 else 0.0
    st["qbar"] = n + (st["qbar"] - n) * a
    st["t_last"] = now


def _noise():
    sd = cfg["noise"]
    if sd <= 0:
        return 1.0
    s2 = math.log1p(sd * sd)
    return random.lognormvariate(-s2 / 2, math.sqrt(s2))


def _arrive(nbytes, write):
    c, m = cfg["c_ms"] / 1e3, cfg["m_ms"] / 1e3
    with lock:
        now = time.monotonic()
        _advance(now)
        n = st["inflight"]
        st["inflight"] = n + 1
        if cfg["model"] == "lq":
            done = now + (c + m * st["qbar"]) * _noise()
        elif cfg["model"] == "lqnow":
            done = now + (c + m * n) * _noise()
        else:
            bw = cfg["bw_mbps"] * 1e6
            start = max(now, st["busy_until"])
            st["busy_until"] = start + (m + (nbytes / bw if bw > 0 else 0.0)) * _noise()
            done = st["busy_until"] + c
        st["n_arrival_sum"] += st["qbar"] if cfg["model"] == "lq" else n
        st["ios"] += 1
        st["writes" if write else "reads"] += 1
        st["bytes"] += nbytes
    return now, done


def _leave(t0, done):
    left = done - time.monotonic()
    if left > 0:
        time.sleep(left)
    with lock:
        now = time.monotonic()
        _advance(now)
        st["inflight"] -= 1
        st["lat_sum_s"] += now - t0


def pread(h, buf, offset, flags):
    t0, done = _arrive(len(buf), False)
    try:
        os.preadv(fd, [buf], offset)
    finally:
        _leave(t0, done)


def pwrite(h, buf, offset, flags):
    t0, done = _arrive(len(buf), True)
    try:
        os.pwrite(fd, buf, offset)
    finally:
        _leave(t0, done)


def flush(h, flags):
    pass
