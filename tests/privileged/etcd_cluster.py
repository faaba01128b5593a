"""A 3-member etcd cluster in network namespaces this test owns, and appliances beside it.

    hub namespace: bridge br0 -- veth -- member namespace 1 (198.51.100.1, etcd m1)
                              -- veth -- member namespace 2 (198.51.100.2, etcd m2)
                              -- veth -- member namespace 3 (198.51.100.3, etcd m3)

TEST-NET-2 addresses, only inside the namespaces; no IPv6.  Each appliance is a
fleet_agent.py process in a member's namespace (an appliance that runs one of
the members, its own member first in its endpoint list).  A secure cluster
(cluster(secure=True)) speaks TLS to clients and peers with certificates the
test makes with openssl (Pki: a CA, each member's, each client's), asks every
client for a certificate (--client-cert-auth), and turns etcd's authentication
on with enable_auth(): the user root, then users with roles (add_user).  etcd runs with
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from santhrottle.appliance.fleet.engine import (
    Decision,
    EngineUnavailable,
    Leadership,
    LeaseLost,
    Payload,
    Registration,
    Snapshot,
)

HEARTBEAT_MS = 50
ELECTION_MS = 500
# A secure cluster's tokens end after this long unused (etcd's --auth-token-ttl):
# short, so that a test sees the adapter ask for a new one.
TOKEN_TTL_S = 3
NET = "198.51.100"
AGENT = Path(__file__).with_name("fleet_agent.py")
ROOT = Path(__file__).parents[2]


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def missing(secure: bool = False) -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "etcd", *(("etcdctl", "openssl") if secure else ())):
        if not shutil.which(tool):
            return f"{tool} not installed (apt-get install etcd-server etcd-client openssl)"
    return None


def appliance_grants(array: str, name: str, lead: bool) -> list[tuple[str, str, bool]]:
    """An appliance's least rights on its array (docs/fleet.md, "Security"): read the
    array, write its own member and samples keys, and the leaders and decisions if
    it may lead; (permission, key, prefix?) for Cluster.add_user."""
    p = f"/santhrottle/{array}/"
    grants = [("read", p, True), ("readwrite", f"{p}appliances/{name}", False),
              ("readwrite", f"{p}samples/{name}", False)]  # fmt: skip
    if lead:
        grants += [("readwrite", f"{p}leader/", True), ("readwrite", f"{p}decisions/", True)]
    return grants


class Pki:
    """A CA and certificates signed by it, made with openssl in dir: members'
    (serverAuth and clientAuth: etcd's gateway dials its own member with it; the
    member's address as subjectAltName) and clients' (clientAuth, the name as OU
    and no Common Name: with authentication on, etcd's gateway refuses a client
    certificate that has one)."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.ca = str(dir / "ca.pem")
        self._ca_key = str(dir / "ca-key.pem")
        _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", self._ca_key, "-out", self.ca, "-days", "2",
             "-subj", "/CN=santhrottle test CA")  # fmt: skip

    def issue(self, name: str, ip: str | None = None) -> tuple[str, str]:
        """(certificate, key) for name: a member's with ip, else a client's."""
        cert, key, csr = (str(self.dir / f"{name}{x}") for x in (".pem", "-key.pem", ".csr"))
        if Path(cert).exists():
            return cert, key
        ext = self.dir / f"{name}.ext"
        usage = "serverAuth,clientAuth" if ip else "clientAuth"
        ext.write_text(f"extendedKeyUsage={usage}\n" + (f"subjectAltName=IP:{ip}\n" if ip else ""))
        subject = f"/CN={name}" if ip else f"/O=santhrottle/OU={name}"
        _run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", subject)  # fmt: skip
        _run("openssl", "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self._ca_key,
             "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", str(ext))  # fmt: skip
        os.chmod(key, 0o600)
        return cert, key


