"""Reading a small file a user named (a config.json, a tokenizer's files, a TOML job file).

One home for the checks every such read needs before it opens the file: the path must be a
regular file (after links), since a named pipe blocks its reader forever and a device such as
/dev/zero never ends; and it must be of a plausible size, since a mistyped path to a weights
file would otherwise be read whole into memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ._errors import ConfigError

__all__ = ["MiB", "check_user_file", "read_user_file"]

MiB = 2**20


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
            f"{st.st_size / MiB:.0f} MiB is too large for {what} (at most "
            f"{max_bytes / MiB:.0f} MiB): check the path",
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
            f"it grew past {max_bytes / MiB:.0f} MiB while being read: give {what}",
        )
    return data
