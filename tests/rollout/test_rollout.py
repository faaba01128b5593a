"""Rollout: the Ansible role, the Vagrantfile and the packaging, without a target.

- The role's templates rendered by ansible-playbook itself (Debian's
  ansible-core and the one ansible-lint brings, whichever are installed) and
  read back with the daemon's own parser (appliance/config.py).
- The unit the role installs is systemd/santhrottled.service with the venv's paths.
- santhrottle-service (the role's non-systemd service manager) against a fake daemon.
- Every public variable is documented in the role's README, every private one
  is prefixed `__santhrottle_`.
- A fleet: the [fleet] table read back with the daemon's parser, the assert that
  refuses endpoints without an array, and the example (ansible/fleet.yml over
  inventory/example) rendered for its appliances and its etcd members
  (role santhrottle_etcd: /etc/default/etcd with the group's initial cluster).
- ansible-lint (production profile), `vagrant validate` (core config, libvirt,
  VirtualBox), `python -m build` (sdist + wheel: modules, entry points, dependency
  floors, and the data files under share/: man pages, completions, example config,
  unit, dashboard), the Debian package names (the role's package task in check mode).
- What the build generates, where it is made: tests/rollout/test_packaging.py.

A missing tool is a skip that names it, never a pass. The role applied for
real (twice, then a threshold change) is tests/lab/test_ansible_lab.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from santhrottle.appliance.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
ROLE = ANSIBLE / "roles" / "santhrottle"
ETCD_ROLE = ANSIBLE / "roles" / "santhrottle_etcd"
EXAMPLE_INVENTORY = ANSIBLE / "inventory" / "example" / "hosts.yml"
VENV_BIN = Path(sys.executable).parent
UNIT = ROOT / "systemd" / "santhrottled.service"
# the python of whichever ansible-playbook runs (implicit localhost uses it too)
CONTROLLER_PY = "{{ ansible_playbook_python }}"
SYS_PY = "ansible_python_interpreter=/usr/bin/python3"

# ansible-playbook binaries: Debian's (the controller and the lab's) and the
# one pip installs with ansible-lint (newer ansible-core).
PLAYBOOKS = {
    "debian-ansible-core": Path("/usr/bin/ansible-playbook"),
    "venv-ansible-core": VENV_BIN / "ansible-playbook",
}
TEMPLATES = [
    "santhrottle.toml",
    "santhrottled.service",
    "santhrottled-dropin.conf",
    "santhrottle-service.sh",
    "modules-load.conf",
]

# A bcrypt hash (of "secret", cost 10), as htpasswd -nBC 10 writes them.
BCRYPT = "$2y$10$U2cJG/fMk9z9mTNYy2rE8eBz6Fqj3o7b0yY1mV1Gk0sT7n3yY8z3W"
# Scenario name -> variables (over the role's defaults).
FLEET = {
    "santhrottle_enabled": True,
    "santhrottle_datapath_devices": ["bond0", "eth1"],
    "santhrottle_resources": {
        "vg_aic": {"threshold": "15ms"},
        "vg_backup": {},
        "vg.odd+name": {"threshold": "2.5ms"},
        "array1": {"threshold": "20ms", "devices": ["sdb", "sdc"]},
        "nothing": None,
    },
    "santhrottle_default_threshold": "30ms",
    "santhrottle_static_map": {"10.1.0.0/24": ["vg_aic"], "10.2.0.7": ["array1", "vg_aic"]},
    "santhrottle_controller": {"tick": "50ms", "class_hysteresis": 2, "setpoint_fraction": 0.8},
    "santhrottle_netns": "tgt",
    "santhrottle_datapath_ports": [3260],
    "santhrottle_write_mode": "ack",
    "santhrottle_step": "250us",
    "santhrottle_max_delay": "20ms",
    "santhrottle_link_speed": "10gbit",
    "santhrottle_glide_leaves": 3,
    "santhrottle_keep_static_state": True,
    "santhrottle_metrics_port": 0,
}
BRIDGE = {
    "santhrottle_enabled": True,
    "santhrottle_mode": "control",
    "santhrottle_daemon_mode": "bridge",
    "santhrottle_bridge_initiator_port": "eth1",
    "santhrottle_bridge_array_port": "eth2",
    "santhrottle_resources": {
        "array1": {"threshold": "10ms", "volumes": ["iscsi://10.0.0.5/iqn.x:a/*"]},
    },
}
SCENARIOS = {
    "defaults": {},
    "control": {**FLEET, "santhrottle_mode": "control"},
    "observe": {**FLEET, "santhrottle_mode": "observe"},
    "bridge": BRIDGE,
    "fleet": {
        **BRIDGE,
        "santhrottle_fleet_endpoints": ["10.77.0.1:2379", "10.77.0.2", "http://[fd00:77::3]:2379"],
        "santhrottle_fleet_array": "array1",
        "santhrottle_fleet_appliance": "gw-a",
    },
    "fleet_tls": {
        **BRIDGE,
        "santhrottle_fleet_endpoints": ["https://10.77.0.1:2379", "https://10.77.0.2:2379"],
        "santhrottle_fleet_array": "array1",
        "santhrottle_fleet_appliance": "gw-b",
        "santhrottle_fleet_lead": False,
        "santhrottle_fleet_ca_src": "/ctl/pki/ca.pem",
        "santhrottle_fleet_cert_src": "/ctl/pki/gw-b.pem",
        "santhrottle_fleet_key_src": "/ctl/pki/gw-b-key.pem",
        "santhrottle_fleet_user": "santhrottle-array1-gw-b",
        "santhrottle_fleet_password": "not-rendered",
    },
    "everything": {
        **FLEET,
        "santhrottle_mode": "control",
        "santhrottle_socket_mode": "0660",
        "santhrottle_socket_group": "storage-admins",
        "santhrottle_state_dir": "/srv/st/state",
        "santhrottle_controller": {
            "tick": "50ms",
            "law": "paper",
            "auto_alpha": 0.8,
            "class_decrease_max_per_tick": 2,
        },
        "santhrottle_resources": {
            "vg_aic": {"threshold": "auto", "fallback_threshold": "20ms"},
            "array1": {"threshold": "10ms", "devices": ["sdb"]},
        },
        "santhrottle_groups": {
            "db": {
                "members": ["10.0.1.0/24", "db1"],
                "latency_target": "5ms",
                "priority": 2,
                "resources": ["vg_aic"],
            },
            "backup": {"members": ["10.0.9.7"], "throughput_target": "200MB/s"},
        },
        "santhrottle_hosts": {"db1": {"addresses": ["10.0.1.5", "fd00:1::5"]}},
        "santhrottle_metrics_port": 9753,
        "santhrottle_metrics_address": "10.0.0.1",
        "santhrottle_metrics_initiator_series": 5,
        "santhrottle_metrics_tls_cert_file": "/etc/santhrottle/metrics.pem",
        "santhrottle_metrics_tls_key_file": "/etc/santhrottle/metrics-key.pem",
        "santhrottle_metrics_basic_auth_users": {"prometheus": BCRYPT},
    },
    "deb": {"santhrottle_deb": "/srv/dist-deb/santhrottle_0.1.0_amd64.deb"},
    "deb-paths": {
        "santhrottle_deb": "/srv/dist-deb/santhrottle_0.1.0_amd64.deb",
        "santhrottle_config_path": "/srv/st/etc/st.toml",
        "santhrottle_control_socket": "/run/santhrottle/st.sock",
        "santhrottle_state_dir": "/srv/st/state",
    },
    "paths": {
        "santhrottle_venv": "/srv/st/venv",
        "santhrottle_config_path": "/srv/st/etc/st.toml",
        "santhrottle_control_socket": "/run/st/c.sock",
        "santhrottle_kernel_modules": ["sch_htb", "xt_set"],
    },
}


def _need(path: Path | str | None, what: str) -> str:
    if path is None or not Path(path).exists():
        pytest.skip(f"{what} is not installed ({path or 'not on PATH'})")
    return str(path)


def _run(cmd, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        **kw,
    )


def _ansible_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp / "ansible-remote"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        PATH=f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    return env


def _render_play(name: str, vars_files: list[Path], dest: str) -> dict:
    """A play that renders the role's templates on localhost into dest (a JSON of
    file name -> text), one module run: every template through the template
    lookup (the module's engine, ansible_managed included)."""
    return {
        "name": f"render {name}",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(f) for f in vars_files],
        "tasks": [
            {
                "name": "render",
                "ansible.builtin.copy": {
                    "content": "{{ " + _lookups() + " | to_json }}",
                    "dest": dest,
                    "mode": "0644",
                },
            }
        ],
    }


