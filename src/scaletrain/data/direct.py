"""Pre-tokenized corpora trained in place: Megatron indexed datasets and datatrove `.ds` files
read memory-mapped where they lie, never copied.

A corpus tokenized on a cluster is terabytes; copying it into our own shards would double the
storage and take days. When every file of `data.source` is such a dataset (and `data.format` is
text), the loader reads windows straight from the files through a `TokenView`: the tokens
ingestion would have written (`corpus.build_streamed`: each document with the BOS/EOS it lacks,
`megatron._with_separators`; each component's last `data.val_fraction` as its validation part;
a mixture's components truncated or repeated to their token shares), in the same order, so a
run trains on exactly the windows and losses of the same corpus ingested by us.

Verification is the one our own shards get on every open (`shards.verify_shards`): recorded sizes
and sha256 checksums, no id beyond the tokenizer. On first use each file is scanned once
(sha256 of the ids and of the index, the largest id) and, where documents lack separators, the
offsets they take with them are written (`NAME.vbounds`, int64 per document boundary: 8 bytes a
document, about 0.4% of a corpus of 1,000-token documents in uint16) into
`<cache_dir>/direct-<key>/` with `meta.json`; every later open re-scans and compares. The key
hashes each file's path, size and content (`shards.file_identity`), the tokenizer and the split,
like a shard's: a file whose bytes change is a new corpus with a directory of its own. The
index structure itself is checked by `megatron.read_index` / `datatrove.read_datatrove`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import parse_sources

from .corpus import document_separators, make_tokenizer
from .datatrove import is_datatrove, read_datatrove
from .megatron import DocumentIndex, is_megatron, read_index
from .shards import Shards, check_size, publish, read_meta, saved_tokenizer, source_identity
from .tokenizer import Tokenizer

__all__ = ["TokenView", "FileTokens", "applies", "load_direct", "index_path"]

FORMAT = 1  # bump when the records or the reading rule change, so old records are not reused

_BLOCK = 1 << 20  # documents per step of the separator pass
_READ = 1 << 24  # bytes per read of the checksum pass


def applies(cfg: DataConfig) -> bool:
    """Whether `cfg.source` is trained in place: plain text format and every file a Megatron
    indexed dataset or datatrove tokenized output."""
    if cfg.source == "grammar" or cfg.format != "text":
        return False
    files = [f for e in parse_sources(cfg.source) for f in e.files]
    return bool(files) and all(is_megatron(f) or is_datatrove(f) for f in files)


def index_path(path: Path) -> Path:
    """The document index beside a dataset file (`.idx` of a Megatron `.bin`, `.ds.index`)."""
    return path.with_suffix(".idx") if is_megatron(path) else Path(f"{path}.index")


def _read(path: Path, token_dtype: str) -> DocumentIndex:
    return read_index(path) if is_megatron(path) else read_datatrove(path, token_dtype)


@dataclass
class FileTokens:
    """One file's ids as ingestion writes them: every document followed by EOS and preceded by
    BOS (when the tokenizer adds one) where it lacks them."""

    index: DocumentIndex
    data: np.ndarray
    """The file's raw ids (memmap)."""
    eos: int
    bos: int | None
    vbounds: np.ndarray | None
    """(documents + 1,) int64 offsets of the documents with their separators; None when no
    document lacks one (the file is then read as it is)."""

    def __len__(self) -> int:
        return int(self.vbounds[-1]) if self.vbounds is not None else len(self.data)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Ids [lo, hi) of the file with separators, int64."""
        if hi <= lo:
            return np.zeros(0, np.int64)
        if self.vbounds is None:
            return np.asarray(self.data[lo:hi], dtype=np.int64)
        vb = self.vbounds
        d0 = int(np.searchsorted(vb, lo, side="right")) - 1
        d1 = int(np.searchsorted(vb, hi - 1, side="right")) - 1  # the document holding hi - 1
        vstart = np.asarray(vb[d0 : d1 + 2], dtype=np.int64)  # (n + 1,) with separators
        raw = self.index.token_bounds(d0, d1 + 1)  # (n + 1,) in the file
        add_bos = self._lacks_bos(raw)  # (n,)
        pos = np.arange(lo, hi)
        doc = np.searchsorted(vstart, pos, side="right") - 1  # (hi - lo,) local document
        k = pos - vstart[doc]  # position inside the document with its separators
        src = raw[doc] + k - add_bos[doc]  # position in the file
        is_bos = add_bos[doc] & (k == 0)
        is_eos = src >= raw[doc + 1]  # past the document's last id: the EOS it lacked
        take = ~(is_bos | is_eos)
        out = np.empty(hi - lo, dtype=np.int64)
        if take.any():
            first, last = int(src[take][0]), int(src[take][-1])  # rising with pos
            chunk = np.asarray(self.data[first : last + 1], dtype=np.int64)
            out[take] = chunk[src[take] - first]
        out[is_eos] = self.eos
        if self.bos is not None:
            out[is_bos] = self.bos
        return out

    def _lacks_bos(self, raw: np.ndarray) -> np.ndarray:
        """Per document between the file offsets `raw`: whether BOS is added before it."""
        n = len(raw) - 1
        if self.bos is None:
            return np.zeros(n, dtype=bool)
        empty = raw[1:] <= raw[:-1]
        first = self.data[np.minimum(raw[:-1], max(len(self.data) - 1, 0))] if len(self.data) else 0
        return empty | (np.asarray(first) != self.bos)


@dataclass(frozen=True)
class _Segment:
    file: FileTokens
    lo: int
    hi: int


class TokenView:
    """Consecutive ranges of files read as one id sequence: what `loader.WindowSampler` slices
    (`len`, `view[a:b]` -> int64 ids) in place of a shard's memmap."""

    def __init__(self, segments: list[_Segment]):
        self._segments = [s for s in segments if s.hi > s.lo]
        lengths = [s.hi - s.lo for s in self._segments]
        self._starts = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, key: slice | int) -> np.ndarray:
        if isinstance(key, int):
            i = key + len(self) if key < 0 else key
            if not 0 <= i < len(self):
                raise IndexError(key)
            return self[i : i + 1][0]
        lo, hi, step = key.indices(len(self))
        if step != 1:
            raise ValueError("a TokenView is sliced with step 1")
        if hi <= lo:
            return np.zeros(0, np.int64)
        first = int(np.searchsorted(self._starts, lo, side="right")) - 1
        pieces = []
        for i in range(first, len(self._segments)):
            start = int(self._starts[i])
            if start >= hi:
                break
            s = self._segments[i]
            a, b = max(lo, start) - start, min(hi, int(self._starts[i + 1])) - start
            pieces.append(s.file.read(s.lo + a, s.lo + b))
        return np.concatenate(pieces)

    def __iter__(self) -> Iterator[int]:
        for lo in range(0, len(self), _BLOCK):
            yield from self[lo : lo + _BLOCK].tolist()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[0 : len(self)]
        return out if dtype is None else out.astype(dtype)

    def sub(self, lo: int, hi: int) -> TokenView:
        """Ids [lo, hi) of this view, unread."""
        out, hi = [], min(hi, len(self))
        for i, s in enumerate(self._segments):
            start, end = int(self._starts[i]), int(self._starts[i + 1])
            if end <= lo or start >= hi:
                continue
            out.append(_Segment(s.file, s.lo + max(lo - start, 0), s.lo + min(hi, end) - start))
        return TokenView(out)


