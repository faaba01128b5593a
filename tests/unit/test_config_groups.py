"""[groups.NAME] in the configuration (appliance/config) and who is in which group
(appliance/daemon/core/groupmap.py)."""

from dataclasses import replace

import pytest

from santhrottle.appliance.config.initiators import member_kind
from santhrottle.appliance.config.parse import ConfigError, parse_config
from santhrottle.appliance.daemon.core.groupmap import GroupMap, GroupMapError

BRIDGE = """
[daemon]
mode = "bridge"
[bridge]
initiator_port = "eth1"
array_port = "eth2"
"""
GOOD = (
    BRIDGE
    + """
[groups.db]
members = ["10.0.1.0/24", "fd00::/64"]
latency_target = "5ms"
priority = 2

[groups.backup]
members = ["10.0.1.7", "backup1.example.com"]
throughput_target = "5000iops"
resources = ["vg0"]

[groups.tenant]
members = ["10.0.2.0/23"]
throughput_target = "200MB/s"
"""
)


def test_groups_parse_with_their_targets():
    c = parse_config(GOOD)
    db, backup, tenant = c.groups["db"], c.groups["backup"], c.groups["tenant"]
    assert db.priority == 2.0 and db.latency_target_s == 0.005
    assert db.throughput_target_bps is None and db.throughput_target_iops is None
    assert backup.priority == 1.0 and backup.throughput_target_iops == 5000.0
    assert backup.resources == ("vg0",)
    assert tenant.throughput_target_bps == 200e6 and tenant.resources == ()
    assert parse_config("").groups == {}


@pytest.mark.parametrize("mode", [BRIDGE, ""], ids=["bridge", "target"])
def test_initiator_names_are_members_in_both_modes(mode):
    text = mode + (
        '[groups.a]\nmembers = ["iqn.2024-01.com.example:db1", "10.0.0.9"]\n'
        '[groups.b]\nmembers = ["nqn.2014-08.org.nvmexpress:uuid:42", "eui.0123456789abcdef"]'
    )
    c = parse_config(text)
    assert c.groups["a"].members == ("iqn.2024-01.com.example:db1", "10.0.0.9")
    assert c.groups["b"].members[0] == "nqn.2014-08.org.nvmexpress:uuid:42"


def test_a_name_in_two_groups_is_an_error_whatever_its_case():
    text = '[groups.a]\nmembers = ["iqn.2024-01.com.example:db1"]\n'
    text += '[groups.b]\nmembers = ["iqn.2024-01.com.Example:DB1"]'
    with pytest.raises(ConfigError, match=r"already a member of groups\.a"):
        parse_config(text)


def test_target_mode_takes_groups():
    c = parse_config(GOOD.replace(BRIDGE, ""))
    assert c.mode == "target" and set(c.groups) == {"db", "backup", "tenant"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[groups.default]\nmembers = ["10.0.0.1"]', 'groups.default: "default" names'),
        ("[groups.a]\npriority = 2", "groups.a.members: is required"),
        ('[groups.a]\nmembers = ["x y"]', "'x y' is not a member"),
        ("[groups.a]\nmembers = []", "must be a non-empty list"),
        ('[groups.a]\nmembers = ["10.0.0.999"]', "'10.0.0.999' is not a member"),
        (
            '[groups.a]\nmembers = ["10.0.0.1"]\n[groups.b]\nmembers = ["10.0.0.1"]',
            "groups.b.members: 10.0.0.1 is already a member of groups.a",
        ),
        ('[groups.a]\nmembers = ["10.0.0.1"]\nthroughput_target = "fast"', "not a throughput"),
        ('[groups.a]\nmembers = ["10.0.0.1"]\nthroughput_target = "0iops"', "more than 0 iops"),
        ('[groups.a]\nmembers = ["10.0.0.1"]\npriority = 0', "groups.a.priority"),
        ('[groups.a]\nmembers = ["10.0.0.1"]\nlatency_target = "0ms"', "groups.a.latency_target"),
        ('[groups.a]\nmembers = ["10.0.0.1"]\nweight = 1', "groups.a.weight: unknown key"),
        ("groups = 3", "groups: must be a table"),
        ("[groups]\na = 3", "groups.a: must be a table"),
    ],
)
def test_bad_groups_one_line_each(text, message):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("member", "kind"),
    [
        ("10.0.0.1", "address"),
        ("fd00::1", "address"),
        ("10.0.1.0/24", "network"),
        ("iqn.2024-01.com.example:db1", "iscsi"),
        ("eui.0123456789abcdef", "iscsi"),
        ("nqn.2014-08.org.nvmexpress:uuid:42", "nvme"),
        ("db-1.example.com", "host"),
        ("1.2.3", None),
        ("10.0.0.0/33", None),
        ("-bad.example", None),
    ],
)
def test_member_kinds(member, kind):
    assert member_kind(member) == kind


def _map(text=GOOD, hosts=None):
    hosts = {"backup1.example.com": ["10.0.3.9", "fd00::9"]} if hosts is None else hosts

    def resolve(name):
        if name not in hosts:
            raise GroupMapError(f"host {name!r} does not resolve")
        return hosts[name]

    return GroupMap(parse_config(text).groups, resolve)


def test_the_most_specific_member_wins():
    groups = dict(parse_config(GOOD).groups)
    db = groups["db"]
    groups["db"] = replace(db, members=(*db.members, "iqn.2024-01.com.example:db1"))
    bk = groups["backup"]
    groups["backup"] = replace(bk, members=(*bk.members, "nqn.2014-08.org.nvmexpress:uuid:42"))
    m = GroupMap(groups, lambda name: {"backup1.example.com": ["10.0.3.9", "fd00::9"]}[name])
    assert m.group_of("10.0.1.8") == "db"  # the network
    assert m.group_of("10.0.1.7") == "backup"  # an address beats a network
    assert m.group_of("10.0.1.7", ["IQN.2024-01.com.example:DB1"]) == "db"  # a name beats both
    assert m.group_of("10.0.3.9") == "backup" and m.group_of("fd00::9") == "backup"  # resolved
    assert m.group_of("fd00::5") == "db"
    assert m.group_of("10.0.3.1") == "tenant"  # 10.0.2.0/23
    assert m.group_of("10.0.9.9") is None
    assert m.group_of("10.9.9.9", ["nqn.2014-08.org.nvmexpress:uuid:42"]) == "backup"
    assert m.group_of("not an address") is None
    assert m.group_of_all(["10.0.1.8", "10.0.9.9"]) == {"10.0.1.8": "db"}


def test_a_longer_network_beats_a_shorter_one_whatever_the_order():
    text = (
        BRIDGE
        + '[groups.wide]\nmembers = ["10.0.0.0/8"]\n[groups.narrow]\nmembers = ["10.1.0.0/16"]'
    )
    m = _map(text, {})
    assert m.group_of("10.1.2.3") == "narrow" and m.group_of("10.2.0.1") == "wide"


def test_a_host_that_does_not_resolve_is_one_error():
    with pytest.raises(GroupMapError, match=r"backup1\.example\.com"):
        _map(hosts={})


def test_resolve_host_reads_the_system_resolver():
    """localhost comes from /etc/hosts: no query leaves the machine."""
    from santhrottle.appliance.daemon.core.groupmap import resolve_host

    assert {"127.0.0.1", "::1"} & set(resolve_host("localhost"))
