"""LIO targets through rtslib-fb: TPGs, portals, LUNs -> backstores, ACL sessions.

rtslib-fb's RTSRoot() mounts configfs and modprobes target_core_mod in its
constructor, so the one RTSRoot of the process is created lazily, here, on
the first scan. For tests and captured trees, `configfs_root` points
rtslib at another directory (rtslib reads everything below
CFSNode.configfs_dir); then nothing is mounted or loaded.

Initiator addresses: with explicit ACLs, from NodeACL.session (the
connections' addresses in the ACL's `info`). With generate_node_acls=1 (no
ACLs, the common lab/demo setup) LIO keeps no addresses: the caller takes
the peers of established connections on the portal ports (conns.py).

Per-initiator counters: with explicit ACLs, LIO counts per mapped LUN in
acls/<initiator>/lun_<n>/statistics/scsi_auth_intr/: write_mbytes and
read_mbytes (MiB, so a 1 s rate has a 1 MiB/s resolution) and num_cmds (every
SCSI command, exact). Without ACLs there are none: discovery.py then uses the
LUN's block device when one initiator has that LUN (docs/sensing.md,
"Write-rate sources"); initiator_io.py splits a shared device's IOs with them.

Initiator names: an explicit ACL is named by its initiator (and its session
gives the addresses); with generated ACLs, tpgt_N/dynamic_sessions lists the
names of the sessions, without addresses (LioTpg.dynamic_sessions; a file that
cannot be read lists none).

Errors, per object: the scan lists the tree's directories itself (sorted) and
reads each target, TPG, portal, LUN, ACL, session and mapped LUN through rtslib
on its own. One that cannot be read (rtslib's OSError, RTSLibError, ValueError
such as a UnicodeDecodeError, KeyError or IndexError on a truncated, empty,
garbage or vanished file) is skipped, and the rest of the scan goes on; an ACL
whose session cannot be read keeps no address, and so does a session address
that is not an IP address. The sensor counts what it skipped (`skipped`, since
start; `last_skipped`, the last scan's, one line each) and logs one warning
line per object when it starts being skipped. scan() raises LioUnavailable (one
line), and nothing else, only when LIO itself cannot be read. For example, the
lab's captured tree with the ACL's `info` emptied (rtslib's session parser raises
IndexError on it):

    >>> sensor = LioSensor(copy_of_the_lab_configfs)
    >>> [t.acls for t in sensor.scan() if t.acls]
    [(LioAcl(initiator='iqn.2003-01.org.santhrottle.lab:ini1', addresses=(),
             mapped_luns=(0,), write_bytes={0: 46137344}, read_bytes={0: 0},
             commands={0: 774}),)]
    >>> sensor.last_skipped, sensor.skipped
    (('session <root>/target/iscsi/<iqn>/tpgt_1/acls/<ini1>: IndexError: list index
    out of range',), 1)

Cost: a sensor kept from one scan to the next (the daemon's) walks the tree through
rtslib at its first scan, then at most FULL_WALK_EVERY_S apart and whenever the
tree's shape is not as the walk saw it (lioshape.py: the directories it listed, the
links it resolved, the TPGs' flags). In between, a scan (a refresh) reads again only
the sessions (rtslib's parser of each ACL's `info`), the counters and the generated
ACLs' sessions, and gives what a walk would: a quarter of a walk's CPU on the lab's
captured tree (`make bench`, sensing: lio_scan_ms_median). A walk that skipped an
object other than a session or an address is followed by another walk, not by
refreshes (tests/unit/test_lio_refresh.py, with a corpus of mutated trees).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from santhrottle.appliance.sensing.lioshape import Shape

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_CONFIGFS = "/sys/kernel/config"
MIB = 1024 * 1024
# What rtslib raises on a damaged tree, or one that changes while it is read, besides
# its own RTSLibError: OSError (gone), ValueError (UnicodeDecodeError, int() of
# garbage, a name that does not split), LookupError (KeyError, IndexError: its
# session parser on an empty or partial `info`)
_TREE_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, LookupError)
_PORT_MAX = 65535
_NUMBER_DIGITS_MAX = 9  # a TPG tag, LUN or mapped LUN number (LIO's are below 2**16)
# The rtslib walk at least this often (module header, "Cost"); between walks, a scan
# reads again only what changes under an unchanged tree
FULL_WALK_EVERY_S = 30.0
# What a refresh reads again itself: a walk that skipped only these leaves a plan
_REREAD = ("session ", "address ")


class LioUnavailable(RuntimeError):
    """LIO cannot be read (no configfs/target_core_mod, no rtslib-fb)."""


@dataclass(frozen=True, slots=True)
class LioLun:
    lun: int
    backstore: str  # "block/lun0"
    udev_path: str  # "/dev/labvg/lun0"


@dataclass(frozen=True, slots=True)
class LioAcl:
    initiator: str  # node WWN (IQN)
    addresses: tuple[str, ...]  # from the active session, if any
    mapped_luns: tuple[int, ...]  # TPG LUN numbers this ACL sees
    # tpg lun -> bytes (MiB res.): a counter, not part of the ACL's identity (equal
    # ACLs with other counts are the same configuration: discovery's change test)
    write_bytes: dict[int, int] = field(default_factory=dict, compare=False)
    # tpg lun -> bytes read (MiB res.) and SCSI commands, for initiator groups; a LUN
    # is in both only when all three of its counters could be read
    read_bytes: dict[int, int] = field(default_factory=dict, compare=False)
    commands: dict[int, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class LioTpg:
    fabric: str
    wwn: str
    tag: int
    enabled: bool
    generate_node_acls: bool
    portals: tuple[tuple[str, int], ...]
    luns: tuple[LioLun, ...]
    acls: tuple[LioAcl, ...]
    # the initiator names of its sessions through generated ACLs (tpgt_N/dynamic_sessions:
    # names only, no addresses); state, not configuration, like the ACL counters
    dynamic_sessions: tuple[str, ...] = field(default=(), compare=False)


@contextlib.contextmanager
def _rtslib_at(configfs_root: str) -> Iterator[Any]:
    try:
        import rtslib_fb
        from rtslib_fb import node as rts_node
    except ImportError as e:  # pragma: no cover - a packaging error
        raise LioUnavailable(f"rtslib-fb is not installed: {e}") from None
    if configfs_root == DEFAULT_CONFIGFS:
        yield rtslib_fb
        return
    saved = rts_node.CFSNode.configfs_dir
    rts_node.CFSNode.configfs_dir = f"{configfs_root}/target"
    try:
        yield rtslib_fb
    finally:
        rts_node.CFSNode.configfs_dir = saved


def _uint_file(path: Path) -> int | None:
    """The first word of a file as a non-negative integer (ASCII digits), or None."""
    try:
        word = path.read_bytes().split()[0]
    except (OSError, IndexError):
        return None
    return int(word) if word.isdigit() and len(word) <= 20 else None


def _session_names(path: Path) -> tuple[str, ...]:
    """The names in a dynamic_sessions file ("<name>\\n\\0" per session: the kernel's
    target_show_dynamic_sessions()), each once, sorted; none if it cannot be read."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ()
    words = {w.strip() for w in text.replace("\0", "\n").split("\n")}
    return tuple(sorted(w for w in words if w and w.isprintable()))


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _numbered(names: Iterable[str], prefix: str) -> list[tuple[int, str]]:
    """(number, name) of a directory's entries `<prefix><number>`, by number; an
    entry whose number does not parse is (-1, name): the caller skips and notes it."""
    out = []
    for name in names:
        if name.startswith(prefix):
            tail = name[len(prefix) :]
            ok = tail.isdigit() and tail.isascii() and len(tail) <= _NUMBER_DIGITS_MAX
            out.append((int(tail) if ok else -1, name))
    return sorted(out)


