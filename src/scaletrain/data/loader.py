"""Deterministic, resumable, rank-aware batches with a background prefetch thread.

Sampling rule (what every rank agrees on without talking):

* Training windows are `seq_len + 1` consecutive tokens of the train shard (inputs and targets
  shifted by one). The train shard is cut into `W` windows on a stride of `seq_len`, after a
  per-epoch shift in [0, seq_len) so token positions inside the context vary between epochs.
* Global sample number `n` belongs to epoch `n // W` and takes window `perm_e[n % W]`, where
  `perm_e` is a permutation drawn from `numpy.random.default_rng([seed, e])`. Each epoch visits
  every window once; any sample is computable directly from (seed, n), which makes resume exact.
* Optimizer step `t` uses global samples `[t*G, (t+1)*G)`, `G = micro_batch * dp * grad_accum`.
  Micro-step `k` of that step covers batch positions `[k*micro*dp, (k+1)*micro*dp)`, and dp rank
  `r` takes `[r*micro, (r+1)*micro)` of those. So dp=2 sees exactly the rows dp=1 sees with a
  micro-batch twice as large, in the same order (rank 0's rows first).

Validation uses the first windows of the val shard (stride `seq_len`, no shuffling, wrapping
around when asked for more), sliced over ranks the same way.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Protocol

import numpy as np
import torch

__all__ = ["WindowSampler", "BatchIterator", "Tokens"]

Batch = tuple[torch.Tensor, torch.Tensor]


class Tokens(Protocol):
    """What the sampler reads ids from: a shard's memmap, or a view of pre-tokenized files read
    in place (`direct.TokenView`)."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: slice, /) -> np.ndarray: ...


class WindowSampler:
    """Maps (micro-step index, rank) to token windows; pure and stateless apart from caches."""

    def __init__(
        self,
        train: Tokens,
        val: Tokens,
        *,
        seq_len: int,
        micro_batch: int,
        grad_accum: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        train_mask: np.ndarray | None = None,
        val_mask: np.ndarray | None = None,
    ):
        assert 0 <= dp_rank < dp_size
        self.train, self.val = train, val
        # SFT: 1 where a token is a training target (responses), 0 where not (prompts); a
        # masked target becomes -100, which the loss ignores
        self.train_mask, self.val_mask = train_mask, val_mask
        self.seq_len, self.micro_batch, self.grad_accum = seq_len, micro_batch, grad_accum
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        # Windows that fit after any shift < seq_len: shift + W*seq_len + 1 <= len(train).
        self.num_windows = max(1, (len(train) - seq_len) // seq_len)
        self.num_val_windows = max(1, (len(val) - 1) // seq_len)
        self._perm = lru_cache(maxsize=4)(self._epoch)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.dp_size * self.grad_accum

    def _epoch(self, epoch: int) -> tuple[int, np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        max_shift = min(self.seq_len - 1, len(self.train) - 1 - self.num_windows * self.seq_len)
        shift = int(rng.integers(0, max_shift + 1))
        return shift, rng.permutation(self.num_windows)

    def train_offsets(self, micro_index: int) -> np.ndarray:
        """Start offsets of this rank's rows for micro-step `micro_index` (= t*grad_accum + k)."""
        step, k = divmod(micro_index, self.grad_accum)
        first = (
            step * self.global_batch
            + k * self.micro_batch * self.dp_size
            + self.dp_rank * self.micro_batch
        )
        out = np.empty(self.micro_batch, dtype=np.int64)
        for i, n in enumerate(range(first, first + self.micro_batch)):
            shift, perm = self._perm(n // self.num_windows)
            out[i] = shift + int(perm[n % self.num_windows]) * self.seq_len
        return out

    def _gather(self, tokens: Tokens, offsets: np.ndarray, mask: np.ndarray | None = None) -> Batch:
        rows = np.stack([tokens[o : o + self.seq_len + 1] for o in offsets]).astype(np.int64)
        x = torch.from_numpy(rows)  # (micro_batch, seq_len + 1)
        targets = x[:, 1:].contiguous()
        if mask is not None:
            keep = np.stack([mask[o + 1 : o + self.seq_len + 1] for o in offsets]) != 0
            targets[~torch.from_numpy(keep)] = -100  # (micro_batch, seq_len)
        return x[:, :-1].contiguous(), targets

    def train_batch(self, micro_index: int) -> Batch:
        return self._gather(self.train, self.train_offsets(micro_index), self.train_mask)

    def val_batch(self, index: int) -> Batch:
        first = index * self.micro_batch * self.dp_size + self.dp_rank * self.micro_batch
        windows = np.arange(first, first + self.micro_batch) % self.num_val_windows
        return self._gather(self.val, windows * self.seq_len, self.val_mask)


def _produce(
    make: Callable[[int], Batch],
    start: int,
    delay_s: float,
    out: queue.Queue,
    stop: threading.Event,
) -> None:
    """Prefetch thread body: put (index, batch) pairs until told to stop.

    Holds no reference to the iterator, so an abandoned iterator can be garbage-collected (its
    finalizer then stops this thread).
    """
    index = start
    while not stop.is_set():
        try:
            if delay_s:
                time.sleep(delay_s)
            item: object = (index, make(index))
        except BaseException as e:  # hand the error to the consumer instead of dying silently
            item = e
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                break
            except queue.Full:
                continue
        if isinstance(item, BaseException):
            return
        index += 1


def _stop(thread: threading.Thread | None, stop: threading.Event, q: queue.Queue | None) -> None:
    stop.set()
    if q is not None:  # unblock a producer waiting on a full queue
        while True:
            try:
                q.get_nowait()
            except queue.Empty:
                break
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=10.0)


class BatchIterator(Iterator[Batch]):
    """Infinite iterator over this rank's training micro-batches, from micro-step `start`.

    `position` counts micro-batches handed to the caller (not those prefetched), so it is the
    exact resume point. With `prefetch > 0` a daemon thread keeps up to that many batches ready.
    """

    def __init__(self, sampler: WindowSampler, start: int, *, prefetch: int, delay_s: float):
        self._sampler, self._prefetch, self._delay_s = sampler, prefetch, delay_s
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop_event = threading.Event()
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self.position = start
        self._start_thread()

    def _start_thread(self) -> None:
        if self._prefetch <= 0:
            return
        self._stop_event = threading.Event()
        self._queue = queue.Queue(maxsize=self._prefetch)
        self._thread = threading.Thread(
            target=_produce,
            name="scaletrain-data-prefetch",
            daemon=True,
            args=(
                self._sampler.train_batch,
                self.position,
                self._delay_s,
                self._queue,
                self._stop_event,
            ),
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._thread, self._stop_event, self._queue)

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        if self._queue is None:
            if self._delay_s:
                time.sleep(self._delay_s)
            batch = self._sampler.train_batch(self.position)
        else:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            index, batch = item
            assert index == self.position, (index, self.position)
        self.position += 1
        return batch

    def seek(self, position: int) -> None:
        """Continue from micro-step `position` (drops anything prefetched)."""
        self.close()
        self._closed = False
        self.position = position
        self._start_thread()

    def close(self) -> None:
        """Stop and join the prefetch thread; idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop once
            self._finalizer = None
        self._thread, self._queue = None, None
        self._closed = True
