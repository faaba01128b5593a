"""What every verb of the CLI shares: the one error type and how a verb's parser is made.

Errors an admin can cause (a bad file, a bad argument, a daemon that says
no) are a CliError: main() prints its one line on stderr and exits 2;
never a traceback.  Every verb has a description, its own examples in
--help, and keeps the examples' indentation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2


class CliError(Exception):
    """One line for the admin; exit status 2."""


def verb(
    sub: Any, name: str, help_: str, epilog: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subparser named `name` with its help, description (default: the help as a
    sentence) and examples."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=description or help_[:1].upper() + help_[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def emit(args: argparse.Namespace, data: Any, show: Callable[[Any], None]) -> int:
    """--json: the data as JSON on stdout; otherwise show(data) for humans.  Exit 0."""
    if getattr(args, "json", False):
        json.dump(data, sys.stdout, indent=1)
        print()
    else:
        show(data)
    return 0
