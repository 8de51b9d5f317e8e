"""Token shards: the corpus tokenized once into numpy memmaps, cached under a content key.

A shard directory `<cache_dir>/<key>/` holds `train.bin`, `val.bin` (raw uint16/uint32 ids),
`meta.json` and the tokenizer's files. The key hashes the source identity (the grammar's parameters,
or each file's path, size and content: `file_identity`), the tokenizer and the split, so any change
of the bytes rebuilds and an unchanged source is reused, whatever its mtime; the digests are read
once per cache directory (`digests.py`). Directories are written under a temporary name naming
the writer's host and pid (`stale_writes.temp_name`) and renamed into place, so a reader never
sees a half-written shard, concurrent ranks that build the same shard do not corrupt each other
(the first rename wins), and what a killed writer left is removed at the next start
(`stale_writes.sweep`, from `bundle.build_data`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import parse_sources, resolve_tokenizer_file

from . import corpus, sft
from .datatrove import is_datatrove
from .digests import DigestMemo, content_digest
from .grammar import default_grammar, generate_text
from .megatron import is_megatron
from .stale_writes import temp_name
from .tokenizer import BPETokenizer, ByteTokenizer, CharTokenizer, Tokenizer, load_tokenizer

if TYPE_CHECKING:  # (the loader imports torch; shards are written without it)
    from .loader import Tokens

__all__ = [
    "Shards",
    "source_files",
    "load_or_build_shards",
    "check_size",
    "publish",
    "read_meta",
    "saved_tokenizer",
    "source_identity",
    "file_identity",
    "digest_memo",
    "DIGESTS",
    "shard_layout",
    "verify_shards",
]

_FORMAT = 2  # bump when the shard layout or the grammar changes, so old caches are not reused
# (2: whole-text shards carry sha256 checksums; byte-tokenized files are kept byte-exact)
_CHUNK_CHARS = 1 << 16
DIGESTS = "digests"
"""The folder of `data.cache_dir` holding the source files' digest records."""
_DOC_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet", ".arrow", ".bin", ".ds")


@dataclass
class Shards:
    directory: Path
    tokenizer: Tokenizer
    train: Tokens
    val: Tokens
    meta: dict
    train_mask: np.ndarray | None = None
    """SFT: 1 where the token is a training target (see `sft.py`); None for plain text."""
    val_mask: np.ndarray | None = None


def source_files(source: str) -> list[Path]:
    """The files a non-grammar source names (see `scaletrain.config.sources`)."""
    return [f for e in parse_sources(source) for f in e.files]


def streamed(cfg: DataConfig) -> bool:
    """Whether `cfg` is ingested by `corpus.build_streamed` (documents, mixtures, pretrained
    tokenizers) rather than as one text (plain .txt files with byte/char/BPE)."""
    if cfg.source == "grammar":
        return False
    if cfg.tokenizer not in ("byte", "char", "bpe") or cfg.format == "sft":
        return True
    entries = parse_sources(cfg.source)
    return (
        len(entries) > 1
        or entries[0].weight != 1.0
        or any(c in cfg.source for c in "*?[")
        or any(f.name.endswith(_DOC_SUFFIXES) for f in entries[0].files)
    )


def _file_digest(path: Path) -> str:
    return content_digest(path)[:16] if path.is_file() else ""


def digest_memo(cfg: DataConfig) -> DigestMemo:
    """The digests of `cfg`'s source files recorded in its cache (`digests.py`)."""
    return DigestMemo(Path(cfg.cache_dir) / DIGESTS)


def file_identity(paths: list[Path], memo: DigestMemo | None = None) -> list[list]:
    """What a cache key knows of source files: each one's resolved path, size and the sha256 of
    all its bytes, the bytes the build reads (text, JSONL, Parquet, Arrow, ids and their index
    or metadata files).

    Content, not mtime: a file edited in place with its size and mtime restored (os.utime) gets
    a new key, and a file merely touched keeps its key. The sha256 streams at 1.5 GB/s on one
    core of the project's 2-core host (x86 with SHA extensions, page-cached:
    benchmarks/results/cache_key.md) and at the disk's speed when cold; `memo` (the cache's
    `digests/` records: `digests.DigestMemo`) keeps it to one read per file and cache
    directory, whichever rank comes first, until the file's size, mtime, ctime or inode
    change (ctime moves on every write and every os.utime, so the edit above is still seen)."""
    memo = memo if memo is not None else DigestMemo(None)
    return [[str(p.resolve()), p.stat().st_size, memo.digest(p)] for p in paths]