def _address(text: str) -> str | None:
    """An ACL session's connection address ("10.0.0.3", "10.0.0.3:3260", "[fe80::1]")
    as canonical text, None if it is not an IP address."""
    if text.count(":") == 1:
        text = text.rsplit(":", 1)[0]
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        return None


class LioSensor:
    """Reads the LIO configuration; every path a parameter."""

    def __init__(
        self,
        configfs_root: str | Path = DEFAULT_CONFIGFS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # absolute: rtslib resolves configfs symlinks and compares real paths
        self.configfs_root = os.path.abspath(configfs_root)
        self.clock = clock
        self._root: Any = None
        self._warned = False
        self.skipped = 0  # objects skipped since start, summed over scans
        self.last_skipped: tuple[str, ...] = ()  # the last scan's: "<what> <path>: <error>"
        self._skipped_keys: frozenset[str] = frozenset()  # the last scan's "<what> <path>"
        self._plan: _Plan | None = None  # what the last walk read, for the refreshes
        self.walks = 0  # scans that walked the tree through rtslib
        self.refreshes = 0  # scans that re-read the counters and sessions only

    def _rts_root(self, rtslib: Any) -> Any:
        if self._root is None:
            if self.configfs_root == DEFAULT_CONFIGFS:
                try:
                    self._root = rtslib.RTSRoot()  # mounts configfs, modprobes
                except Exception as e:  # rtslib raises RTSLibError and OSErrors
                    raise LioUnavailable(f"LIO is not available: {_one_line(e)}") from None
            else:
                root = object.__new__(rtslib.RTSRoot)  # a captured tree: no mount
                rtslib.node.CFSNode.__init__(root)
                self._root = root
        return self._root

    def scan(self) -> list[LioTpg]:
        """The tree: walked through rtslib at most FULL_WALK_EVERY_S apart and whenever
        its shape changed (lioshape.py); otherwise the last walk's with its sessions
        and counters read again (module header, "Cost")."""
        if not Path(self.configfs_root, "target").is_dir():
            self._plan = None
            if not self._warned and not Path(self.configfs_root).is_dir():
                self._warned = True
                log.warning(
                    "%s is not mounted: LIO and nvmet are invisible (`ip netns exec` remounts "
                    "/sys without configfs: use daemon.netns instead)",
                    self.configfs_root,
                )
            return []  # no LIO on this host (or module not loaded): nothing to see
        now = self.clock()
        with _rtslib_at(self.configfs_root) as rtslib:
            plan = self._plan
            if plan is not None and 0.0 <= now - plan.walked_s < FULL_WALK_EVERY_S:
                walk = _Walk(rtslib)
                tpgs = walk.refresh(plan)
                if tpgs is not None:
                    self.refreshes += 1
                    self._note(walk.skipped)
                    return tpgs
            root = self._rts_root(rtslib)
            walk = _Walk(rtslib)
            self._plan = None
            try:
                tpgs = walk.tpgs(root)
            except walk.errors as e:  # the fabric modules themselves: changed while we walked
                raise LioUnavailable(f"LIO tree changed during the scan: {_one_line(e)}") from None
        self.walks += 1
        self._plan = walk.plan(tpgs, now)
        self._note(walk.skipped)
        return tpgs

    def _note(self, skipped: list[tuple[str, str]]) -> None:
        """Counts the scan's skipped objects; one warning line for each that was not
        skipped in the scan before."""
        self.skipped += len(skipped)
        self.last_skipped = tuple(f"{key}: {err}" for key, err in skipped)
        keys = frozenset(key for key, _ in skipped)
        for key, err in skipped:
            if key not in self._skipped_keys:
                log.warning("LIO: skipped %s: %s", key, err)
        self._skipped_keys = keys


@dataclass(frozen=True, slots=True)
class _AclPlan:
    """Where a refresh reads an ACL again: its rtslib object (the session) and its
    mapped LUNs' statistics directories, (TPG LUN, directory)."""

    rts_acl: Any
    stats: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class _TpgPlan:
    """Where a refresh reads a TPG again: its ACLs, in order, and the file that names
    its generated ACLs' sessions (None without generated ACLs)."""

    acls: tuple[_AclPlan, ...]
    sessions: str | None


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a walk read that a refresh checks (the tree's shape) and where it reads
    the sessions and counters again, per TPG of `tpgs`."""

    walked_s: float
    tpgs: tuple[tuple[LioTpg, _TpgPlan], ...]
    shape: Shape


class _Walk:
    """One scan of the tree: rtslib objects -> LioTpg, each object read on its own and
    skipped (noted in `skipped`) when it cannot be read; or a refresh of a plan."""

    def __init__(self, rtslib: Any) -> None:
        self.rts = rtslib
        self.errors: tuple[type[Exception], ...] = (*_TREE_ERRORS, rtslib.utils.RTSLibError)
        self.skipped: list[tuple[str, str]] = []  # ("<what> <path>", "<error>")
        self.shape = Shape()  # what it read of the tree's shape (lioshape.py)
        # id(LioTpg) -> (the TPG, where a refresh reads it): kept, so that an id is not
        # reused by another TPG while the walk lasts
        self.tpg_plans: dict[int, tuple[LioTpg, _TpgPlan]] = {}

    def _try(self, what: str, path: str, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except self.errors as e:
            self.skipped.append((f"{what} {path}", _one_line(e)))
            return None

    def _each(self, what: str, parent: str, prefix: str, read: Callable[[int], T]) -> list[T]:
        """read(n) for every `<prefix><n>` entry below `parent`, those that can be read."""
        out = []
        for n, name in _numbered(self.shape.list(parent), prefix):
            path = f"{parent}/{name}"
            if n < 0:
                self.skipped.append((f"{what} {path}", "not a numbered entry"))
                continue
            got = self._try(what, path, lambda n=n: read(n))
            if got is not None:
                out.append(got)
        return out

    def tpgs(self, root: Any) -> list[LioTpg]:
        excluded = getattr(self.rts.fabric, "target_names_excludes", frozenset())
        out: list[LioTpg] = []
        present = set(self.shape.list(root.path))  # a fabric module loaded or unloaded
        for fm in root.fabric_modules:
            parent, name = os.path.split(fm.path)
            if (parent == root.path and name not in present) or not self.shape.is_dir(fm.path):
                continue  # one rtslib knows of that is not loaded: the listing covers it
            for name in self.shape.list(fm.path):
                path = f"{fm.path}/{name}"
                if name in excluded or not self.shape.is_dir(path):
                    continue
                tgt = self._try(
                    "target",
                    path,
                    lambda fm=fm, name=name: self.rts.Target(
                        fm, fm.from_fabric_wwn(name), "lookup"
                    ),
                )
                if tgt is None:
                    continue
                tpgs = self._try(
                    "target",
                    path,
                    lambda tgt=tgt: self._each(
                        "TPG", tgt.path, "tpgt_", lambda tag: self._tpg(tgt, tag)
                    ),
                )
                out.extend(tpgs or ())
        return out

    def _tpg(self, tgt: Any, tag: int) -> LioTpg:
        tpg = self.rts.TPG(tgt, tag, "lookup")
        luns = self._each("LUN", f"{tpg.path}/lun", "lun_", lambda n: self._lun(tpg, n))
        acls, plans = [], []
        names = self.shape.list(f"{tpg.path}/acls") if tpg.has_feature("acls") else ()
        if names:  # what the ACLs' mapped LUNs link to (none with generated ACLs)
            lun_paths = {os.path.realpath(f"{tpg.path}/lun/lun_{x.lun}"): x.lun for x in luns}
            fm = tgt.fabric_module
            for name in names:
                path = f"{tpg.path}/acls/{name}"
                got = self._try("ACL", path, lambda name=name: self._acl(tpg, fm, name, lun_paths))
                if got is not None:
                    acls.append(got[0])
                    plans.append(got[1])
        self.shape.flag(f"{tpg.path}/enable")
        self.shape.flag(f"{tpg.path}/attrib/generate_node_acls")
        try:
            gen = tpg.get_attribute("generate_node_acls") == "1"
        except Exception:  # attribute missing in an older kernel or a partial tree
            gen = False
        sessions = f"{tpg.path}/dynamic_sessions" if gen else None
        out = LioTpg(
            fabric=tgt.fabric_module.name,
            wwn=tgt.wwn,
            tag=tpg.tag,
            enabled=bool(tpg.enable),
            generate_node_acls=gen,
            portals=self._portals(tpg),
            luns=tuple(luns),
            acls=tuple(acls),
            dynamic_sessions=_session_names(Path(sessions)) if sessions else (),
        )
        self.tpg_plans[id(out)] = (out, _TpgPlan(tuple(plans), sessions))
        return out

    def _portals(self, tpg: Any) -> tuple[tuple[str, int], ...]:
        """(address, port) from the names of np/ ("10.0.0.11:3260", "[::]:3260")."""
        if not tpg.has_feature("nps"):
            return ()
        out = []
        for name in self.shape.list(f"{tpg.path}/np"):
            ip, _, port = name.rpartition(":")
            if ip and port.isdigit() and port.isascii() and int(port) <= _PORT_MAX:
                out.append((ip, int(port)))
            else:
                self.skipped.append((f"portal {tpg.path}/np/{name}", "not <address>:<port>"))
        return tuple(out)

    def _lun(self, tpg: Any, n: int) -> LioLun:
        lun = self.rts.LUN(tpg, n)  # no storage object: lookup
        self.shape.links_in(lun.path)
        so = lun.storage_object
        return LioLun(lun.lun, f"{so.plugin}/{so.name}", so.udev_path or "")

    def _acl(
        self, tpg: Any, fm: Any, name: str, lun_paths: dict[str, int]
    ) -> tuple[LioAcl, _AclPlan]:
        acl = self.rts.NodeACL(tpg, fm.from_fabric_wwn(name), "lookup")
        stats = tuple(
            (tpg_lun, f"{mpath}/statistics/scsi_auth_intr")
            for tpg_lun, mpath in self._each(
                "mapped LUN", acl.path, "lun_", lambda n: self._mapped_lun(acl, n, lun_paths)
            )
        )
        plan = _AclPlan(acl, stats)
        return self._acl_now(plan), plan

    def _acl_now(self, plan: _AclPlan) -> LioAcl:
        """The ACL with its session's addresses and its counters as they are now."""
        acl = plan.rts_acl
        sess = self._try("session", acl.path, lambda: acl.session)
        conns = sess.get("connections") if isinstance(sess, dict) else None
        addrs = []
        for c in conns if isinstance(conns, list) else ():
            text = c.get("address") if isinstance(c, dict) else None
            if not text:
                continue
            addr = _address(str(text))
            if addr is None:
                self.skipped.append((f"address {acl.path}", f"not an IP address: {text!r}"))
            else:
                addrs.append(addr)
        wbytes: dict[int, int] = {}
        rbytes: dict[int, int] = {}
        commands: dict[int, int] = {}
        for tpg_lun, stats in plan.stats:
            mib = _uint_file(Path(stats, "write_mbytes"))
            if mib is not None:
                wbytes[tpg_lun] = mib * MIB
                read_mib = _uint_file(Path(stats, "read_mbytes"))
                cmds = _uint_file(Path(stats, "num_cmds"))
                if read_mib is not None and cmds is not None:
                    rbytes[tpg_lun], commands[tpg_lun] = read_mib * MIB, cmds
        mapped = tuple(tpg_lun for tpg_lun, _ in plan.stats)
        return LioAcl(acl.node_wwn, tuple(addrs), mapped, wbytes, rbytes, commands)

    def _mapped_lun(self, acl: Any, n: int, lun_paths: dict[str, int]) -> tuple[int, str]:
        """(the TPG LUN it maps, its path); LookupError when it links to no LUN read."""
        m = self.rts.MappedLUN(acl, n)  # no TPG LUN: lookup
        self.shape.links_in(m.path)
        tpg_lun = lun_paths.get(os.path.realpath(f"{m.path}/{m.alias}"))
        if tpg_lun is None:
            raise LookupError("links to no LUN of its TPG that could be read")
        return tpg_lun, m.path

    # -- refresh ---------------------------------------------------------------
    def plan(self, tpgs: list[LioTpg], now: float) -> _Plan | None:
        """What a refresh needs after this walk; None when the walk skipped an object
        other than a session or an address (a damaged or changing tree: walked again)."""
        if any(not key.startswith(_REREAD) for key, _ in self.skipped):
            return None
        where = tuple(self.tpg_plans[id(t)] for t in tpgs)
        return _Plan(now, where, self.shape)

    def refresh(self, plan: _Plan) -> list[LioTpg] | None:
        """The plan's TPGs with their sessions, counters and generated ACLs' sessions
        read again; None when the tree's shape is not as walked (the caller walks)."""
        if not plan.shape.holds():
            return None
        out = []
        for tpg, where in plan.tpgs:
            acls = tuple(self._acl_now(a) for a in where.acls)
            dyn = _session_names(Path(where.sessions)) if where.sessions else ()
            out.append(replace(tpg, acls=acls, dynamic_sessions=dyn))
        return out
