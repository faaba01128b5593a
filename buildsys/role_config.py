"""The Ansible role's view of the configuration, generated from the config schema.

What it writes (`make role`, or `python buildsys/role_config.py`), into the role
ansible/roles/santhrottle/ (committed: the role works from a plain checkout; a
rollout test fails when they are older than the schema or the README):

    templates/santhrottle.toml.j2   every key of appliance/config/schema.py's KEYS,
                                    from one role variable each (VARIABLES below), or
                                    from the named tables' dicts (santhrottle_resources,
                                    _groups, _hosts, _static_map) and santhrottle_controller
    meta/argument_specs.yml         the role's options for ansible-core (validated before
                                    the role's first task) and ansible-doc: the type,
                                    choices and default of every config variable from the
                                    schema, every description from the role's README
    vars/main/schema.yml            the variables of the keys the daemon cannot reload
                                    (restart keys): their digest restarts the daemon

The role's own options (install, service, ...) are ROLE_OPTIONS below.  A key of
the schema's fixed tables is set by santhrottle_<table>_<key> unless VARIABLES
names it otherwise (the names the role had before), and is written only when set:
a key whose schema default is None is left out while its variable is "" (or []).

Types come from the kinds' own description (Kind.describe): "list of", "whole
number", "number", "true or false", '"a" or "b"' (choices), the rest strings
(durations, rates, names, paths), and are checked against each default.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import santhrottle_build  # the source tree as the santhrottle package

ROOT = Path(__file__).resolve().parent.parent
ROLE = ROOT / "ansible" / "roles" / "santhrottle"
README = ROLE / "README.md"
DEFAULTS = ROLE / "defaults" / "main.yml"

# Variable names that are not santhrottle_<table>_<key> (the role's names before).
VARIABLES = {
    "daemon.control_socket": "santhrottle_control_socket",
    "daemon.socket_mode": "santhrottle_socket_mode",
    "daemon.socket_group": "santhrottle_socket_group",
    "daemon.state_dir": "santhrottle_state_dir",
    "daemon.netns": "santhrottle_netns",
    "daemon.keep_static_state": "santhrottle_keep_static_state",
    "daemon.mode": "santhrottle_daemon_mode",
    "datapath.write_mode": "santhrottle_write_mode",
    "datapath.step": "santhrottle_step",
    "datapath.max_delay": "santhrottle_max_delay",
    "datapath.ladder_ratio": "santhrottle_ladder_ratio",
    "datapath.link_speed": "santhrottle_link_speed",
    "datapath.leaf": "santhrottle_leaf",
    "datapath.glide_leaves": "santhrottle_glide_leaves",
    "controller.default_threshold": "santhrottle_default_threshold",
}
# Keys whose value the role derives (no variable of their own): the fleet's TLS and
# password files, copied to the appliance (tasks/fleet.yml) from santhrottle_fleet_*_src
# and santhrottle_fleet_password; key -> (private variable, its entry).
DERIVED = {
    "fleet.ca": ("__santhrottle_fleet_files", "ca"),
    "fleet.cert": ("__santhrottle_fleet_files", "cert"),
    "fleet.key": ("__santhrottle_fleet_files", "key"),
    "fleet.password_file": ("__santhrottle_fleet_files", "password_file"),
}
# [controller]'s other keys: entries of this dict; the named tables: dicts of NAME.
CONTROLLER = "santhrottle_controller"
NAMED = {
    "resources": "santhrottle_resources",
    "groups": "santhrottle_groups",
    "hosts": "santhrottle_hosts",
}
STATIC_MAP = "santhrottle_static_map"
# Keys written only in one daemon mode, tables only when in use.
TABLE_WHEN = {"bridge": "__santhrottle_bridge | bool", "fleet": "__santhrottle_fleet | bool"}
KEY_WHEN = {"datapath.devices": "not __santhrottle_bridge | bool"}
# Keys observe mode writes as comments: nothing is throttled.
THRESHOLDS = {"controller.default_threshold", "resources.NAME.threshold"}

# The role's own options: name -> (type, elements or choices). Their descriptions
# are the README's, their defaults defaults/main.yml's (none where it computes one).
ROLE_OPTIONS: dict[str, tuple[str, Any]] = {
    "santhrottle_enabled": ("bool", None),
    "santhrottle_mode": ("str", ["observe", "control"]),
    "santhrottle_service_manager": ("str", ["systemd", "direct"]),
    "santhrottle_manage_packages": ("bool", None),
    "santhrottle_packages": ("list", "str"),
    "santhrottle_packages_extra": ("list", "str"),
    "santhrottle_kernel_modules": ("list", "str"),
    "santhrottle_bridge_kernel_modules": ("list", "str"),
    "santhrottle_deb": ("str", None),
    "santhrottle_dist_dir": ("str", None),
    "santhrottle_wheel": ("str", None),
    "santhrottle_wheelhouse": ("str", None),
    "santhrottle_pip_extra_args": ("list", "str"),
    "santhrottle_prefix": ("path", None),
    "santhrottle_venv": ("path", None),
    "santhrottle_python": ("path", None),
    "santhrottle_venv_system_site_packages": ("bool", None),
    "santhrottle_bin_dir": ("str", None),
    "santhrottle_unit_dir": ("path", None),
    "santhrottle_log_file": ("path", None),
    "santhrottle_config_path": ("path", None),
    "santhrottle_fleet_ca_src": ("str", None),
    "santhrottle_fleet_cert_src": ("str", None),
    "santhrottle_fleet_key_src": ("str", None),
    "santhrottle_fleet_password": ("str", None),
    "santhrottle_fleet_secrets_dir": ("path", None),
}
NO_LOG = {"santhrottle_fleet_password"}
NAMED_DOC = {
    "resources": "per resource NAME, a dict of",
    "groups": "per initiator group NAME, a dict of",
    "hosts": "per initiator host NAME, a dict of",
}


# ------------------------------------------------------------------ the schema
def keys() -> list[Any]:
    with santhrottle_build.source_tree():
        from santhrottle.appliance.config.schema import KEYS

        return list(KEYS)


def variable(key: Any) -> str:
    if key.dotted in DERIVED:
        return DERIVED[key.dotted][0]
    return VARIABLES.get(key.dotted) or f"santhrottle_{key.table}_{key.name}"


def kind_type(key: Any) -> tuple[str, str | None, list[str] | None]:
    """(type, list elements, choices) of a key, from its kind's description."""
    d = key.kind.describe
    if d.startswith("table of"):
        out = ("dict", None, None)
    elif d.startswith("list of"):
        out = ("list", "int" if "TCP port" in d else "str", None)
    elif d.startswith("whole number") or d.startswith("TCP port"):
        out = ("int", None, None)
    elif d.startswith("number"):
        out = ("float", None, None)
    elif d == "true or false":
        out = ("bool", None, None)
    elif re.fullmatch(r'"[^"]+"( or "[^"]+")+', d):
        out = ("str", None, re.findall(r'"([^"]+)"', d))
    else:
        out = ("str", None, None)
    want = {"list": list, "int": int, "float": (int, float), "bool": bool, "str": str, "dict": dict}
    if key.default is not None and not isinstance(key.default, want[out[0]]):
        raise SystemExit(f"role_config: {key.dotted}: default {key.default!r} is not {out[0]}")
    return out


