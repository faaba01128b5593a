"""A 3-member etcd cluster in network namespaces this test owns, and appliances beside it.

    hub namespace: bridge br0 -- veth -- member namespace 1 (198.51.100.1, etcd m1)
                              -- veth -- member namespace 2 (198.51.100.2, etcd m2)
                              -- veth -- member namespace 3 (198.51.100.3, etcd m3)

TEST-NET-2 addresses, only inside the namespaces; no IPv6.  Each appliance is a
fleet_agent.py process in a member's namespace (an appliance that runs one of
the members, its own member first in its endpoint list).  etcd runs with
HEARTBEAT_MS / ELECTION_MS and its data on tmpfs when there is one (the WAL's
fsync then costs nothing: the figures are the network's and raft's).  Everything
started is ended by its PID and the namespaces are deleted, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from santhrottle.appliance.fleet.engine import (
    Decision,
    EngineUnavailable,
    Leadership,
    LeaseLost,
    Member,
    Payload,
    Snapshot,
)

HEARTBEAT_MS = 50
ELECTION_MS = 500
NET = "198.51.100"
AGENT = Path(__file__).with_name("fleet_agent.py")
ROOT = Path(__file__).parents[2]


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "etcd"):
        if not shutil.which(tool):
            return f"{tool} not installed (etcd: apt-get install etcd-server)"
    return None


class Agent:
    """The Coordinator interface, forwarded to a fleet_agent.py process."""

    def __init__(self, cluster: Cluster, member: int, array: str, ttl_s: int = 1) -> None:
        ns = cluster.ns[member]
        order = [member, *(i for i in range(3) if i != member)]
        endpoints = [f"{NET}.{i + 1}:2379" for i in order]
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(AGENT), array, str(ttl_s), *endpoints],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        cluster.procs.append(self.proc)
        self.member = member
        self._array = array
        self._appliance: str | None = None
        self.last_s = 0.0
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"agent {self.proc.pid} exited {self.proc.poll()}")
        return line

    def send(self, op: str, *args: Any) -> None:
        """A request, its answer left for receive(): several agents at once."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self.proc.stdin.flush()

    def call(self, op: str, *args: Any) -> Any:
        self.send(op, *args)
        return self.receive()

    def receive(self) -> Any:
        got = json.loads(self._line())
        self.last_s = got["s"]
        if "ok" in got:
            return got["ok"]
        kind = {"LeaseLost": LeaseLost, "EngineUnavailable": EngineUnavailable}
        kind |= {"ValueError": ValueError}
        raise kind.get(got["err"], AssertionError)(f"{got['err']}: {got['msg']}")

    def kill(self) -> None:
        self.proc.kill()  # `ip netns exec` execs python: this PID is the agent
        self.proc.wait(timeout=5)

    # -- Coordinator ------------------------------------------------------------
    @property
    def array(self) -> str:
        return self._array

    @property
    def appliance(self) -> str | None:
        return self._appliance

    @property
    def lease(self) -> int | None:
        got = self.call("lease")
        return None if got is None else int(got)

    def join(self, appliance: str, info: Payload) -> None:
        self.call("join", appliance, dict(info))
        self._appliance = appliance

    def refresh(self) -> None:
        self.call("refresh")

    def leave(self) -> None:
        self.call("leave")

    def members(self) -> list[Member]:
        return [Member(**m) for m in self.call("members")]

    def campaign(self, resource: str) -> Leadership | None:
        got = self.call("campaign", resource)
        return Leadership(**got) if got else None

    def resign(self, resource: str) -> bool:
        return bool(self.call("resign", resource))

    def leader(self, resource: str) -> Leadership | None:
        got = self.call("leader", resource)
        return Leadership(**got) if got else None

    def publish_samples(self, payload: Payload) -> None:
        self.call("publish_samples", dict(payload))

    def samples(self) -> dict[str, Payload]:
        return dict(self.call("samples"))

    def publish_decisions(self, resource: str, epoch: int, payload: Payload) -> bool:
        return bool(self.call("publish_decisions", resource, epoch, dict(payload)))

    def decisions(self, resource: str) -> Decision | None:
        got = self.call("decisions", resource)
        return Decision(**got) if got else None

    def snapshot(self) -> Snapshot:
        s = self.call("snapshot")
        return Snapshot(
            s["revision"],
            {k: Member(**v) for k, v in s["members"].items()},
            {k: Leadership(**v) for k, v in s["leaders"].items()},
            s["samples"],
            {k: Decision(**v) for k, v in s["decisions"].items()},
        )


