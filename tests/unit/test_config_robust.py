"""The configuration loader refuses every bad file with one ConfigError line (issue: trust).

Regression tests for what once escaped or was accepted, then a fuzz over
the parser: random TOML documents built from the schema's own keys with
wrong values, and random text, never raise anything but ConfigError.
"""

from __future__ import annotations

import os
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from santhrottle.appliance.config import ConfigError, load_config, parse_config
from santhrottle.appliance.config.schema import KEYS

DEV = '[datapath]\ndevices = ["eth0"]\n'


def _refused(text: str) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "x.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("x.toml")
    return msg


@pytest.mark.parametrize(
    "text, words",
    [
        (DEV + "ports = [3260, 3260]\n", "given twice"),
        (DEV + f"ports = [{', '.join(str(1000 + i) for i in range(16))}]\n", "at most 15"),
        (DEV + 'step = "10.5us"\n', "finer than 1us"),
        (DEV + "[metrics]\naddress = 5\n", "not an IP address"),
        (f'[daemon]\ncontrol_socket = "/run/{"x" * 120}/s.sock"\n' + DEV, "longer than 107"),
        (DEV + f'link_speed = "{"9" * 30}tbit"\n', "above 10tbit"),
        ('[daemon]\nsocket_mode = "0777"\n' + DEV, "socket_mode"),
        ('[daemon]\nsocket_mode = "0660"\n' + DEV, "needs daemon.socket_group"),
        ('[daemon]\nsocket_group = "disk"\n' + DEV, 'needs socket_mode = "0660"'),
        ("a = " + "[" * 600 + "]" * 600 + "\n", "nested too deep"),
        ("x = {" * 400 + "}" * 400, "not valid TOML"),
    ],
)
def test_a_bad_config_is_one_line_naming_it(text, words):
    assert words in _refused(text)


BRIDGE = '[daemon]\nmode = "bridge"\n[bridge]\ninitiator_port = "eth1"\narray_port = "eth2"\n'
VOL = "iscsi://10.0.0.5/iqn.2026-11.lab:a/0"


@pytest.mark.parametrize(
    "text, words",
    [
        ('[daemon]\nmode = "bridge"\n', "bridge.initiator_port: is required"),
        (BRIDGE.replace('"eth2"', '"eth1"'), "must differ from bridge.initiator_port"),
        (BRIDGE + 'name = "eth1"\n', "bridge.name: must differ from both ports"),
        (BRIDGE + DEV, "datapath.devices: bridge mode delays on bridge.initiator_port"),
        (BRIDGE + '[static_map]\n"10.0.0.0/24" = ["a"]\n', "static_map: in bridge mode"),
        (BRIDGE + '[resources.a]\nthreshold = "auto"\n', '"auto" needs the devices'),
        (BRIDGE + '[controller]\ndefault_threshold = "auto"\n', "target mode only"),
        (BRIDGE + '[resources.a]\ndevices = ["sdb"]\n', "in bridge mode a resource is volumes"),
        (BRIDGE + '[resources.a]\nvolumes = ["iscsi://x/y/0"]\n', "portal 'x' is not an IP"),
        (BRIDGE + '[resources.a]\nvolumes = ["nvme://10.0.0.5/n/x"]\n', "NSID must be a number"),
        (BRIDGE + "[resources.a]\nvolumes = [5]\n", "must be a list of volume names"),
        (DEV + f'[resources.a]\nvolumes = ["{VOL}"]\n', 'needs daemon.mode = "bridge"'),
        ('[daemon]\nmode = "router"\n' + DEV, "must be one of target, bridge"),
    ],
)
def test_a_bad_bridge_config_is_one_line_naming_it(text, words):
    assert words in _refused(text)


def test_bridge_mode_delays_on_the_initiator_port_and_groups_volumes():
    cfg = parse_config(BRIDGE + f'[resources.a]\nthreshold = "10ms"\nvolumes = ["{VOL}"]\n')
    assert cfg.bridge_mode and cfg.devices == ("eth1",) and cfg.array_port == "eth2"
    assert cfg.volumes() == {"a": (VOL,)} and cfg.bridge_name == "br-santhrottle"
    from santhrottle.appliance.datapath import DatapathSpec

    assert DatapathSpec.from_config(cfg).bridged
    assert not DatapathSpec.from_config(parse_config(DEV)).bridged


def test_socket_group_with_0660_is_accepted():
    cfg = parse_config('[daemon]\nsocket_mode = "0660"\nsocket_group = "disk"\n' + DEV)
    assert (cfg.socket_mode, cfg.socket_group) == (0o660, "disk")


@pytest.mark.parametrize("path", ["/dev/zero", "/tmp", "/nonexistent/santhrottle.toml"])
def test_only_a_regular_file_is_read(path):
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert path in str(e.value) and "\n" not in str(e.value)


def test_a_fifo_never_blocks(tmp_path):
    fifo = tmp_path / "cfg.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)


def test_a_symlink_to_dev_zero_is_refused(tmp_path):
    link = tmp_path / "cfg.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(link)


def test_a_huge_file_is_refused(tmp_path):
    big = tmp_path / "cfg.toml"
    big.write_text("# " + "x" * (2 * 1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config(big)


def test_not_utf8(tmp_path):
    p = tmp_path / "cfg.toml"
    p.write_bytes(b'[daemon]\nnetns = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(p)


# ------------------------------------------------------------------- fuzz
_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["0", "15ms", "1e308s", "nan", "-1ms", "١٢ms", "10.5us", "25gbit", "0600"]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=8)


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(v), repr(v))
    if isinstance(v, str):
        return '"' + v.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml(x) for x in v) + "]"


@settings(derandomize=True, max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), _VALUES), min_size=1, max_size=4))
def test_fuzz_schema_keys_with_random_values(entries):
    tables: dict[str, list[str]] = {}
    for k, v in entries:
        table = "resources.vg0" if k.table == "resources.NAME" else k.table
        tables.setdefault(table, []).append(f"{k.name} = {_toml(v)}")
    text = "".join(
        f"[{t}]\n" + "\n".join(dict.fromkeys(lines)) + "\n" for t, lines in tables.items()
    )
    try:
        parse_config(text, "fuzz.toml")
    except ConfigError as e:
        assert "\n" not in str(e)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "[]{}=\"'#.\u00e9\u0663", max_size=200))
def test_fuzz_random_text(text):
    try:
        parse_config(text, "fuzz.toml")
    except ConfigError as e:
        assert "\n" not in str(e)


# ------------------------------------------------ santhrottled --check and the start
_START_FAILURES = [
    DEV + "ports = [3260, 3260]\n",
    DEV + f"ports = [{', '.join(str(1000 + i) for i in range(16))}]\n",
    DEV + 'step = "10.5us"\n',
    DEV + "[metrics]\naddress = 5\n",
    f'[daemon]\ncontrol_socket = "/run/{"x" * 120}/s.sock"\n' + DEV,
    DEV + f'link_speed = "{"9" * 30}tbit"\n',
    "a = " + "[" * 600 + "]" * 600 + "\n",
]


@pytest.mark.parametrize("text", _START_FAILURES)
def test_check_and_start_refuse_what_the_start_would_refuse(tmp_path, capsys, text):
    """--check loads the file with the start's own code: what the start refuses,
    --check refuses, before anything is touched (exit 2, one line)."""
    from santhrottle.appliance.daemon.main import main

    f = tmp_path / "s.toml"
    f.write_text(text)
    for argv in (["--check", "--config", str(f)], ["--config", str(f)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("santhrottled: "), err
