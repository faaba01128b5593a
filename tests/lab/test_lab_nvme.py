"""NVMe/TCP: nvmet (configfs) in netns tgt, the kernel NVMe/TCP host outside."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.lab


def test_nvme_tcp_connected(topology, guest, nvme_ns):
    n = topology["nvme"][nvme_ns]
    assert n["device"] and os.path.exists(n["device"])
    out = guest.run(
        [
            "ip",
            "netns",
            "exec",
            topology["netns"],
            "ss",
            "-Htn",
            "state",
            "established",
            "sport = :4420",
        ]
    ).stdout
    peers = {line.split()[-1].rsplit(":", 1)[0] for line in out.splitlines()}
    assert peers == {n["host_traddr"]}, out


def test_fio_writes_and_reads_back_nvme(topology, guest, nvme_ns):
    dev = topology["nvme"][nvme_ns]["device"]
    size = 16 << 20
    job = guest.fio_write_verify(dev, size)
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] == size
    assert job["read"]["io_bytes"] == size
