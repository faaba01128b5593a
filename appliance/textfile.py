"""A small text file an admin or a previous run wrote: read, shown and written without surprises.

read_text_file() is the one reader of the configuration, the state file and a
scenario: a regular file's UTF-8 text up to a size, or the caller's error type
with one line ("FILE: PROBLEM").  It is opened non-blocking and checked before
it is read, so a FIFO, a device (/dev/zero) or a directory never blocks the
reader or fills its memory.

unsafe_directory() is why a directory the daemon keeps files in (its state,
its control socket) is not its own: one another user could write to, or one
below a directory such a user could rename.  What is kept there is read back
as root's word, so a stranger must not be able to plant it.

printable() is what such text (a key, a value, a path) becomes in an error
line or a log line: every character that is not printable escaped as Python
writes it ("\\n", "\\x00"), so a key with a newline cannot forge a second
log line.

write_atomically() writes the daemon's state and meter files: a temporary file
in the same directory, fsync, rename over the file, fsync of the directory.
set_aside() moves such a file out of the way when it cannot be read back (kept
as NAME.invalid for the admin), with one error line saying what the daemon does
instead.

Worked example
    read_text_file(Path("/dev/zero"), 1 << 20, ConfigError) -> ConfigError
    "/dev/zero: not a regular file"; printable('a\\nINFO forged') -> 'a\\\\nINFO forged';
    unsafe_directory("/tmp/santhrottle") -> "/tmp is writable by others (mode 1777)"
    (until /tmp/santhrottle exists, root's and 0755: then None).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path


def read_text_file(
    p: Path, max_bytes: int, error: type[Exception], what: str = "", missing_hint: str = ""
) -> str:
    """A regular file's UTF-8 text, at most max_bytes; `error` with one line
    ("WHAT FILE: PROBLEM") otherwise.  Opened non-blocking and checked before
    reading: a FIFO, a device (/dev/zero) or a directory never blocks or
    fills the memory."""
    name = f"{what}{p}"
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{name}: no such file{missing_hint}") from None
    except OSError as e:
        raise error(f"{name}: cannot read: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{name}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > max_bytes:
            raise error(f"{name}: larger than {max_bytes // 1024} KiB")
        try:
            raw = f.read(max_bytes + 1)
        except OSError as e:
            raise error(f"{name}: cannot read: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise error(f"{name}: larger than {max_bytes // 1024} KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{name}: not UTF-8 text") from None


def unsafe_directory(path: str | Path) -> str | None:
    """Why the directory (created later if missing) is not only root's, or None.

    The directory itself, or the nearest one that exists: owned by root or by
    this process's user, and not writable by others (sticky or not: anyone could
    create a missing file first).  Each directory above it: owned by root or by
    this user, or sticky, and not writable by others unless sticky (/tmp holds a
    root-owned directory safely).  Symbolic links are followed first."""
    me = {0, os.geteuid()}
    p = Path(os.path.realpath(path))
    first = True
    for d in (p, *p.parents):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{d}: {e.strerror or e}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a directory"
        sticky = bool(st.st_mode & stat.S_ISVTX)
        mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
        if st.st_uid not in me and (first or not sticky):
            return f"{d} belongs to uid {st.st_uid} ({mode})"
        if st.st_mode & stat.S_IWOTH and (first or not sticky):
            return f"{d} is writable by others ({mode})"
        first = False
    return None


def printable(text: str) -> str:
    """text on one line: each non-printable character escaped (a newline as \\n)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def write_atomically(path: Path, data: bytes) -> None:
    """path's new content, or its old one after a crash at any moment (OSError when the
    directory cannot be written; it is created 0700 when missing)."""
    d = path.parent
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def set_aside(path: Path, error: Exception, instead: str, log: logging.Logger) -> None:
    """An invalid file moved out of the way as NAME.invalid (kept for the admin to
    read), logged in one line: the error, where the file went (or why it could not
    move), and what the daemon does instead."""
    dest = path.with_name(path.name + ".invalid")
    try:
        os.replace(path, dest)
    except OSError as e:
        log.error("%s; cannot set it aside (%s), %s", error, e, instead)
    else:
        log.error("%s; set aside as %s, %s", error, dest, instead)
