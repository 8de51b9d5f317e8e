"""Reading a small file a user named (a config.json, a tokenizer's files, a TOML job file),
and checking a place the user named for writing (a run directory, a cache, an --out path).

One home for the checks every such read needs before it opens the file: the path must be a
regular file (after links), since a named pipe blocks its reader forever and a device such as
/dev/zero never ends; and it must be of a plausible size, since a mistyped path to a weights
file would otherwise be read whole into memory.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from ._errors import ConfigError
from .units import MiB, fmt_bytes

__all__ = ["MiB", "check_output_dir", "check_output_file", "check_user_file", "read_user_file"]


def check_user_file(path: Path, field: str, *, what: str, max_bytes: int) -> int:
    """The size of `path`, a regular file of at most `max_bytes`, else one ConfigError naming
    `field`, the path and what to give instead (`what`, e.g. "a config.json")."""
    try:
        st = os.stat(path)  # (follows links: a link to /dev/zero is a device)
    except OSError as e:
        raise ConfigError(field, str(path), f"cannot read it ({e.strerror}): give {what}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            field, str(path), f"not a regular file (a pipe, device or socket): give {what}"
        )
    if st.st_size > max_bytes:
        raise ConfigError(
            field,
            str(path),
            f"{fmt_bytes(st.st_size)} is too large for {what} (at most "
            f"{fmt_bytes(max_bytes)}): check the path",
        )
    return st.st_size


def read_user_file(path: Path, field: str, *, what: str, max_bytes: int = 16 * MiB) -> bytes:
    """The bytes of `path` after `check_user_file`; reads at most `max_bytes` + 1 bytes, so a
    file that grows while it is read cannot exhaust memory either."""
    check_user_file(path, field, what=what, max_bytes=max_bytes)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(field, str(path), f"cannot read it ({e.strerror}): give {what}") from None
    if len(data) > max_bytes:
        raise ConfigError(
            field,
            str(path),
            f"it grew past {fmt_bytes(max_bytes)} while being read: give {what}",
        )
    return data


def _name_limits(existing: Path) -> tuple[int, int]:
    """(longest file name, longest path) of the filesystem holding `existing`."""
    try:
        return os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path: Path | str, field: str) -> None:
    """A directory `field` names for writing, checked before any work: each name within the
    filesystem's length limit; the directory, or the nearest folder above it that exists, a
    directory (not a file) that this process may write into (a read-only mount or a folder of
    someone else's fails here, not after the model is built). One ConfigError naming `field`."""
    path = Path(os.path.abspath(os.fspath(path)))
    existing = _nearest_existing(path)
    name_max, path_max = _name_limits(existing if existing.is_dir() else existing.parent)
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > name_max or len(os.fsencode(str(path))) > path_max:
        raise ConfigError(
            field,
            str(path)[:80] + "...",
            f"a name in it is longer than this filesystem allows ({name_max} bytes a name, "
            f"{path_max} a path): give a shorter path",
        )
    if not existing.is_dir():
        where = "is" if existing == path else f"would be under {existing}, which is"
        raise ConfigError(
            field, str(path), f"it {where} a file, not a directory: give a directory's path"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "a read-only filesystem" if _read_only_mount(existing) else "permission denied"
        raise ConfigError(
            field,
            str(path),
            f"{existing} is not writable ({why}): give a directory this user can write",
        )
    _probe(existing, path, field)


def _probe(existing: Path, path: Path, field: str) -> None:
    """Make and remove an empty folder in `existing`: the permission bits do not tell root
    about a read-only mount, nor anyone about a pseudo-filesystem such as /proc or /sys that
    refuses new entries (os.access says yes to both), so the filesystem itself is asked."""
    try:
        probe = tempfile.mkdtemp(prefix=".scaletrain-probe-", dir=existing)
    except OSError as e:
        ro = e.errno == errno.EROFS or _read_only_mount(existing)
        why = "a read-only filesystem" if ro else (e.strerror or os.strerror(e.errno or 0))
        raise ConfigError(
            field,
            str(path),
            f"{existing} does not take new folders ({why}): give a directory this user can "
            "write on an ordinary filesystem",
        ) from None
    os.rmdir(probe)


def check_output_file(path: Path | str, field: str) -> None:
    """A file `field` names for writing (an --out FILE): not a directory, and its folder
    passes `check_output_dir`."""
    path = Path(os.path.abspath(os.fspath(path)))
    if path.is_dir():
        raise ConfigError(field, str(path), "it is a directory: give a file's path")
    check_output_dir(path.parent, field)


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
