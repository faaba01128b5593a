"""The wire's names across restarts: each live connection's target and initiator names, in files.

Problem
    A volume's target name and an initiator's name come from its session's
    login (or connect), which happened long before a restart of
    santhrottled. With names_path, the sensor writes every live
    connection's target name there when they change (at a convergence; a
    JSON list, written whole and renamed into place) and their initiator
    names likewise to initiators_path (by default INITIATORS_FILE beside
    names_path), and reads both back at its start, so the sessions that
    outlive the restart keep their names. A file that cannot be read or
    parsed is a warning, not an error: those sessions show their target as
    "*", and their initiators by address only, until they log in again.

Worked example
    names_path /var/lib/santhrottle/wire-names.json holds
    [["10.0.0.2", 51000, "10.0.0.11", 3260, "iqn.2003-01.org.lab:lun0"]]: after a
    restart, load_names() gives {("10.0.0.2", 51000, "10.0.0.11", 3260):
    "iqn.2003-01.org.lab:lun0"} to the tracker, which names that session's volumes
    with it before it logs in again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from santhrottle.bridge.tracker import ConnKey

log = logging.getLogger(__name__)

NAMES_FILE = "wire-names.json"  # the daemon's, in daemon.state_dir
INITIATORS_FILE = "wire-initiators.json"  # beside it: the initiators' login names


class SavedNames:
    """The target and initiator names of the live connections, kept across restarts in
    names_path and initiators_path (module header: Names across restarts)."""

    def __init__(
        self, names_path: str | Path | None, initiators_path: str | Path | None, save: bool
    ) -> None:
        self.names_path = Path(names_path) if names_path is not None else None
        if initiators_path is None and self.names_path is not None:
            initiators_path = self.names_path.with_name(INITIATORS_FILE)
        self.initiators_path = Path(initiators_path) if initiators_path is not None else None
        self.save = save and self.names_path is not None
        self.targets = load_names(self.names_path) if self.names_path else {}
        self.initiators = (
            load_names(self.initiators_path, "initiator") if self.initiators_path else {}
        )

    def store(self, targets: dict[ConnKey, str], initiators: dict[ConnKey, str]) -> None:
        """Written when they changed (a failure is a warning: tried again next time)."""
        if targets != self.targets and self._stored(self.names_path, targets):
            self.targets = targets
        if initiators != self.initiators and self._stored(self.initiators_path, initiators):
            self.initiators = initiators

    @staticmethod
    def _stored(path: Path | None, names: Mapping[ConnKey, str]) -> bool:
        if path is None:
            return False
        try:
            store_names(path, names)
        except OSError as e:
            log.warning("cannot write %s: %s", path, e.strerror or e)
            return False
        return True


# The longest names file read: 10,000 connections' names are ~3 MB.
MAX_NAMES_BYTES = 16 << 20


def load_names(path: Path, what: str = "target") -> dict[ConnKey, str]:
    """(initiator, port, target address, port) -> target (or initiator) name, from
    store_names()."""
    try:
        if path.stat().st_size > MAX_NAMES_BYTES:
            raise ValueError(f"larger than {MAX_NAMES_BYTES} bytes")
        rows = json.loads(path.read_text())
        return {(str(a), int(b), str(c), int(d)): str(n) for a, b, c, d, n in rows}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as e:  # a broken file names nothing
        log.warning("%s: cannot use the saved %s names (%s)", path, what, e)
        return {}


def store_names(path: Path, names: Mapping[ConnKey, str]) -> None:
    rows = sorted([*k, n] for k, n in names.items())
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, path)