@dataclass(frozen=True)
class Credentials:
    """What an appliance shows a secure cluster (fleet_agent.py's options)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password_file: str | None = None

    def args(self) -> list[str]:
        out = []
        for name in ("ca", "cert", "key", "user", "password_file"):
            v = getattr(self, name)
            if v is not None:
                out += [f"--{name.replace('_', '-')}", v]
        return out


class Agent:
    """The Coordinator interface, forwarded to a fleet_agent.py process."""

    def __init__(
        self,
        cluster: Cluster,
        member: int,
        array: str,
        ttl_s: int = 1,
        creds: Credentials | None = None,
    ) -> None:
        ns = cluster.ns[member]
        order = [member, *(i for i in range(3) if i != member)]
        endpoints = [cluster.endpoint(i) for i in order]
        creds = creds if creds is not None else cluster.default_creds
        cmd = ["ip", "netns", "exec", ns, sys.executable, str(AGENT), array, str(ttl_s)]
        self.proc = subprocess.Popen(
            [*cmd, *endpoints, *(creds.args() if creds else [])],
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

    def appliances(self) -> list[Registration]:
        return [Registration(**m) for m in self.call("appliances")]

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
            {k: Registration(**v) for k, v in s["appliances"].items()},
            {k: Leadership(**v) for k, v in s["leaders"].items()},
            s["samples"],
            {k: Decision(**v) for k, v in s["decisions"].items()},
        )


class Cluster:
    def __init__(
        self,
        tag: str,
        data: Path,
        heartbeat_ms: int = HEARTBEAT_MS,
        election_ms: int = ELECTION_MS,
        secure: bool = False,
    ) -> None:
        self.heartbeat_ms, self.election_ms = heartbeat_ms, election_ms
        self.pki = Pki(data) if secure else None
        self.root_password: str | None = None  # set by enable_auth()
        # what Agent shows when not told otherwise: on a secure cluster, root's
        # certificate (and root's user once authentication is on)
        self.default_creds: Credentials | None = None
        if self.pki is not None:
            cert, key = self.pki.issue("root")
            self.default_creds = Credentials(self.pki.ca, cert, key)
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

    @property
    def scheme(self) -> str:
        return "https" if self.pki else "http"

    def endpoint(self, member: int) -> str:
        plain = f"{NET}.{member + 1}:2379"
        return f"https://{plain}" if self.pki else plain

    def start(self, member: int) -> None:
        names = [f"m{i + 1}" for i in range(3)]
        sch = self.scheme
        peers = ",".join(f"{n}={sch}://{NET}.{i + 1}:2380" for i, n in enumerate(names))
        ip = f"{NET}.{member + 1}"
        tls: list[str] = []
        if self.pki is not None:
            cert, key = self.pki.issue(names[member], ip)
            tls = ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", self.pki.ca,
                   "--client-cert-auth", "--peer-cert-file", cert, "--peer-key-file", key,
                   "--peer-trusted-ca-file", self.pki.ca, "--peer-client-cert-auth",
                   "--auth-token-ttl", str(TOKEN_TTL_S)]  # fmt: skip
        log = open(self.data / f"{names[member]}.log", "ab")  # noqa: SIM115 (etcd keeps it)
        cmd = [
            "ip", "netns", "exec", self.ns[member], "etcd",
            "--name", names[member],
            "--data-dir", str(self.data / names[member]),
            "--listen-peer-urls", f"{sch}://{ip}:2380",
            "--initial-advertise-peer-urls", f"{sch}://{ip}:2380",
            "--listen-client-urls", f"{sch}://{ip}:2379",
            "--advertise-client-urls", f"{sch}://{ip}:2379",
            "--initial-cluster", peers,
            "--initial-cluster-token", "santhrottle-test",
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--logger", "zap", "--log-level", "warn", *tls,
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

    def etcdctl(self, member: int, *args: str, user: str | None = None) -> str:
        """etcdctl in a member's namespace, on that member: an admin (root once
        authentication is on), or anyone with write access to etcd; as user
        (its client certificate, password "pw-USER") when given."""
        cmd = ["ip", "netns", "exec", self.ns[member], "etcdctl",
               f"--endpoints={self.endpoint(member)}"]  # fmt: skip
        if self.pki is not None:
            cert, key = self.pki.issue(user or "root")
            cmd += [f"--cacert={self.pki.ca}", f"--cert={cert}", f"--key={key}"]
        if user is not None:
            cmd.append(f"--user={user}:pw-{user}")
        elif self.root_password is not None:
            cmd.append(f"--user=root:{self.root_password}")
        got = _run(*cmd, *args, check=False)
        if got.returncode != 0:
            raise AssertionError(f"etcdctl {' '.join(args)}: {got.stderr.strip()}")
        return got.stdout

    def enable_auth(self) -> None:
        """etcd's authentication on: the user root (role root), then nobody
        without a user and a password gets an answer."""
        self.root_password = "pw-root"
        self.etcdctl(0, "user", "add", "root", "--new-user-password=pw-root", "--interactive=false")
        self.etcdctl(0, "auth", "enable")
        assert self.pki is not None
        cert, key = self.pki.issue("root")
        pw = self.data / "root.password"
        pw.write_text("pw-root\n")
        pw.chmod(0o600)
        self.default_creds = Credentials(self.pki.ca, cert, key, "root", str(pw))

    def add_user(self, user: str, grants: list[tuple[str, str, bool]]) -> Credentials:
        """A user (password "pw-USER", its own client certificate) with a role of
        its own: grants are (read|write|readwrite, key, prefix?)."""
        self.etcdctl(0, "user", "add", user, f"--new-user-password=pw-{user}",
                     "--interactive=false")  # fmt: skip
        self.etcdctl(0, "role", "add", user)
        for perm, key, prefix in grants:
            self.etcdctl(0, "role", "grant-permission", *(["--prefix=true"] if prefix else []),
                         user, perm, key)  # fmt: skip
        self.etcdctl(0, "user", "grant-role", user, user)
        assert self.pki is not None
        cert, key = self.pki.issue(user)
        pw = self.data / f"{user}.password"
        pw.write_text(f"pw-{user}\n")
        pw.chmod(0o600)
        return Credentials(self.pki.ca, cert, key, user, str(pw))

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
    secure: bool = False,
) -> Iterator[Cluster]:
    """The network and the three members, up and answering; gone afterwards.  Data on
    tmpfs (/dev/shm) if there is one, unless on_disk.  secure: TLS everywhere and
    client certificates asked for (authentication: enable_auth())."""
    base = "/dev/shm" if Path("/dev/shm").is_dir() and not on_disk else None
    data = Path(tempfile.mkdtemp(prefix="santhrottle-etcd-", dir=base))
    try:
        c = Cluster(tag, data, heartbeat_ms, election_ms, secure)
    except BaseException:
        shutil.rmtree(data, ignore_errors=True)
        raise
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
