"""Access to the kernel of one network namespace: the system's tools and pyroute2's sockets.

What it owns
    Tools: every binary and kernel path the data path uses (constructor
    parameters, so tests and odd hosts can point elsewhere).  Host: runs a
    tool inside the namespace (nsenter --net), opens pyroute2's IPRoute and
    IPSet sockets inside it (IPSet takes no netns argument: opened between
    pushns and popns), and looks devices up (once each, until forget()).
    module_available() and check_netem() answer whether the kernel can give
    us a netem qdisc.

    Every failure becomes one DatapathError line for the admin.  The sync
    pyroute2 API cannot run inside a running asyncio loop: call the data
    path from a thread there.

Worked example
    Host("tgt").run(["tc", "-batch", "-"], stdin=...) runs
    `nsenter --net=/run/netns/tgt tc -batch -`; a failure raises
    DatapathError("tc -batch failed: <tc's last line>").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from santhrottle.appliance.config.kinds import IFNAME_MAX_CHARS
from santhrottle.appliance.datapath.names import DatapathError, NetemMissing
from santhrottle.appliance.netns import entered

NETEM_MISSING_MSG = (
    "this kernel has no sch_netem (the netem qdisc the delay classes need): "
    "load it with `modprobe sch_netem` or use a kernel built with CONFIG_NET_SCH_NETEM"
)


@dataclass(frozen=True)
class Tools:
    tc: str = "tc"
    ipset: str = "ipset"
    iptables: str = "iptables"
    iptables_restore: str = "iptables-restore"
    ip6tables: str = "ip6tables"
    ip6tables_restore: str = "ip6tables-restore"
    nft: str = "nft"
    nsenter: str = "nsenter"
    unshare: str = "unshare"
    netns_dir: str = "/run/netns"
    sys_module_dir: str = "/sys/module"
    modules_dir: str = "/lib/modules"
    command_timeout_s: float = 60.0


NS_GET_NSTYPE = 0xB703  # ioctl on a namespace file: its CLONE_NEW* type
CLONE_NEWNET = 0x40000000


def _is_netns(fd: int) -> bool:
    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:  # not a namespace file at all
        return False


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


class Host:
    """One network namespace's kernel (None: this process's)."""

    def __init__(self, netns: str | None = None, tools: Tools | None = None) -> None:
        self.netns = netns
        self.tools = tools or Tools()
        self._ipr: Any = None
        self._ipset: Any = None
        self._ifindex: dict[str, int] = {}  # device -> index (ifindex)

    def close(self) -> None:
        for s in (self._ipr, self._ipset):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.close()
        self._ipr = self._ipset = None
        self._ifindex.clear()

    def netns_path(self) -> str | None:
        if self.netns is None:
            return None
        path = self.netns if "/" in self.netns else os.path.join(self.tools.netns_dir, self.netns)
        if not os.path.exists(path):
            raise DatapathError(f"no network namespace {self.netns} ({path})")
        return path

    def command(self, argv: Sequence[str]) -> list[str]:
        path = self.netns_path()
        if path is None:
            return list(argv)
        return [self.tools.nsenter, f"--net={path}", *argv]

    def run(self, argv: Sequence[str], stdin: str | None = None, what: str | None = None) -> str:
        cmd = self.command(argv)
        try:
            p = subprocess.run(
                cmd,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.tools.command_timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise DatapathError(f"{cmd[0]} not found (install it or pass its path)") from None
        except subprocess.TimeoutExpired:
            raise DatapathError(f"{shlex.join(cmd)} timed out") from None
        if p.returncode != 0:
            raise DatapathError(
                f"{what or shlex.join(argv[:2])} failed: {_last_line(p.stderr or p.stdout)}"
            )
        return p.stdout

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the block's socket creation inside the namespace."""
        path = self.netns_path()
        if path is None:
            yield
            return
        try:  # non-blocking: a FIFO given as the namespace must not hang the open
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise DatapathError(f"cannot open network namespace {path}: {e.strerror}") from None
        try:
            if not _is_netns(fd):
                raise DatapathError(f"{path} is not a network namespace")
            with entered(fd):  # an fd: never creates a namespace
                yield
        finally:
            os.close(fd)

    def iproute(self) -> Any:
        if self._ipr is None:
            from pyroute2 import IPRoute

            with self.inside():
                self._ipr = IPRoute()
        return self._ipr

    def ipsets(self) -> Any:
        if self._ipset is None:
            from pyroute2 import IPSet

            try:
                with self.inside():
                    self._ipset = IPSet()
            except OSError as e:
                raise DatapathError(f"cannot open the ipset netlink socket: {e}") from None
        return self._ipset

    def ifindex(self, device: str) -> int:
        """The device's index, looked up once (a link dump's reply is a large message:
        decoding it is most of what a tick's glide-leaf change costs under emulation).
        A message that fails on it calls forget(): the next call looks again."""
        idx = self._ifindex.get(device)
        if idx is not None:
            return idx
        if not device or len(device.encode()) > IFNAME_MAX_CHARS:  # no netlink message holds it
            raise DatapathError(f"no network device {device[:20]!r}: not an interface name")
        found = self.iproute().link_lookup(ifname=device)
        if not found:
            where = f" in network namespace {self.netns}" if self.netns else ""
            raise DatapathError(f"no network device {device}{where}")
        self._ifindex[device] = idx = int(found[0])
        return idx

    def forget(self, device: str) -> None:
        """Look the device's index up again next time (it may have been recreated)."""
        self._ifindex.pop(device, None)

    def check_netem(self) -> None:
        """Raise NetemMissing when the kernel cannot give us a netem qdisc: the
        module tree answers when there is one; otherwise the kernel is asked
        directly in a private, throwaway namespace (`unshare --net`)."""
        t = self.tools
        have = module_available("sch_netem", t.sys_module_dir, t.modules_dir)
        if have:
            return
        probe = [
            t.unshare,
            "--net",
            t.tc,
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "netem",
            "delay",
            "1ms",
        ]
        try:
            p = subprocess.run(probe, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            p = None
        if p is not None and p.returncode == 0:
            return
        err = (p.stderr if p is not None else "") or ""
        if have is False or "kind is unknown" in err or "No such file" in err:
            raise NetemMissing(NETEM_MISSING_MSG)
        # Cannot tell (no unshare permission, ...): the build will say.


def module_available(
    name: str,
    sys_module_dir: str = "/sys/module",
    modules_dir: str = "/lib/modules",
    release: str | None = None,
) -> bool | None:
    """True: loaded or built in (per /sys/module, modules.builtin) or loadable
    (modules.dep); False: the module tree says it is neither; None: cannot
    tell (no module tree for this kernel: built-ins without parameters do
    not show in /sys/module)."""
    if os.path.isdir(os.path.join(sys_module_dir, name)):
        return True
    base = os.path.join(modules_dir, release or os.uname().release)
    found_tree = False
    for fname in ("modules.builtin", "modules.dep"):
        try:
            with open(os.path.join(base, fname), encoding="utf-8", errors="replace") as f:
                found_tree = True
                for line in f:
                    mod = line.split(":", 1)[0].strip().rsplit("/", 1)[-1]
                    for ext in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
                        if mod.endswith(ext):
                            mod = mod[: -len(ext)]
                            break
                    if mod.replace("-", "_") == name:
                        return True
        except OSError:
            continue
    return False if found_tree else None
