"""Host: a device's index is looked up once, and again after a message on it failed."""

from __future__ import annotations

import pytest

from santhrottle.appliance.datapath.host import Host
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.datapath.tc import TcDevice

pytestmark = pytest.mark.privileged


def test_a_recreated_device_is_looked_up_again(netns_pair):
    pair = netns_pair
    pair.tsh("ip", "link", "add", "st-a", "type", "veth", "peer", "name", "st-b")
    host = Host(pair.target)
    try:
        first = host.ifindex("st-a")
        pair.tsh("ip", "link", "del", "st-a")
        assert host.ifindex("st-a") == first  # kept: no lookup per message
        with pytest.raises(DatapathError, match="glide leaves' queues"):
            TcDevice(host, "st-a").leaf_readings([0x6000])  # the index names nothing now
        with pytest.raises(DatapathError, match="no network device st-a"):
            host.ifindex("st-a")  # looked up again
        pair.tsh("ip", "link", "add", "st-a", "type", "veth", "peer", "name", "st-b")
        again = host.ifindex("st-a")
        assert again != first
        assert again == int(pair.tsh("cat", "/sys/class/net/st-a/ifindex"))
    finally:
        host.close()
