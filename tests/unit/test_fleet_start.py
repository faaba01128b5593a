"""[fleet] to an agent (fleet/start.py): the optional etcd client, the TLS and password files.

The client's absence is made for real in a child Python whose import system
refuses etcd3gw and requests (as on a host where neither is installed): the
daemon's every other module imports, a daemon without [fleet] ticks, reports
and exports metrics, and a [fleet] configuration gets one line naming the
missing client.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.fleet.start import FleetSetupError, agent_for, problems

pytestmark = pytest.mark.unit
ROOT = Path(__file__).parents[2]
FLEET = '[datapath]\ndevices = ["eth1"]\n[resources.vg0]\nthreshold = "10ms"\n[fleet]\n'


def conf(extra: str, endpoint: str = "https://10.77.0.1:2379") -> str:
    return FLEET + f'endpoints = ["{endpoint}"]\narray = "arr"\nappliance = "gw-a"\n' + extra


def test_an_agent_with_tls_a_user_and_follower_only(tmp_path):
    for name in ("ca.pem", "gw-a.pem", "gw-a-key.pem"):
        (tmp_path / name).write_text("PEM\n")
    pw = tmp_path / "gw-a.password"
    pw.write_text("s3cret\nignored\n")
    pw.chmod(0o600)
    (tmp_path / "gw-a-key.pem").chmod(0o600)
    cfg = parse_config(conf(
        f'ca = "{tmp_path}/ca.pem"\ncert = "{tmp_path}/gw-a.pem"\nkey = "{tmp_path}/gw-a-key.pem"\n'
        f'user = "gw-a"\npassword_file = "{pw}"\nlead = false\n'
    ), "t.toml")  # fmt: skip
    a = agent_for(cfg)
    sec = a.coord.gateway.security
    assert (sec.ca, sec.cert, sec.user, sec.password) == (
        f"{tmp_path}/ca.pem", f"{tmp_path}/gw-a.pem", "gw-a", "s3cret",
    )  # fmt: skip
    assert not a.lead and a.name == "gw-a"
    assert problems(cfg) == []
    session = a.coord.gateway.clients[0].session
    assert session.verify == f"{tmp_path}/ca.pem"
    assert session.cert == (f"{tmp_path}/gw-a.pem", f"{tmp_path}/gw-a-key.pem")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "fleet.password_file: {pw}: No such file or directory"),
        ("empty", "fleet.password_file: {pw}: the first line is empty"),
        ("binary", "fleet.password_file: not UTF-8 text"),
    ],
)
def test_a_password_file_that_does_not_serve_is_one_line(tmp_path, setup, message):
    pw = tmp_path / "pw"
    if setup == "empty":
        pw.write_text("\nsecond\n")
    elif setup == "binary":
        pw.write_bytes(b"\xff\xfe\n")
    cfg = parse_config(conf(f'user = "gw-a"\npassword_file = "{pw}"\n'), "t.toml")
    with pytest.raises(FleetSetupError) as e:
        agent_for(cfg)
    assert str(e.value).startswith(message.format(pw=pw)) and "\n" not in str(e.value)


def test_secrets_others_may_read_are_problems_for_check(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    pw.chmod(0o644)
    cfg = parse_config(conf(f'user = "gw-a"\npassword_file = "{pw}"\n'), "t.toml")
    assert problems(cfg) == [f"fleet.password_file: {pw}: mode 0644, readable by others: chmod 600"]
    agent_for(cfg)  # it starts, and says so in the log


@pytest.mark.parametrize(
    ("extra", "endpoint", "message"),
    [
        ('ca = "/x/ca.pem"\n', "10.77.0.1:2379", "fleet.endpoints: must be https://host:port"),
        ('cert = "/x/c.pem"\n', "https://e:2379", "fleet.key: is required with fleet.cert"),
        ('password_file = "/x/p"\n', "e:2379", "fleet.user: is required with fleet.password_file"),
        ('user = "a b"\npassword_file = "/x/p"\n', "e:2379", "fleet.user: 'a b' is not an etcd"),
        ("lead = 1\n", "e:2379", "fleet.lead: 1 must be true or false"),
    ],
)
def test_bad_tls_and_user_keys_are_config_errors(extra, endpoint, message):
    from santhrottle.appliance.config import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_config(conf(extra, endpoint), "t.toml")
    assert message in str(e.value)


BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class NoClient(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("etcd3gw", "requests"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoClient())
    for m in [m for m in sys.modules if m.split(".")[0] in ("etcd3gw", "requests")]:
        del sys.modules[m]
""")

WITHOUT_CLIENT = BLOCKED + textwrap.dedent("""
    import pkgutil, importlib
    import santhrottle.appliance as appliance
    skipped = {"santhrottle.appliance.fleet.etcd", "santhrottle.appliance.fleet.gateway"}
    for m in pkgutil.walk_packages(appliance.__path__, "santhrottle.appliance."):
        if m.name not in skipped and not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    from prometheus_client import generate_latest
    from santhrottle.appliance.daemon.status.build import StatusCache
    from santhrottle.appliance.daemon.status.metrics import registry_for
    from santhrottle.appliance.daemon.main import build_fleet
    from santhrottle.appliance.config import parse_config
    from tests.unit.test_daemon import make, run_for, status_of
    d, vt, _s, act = make()
    run_for(d, vt, 5.0)
    assert act.kernel, "the writer is delayed"
    assert status_of(d)["fleet"] is None
    assert b"santhrottle_ticks_total" in generate_latest(registry_for(StatusCache(d)))
    try:
        build_fleet(parse_config(sys.argv[1], "t.toml"))
    except ValueError as e:
        print(f"santhrottled: {e}")
    assert "etcd3gw" not in sys.modules and "requests" not in sys.modules
""")


def test_without_the_etcd_client_the_daemon_runs_and_a_fleet_config_says_why():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run(
        [sys.executable, "-c", WITHOUT_CLIENT, conf("")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == [
        "santhrottled: [fleet] needs the etcd client etcd3gw, which is not installed "
        "(No module named 'etcd3gw'): apt install python3-etcd3gw, or pip install "
        "'santhrottle[fleet]'"
    ]
