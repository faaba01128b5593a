"""iSCSI through LIO in netns tgt, kernel initiators in the initial netns."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.lab

FIO_COMMON = ["--direct=1", "--ioengine=libaio", "--group_reporting=0"]


def _established(guest, netns: str, port: int) -> set[tuple[str, str]]:
    """(local address, peer address) of the established TCP connections on `port`."""
    out = guest.run(
        ["ip", "netns", "exec", netns, "ss", "-Htn", "state", "established", f"sport = :{port}"]
    ).stdout
    pairs = set()
    for line in out.splitlines():
        cols = line.split()
        local, peer = cols[-2], cols[-1]
        pairs.add((local.rsplit(":", 1)[0], peer.rsplit(":", 1)[0]))
    return pairs


def test_iscsi_sessions_one_per_initiator(topology, topo_mod, guest):
    sessions = {s["targetname"]: s for s in topo_mod.iscsi_sessions()}
    assert len(sessions) == len(topology["iscsi"])
    for t in topology["iscsi"]:
        s = sessions[t["iqn"]]
        assert s["state"] == "LOGGED_IN", s
        assert s["iface"] == t["iface"]
        assert s["initiatorname"] == t["initiator_iqn"]
        assert s["devices"] == [t["device"]]
        assert os.path.exists(t["device"])
    # The target sees each initiator from its own source address, on its own portal.
    want = {(t["portal"], t["initiator_ip"]) for t in topology["iscsi"]}
    assert _established(guest, topology["netns"], 3260) == want


def test_fio_writes_and_reads_back_each_lun(topology, guest, lun):
    """Random 64k writes then a verifying read pass of every block, per LUN."""
    dev = topology["iscsi"][lun]["device"]
    size = 16 << 20
    r = guest.fio(
        "--name=verify", f"--filename={dev}", *FIO_COMMON, "--rw=randwrite", "--bs=64k",
        "--iodepth=4", f"--size={size}", "--verify=crc32c", "--do_verify=1",
        "--verify_fatal=1",
    )
    job = r["jobs"][0]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] == size
    assert job["read"]["io_bytes"] == size  # the verify pass
    assert job["write"]["iops"] > 0 and job["read"]["iops"] > 0


def test_no_target_retransmits_under_load(topology, guest):
    """With RPS on both veth ends (lab-notes) the target retransmits nothing
    while all initiators read and write at once."""
    netns = topology["netns"]
    before_tgt, before_ini = guest.nstat(netns), guest.nstat()
    args = ["--time_based", "--runtime=3", "--rw=randrw", "--bs=64k", "--iodepth=4",
            *FIO_COMMON]
    for t in topology["iscsi"]:
        args += [f"--name={t['lv']}", f"--filename={t['device']}"]
    r = guest.fio(*args, timeout=60)
    after_tgt, after_ini = guest.nstat(netns), guest.nstat()
    moved = sum(j["read"]["io_bytes"] + j["write"]["io_bytes"] for j in r["jobs"])
    assert moved > 0 and all(j["error"] == 0 for j in r["jobs"])
    assert after_tgt["TcpOutSegs"] > before_tgt["TcpOutSegs"]
    delta = {
        k: after_ini.get(k, 0) - before_ini.get(k, 0)
        for k in ("TcpRetransSegs", "TcpExtTCPLossProbes")
    }
    print(f"{moved >> 20} MiB moved; initiator side: {delta} (loss probes are expected)")
    retrans = after_tgt["TcpRetransSegs"] - before_tgt["TcpRetransSegs"]
    assert retrans == 0, f"target retransmitted {retrans} segments"
