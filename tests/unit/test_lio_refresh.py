"""A LioSensor kept from one scan to the next (the daemon's): rtslib's walk, then
refreshes that read the sessions and counters again, and a walk again whenever the
tree is not as walked or FULL_WALK_EVERY_S has passed (lio.py, "Cost"). A refresh
must give what a fresh sensor's walk gives: checked on named changes and on a seeded
corpus of mutated trees (tests/unit/test_fuzz_sensing.py's Mutator)."""

import os
import random
import shutil

import pytest

from santhrottle.appliance.sensing import lio
from santhrottle.appliance.sensing.lio import LioSensor, LioUnavailable

from .test_fuzz_sensing import ACL1, IQN0, IQN1, LAB, TPG1, Mutator, _lio_hot

MAPPED = f"{ACL1}/lun_0"
STATS = f"{MAPPED}/statistics/scsi_auth_intr"


def whole(tpgs):
    """Everything a scan gives, the counters and sessions too (LioAcl's equality
    leaves them out)."""
    return [
        (t, t.dynamic_sessions, [(a, a.addresses, a.write_bytes, a.read_bytes, a.commands)
                                 for a in t.acls])
        for t in tpgs
    ]  # fmt: skip


def fresh(root):
    sensor = LioSensor(root)
    try:
        return whole(sensor.scan()), sorted(sensor.last_skipped)
    except LioUnavailable:
        return "unavailable", []


def kept_scan(sensor):
    try:
        return whole(sensor.scan()), sorted(sensor.last_skipped)
    except LioUnavailable:
        return "unavailable", []


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "lab"
    shutil.copytree(LAB, root, symlinks=True)
    return root / "configfs"


@pytest.fixture
def clock():
    return [100.0]


@pytest.fixture
def kept(tree, clock):
    sensor = LioSensor(tree, clock=lambda: clock[0])
    sensor.scan()
    assert (sensor.walks, sensor.refreshes) == (1, 0)
    return sensor


def test_between_walks_the_counters_and_sessions_are_read_again(tree, kept, clock):
    (tree / STATS / "write_mbytes").write_text("77\n")
    (tree / STATS / "num_cmds").write_text("9000\n")
    info = tree / ACL1 / "info"
    info.write_text(info.read_text().replace("Address 10.0.0.3 TCP", "Address 10.0.0.9 TCP"))
    dyn = tree / "target/iscsi" / IQN0 / "tpgt_1/dynamic_sessions"
    dyn.write_bytes(b"iqn.2003-01.org.santhrottle.lab:ini0\n\0iqn.2003-01.org.x:other\n\0")
    clock[0] += lio.FULL_WALK_EVERY_S - 1.0
    tpgs = {t.wwn: t for t in kept.scan()}
    assert (kept.walks, kept.refreshes) == (1, 1)
    (acl,) = tpgs[IQN1].acls
    assert acl.addresses == ("10.0.0.9",)
    assert acl.write_bytes == {0: 77 * lio.MIB} and acl.commands == {0: 9000}
    assert tpgs[IQN0].dynamic_sessions == (
        "iqn.2003-01.org.santhrottle.lab:ini0",
        "iqn.2003-01.org.x:other",
    )
    assert kept_scan(kept) == fresh(tree)


def test_the_tree_is_walked_again_after_full_walk_every_s(tree, kept, clock):
    clock[0] += lio.FULL_WALK_EVERY_S
    kept.scan()
    assert (kept.walks, kept.refreshes) == (2, 0)
    clock[0] -= 5.0  # a clock that went back: a walk too
    kept.scan()
    assert kept.walks == 3


def _new_acl(tree):
    shutil.copytree(tree / ACL1, tree / TPG1 / "acls" / "iqn.2003-01.org.x:new", symlinks=True)


def _relink(tree):
    """The mapped LUN's link, same name, pointing elsewhere (to no LUN of the TPG)."""
    link = tree / MAPPED / "046a728b48"
    link.unlink()
    os.symlink("../../../../../../../target/iscsi/nowhere", link)


def _file_to_link(tree):
    (tree / MAPPED / "write_protect").unlink()
    os.symlink("../../lun/lun_0", tree / MAPPED / "write_protect")


def _flip(rel, data):
    return lambda tree: (tree / rel).write_bytes(data)


CHANGES = {
    "a new ACL": _new_acl,
    "an ACL gone": lambda tree: shutil.rmtree(tree / ACL1),
    "a mapped LUN gone": lambda tree: shutil.rmtree(tree / MAPPED),
    "a mapped LUN relinked": _relink,
    "a file of a mapped LUN turned link": _file_to_link,
    "a new LUN": lambda tree: (tree / TPG1 / "lun" / "lun_1").mkdir(),
    "a new portal": lambda tree: (tree / TPG1 / "np" / "10.0.0.99:3260").mkdir(),
    "a new TPG": lambda tree: (tree / "target/iscsi" / IQN1 / "tpgt_2").mkdir(),
    "a new target": lambda tree: (tree / "target/iscsi/iqn.2003-01.org.x:t").mkdir(),
    "a TPG disabled": _flip(f"{TPG1}/enable", b"0\n"),
    "generated ACLs on": _flip(f"{TPG1}/attrib/generate_node_acls", b"1\n"),
    "a new fabric module": lambda tree: (tree / "target" / "loopback").mkdir(),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_tree_not_as_walked_is_walked_again(tree, kept, change):
    change(tree)
    got = kept_scan(kept)
    assert (kept.walks, kept.refreshes) == (2, 0)
    assert got == fresh(tree)


def test_a_walk_that_skipped_an_object_leaves_no_plan(tree, clock):
    """A damaged or changing tree (an object skipped, not a session): walked each time."""
    (tree / TPG1 / "lun" / "lun_x").mkdir()
    sensor = LioSensor(tree, clock=lambda: clock[0])
    sensor.scan()
    sensor.scan()
    assert (sensor.walks, sensor.refreshes) == (2, 0)


LIO_CASES = 300


@pytest.mark.fuzz
def test_corpus_a_kept_sensor_reads_what_a_fresh_one_does(tmp_path):
    """300 mutated trees (1-3 mutations each, undone after): after each mutation and
    each undo, the kept sensor's scan is a fresh sensor's, its skipped objects too.
    Left out: mutations of the backstores (target/core), which a refresh does not read
    (a backstore in use cannot change in LIO: the walk every FULL_WALK_EVERY_S sees it)."""
    root = tmp_path / "lab"
    shutil.copytree(LAB, root, symlinks=True)
    mut = Mutator(LAB / "configfs", root / "configfs", _lio_hot)
    sensor = LioSensor(root / "configfs", clock=lambda: 0.0)
    sensor.scan()
    differ, compared = [], 0
    for case in range(LIO_CASES):
        rng = random.Random(case)
        done = mut.mutate(rng, rng.randint(1, 3))
        for step in ("mutated", "undone"):
            got = kept_scan(sensor)
            if not any(" target/core" in d for d in done):
                compared += 1
                if got != fresh(root / "configfs"):
                    differ.append(f"case {case} {step}: {done}")
            if step == "mutated":
                mut.undo()
    print(f"\nkept LIO sensor corpus: {compared} scans compared, {sensor.walks} walks, "
          f"{sensor.refreshes} refreshes, {len(differ)} differ")  # fmt: skip
    assert differ == []
    assert compared > LIO_CASES // 2 and sensor.walks > 50 and sensor.refreshes > 50
