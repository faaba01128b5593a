"""One check of initiator addresses for every entry (appliance/addresses.py; issue 46 item 1).

A pin of 0.0.0.0 (or ::) once stopped the data path for everyone: the socket, the
CLI, the state file and the configuration accepted it, the kernel's hash:ip set
refused it, and the actuator retried the whole batch every tick.  Every entry
refuses such an address now with one line; the data path refuses what reaches it
anyway member by member (tests/unit/test_actuator_isolation.py)."""

from __future__ import annotations

import json
import logging

import pytest

from santhrottle.appliance.addresses import (
    AddressError,
    RefusedAddress,
    initiator_address,
    initiator_network,
)
from santhrottle.appliance.cli.main import main as cli_main
from santhrottle.appliance.config import ConfigError, parse_config
from santhrottle.appliance.daemon.control.requests import RequestError, check
from santhrottle.appliance.daemon.core.state import StateError, StateStore, decode

from .test_daemon import CONF, CommandError, handle, make, run_for

NOT_INITIATORS = [
    ("0.0.0.0", "is unspecified"),
    ("::", "is unspecified"),
    ("::ffff:0.0.0.0", "is unspecified"),
    ("0.1.2.3", "is unspecified"),
    ("127.0.0.1", "is a loopback address"),
    ("::1", "is a loopback address"),
    ("224.0.0.1", "is a multicast address"),
    ("ff02::1", "is a multicast address"),
    ("255.255.255.255", "is a broadcast address"),
    ("240.0.0.1", "is reserved"),
    ("169.254.1.1", "is link-local"),
    ("fe80::1", "is link-local"),
    ("fe80::1%eth1", "is link-local"),
]


@pytest.mark.parametrize("addr, why", NOT_INITIATORS)
def test_the_check_refuses_what_no_initiator_has_with_one_line(addr, why):
    with pytest.raises(RefusedAddress) as e:
        initiator_address(addr)
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "addr, canonical",
    [
        ("10.0.0.3", "10.0.0.3"),
        ("FD00:0::2", "fd00::2"),
        ("::ffff:10.0.0.3", "10.0.0.3"),
        ("2001:db8::7", "2001:db8::7"),
        ("100.64.0.1", "100.64.0.1"),  # shared address space: a carrier's initiators
        ("fd00::2%eth1", "fd00::2"),  # a zone is dropped
    ],
)
def test_the_check_gives_the_data_paths_form(addr, canonical):
    assert initiator_address(addr) == canonical


@pytest.mark.parametrize("bad", ["bogus", "", 5, None, "10.0.0.1/32", "x" * 10_000, "1\n2"])
def test_what_is_no_address_is_one_short_line(bad):
    with pytest.raises(AddressError) as e:
        initiator_address(bad)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 200 and "is not an IPv4 or IPv6 address" in msg


def test_networks_are_refused_only_when_they_hold_no_initiator():
    assert initiator_network("10.0.1.0/24") == "10.0.1.0/24"
    assert initiator_network("0.0.0.0/0") == "0.0.0.0/0"  # every initiator
    for net in ("224.0.0.0/8", "127.0.0.0/8", "fe80::/64", "0.0.0.0/32"):
        with pytest.raises(RefusedAddress, match="holds only"):
            initiator_network(net)


# ------------------------------------------------------------ every entry
@pytest.mark.parametrize("addr, why", NOT_INITIATORS[:11])
def test_the_control_socket_refuses_the_pin(addr, why):
    with pytest.raises(RequestError, match=f"^pin: initiator: .*{why}"):
        check("pin", {"initiator": addr, "class": 5, "mode": "all"})
    d, _vt, _s, _act = make()
    with pytest.raises(CommandError, match=why):
        handle(d, "pin", {"initiator": addr, "class": 5, "mode": "all"})
    assert d.runtime.pins == {}


@pytest.mark.parametrize(
    "addr, why", [("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.1", "multicast")]
)
def test_the_cli_refuses_the_pin_before_any_socket(addr, why, tmp_path, capsys):
    sock = str(tmp_path / "none.sock")
    with pytest.raises(SystemExit) as e:  # argparse's own one-line error
        cli_main(["pin", addr, "--delay", "5ms", "--socket", sock])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert why in err[-1] and "Traceback" not in "".join(err)


def test_a_state_file_pin_no_initiator_has_is_dropped_and_the_others_kept(tmp_path, caplog):
    doc = {
        "version": 1,
        "pins": {
            "0.0.0.0": [5, "all"],
            "::": [5, "all"],
            "10.0.0.3": [7, "all"],
            "fd00::3": [8, "read"],
        },
    }
    with caplog.at_level(logging.WARNING):
        saved = decode(json.dumps(doc), 88)
    assert saved.pins == {"10.0.0.3": (7, "all"), "fd00::3": (8, "read")}
    assert "0.0.0.0" in caplog.text and "dropped" in caplog.text
    # and through the daemon's start: the kernel never sees it
    (tmp_path / "state.json").write_text(json.dumps(doc))
    d, vt, _s, act = make(store=StateStore(tmp_path))
    d.restore(vt.now)
    run_for(d, vt, 1.0)
    assert set(act.kernel) >= {"10.0.0.3", "fd00::3"} and "0.0.0.0" not in act.kernel


def test_a_state_file_pin_that_is_no_address_still_sets_the_file_aside():
    with pytest.raises(StateError, match="'bogus' is not an IPv4 or IPv6 address"):
        decode(json.dumps({"version": 1, "pins": {"bogus": [5, "all"]}}), 88)


@pytest.mark.parametrize(
    "table, why",
    [
        ('[groups.db]\nmembers = ["0.0.0.0"]\n', "groups.db.members: '0.0.0.0' is unspecified"),
        ('[groups.db]\nmembers = ["224.0.0.0/8"]\n', "holds only multicast addresses"),
        ('[groups.db]\nmembers = ["fe80::1"]\n', "is link-local"),
        ('[hosts.db1]\naddresses = ["0.0.0.0", "10.0.0.5"]\n', "'0.0.0.0' is unspecified"),
        ('[hosts.db1]\naddresses = ["::1"]\n', "is a loopback address"),
        ('[static_map]\n"255.255.255.255" = ["vg0"]\n', "is a broadcast address"),
        ('[static_map]\n"127.0.0.0/8" = ["vg0"]\n', "holds only loopback addresses"),
    ],
)
def test_the_configuration_refuses_them_naming_the_key(table, why):
    with pytest.raises(ConfigError) as e:
        parse_config(CONF + table, "t.toml")
    assert why in str(e.value) and "\n" not in str(e.value)
