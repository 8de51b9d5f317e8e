"""Ingestion progress: one line at most every few seconds while a large corpus is tokenized.

    tokenizing: 41.2/100.0 MB (41%) | 51,234 docs | 9,876,543 tokens | 0.35 MB/s | ETA 2m49s

Bytes are on-disk bytes of the source files (compressed bytes for `.jsonl.gz`), so the fraction
and the ETA are exact for the input as stored; MB/s is the mean rate since the start. Only the
process that asks prints (the trainer asks on rank 0 with `train.progress`); a build shorter
than the interval prints nothing at all, so small corpora (and tests) stay quiet.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "Cursor"]

MB = 2**20


class Cursor:
    """Where a document iterator is in its file (on-disk bytes read so far); the iterators of
    `corpus` update it, the progress line reads it."""

    def __init__(self) -> None:
        self.pos = 0


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Counts documents and tokens of one build; `tick()` prints when the interval has passed.

    `enabled=False` counts and prints nothing (the default for library callers)."""

    def __init__(
        self,
        total_bytes: int,
        *,
        enabled: bool,
        label: str = "tokenizing",
        every_s: float = 5.0,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_bytes, self.enabled, self.label = total_bytes, enabled, label
        self.every_s, self.out, self.clock = every_s, out, clock
        self.docs = self.tokens = 0
        self.done_bytes = 0
        """Bytes of the files already finished."""
        self.cursor = Cursor()
        """Position in the file being read."""
        self.lines = 0
        self._start = self._last = clock()

    @property
    def bytes(self) -> int:
        return self.done_bytes + self.cursor.pos

    def file_done(self, size: int) -> None:
        self.done_bytes += size
        self.cursor.pos = 0

    def line(self) -> str:
        elapsed = max(self.clock() - self._start, 1e-9)
        done, total = self.bytes, max(self.total_bytes, 1)
        rate = done / elapsed
        eta = f"ETA {_duration((total - done) / rate)}" if rate > 0 and done < total else "ETA -"
        return (
            f"{self.label}: {done / MB:.1f}/{total / MB:.1f} MB ({done / total:.0%}) | "
            f"{self.docs:,} docs | {self.tokens:,} tokens | {rate / MB:.2f} MB/s | {eta}"
        )

    def tick(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._print(self.line())

    def finish(self) -> None:
        """A closing line, only when the build was long enough to print progress."""
        if self.enabled and self.lines:
            elapsed = self.clock() - self._start
            self._print(
                f"{self.label}: done, {self.bytes / MB:.1f} MB | {self.docs:,} docs | "
                f"{self.tokens:,} tokens in {_duration(elapsed)}"
            )

    def _print(self, text: str) -> None:
        self.lines += 1
        print(text, file=self.out or sys.stderr, flush=True)