def render(kind: str, elements: str | None, expr: str) -> str:
    """A Jinja expression writing `expr` as a TOML value of this type."""
    if kind == "list":
        each = "map('int')" if elements == "int" else "map('string')"
        return f"{{{{ {expr} | {each} | list | to_json }}}}"
    if kind == "dict":  # a TOML inline table of strings
        pair = "{{ k | string | to_json }} = {{ v | string | to_json }}"
        return f"{{ {{% for k, v in {expr} | dictsort %}}{pair}{{{{ ', ' if not loop.last }}}}" + (
            "{% endfor %} }"
        )
    return {
        "int": f"{{{{ {expr} | int }}}}",
        "float": f"{{{{ {expr} | float }}}}",
        "bool": f"{{{{ {expr} | bool | to_json }}}}",
    }.get(kind, f"{{{{ {expr} | string | to_json }}}}")


def is_set(expr: str) -> str:
    """A Jinja test that a value is given (none, "", [] and {} are not; 0 and false are)."""
    return f"{expr} is not none and {expr} not in ['', [], {{}}]"


# ----------------------------------------------------------------- the template
HEADER = """\
{{ ansible_managed | comment }}
# santhrottled's configuration (santhrottle.toml(5), docs/configure.md). Rendered by
# the Ansible role santhrottle from its variables: change the inventory, not this
# file. The template is generated from the configuration schema
# (buildsys/role_config.py; `make role`).
{% if santhrottle_mode == 'observe' %}
# santhrottle_mode: observe - no threshold is written, so every resource is
# measured and none is throttled (`santhrottle status` shows mode "observe").
# The thresholds the inventory holds are kept below as comments.
{% endif %}
"""