class Cluster:
    def __init__(
        self, tag: str, data: Path, heartbeat_ms: int = HEARTBEAT_MS, election_ms: int = ELECTION_MS
    ) -> None:
        self.heartbeat_ms, self.election_ms = heartbeat_ms, election_ms
        self.hub = f"stf-{tag}-hub"
        self.ns = [f"stf-{tag}-m{i + 1}" for i in range(3)]
        self.data = data
        self.procs: list[subprocess.Popen[str]] = []
        self.etcd: list[subprocess.Popen[str] | None] = [None, None, None]

    def make_network(self) -> None:
        for ns in (self.hub, *self.ns):
            _run("ip", "netns", "add", ns)
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.ns):
            port = f"fl-m{i + 1}"
            _run("ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name",
                 "fl0", "netns", ns)  # fmt: skip
            _run("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{NET}.{i + 1}/24", "dev", "fl0")
            _run("ip", "-n", ns, "link", "set", "fl0", "up")

    def link(self, member: int, up: bool) -> None:
        """The member's namespace off the network (its veth down) or back."""
        _run("ip", "-n", self.ns[member], "link", "set", "fl0", "up" if up else "down")

    def start(self, member: int) -> None:
        names = [f"m{i + 1}" for i in range(3)]
        peers = ",".join(f"{n}=http://{NET}.{i + 1}:2380" for i, n in enumerate(names))
        ip = f"{NET}.{member + 1}"
        log = open(self.data / f"{names[member]}.log", "ab")  # noqa: SIM115 (etcd keeps it)
        cmd = [
            "ip", "netns", "exec", self.ns[member], "etcd",
            "--name", names[member],
            "--data-dir", str(self.data / names[member]),
            "--listen-peer-urls", f"http://{ip}:2380",
            "--initial-advertise-peer-urls", f"http://{ip}:2380",
            "--listen-client-urls", f"http://{ip}:2379",
            "--advertise-client-urls", f"http://{ip}:2379",
            "--initial-cluster", peers,
            "--initial-cluster-token", "santhrottle-test",
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--logger", "zap", "--log-level", "warn",
        ]  # fmt: skip
        p = subprocess.Popen(cmd, stdout=log, stderr=log, text=True)
        log.close()
        self.etcd[member] = p
        self.procs.append(p)

    def stop(self, member: int) -> None:
        p = self.etcd[member]
        if p is not None and p.poll() is None:
            p.kill()  # `ip netns exec` execs etcd: this PID is etcd
            p.wait(timeout=10)
        self.etcd[member] = None

    def etcdctl(self, member: int, *args: str) -> str:
        """etcdctl in a member's namespace, on that member: an admin, or anyone
        with write access to etcd."""
        cmd = ["ip", "netns", "exec", self.ns[member], "etcdctl",
               f"--endpoints={NET}.{member + 1}:2379", *args]  # fmt: skip
        got = _run(*cmd, check=False)
        if got.returncode != 0:
            raise AssertionError(f"etcdctl {' '.join(args)}: {got.stderr.strip()}")
        return got.stdout

    def wait_ready(self, agent: Agent, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while True:
            try:
                agent.snapshot()
                return
            except EngineUnavailable:
                if time.monotonic() > deadline:
                    raise AssertionError(f"etcd not ready in {within_s} s: {self.logs()}") from None
                time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.data.glob("*.log")))

    def teardown(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            for s in (p.stdin, p.stdout):
                if s:
                    s.close()
        self.procs.clear()
        for ns in (*self.ns, self.hub):
            if Path(f"/run/netns/{ns}").exists():
                _run("ip", "netns", "del", ns, check=False)


class Forger:
    """Writes straight into etcd under an array's prefix (tests/unit/fleet_contract.py's
    Forger), with etcdctl from the third member's namespace."""

    def __init__(self, cluster: Cluster, array: str) -> None:
        self.cluster, self.prefix = cluster, f"/santhrottle/{array}/"

    def put(self, key: str, value: dict[str, Any], lease: int = 0) -> None:
        lease_arg = [f"--lease={lease:x}"] if lease else []
        self.cluster.etcdctl(2, "put", *lease_arg, self.prefix + key, json.dumps(value))

    def delete(self, key: str) -> None:
        self.cluster.etcdctl(2, "del", self.prefix + key)


@contextlib.contextmanager
def cluster(
    tag: str,
    heartbeat_ms: int = HEARTBEAT_MS,
    election_ms: int = ELECTION_MS,
    on_disk: bool = False,
) -> Iterator[Cluster]:
    """The network and the three members, up and answering; gone afterwards.  Data on
    tmpfs (/dev/shm) if there is one, unless on_disk."""
    base = "/dev/shm" if Path("/dev/shm").is_dir() and not on_disk else None
    data = Path(tempfile.mkdtemp(prefix="santhrottle-etcd-", dir=base))
    c = Cluster(tag, data, heartbeat_ms, election_ms)
    try:
        c.make_network()
        for i in range(3):
            c.start(i)
        probe = Agent(c, 0, "probe")
        c.wait_ready(probe)
        probe.kill()
        yield c
    finally:
        c.teardown()
        shutil.rmtree(data, ignore_errors=True)