def _cycle(view: TokenView, n: int) -> list[_Segment]:
    """`n` ids of `view` read from its start, repeated whole as often as needed (as
    `corpus._copy` fills a component's share)."""
    out: list[_Segment] = []
    left = n
    while left > 0 and len(view):
        take = min(left, len(view))
        out += view.sub(0, take)._segments
        left -= take
    return out


@dataclass
class _Scan:
    sha256: str
    index_sha256: str
    tokens: int
    vbounds: str | None
    vbounds_sha256: str | None


def _bad(path: Path, what: str, fix: str) -> ConfigError:
    return ConfigError("data.source", str(path), f"{what}: {fix}")


def _checksum(path: Path, index: DocumentIndex, tok: Tokenizer) -> str:
    """sha256 of the file's bytes, once every id is shown to be a tokenizer id (bounded memory:
    chunked reads, not the memmap)."""
    digest = hashlib.sha256()
    item = index.dtype.itemsize
    with open(path, "rb") as f:
        while chunk := f.read(_READ - _READ % item):
            digest.update(chunk)
            ids = np.frombuffer(chunk, dtype=index.dtype)
            if len(ids) and (int(ids.max()) >= tok.vocab_size or int(ids.min()) < 0):
                bad = int(ids.max()) if int(ids.max()) >= tok.vocab_size else int(ids.min())
                raise _bad(
                    path,
                    f"holds id {bad} but the tokenizer has {tok.vocab_size} ids",
                    "train with the tokenizer the dataset was written with (data.tokenizer)",
                )
    return digest.hexdigest()


