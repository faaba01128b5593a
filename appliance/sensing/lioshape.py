"""The shape of LIO's configfs tree as a walk saw it, and whether it still is so.

Problem
    rtslib's walk of the tree (lio.py) costs ~4 ms of CPU on the development host
    for the lab's captured two targets, 0.21 s (under the profiler) in the
    one-vCPU lab guest with make lab-light's four, and the daemon scans at every
    convergence (1 s), though the tree's shape changes only when an admin
    changes the target.  What changes every second (the ACLs' counters, their
    sessions, the generated ACLs' sessions) is a few small files.

What it owns
    Shape: what a walk read of the tree's shape, recorded as it reads it:
      list(dir)       the entries of a directory the walk enumerated (fabric
                      modules, targets, TPGs, LUNs, ACLs, mapped LUNs, portals)
      is_dir(path)    whether a loaded fabric module's or a target's entry is a
                      directory (one not loaded is not in the listing of target/)
      links_in(dir)   a LUN's or mapped LUN's directory: its entries, and where
                      each one links (None for one that is not a link): what
                      rtslib resolves to a storage object or a TPG LUN
      flag(file)      a TPG's enable and generate_node_acls, as bytes (None
                      when they cannot be read)
    holds() reads the same again and says whether every one is as recorded.
    It reads nothing of the backstores (target/core): a storage object a LUN
    links to cannot be removed, and its udev_path cannot change, while it is in
    use; the walk every FULL_WALK_EVERY_S (lio.py) sees them anyway.

Worked example
    A walk of the lab's captured tree (tests/fixtures/lab: two iSCSI targets, one
    with an ACL) records 14 directories, 3 kinds (the one fabric module loaded of
    the ten rtslib knows, 2 targets), 15 entries of LUN and mapped LUN directories
    (3 of them links) and 4 flags; `targetcli /iscsi/<iqn>/tpg1/acls create <wwn>`
    adds an entry to the TPG's acls/ and holds() is False: the next scan walks.
"""

from __future__ import annotations

import os
from pathlib import Path


def readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def read_flag(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


class Shape:
    """What a walk read of the tree's shape (module header)."""

    def __init__(self) -> None:
        self.listed: dict[str, tuple[str, ...]] = {}  # directory -> its entries, sorted
        self.dirs: dict[str, bool] = {}  # a fabric module's or target's path -> a directory?
        self.links: dict[str, str | None] = {}  # a LUN's or mapped LUN's entry -> its target
        self.flags: dict[str, bytes | None] = {}  # a TPG's enable, generate_node_acls

    def list(self, path: str) -> tuple[str, ...]:
        """A directory's entries, sorted; OSError as os.listdir raises it."""
        names = self.listed[path] = tuple(sorted(os.listdir(path)))
        return names

    def is_dir(self, path: str) -> bool:
        is_dir = self.dirs[path] = os.path.isdir(path)
        return is_dir

    def links_in(self, path: str) -> None:
        for name in self.list(path):  # every entry: a file turned link is a change too
            self.links[f"{path}/{name}"] = readlink(f"{path}/{name}")

    def flag(self, path: str) -> None:
        self.flags[path] = read_flag(path)

    def holds(self) -> bool:
        """Whether every directory, kind, link and flag recorded is as it was."""
        try:
            if any(tuple(sorted(os.listdir(p))) != names for p, names in self.listed.items()):
                return False
        except OSError:
            return False
        return (
            all(os.path.isdir(p) == is_dir for p, is_dir in self.dirs.items())
            and all(readlink(p) == target for p, target in self.links.items())
            and all(read_flag(p) == flag for p, flag in self.flags.items())
        )
