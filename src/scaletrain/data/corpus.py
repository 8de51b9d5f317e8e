"""Streamed corpus ingestion: documents -> token ids -> checksummed memmap shards.

Used for every source the whole-text path in `shards.py` does not cover: JSONL (+ gzip),
parquet, pre-tokenized `.bin`, globs, weighted mixtures, and any source with a pretrained
tokenizer (reading each format's documents: `documents.py`). Memory stays bounded whatever the
corpus size: documents are read one at a time (`.txt` files in ~1 MiB pieces), encoded in
batches of `_BATCH_DOCS` by `data.workers` processes (`encode_pool.py`: the same ids in the same
order for any number of workers) and appended to per-source part files; parts are copied into
the final `train.bin` / `val.bin` in chunks of `_COPY_TOKENS`.

Layout of the shards (what the loader reads): each document's ids, then the tokenizer's
end-of-document id (a newline for tokenizers without one: byte-level), then the next document;
a tokenizer whose config sets `add_bos_token` also gets BOS before each document. `.bin` files
are copied verbatim (nanoGPT's files already hold their separators); a Megatron dataset's
documents and datatrove's `.ds` files' get the separators they lack (`megatron.py`,
`datatrove.py`).

Train/val split: the last `val_fraction` of each source's tokens is its validation part, so
every source is represented in validation. Mixture: source i contributes `w_i / sum(w)` of the
training tokens; the total stays the corpus' own size, so a source is truncated (down-weighted)
or repeated whole and then truncated (up-weighted) to reach its share. Each component's
validation part is also scored on its own (`bundle.component_val_parts`). Megatron and datatrove
files alone are not ingested but read in place by the same rule (`direct.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import parse_sources

from .datatrove import is_datatrove, read_datatrove
from .documents import decode_utf8, iter_documents
from .encode_pool import Batch, EncodePool, default_workers
from .megatron import DocumentIndex, is_megatron, iter_document_ids, read_index
from .progress import Progress
from .tokenizer import BPETokenizer, ByteTokenizer, Tokenizer

__all__ = [
    "iter_documents",
    "build_streamed",
    "decode_utf8",
    "make_tokenizer",
    "sha256_of",
    "encode_file",
    "token_dtype_for",
    "TokenFile",
    "document_separators",
]

FORMAT = 2  # bump when the streamed layout changes, so old caches are not reused
# (2: meta records each component's validation count, `val_parts`)
_BATCH_DOCS = 256
_COPY_TOKENS = 1 << 20


def _text_files(cfg: DataConfig) -> list[Path]:
    return [
        f
        for e in parse_sources(cfg.source)
        for f in e.files
        if not f.name.endswith((".bin", ".ds"))
    ]


def _training_documents(cfg: DataConfig, progress: Progress) -> Iterator[str]:
    for f in _text_files(cfg):
        for text, ends in iter_documents(f, text_field=cfg.text_field, cursor=progress.cursor):
            progress.docs += int(ends)
            progress.tick()
            yield text
        progress.file_done(f.stat().st_size)
    progress.finish()


def make_tokenizer(cfg: DataConfig, *, progress: bool = False) -> Tokenizer:
    """The tokenizer for a streamed build (BPE is trained on the streamed documents, with a
    progress line when `progress`)."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer == "char":
        raise ConfigError(
            "data.tokenizer",
            "char",
            "char-level needs the whole text in memory: "
            "use byte, bpe or a pretrained tokenizer.json for this source",
        )
    if cfg.tokenizer == "bpe":
        tracker = Progress(
            sum(f.stat().st_size for f in _text_files(cfg)), enabled=progress, label="training BPE"
        )
        return BPETokenizer.train(_training_documents(cfg, tracker), cfg.bpe_vocab_size)
    from .pretrained import PretrainedTokenizer, resolve_tokenizer_file

    return PretrainedTokenizer(resolve_tokenizer_file(cfg.tokenizer))