def _file_sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            digest.update(chunk)
    return digest.hexdigest()


def _separator_offsets(ft: FileTokens, out: Path) -> bool:
    """Write the documents' offsets with their separators to `out` (int64, documents + 1, in
    blocks: memory stays bounded); False (and no file) when no document lacks one."""
    index, data, n = ft.index, ft.data, ft.index.num_documents
    added, need = 0, False
    with open(out, "wb") as f:
        for lo in range(0, n, _BLOCK):
            hi = min(lo + _BLOCK, n)
            raw = index.token_bounds(lo, hi)  # (hi - lo + 1,)
            empty = raw[1:] <= raw[:-1]
            last = data[np.maximum(raw[1:] - 1, 0)] if len(data) else np.zeros(hi - lo)
            extra = (empty | (np.asarray(last) != ft.eos)).astype(np.int64)
            extra += ft._lacks_bos(raw)
            need = need or bool(extra.any())
            shifted = raw[:-1] + added + np.concatenate(([0], np.cumsum(extra)[:-1]))
            shifted.astype(np.int64).tofile(f)
            added += int(extra.sum())
        np.array([len(data) + added], dtype=np.int64).tofile(f)
    if not need:
        out.unlink()
    return need


def _scan(path: Path, ft: FileTokens, tok: Tokenizer, directory: Path, name: str) -> _Scan:
    """First open of a file: its checksums and, where needed, its separator offsets."""
    sha = _checksum(path, ft.index, tok)
    vb_path = directory / f"{name}.vbounds"
    if _separator_offsets(ft, vb_path):
        vb = np.memmap(vb_path, dtype=np.int64, mode="r")
        return _Scan(
            sha, _file_sha(index_path(path)), int(vb[-1]), vb_path.name, _file_sha(vb_path)
        )
    return _Scan(sha, _file_sha(index_path(path)), len(ft.data), None, None)


def _verify(path: Path, ft: FileTokens, tok: Tokenizer, directory: Path, rec: dict) -> None:
    """Every later open: the file, its index and its separator offsets as first recorded."""
    changed = f"delete {directory} to record the files as they are now, or restore them"
    if _checksum(path, ft.index, tok) != rec["sha256"]:
        raise _bad(
            path, "fails the sha256 recorded when it was first opened (corrupt or changed)", changed
        )
    idx = index_path(path)
    if _file_sha(idx) != rec["index_sha256"]:
        raise _bad(
            idx, "fails the sha256 recorded when it was first opened (corrupt or changed)", changed
        )
    if rec["vbounds"] is not None:
        vb = directory / rec["vbounds"]
        if not vb.is_file() or _file_sha(vb) != rec["vbounds_sha256"]:
            raise ConfigError(
                "data.cache_dir",
                str(vb),
                f"missing or fails its sha256: the cached offsets are damaged; delete {directory}",
            )


