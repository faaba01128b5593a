import json
import shutil
from pathlib import Path

import pytest

from santhrottle.appliance.cli.main import main
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION

LAB = Path(__file__).parents[1] / "fixtures" / "lab"
META = json.loads((LAB / "meta.json").read_text())


@pytest.fixture
def roots(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(LAB / "proc" / "diskstats.1", proc / "diskstats")
    return [
        "--proc-root",
        str(proc),
        "--sys-root",
        str(LAB / "sys"),
        "--configfs-root",
        str(LAB / "configfs"),
        "--interval",
        "0.01",
    ]


def test_resources_json(roots, capsys):
    assert main(["resources", "--json", *roots]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["protocol"] == PROTOCOL_VERSION
    (r,) = out["data"]["resources"]
    assert out["data"]["warnings"] == {
        "malformed_diskstats_lines": 0, "lio_errors": 0, "lio_skipped": 0}  # fmt: skip
    assert r["resource"] == META["vg"] and r["devices"] == ["dm-0", "dm-1", "dm-2"]
    # the ACL session is known from configfs alone (no live connections here)
    assert META["iscsi"][1]["initiator_ip"] in r["initiators"]


def test_initiators_table(roots, capsys):
    assert main(["initiators", *roots]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["INITIATOR", "RESOURCE", "WR_MB/s", "SOURCE"]
    assert META["iscsi"][1]["initiator_ip"] in out and "acl" in out


def test_bad_interval_is_usage_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["resources", "--interval", "0"])
    assert e.value.code == 2
    assert "--interval must be above 0" in capsys.readouterr().err


def test_kernel_state_that_cannot_be_read_is_exit_1(capsys):
    assert main(["initiators", "--proc-root", "/nonexistent", "--interval", "0.01"]) == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and err.count("\n") == 1 and err.startswith("santhrottle: ")


def test_the_configuration_declares_resources_and_maps_addresses(roots, tmp_path, capsys):
    conf = tmp_path / "s.toml"
    conf.write_text(
        '[datapath]\ndevices = ["eth1"]\n\n[resources.decl]\ndevices = ["dm-2"]\n\n'
        '[static_map]\n"192.0.2.77" = ["decl"]\n'
    )
    assert main(["resources", "--json", *roots, "--config", str(conf)]) == 0
    got = {r["resource"]: r for r in json.loads(capsys.readouterr().out)["data"]["resources"]}
    assert got["decl"]["devices"] == ["dm-2"] and "192.0.2.77" in got["decl"]["initiators"]
    conf.write_text("[datapath]\nstep = 5\n")
    assert main(["resources", *roots, "--config", str(conf)]) == 2
    assert "datapath.step" in capsys.readouterr().err
