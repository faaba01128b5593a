"""What every verb of the CLI shares: exit codes, errors, argument types, --json, a verb's parser.

What it owns
    The exit codes (EXIT_OK 0, EXIT_FAILED 1, EXIT_USAGE 2, EXIT_NO_DAEMON 3),
    defined once here and shown in every --help (verb() appends EXIT_HELP) and
    in santhrottle(8) (buildsys reads EXIT_CODES).  The error types a verb
    raises: CliError (bad usage or input, exit 2), Failed (the kernel, the
    daemon or a tool refused or failed, exit 1), NoDaemon (santhrottled is not
    running or not answering, exit 3); main() prints their one line on stderr
    as "santhrottle: ..." and exits with their code: never a traceback.  The
    argparse types that accept only what they promise (ASCII decimal, finite,
    in range; paths that are not empty), so a bad value is argparse's own
    one-line error, exit 2.  emit(): --json as {"protocol": N, "data": ...}.

Worked example
    p.add_argument("--interval", type=number("--interval", lo=0, hi=60, positive=True))
    `--interval nan` -> "santhrottle resources: error: argument --interval: 'nan' is
    not a number: write ASCII digits, e.g. 1 or 0.5", exit 2; a daemon that does
    not answer -> raise NoDaemon(str(e)) -> "santhrottle: santhrottled ...", exit 3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from santhrottle.appliance.addresses import AddressError, initiator_address
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION
from santhrottle.appliance.datapath.names import ip_key as ip_key
from santhrottle.appliance.units import UnitError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3
EXIT_INTERRUPTED = 130  # ^C, the shell's convention (128 + SIGINT)
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "the kernel, the daemon or a tool refused or failed",
    EXIT_USAGE: "bad usage or input (an argument, a value, a file)",
    EXIT_NO_DAEMON: "the daemon (santhrottled) is not running or does not answer",
    EXIT_INTERRUPTED: "interrupted (^C)",
}
EXIT_HELP = "exit status:\n" + "".join(f"  {k:<3}  {v}\n" for k, v in EXIT_CODES.items())
JSON_HELP = f'print JSON: {{"protocol": {PROTOCOL_VERSION}, "data": ...}}'
# The longest path a Unix socket address holds (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH_BYTES = 107
# A name (a network namespace: a file under /run/netns) is at most this long.
MAX_NAME_CHARS = 255
# Digits a number argument may have: enough for any value we accept, never a bignum.
MAX_NUMBER_CHARS = 32

_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\Z")


class CliError(Exception):
    """Bad usage or input: one line for the admin; exit status 2."""

    code = EXIT_USAGE


class Failed(CliError):
    """The kernel, the daemon or a tool refused or failed; exit status 1."""

    code = EXIT_FAILED


class NoDaemon(CliError):
    """santhrottled is not running or does not answer; exit status 3."""

    code = EXIT_NO_DAEMON


def number(
    name: str,
    lo: float | None = None,
    hi: float | None = None,
    positive: bool = False,
    integer: bool = False,
) -> Callable[[str], Any]:
    """An argparse type: ASCII decimal digits only (no sign, exponent, nan, inf,
    hex, Unicode digits), finite, within [lo, hi] (and > 0 if positive)."""
    what = "a whole number" if integer else "a number"
    example = "e.g. 10" if integer else "e.g. 1 or 0.5"

    def parse(text: str) -> Any:
        t = text
        if len(t) > MAX_NUMBER_CHARS or not _DECIMAL.match(t) or (integer and "." in t):
            raise argparse.ArgumentTypeError(
                f"{_short(text)} is not {what}: write ASCII digits, {example}"
            )
        value = int(t) if integer else float(t)
        if not math.isfinite(value):  # cannot happen within MAX_NUMBER_CHARS; kept as a guard
            raise argparse.ArgumentTypeError(f"{_short(text)} is not finite")
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be above 0, got {t}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{name} must be within [{_g(lo)}, {_g(hi)}], got {t}")
        return value

    parse.__name__ = "integer" if integer else "number"
    return parse


def path_arg(name: str, socket: bool = False) -> Callable[[str], str]:
    """An argparse type for a path: not empty, no NUL; a socket's fits sun_path."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name} must not be empty")
        if "\0" in text:
            raise argparse.ArgumentTypeError(f"{name} {_short(text)} contains a NUL byte")
        if socket and len(os.fsencode(text)) > MAX_SOCKET_PATH_BYTES:
            raise argparse.ArgumentTypeError(
                f"{name} is {len(os.fsencode(text))} bytes long: a Unix socket path "
                f"holds at most {MAX_SOCKET_PATH_BYTES}"
            )
        return text

    parse.__name__ = "path"
    return parse


