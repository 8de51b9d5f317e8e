"""Held-out eval sources (`data.eval_sources`): each tokenized into its own checksummed shard.

A set is streamed exactly like a training source (`corpus.encode_file`: documents, each followed by
the end-of-document separator; `.bin` ids as they are) with the training tokenizer, into
`<cache_dir>/eval-<name>-<key>/tokens.bin` + `meta.json` (count, dtype, sha256). The key hashes the
files (path, size and the sha256 of their bytes: `shards.file_identity`), the text field, the token
dtype and the training shard's own key, which identifies the tokenizer (a trained BPE or char
vocabulary belongs to its corpus), so any change rebuilds. The shard is verified against its
checksum whenever it is opened.

The batches are those of the validation split (`loader.WindowSampler.val_batch`): the first
windows at stride `seq_len`, sliced over dp ranks, so every layout evaluates a set the way it
evaluates validation, and a set holding the validation tokens scores exactly `val_loss`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import EvalSource, parse_eval_sources

from . import corpus
from .encode_pool import EncodePool, default_workers
from .progress import Progress
from .shards import digest_memo, file_identity, publish
from .tokenizer import Tokenizer

__all__ = ["EvalSet", "load_or_build_eval_sets"]

_FIELD = "data.eval_sources"


@dataclass
class EvalSet:
    name: str
    directory: Path
    tokens: np.ndarray


def _identity(cfg: DataConfig, src: EvalSource, train_shard: str) -> dict:
    return {
        "format": corpus.FORMAT,
        "files": file_identity(list(src.files), digest_memo(cfg)),
        "text_field": cfg.text_field,
        "token_dtype": cfg.token_dtype,
        "tokenizer_of": train_shard,
    }


def _build(
    cfg: DataConfig, src: EvalSource, tok: Tokenizer, final: Path, identity: dict, progress: bool
) -> None:
    def fill(tmp: Path) -> None:
        dtype = corpus.token_dtype_for(tok)
        tracker = Progress(
            sum(f.stat().st_size for f in src.files),
            enabled=progress,
            label=f"tokenizing eval source {src.name}",
        )
        out = corpus._Appender(tmp / "tokens.bin", dtype)
        try:
            with EncodePool(tok, cfg.workers or default_workers()) as pool:
                for f in src.files:
                    corpus.encode_file(
                        f,
                        tok,
                        out,
                        text_field=cfg.text_field,
                        token_dtype=cfg.token_dtype,
                        progress=tracker,
                        pool=pool,
                        field=_FIELD,
                    )
                pool.drain()
        except ConfigError as e:  # a malformed line is reported for the setting that named it
            if e.field != "data.source":
                raise
            raise ConfigError(_FIELD, e.value, e.fix) from None
        finally:
            out.close()
        tracker.finish()
        meta = {
            "identity": identity,
            "dtype": dtype.name,
            "count": out.count,
            "sha256": corpus.sha256_of(out.path, dtype.name, out.count),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    publish(final, fill)


def _open(src: EvalSource, final: Path, *, seq_len: int) -> EvalSet:
    meta = json.loads((final / "meta.json").read_text())
    count = int(meta["count"])
    if count < seq_len + 1:
        raise ConfigError(
            _FIELD,
            f"{src.name}={src.pattern}",
            f"holds {count} tokens but one "
            f"evaluation window needs seq_len+1 = {seq_len + 1}: give more text "
            "or lower batch.seq_len",
        )
    if corpus.sha256_of(final / "tokens.bin", meta["dtype"], count) != meta["sha256"]:
        raise ConfigError(
            "data.cache_dir",
            str(final / "tokens.bin"),
            "the eval shard fails "
            "its checksum (corrupt or changed): delete this directory to rebuild",
        )
    tokens = np.memmap(final / "tokens.bin", dtype=meta["dtype"], mode="r", shape=(count,))
    return EvalSet(src.name, final, tokens)


def load_or_build_eval_sets(
    cfg: DataConfig, tok: Tokenizer, *, train_shard: Path, seq_len: int, progress: bool = False
) -> list[EvalSet]:
    """Every `data.eval_sources` set, tokenized with `tok` (the tokenizer of the training
    shard `train_shard`); cached shards are reused and verified."""
    out = []
    for src in parse_eval_sources(cfg.eval_sources):
        identity = _identity(cfg, src, train_shard.name)
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        final = Path(cfg.cache_dir) / f"eval-{src.name}-{key}"
        if not (final / "meta.json").exists():
            _build(cfg, src, tok, final, identity, progress)
        out.append(_open(src, final, seq_len=seq_len))
    return out
