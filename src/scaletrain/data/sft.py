"""Supervised fine-tuning data: chat / instruction JSONL -> ids + a loss mask.

Records (one JSON object per line of `.jsonl` / `.jsonl.gz` files):
  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
  {"prompt": "...", "response": "..."}          (= one user turn and one assistant turn)

Built-in chat template (plain text, so any tokenizer encodes it):

    [BOS]System: {system}\n
    User: {user}\n
    Assistant: {assistant}[EOS]\n      <- only `{assistant}[EOS]` is trained

Every piece is tokenized on its own, so the boundary between prompt and response falls exactly
between tokens. The mask is 1 on the tokens the model must predict (each assistant reply and
the EOS that ends it) and 0 elsewhere; the loader turns masked targets into -100, which the
loss ignores, so prompt positions get exactly zero gradient. Examples are packed one after
another like documents (combine with `data.document_masking` to keep attention inside each).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import parse_sources

from .corpus import _Appender, _copy, jsonl_records
from .tokenizer import Tokenizer

__all__ = ["build_sft", "render_example", "ROLE_NAMES"]

ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}


def _messages(rec: object, where: str) -> list[tuple[str, str]]:
    if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
        out = []
        for m in rec["messages"]:
            if not (isinstance(m, dict) and m.get("role") in ROLE_NAMES
                    and isinstance(m.get("content"), str)):
                raise ConfigError("data.source", where, "each message needs a role (system, "
                                  "user or assistant) and a string content")
            out.append((m["role"], m["content"]))
        return out
    if isinstance(rec, dict) and isinstance(rec.get("prompt"), str) and isinstance(
            rec.get("response"), str):
        return [("user", rec["prompt"]), ("assistant", rec["response"])]
    raise ConfigError("data.source", where, "an SFT record needs 'messages' or 'prompt' and "
                      "'response' string fields")


def render_example(messages: list[tuple[str, str]], tok: Tokenizer
                   ) -> tuple[list[int], list[int]]:
    """(ids, mask) of one conversation in the built-in template (see the module docstring)."""
    eos = getattr(tok, "eos_id", None)
    if eos is None:
        raise ConfigError("data.tokenizer", tok.name, "SFT needs an end-of-turn token: use bpe "
                          "or a pretrained tokenizer.json")
    ids: list[int] = []
    mask: list[int] = []

    def add(piece: list[int], trained: int) -> None:
        ids.extend(piece)
        mask.extend([trained] * len(piece))

    if getattr(tok, "add_bos", False):
        add([tok.bos_id], 0)  # type: ignore[attr-defined]
    for role, content in messages:
        if role == "assistant":
            add(tok.encode("Assistant: "), 0)
            add(tok.encode(content) + [eos], 1)
            add(tok.encode("\n"), 0)
        else:
            add(tok.encode(f"{ROLE_NAMES[role]}: {content}\n"), 0)
    return ids, mask


def build_sft(cfg: DataConfig, tmp: Path, tok: Tokenizer) -> dict:
    """Write train/val ids (`*.bin`) and masks (`*.mask`, uint8) into `tmp`; the last
    `val_fraction` of the tokens (whole examples packed in order) is validation."""
    dtype = np.dtype(np.uint16 if tok.vocab_size < 65536 else np.uint32)
    ids_out, mask_out = _Appender(tmp / "all.tmp", dtype), _Appender(tmp / "mask.tmp",
                                                                      np.dtype(np.uint8))
    try:
        for entry in parse_sources(cfg.source):
            for path in entry.files:
                if not path.name.endswith((".jsonl", ".jsonl.gz")):
                    raise ConfigError("data.source", str(path), "data.format=sft reads .jsonl "
                                      "(or .jsonl.gz) files only")
                for lineno, rec in jsonl_records(path):
                    ids, mask = render_example(_messages(rec, f"{path}:{lineno}"), tok)
                    ids_out.add(np.asarray(ids, dtype=np.int64))
                    mask_out.add(np.asarray(mask, dtype=np.uint8))
    finally:
        ids_out.close()
        mask_out.close()
    n = ids_out.count
    n_val = int(n * cfg.val_fraction)
    meta: dict = {"dtype": dtype.name, "num_train": n - n_val, "num_val": n_val, "masks": True,
                  "sha256": {}, "eos_id": getattr(tok, "eos_id", None)}
    for src_path, out_dtype, suffix in ((ids_out.path, dtype, "bin"),
                                        (mask_out.path, np.dtype(np.uint8), "mask")):
        src = np.memmap(src_path, dtype=out_dtype, mode="r", shape=(n,)) if n else \
            np.zeros(0, out_dtype)
        for split, start, count in (("train", 0, n - n_val), ("val", n - n_val, n_val)):
            out, digest = _Appender(tmp / f"{split}.{suffix}", out_dtype), hashlib.sha256()
            try:
                _copy(src, start, count, out, digest)
            finally:
                out.close()
            if suffix == "bin":
                meta["sha256"][f"{split}.bin"] = digest.hexdigest()
        del src
        src_path.unlink()
    return meta
