"""santhrottle's build backend: setuptools.build_meta, after writing what the build derives.

pyproject.toml names this module (`[build-system] build-backend`, `backend-path =
["buildsys"]`).  Before setuptools builds an sdist, a wheel or an editable install,
generate() writes into buildsys/generated/ (gitignored):

    man/santhrottle.8            argparse-manpage on santhrottle.appliance.cli.main:build_parser;
    man/santhrottled.8           ... on santhrottle.appliance.daemon.main:build_parser; every
                                 verb's epilog (its examples) goes to EXAMPLES; EXIT
                                 STATUS of santhrottle.8 is cli/common.py's EXIT_CODES
    man/santhrottle-simulate.1   ... on santhrottle.sim.cli:build_parser (the simulator)
    man/santhrottle.toml.5       the configuration schema (appliance/config/schema.py, KEYS)
    bash/santhrottle{,d,-simulate}  shtab, bash
    zsh/_santhrottle{,d,-simulate}  shtab, zsh
    santhrottle.toml.example     every key of KEYS at its default, commented out

and pyproject.toml's [tool.setuptools.data-files] installs them, with the systemd unit
and the Grafana dashboard, under the install prefix (the wheel's .data/data/):

    share/man/man8/santhrottle.8, share/man/man8/santhrottled.8, share/man/man5/santhrottle.toml.5
    share/man/man1/santhrottle-simulate.1
    share/bash-completion/completions/santhrottle, .../santhrottled, .../santhrottle-simulate
    share/zsh/site-functions/_santhrottle, .../_santhrottled, .../_santhrottle-simulate
    share/santhrottle/santhrottle.toml.example
    share/santhrottle/systemd/santhrottled.service
    share/santhrottle/grafana/santhrottle.json

The parsers and the schema come from this source tree, never from an installed
santhrottle: `santhrottle` is made a package whose path is the tree's root, whose
controller/, sim/, appliance/ and bridge/ are santhrottle.controller, .sim, .appliance
and .bridge (pyproject.toml's package-dir).  They import only the standard library and
the project's own modules at import time: the build environment holds only the
build requirements (no pyroute2, no prometheus_client).

Reproducible: the man pages' date is SOURCE_DATE_EPOCH's (as argparse-manpage's), and
argparse's usage lines do not depend on the terminal's width (COLUMNS is set).

With SANTHROTTLE_MYPYC=1 the wheel also compiles the controller's tick with mypyc
(buildsys/compiled.py; setup.py adds the extensions, get_requires_for_build_wheel asks
for mypy).

`python buildsys/santhrottle_build.py [OUTDIR]` runs generate() alone (`make man`);
`... --bpf` compiles the in-kernel wire sensor alone (compile_bpf(), `make bpf`), which
the wheel's and the editable install's builds do too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import textwrap
import time
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.command.sdist import sdist as _sdist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import manpage  # buildsys/manpage.py, after its path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "buildsys" / "generated"
# The source files the sdist needs beyond setuptools' defaults: this backend.
SDIST_EXTRA = ("buildsys/santhrottle_build.py", "buildsys/manpage.py", "buildsys/compiled.py")
PROGS = {
    "santhrottle": "santhrottle.appliance.cli.main",
    "santhrottled": "santhrottle.appliance.daemon.main",
    "santhrottle-simulate": "santhrottle.sim.cli",
}
SUMMARY = {
    "santhrottle": "command line of santhrottle, the storage read-latency throttle",
    "santhrottled": "keep shared storage read latency under a threshold (the daemon)",
    "santhrottle-simulate": "run santhrottle's controller against a simulated storage resource",
}
# The manual's section of each program: the simulator needs no root and no daemon.
SECTION = {"santhrottle": 8, "santhrottled": 8, "santhrottle-simulate": 1}
# Options whose value is a file: the completions offer file names for them (and for
# the words after `santhrottle simulate`: a scenario, first).
FILE_OPTIONS = {"config", "socket", "scenario", "plot", "simulator_args"}
# Examples for the keys without a default (the example config shows them in a comment).
UNSET_EXAMPLES = {
    "daemon.netns": '"tgt"',
    "daemon.socket_group": '"storage-admins"',
    "controller.default_threshold": '"20ms"',
    "controller.utilization_threshold": "0.9",
    "bridge.initiator_port": '"eth1"',
    "bridge.array_port": '"eth2"',
    "fleet.array": '"array1"',
    "fleet.appliance": '"gw-a"',
    "fleet.ca": '"/etc/santhrottle/etcd/ca.pem"',
    "fleet.cert": '"/etc/santhrottle/etcd/client.pem"',
    "fleet.key": '"/etc/santhrottle/etcd/client-key.pem"',
    "fleet.user": '"santhrottle-array1-gw-a"',
    "fleet.password_file": '"/etc/santhrottle/etcd/password"',
    "metrics.tls_cert_file": '"/etc/santhrottle/metrics.crt"',
    "metrics.tls_key_file": '"/etc/santhrottle/metrics.key"',
    "metrics.tls_client_ca_file": '"/etc/santhrottle/scrapers-ca.crt"',
    "metrics.basic_auth_users": '{ prometheus = "$2b$10$..." }',
    "resources.NAME.threshold": '"15ms"',
}


# ------------------------------------------------------------ the source tree
@contextlib.contextmanager
def source_tree() -> Iterator[None]:
    """`import santhrottle.*` from ROOT for the duration (any installed one hidden)."""

    def ours() -> list[str]:
        return [n for n in sys.modules if n == "santhrottle" or n.startswith("santhrottle.")]

    saved = {n: sys.modules.pop(n) for n in ours()}
    pkg = types.ModuleType("santhrottle")
    pkg.__path__ = [str(ROOT)]  # santhrottle.appliance -> ROOT/appliance, ...
    sys.modules["santhrottle"] = pkg
    old_columns = os.environ.get("COLUMNS")
    # argparse wraps usage lines to the terminal's width: one line each, whatever the
    # terminal (the man page's own filling wraps them; the completions ignore them)
    os.environ["COLUMNS"] = "1000"
    try:
        yield
    finally:
        for n in ours():
            del sys.modules[n]
        sys.modules.update(saved)
        if old_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old_columns


def project_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def build_date() -> str:
    """The build's date: SOURCE_DATE_EPOCH's (as argparse-manpage dates its pages)."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d")


