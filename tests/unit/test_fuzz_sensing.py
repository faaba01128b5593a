"""The tree readers never let an unexpected exception escape: LIO (lio.py, through
rtslib-fb), nvmet (nvmet.py), the LVM map (blockdevs.py) and the whole discovery
(discovery.py, target.py) over mutated copies of the captured lab tree
(tests/fixtures/lab). Regression tests for each reproduced escape, Hypothesis over the
files rtslib parses (derandomized), and seeded corpora that count their cases and
escapes. An escape is any exception but the module's documented one (lio.py:
LioUnavailable; nvmet.py, blockdevs.py, discovery.py: none); every documented error
and every skipped object's note is one line. The byte and text parsers (sock_diag,
diskstats): test_fuzz_sensing_parsers.py.

The corpora mutate a copy of the tree in place, a few entries per case with a
random.Random(case), and undo the case before the next one by renaming the originals
back (a fresh copy per case would cost ~0.1 s). `pytest -s` prints each corpus's counts.
"""

import logging
import math
import os
import random
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance.sensing.blockdevs import resolve_device_path, scan_lvm
from santhrottle.appliance.sensing.conns import parse_diag_dump
from santhrottle.appliance.sensing.discovery import build_discovery
from santhrottle.appliance.sensing.diskstats import COUNTER_LIMIT
from santhrottle.appliance.sensing.lio import LioAcl, LioSensor, LioTpg, LioUnavailable
from santhrottle.appliance.sensing.nvmet import NvmetSensor
from santhrottle.appliance.sensing.target import TargetSensor

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
IQN0 = "iqn.2003-01.org.santhrottle.lab:lun0"
IQN1 = "iqn.2003-01.org.santhrottle.lab:lun1"
TPG1 = f"target/iscsi/{IQN1}/tpgt_1"
ACL1 = f"{TPG1}/acls/iqn.2003-01.org.santhrottle.lab:ini1"
FUZZ = settings(derandomize=True, deadline=None, database=None)


def one_line(e: BaseException) -> bool:
    return bool(str(e)) and "\n" not in str(e)


# -- a captured tree, mutated and restored in place -------------------------------------


class Mutator:
    """Mutates entries of `work` (a copy of `source`) in place; undo() puts every entry
    back by renaming its original in from a stash next to `work` (no copying)."""

    KINDS = ("truncate", "empty", "garbage", "non-utf8", "remove", "extra-dir", "link", "to-dir")

    def __init__(self, source: Path, work: Path, hot=lambda rel: True, keep=()) -> None:
        self.work = work
        self.stash = work.parent / f".stash-{work.name}"
        self.stash.mkdir(exist_ok=True)
        self.entries: list[str] = []  # relative paths: files, links, directories
        for dirpath, dirs, files in os.walk(source):
            for name in dirs + files:
                rel = os.path.relpath(os.path.join(dirpath, name), source)
                if rel not in keep:
                    self.entries.append(rel)
        self.entries.sort()
        self.hot = [e for e in self.entries if hot(e)]
        self._undo: list[tuple[Path, Path | None]] = []  # (entry, its stashed original)

    def mutate(self, rng: random.Random, n: int) -> list[str]:
        done = []
        for _ in range(n):
            rel = rng.choice(self.hot if rng.random() < 0.8 else self.entries)
            kind = rng.choice(self.KINDS)
            if self._apply(rng, rel, kind):
                done.append(f"{kind} {rel}")
        return done

    def _apply(self, rng: random.Random, rel: str, kind: str) -> bool:
        path = self.work / rel
        if not os.path.lexists(path) or not path.parent.is_dir():
            return False  # under something an earlier mutation removed
        if kind == "extra-dir":
            parent = path if path.is_dir() and not path.is_symlink() else path.parent
            extra = parent / rng.choice(["lun_9", "lun_x", "tpgt_x", "tpgt_", "zz", "1", "١"])
            if os.path.lexists(extra):
                return False
            extra.mkdir()
            self._undo.append((extra, None))
            return True
        is_file = path.is_file() and not path.is_symlink()
        data = path.read_bytes() if is_file else b""
        saved = self.stash / str(len(self._undo))
        os.rename(path, saved)
        self._undo.append((path, saved))
        if kind == "remove":
            return True
        if kind == "to-dir":
            path.mkdir()
        elif kind == "link" or not is_file:
            os.symlink(rng.choice(["../nowhere", "..", ".", "/", path.name]), path)
        elif kind == "truncate":
            path.write_bytes(data[: rng.randrange(len(data))] if data else b"")
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "garbage":
            alphabet = b"0123456789 :-_.x\n\t[]" + bytes(range(97, 123))
            path.write_bytes(bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))))
        else:
            path.write_bytes(rng.choice([b"\xff\xfe", b"\x80", b"\xc3\x28", b"\x00"]) + data[:20])
        return True

    def undo(self) -> None:
        for path, saved in reversed(self._undo):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif os.path.lexists(path):
                path.unlink()
            if saved is not None:
                os.rename(saved, path)
        self._undo.clear()


