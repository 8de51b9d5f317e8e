"""Tokenization on every core: batches of documents encoded in worker processes, results
written in the order the batches were read.

Why processes: a tokenizer's own threads (`tokenizers`' `encode_batch`) left ingestion at 1.4-1.8
MB/s on this project's hosts (benchmarks/results/ingest.md) with the reading, JSON decoding and
writing on one core between batches. Each worker encodes one batch on one thread
(`TOKENIZERS_PARALLELISM=false` in the workers, so N workers use N cores, not N x cores).

Determinism: batch k's ids are written before batch k+1's whatever finishes first, so the shards
and their checksums are the same for any `data.workers`. Memory: at most `2 x workers` batches
are in flight (read but not written); the reader waits for the oldest before reading more.

Workers are forked (Linux/macOS): the tokenizer object is inherited, nothing is re-imported (a
spawned worker would import torch with `scaletrain.data`, seconds per start). A worker uses
numpy and the tokenizer only, never torch, so the parent's threads do not matter to it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from typing import Any

import numpy as np

from scaletrain.config import ConfigError

from .tokenizer import Tokenizer

__all__ = ["EncodePool", "Batch", "default_workers"]

Batch = list[tuple[str, bool, bool]]
"""(text, starts a document, ends one) per piece of text."""
Sink = Callable[[np.ndarray, int], None]
"""Receives a batch's ids and the number of documents it ended."""


def default_workers() -> int:
    """The cores this process may run on (a cgroup or taskset limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def encode_rows(tok: Tokenizer, batch: Batch) -> tuple[np.ndarray, int]:
    """A batch's ids as the shards hold them: each piece's ids, preceded by BOS where a document
    starts (when the tokenizer adds one) and followed by the end-of-document separator (the
    tokenizer's EOS, else a newline) where one ends. Returns (ids, documents ended); the ids
    are uint32 (every vocabulary fits; half the bytes of int64 to send back from a worker)."""
    eos = getattr(tok, "eos_id", None)
    sep = [eos] if eos is not None else tok.encode("\n")
    bos = [tok.bos_id] if getattr(tok, "add_bos", False) else []  # type: ignore[attr-defined]
    texts = [t for t, _, _ in batch]
    encoded = (
        tok.encode_batch(texts)  # type: ignore[attr-defined]
        if hasattr(tok, "encode_batch")
        else [tok.encode(t) for t in texts]
    )
    rows: list[int] = []
    for (_, starts, ends), ids in zip(batch, encoded, strict=True):
        rows += (bos if starts else []) + ids + (sep if ends else [])
    return np.asarray(rows, dtype=np.uint32), sum(int(e) for _, _, e in batch)


_worker_tok: Tokenizer | None = None  # a worker process's tokenizer, set by _init


def _init(tok: Tokenizer) -> None:
    global _worker_tok
    _worker_tok = tok


def _work(batch: Batch) -> tuple[np.ndarray, int]:
    assert _worker_tok is not None, "the pool initializer sets it"
    return encode_rows(_worker_tok, batch)


@dataclass
class _Pending:
    result: AsyncResult
    sink: Sink
    field: str
    where: str


class EncodePool:
    """`workers` forked processes encoding batches; `submit` hands a batch and where its ids go,
    results reach their sinks in submission order. Use as a context manager."""

    def __init__(self, tok: Tokenizer, workers: int):
        assert workers >= 1
        self.workers = workers
        self._pending: deque[_Pending] = deque()
        # set while forking: the workers inherit it (one thread each, and no "forked after
        # parallelism" warning from tokenizers); the parent's own value is put back
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            self._pool: Any = mp.get_context("fork").Pool(workers, _init, (tok,))
        finally:
            if before is None:
                del os.environ["TOKENIZERS_PARALLELISM"]
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = before

    def submit(self, batch: Batch, sink: Sink, *, field: str, where: str) -> None:
        """Queue `batch` (a copy is sent); its ids go to `sink` once every earlier batch's have.
        `field` and `where` name the setting and file in a tokenization error."""
        while len(self._pending) >= 2 * self.workers:
            self._complete_oldest()
        result = self._pool.apply_async(_work, (list(batch),))
        self._pending.append(_Pending(result, sink, field, where))

    def drain(self) -> None:
        """Write every submitted batch."""
        while self._pending:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        p = self._pending.popleft()
        try:
            ids, docs = p.result.get()
        except ValueError as e:  # char-level: a character the vocabulary lacks
            raise ConfigError(p.field, p.where, f"cannot be tokenized: {e}") from None
        p.sink(ids, docs)

    def close(self) -> None:
        self._pending.clear()
        self._pool.terminate()  # after drain() nothing is running; after an error, stop it
        self._pool.join()

    def __enter__(self) -> EncodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
