"""A pre-tokenized corpus checked from its index and metadata alone (`scaletrain data check`).

A corpus tokenized on a cluster (Megatron `.bin` + `.idx`, datatrove `.ds` + `.ds.index`) or
by us (a shard directory under `data.cache_dir`) is trained where it lies; the check a run
makes at its start reads every id, hours for terabytes. `check_corpus(..., index_only=True)`
reads only:

- each file's header and metadata (Megatron's magic, version and dtype code; datatrove's
  `.metadata`; a shard directory's `meta.json` and tokenizer) and its sizes from `stat`: the
  `.idx` against its counts, the `.bin` against its last sequence's pointer and length, the
  `.ds` against its last document end and the metadata's count, shard files against
  `meta.json`;
- the ends of every index: the first pointer 0, the document indices from 0 to the sequence
  count, the last document end at the token count;
- the index body (lengths >= 0, pointers back to back, document boundaries rising and in
  range): whole when the corpus' indexes together fit in `index_budget` bytes, else blocks of
  `_SPAN` entries drawn with `seed`, the budget shared between files by their index sizes;
- the id type against the tokenizer's vocabulary: a type too narrow for the vocabulary was
  written by another tokenizer (Megatron's `preprocess_data.py` and datatrove pick 2-byte ids
  only below 65,536 ids);
- with `sample` > 0, that many windows of `window` ids at positions drawn with `seed` over
  the whole corpus: every id >= 0 and below the vocabulary.

The bytes read are thus bounded by the budget, the windows and a few hundred bytes per file,
whatever the corpus' size; every read of ids and index entries goes through a `ByteCounter`
(`CheckResult.bytes_read`). Without `index_only` the check is the one a run's start makes:
the whole index structure (`megatron.read_index`, `datatrove.read_datatrove`) and every id in
range, or for a shard directory its sha256 checksums (`shards.verify_shards`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scaletrain.config import ConfigError
from scaletrain.config.sources import parse_sources, pretrained_vocab_size

from .datatrove import bad_ds, is_datatrove, parse_metadata, read_datatrove
from .megatron import HEADER_BYTES, bad_index, is_megatron, parse_header, read_index
from .shards import read_meta, shard_layout, verify_shards

__all__ = ["ByteCounter", "FileReport", "CheckResult", "check_corpus", "INDEX_BUDGET"]

INDEX_BUDGET = 256 << 20
"""Index bytes read in all by default: every index of a corpus up to ~13 M Megatron sequences
(12 bytes each, plus 8 per document) is read whole; a larger one in sampled blocks."""
_SPAN = 1 << 10  # index entries per sampled block
_CHUNK = 1 << 20  # index entries (or ids) per read when reading whole
_META_MAX = 1 << 16  # a datatrove .metadata is two short lines


@dataclass
class ByteCounter:
    """Every read the check makes of ids and index entries, counted in `bytes_read`."""

    bytes_read: int = 0

    def read(self, path: Path, offset: int, size: int) -> bytes:
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), size, offset)
        self.bytes_read += len(data)
        return data

    def array(
        self, path: Path, offset: int, count: int, dtype: np.dtype | type | str
    ) -> np.ndarray:
        dt = np.dtype(dtype)
        raw = self.read(path, offset, count * dt.itemsize)
        if len(raw) != count * dt.itemsize:  # the size was checked: it changed under us
            raise ConfigError(
                "data.source", str(path), "shrank while it was checked: check it again"
            )
        return np.frombuffer(raw, dtype=dt)


@dataclass
class FileReport:
    """One file (or shard directory) of the corpus as checked."""

    path: str
    kind: str
    """megatron, datatrove or shards."""
    dtype: str = ""
    num_tokens: int = 0
    num_documents: int | None = None
    data_bytes: int = 0
    index_bytes: int = 0
    """Bytes of the index body (the entries checked whole or in blocks)."""
    index_checked: int = 0
    """Of which were read and checked."""
    windows: int = 0
    max_id: int | None = None
    vocab_size: int | None = None
    notes: list[str] = field(default_factory=list)
    problem: str | None = None
    """One line naming the file and the fix; None when the file passed."""


@dataclass
class CheckResult:
    files: list[FileReport]
    bytes_read: int
    """Bytes of ids and index entries read (index-only: bounded whatever the corpus size)."""
    index_only: bool
    seed: int

    @property
    def corpus_bytes(self) -> int:
        return sum(f.data_bytes for f in self.files)

    @property
    def bad(self) -> list[FileReport]:
        return [f for f in self.files if f.problem is not None]


@dataclass(frozen=True)
class _Ids:
    """Ids of one file for the sampled windows: `count` of `dtype` from byte `offset`."""

    report: FileReport
    path: Path
    offset: int
    count: int
    dtype: np.dtype


def _targets(spec: str) -> list[tuple[str, Path]]:
    """(kind, path) of what `spec` names: a shard directory, or `data.source`'s files."""
    path = Path(spec)
    if path.is_dir() and (path / "meta.json").is_file():
        return [("shards", path)]
    out: list[tuple[str, Path]] = []
    for f in (f for e in parse_sources(spec) for f in e.files):
        kind = "megatron" if is_megatron(f) else "datatrove" if is_datatrove(f) else ""
        if not kind:
            raise ConfigError(
                "data.source",
                str(f),
                "not a pre-tokenized dataset (a Megatron .bin beside its .idx, a datatrove .ds "
                "beside its .ds.index, or a shard directory): text is checked as it is "
                "tokenized; give the pre-tokenized files only",
            )
        out.append((kind, f))
    if not out:
        raise ConfigError("data.source", spec, "names no pre-tokenized file")
    return out