def _lio_hot(rel: str) -> bool:
    """What rtslib reads: directories (not the statistics), symlinks, a few files."""
    if not rel.startswith("target"):
        return False
    if "statistics" in rel:
        return rel.endswith("write_mbytes")
    name = rel.rsplit("/", 1)[-1]
    return name in ("info", "enable", "udev_path", "generate_node_acls", "tag", "write_mbytes") or (
        "/" in rel and not any(p in rel for p in ("/param", "/auth", "/attrib/", "/wwn", "/alua"))
    )


@pytest.fixture(scope="module")
def lab_copy(tmp_path_factory):
    """A copy of the whole captured lab tree: configfs/, sys/, proc/."""
    root = tmp_path_factory.mktemp("lab") / "lab"
    shutil.copytree(LAB, root, symlinks=True)
    return root


@pytest.fixture(scope="module")
def baseline():
    return {t.wwn: t for t in LioSensor(LAB / "configfs").scan()}


def _scan(root: Path) -> LioSensor:
    sensor = LioSensor(root)
    sensor.scan()
    return sensor


# -- LIO: the reproduced escapes --------------------------------------------------------


def test_an_empty_acl_info_keeps_the_acl_without_address_and_logs_once(lab_copy, caplog):
    info = lab_copy / "configfs" / ACL1 / "info"
    saved = info.read_bytes()
    info.write_bytes(b"")  # rtslib's session parser: IndexError
    try:
        sensor = LioSensor(lab_copy / "configfs")
        with caplog.at_level(logging.WARNING, logger="santhrottle.appliance.sensing.lio"):
            tpgs = {t.wwn: t for t in sensor.scan()}
            sensor.scan()
    finally:
        info.write_bytes(saved)
    (acl,) = tpgs[IQN1].acls
    assert acl.addresses == () and acl.mapped_luns == (0,)
    assert acl.write_bytes[0] >= 1024 * 1024  # the counters are still read
    (line,) = sensor.last_skipped
    assert line.startswith("session ") and line.endswith("IndexError: list index out of range")
    assert sensor.skipped == 2  # one per scan
    (rec,) = caplog.records  # logged once, one line
    assert "\n" not in rec.getMessage()


@pytest.mark.parametrize(
    ("rel", "data", "what"),
    [
        # UnicodeDecodeError: the LUN, and so the ACL's mapping of it
        ("target/core/iblock_1/lun1/udev_path", b"\xff\xfe/dev/labvg/lun1", ["LUN", "mapped"]),
        (f"{TPG1}/enable", b"yes", ["TPG"]),  # ValueError: int("yes")
        (
            f"{ACL1}/info",
            b"CID: 0  Connection State: TARG_CONN_STATE_UP\n",
            ["session"],
        ),  # KeyError
        (f"{ACL1}/info", b"InitiatorName: x\nCID: 1 TARG_CONN_STATE_UP\n   Address", ["session"]),
    ],
    ids=["non-utf8-udev_path", "garbage-enable", "info-keyerror", "info-indexerror"],
)
def test_one_unreadable_object_is_skipped_and_the_other_target_kept(
    lab_copy, baseline, rel, data, what
):
    path = lab_copy / "configfs" / rel
    saved = path.read_bytes()
    path.write_bytes(data)
    try:
        sensor = LioSensor(lab_copy / "configfs")
        tpgs = {t.wwn: t for t in sensor.scan()}
    finally:
        path.write_bytes(saved)
    assert tpgs[IQN0] == baseline[IQN0]
    assert [s.split(" ", 1)[0] for s in sensor.last_skipped] == what
    assert all(one_line(Exception(s)) for s in sensor.last_skipped)


@pytest.mark.parametrize(
    "extra", [f"{TPG1}/lun/lun_x", f"target/iscsi/{IQN1}/tpgt_x", "target/iscsi/zz"]
)
def test_an_extra_directory_is_skipped_not_the_scan(lab_copy, baseline, extra):
    path = lab_copy / "configfs" / extra
    path.mkdir()
    try:
        sensor = LioSensor(lab_copy / "configfs")
        tpgs = {t.wwn: t for t in sensor.scan()}
    finally:
        path.rmdir()
    assert tpgs == baseline  # every real object still read
    assert len(sensor.last_skipped) == 1


