"""IPv6 initiators on the target host's data path, with real TCP between namespaces.

The same proof as test_datapath_netns.py, for IPv6: the HTB class counters
and the ipset member counters (santhrottle-all6, -ack6, -read6) count the
very packets ip6tables' rules gave a class.  netns_pair6 is dual-stack, so
one batch can move an IPv4 and an IPv6 member at once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from santhrottle.appliance import datapath as dp
from santhrottle.appliance.datapath import rules
from santhrottle.appliance.datapath.host import Tools
from santhrottle.appliance.datapath.names import MEMBERS_SET
from tests.privileged.conftest import MEMBER_IP, MEMBER_IP6, OTHER_IP6, TARGET_DEV
from tests.privileged.test_datapath_netns import ETH_HLEN, MB, _counters, _delta, _dp, _only

pytestmark = pytest.mark.privileged

# A pure ACK with TCP timestamps: 40 B IPv6 + 32 B TCP; the largest TCP header
# (60 B) + IPv6 = 100 B.  Any packet carrying data in these tests is >= 1 kB.
MAX_ACK_IP6_BYTES = 100


def _measured(pair, d, *transfers):
    pair.start_server()
    before = _counters(d)
    for ip, port, up, down in transfers:
        pair.transfer(ip, port, up=up, down=down)
    return _delta(_counters(d), before)


def _jumps6(pair) -> list[str]:
    text = pair.tsh("ip6tables", "-t", "mangle", "-S", "POSTROUTING")
    return [ln for ln in text.splitlines() if ln.endswith("-j SANTHROTTLE")]


def _gate(pair) -> set[str]:
    text = pair.tsh("ipset", "list", MEMBERS_SET)
    return set(text.split("Members:", 1)[1].split())


def test_all_mode_an_ipv6_member_goes_to_its_class(netns_pair6):
    pair = netns_pair6
    with _dp(pair) as d:
        d.apply()
        d.set_classes({"FD00:5374:0::2": 7})  # any spelling: the canonical one is the member
        assert d.current()[MEMBER_IP6].mode == "all"
        assert _gate(pair) == {"santhrottle-all6"}
        assert len(_jumps6(pair)) == 1
        classes, members = _measured(
            pair,
            d,
            (MEMBER_IP6, 3260, 2 * MB, 2 * MB),
            (MEMBER_IP6, 4420, 256 * 1024, 256 * 1024),
            (OTHER_IP6, 3260, MB, MB),  # not a member
            (MEMBER_IP6, 5201, MB, MB),  # a member, not a storage port
        )
    pkts, nbytes = members[MEMBER_IP6]
    assert classes[7] == (pkts, nbytes + ETH_HLEN * pkts)
    assert nbytes >= 2 * MB + 256 * 1024
    assert nbytes < 2 * MB + 256 * 1024 + MB, "the other address and port stayed out"
    assert _only(classes, 0, 7) == {}


def test_ack_mode_an_ipv6_members_pure_acks_go_to_the_class(netns_pair6):
    pair = netns_pair6
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP6: 3}, mode="ack")
        classes, members = _measured(pair, d, (MEMBER_IP6, 3260, 16 * MB, 256 * 1024))
    pkts, nbytes = members[MEMBER_IP6]
    assert pkts > 50, "the writer's pure ACKs matched the IPv6 ack rule"
    assert classes[3] == (pkts, nbytes + ETH_HLEN * pkts)
    assert nbytes <= MAX_ACK_IP6_BYTES * pkts, "and only pure ACKs did"
    assert classes[0][1] >= 256 * 1024  # the read payload: unthrottled
    assert _only(classes, 0, 3) == {}


def test_read_mode_an_ipv6_members_payload_goes_to_the_class(netns_pair6):
    pair = netns_pair6
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP6: 5}, mode="read")
        classes, members = _measured(pair, d, (MEMBER_IP6, 3260, 2 * MB, 4 * MB))
    pkts, nbytes = members[MEMBER_IP6]
    assert classes[5] == (pkts, nbytes + ETH_HLEN * pkts)
    assert nbytes >= 4 * MB and nbytes / pkts > 1000
    assert _only(classes, 0, 5) == {}


@pytest.mark.parametrize("bulk_threshold", [16, 0], ids=["netlink", "restore"])
def test_ipv4_and_ipv6_members_move_between_classes_in_one_batch(netns_pair6, bulk_threshold):
    pair = netns_pair6
    with _dp(pair) as d:
        d.sets.bulk_threshold = bulk_threshold  # 0: every batch as one ipset restore
        d.apply()
        assert d.set_classes({MEMBER_IP: 3, MEMBER_IP6: 5}, ordered=False) == 2
        assert _gate(pair) == {"santhrottle-all", "santhrottle-all6"}
        # one batch swaps them: each lands in the other's class
        assert d.set_classes({MEMBER_IP: 5, MEMBER_IP6: 3}, ordered=False) == 2
        got = {ip: (m.mode, m.klass) for ip, m in d.current().items()}
        assert got == {MEMBER_IP: ("all", 5), MEMBER_IP6: ("all", 3)}
        c4, m4 = _measured(pair, d, (MEMBER_IP, 3260, MB, MB))
        before = _counters(d)
        pair.transfer(MEMBER_IP6, 3260, up=MB, down=MB)
        c6, m6 = _delta(_counters(d), before)
        # IPv4's packets went through class 5 only, IPv6's through class 3 only
        assert c4[5] == (m4[MEMBER_IP][0], m4[MEMBER_IP][1] + ETH_HLEN * m4[MEMBER_IP][0])
        assert c4[3] == (0, 0) and m4[MEMBER_IP][1] >= MB
        assert c6[3] == (m6[MEMBER_IP6][0], m6[MEMBER_IP6][1] + ETH_HLEN * m6[MEMBER_IP6][0])
        assert c6[5] == (0, 0) and m6[MEMBER_IP6][1] >= MB
        # and out together: the gate and both families' jumps go with the last member
        d.set_classes({MEMBER_IP: 0, MEMBER_IP6: 0}, ordered=False)
        assert d.current() == {} and _gate(pair) == set()
        assert _jumps6(pair) == []


def test_replace_members_splits_a_mode_by_family(netns_pair6):
    pair = netns_pair6
    with _dp(pair) as d:
        d.apply()
        d.replace_members("read", {MEMBER_IP: 4, "fd00:5374:0:0::2": 6})
        got = {ip: (m.mode, m.klass) for ip, m in d.current().items()}
        assert got == {MEMBER_IP: ("read", 4), MEMBER_IP6: ("read", 6)}
        assert _gate(pair) == {"santhrottle-read", "santhrottle-read6"}
        d.replace_members("read", {MEMBER_IP6: 6})
        assert set(d.current()) == {MEMBER_IP6} and _gate(pair) == {"santhrottle-read6"}


def test_cleanup_removes_the_ipv6_rules_and_sets(netns_pair6):
    pair = netns_pair6
    before = pair.snapshot()
    with _dp(pair) as d:
        d.apply()
        d.set_classes({MEMBER_IP6: 2, MEMBER_IP: 2})
        assert "-N SANTHROTTLE" in pair.tsh("ip6tables", "-t", "mangle", "-S")
        d.cleanup()
    assert pair.snapshot() == before


def test_without_ip6tables_ipv4_runs_and_an_ipv6_member_is_one_clear_error(netns_pair6):
    pair = netns_pair6
    spec = _dp(pair).spec
    tools = Tools(ip6tables="/nonexistent/ip6tables", ip6tables_restore="/nonexistent/r")
    with dp.Datapath(spec, netns=pair.target, tools=tools) as d:
        d.apply()
        assert d.mangle.v6_problem and "ip6tables cannot list its mangle table" in (
            d.mangle.v6_problem
        )
        with pytest.raises(dp.DatapathError, match=r"IPv6 initiator fd00:5374::2: ip6tables"):
            d.set_classes({MEMBER_IP: 2, MEMBER_IP6: 2})
        assert d.current() == {}, "nothing of the batch went in"
        d.set_classes({MEMBER_IP: 2})
        assert set(d.current()) == {MEMBER_IP}
        d.cleanup()
    assert "SANTHROTTLE" not in pair.tsh("iptables", "-t", "mangle", "-S")


def test_pin_show_and_unpin_an_ipv6_initiator_from_the_cli(netns_pair6):
    pair = netns_pair6
    with _dp(pair) as d:
        d.apply()

    def cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "santhrottle.appliance.cli", *argv, "--netns", pair.target],
            capture_output=True,
            text=True,
            check=False,
        )

    p = cli("pin", "FD00:5374::2", "--delay", "5ms", "--mode", "read")
    assert p.returncode == 0, p.stderr
    assert f"pinned {MEMBER_IP6}: read" in p.stdout
    assert _jumps6(pair) == [rules.jump_rule(TARGET_DEV)]
    p = cli("pin", "fd00:5374::zz", "--delay", "5ms")
    assert p.returncode == 2 and "is not an IPv4 or IPv6 address" in p.stderr
    assert "Traceback" not in p.stderr
    p = cli("datapath", "show")
    assert p.returncode == 0, p.stderr
    assert "ip6tables: chain SANTHROTTLE (5 rules), POSTROUTING -o st-tgt" in p.stdout
    assert "santhrottle-read6 1" in p.stdout
    row = next(ln for ln in p.stdout.splitlines() if MEMBER_IP6 in ln)
    assert row.split()[:3] == [MEMBER_IP6, "read", "10"]
    doc = json.loads(cli("datapath", "show", "--json").stdout)["data"]
    assert [m["ip"] for m in doc["members"]] == [MEMBER_IP6]
    assert doc["chain6"]["jumps"] and doc["chain6"]["exists"]
    p = cli("unpin", MEMBER_IP6)
    assert p.returncode == 0 and f"unpinned {MEMBER_IP6}" in p.stdout, p.stderr
    assert _jumps6(pair) == []
    assert cli("cleanup").returncode == 0
