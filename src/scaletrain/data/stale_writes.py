"""Temporary names of the data cache's atomic writes, and the leftovers of writers that died.

Whatever the data cache writes is written under a temporary name and renamed into place (a
shard directory: `shards.publish`; a digest record: `digests.DigestMemo`), so a reader never
sees half of it. A writer killed before its rename (SIGKILL, OOM, a lost node) leaves the
temporary behind: a shard directory's can be as large as the corpus. Temporary names carry
the writer's host and pid (`temp_name`: `.<final>.tmp-<host>-<pid>-<8 hex>`), so a later start
tells a leftover from a write in flight (`sweep`): on this host, a writer whose pid no longer
exists is dead and its leftover is removed; another host's cannot be judged from here (the
cache may be shared), and is reported once it has not changed for `_FOREIGN_AGE_S`. Names
without a host (written before this rule) are judged by that age alone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.config import fmt_bytes

__all__ = ["temp_name", "sweep", "Sweep", "pid_alive"]

_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"
"""This host in temporary names: no '-' (the field separator), no path characters."""
_NAME = re.compile(r"^\.(?P<final>.+)\.tmp-(?:(?P<host>[A-Za-z0-9._]+)-)?(?P<pid>\d+)-[0-9a-f]{8}$")
_FOREIGN_AGE_S = 24 * 3600.0
"""A leftover of another host is reported when nothing in it changed for a day (an ingest in
flight there appends to its part files, and their mtimes move)."""


def temp_name(final: str) -> str:
    """The temporary name `final` is written under before its rename."""
    return f".{final}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _size_and_newest(path: Path) -> tuple[int, float]:
    """Bytes under `path` and the newest mtime of it and its entries."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return 0, 0.0
    if not path.is_dir() or path.is_symlink():
        return st.st_size, st.st_mtime
    size, newest = 0, st.st_mtime
    for root, _, files in os.walk(path):
        for f in files:
            try:
                fst = os.lstat(os.path.join(root, f))
            except FileNotFoundError:
                continue
            size, newest = size + fst.st_size, max(newest, fst.st_mtime)
    return size, newest


@dataclass
class Sweep:
    """What `sweep` found: leftovers removed, and others' reported for a person."""

    removed: list[Path] = field(default_factory=list)
    removed_bytes: int = 0
    foreign: list[Path] = field(default_factory=list)
    foreign_bytes: int = 0

    def lines(self, what: str) -> list[str]:
        out = []
        if self.removed:
            names = ", ".join(p.name for p in self.removed)
            out.append(
                f"removed {len(self.removed)} temporary {what} ({fmt_bytes(self.removed_bytes)}) "
                f"left by a writer on this host that died: {names}"
            )
        if self.foreign:
            out.append(
                f"{len(self.foreign)} temporary {what} ({fmt_bytes(self.foreign_bytes)}) unchanged "
                "for a day, of writers on other hosts (or of an older version): "
                f"{', '.join(str(p) for p in self.foreign)}; delete them if nothing writes there"
            )
        return out


def sweep(directory: Path, *, now: float | None = None) -> Sweep:
    """Remove the leftovers in `directory` of this host's dead writers; list other hosts'
    unchanged for `_FOREIGN_AGE_S` (`now`: the time to age them from, default the clock)."""
    found = Sweep()
    try:
        entries = list(directory.iterdir())
    except OSError:  # no cache yet (or unreadable: the run's own checks name it)
        return found
    now = time.time() if now is None else now
    for p in entries:
        m = _NAME.match(p.name)
        if m is None:
            continue
        mine = m.group("host") == _HOST
        if mine and (int(m.group("pid")) == os.getpid() or pid_alive(int(m.group("pid")))):
            continue  # a write in flight
        size, newest = _size_and_newest(p)
        if mine:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            found.removed.append(p)
            found.removed_bytes += size
        elif now - newest > _FOREIGN_AGE_S:
            found.foreign.append(p)
            found.foreign_bytes += size
    return found