def test_an_acl_address_that_is_not_an_ip_is_dropped(lab_copy):
    info = lab_copy / "configfs" / ACL1 / "info"
    saved = info.read_text()
    info.write_text(saved.replace("Address 10.0.0.3 TCP", "Address 10.0.0.3\x00; TCP"))
    try:
        sensor = LioSensor(lab_copy / "configfs")
        (acl,) = next(t for t in sensor.scan() if t.wwn == IQN1).acls
    finally:
        info.write_text(saved)
    assert acl.addresses == ()
    assert sensor.last_skipped[0].startswith("address ")


# -- LIO: Hypothesis and the seeded corpus ----------------------------------------------

LIO_FILES = [
    f"{ACL1}/info",
    f"{ACL1}/lun_0/statistics/scsi_auth_intr/write_mbytes",
    f"{TPG1}/enable",
    f"{TPG1}/attrib/generate_node_acls",
    "target/core/iblock_1/lun1/udev_path",
]


@settings(FUZZ, max_examples=100)
@given(st.sampled_from(LIO_FILES), st.binary(max_size=120))
def test_fuzz_lio_file_contents(lab_copy, baseline, rel, data):
    path = lab_copy / "configfs" / rel
    saved = path.read_bytes()
    path.write_bytes(data)
    try:
        tpgs = {t.wwn: t for t in LioSensor(lab_copy / "configfs").scan()}
    finally:
        path.write_bytes(saved)
    assert tpgs[IQN0] == baseline[IQN0]  # the other target is never touched


def _check_tpg(t: LioTpg) -> None:
    assert isinstance(t.tag, int) and all(0 <= port <= 65535 for _, port in t.portals)
    for acl in t.acls:
        assert isinstance(acl, LioAcl)
        for a in acl.addresses:
            socket.inet_pton(socket.AF_INET6 if ":" in a else socket.AF_INET, a)
        assert all(b >= 0 for b in acl.write_bytes.values())


LIO_CASES = 300


@pytest.mark.fuzz
def test_corpus_mutated_lio_trees(lab_copy, baseline):
    """300 mutated configfs trees, 1-3 mutations each: 0 escapes, 0 LioUnavailable, and a
    target none of whose files was touched is read exactly as in the captured tree."""
    mut = Mutator(LAB / "configfs", lab_copy / "configfs", _lio_hot)
    escapes, unavailable, skipped, intact_checked = [], 0, 0, 0
    for case in range(LIO_CASES):
        rng = random.Random(case)
        done = mut.mutate(rng, rng.randint(1, 3))
        try:
            sensor = LioSensor(lab_copy / "configfs")
            tpgs = sensor.scan()
        except LioUnavailable as e:
            assert one_line(e)
            unavailable += 1
        except Exception as e:
            escapes.append(f"case {case} {done}: {type(e).__name__}: {e}")
        else:
            skipped += len(sensor.last_skipped)
            for t in tpgs:
                _check_tpg(t)
            touched = {d.split(" ", 1)[1] for d in done}
            if all(r.startswith(f"target/iscsi/{IQN1}/") for r in touched):
                intact_checked += 1
                assert {t.wwn: t for t in tpgs}.get(IQN0) == baseline[IQN0], (case, done)
        finally:
            mut.undo()
    print(f"\nfuzz LIO corpus: {LIO_CASES} trees, {len(escapes)} escapes, "
          f"{unavailable} LioUnavailable, {skipped} objects skipped")  # fmt: skip
    assert escapes == []
    assert unavailable == 0
    assert skipped > LIO_CASES // 4 and intact_checked > 10  # the mutations do bite
    assert {t.wwn: t for t in LioSensor(lab_copy / "configfs").scan()} == baseline  # undone


# -- nvmet, blockdevs, discovery ----------------------------------------------------------


def test_nvmet_numbers_are_ascii_digits_in_range(tmp_path):
    for port, svc in (("1", "٤٤٢٠"), ("2", "70000"), ("3", "9" * 5000), ("4", "4420")):
        (tmp_path / "nvmet" / "ports" / port).mkdir(parents=True)
        (tmp_path / "nvmet" / "ports" / port / "addr_trsvcid").write_text(svc)
    for nsid in ("²", "1", "9" * 200):
        (tmp_path / "nvmet" / "subsystems" / "s" / "namespaces" / nsid).mkdir(parents=True)
    nv = NvmetSensor(tmp_path)
    assert [p.trsvcid for p in nv.ports()] == [None, None, None, 4420]
    assert [ns.nsid for ns in nv.subsystems()[0].namespaces] == [1]


def test_a_nul_in_a_device_path_resolves_to_nothing():
    assert resolve_device_path("/dev/lab\x00vg/lun0", {}) is None
    assert resolve_device_path("/dev/x\x00y", {}) is None


def test_a_static_map_over_an_address_that_does_not_parse():
    acl = LioAcl("iqn.x:ini", ("garbage",), (0,))
    tpg = LioTpg("iscsi", "iqn.x:tgt", 1, True, False, (), (), (acl,))
    d = build_discovery(lio=[tpg], static_map={"10.0.0.0/24": ["vg0"], "10.0.0.9": ["vg0"]})
    assert d.initiators["garbage"].resources == set()
    assert d.initiators["10.0.0.9"].resources == {"vg0"}