def name_arg(name: str, max_chars: int = MAX_NAME_CHARS) -> Callable[[str], str]:
    """An argparse type for a name (a device: at most IFNAME_MAX_CHARS; a namespace):
    printable, not empty, not longer than max_chars."""

    def parse(text: str) -> str:
        if not text.strip() or not text.isprintable():
            raise argparse.ArgumentTypeError(
                f"{name} {_short(text)} must be a non-empty printable name"
            )
        if len(text) > max_chars:
            raise argparse.ArgumentTypeError(
                f"{name} {_short(text)} is {len(text)} characters long: at most {max_chars}"
            )
        return text

    parse.__name__ = "name"
    return parse


def parsed(name: str, parse: Callable[[str], Any], positive: bool = False) -> Callable[[str], Any]:
    """An argparse type from a strict parser (units.py's, the schema's): its one-line
    ValueError (UnitError, KindError) becomes argparse's error, exit 2."""

    def wrapped(text: str) -> Any:
        try:
            value = parse(text)
        except (UnitError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"{name} must be above 0, got {_short(text)}")
        return value

    wrapped.__name__ = name.lstrip("-")
    return wrapped


def ip_address(text: str) -> str:
    """An argparse type: an initiator's address in the data path's canonical form
    ("FD00:0::2" -> "fd00::2", "::ffff:10.0.0.3" -> "10.0.0.3"), checked as every
    entry checks it (appliance/addresses.py: no 0.0.0.0, ::, loopback, multicast,
    broadcast or link-local address)."""
    try:
        return initiator_address(text)
    except AddressError as e:
        raise argparse.ArgumentTypeError(f"bad initiator address {e}") from None


def column_width(values: Iterable[str], head: str, least: int = 0) -> int:
    """The width of a table's column: its longest value or its heading (an IPv6
    address is up to 39 characters, an IPv4 one 15), at least `least`."""
    return max([len(head), least, *(len(v) for v in values)])


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _short(text: str, limit: int = 40) -> str:
    """repr() of a value for an error line, cut to `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


def verb(
    sub: Any, name: str, help_: str, epilog: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subparser named `name` with its help, description (default: the help as a
    sentence), examples and the exit codes (EXIT_HELP, after the examples)."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=description or help_[:1].upper() + help_[1:] + ".",
        epilog=epilog.rstrip("\n") + "\n\n" + EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def one_line_failures(prog: str, run: Callable[[], int]) -> int:
    """run()'s exit status; a failure is one line on stderr, `PROG: PROBLEM`, with the
    status that says whose it is (CliError's code; a file or a tool this process could
    not use: 1), never a traceback; a closed pipe (`PROG ... | head`) is 0, ^C 130.
    santhrottle's main() and santhrottle-simulate's (sim/cli.py) share it."""
    try:
        return run()
    except CliError as e:
        return fail(prog, str(e), e.code)
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        return fail(prog, f"{where}{e.strerror or e}", EXIT_FAILED)
    except KeyboardInterrupt:  # the shell's convention, no traceback
        return EXIT_INTERRUPTED


def fail(prog: str, message: str, code: int) -> int:
    """The one line on stderr; the exit status."""
    print(f"{prog}: {' '.join(message.split()) or 'failed'}", file=sys.stderr)
    return code


def finite(x: Any) -> Any:
    """JSON has no NaN/Infinity: map them to null, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def envelope(data: Any) -> dict[str, Any]:
    """What every --json prints: the protocol version and the data (NaN/inf as null)."""
    return {"protocol": PROTOCOL_VERSION, "data": finite(data)}


def emit(args: argparse.Namespace, data: Any, show: Callable[[Any], None]) -> int:
    """--json: {"protocol": N, "data": data} on stdout; otherwise show(data) for humans.
    Exit 0."""
    if getattr(args, "json", False):
        json.dump(envelope(data), sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        show(data)
    return EXIT_OK