def source_identity(cfg: DataConfig) -> dict:
    """What a cache directory's key hashes (module docstring): the source's files, the
    tokenizer, the split and, for streamed builds, the reading options."""
    if cfg.source == "grammar":
        src: dict = {"kind": "grammar", "num_bytes": cfg.num_tokens, "seed": cfg.seed}
    else:
        root = Path(cfg.source).resolve()
        paths = source_files(cfg.source)
        paths += [p.with_suffix(".idx") for p in paths if is_megatron(p)]  # indexes too
        trove = [p for p in paths if is_datatrove(p)]
        paths += [Path(f"{p}.index") for p in trove]
        paths += [m for p in trove if (m := Path(f"{p}.metadata")).is_file()]
        src = {"kind": "files", "root": str(root), "files": file_identity(paths, digest_memo(cfg))}
    tok: dict = {"name": cfg.tokenizer}
    if cfg.tokenizer == "bpe":
        tok["vocab_size"] = cfg.bpe_vocab_size
    identity = {
        "format": _FORMAT,
        "source": src,
        "tokenizer": tok,
        "val_fraction": cfg.val_fraction,
    }
    if streamed(cfg):
        if cfg.tokenizer not in ("byte", "char", "bpe"):
            file = resolve_tokenizer_file(cfg.tokenizer)
            tok["sha"] = [
                _file_digest(file),
                _file_digest(file.parent / "tokenizer_config.json"),
                _file_digest(file.parent / "chat_template.jinja"),
            ]
        streamed_id = {
            "format": corpus.FORMAT,
            "spec": cfg.source,
            "text_field": cfg.text_field,
            "token_dtype": cfg.token_dtype,
            "data_format": cfg.format,
        }
        if cfg.format == "sft":
            streamed_id["chat_template"] = cfg.chat_template
        identity["streamed"] = streamed_id
    return identity


def _source_bytes(cfg: DataConfig) -> int:
    if cfg.source == "grammar":
        return cfg.num_tokens
    files = source_files(cfg.source)
    return sum(p.stat().st_size for p in files) + max(0, len(files) - 1)


def check_size(
    cfg: DataConfig, num_tokens: int, *, train_need: int, val_need: int, exact: bool
) -> None:
    """Raise `ConfigError` when the train or val split cannot fill one batch.

    Before tokenizing, `num_tokens` is the byte count, an upper bound on the token count for all
    three tokenizers (each token covers at least one byte); after, it is exact.
    """
    num_val = int(num_tokens * cfg.val_fraction)
    num_train = num_tokens - num_val
    if num_train >= train_need and num_val >= val_need:
        return
    what = "tokens" if exact else "bytes (an upper bound on tokens)"
    fix = (
        f"the corpus has {num_tokens:,} {what}: {num_train:,} train / {num_val:,} val, but one "
        f"batch needs {train_need:,} train and {val_need:,} val tokens "
        "((seq_len+1) x micro_batch x dp [x grad_accum]); "
    )
    if cfg.source == "grammar":
        raise ConfigError("data.num_tokens", cfg.num_tokens, fix + "raise data.num_tokens")
    if num_tokens == 0:
        fix = "no text found: give a non-empty text file or a folder holding *.txt files"
    else:
        fix += "give more text, or lower seq_len / micro_batch, or raise data.val_fraction"
    raise ConfigError("data.source", cfg.source, fix)


def _read_text(cfg: DataConfig) -> str:
    if cfg.source == "grammar":
        return generate_text(cfg.num_tokens, cfg.seed)
    return "\n".join(corpus.decode_utf8(p, p.read_bytes()) for p in source_files(cfg.source))


def _read_bytes(cfg: DataConfig) -> bytes:
    """The source files' bytes as they are (the byte tokenizer's input: nothing is decoded, so
    nothing is replaced)."""
    return b"\n".join(p.read_bytes() for p in source_files(cfg.source))


def _chunks(text: str) -> list[str]:
    """Cut text at line ends into ~64K-character pieces (BPE trains and encodes in batches)."""
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def _tokenize(cfg: DataConfig, text: str) -> tuple[Tokenizer, np.ndarray]:
    if cfg.tokenizer == "byte":
        return ByteTokenizer(), np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    if cfg.tokenizer == "char":
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        uniq = np.unique(codes)
        tok = CharTokenizer(chr(c) for c in uniq.tolist())
        return tok, np.searchsorted(uniq, codes)  # sorted code points = the tokenizer's order
    chunks = _chunks(text)
    bpe = BPETokenizer.train(iter(chunks), cfg.bpe_vocab_size)
    ids = [np.asarray(x, dtype=np.int64) for x in bpe.encode_batch(chunks)]
    return bpe, np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)


