"""vagrant/qemu/lab.py refuses, with one clear error, what can only fail later in the guest."""

import importlib.util
from pathlib import Path

import pytest

LAB_PY = Path(__file__).resolve().parents[2] / "vagrant" / "qemu" / "lab.py"


@pytest.fixture(scope="module")
def lab():
    spec = importlib.util.spec_from_file_location("santhrottle_lab_runner_unit", LAB_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("checkout", ["/tmp/ci/main", "/run/x", "/dev/shm/y"])
def test_checkout_on_a_guest_tmpfs_is_refused(lab, checkout, tmp_path):
    runner = lab.Lab(checkout=checkout, cache=tmp_path, log=lambda _msg: None)
    with pytest.raises(lab.LabError, match=r"mounts as an empty tmpfs"):
        runner.up()
    assert not (tmp_path / ".lock").exists()  # refused before touching anything


def test_refuses_to_run_inside_the_guest(lab, monkeypatch, tmp_path):
    monkeypatch.setenv("SANTHROTTLE_IN_GUEST", "1")
    with pytest.raises(lab.LabError, match="this is the lab guest already"):
        lab.Lab(cache=tmp_path, log=lambda _msg: None).up()


@pytest.fixture(scope="module")
def topology():
    path = LAB_PY.parent / "guest" / "topology.py"
    spec = importlib.util.spec_from_file_location("santhrottle_lab_topology_unit", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_topology_plan_spreads_initiators_over_links(topology):
    t = topology.plan(luns=3, nvme=0, links=2)
    assert [x["target_device"] for x in t["iscsi"]] == ["lab-tgt", "lab-tgt1", "lab-tgt"]
    assert t["links"] == [
        {"initiator": "lab-ini", "target": "lab-tgt"},
        {"initiator": "lab-ini1", "target": "lab-tgt1"},
    ]
    assert [x["target_device"] for x in topology.plan(luns=2, nvme=0)["iscsi"]] == ["lab-tgt"] * 2
    with pytest.raises(topology.TopologyError, match=r"links must be within 1\.\.2"):
        topology.plan(luns=2, nvme=0, links=3)