class _Appender:
    """Appends id arrays to a raw file of one dtype, counting them."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype, self.count = path, dtype, 0
        self._f = open(path, "wb")  # noqa: SIM115 - closed by close()

    def add(self, ids: np.ndarray) -> None:
        np.ascontiguousarray(ids, dtype=self.dtype).tofile(self._f)
        self.count += len(ids)

    def close(self) -> None:
        self._f.close()


def encode_file(
    path: Path,
    tok: Tokenizer,
    out: _Appender,
    *,
    text_field: str,
    token_dtype: str,
    progress: Progress,
    pool: EncodePool,
    field: str = "data.source",
) -> None:
    """Append the ids of one source file to `out`: its documents, each followed by the
    end-of-document separator (and preceded by BOS when the tokenizer adds one), encoded by
    `pool`'s workers (`encode_pool.encode_rows`), or a `.bin` file's ids as they are, or the
    documents of a Megatron dataset or a datatrove `.ds` file. Documents still in the pool when
    this returns are written by `pool.drain()`, which the caller runs before closing `out`.
    `field` names the setting in errors."""
    if path.name.endswith((".bin", ".ds")):
        pool.drain()  # the ids of earlier files first: these are written here, at once
    if is_megatron(path) or is_datatrove(path):
        index = read_index(path) if is_megatron(path) else read_datatrove(path, token_dtype)
        _encode_documents(path, index, tok, out, progress=progress, field=field)
        return
    if path.name.endswith(".bin"):
        size, item = path.stat().st_size, np.dtype(token_dtype).itemsize
        if size % item:
            raise ConfigError(
                field,
                str(path),
                f"holds {size} bytes, not a whole number of {token_dtype} ids "
                "(truncated?): check data.token_dtype or restore the file",
            )
        src = TokenFile(path, token_dtype)
        for i in range(0, len(src), _COPY_TOKENS):
            chunk = src[i : i + _COPY_TOKENS]
            if len(chunk) and int(chunk.max()) >= tok.vocab_size:
                raise ConfigError(
                    field,
                    str(path),
                    f"holds id {int(chunk.max())} but the tokenizer has "
                    f"{tok.vocab_size} ids: check data.token_dtype and "
                    "data.tokenizer",
                )
            out.add(chunk)
            progress.tokens += len(chunk)
            progress.cursor.pos = (i + len(chunk)) * src.dtype.itemsize
            progress.tick()
        progress.file_done(path.stat().st_size)
        return

    def sink(ids: np.ndarray, docs: int) -> None:
        out.add(ids)
        progress.tokens += len(ids)
        progress.docs += docs
        progress.tick()

    batch: Batch = []
    starts = True
    for text, ends in iter_documents(path, text_field=text_field, cursor=progress.cursor):
        batch.append((text, starts, ends))
        starts = ends
        if len(batch) >= _BATCH_DOCS:
            pool.submit(batch, sink, field=field, where=str(path))
            batch = []
    if batch:
        pool.submit(batch, sink, field=field, where=str(path))
    progress.file_done(path.stat().st_size)


def _encode_documents(
    path: Path,
    index: DocumentIndex,
    tok: Tokenizer,
    out: _Appender,
    *,
    progress: Progress,
    field: str,
) -> None:
    """A Megatron or datatrove file's documents, with the separators they lack."""
    eos, bos = document_separators(tok)
    for ids, docs, pos in iter_document_ids(index, eos=eos, bos=bos):
        if len(ids) and (int(ids.max()) >= tok.vocab_size or int(ids.min()) < 0):
            bad = int(ids.max()) if int(ids.max()) >= tok.vocab_size else int(ids.min())
            raise ConfigError(
                field,
                str(path),
                f"holds id {bad} but the tokenizer has {tok.vocab_size} ids: train with the "
                "tokenizer the dataset was written with (data.tokenizer)",
            )
        out.add(ids)
        progress.tokens += len(ids)
        progress.docs += docs
        progress.cursor.pos = pos
        progress.tick()
    progress.file_done(path.stat().st_size)


def document_separators(tok: Tokenizer) -> tuple[int, int | None]:
    """(the id ending each document, the id starting each one or None) as text ingestion writes
    them: the tokenizer's EOS (a newline for byte-level tokenizers, which have none) and its
    BOS where its config adds one."""
    eos = getattr(tok, "eos_id", None)
    if eos is None:  # byte-level: documents end with a newline, as text ingestion ends them
        (eos,) = tok.encode("\n")
    bos = tok.bos_id if getattr(tok, "add_bos", False) else None  # type: ignore[attr-defined]
    return int(eos), bos


@dataclass
class _Part:
    path: Path
    count: int
    weight: float