def _write(directory: Path, name: str, ids: np.ndarray, dtype: np.dtype) -> None:
    np.ascontiguousarray(ids, dtype=dtype).tofile(directory / name)


def publish(final: Path, fill: Callable[[Path], None]) -> None:
    """Write a shard directory under a temporary name with `fill`, then rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / temp_name(final.name)  # (host and pid: `stale_writes.sweep`)
    tmp.mkdir()
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():
                raise  # not a lost race with another rank: a real error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build_streamed(
    cfg: DataConfig, final: Path, identity: dict, *, train_need: int, val_need: int, progress: bool
) -> None:
    def fill(tmp: Path) -> None:
        tok = corpus.make_tokenizer(cfg, progress=progress)
        meta = (
            sft.build_sft(cfg, tmp, tok)
            if cfg.format == "sft"
            else corpus.build_streamed(cfg, tmp, tok, progress=progress)
        )
        check_size(
            cfg,
            meta["num_train"] + meta["num_val"],
            train_need=train_need,
            val_need=val_need,
            exact=True,
        )
        tok.save(tmp)
        meta.update(
            identity=identity, tokenizer=tok.name, vocab_size=tok.vocab_size, best_loss_nats=None
        )
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    publish(final, fill)


def _build(
    cfg: DataConfig, final: Path, identity: dict, *, train_need: int, val_need: int, progress: bool
) -> None:
    if streamed(cfg):
        _build_streamed(
            cfg, final, identity, train_need=train_need, val_need=val_need, progress=progress
        )
        return
    tok: Tokenizer
    if cfg.source != "grammar" and cfg.tokenizer == "byte":
        raw = _read_bytes(cfg)
        tok, ids = ByteTokenizer(), np.frombuffer(raw, dtype=np.uint8)
        num_bytes = len(raw)
    else:
        text = _read_text(cfg)
        tok, ids = _tokenize(cfg, text)
        num_bytes = len(text.encode("utf-8"))
    check_size(cfg, len(ids), train_need=train_need, val_need=val_need, exact=True)
    num_val = int(len(ids) * cfg.val_fraction)
    num_train = len(ids) - num_val
    dtype = np.dtype(np.uint16 if tok.vocab_size < 65536 else np.uint32)
    best = None
    if cfg.source == "grammar":
        # Lossless tokenization keeps the information; it is spread over fewer (or as many)
        # tokens: per-token rate = per-byte rate x bytes per token of this corpus.
        bytes_per_token = num_bytes / len(ids)
        best = default_grammar().entropy_per_byte() * bytes_per_token
    splits = {
        "train.bin": np.ascontiguousarray(ids[:num_train], dtype=dtype),
        "val.bin": np.ascontiguousarray(ids[num_train:], dtype=dtype),
    }
    meta = {
        "identity": identity,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "num_train": num_train,
        "num_val": num_val,
        "num_bytes": num_bytes,
        "best_loss_nats": best,
        "sha256": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in splits.items()},
    }

    def fill(tmp: Path) -> None:
        for name, arr in splits.items():
            _write(tmp, name, arr, dtype)
        tok.save(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    publish(final, fill)


_META_KEYS = {
    "tokenizer": str,
    "vocab_size": int,
    "dtype": str,
    "num_train": int,
    "num_val": int,
    "sha256": dict,
}


def _damaged(path: Path, what: str) -> ConfigError:
    return ConfigError(
        "data.cache_dir",
        str(path),
        f"{what}: the cached shard is damaged; delete {path.parent} to rebuild it",
    )


def read_meta(final: Path, keys: dict[str, type]) -> dict:
    """A cache directory's meta.json, readable and holding `keys` with their types."""
    mpath = final / "meta.json"
    try:
        meta = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _damaged(mpath, f"unreadable ({type(e).__name__})") from None
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), t) for k, t in keys.items()):
        raise _damaged(mpath, f"missing or mistyped keys (needs {', '.join(keys)})")
    return meta


def saved_tokenizer(final: Path, meta: dict) -> Tokenizer:
    """The tokenizer saved in a cache directory, of the vocabulary its meta records."""
    try:
        tok = load_tokenizer(meta["tokenizer"], final)
    except Exception as e:  # noqa: BLE001 - any failure to reload is damage to name
        raise _damaged(
            final / _tokenizer_file(meta["tokenizer"]),
            f"the saved tokenizer does not load ({type(e).__name__})",
        ) from None
    if tok.vocab_size != meta["vocab_size"]:
        raise _damaged(
            final / _tokenizer_file(meta["tokenizer"]),
            f"the saved tokenizer has {tok.vocab_size} ids, the shards were built "
            f"with {meta['vocab_size']}",
        )
    return tok


