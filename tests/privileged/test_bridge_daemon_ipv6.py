"""santhrottled in bridge mode with IPv6 initiators, for real: the dual-stack namespaces of
test_bridge_ipv6.py, iSCSI PDUs over IPv6 TCP through the bridge.

A writer and a reader on one IPv6 address: the wire sensor (in the kernel, and in Python)
reads the writes and the reads' latency off IPv6 packets, the daemon puts the address in
its resource's write-heavy set and, with the read latency over the threshold, in a delay
class of nftables' IPv6 map; on SIGTERM nobody is delayed any more.
"""

from __future__ import annotations

import time

import pytest

from santhrottle.appliance.daemon.control import request
from tests.privileged.bridge_ns import INI6, TGT6
from tests.privileged.test_bridge_daemon import Reader, Target, _until
from tests.privileged.test_bridge_ipv6 import _nft
from tests.privileged.test_daemon_netns import _start, _stop

pytestmark = pytest.mark.privileged


@pytest.mark.parametrize("sensor", ["kernel", "capture"])
def test_an_ipv6_writer_becomes_write_heavy_and_is_delayed(dual_stack, tmp_path, sensor):
    ini, mid, tgt = dual_stack
    conf = tmp_path / "s.toml"
    sock = str(tmp_path / "control.sock")
    conf.write_text(
        f'[daemon]\nmode = "bridge"\ncontrol_socket = "{sock}"\n'
        f'netns = "{mid}"\nstate_dir = "{tmp_path / "state"}"\n'
        '[bridge]\nname = "st-br0"\ninitiator_port = "st-bi"\narray_port = "st-ba"\n'
        f'sensor = "{sensor}"\n'
        '[datapath]\nleaf = "pfifo"\nlink_speed = "10gbit"\n[metrics]\nport = 0\n'
        f'[resources.arr]\nthreshold = "10ms"\nvolumes = ["iscsi://[{TGT6}]/*/*"]\n'
    )
    target = Target(tgt, addr=TGT6)
    target.start()
    reader = Reader(ini, src=INI6, dst=TGT6)
    writer = Reader(ini, write_bps=4e6, src=INI6, dst=TGT6)
    reader.start()
    writer.start()
    time.sleep(2)
    proc = _start(conf, sock)
    try:

        def members():
            (r,) = request(sock, "status")["resources"]
            return r["members"]

        assert _until(members, 30.0) == [INI6], request(sock, "status")
        assert writer.error is None and reader.error is None

        def klass():
            inis = {i["initiator"]: i for i in request(sock, "status")["initiators"]}
            return inis.get(INI6, {}).get("class")

        assert _until(klass, 30.0), request(sock, "status")
        (r,) = request(sock, "status")["resources"]
        assert r["reads"] and r["read_latency_s"] > 0.01  # the target answers after 20 ms
        assert f"{INI6} : 5374:" in _nft(mid)  # in the IPv6 map
    finally:
        reader.stop.set()
        writer.stop.set()
        _stop(proc)
        reader.join(timeout=15)
        writer.join(timeout=15)
        target.close()
    assert proc.returncode == 0
    assert " : 5374:" not in _nft(mid), "nobody delayed once the daemon has stopped"
