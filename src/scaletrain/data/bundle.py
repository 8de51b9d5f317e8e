"""`build_data`: config in, a `DataBundle` out (tokenizer, train/val batches, resume state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import parse_sources

from .direct import TokenView, load_direct
from .direct import applies as direct_applies
from .eval_sets import load_or_build_eval_sets
from .loader import BatchIterator, Tokens, WindowSampler
from .shards import DIGESTS, Shards, load_or_build_shards
from .stale_writes import sweep
from .tokenizer import Tokenizer

__all__ = ["DataBundle", "build_data"]

_STATE_VERSION = 1


class DataBundle:
    """Everything the trainer needs from the data side, for one dp rank."""

    def __init__(
        self,
        cfg: DataConfig,
        shards: Shards,
        sampler: WindowSampler,
        eval_samplers: dict[str, WindowSampler] | None = None,
        notes: list[str] | None = None,
    ):
        self.cfg, self._shards, self._sampler = cfg, shards, sampler
        self._eval_samplers = eval_samplers or {}
        self.notes = notes or []
        """What `describe` adds (a mixture component too small to score on its own)."""
        self._position = 0  # next micro-step (t * grad_accum + k) when no iterator is live
        self._iterator: BatchIterator | None = None

    @property
    def tokenizer(self) -> Tokenizer:
        return self._shards.tokenizer

    @property
    def best_loss_nats(self) -> float | None:
        """Entropy rate per token of the generated corpus; None for arbitrary text."""
        return self._shards.meta["best_loss_nats"]

    @property
    def num_train_tokens(self) -> int:
        return len(self._shards.train)

    @property
    def num_val_tokens(self) -> int:
        return len(self._shards.val)

    @property
    def shard_dir(self) -> Path:
        return self._shards.directory

    def train_batches(self) -> BatchIterator:
        """Infinite (inputs, targets) micro-batches, (micro_batch, seq_len) int64 each, from the
        current position; a new call replaces (and closes) the previous iterator."""
        if self._iterator is not None:
            self._position = self._iterator.position
            self._iterator.close()
        self._iterator = BatchIterator(
            self._sampler, self._position, prefetch=self.cfg.prefetch, delay_s=self.cfg.delay_s
        )
        return self._iterator

    def val_batches(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first `n` validation micro-batches of this rank: identical on every call."""
        return [self._sampler.val_batch(i) for i in range(n)]

    @property
    def eval_names(self) -> list[str]:
        """The `data.eval_sources` names in the order given, then a mixture's components
        (each scored on its own validation part)."""
        return list(self._eval_samplers)

    def eval_batches(self, n: int) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per eval source, its first `n` micro-batches of this rank, chosen exactly as
        `val_batches` chooses them from the validation split."""
        return {name: [s.val_batch(i) for i in range(n)] for name, s in self._eval_samplers.items()}

    def state_dict(self) -> dict:
        """Position in the stream (micro-batches consumed) plus what must match on resume."""
        s = self._sampler
        position = self._iterator.position if self._iterator is not None else self._position
        step, micro_step = divmod(position, s.grad_accum)
        return {
            "version": _STATE_VERSION,
            "step": step,
            "micro_step": micro_step,
            "seed": s.seed,
            "seq_len": s.seq_len,
            "global_batch": s.global_batch,
            "shard": self._shards.directory.name,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Resume exactly where `sd` was taken. The dp degree may differ if the global batch is
        the same; a different seed, seq_len or global batch would silently change the stream,
        so those raise."""
        s = self._sampler
        for key, field, mine in (
            ("seed", "data.seed", s.seed),
            ("seq_len", "batch.seq_len", s.seq_len),
            ("global_batch", "batch.global_batch", s.global_batch),
        ):
            if sd.get(key) != mine:  # refused: the saved position means another stream
                raise ConfigError(
                    field,
                    mine,
                    f"the checkpoint's data stream was taken with {field} = {sd.get(key)!r}: "
                    "resume with the same value, or start a new run_dir (or set "
                    "checkpoint.resume=never) to train with this one",
                )
        if sd.get("shard") != self._shards.directory.name:
            raise ConfigError(
                "data.source",
                self._shards.directory.name,
                f"the checkpoint's data stream was taken on shard {sd.get('shard')!r}: the "
                "corpus or tokenizer changed; resume with the same data, or start a new run_dir",
            )
        self._position = int(sd["step"]) * s.grad_accum + int(sd["micro_step"])
        if self._iterator is not None:
            self._iterator.seek(self._position)

    def skip_steps(self, num_steps: int) -> None:
        """Jump `num_steps` optimizer steps ahead in the stream (the loss-spike guard skips the
        data window around a spike this way)."""
        position = self._iterator.position if self._iterator is not None else self._position
        self._position = position + num_steps * self._sampler.grad_accum
        if self._iterator is not None:
            self._iterator.seek(self._position)

    def describe(self) -> str:
        cfg, best = self.cfg, self.best_loss_nats
        source = (
            f"grammar ({cfg.num_tokens:,} bytes, seed {cfg.seed})"
            if cfg.source == "grammar"
            else cfg.source
        )
        best_s = f"{best:.3f} nats/token" if best is not None else "unknown (arbitrary text)"
        evals = "".join(
            f" | eval {name} {len(s.val):,} tokens" for name, s in self._eval_samplers.items()
        )
        return (
            f"data: {source} | tokenizer {self.tokenizer.name} "
            f"(vocab {self.tokenizer.vocab_size}) | tokens train {self.num_train_tokens:,} "
            f"/ val {self.num_val_tokens:,}{evals} | best loss {best_s}"
            + "".join(f" | {n}" for n in self.notes)
        )

    def close(self) -> None:
        if self._iterator is not None:
            self._position = self._iterator.position
            self._iterator.close()
            self._iterator = None

    def __enter__(self) -> DataBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_data(
    cfg: DataConfig,
    *,
    seq_len: int,
    micro_batch: int,
    grad_accum: int = 1,
    dp_rank: int = 0,
    dp_size: int = 1,
    seed: int | None = None,
    progress: bool = False,
    sweep_stale: bool = True,
) -> DataBundle:
    """Tokenize (or reuse the cached shards of) `cfg.source` and set up this rank's sampler.

    `seed` picks the sampling order (defaults to `cfg.seed`, which also seeds the grammar).
    Raises `ConfigError` naming `data.source` (or `data.num_tokens`) when the corpus cannot fill
    one batch, before tokenizing anything. `progress`: print the ingestion progress line
    (every few seconds, on stderr) while a streamed corpus is tokenized. `sweep_stale`: first
    remove what writers of this host that died left in `data.cache_dir`
    (`stale_writes.sweep`; one process per host is enough, the trainer's local rank 0), said
    in `describe`.
    """
    if min(seq_len, micro_batch, grad_accum, dp_size) < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(
            f"need seq_len, micro_batch, grad_accum, dp_size >= 1 and 0 <= dp_rank "
            f"< dp_size; got {seq_len}, {micro_batch}, {grad_accum}, {dp_size}, "
            f"{dp_rank}"
        )
    window = seq_len + 1
    need = {
        "train_need": window * micro_batch * dp_size * grad_accum,
        "val_need": window * micro_batch * dp_size,
    }
    notes = _swept(cfg) if sweep_stale else []
    shards = (
        load_direct(cfg, **need)
        if direct_applies(cfg)
        else load_or_build_shards(cfg, **need, progress=progress)
    )
    kw: dict[str, Any] = {
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "grad_accum": grad_accum,
        "dp_rank": dp_rank,
        "dp_size": dp_size,
        "seed": cfg.seed if seed is None else seed,
    }
    sampler = WindowSampler(
        shards.train, shards.val, train_mask=shards.train_mask, val_mask=shards.val_mask, **kw
    )
    eval_sets = load_or_build_eval_sets(
        cfg, shards.tokenizer, train_shard=shards.directory, seq_len=seq_len, progress=progress
    )
    # a held-out set is sampled as a validation split (`val_batch`); its train side is unused
    evals = {e.name: WindowSampler(e.tokens, e.tokens, **kw) for e in eval_sets}
    for name, part in component_val_parts(cfg, shards).items():
        if len(part) < seq_len + 1:
            notes.append(
                f"source {name}: {len(part):,} validation tokens, fewer than one window "
                f"(seq_len + 1 = {seq_len + 1}): not scored on its own"
            )
        else:
            evals[name] = WindowSampler(part, part, **kw)
    return DataBundle(cfg, shards, sampler, evals, notes)