def _role_vars() -> list[Path]:
    """The role's defaults and vars (Debian's too), as vars_files."""
    return [
        ROLE / "defaults" / "main.yml",
        ROLE / "vars" / "main" / "main.yml",
        ROLE / "vars" / "main" / "schema.yml",
        ROLE / "vars" / "Debian.yml",
    ]


def _playbook(playbook_bin: str, tmp: Path, plays: list[dict], inventory="localhost,", *args):
    pb = tmp / "render.yml"
    pb.write_text(json.dumps(plays))
    return _run(
        [playbook_bin, "-i", inventory, "-e", f"ansible_python_interpreter={CONTROLLER_PY}",
         *args, pb],
        env=_ansible_env(tmp),
        cwd=tmp,
    )  # fmt: skip


def _checked_and_rendered(play: dict, templates: dict[str, list[str]], dest: str, **role_vars):
    """A play (ours, or one of ansible/fleet.yml's) on the controller: its roles for
    real but, run with --tags CHECKS, only their checks (tasks/assert.yml), then
    each role's templates rendered into dest (a JSON of file name -> text; dest
    names {{ inventory_hostname }}) with the role's variables as the role sees
    them: its defaults under the inventory's variables, hostvars without them.
    role_vars: more parameters for every role."""
    roles, play_vars = [], dict(play.get("vars", {}))
    for entry in play["roles"]:
        entry = {"role": entry} if isinstance(entry, str) else dict(entry)
        # the role's parameters as play variables: the post_tasks see them too
        # (ansible-core >= 2.15 keeps them to the role), above the inventory's alike
        play_vars |= entry.pop("vars", {}) | role_vars
        roles.append(entry | {"role": str(ANSIBLE / "roles" / entry["role"])})
    lookups = ", ".join(
        _lookups(ANSIBLE / "roles" / role, names)[1:-1] for role, names in templates.items()
    )
    render = {"content": "{{ {" + lookups + "} | to_json }}", "dest": dest, "mode": "0644"}
    play = {k: v for k, v in play.items() if k not in ("serial", "become", "roles")}
    return play | {
        "connection": "local",
        "gather_facts": False,
        "vars": play_vars,
        "roles": roles,
        "post_tasks": [{"name": "render", "ansible.builtin.copy": render, "tags": ["always"]}],
    }


CHECKS = ("--tags", "santhrottle_assert,santhrottle_etcd_assert")