NVMET_LVM_CASES = 300


@pytest.mark.fuzz
def test_corpus_mutated_nvmet_and_sysfs_trees(lab_copy):
    """300 mutated copies of the nvmet configfs tree and sys/block, 1-3 mutations each:
    0 escapes from NvmetSensor and scan_lvm, and what they give is well-formed."""
    mut = Mutator(LAB, lab_copy, lambda rel: rel.startswith(("configfs/nvmet", "sys")))
    mut.entries = list(mut.hot)  # nothing else
    escapes, lvs_seen = [], 0
    for case in range(NVMET_LVM_CASES):
        rng = random.Random(case)
        done = mut.mutate(rng, rng.randint(1, 3))
        try:
            nv = NvmetSensor(lab_copy / "configfs")
            for sub in nv.subsystems():
                assert all(isinstance(ns.nsid, int) and ns.nsid >= 0 for ns in sub.namespaces)
            for port in nv.ports():
                assert port.trsvcid is None or 0 <= port.trsvcid <= 65535
            lvs = scan_lvm(lab_copy / "sys")
            assert all(lv.device.startswith("dm-") and lv.vg and lv.lv for lv in lvs.values())
            lvs_seen += len(lvs)
        except AssertionError:
            raise
        except Exception as e:
            escapes.append(f"case {case} {done}: {type(e).__name__}: {e}")
        finally:
            mut.undo()
    print(f"\nfuzz nvmet+sysfs corpus: {NVMET_LVM_CASES} trees, {len(escapes)} escapes")
    assert escapes == []
    assert 0 < lvs_seen < 3 * NVMET_LVM_CASES  # some LVs read, some mutated away


class _Conns:
    def __init__(self, conns):
        self.conns = conns

    def connections(self):
        return self.conns


def _whole_hot(rel: str) -> bool:
    return _lio_hot(rel.removeprefix("configfs/")) or rel.startswith(("sys/", "configfs/nvmet"))


DISCOVERY_CASES = 60


@pytest.mark.fuzz
def test_corpus_whole_discovery_over_mutated_trees(lab_copy):
    """60 mutated lab trees (configfs with LIO and nvmet, sys/block, the diskstats
    contents), 1-4 mutations each, through TargetSensor: two convergences and a tick
    each. 0 escapes; every sample finite and non-negative."""
    import json

    conns = parse_diag_dump(json.loads((LAB / "sock_diag.json").read_text()), [3260, 4420])
    keep = {"proc", "proc/diskstats.0", "proc/diskstats.1"}  # contents only, below
    mut = Mutator(LAB, lab_copy, _whole_hot, keep=keep)
    junk = ["٣", "-1", "x", str(COUNTER_LIMIT)]
    escapes, skipped = [], 0
    for case in range(DISCOVERY_CASES):
        rng = random.Random(case)
        done = mut.mutate(rng, rng.randint(1, 4))
        proc = lab_copy / f"proc-{case}"
        proc.mkdir()
        now = [100.0]
        try:
            sensor = TargetSensor(
                proc_root=proc,
                sys_root=lab_copy / "sys",
                configfs_root=lab_copy / "configfs",
                clock=lambda now=now: now[0],
                connections=_Conns(conns),
                static_map={"10.0.0.0/24": ["labvg"]},
            )
            for name in ("diskstats.0", "diskstats.1"):
                lines = (LAB / "proc" / name).read_text().splitlines()
                if rng.random() < 0.5:
                    i = rng.randrange(len(lines))
                    f = lines[i].split()
                    f[rng.randrange(len(f))] = rng.choice(junk)
                    lines[i] = " ".join(f)
                (proc / "diskstats").write_text("\n".join(lines))
                sensor.read_samples()
                _, writes = sensor.converge()
                now[0] += 1.0
            reads = sensor.read_samples()
            for r in reads:
                assert math.isfinite(r.read_latency_s) and r.read_latency_s >= 0
            assert all(math.isfinite(w.write_bps) and w.write_bps >= 0 for w in writes)
            skipped += sensor.warnings.lio_skipped
        except AssertionError:
            raise
        except Exception as e:
            escapes.append(f"case {case} {done}: {type(e).__name__}: {e}")
        finally:
            mut.undo()
            shutil.rmtree(proc)
    print(f"\nfuzz discovery corpus: {DISCOVERY_CASES} trees, {len(escapes)} escapes, "
          f"{skipped} LIO objects skipped")  # fmt: skip
    assert escapes == []
    assert skipped > 0
    assert scan_lvm(lab_copy / "sys") == scan_lvm(LAB / "sys")  # undone
