"""The sha256 of a source file, read once per cache directory rather than by every rank at
every start: what the cache key hashes (`shards.file_identity`).

`DigestMemo(<cache_dir>/digests)` keeps one JSON record per file, named by the sha256 of its
resolved path: the path, size, mtime, ctime, inode and device the file had when it was
hashed, and the digest. A record is used while the file's `stat` still shows all six;
otherwise the file is read again and the record replaced. The ctime is what keeps the key on
the content (#38: a file edited in place with its size and mtime restored by `os.utime` must
be re-tokenized): the kernel sets it to the current time on every write, truncate, rename and
`utime`, and no call sets it to a chosen value.

Racy records, as git's index has them (git's Documentation/technical/racy-git.txt): a file
changed within the same timestamp tick as the stat taken after it was hashed would keep its
ctime. So a record is written only when the stat after hashing equals the stat before it and
that moment is more than `settle_ns` (2 s: the coarsest ctime of the usual Linux filesystems,
ext3's 1 s, twice) after the file's ctime; a younger file is hashed at every start until it
settles. The rule compares the file's ctime with this host's clock: on a network filesystem
whose server runs more than `settle_ns` behind the client, a change in that window could be
missed (NFS keeps clocks within milliseconds under NTP).

Once across ranks: the hash is taken under an exclusive `flock` on the record's `.lock` file,
so ranks that start together (every rank of a node, or of every node sharing the cache
directory) wait for the first and read its record instead of reading the corpus themselves.
A lock or a record that cannot be written (a read-only cache, a full disk, a filesystem
without locks) costs only the saving: the file is hashed as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .stale_writes import temp_name

__all__ = ["DigestMemo", "content_digest"]

_SETTLE_NS = 2_000_000_000
_STAT_KEYS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def content_digest(path: Path) -> str:
    """sha256 of every byte of `path`, streamed (hashlib.file_digest: bounded memory)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stat(path: Path) -> dict[str, int]:
    st = path.stat()
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
        "dev": st.st_dev,
    }


class DigestMemo:
    """sha256 digests of files, recorded in `directory` (module docstring). One object per
    build; `hashed` lists the files this object read (the others came from records)."""

    def __init__(self, directory: Path | None, *, settle_ns: int = _SETTLE_NS):
        self.directory, self.settle_ns = directory, settle_ns
        self.hashed: list[Path] = []

    def digest(self, path: Path) -> str:
        resolved = path.resolve()
        if self.directory is None:
            return self._hash(path)
        record = self.directory / f"{hashlib.sha256(str(resolved).encode()).hexdigest()}.json"
        known = self._recorded(record, resolved)
        if known is not None:
            return known
        with self._locked(record) as usable:
            known = self._recorded(record, resolved)  # the rank that held the lock wrote it
            if known is not None:
                return known
            before = _stat(path)
            digest = self._hash(path)
            after, now = _stat(path), time.time_ns()
            if usable and before == after and now - after["ctime_ns"] > self.settle_ns:
                self._write(record, {"path": str(resolved), **after, "sha256": digest})
        return digest

    def _hash(self, path: Path) -> str:
        self.hashed.append(path)
        return content_digest(path)

    @staticmethod
    def _recorded(record: Path, resolved: Path) -> str | None:
        """The record's digest when it names this file with the stat it has now."""
        try:
            rec = json.loads(record.read_text())
            now = _stat(resolved)
        except (OSError, ValueError):
            return None  # none yet, or half-written by a writer that died: hash again
        if not isinstance(rec, dict) or rec.get("path") != str(resolved):
            return None
        if any(rec.get(k) != now[k] for k in _STAT_KEYS):
            return None
        sha = rec.get("sha256")
        return sha if isinstance(sha, str) and len(sha) == 64 else None

    @contextlib.contextmanager
    def _locked(self, record: Path) -> Iterator[bool]:
        """An exclusive flock on `record`'s `.lock` for the hash; yields whether the folder
        is usable (False: no lock and no record, every rank hashes for itself as without a
        memo)."""
        try:
            assert self.directory is not None
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(record.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield False
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:  # a filesystem without locks (ENOLCK): hash unlocked
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
            yield True
        finally:
            os.close(fd)  # (releases the lock)

    @staticmethod
    def _write(record: Path, rec: dict) -> None:
        """Write the record atomically: a reader sees the old one, or none, or this one."""
        tmp = record.with_name(temp_name(record.name))
        try:
            tmp.write_text(json.dumps(rec))
            os.replace(tmp, record)
        except OSError:  # (a full disk): no record, the next start hashes again
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