def _unpack(rendered_json: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    for fname, text in json.loads(rendered_json.read_text()).items():
        (into / fname).write_text(text)
    return into


def _render(playbook_bin: str, tmp: Path, scenarios: dict[str, dict]) -> dict[str, Path]:
    """Render every template for every scenario with one ansible-playbook run,
    each scenario a play over the role's defaults + vars (Debian)."""
    plays = []
    for name, extra in scenarios.items():
        vf = tmp / f"{name}.vars.json"
        vf.write_text(json.dumps(extra))
        dest = str(tmp / f"{name}.rendered.json")
        plays.append(_render_play(name, [*_role_vars(), vf], dest))
    p = _playbook(playbook_bin, tmp, plays)
    assert p.returncode == 0, p.stdout[-4000:]
    return {name: _unpack(tmp / f"{name}.rendered.json", tmp / name) for name in scenarios}


def _lookups(role: Path = ROLE, templates: list[str] = TEMPLATES) -> str:
    """A Jinja dict expression: file name -> the template rendered by lookup."""
    items = ", ".join(
        f"'{t}': lookup('ansible.builtin.template', '{role / 'templates' / t}.j2')"
        for t in templates
    )
    return "{" + items + "}"


@pytest.fixture(scope="module", params=sorted(PLAYBOOKS))
def playbook_bin(request) -> str:
    return _need(PLAYBOOKS[request.param], f"ansible-playbook ({request.param})")


@pytest.fixture(scope="module")
def rendered(playbook_bin, tmp_path_factory):
    return _render(playbook_bin, tmp_path_factory.mktemp("rendered"), SCENARIOS)


# --------------------------------------------------------------- templates
def test_defaults_are_safe(rendered):
    text = (rendered["defaults"] / "santhrottle.toml").read_text()
    cfg = parse_config(text, "defaults.toml")
    assert (cfg.metrics_address, cfg.metrics_port) == ("127.0.0.1", 9753)
    assert cfg.resources == {} and cfg.default_threshold_s is None  # nothing throttled
    assert "santhrottle_mode: observe" in text
    assert cfg.control_socket == "/run/santhrottle/control.sock"
    assert cfg.devices == () and cfg.netns is None
    assert text.startswith("#")  # ansible_managed as a TOML comment


def test_control_renders_every_threshold_and_setting(rendered):
    cfg = parse_config((rendered["control"] / "santhrottle.toml").read_text(), "control.toml")
    assert {n: r.threshold_s for n, r in cfg.resources.items()} == {
        "vg_aic": 0.015,
        "vg_backup": None,
        "vg.odd+name": 0.0025,
        "array1": 0.020,
        "nothing": None,
    }
    assert cfg.resources["array1"].devices == ("sdb", "sdc")
    assert cfg.default_threshold_s == 0.030
    assert cfg.threshold_of("vg_backup") == 0.030  # the default applies to it
    assert cfg.static_map == {"10.1.0.0/24": ("vg_aic",), "10.2.0.7": ("array1", "vg_aic")}
    assert cfg.controller.tick_s == 0.050
    assert cfg.controller.class_hysteresis == 2
    assert cfg.controller.setpoint_fraction == 0.8
    assert cfg.netns == "tgt" and cfg.devices == ("bond0", "eth1") and cfg.ports == (3260,)
    assert (cfg.write_mode, cfg.step_us, cfg.max_delay_us) == ("ack", 250, 20_000)
    assert cfg.link_bits_s == 10**10 and cfg.keep_static_state is True
    assert cfg.glide_leaves == 3
    assert cfg.metrics_port == 0


def test_observe_renders_no_threshold_but_keeps_the_resources(rendered):
    text = (rendered["observe"] / "santhrottle.toml").read_text()
    cfg = parse_config(text, "observe.toml")
    assert set(cfg.resources) == set(FLEET["santhrottle_resources"])
    assert all(r.threshold_s is None for r in cfg.resources.values())
    assert cfg.default_threshold_s is None
    assert cfg.resources["array1"].devices == ("sdb", "sdc")  # still measured
    # the inventory's thresholds stay visible, commented out
    assert '# threshold = "15ms"' in text and '# default_threshold = "30ms"' in text


def test_bridge_mode_renders_the_ports_and_volumes_and_loads_nf_tables(rendered):
    cfg = parse_config((rendered["bridge"] / "santhrottle.toml").read_text(), "bridge.toml")
    assert cfg.bridge_mode and (cfg.initiator_port, cfg.array_port) == ("eth1", "eth2")
    assert cfg.devices == ("eth1",) and cfg.bridge_name == "br-santhrottle"
    assert cfg.volumes() == {"array1": ("iscsi://10.0.0.5/iqn.x:a/*",)}
    assert cfg.threshold_of("array1") == 0.010
    mods = (rendered["bridge"] / "modules-load.conf").read_text().split()
    assert {"bridge", "nf_tables", "sch_netem"} <= set(mods)
    plain = (rendered["defaults"] / "modules-load.conf").read_text().splitlines()
    assert "bridge" not in plain and "nf_tables" not in plain
    assert parse_config((rendered["defaults"] / "santhrottle.toml").read_text()).mode == "target"


def test_fleet_renders_the_fleet_table_only_with_endpoints(rendered):
    text = (rendered["fleet"] / "santhrottle.toml").read_text()
    cfg = parse_config(text, "fleet.toml")
    assert cfg.fleet and cfg.bridge_mode
    assert cfg.fleet_endpoints == ("10.77.0.1:2379", "10.77.0.2", "http://[fd00:77::3]:2379")
    assert (cfg.fleet_array, cfg.fleet_appliance) == ("array1", "gw-a")
    for name in ("defaults", "bridge", "control"):
        text = (rendered[name] / "santhrottle.toml").read_text()
        assert "[fleet]" not in text, name
        assert not parse_config(text, f"{name}.toml").fleet


def test_every_key_family_renders(rendered):
    """The template is the schema's: the daemon's socket and state, the controller's
    keys, auto thresholds, initiator groups and hosts all reach the file."""
    text = (rendered["everything"] / "santhrottle.toml").read_text()
    cfg = parse_config(text, "everything.toml")
    assert (cfg.socket_mode, cfg.socket_group, cfg.state_dir) == (
        0o660, "storage-admins", "/srv/st/state")  # fmt: skip
    assert (cfg.controller.tick_s, cfg.controller.law) == (0.050, "paper")
    assert cfg.controller.auto_alpha == 0.8 and cfg.controller.class_decrease_max_per_tick == 2
    assert cfg.resources["vg_aic"].threshold_s == "auto"
    assert cfg.resources["vg_aic"].fallback_s == 0.020
    assert set(cfg.groups) == {"db", "backup"}
    assert cfg.groups["db"].priority == 2 and cfg.groups["db"].latency_target_s == 0.005
    assert set(cfg.hosts) == {"db1"}
    assert (cfg.metrics_address, cfg.metrics_initiator_series) == ("10.0.0.1", 5)
    assert cfg.metrics_tls_cert_file == "/etc/santhrottle/metrics.pem"
    assert cfg.metrics_basic_auth_users == {"prometheus": BCRYPT}
    defaults = parse_config((rendered["defaults"] / "santhrottle.toml").read_text(), "d.toml")
    assert (defaults.socket_mode, defaults.state_dir) == (0o600, "/var/lib/santhrottle")
    assert defaults.metrics_initiator_series == 100
    assert "[groups" not in (rendered["defaults"] / "santhrottle.toml").read_text()


def test_the_debian_packages_unit_gets_a_drop_in(rendered):
    """With santhrottle_deb the package's unit stays as shipped: the drop-in carries the
    restart digest, and the paths only when they are not the unit's own."""
    plain = (rendered["deb"] / "santhrottled-dropin.conf").read_text()
    assert "digest: " in plain
    assert [line for line in plain.splitlines() if not line.startswith("#")] == []
    moved = (rendered["deb-paths"] / "santhrottled-dropin.conf").read_text()
    settings = [line for line in moved.splitlines() if not line.startswith("#")]
    assert settings[0] == "[Service]"
    assert "ExecStart=" in settings and "ExecReload=" in settings and "ExecStopPost=" in settings
    assert "ExecStart=/usr/bin/santhrottled --config /srv/st/etc/st.toml" in settings
    assert "ExecReload=/usr/bin/santhrottle reload --socket /run/santhrottle/st.sock" in settings
    assert "ReadWritePaths=/srv/st/state" in settings
    # the digest moves with a restart key, not with a reload key
    digest = re.compile(r"digest: (\w+)")
    assert digest.search(plain).group(1) != digest.search(moved).group(1)
    unit = (rendered["everything"] / "santhrottled.service").read_text()
    assert "ReadWritePaths=/srv/st/state" in unit


@pytest.mark.parametrize(
    ("role_vars", "message"),
    [
        ({"santhrottle_mode": "enforce"},
         "value of santhrottle_mode must be one of: observe, control, got: enforce"),
        ({"santhrottle_glide_leaves": "many"},
         "'santhrottle_glide_leaves' is of type"),
        ({"santhrottle_controller": {"tik": "50ms"}},
         "santhrottle_controller.tik. Supported parameters include: auto_alpha,"),
        ({"santhrottle_datapath_devices": "eth0"},
         "santhrottle_datapath_devices: a list (YAML [a, b] or one item per line), not a string"),
        ({"santhrottle_enabled": True, "santhrottle_mode": "control",
          "santhrottle_datapath_devices": ["eth0"]},
         "with santhrottle_mode control, a threshold"),
        ({"santhrottle_deb": "/nonexistent/santhrottle_0_amd64.deb"},
         "is not a file on the controller: build it with `make deb`"),
    ],
)  # fmt: skip
def test_the_role_refuses_bad_variables_before_it_changes_anything(
    playbook_bin, tmp_path, role_vars, message
):
    """The role's argument specification (meta/argument_specs.yml, checked by
    ansible-core before the first task) and its checks (tasks/assert.yml): one
    message naming the variable, and no task after them runs."""
    wheel = tmp_path / "santhrottle-0-py3-none-any.whl"
    wheel.write_bytes(b"")
    play = {"name": "checks", "hosts": "localhost", "roles": ["santhrottle"]}
    play = _checked_and_rendered(play, {"santhrottle": []}, str(tmp_path / "x.json"),
                                 santhrottle_wheel=str(wheel), santhrottle_wheelhouse="",
                                 **role_vars)  # fmt: skip
    p = _playbook(playbook_bin, tmp_path, [play], "localhost,", *CHECKS)
    assert p.returncode != 0, p.stdout[-4000:]
    assert message in " ".join(p.stdout.split()), p.stdout[-4000:]
    assert not (tmp_path / "x.json").exists()


def _etcd_environment(path: Path) -> dict[str, str]:
    """/etc/default/etcd as Debian's unit reads it: KEY="value" lines (values JSON-quoted)."""
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert re.fullmatch(r"ETCD_[A-Z_]+", key), line
            env[key] = json.loads(value)
    return env


def test_fleet_tls_renders_the_files_the_role_installs_and_the_user(rendered):
    text = (rendered["fleet_tls"] / "santhrottle.toml").read_text()
    cfg = parse_config(text, "fleet_tls.toml")
    d = "/etc/santhrottle/etcd"
    assert (cfg.fleet_ca, cfg.fleet_cert, cfg.fleet_key, cfg.fleet_password_file) == (
        f"{d}/ca.pem", f"{d}/client.pem", f"{d}/client-key.pem", f"{d}/password",
    )  # fmt: skip
    assert cfg.fleet_user == "santhrottle-array1-gw-b" and cfg.fleet_lead is False
    assert "not-rendered" not in text  # the password goes to its file, never the config
    plain = parse_config((rendered["fleet"] / "santhrottle.toml").read_text(), "fleet.toml")
    assert plain.fleet_lead and plain.fleet_user is None and plain.fleet_ca is None


def test_the_example_fleet_renders_its_appliances_and_its_etcd_members(playbook_bin, tmp_path):
    """ansible/fleet.yml's two plays over inventory/example (group fleet): each
    bridge's santhrottle.toml names the etcd members' client URLs, the array and
    itself; each member's /etc/default/etcd names the group's initial cluster."""
    import yaml

    etcd_play, fleet_play = yaml.safe_load((ANSIBLE / "fleet.yml").read_text())
    assert (etcd_play["hosts"], fleet_play["hosts"]) == ("etcd", "fleet_appliances")
    wheel = tmp_path / "santhrottle-0-py3-none-any.whl"
    wheel.write_bytes(b"")
    plays = [
        _checked_and_rendered(etcd_play, {"santhrottle_etcd": ["etcd.default"]},
                              str(tmp_path / "etcd-{{ inventory_hostname }}.json")),
        _checked_and_rendered(fleet_play, {"santhrottle": ["santhrottle.toml"]},
                              str(tmp_path / "app-{{ inventory_hostname }}.json"),
                              santhrottle_wheel=str(wheel), santhrottle_wheelhouse=""),
    ]  # fmt: skip
    p = _playbook(playbook_bin, tmp_path, plays, str(EXAMPLE_INVENTORY), *CHECKS)
    assert p.returncode == 0, p.stdout[-4000:]
    members = {"br-a": "10.77.0.1", "br-b": "10.77.0.2", "mgmt-c": "10.77.0.3"}
    cluster = ",".join(f"{n}=http://{a}:2380" for n, a in members.items())
    clients = []
    for name, address in members.items():
        env = _etcd_environment(
            _unpack(tmp_path / f"etcd-{name}.example.net.json", tmp_path / name) / "etcd.default"
        )
        assert env["ETCD_NAME"] == name
        assert env["ETCD_INITIAL_CLUSTER"] == cluster
        assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == f"http://{address}:2380"
        assert (env["ETCD_HEARTBEAT_INTERVAL"], env["ETCD_ELECTION_TIMEOUT"]) == ("50", "500")
        clients.append(env["ETCD_ADVERTISE_CLIENT_URLS"].removeprefix("http://"))
    for name in ("br-a", "br-b"):
        d = _unpack(tmp_path / f"app-{name}.example.net.json", tmp_path / f"app-{name}")
        cfg = parse_config((d / "santhrottle.toml").read_text(), f"{name}.toml")
        assert cfg.fleet_endpoints == tuple(clients)
        assert (cfg.fleet_array, cfg.fleet_appliance) == ("array1", name)
        assert cfg.bridge_mode and (cfg.initiator_port, cfg.array_port) == ("ens1f0", "ens1f1")
        assert cfg.threshold_of("array1") == 0.015


ETCD_INVENTORY = {
    "etcd": {
        "hosts": {
            "e1.example.net": {"santhrottle_etcd_address": "10.77.0.1"},
            "e2.example.net": {"ansible_host": "10.77.0.2"},
            "e3": {"santhrottle_etcd_name": "m3", "santhrottle_etcd_address": "fd00:77::3"},
        },
        "vars": {"santhrottle_etcd_peer_port": 12380, "santhrottle_etcd_client_port": 12379},
    },
    "other": {"hosts": {"o1": {}}},
}
ETCD_PLAY = {"name": "etcd", "hosts": "etcd", "roles": ["santhrottle_etcd"]}


def test_the_etcd_role_renders_the_groups_initial_cluster(playbook_bin, tmp_path):
    """Every member's /etc/default/etcd: its own name and URLs and the same initial
    cluster, each member named and addressed as the inventory says (host variables,
    else the short name and ansible_host); the role's checks pass on each."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps(ETCD_INVENTORY))
    play = _checked_and_rendered(ETCD_PLAY, {"santhrottle_etcd": ["etcd.default"]},
                                 str(tmp_path / "{{ inventory_hostname }}.json"))  # fmt: skip
    p = _playbook(playbook_bin, tmp_path, [play], str(inventory), *CHECKS)
    assert p.returncode == 0, p.stdout[-4000:]
    want = {
        "e1.example.net": ("e1", "http://10.77.0.1:12380", "http://10.77.0.1:12379"),
        "e2.example.net": ("e2", "http://10.77.0.2:12380", "http://10.77.0.2:12379"),
        "e3": ("m3", "http://[fd00:77::3]:12380", "http://[fd00:77::3]:12379"),
    }
    cluster = ",".join(f"{name}={peer}" for name, peer, _ in want.values())
    for host, (name, peer, client) in want.items():
        env = _etcd_environment(
            _unpack(tmp_path / f"{host}.json", tmp_path / host) / "etcd.default"
        )
        assert env == {
            "ETCD_NAME": name,
            "ETCD_DATA_DIR": "/var/lib/etcd/santhrottle",
            "ETCD_LISTEN_PEER_URLS": peer,
            "ETCD_INITIAL_ADVERTISE_PEER_URLS": peer,
            "ETCD_LISTEN_CLIENT_URLS": f"{client},http://127.0.0.1:12379",
            "ETCD_ADVERTISE_CLIENT_URLS": client,
            "ETCD_INITIAL_CLUSTER": cluster,
            "ETCD_INITIAL_CLUSTER_STATE": "new",
            "ETCD_INITIAL_CLUSTER_TOKEN": "santhrottle",
            "ETCD_HEARTBEAT_INTERVAL": "50",
            "ETCD_ELECTION_TIMEOUT": "500",
        }, host


def test_the_vagrant_fleet_labs_etcd_members(playbook_bin, tmp_path):
    """ansible/vagrant/etcd.yml over fleet-hosts.yml, as the Vagrantfile's fleet mode
    runs it on the target and both bridges: one cluster on the management network,
    each member's first start queued rather than waited for."""
    import yaml

    (play,) = yaml.safe_load((ANSIBLE / "vagrant" / "etcd.yml").read_text())
    play = _checked_and_rendered(play, {"santhrottle_etcd": ["etcd.default"]},
                                 str(tmp_path / "{{ inventory_hostname }}.json"))  # fmt: skip
    assert play["vars"]["santhrottle_etcd_wait_for_quorum"] is False
    inventory = str(ANSIBLE / "vagrant" / "fleet-hosts.yml")
    p = _playbook(
        playbook_bin, tmp_path, [play], inventory, *CHECKS, "-e", "lab_mgmt_subnet=10.9.8"
    )
    assert p.returncode == 0, p.stdout[-4000:]
    members = {"target": "10.9.8.10", "bridge1": "10.9.8.11", "bridge2": "10.9.8.12"}
    cluster = ",".join(f"{n}=http://{a}:2380" for n, a in members.items())
    for name, address in members.items():
        env = _etcd_environment(
            _unpack(tmp_path / f"{name}.json", tmp_path / name) / "etcd.default"
        )
        assert (env["ETCD_NAME"], env["ETCD_INITIAL_CLUSTER"]) == (name, cluster)
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{address}:2379"


@pytest.mark.parametrize(
    ("hosts", "role_vars", "message"),
    [
        ("e1.example.net", {"santhrottle_etcd_name": "renamed"},
         "this member is renamed=http://10.77.0.1:12380, the initial cluster e1="),
        ("o1", {}, "o1 is not in the inventory group santhrottle_etcd_group (etcd)"),
        ("e2.example.net", {"santhrottle_etcd_election_timeout": 200},
         "at least 5 times santhrottle_etcd_heartbeat_interval"),
    ],
)  # fmt: skip
def test_the_etcd_role_refuses_what_the_cluster_cannot_agree_on(
    playbook_bin, tmp_path, hosts, role_vars, message
):
    """A member named by a role parameter (which the other members do not see), a
    host outside the group, etcd's own timing rule: each fails the role's checks."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps(ETCD_INVENTORY))
    play = _checked_and_rendered(ETCD_PLAY | {"hosts": hosts}, {"santhrottle_etcd": []},
                                 str(tmp_path / "x.json"), **role_vars)  # fmt: skip
    p = _playbook(playbook_bin, tmp_path, [play], str(inventory), *CHECKS)
    assert p.returncode != 0, p.stdout[-4000:]
    assert message in " ".join(p.stdout.split()), p.stdout[-4000:]


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ({"santhrottle_fleet_endpoints": ["10.77.0.1:2379"]},
         "santhrottle_fleet_endpoints is set, santhrottle_fleet_array is not"),
        ({"santhrottle_fleet_endpoints": "10.77.0.1:2379", "santhrottle_fleet_array": "a1"},
         "santhrottle_fleet_endpoints: a list (YAML [a, b] or one item per line), not a string"),
        ({"santhrottle_fleet_endpoints": ["10.77.0.1:2379"], "santhrottle_fleet_array": "a1"},
         None),
        ({}, None),
    ],
)  # fmt: skip
def test_the_role_refuses_fleet_endpoints_without_an_array(playbook_bin, tmp_path, fleet, message):
    """The role's checks (tasks/assert.yml) on the fleet's variables: one message
    for endpoints without an array, another for endpoints that are not a list."""
    wheel = tmp_path / "santhrottle-0-py3-none-any.whl"
    wheel.write_bytes(b"")
    vf = tmp_path / "vars.json"
    vf.write_text(
        json.dumps({"santhrottle_wheel": str(wheel), "santhrottle_wheelhouse": "", **fleet})
    )
    play = {
        "name": "checks",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(f) for f in [*_role_vars(), vf]],
        "tasks": [{"ansible.builtin.import_tasks": str(ROLE / "tasks" / "assert.yml")}],
    }
    p = _playbook(playbook_bin, tmp_path, [play])
    if message is None:
        assert p.returncode == 0, p.stdout[-4000:]
    else:
        task = (
            "Check that every list is a list"
            if "a list (" in message
            else ("Check that a fleet names its array")
        )
        assert p.returncode != 0 and task in p.stdout, p.stdout
        failed = p.stdout[p.stdout.index(task) :]
        assert message in " ".join(failed.split()), p.stdout[-4000:]


def test_unit_is_the_projects_unit_with_the_venvs_paths(rendered):
    unit = (rendered["defaults"] / "santhrottled.service").read_text()
    body = "\n".join(line for line in unit.splitlines() if not line.startswith("#"))
    want = "\n".join(line for line in UNIT.read_text().splitlines() if not line.startswith("#"))
    # the venv's bin/ where the shipped unit names its commands alone
    assert body.replace("/opt/santhrottle/venv/bin/", "") == want
    moved = (rendered["paths"] / "santhrottled.service").read_text()
    assert "ExecStart=/srv/st/venv/bin/santhrottled --config /srv/st/etc/st.toml" in moved
    assert (
        "ExecStopPost=/srv/st/venv/bin/santhrottle cleanup --delays-only "
        "--config /srv/st/etc/st.toml" in moved
    )


def test_modules_load_lists_the_data_path_modules(rendered):
    mods = [
        line
        for line in (rendered["defaults"] / "modules-load.conf").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert {"sch_netem", "sch_htb", "ip_set", "ip_set_hash_ip", "xt_set", "xt_bpf"} <= set(mods)
    from santhrottle.appliance.datapath.probe import KERNEL_MODULES

    assert set(KERNEL_MODULES) <= set(mods)
    paths = (rendered["paths"] / "modules-load.conf").read_text().split()
    assert paths[-2:] == ["sch_htb", "xt_set"]


def test_service_script_is_valid_sh(rendered):
    for name in rendered:
        p = _run(["sh", "-n", rendered[name] / "santhrottle-service.sh"])
        assert p.returncode == 0, p.stdout


# ------------------------------------------------------ santhrottle-service
FAKE_DAEMON = """#!{python}
# A stand-in for santhrottled: the control socket, SIGHUP counted, SIGTERM exits.
import os, signal, socket, sys, time
sock, log = {sock!r}, {log!r}
time.sleep(0.3)  # a daemon takes a moment to be ready
if os.path.exists(sock):
    os.unlink(sock)
s = socket.socket(socket.AF_UNIX)
s.bind(sock)
s.listen()
def note(what):
    with open(log, "a") as f:
        f.write(what + " " + str(os.getpid()) + chr(10))
signal.signal(signal.SIGHUP, lambda *a: note("hup"))
signal.signal(signal.SIGTERM, lambda *a: (note("term"), os.unlink(sock), sys.exit(0)))
note("start")
while True:
    time.sleep(0.05)
"""
FAKE_CHECK = """#!/bin/sh
# santhrottled --check / santhrottle cleanup stand-ins
if [ "$1" = --check ]; then echo check >>{log}; exit 0; fi
exec {python} {daemon} "$@"
"""
FAKE_CLI = """#!/bin/sh
echo "cli $*" >>{log}
"""


def test_service_script_starts_reloads_restarts_stops(tmp_path):
    binary = next((str(p) for p in PLAYBOOKS.values() if p.exists()), None)
    _need(binary, "ansible-playbook")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    sock, log = tmp_path / "c.sock", tmp_path / "events"
    daemon = tmp_path / "real" / "santhrottled"  # the cmdline the script checks for
    daemon.parent.mkdir()
    daemon.write_text(FAKE_DAEMON.format(python=sys.executable, sock=str(sock), log=str(log)))
    (venv / "bin" / "santhrottled").write_text(
        FAKE_CHECK.format(python=sys.executable, daemon=daemon, log=log)
    )
    (venv / "bin" / "santhrottle").write_text(FAKE_CLI.format(log=log))
    for f in (venv / "bin").iterdir():
        f.chmod(0o755)
    out = _render(
        binary,
        tmp_path,
        {
            "svc": {
                "santhrottle_venv": str(venv),
                "santhrottle_control_socket": str(sock),
                "santhrottle_log_file": str(tmp_path / "log" / "d.log"),
                "__santhrottle_pidfile": str(tmp_path / "run" / "d.pid"),
            }
        },
    )
    script = out["svc"] / "santhrottle-service.sh"
    script.chmod(0o755)

    def svc(action: str) -> subprocess.CompletedProcess:
        return _run([script, action], timeout=60)

    def events() -> list[str]:
        return log.read_text().split("\n") if log.exists() else []

    def pid() -> int:
        return int((tmp_path / "run" / "d.pid").read_text())

    try:
        assert svc("status").returncode == 3
        p = svc("start")
        assert p.returncode == 0 and p.stdout.startswith("started santhrottled, PID"), p.stdout
        first = pid()
        assert "check" in events() and f"start {first}" in events()
        p = svc("start")  # idempotent: no "started"
        assert p.returncode == 0 and p.stdout.startswith("santhrottled is running"), p.stdout
        p = svc("reload")
        assert p.stdout.startswith("reloaded") and pid() == first
        deadline = time.monotonic() + 10
        while f"hup {first}" not in events():
            assert time.monotonic() < deadline, events()
            time.sleep(0.05)
        p = svc("restart")
        assert p.returncode == 0 and "stopped" in p.stdout and "started" in p.stdout, p.stdout
        second = pid()
        assert second != first and f"term {first}" in events()
        assert any(e.startswith("cli cleanup --delays-only --config") for e in events())
        p = svc("stop")
        assert p.stdout.startswith("stopped") and f"term {second}" in events()
        assert svc("stop").stdout.startswith("santhrottled is not running")
        assert svc("reload").returncode == 1
    finally:
        pidfile = tmp_path / "run" / "d.pid"
        if pidfile.exists():  # our own fake daemon, by PID
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


# --------------------------------------------------------------- variables
def _keys(path: Path) -> list[str]:
    return re.findall(r"^(\w+):", path.read_text(), flags=re.M)


def test_every_public_variable_is_documented_and_private_ones_are_prefixed():
    defaults = _keys(ROLE / "defaults" / "main.yml")
    assert defaults and all(k.startswith("santhrottle_") for k in defaults), defaults
    readme = (ROLE / "README.md").read_text()
    documented = re.findall(r"^\| `(santhrottle_\w+)` \|", readme, flags=re.M)
    assert documented == defaults  # each once, in the same order
    for f in (ROLE / "vars").rglob("*.yml"):
        keys = _keys(f)
        assert keys and all(k.startswith("__santhrottle_") for k in keys), (f.name, keys)
    # every santhrottle_ name the role uses is a documented public variable
    used = set()
    registered = set()
    for f in ROLE.rglob("*"):
        # argument_specs.yml is generated from the README's prose (and tested above)
        # argument_specs.yml is generated from the README's prose (and tested above); the
        # role's tests/ are playbooks that apply the role, not the role
        if (f.suffix in (".yml", ".j2") and f.is_file() and f.name != "argument_specs.yml"
                and ROLE / "tests" not in f.parents):  # fmt: skip
            text = f.read_text()
            used |= set(re.findall(r"(?<![\w_])santhrottle_\w+", text))
            registered |= set(re.findall(r"^\s*register: (\S+)", text, flags=re.M))
            for block in re.findall(r"set_fact:\n((?:\s{4,}\w+:.*\n)+)", text):
                registered |= set(re.findall(r"^\s+(\w+):", block, flags=re.M))
    tags = {"santhrottle_assert", "santhrottle_packages", "santhrottle_modules"}
    tags |= {"santhrottle_install", "santhrottle_config", "santhrottle_service"}
    assert used - tags <= set(defaults), sorted(used - tags - set(defaults))
    assert registered and all(r.startswith("__santhrottle_") for r in registered), registered


def test_the_etcd_roles_variables_are_documented_and_private_ones_are_prefixed():
    defaults = _keys(ETCD_ROLE / "defaults" / "main.yml")
    assert defaults and all(k.startswith("santhrottle_etcd_") for k in defaults), defaults
    readme = (ETCD_ROLE / "README.md").read_text()
    documented = re.findall(r"^\| `(santhrottle_etcd_\w+)` \|", readme, flags=re.M)
    assert documented == defaults  # each once, in the same order
    keys = _keys(ETCD_ROLE / "vars" / "main.yml")
    assert keys and all(k.startswith("__santhrottle_etcd_") for k in keys), keys
    used, registered = set(), set()
    for f in ETCD_ROLE.rglob("*"):
        if f.suffix in (".yml", ".j2") and f.is_file():
            text = f.read_text()
            used |= set(re.findall(r"(?<![\w_])santhrottle_etcd_\w+", text))
            registered |= set(re.findall(r"^\s*register: (\S+)", text, flags=re.M))
    tags = {"santhrottle_etcd_assert", "santhrottle_etcd_packages", "santhrottle_etcd_member"}
    assert used - tags <= set(defaults), sorted(used - tags - set(defaults))
    assert registered and all(r.startswith("__santhrottle_etcd_") for r in registered)


# -------------------------------------------------------------- the tools
def test_ansible_lint_production_profile():
    lint = _need(VENV_BIN / "ansible-lint", "ansible-lint (pip install ansible-lint)")
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env["NO_COLOR"] = "1"
    p = _run([lint, "--profile", "production", "--strict"], cwd=ANSIBLE, env=env)
    assert p.returncode == 0, p.stdout[-6000:]
    assert "Profile 'production' was required, and it passed" in p.stdout, p.stdout[-2000:]


VALIDATIONS = {
    "core": (["--ignore-provider"], {}),
    "libvirt": ([], {"VAGRANT_DEFAULT_PROVIDER": "libvirt"}),
    "virtualbox": ([], {"VAGRANT_DEFAULT_PROVIDER": "virtualbox"}),
}


@pytest.mark.parametrize(
    ("provider", "initiators", "mode"),
    [("core", "1", "target"), ("core", "3", "target"), ("libvirt", "3", "target"),
     ("virtualbox", "3", "target"), ("core", "2", "bridge"), ("libvirt", "2", "bridge"),
     ("virtualbox", "2", "bridge"), ("core", "2", "fleet"), ("libvirt", "2", "fleet"),
     ("virtualbox", "2", "fleet"), ("core", "3", "fleet")],
)  # fmt: skip
def test_vagrant_validate(provider, initiators, mode, tmp_path):
    vagrant = _need(shutil.which("vagrant"), "vagrant (apt-get install --no-install-recommends)")
    args, extra = VALIDATIONS[provider]
    env = dict(
        os.environ,
        VAGRANT_DOTFILE_PATH=str(tmp_path / "dot"),
        SANTHROTTLE_INITIATORS=initiators,
        SANTHROTTLE_MODE=mode,
        VAGRANT_NO_COLOR="1",
        **extra,
    )
    if provider == "libvirt":
        plugins = _run([vagrant, "plugin", "list"], env=env).stdout
        if "vagrant-libvirt" not in plugins:
            pytest.skip("the vagrant-libvirt plugin is not installed (Debian: vagrant-libvirt)")
    if provider == "virtualbox":
        # VirtualBox is not in Debian: validate asks VBoxManage only for --version
        stub = tmp_path / "stub" / "VBoxManage"
        stub.parent.mkdir()
        stub.write_text('#!/bin/sh\n[ "$1" = --version ] && echo 7.0.14r161095\n')
        stub.chmod(0o755)
        env["PATH"] = f"{stub.parent}:{env['PATH']}"
    p = _run([vagrant, "validate", *args], cwd=ROOT / "vagrant", env=env, timeout=120)
    assert p.returncode == 0 and "validated successfully" in p.stdout, p.stdout
    if provider == "core":  # one line per machine: the target, N initiators, the bridge(s)
        machines = {"target"} | {f"ini{k}" for k in range(1, int(initiators) + 1)}
        machines |= {"bridge": {"bridge"}, "fleet": {"bridge1", "bridge2"}}.get(mode, set())
        seen = set(re.findall(r"==> (\S+): Ignoring provider config", p.stdout))
        assert seen == machines, p.stdout


def test_vagrant_validate_refuses_a_bad_initiator_count(tmp_path):
    vagrant = _need(shutil.which("vagrant"), "vagrant")
    env = dict(os.environ, VAGRANT_DOTFILE_PATH=str(tmp_path), SANTHROTTLE_INITIATORS="0")
    p = _run([vagrant, "validate", "--ignore-provider"], cwd=ROOT / "vagrant", env=env)
    assert p.returncode != 0 and "SANTHROTTLE_INITIATORS must be 1..8" in p.stdout


def test_sdist_and_wheel_build(tmp_path):
    try:
        import build  # noqa: F401
    except ImportError:
        pytest.skip("python -m build: the `build` package is not installed in this venv")
    p = _run([sys.executable, "-m", "build", "--outdir", tmp_path, ROOT], timeout=600)
    assert p.returncode == 0, p.stdout[-4000:]
    (whl,) = tmp_path.glob("santhrottle-*-py3-none-any.whl")
    (sdist,) = tmp_path.glob("santhrottle-*.tar.gz")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        meta_dir = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry = z.read(f"{meta_dir}/entry_points.txt").decode()
        meta = z.read(f"{meta_dir}/METADATA").decode()
        data_dir = meta_dir.replace(".dist-info", ".data") + "/data/"
        data = {n[len(data_dir) :]: z.read(n) for n in names if n.startswith(data_dir)}
    for mod in (
        "santhrottle/appliance/daemon/main.py",
        "santhrottle/appliance/datapath/glide.py",
        "santhrottle/appliance/config/schema.py",
        "santhrottle/appliance/sensing/lio.py",
        "santhrottle/controller/decide.py",
        "santhrottle/sim/loop.py",
        "santhrottle/sim/scenarios/paper.toml",
        "santhrottle/bridge/__init__.py",
    ):
        assert mod in names, mod
    assert "santhrottled = santhrottle.appliance.daemon.main:main" in entry
    assert "santhrottle = santhrottle.appliance.cli.main:main" in entry
    assert "santhrottle-simulate = santhrottle.sim.cli:main" in entry
    for dep in ("pyroute2", "prometheus-client", "rtslib-fb"):
        assert re.search(rf"^Requires-Dist: {dep}\b", meta, flags=re.M | re.I), dep
    # Debian 12's python3-prometheus-client (0.16) and python3-pyroute2 (0.7.2)
    # satisfy the floors
    assert re.search(r"^Requires-Dist: prometheus-client>=0\.16$", meta, flags=re.M), meta
    assert re.search(r"^Requires-Dist: pyroute2>=0\.7\.2$", meta, flags=re.M), meta
    # the fleet's etcd client only with the fleet extra
    (etcd,) = re.findall(r"^Requires-Dist: etcd3gw.*$", meta, flags=re.M)
    assert 'extra == "fleet"' in etcd, etcd
    assert re.search(r"^License: GPL-2\.0-or-later$", meta, flags=re.M), meta
    for url in ("Homepage", "Documentation", "Source", "Issues"):
        assert re.search(rf"^Project-URL: {url}, https://", meta, flags=re.M), url
    assert "Classifier: License :: OSI Approved :: GNU General Public License v2 or later" in meta
    assert f"{meta_dir}/LICENSE" in names or any(n.endswith("/LICENSE") for n in names)
    # scapy builds test traffic (the dev extra), never a runtime dependency
    assert not re.search(r"^Requires-Dist: scapy(?!.*extra ==)", meta, flags=re.M | re.I)
    # the data files, under the install prefix (the wheel's .data/data/)
    assert sorted(data) == sorted(WHEEL_DATA), sorted(data)
    assert data["share/santhrottle/systemd/santhrottled.service"] == UNIT.read_bytes()
    assert (
        data["share/santhrottle/grafana/santhrottle.json"]
        == (ROOT / "docs" / "grafana" / "santhrottle.json").read_bytes()
    )
    example = data["share/santhrottle/santhrottle.toml.example"].decode()
    assert parse_config(example, "example") == parse_config("", "example")
    for page in (n for n in data if n.startswith("share/man/")):
        assert data[page].startswith(b".TH "), page
    for prog in ("santhrottle", "santhrottled", "santhrottle-simulate"):
        fn = "_shtab_" + prog.replace("-", "_")
        assert (
            f"complete -o bashdefault -F {fn} {prog}".encode()
            in (data[f"share/bash-completion/completions/{prog}"])
        )
        assert data[f"share/zsh/site-functions/_{prog}"].startswith(f"#compdef {prog}".encode())
    # the unit's Documentation= names what the wheel installs
    for name, section in re.findall(r"man:([\w.]+)\((\d)\)", UNIT.read_text()):
        assert f"share/man/man{section}/{name}.{section}" in data, name
    assert (
        data["share/santhrottle/prometheus/santhrottle-rules.yml"]
        == (ROOT / "docs" / "prometheus" / "santhrottle-rules.yml").read_bytes()
    )
    with tarfile.open(sdist) as t:
        snames = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"pyproject.toml", "appliance/daemon/main.py", "controller/decide.py"} <= snames
    # the wheel is built from the sdist: it carries the build backend and the data sources
    assert {"buildsys/santhrottle_build.py", "systemd/santhrottled.service"} <= snames
    assert {"docs/grafana/santhrottle.json", "LICENSE"} <= snames


# What the wheel installs under the prefix (pyproject.toml [tool.setuptools.data-files]).
WHEEL_DATA = (
    "share/man/man8/santhrottle.8",
    "share/man/man8/santhrottled.8",
    "share/man/man1/santhrottle-simulate.1",
    "share/man/man5/santhrottle.toml.5",
    "share/bash-completion/completions/santhrottle",
    "share/bash-completion/completions/santhrottled",
    "share/bash-completion/completions/santhrottle-simulate",
    "share/zsh/site-functions/_santhrottle",
    "share/zsh/site-functions/_santhrottled",
    "share/zsh/site-functions/_santhrottle-simulate",
    "share/santhrottle/santhrottle.toml.example",
    "share/santhrottle/systemd/santhrottled.service",
    "share/santhrottle/grafana/santhrottle.json",
    "share/santhrottle/prometheus/santhrottle-rules.yml",
)


def test_debian_package_names_resolve(tmp_path):
    """The role's package task, check mode, on this Debian host: every name
    resolves (a wrong one fails the task; missing ones only report changed)."""
    binary = _need(PLAYBOOKS["debian-ansible-core"], "Debian's ansible-playbook (ansible-core)")
    if not list(Path("/usr/lib/python3/dist-packages").glob("apt_pkg*.so")):
        pytest.skip("python3-apt is not installed (the apt module needs it)")
    release = Path("/etc/debian_version")
    if not release.exists() or not release.read_text().startswith("12"):
        pytest.skip("not a Debian 12 host: the role's Debian package list targets bookworm")
    play = [
        {
            "name": "packages, check mode",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(f) for f in _role_vars()],
            "tasks": [{"ansible.builtin.import_tasks": str(ROLE / "tasks" / "packages.yml")}],
        }
    ]
    pb = tmp_path / "packages.yml"
    pb.write_text(json.dumps(play))
    env = _ansible_env(tmp_path)
    env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin"
    p = _run(
        [binary, "--check", "-i", "localhost,", "-e", SYS_PY, pb],
        env=env,
    )
    assert p.returncode == 0, p.stdout[-4000:]
    assert re.search(r"failed=0", p.stdout), p.stdout[-2000:]


def test_the_roles_restart_keys_are_the_schemas():
    """A setting the daemon cannot reload must restart it when the role changes it:
    the role's restart digest covers the variable of every key the configuration
    schema marks restart (vars/main/schema.yml, generated from the schema)."""
    import yaml

    sys.path.insert(0, str(ROOT / "buildsys"))
    import role_config

    from santhrottle.appliance.config.schema import KEYS

    schema = yaml.safe_load((ROLE / "vars" / "main" / "schema.yml").read_text())
    restart = {role_config.variable(k) for k in KEYS if k.restart}
    assert set(schema["__santhrottle_restart_vars"]) == restart
    assert {"santhrottle_socket_mode", "santhrottle_state_dir", "santhrottle_datapath_devices",
            "santhrottle_fleet_endpoints"} <= restart  # fmt: skip
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    # public variables, and the files the role derives for the fleet's TLS (private)
    assert {v for v in restart if not v.startswith("__")} <= set(defaults)
    assert {v for v in restart if v.startswith("__")} <= {"__santhrottle_fleet_files"}


def test_the_roles_generated_files_are_the_schemas_and_the_readmes():
    """templates/santhrottle.toml.j2, meta/argument_specs.yml and vars/main/schema.yml
    are what buildsys/role_config.py makes of today's schema and README (`make role`)."""
    sys.path.insert(0, str(ROOT / "buildsys"))
    import role_config

    stale = [rel for rel, text in role_config.outputs().items()
             if (ROLE / rel).read_text() != text]  # fmt: skip
    assert not stale, f"{stale}: run `make role`"


def test_every_option_has_its_default_and_every_key_a_variable():
    """argument_specs names every public variable, with the default defaults/main.yml
    gives it (a templated default is the README's "per platform" or a path), and
    every key of the schema's fixed tables has its variable."""
    import yaml

    sys.path.insert(0, str(ROOT / "buildsys"))
    import role_config

    from santhrottle.appliance.config.schema import KEYS

    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert list(options) == list(defaults)
    for name, opt in options.items():
        given = defaults[name]
        if isinstance(given, str) and "{{" in given:
            assert "default" not in opt, name
        else:
            assert opt.get("default") == given, (name, opt.get("default"), given)
    for k in KEYS:
        if not k.table.endswith(".NAME") and k.dotted not in role_config.DERIVED:
            var = role_config.variable(k)
            in_controller = k.table == "controller" and k.dotted not in role_config.VARIABLES
            assert in_controller or var in options, k.dotted
            if in_controller:
                assert k.name in options["santhrottle_controller"]["options"], k.dotted
            elif k.default is not None:
                assert defaults[var] == k.default, (var, defaults[var], k.default)


def test_a_fleet_appliance_installs_the_etcd_client(playbook_bin, tmp_path):
    """In a fleet the daemon refuses to start without etcd3gw: the role's package list
    then has Debian's python3-etcd3gw and the wheel is installed with its fleet extra;
    alone, neither."""
    plays = []
    for name, endpoints in (("fleet", ["10.77.0.1:2379"]), ("alone", [])):
        vf = tmp_path / f"{name}.vars.json"
        wheel = "/dist/santhrottle-0.1.0-py3-none-any.whl"
        vf.write_text(
            json.dumps({"santhrottle_fleet_endpoints": endpoints, "santhrottle_wheel": wheel})
        )
        content = (
            "{{ {'packages': __santhrottle_packages_to_install,"
            " 'wheel': __santhrottle_wheel_spec} | to_json }}"
        )
        plays.append(
            {
                "name": name,
                "hosts": "localhost",
                "connection": "local",
                "gather_facts": False,
                "vars_files": [str(f) for f in [*_role_vars(), vf]],
                "tasks": [
                    {
                        "ansible.builtin.copy": {
                            "content": content,
                            "dest": str(tmp_path / f"{name}.json"),
                        }
                    }
                ],
            }
        )
    p = _playbook(playbook_bin, tmp_path, plays)
    assert p.returncode == 0, p.stdout[-4000:]
    fleet = json.loads((tmp_path / "fleet.json").read_text())
    alone = json.loads((tmp_path / "alone.json").read_text())
    assert "python3-etcd3gw" in fleet["packages"] and "python3-etcd3gw" not in alone["packages"]
    assert fleet["packages"][: len(alone["packages"])] == alone["packages"]
    assert fleet["wheel"].endswith("santhrottle-0.1.0-py3-none-any.whl[fleet]")
    assert alone["wheel"].endswith("santhrottle-0.1.0-py3-none-any.whl")