def build_parser(prog: str) -> argparse.ArgumentParser:
    """A fresh parser of `prog` (call inside source_tree())."""
    module = __import__(PROGS[prog], fromlist=["build_parser"])
    parser: argparse.ArgumentParser = module.build_parser()
    return parser


def walk(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) of the parser and every subcommand, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share the parser
                    seen.add(id(sub))
                    yield from walk(sub, f"{path} {name}")


# ------------------------------------------------------------------- roff
def roff(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line read as a request."""
    out = []
    for line in text.replace("\\", "\\e").replace("-", "\\-").split("\n"):
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def roff_epilog(epilog: str) -> str:
    """An epilog ("examples:", indented command lines, prose paragraphs) as roff:
    the commands as written (no fill), the prose filled."""
    out: list[str] = []
    block: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if block:
            width = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            out.extend([".PP", ".RS 2", ".nf", roff("\n".join(b[width:] for b in block))])
            out.extend([".fi", ".RE"])
            block.clear()
        if para:
            out.extend([".PP", roff(" ".join(para))])
            para.clear()

    for line in epilog.strip("\n").split("\n"):
        if line.strip().lower() == "examples:":
            continue
        if not line.strip():
            flush()
        elif line[:1].isspace():
            if para:
                flush()
            block.append(line.rstrip())
        else:
            if block:
                flush()
            para.append(line.strip())
    flush()
    return "\n".join(out)


# -------------------------------------------------------------- man pages
def _see_also(*pages: str) -> str:
    return ",\n".join(f".BR {p.split('(')[0]} ({p.split('(')[1]}" for p in pages)


FILES = r""".TP
.I /etc/santhrottle/santhrottle.toml
The configuration (\fBsanthrottle.toml\fR(5)); \fB\-\-config\fR names another.
.TP
.I /run/santhrottle/control.sock
The daemon's control socket (daemon.control_socket), through which \fBsanthrottle\fR
talks to \fBsanthrottled\fR.
.TP
.I \%PREFIX/share/santhrottle/santhrottle.toml.example
Every configuration key at its default, with its meaning.
.TP
.I \%PREFIX/share/santhrottle/systemd/santhrottled.service
The systemd unit; its paths are those of an install in \fI\%/usr/local\fR.
.TP
.I \%PREFIX/share/santhrottle/grafana/santhrottle.json
A Grafana dashboard for the Prometheus metrics (metrics.address, metrics.port).
.PP
PREFIX is where the wheel was installed: \fI\%/usr/local\fR for pip as root, the virtual
environment otherwise (the Ansible role's is \fI\%/opt/santhrottle/venv\fR).
"""


# The module whose EXIT_CODES and EXIT_HELP (the block its --help ends with) a
# program's EXIT STATUS shows; santhrottled's is written out (EXIT_STATUS).
EXIT_CODES_OF = {
    "santhrottle": "santhrottle.appliance.cli.common",
    "santhrottle-simulate": "santhrottle.sim.cli",
}


def cli_exit_status(prog: str) -> str:
    """santhrottle(8)'s or santhrottle-simulate(1)'s EXIT STATUS: the EXIT_CODES its
    --help shows (call inside source_tree())."""
    codes = __import__(EXIT_CODES_OF[prog], fromlist=["EXIT_CODES"]).EXIT_CODES
    out = [f".TP\n.B {code}\n{roff(text[:1].upper() + text[1:])}." for code, text in codes.items()]
    verbs = " ..." if prog == "santhrottle" else ""  # the usage error names the verb
    out.append(
        ".PP\nEvery failure prints one line on standard error, "
        f"\\fB{prog}: \\fR followed by the problem; argparse's usage errors print the "
        f"usage and one line \\fB{prog}{verbs}: error: ...\\fR."
    )
    return "\n".join(out)


EXIT_STATUS = {
    "santhrottled": r""".TP
.B 0
Stopped on SIGTERM or SIGINT after removing every delay; with \fB\-\-check\fR: ready.
.TP
.B 1
\fB\-\-check\fR found a problem (each one is printed), or the data path could not be
installed.
.TP
.B 2
A bad configuration file or command line.
""",
}

SEE_ALSO = {
    "santhrottle": (
        "santhrottled(8)",
        "santhrottle.toml(5)",
        "santhrottle-simulate(1)",
        "tc(8)",
        "ipset(8)",
        "iptables(8)",
    ),
    "santhrottled": ("santhrottle(8)", "santhrottle.toml(5)", "systemd.service(5)", "tc-netem(8)"),
    "santhrottle-simulate": ("santhrottle(8)", "santhrottled(8)", "santhrottle.toml(5)"),
}


def _exit_help(prog: str) -> str:
    """The exit codes' block an epilog of `prog` ends with ("" if it has none)."""
    if prog not in EXIT_CODES_OF:
        return ""
    return str(__import__(EXIT_CODES_OF[prog], fromlist=["EXIT_HELP"]).EXIT_HELP)


def man_page(prog: str) -> str:
    """santhrottle(8), santhrottled(8) or santhrottle-simulate(1) from the parser (call
    inside source_tree())."""
    parser = build_parser(prog)
    # Every verb's examples, once per distinct epilog, in EXAMPLES (argparse-manpage
    # shows the top parser's epilog only, as COMMENTS).
    epilogs: dict[str, list[str]] = {}
    exit_help = _exit_help(prog)
    for path, p in walk(parser, prog):
        # the exit codes every verb's --help ends with go to EXIT STATUS, once
        epilog = (p.epilog or "").removesuffix(exit_help).rstrip("\n")
        if epilog:
            epilogs.setdefault(epilog + "\n", []).append(path)
        for group in p._action_groups:  # the verbs: COMMANDS, not POSITIONAL ARGUMENTS
            if any(isinstance(a, argparse._SubParsersAction) for a in group._group_actions):
                group.title = "commands"
    parser.epilog = None
    examples = []
    for text, paths in epilogs.items():
        # a group's verbs that share its examples are named by the group's name
        named = [v for v in paths if v.rsplit(" ", 1)[0] not in paths]
        if named != [prog]:
            examples.append(".SS " + roff(", ".join(v.removeprefix(prog + " ") for v in named)))
        examples.append(roff_epilog(text))

    exit_status = cli_exit_status(prog) if prog in EXIT_CODES_OF else EXIT_STATUS[prog].strip()
    files = [] if prog == "santhrottle-simulate" else [("files", FILES.strip())]
    return manpage.render(
        parser,
        section=SECTION[prog],
        date=build_date(),
        source=f"santhrottle {project_version()}",
        manual="System Administration" if SECTION[prog] == 8 else "User Commands",
        summary=SUMMARY[prog],
        sections=[
            ("examples", "\n".join(examples)),
            ("exit status", exit_status),
            *files,
            ("see also", _see_also(*SEE_ALSO[prog])),
        ],
    )


def config_man_page() -> str:
    """santhrottle.toml(5): the schema's keys (call inside source_tree())."""
    from santhrottle.appliance.config.schema import DEFAULT_PATH, KEYS, toml_value

    out = [
        f'.TH SANTHROTTLE.TOML 5 "{roff(build_date())}" '
        f'"santhrottle {project_version()}" "File Formats"',
        ".SH NAME",
        "santhrottle.toml \\- configuration of santhrottled",
        ".SH SYNOPSIS",
        f".I {roff(DEFAULT_PATH)}",
        ".SH DESCRIPTION",
        roff(
            "A TOML file read by santhrottled(8) at start and on reload (SIGHUP or "
            "santhrottle reload). Every key is optional (though santhrottled needs "
            "datapath.devices); a missing key is at its default. "
            "An invalid file is refused whole, with one line naming the file, the line and "
            "the key; on reload the running configuration stays. Keys marked restart take "
            "effect only when the daemon restarts (a reload that changes them is refused)."
        ),
        ".PP",
        roff(
            'Durations are strings with a unit ("15ms", "500us", "1s"), byte rates '
            'too ("1MiB/s"), link speeds like tc\'s ("10gbit").'
        ),
    ]
    table = None
    for k in KEYS:
        if k.table != table:
            table = k.table
            out.append(".SH " + roff(f"[{table}]"))
            if table == "resources.NAME":
                out.append(
                    roff(
                        "One table per shared resource: an LVM volume group that discovery "
                        "finds by its name, or, with devices, any set of block devices."
                    )
                )
            elif table == "groups.NAME":
                out.append(
                    roff(
                        "One table per initiator group: its members, targets and priority "
                        "(docs/groups.md)."
                    )
                )
            elif table == "hosts.NAME":
                out.append(
                    roff(
                        "One table per initiator host that connects from several addresses "
                        "(IPv4 and IPv6): one initiator to the controller, status and metrics."
                    )
                )
        default = "unset" if k.default is None else toml_value(k.default)
        out.append(".TP")
        out.append(f"\\fB{roff(k.name)}\\fR = \\fI{roff(default)}\\fR")
        out.append(roff(f"{k.doc}."))
        out.append(
            roff(
                f"Values: {k.kind.describe}. Takes effect on "
                f"{'restart' if k.restart else 'reload'}."
            )
        )
    out.extend(
        [
            ".SH [static_map]",
            roff(
                "Addresses or subnets mapped to the resources their initiators use, for what "
                "discovery cannot see (a bridge, a portal shared by several targets):"
            ),
            ".PP",
            ".RS 4",
            ".nf",
            roff('"10.1.0.0/24" = ["vg_aic"]'),
            ".fi",
            ".RE",
            ".SH EXAMPLE",
            ".nf",
            roff(
                '[datapath]\ndevices = ["eth1"]\n\n[resources.vg_aic]\nthreshold = "15ms"\n\n'
                '[resources.array1]\nthreshold = "10ms"\ndevices = ["sdb", "sdc"]'
            ),
            ".fi",
            ".SH FILES",
            ".TP",
            f".I {roff(DEFAULT_PATH)}",
            "The configuration santhrottled and santhrottle read by default.",
            ".TP",
            ".I \\%PREFIX/share/santhrottle/santhrottle.toml.example",
            "Every key at its default, commented out, with its meaning (PREFIX: where the "
            "wheel was installed, e.g. \\fI\\%/usr/local\\fR or a virtual environment).",
            ".SH SEE ALSO",
            _see_also("santhrottled(8)", "santhrottle(8)"),
        ]
    )
    return "\n".join(out) + "\n"


# ------------------------------------------------------------- completions
def completion(prog: str, shell: str) -> str:
    """shtab's completion script of `prog` for bash or zsh (call inside source_tree())."""
    import shtab

    parser = build_parser(prog)
    for _, p in walk(parser, prog):
        for action in p._actions:
            if action.dest in FILE_OPTIONS:
                action.complete = shtab.FILE  # type: ignore[attr-defined]
    preamble = None
    if prog == "santhrottle":  # the daemon's names (appliance/cli/completion.py)
        from santhrottle.appliance.cli.completion import PREAMBLE as preamble
    text: str = shtab.complete(parser, shell=shell, preamble=preamble)
    return text


# ---------------------------------------------------------- example config
def example_config() -> str:
    """santhrottle.toml with every key at its default, commented out (call inside
    source_tree()).  A line `#key = value` (no space after #) is a key at its default:
    removing the # changes nothing."""
    from santhrottle.appliance.config.schema import DEFAULT_PATH, KEYS, toml_value

    def comment(text: str, indent: str = "") -> list[str]:
        return textwrap.wrap(
            text, 88, initial_indent="# " + indent, subsequent_indent="# " + indent
        )

    def named_keys(table: str) -> list[str]:
        """The keys of a [TABLE.NAME] table, one comment each."""
        lines: list[str] = []
        for k in KEYS:
            if k.table == table:
                when = "restart" if k.restart else "reload"
                default = "unset" if k.default is None else toml_value(k.default)
                lines += comment(
                    f"{k.name}: {k.doc} [{k.kind.describe}; default {default}; {when}]", "  "
                )
        return lines

    out = [
        f"# {DEFAULT_PATH}: santhrottled's configuration (santhrottle.toml(5)).",
        "#",
        *comment(
            "Every key at its default: a line `#key = value` is commented out and changing "
            "nothing; remove the # to set it. Generated by the build from the configuration "
            "schema, so it matches the santhrottle it was installed with."
        ),
        "#",
        *comment(
            "To start: copy this file to /etc/santhrottle/santhrottle.toml, name the device "
            "facing the initiators in datapath.devices (on a bridge: daemon.mode = "
            '"bridge" and the two ports in [bridge]), give thresholds ([resources.NAME] '
            "or controller.default_threshold), then `santhrottled --check`. Without a "
            "threshold a resource is only measured. [reload]: `santhrottle reload` or "
            "SIGHUP applies it; [restart]: the daemon must restart."
        ),
    ]
    table = None
    for k in KEYS:
        if k.table.endswith(".NAME"):  # described in comments below
            continue
        if k.table != table:
            table = k.table
            out += ["", f"[{table}]"]
        when = "restart" if k.restart else "reload"
        out += comment(f"{k.doc} [{k.kind.describe}; {when}]")
        if k.default is None:
            example = UNSET_EXAMPLES.get(k.dotted)
            out += comment(f"unset by default{f', e.g. {k.name} = {example}' if example else ''}")
        else:
            out.append(f"#{k.name} = {toml_value(k.default)}")
    out += [
        "",
        *comment(
            "[resources.NAME]: one table per shared resource, by its name: an LVM "
            "volume group that discovery finds, or any set of block devices "
            "(devices). None by default. Keys:"
        ),
    ]
    out += named_keys("resources.NAME")
    out += [
        "# e.g.",
        "#   [resources.vg_aic]",
        f"#   threshold = {UNSET_EXAMPLES['resources.NAME.threshold']}",
        "#   [resources.array1]",
        '#   threshold = "10ms"',
        '#   devices = ["sdb", "sdc"]',
        "#   [resources.array2]                # bridge mode: volumes as the wire names them",
        '#   threshold = "10ms"',
        '#   volumes = ["iscsi://10.0.0.5/iqn.2003-01.org.example:array2/*"]',
        "",
        *comment(
            "[static_map]: addresses or subnets -> the resources their initiators use, for "
            "what discovery cannot see (a bridge, a portal shared by several targets). "
            "Empty by default; e.g."
        ),
        "#   [static_map]",
        '#   "10.1.0.0/24" = ["vg_aic"]',
        "",
        *comment(
            "[groups.NAME]: one table per initiator group, its members, targets and "
            "priority. None by default. Keys:"
        ),
        *named_keys("groups.NAME"),
        "# e.g.",
        "#   [groups.db]",
        '#   members = ["10.0.1.0/24", "10.0.2.7"]',
        '#   latency_target = "5ms"',
        "#   priority = 2",
        "",
        *comment(
            "[hosts.NAME]: one table per initiator host that connects from several "
            "addresses (IPv4 and IPv6), counted and delayed as one initiator. None by "
            "default. Keys:"
        ),
        *named_keys("hosts.NAME"),
        "# e.g.",
        "#   [hosts.db1]",
        '#   addresses = ["10.0.1.5", "fd00:1::5"]',
    ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------- generate
def outputs() -> dict[str, Any]:
    """Relative path under GENERATED -> a function giving its text."""
    return {
        "man/santhrottle.8": lambda: man_page("santhrottle"),
        "man/santhrottled.8": lambda: man_page("santhrottled"),
        "man/santhrottle-simulate.1": lambda: man_page("santhrottle-simulate"),
        "man/santhrottle.toml.5": config_man_page,
        "bash/santhrottle": lambda: completion("santhrottle", "bash"),
        "bash/santhrottled": lambda: completion("santhrottled", "bash"),
        "zsh/_santhrottle": lambda: completion("santhrottle", "zsh"),
        "zsh/_santhrottled": lambda: completion("santhrottled", "zsh"),
        "bash/santhrottle-simulate": lambda: completion("santhrottle-simulate", "bash"),
        "zsh/_santhrottle-simulate": lambda: completion("santhrottle-simulate", "zsh"),
        "santhrottle.toml.example": example_config,
    }


def generate(outdir: Path = GENERATED) -> list[Path]:
    """Write every generated file under outdir; their paths."""
    written = []
    with source_tree():
        for rel, make in outputs().items():
            path = outdir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            text = make()
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


BPF_SOURCE = ROOT / "bridge" / "bpf" / "wire.bpf.c"
BPF_OBJECT = BPF_SOURCE.with_suffix(".o")


def compile_bpf(strict: bool = False) -> Path | None:
    """bridge/bpf/wire.bpf.c -> wire.bpf.o (the in-kernel wire sensor) with clang, against
    libbpf's headers. Without clang: a warning, and None (bridge mode then reads the wire
    in Python); strict (make bpf): an error."""
    import shutil
    import subprocess
    import sysconfig

    clang = shutil.which("clang")
    if clang is None:
        msg = "clang not found: the in-kernel wire sensor (bridge/bpf) is not built"
        if strict:
            raise SystemExit(f"santhrottle_build: {msg}")
        print(f"santhrottle_build: warning: {msg}", file=sys.stderr)
        return None
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    # reproducible: from the tree's root with relative paths, the debug info names no
    # directory of this build (the wheel's, built from an unpacked sdist, is the same)
    cmd = [
        clang,
        "-O2",
        "-g",
        "-target",
        "bpf",
        "-Wall",
        "-Werror",
        "-fdebug-compilation-dir=.",
        f"-I/usr/include/{multiarch}",
        "-c",
        str(BPF_SOURCE.relative_to(ROOT)),
        "-o",
        str(BPF_OBJECT),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"santhrottle_build: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return BPF_OBJECT


class Sdist(_sdist):  # type: ignore[misc]  # setuptools has no types here
    """setuptools' sdist plus this backend (pyproject.toml: [tool.setuptools.cmdclass]):
    the wheel is built from the sdist, with this module."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, [*files, *(f for f in SDIST_EXTRA if f not in files)])


# ------------------------------------------------- the PEP 517 / 660 hooks
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    """setuptools', and mypy (mypyc) where the wheel compiles the controller
    (SANTHROTTLE_MYPYC=1, buildsys/compiled.py)."""
    import compiled

    extra = ["mypy>=1.10"] if compiled.wanted() else []
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *extra]


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    generate()
    name: str = _setuptools.build_sdist(sdist_directory, config_settings)
    return name


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    generate()
    compile_bpf()
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    generate()
    compile_bpf()
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    return name


if __name__ == "__main__":
    if sys.argv[1:] == ["--bpf"]:  # make bpf
        print(compile_bpf(strict=True))
        sys.exit(0)
    for p in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else GENERATED):
        print(p)