def _key_line(key: Any, expr: str, as_given: bool = False) -> str:
    """`name = value`; as_given: the value's own TOML (a named table's entry, which
    argument_specs does not type: the daemon's parser names a wrong one)."""
    kind, elements, _ = kind_type(key)
    value = f"{{{{ {expr} | to_json }}}}" if as_given else render(kind, elements, expr)
    prefix = ""
    if key.dotted in THRESHOLDS:
        prefix = "{{ '' if santhrottle_mode == 'control' else '# ' }}"
    return f"{prefix}{key.name} = {value}"


def template(all_keys: list[Any]) -> str:
    out = [HEADER]
    tables: dict[str, list[Any]] = {}
    for k in all_keys:
        tables.setdefault(k.table, []).append(k)
    for table, tkeys in tables.items():
        if table.endswith(".NAME"):
            out.append(_named_table(table.split(".")[0], tkeys))
            continue
        lines = [f"[{table}]"]
        for k in tkeys:
            if table == "controller" and k.dotted not in VARIABLES:
                expr = f"{CONTROLLER}[{k.name!r}]"
                cond = f"{k.name!r} in {CONTROLLER}"
            elif k.dotted in DERIVED:
                var, entry = DERIVED[k.dotted]
                expr, cond = f"{var}[{entry!r}]", f"{entry!r} in {var}"
            else:
                expr = variable(k)
                cond = is_set(expr) if k.default is None else ""
            if k.dotted in KEY_WHEN:
                cond = f"({cond}) and ({KEY_WHEN[k.dotted]})" if cond else KEY_WHEN[k.dotted]
            line = _key_line(k, expr)
            lines += [f"{{% if {cond} %}}", line, "{% endif %}"] if cond else [line]
        block = "\n".join(lines) + "\n"
        if table in TABLE_WHEN:
            block = f"{{% if {TABLE_WHEN[table]} %}}\n{block}{{% endif %}}\n"
        out.append(block)
        if table == "controller":  # [static_map] after the controller, as before
            out.append(
                f"{{% if {STATIC_MAP} | length > 0 %}}\n[static_map]\n"
                f"{{% for subnet, names in {STATIC_MAP} | dictsort %}}\n"
                "{{ subnet | string | to_json }} = {{ names | map('string') | list | to_json }}\n"
                "{% endfor %}\n{% endif %}\n"
            )
    return "\n".join(block.rstrip("\n") + "\n" for block in out).replace("\n\n\n", "\n\n")


