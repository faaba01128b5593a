"""The lab runner (labkit.images, labkit.qemu) refuses, with one clear error, what can only
fail later in the guest; the topology's plan."""

import pytest
from labkit import images, qemu, topology
from labkit.images import LabError, Settings
from labkit.topology import network


def test_refuses_to_run_inside_the_guest(monkeypatch, tmp_path):
    monkeypatch.setenv("SANTHROTTLE_IN_GUEST", "1")
    with pytest.raises(LabError, match="this is the lab guest already"):
        images.prepare(Settings.from_env(cache=tmp_path, log=lambda _msg: None))


def test_topology_plan_spreads_initiators_over_links():
    t = topology.plan(luns=3, nvme=0, links=2)
    assert [x["target_device"] for x in t["iscsi"]] == ["lab-tgt", "lab-tgt1", "lab-tgt"]
    assert t["links"] == [
        {"initiator": "lab-ini", "target": "lab-tgt"},
        {"initiator": "lab-ini1", "target": "lab-tgt1"},
    ]
    assert [x["target_device"] for x in topology.plan(luns=2, nvme=0)["iscsi"]] == ["lab-tgt"] * 2
    with pytest.raises(topology.TopologyError, match=r"links must be within 1\.\.2"):
        topology.plan(luns=2, nvme=0, links=3)


def test_topology_ipv6_plan_gives_one_iscsi_initiator_and_the_nvme_host_ula():
    t = topology.plan(luns=4, nvme=1, ipv6_iscsi=(3,), ipv6_nvme=(0,))
    assert [(x["family"], x["initiator_ip"], x["portal"]) for x in t["iscsi"]][2:] == [
        (4, "10.0.0.4", "10.0.0.13"),
        (6, "fd00:5374::5", "fd00:5374::14"),
    ]
    (n,) = t["nvme"]
    assert (n["family"], n["host_traddr"], n["traddr"]) == (6, "fd00:5374::31", "fd00:5374::21")
    assert topology.hostport("fd00:5374::14", 3260) == "[fd00:5374::14]:3260"
    assert topology.hostport("10.0.0.13", 3260) == "10.0.0.13:3260"
    with pytest.raises(topology.TopologyError, match="not in the plan"):
        topology.plan(luns=1, nvme=0, ipv6_nvme=(0,))


def test_topology_ipv6_addresses_skip_dad_and_route_by_128(monkeypatch):
    batches = []
    monkeypatch.setattr(network, "sh", lambda cmd, input=None, **_: batches.append(input))
    t = topology.plan(luns=2, nvme=1, ipv6_iscsi=(1,), ipv6_nvme=(0,))
    topology.setup_network(2, 1, rps=False, plan_=t)
    ini, tgt = batches[1].splitlines(), batches[2].splitlines()
    assert "addr add 10.0.0.2/24 dev lab-ini" in ini
    assert "addr add fd00:5374::3/64 dev lab-ini nodad" in ini
    assert "route add fd00:5374::12/128 dev lab-ini src fd00:5374::3" in ini
    assert "route add fd00:5374::21/128 dev lab-ini src fd00:5374::31" in ini
    assert "addr add fd00:5374::21/64 dev lab-tgt nodad" in tgt


def test_boot_command_line_carries_the_kernel_args_and_the_run_dirs_console(monkeypatch, tmp_path):
    monkeypatch.setenv("SANTHROTTLE_LAB_KERNEL_ARGS", "loglevel=7 foo")
    s = Settings.from_env(cache=tmp_path, log=lambda _msg: None)
    append = qemu.kernel_args(s, "systemd.show_status=false")
    words = append.split()
    assert words[:5] == ["console=ttyS0", "quiet", "panic=-1", "mitigations=off", "tsc=reliable"]
    # the boot's own words, then the admin's, then where the checkout is
    assert words[5:] == [
        "systemd.show_status=false",
        "loglevel=7",
        "foo",
        f"lab_checkout={s.checkout}",
    ]
    cmd = qemu.boot_command(
        "qemu-x", 2, 1024, tmp_path, tmp_path / "vmlinuz", tmp_path / "initrd", append
    )
    assert cmd[0] == "qemu-x"
    assert cmd[cmd.index("-smp") + 1] == "2" and cmd[cmd.index("-m") + 1] == "1024"
    assert cmd[cmd.index("-append") + 1] == append
    assert f"file,id=con,path={tmp_path / 'console.log'}" in cmd
    assert qemu.virtfs("/usr", "hostusr", True) == [
        "-virtfs",
        "local,path=/usr,mount_tag=hostusr,security_model=none,readonly=on",
    ]