def _swept(cfg: DataConfig) -> list[str]:
    """Leftovers of dead writers removed from the cache (shard directories, digest records),
    and other hosts' reported, as `describe` notes."""
    cache = Path(cfg.cache_dir)
    return [
        *sweep(cache).lines("shard directories in data.cache_dir"),
        *sweep(cache / DIGESTS).lines("digest records in data.cache_dir"),
    ]


def component_val_parts(cfg: DataConfig, shards: Shards) -> dict[str, Tokens]:
    """A mixture's components, each its own validation part (the validation split is the
    components' parts in `data.source` order: `corpus.build_streamed`), by component name.
    Empty for a single source, whose loss is `val_loss` itself."""
    counts = shards.meta.get("val_parts")
    if cfg.source == "grammar" or counts is None:
        return {}
    entries = parse_sources(cfg.source)
    if len(entries) < 2:
        return {}
    out: dict[str, Tokens] = {}
    start = 0
    for entry, n in zip(entries, counts, strict=True):
        out[entry.name] = _part(shards.val, start, start + n)
        start += n
    return out


def _part(tokens: Tokens, lo: int, hi: int) -> Tokens:
    """Ids [lo, hi) without reading them: a memmap slice, or a view's sub-view."""
    return tokens.sub(lo, hi) if isinstance(tokens, TokenView) else tokens[lo:hi]