def _named_table(table: str, tkeys: list[Any]) -> str:
    var = NAMED[table]
    names = [k.name for k in tkeys]
    lines = [
        f"{{% for name, given in {var} | dictsort %}}",
        "{% set entry = given | default({}, true) %}",
        f"[{table}.{{{{ name | string | to_json }}}}]",
    ]
    for k in tkeys:
        expr = f"entry[{k.name!r}]"
        lines += [
            f"{{% if {is_set(f'entry.get({k.name!r})')} %}}",
            _key_line(k, expr, True),
            "{% endif %}",
        ]
    # a key the schema does not have is written as given: the daemon's parser, which
    # validates the file before it replaces the old one, names it
    lines += [
        f"{{% for key, value in entry | dictsort if key not in {names!r} %}}",
        "{{ key }} = {{ value | to_json }}",
        "{% endfor %}",
        "",
        "{% endfor %}",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------- argument_specs.yml
def readme_descriptions() -> dict[str, str]:
    """Variable -> its README row's meaning, as plain text."""
    out = {}
    for m in re.finditer(r"^\| `(santhrottle_\w+)` \| [^|]* \| (.*) \|$", README.read_text(), re.M):
        text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", m.group(2))  # links -> their text
        out[m.group(1)] = text.replace("`", "").replace("\\|", "|").strip()
    return out


def _option(kind: str, extra: Any, default: Any, description: str) -> dict[str, Any]:
    opt: dict[str, Any] = {"description": description, "type": kind}
    if kind == "list":
        opt["elements"] = extra
    elif isinstance(extra, list):
        opt["choices"] = extra
    if default is not None:
        opt["default"] = default
    return opt


def argument_specs(all_keys: list[Any]) -> dict[str, Any]:
    docs = readme_descriptions()

    def doc(var: str) -> str:
        if var not in docs:
            raise SystemExit(f"role_config: {var} has no row in {README.relative_to(ROOT)}")
        return docs[var]

    given = yaml.safe_load(DEFAULTS.read_text())

    def default(var: str) -> Any:
        if var not in given:
            raise SystemExit(f"role_config: {var} is not in {DEFAULTS.relative_to(ROOT)}")
        value = given[var]
        return None if isinstance(value, str) and "{{" in value else value

    options: dict[str, Any] = {}
    for var, (kind, extra) in ROLE_OPTIONS.items():
        options[var] = _option(kind, extra, default(var), doc(var))
        if var in NO_LOG:
            options[var]["no_log"] = True
    controller: dict[str, Any] = {}
    named: dict[str, dict[str, Any]] = {t: {} for t in NAMED}
    for k in all_keys:
        kind, elements, choices = kind_type(k)
        sub = _option(kind, elements or choices, None, f"{k.doc} ({k.kind.describe})")
        if k.table.endswith(".NAME"):
            named[k.table.split(".")[0]][k.name] = sub
        elif k.dotted in DERIVED:
            continue
        elif k.table == "controller" and k.dotted not in VARIABLES:
            unset = "unset" if k.default is None else f"default {k.default}"
            controller[k.name] = sub | {"description": f"{k.doc} ({k.kind.describe}); {unset}"}
        else:
            options[variable(k)] = _option(
                kind, elements or choices, default(variable(k)), f"{doc(variable(k))} [{k.dotted}]"
            )
    options[CONTROLLER] = {
        "description": doc(CONTROLLER),
        "type": "dict",
        "default": default(CONTROLLER),
        "options": controller,
    }
    for table, var in NAMED.items():
        what = ", ".join(sorted(named[table]))
        options[var] = {
            "description": f"{doc(var)} ({NAMED_DOC[table]} {what})",
            "type": "dict",
            "default": default(var),
        }
    options[STATIC_MAP] = {
        "description": doc(STATIC_MAP),
        "type": "dict",
        "default": default(STATIC_MAP),
    }
    ordered = {v: options[v] for v in given if v in options}  # defaults/main.yml's order
    missing = set(options) ^ set(ordered)
    if missing:
        raise SystemExit(f"role_config: not an option and a default: {', '.join(sorted(missing))}")
    return {
        "argument_specs": {
            "main": {
                "short_description": "santhrottle on a Linux LIO/nvmet target or a bridge",
                "description": [
                    "Installs santhrottle (the Debian package, or the wheel into a venv), "
                    "loads the data path's kernel modules, writes santhrottle.toml from "
                    "these variables (validated by the daemon's own parser) and runs "
                    "santhrottled under systemd or without it.",
                    "Generated by buildsys/role_config.py from the configuration schema "
                    "and the role's README (make role).",
                ],
                "author": ["santhrottle maintainers"],
                "options": ordered,
            }
        }
    }


def schema_vars(all_keys: list[Any]) -> dict[str, Any]:
    fixed = [
        k
        for k in all_keys
        if not k.table.endswith(".NAME")
        and not (k.table == "controller" and k.dotted not in VARIABLES)
    ]
    restart = sorted({variable(k) for k in fixed if k.restart})
    # argument_specs' type list takes a string too (it splits it on commas, but the
    # role sees the variable as given): tasks/assert.yml refuses a string for these
    lists = [v for v, (kind, _) in ROLE_OPTIONS.items() if kind == "list"]
    lists += [variable(k) for k in fixed if kind_type(k)[0] == "list" and k.dotted not in DERIVED]
    return {"__santhrottle_restart_vars": restart, "__santhrottle_list_vars": lists}


# ------------------------------------------------------------------- generate
class _Dumper(yaml.SafeDumper):
    """Lists indented under their key (yamllint's and ansible-lint's style)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)


def outputs() -> dict[str, str]:
    all_keys = keys()
    head = "# Generated by buildsys/role_config.py from the configuration schema: `make role`.\n"
    dump = {"sort_keys": False, "width": 88, "allow_unicode": True, "Dumper": _Dumper}
    return {
        "templates/santhrottle.toml.j2": template(all_keys),
        "meta/argument_specs.yml": "---\n" + head + yaml.dump(argument_specs(all_keys), **dump),
        "vars/main/schema.yml": "---\n"
        + head
        + "# __santhrottle_restart_vars: the variables of the keys santhrottled cannot reload\n"
        + "# (their digest restarts it); __santhrottle_list_vars: the role's lists.\n"
        + yaml.dump(schema_vars(all_keys), **dump),
    }


def main() -> int:
    for rel, text in outputs().items():
        path = ROLE / rel
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
