"""santhrottled in bridge mode with IPv6 initiators, for real: the dual-stack namespaces of
test_bridge_ipv6.py, iSCSI PDUs over IPv6 TCP through the bridge.

A writer and a reader on one IPv6 address: the wire sensor (in the kernel, and in Python)
reads the writes and the reads' latency off IPv6 packets, the daemon puts the address in
its resource's write-heavy set and, with the read latency over the threshold, in a delay
class of nftables' IPv6 map; on SIGTERM nobody is delayed any more.
"""

from __future__ import annotations

import pytest

from tests.privileged.bridge_ns import INI6, TGT6
from tests.privileged.test_bridge_daemon import Target, a_writer_gets_a_class, bridge_config
from tests.privileged.test_bridge_ipv6 import _nft

pytestmark = pytest.mark.privileged


@pytest.mark.parametrize("sensor", ["kernel", "capture"])
def test_an_ipv6_writer_becomes_write_heavy_and_is_delayed(dual_stack, tmp_path, sensor):
    ini, mid, tgt = dual_stack
    conf = bridge_config(tmp_path, mid, sensor, f"iscsi://[{TGT6}]/*/*", "10ms")
    target = Target(tgt, addr=TGT6)
    target.start()
    try:
        a_writer_gets_a_class(conf, ini, mid, INI6, dst=TGT6)
    finally:
        target.close()
    assert " : 5374:" not in _nft(mid), "nobody delayed once the daemon has stopped"
