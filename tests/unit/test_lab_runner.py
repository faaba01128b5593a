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