def _index_size(kind: str, path: Path) -> int:
    if kind == "megatron":
        return path.with_suffix(".idx").stat().st_size
    return Path(f"{path}.index").stat().st_size if kind == "datatrove" else 0


def _spans(n: int, entry_bytes: int, share: float | None, rng: np.random.Generator) -> list[range]:
    """Index entries [lo, hi) to check of `n`: all when they fit in `share` bytes (or
    `share` is None), else as many blocks of `_SPAN` as fit, drawn without replacement and
    read in order."""
    if share is None or n * entry_bytes <= share:
        return [range(lo, min(lo + _CHUNK, n)) for lo in range(0, n, _CHUNK)]
    span = max(1, min(_SPAN, int(share // entry_bytes)))  # (a share under one block: less)
    blocks = -(-n // span)
    k = min(blocks, max(1, int(share // (span * entry_bytes))))
    picks = np.sort(rng.choice(blocks, size=k, replace=False))
    return [range(int(b) * span, min((int(b) + 1) * span, n)) for b in picks]


def _megatron(
    bin_path: Path,
    rep: FileReport,
    c: ByteCounter,
    share: float | None,
    rng: np.random.Generator,
) -> _Ids:
    idx = bin_path.with_suffix(".idx")
    isize, bsize = idx.stat().st_size, bin_path.stat().st_size
    h = parse_header(idx, c.read(idx, 0, HEADER_BYTES), isize)
    item, s, d = h.dtype.itemsize, h.num_seq, h.num_doc
    rep.dtype, rep.data_bytes, rep.num_documents = h.dtype.name, bsize, max(d - 1, 0)

    def ints(offset: int, lo: int, hi: int, dtype: type) -> np.ndarray:
        dt = np.dtype(dtype)
        return c.array(idx, offset + lo * dt.itemsize, hi - lo, dt).astype(np.int64)

    end = 0
    if s:
        first = int(ints(h.pointers_offset, 0, 1, np.int64)[0])
        if first != 0:
            raise bad_index(idx, f"sequence 0 points at byte {first}, not 0")
        last = int(ints(h.pointers_offset, s - 1, s, np.int64)[0])
        end = last + int(ints(h.lengths_offset, s - 1, s, np.int32)[0]) * item
    if bsize != end or bsize % item:
        raise bad_index(
            bin_path, f"{bsize:,} bytes where the .idx's last sequence ends at byte {end:,}"
        )
    if d == 0 or int(ints(h.documents_offset, 0, 1, np.int64)[0]) != 0:
        raise bad_index(idx, "the document indices must start at 0")
    if int(ints(h.documents_offset, d - 1, d, np.int64)[0]) != s:
        raise bad_index(idx, f"the document indices must end at the {s:,} sequences")
    seq_share = None if share is None else share * 12 * s / max(12 * s + 8 * d, 1)
    doc_share = None if share is None or seq_share is None else share - seq_share
    for r in _spans(s, 12, seq_share, rng):
        lengths = ints(h.lengths_offset, r.start, r.stop, np.int32)
        ptr = ints(h.pointers_offset, r.start, min(r.stop + 1, s), np.int64)
        nxt = np.append(ptr[1:], bsize) if r.stop == s else ptr[1:]
        if lengths.size and int(lengths.min()) < 0:
            raise bad_index(idx, f"a negative sequence length near sequence {r.start}")
        here = ptr[: len(lengths)]
        wrong = np.flatnonzero((nxt - here != lengths * item) | (here < 0))
        if wrong.size:
            i = r.start + int(wrong[0])
            raise bad_index(
                idx,
                f"sequence {i + 1} does not start where sequence {i} ends "
                "(sequences must lie back to back from byte 0)",
            )
        rep.index_checked += 12 * len(r)
    for r in _spans(d, 8, doc_share, rng):  # (with the entry before: no gap)
        ends = ints(h.documents_offset, max(r.start - 1, 0), r.stop, np.int64)
        if (np.diff(ends) < 0).any() or int(ends.min()) < 0 or int(ends.max()) > s:
            raise bad_index(idx, f"the document indices fall or leave 0..{s:,} near {r.start}")
        rep.index_checked += 8 * len(r)
    rep.index_bytes = 12 * s + 8 * d
    rep.num_tokens = bsize // item
    return _Ids(rep, bin_path, 0, rep.num_tokens, h.dtype)


def _datatrove(
    path: Path,
    rep: FileReport,
    c: ByteCounter,
    share: float | None,
    rng: np.random.Generator,
    token_dtype: str,
) -> _Ids:
    meta, dtype, count = Path(f"{path}.metadata"), np.dtype(token_dtype), None
    if meta.is_file():
        text = c.read(meta, 0, _META_MAX).decode("utf-8", errors="replace")
        dtype, count = parse_metadata(meta, text)
        rep.notes.append(f"written with tokenizer {text.split('|', 1)[0]!r} (.metadata)")
    size = path.stat().st_size
    rep.dtype, rep.data_bytes = dtype.name, size
    if size % dtype.itemsize:
        raise bad_ds(path, f"{size} bytes, not a whole number of {dtype.name} ids (truncated?)")
    rep.num_tokens = size // dtype.itemsize
    if count is not None and count != rep.num_tokens:
        raise bad_ds(path, f"holds {rep.num_tokens:,} ids where its .metadata counts {count:,}")
    index = Path(f"{path}.index")
    isize = index.stat().st_size
    if isize % 8:
        raise bad_ds(index, f"{isize} bytes, not a whole number of uint64 document ends")
    n = rep.num_documents = isize // 8
    if not n and rep.num_tokens:
        raise bad_ds(index, "no document ends for a non-empty .ds")
    if n and int(c.array(index, 8 * (n - 1), 1, "<u8")[0]) != rep.num_tokens:
        raise bad_ds(index, f"the last document does not end at {rep.num_tokens:,}")
    for r in _spans(n, 8, share, rng):
        lo = max(r.start - 1, 0)  # (with the entry before: no gap between blocks)
        ends = c.array(index, 8 * lo, r.stop - lo, "<u8").astype(np.int64)
        if (np.diff(ends) < 0).any() or int(ends.max()) > rep.num_tokens:
            raise bad_ds(index, f"the document ends fall or pass the ids near document {r.start}")
        rep.index_checked += 8 * len(r)
    rep.index_bytes = isize
    return _Ids(rep, path, 0, rep.num_tokens, dtype)


def _shards(final: Path, rep: FileReport, *, index_only: bool) -> list[_Ids]:
    meta = read_meta(final, {})
    if "files" in meta and "dtype" not in meta:
        raise ConfigError(
            "data.source",
            str(final),
            "holds the records of a corpus trained in place, not shards: check the corpus "
            "itself (its files are listed in this directory's meta.json)",
        )
    _, tok, files = shard_layout(final)
    if not index_only:
        verify_shards(final)  # every id file's sha256 and largest id, as a run's start
    rep.vocab_size = tok.vocab_size
    ids = {k: v for k, v in files.items() if k.endswith(".bin")}
    rep.dtype = next(iter(ids.values()))[0].name
    rep.num_tokens = sum(count for _, count in ids.values())
    rep.data_bytes = sum((final / k).stat().st_size for k in files)
    return [_Ids(rep, final / k, 0, count, dt) for k, (dt, count) in ids.items()]


def _check_ids(ids: np.ndarray, where: _Ids, position: int) -> None:
    rep, vocab = where.report, where.report.vocab_size
    if not ids.size:
        return
    low, high = int(ids.min()), int(ids.max())
    rep.max_id = high if rep.max_id is None else max(rep.max_id, high)
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        limit = f"the tokenizer has {vocab:,} ids" if vocab is not None else "ids are >= 0"
        raise ConfigError(
            "data.source",
            str(where.path),
            f"holds id {bad} near id {position:,} but {limit}: train with the tokenizer the "
            "dataset was written with (data.tokenizer), or rewrite the damaged file",
        )


def _read_all(where: _Ids, c: ByteCounter) -> None:
    item = where.dtype.itemsize
    for lo in range(0, where.count, _CHUNK):
        n = min(_CHUNK, where.count - lo)
        _check_ids(c.array(where.path, where.offset + lo * item, n, where.dtype), where, lo)


def _sample(
    regions: list[_Ids], c: ByteCounter, rng: np.random.Generator, n: int, window: int
) -> None:
    """`n` windows of `window` ids at positions drawn over all regions (in their order)."""
    regions = [r for r in regions if r.count and r.report.problem is None]
    if not regions or n <= 0:
        return
    starts = np.cumsum([0] + [r.count for r in regions])
    for pos in rng.integers(0, int(starts[-1]), size=n):
        i = int(np.searchsorted(starts, pos, side="right")) - 1
        where = regions[i]
        if where.report.problem is not None:
            continue
        lo = max(0, min(int(pos - starts[i]), where.count - window))
        hi = min(lo + window, where.count)
        item = where.dtype.itemsize
        try:
            _check_ids(
                c.array(where.path, where.offset + lo * item, hi - lo, where.dtype), where, lo
            )
        except ConfigError as e:
            where.report.problem = str(e)
        where.report.windows += 1


def _dtype_holds(rep: FileReport) -> None:
    """A type too narrow for the vocabulary: the dataset was written by another tokenizer."""
    vocab = rep.vocab_size
    if vocab is None or not rep.dtype:
        return
    top = int(np.iinfo(np.dtype(rep.dtype)).max)
    if vocab - 1 > top:
        raise ConfigError(
            "data.source",
            rep.path,
            f"its {rep.dtype} ids reach {top:,} but the tokenizer has {vocab:,} ids, so it was "
            "written with another tokenizer: give the one that wrote it (data.tokenizer)"
            + (" or its id type (data.token_dtype)" if rep.kind == "datatrove" else ""),
        )


def check_corpus(
    spec: str,
    *,
    tokenizer: str | None = None,
    token_dtype: str = "uint16",
    index_only: bool = True,
    index_budget: int = INDEX_BUDGET,
    sample: int = 0,
    window: int = 4096,
    seed: int = 0,
    counter: ByteCounter | None = None,
) -> CheckResult:
    """Check the pre-tokenized corpus `spec` names (module docstring). A file's problem is
    its report's one line; bad arguments (no such path, a text file, an unreadable tokenizer)
    raise `ConfigError` before anything is read."""
    c = counter if counter is not None else ByteCounter()
    vocab = pretrained_vocab_size(tokenizer) if tokenizer else None
    targets = _targets(spec)
    rng = np.random.default_rng(seed)
    sizes = [_index_size(kind, p) for kind, p in targets]
    total = sum(sizes)
    scale = 1.0 if total <= index_budget else index_budget / total
    reports, regions = [], []
    for (kind, path), size in zip(targets, sizes, strict=True):
        rep = FileReport(str(path), kind, vocab_size=vocab)
        reports.append(rep)
        share = size * scale if index_only else None  # (None: the whole index)
        try:
            if kind == "shards":
                mine = _shards(path, rep, index_only=index_only)
            elif kind == "megatron":
                if not index_only:
                    read_index(path)  # the whole structure, as a run's start reads it
                mine = [_megatron(path, rep, c, share, rng)]
            else:
                if not index_only:
                    read_datatrove(path, token_dtype)
                mine = [_datatrove(path, rep, c, share, rng, token_dtype)]
            _dtype_holds(rep)
            if not index_only and kind != "shards":
                for where in mine:
                    _read_all(where, c)
            regions += mine
        except ConfigError as e:
            rep.problem = str(e)
    _sample(regions, c, rng, sample, window)
    return CheckResult(reports, c.bytes_read, index_only, seed)