def _open_files(
    indexes: list[list[DocumentIndex]],
    tok: Tokenizer,
    directory: Path,
    meta: dict | None,
    *,
    verify: bool = True,
) -> tuple[list[list[FileTokens]], list[dict]]:
    """Each component's files (their checked `indexes`), opened: scanned and recorded into
    `directory` when `meta` is None (first use), else verified against `meta["files"]`
    (`verify`: False right after the scan that recorded them). Returns the files per component
    and the records."""
    eos, bos = document_separators(tok)
    records = list(meta["files"]) if meta is not None else []
    parts: list[list[FileTokens]] = []
    k = 0
    for component in indexes:
        files = []
        for index in component:
            path = index.bin_path  # the .bin / .ds data.source names
            data = (
                np.memmap(index.bin_path, dtype=index.dtype, mode="r")
                if index.num_tokens
                else np.zeros(0, index.dtype)
            )
            ft = FileTokens(index, data, eos, bos, None)
            if meta is None:
                rec = asdict(_scan(path, ft, tok, directory, f"f{k}"))
                records.append({"path": str(path.resolve()), **rec})
            else:
                rec = records[k]
                if verify:
                    _verify(path, ft, tok, directory, rec)
            if rec["vbounds"] is not None:
                ft.vbounds = np.memmap(directory / rec["vbounds"], dtype=np.int64, mode="r")
            files.append(ft)
            k += 1
        parts.append(files)
    return parts, records


def _split_views(
    parts: list[list[FileTokens]], weights: list[float], val_fraction: float
) -> tuple[TokenView, TokenView, list[int]]:
    """(train, val, each component's val count): `corpus.build_streamed`'s rule on views."""
    views = [TokenView([_Segment(f, 0, len(f)) for f in files]) for files in parts]
    counts = [len(v) for v in views]
    natural = [n - int(n * val_fraction) for n in counts]
    total_train, total_w = sum(natural), sum(weights)
    train: list[_Segment] = []
    val: list[_Segment] = []
    for v, n, n_train, w in zip(views, counts, natural, weights, strict=True):
        if n == 0:
            continue
        share = n_train if len(views) == 1 else round(total_train * w / total_w)
        if n_train > 0:
            train += _cycle(v.sub(0, n_train), share)
        val += v.sub(n_train, n)._segments
    return TokenView(train), TokenView(val), [n - t for n, t in zip(counts, natural, strict=True)]


_META_KEYS = {"tokenizer": str, "vocab_size": int, "files": list}


def load_direct(cfg: DataConfig, *, train_need: int, val_need: int) -> Shards:
    """`cfg.source`'s files as train and validation views (module docstring): recorded on
    first use into `<cache_dir>/direct-<key>/`, verified on every later open."""
    if cfg.tokenizer in ("bpe", "char"):
        raise ConfigError(
            "data.tokenizer",
            cfg.tokenizer,
            "a pre-tokenized source is read with the tokenizer that wrote it: give its "
            "tokenizer.json (or its directory)",
        )
    entries = parse_sources(cfg.source)
    indexes = [[_read(f, cfg.token_dtype) for f in e.files] for e in entries]  # checked here
    # an upper bound before the scan (every document might lack BOS and EOS), exact after
    bound = sum(i.num_tokens + 2 * i.num_documents for c in indexes for i in c)
    check_size(cfg, bound, train_need=train_need, val_need=val_need, exact=False)
    identity = {**source_identity(cfg), "direct": FORMAT, "token_dtype": cfg.token_dtype}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(cfg.cache_dir) / f"direct-{key}"
    fresh = not (final / "meta.json").exists()
    if fresh:

        def fill(tmp: Path) -> None:
            tok = make_tokenizer(cfg)
            _, records = _open_files(indexes, tok, tmp, None)
            tok.save(tmp)
            meta = {
                "identity": identity,
                "tokenizer": tok.name,
                "vocab_size": tok.vocab_size,
                "files": records,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

        publish(final, fill)
    meta = read_meta(final, _META_KEYS)
    tok = saved_tokenizer(final, meta)
    parts, _ = _open_files(indexes, tok, final, meta, verify=not fresh)
    train, val, val_parts = _split_views(parts, [e.weight for e in entries], cfg.val_fraction)
    check_size(cfg, len(train) + len(val), train_need=train_need, val_need=val_need, exact=True)
    meta.update(num_train=len(train), num_val=len(val), val_parts=val_parts, best_loss_nats=None)
    return Shards(final, tok, train, val, meta)