class TokenFile:
    """Ids of a raw token file (or of a range of it), read in explicit chunks.

    Ingestion reads its part files and shards through this rather than `np.memmap`: every page
    a memmap touches stays mapped into the process and counts toward its resident memory (2
    bytes per uint16 token: the whole corpus, by the end of a copy or a checksum), while a
    read copies one chunk into a buffer that is freed, so resident memory stays bounded."""

    def __init__(self, path: Path, dtype: str | np.dtype, count: int | None = None, start: int = 0):
        self.path, self.dtype, self.start = path, np.dtype(dtype), start
        self.count = path.stat().st_size // self.dtype.itemsize - start if count is None else count

    def __len__(self) -> int:
        return self.count

    def part(self, lo: int, hi: int) -> TokenFile:
        """Tokens [lo, hi) of this range, unread."""
        return TokenFile(self.path, self.dtype, hi - lo, self.start + lo)

    def __getitem__(self, sl: slice) -> np.ndarray:
        lo, hi, _ = sl.indices(self.count)
        if hi <= lo:
            return np.zeros(0, self.dtype)
        return np.fromfile(
            self.path,
            dtype=self.dtype,
            count=hi - lo,
            offset=(self.start + lo) * self.dtype.itemsize,
        )


def _copy(src: TokenFile, start: int, n: int, out: _Appender, digest: Any) -> None:
    """Copy n tokens of src beginning at `start`, cycling when n exceeds what is left."""
    pos, left = start, n
    while left > 0:
        take = min(left, _COPY_TOKENS, len(src) - pos)
        chunk = np.ascontiguousarray(src[pos : pos + take], dtype=out.dtype)
        digest.update(chunk.tobytes())
        out.add(chunk)
        left -= take
        pos = pos + take if pos + take < len(src) else 0


def sha256_of(path: Path, dtype: str, count: int) -> str:
    digest = hashlib.sha256()
    arr = TokenFile(path, dtype, count)
    for i in range(0, count, _COPY_TOKENS):
        digest.update(arr[i : i + _COPY_TOKENS].tobytes())
    return digest.hexdigest()


def token_dtype_for(tok: Tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if tok.vocab_size < 65536 else np.uint32)


def build_streamed(cfg: DataConfig, tmp: Path, tok: Tokenizer, *, progress: bool = False) -> dict:
    """Write `train.bin` and `val.bin` for `cfg.source` into `tmp`; returns the meta fields
    (dtype, counts, checksums). `progress`: print the progress line (`progress.py`)."""
    dtype = token_dtype_for(tok)
    entries = parse_sources(cfg.source)
    tracker = Progress(sum(f.stat().st_size for e in entries for f in e.files), enabled=progress)
    parts = []
    with EncodePool(tok, cfg.workers or default_workers()) as pool:
        for i, entry in enumerate(entries):
            out = _Appender(tmp / f"part{i}.tmp", dtype)
            try:
                for f in entry.files:
                    encode_file(
                        f,
                        tok,
                        out,
                        text_field=cfg.text_field,
                        token_dtype=cfg.token_dtype,
                        progress=tracker,
                        pool=pool,
                    )
                pool.drain()
            finally:
                out.close()
            parts.append(_Part(out.path, out.count, entry.weight))
    tracker.finish()
    total_w = sum(p.weight for p in parts)
    train, val = _Appender(tmp / "train.bin", dtype), _Appender(tmp / "val.bin", dtype)
    train_sha, val_sha = hashlib.sha256(), hashlib.sha256()
    natural_train = [p.count - int(p.count * cfg.val_fraction) for p in parts]
    total_train = sum(natural_train)
    try:
        for p, n_train in zip(parts, natural_train, strict=True):
            if p.count == 0:
                continue
            src = TokenFile(p.path, dtype, p.count)
            share = n_train if len(parts) == 1 else round(total_train * p.weight / total_w)
            if n_train > 0:
                _copy(src.part(0, n_train), 0, share, train, train_sha)
            _copy(src, n_train, p.count - n_train, val, val_sha)
            del src
            p.path.unlink()
    finally:
        train.close()
        val.close()
    return {
        "dtype": dtype.name,
        "num_train": train.count,
        "num_val": val.count,
        "sha256": {"train.bin": train_sha.hexdigest(), "val.bin": val_sha.hexdigest()},
        "eos_id": getattr(tok, "eos_id", None),
        # each component's validation part, in order (per-source evaluation)
        "val_parts": [p.count - n for p, n in zip(parts, natural_train, strict=True)],
    }