def shard_layout(final: Path) -> tuple[dict, Tokenizer, dict[str, tuple[np.dtype, int]]]:
    """A cached shard directory's meta, tokenizer and id files ({name: (dtype, count)}), once
    meta is readable with its keys, each file has its recorded size and the saved tokenizer
    has the vocabulary the shards were built with: everything short of reading the ids."""
    mpath = final / "meta.json"
    meta = read_meta(final, _META_KEYS)
    try:
        dtype = np.dtype(meta["dtype"])
    except TypeError:
        raise _damaged(mpath, f"unknown id dtype {meta['dtype']!r}") from None
    tok = saved_tokenizer(final, meta)
    files = {"train.bin": (dtype, meta["num_train"]), "val.bin": (dtype, meta["num_val"])}
    if meta.get("masks"):
        mask = np.dtype(np.uint8)
        files.update({"train.mask": (mask, meta["num_train"]), "val.mask": (mask, meta["num_val"])})
    for name, (dt, count) in files.items():
        path = final / name
        size = path.stat().st_size if path.is_file() else None
        if size != count * dt.itemsize:
            raise _damaged(
                path,
                "missing"
                if size is None
                else f"{size} bytes where {count * dt.itemsize} were written (truncated or "
                "appended to)",
            )
    return meta, tok, files


def verify_shards(final: Path) -> tuple[dict, Tokenizer]:
    """The cached shard directory's meta and tokenizer, once every file is shown intact:
    `shard_layout`'s checks, then each id file's sha256 (no id beyond the vocabulary). Any
    damage is one `ConfigError` naming the file, never a memmap traceback or garbage trained."""
    meta, tok, files = shard_layout(final)
    for name, (dt, count) in files.items():
        path = final / name
        want = meta["sha256"].get(name)
        if want is None:
            continue
        digest, top = _digest(path, dt, count)
        if digest != want:
            raise _damaged(path, "fails its sha256 checksum (corrupt or changed)")
        if not name.endswith(".mask") and top >= meta["vocab_size"]:
            raise _damaged(path, f"holds id {top}, beyond the tokenizer's {meta['vocab_size']}")
    return meta, tok


def _tokenizer_file(name: str) -> str:
    """The file a shard directory's tokenizer is saved in (for error messages)."""
    files = {"char": CharTokenizer._FILE, "bpe": BPETokenizer._FILE}
    return files.get(name, "tokenizer.json")


def _digest(path: Path, dtype: np.dtype, count: int) -> tuple[str, int]:
    """sha256 of the first `count` ids of `path`, and the largest id (-1 when empty)."""
    digest, top = hashlib.sha256(), -1
    arr = corpus.TokenFile(path, dtype, count)  # chunked reads: resident memory stays bounded
    for i in range(0, count, 1 << 20):
        chunk = arr[i : i + (1 << 20)]
        digest.update(chunk.tobytes())
        top = max(top, int(chunk.max()))
    return digest.hexdigest(), top


def load_or_build_shards(
    cfg: DataConfig, *, train_need: int, val_need: int, progress: bool = False
) -> Shards:
    """Open the cached shards for `cfg`, building them first when absent (streamed builds
    print a progress line every few seconds when `progress`: see `progress.py`)."""
    check_size(cfg, _source_bytes(cfg), train_need=train_need, val_need=val_need, exact=False)
    identity = source_identity(cfg)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(cfg.cache_dir) / f"{cfg.source if cfg.source == 'grammar' else 'text'}-{key}"
    if not (final / "meta.json").exists():
        _build(cfg, final, identity, train_need=train_need, val_need=val_need, progress=progress)
    meta, tok = verify_shards(final)
    check_size(
        cfg,
        meta["num_train"] + meta["num_val"],
        train_need=train_need,
        val_need=val_need,
        exact=True,
    )

    def open_(name: str, count: int) -> np.ndarray:
        return np.memmap(final / name, dtype=meta["dtype"], mode="r", shape=(count,))

    masks: dict[str, np.ndarray | None] = {"train": None, "val": None}
    if meta.get("masks"):
        for split in masks:
            masks[split] = np.memmap(
                final / f"{split}.mask", dtype=np.uint8, mode="r", shape=(meta[f"num_{split}"],)
            )
    return Shards(
        final,
        tok,
        open_("train.bin", meta["num_train"]),
        open_("val.bin", meta["num_val"]),
        meta,
        masks["train"],
        masks["val"],
    )
