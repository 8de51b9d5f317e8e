"""Megatron-LM indexed datasets (`PREFIX.bin` + `PREFIX.idx`) as a pre-tokenized source.

Written by Megatron-LM's `tools/preprocess_data.py`, megatron-core's `IndexedDatasetBuilder`
and datatrove's Megatron writer. The format, as read from megatron-core's
`megatron/core/datasets/indexed_dataset.py` (`_IndexWriter` / `_IndexReader`, `DType`), all
integers little-endian:

    PREFIX.idx  b"MMIDIDX\\x00\\x00"       9 bytes of magic
                version                   uint64, always 1
                dtype code                uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                                          6 float64, 7 float32, 8 uint16
                sequence count S          uint64
                document count D          uint64 (one more than the documents: a leading 0)
                sequence lengths          int32[S]   tokens per sequence
                sequence pointers         int64[S]   byte offset of each sequence in PREFIX.bin
                document indices          int64[D]   0, then the sequence index ending each
                                                     document (the last one is S)
                (sequence modes           int8[S]    only in multimodal datasets; not read)
    PREFIX.bin  the sequences' token ids back to back, in the dtype above

Every field is checked before a token is read, each failure one `ConfigError` naming the file:
the magic, the version, an integer dtype code, the .idx size against S and D, the pointers
contiguous from 0 (as every writer lays them out; it lets the .bin be streamed in order), the
document indices rising from 0 to S, and the .bin size against the summed lengths. Ids are
checked against the tokenizer by the caller (`corpus.encode_file`), as for a nanoGPT `.bin`.

Document boundaries are kept: each document is followed by the tokenizer's end-of-document id
unless it already ends with it (`preprocess_data.py --append-eod`), and preceded by BOS when the
tokenizer adds one and the document does not start with it, so the shards match the same
corpus ingested from text and document masking sees the same documents.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from scaletrain.config import ConfigError

__all__ = [
    "DocumentIndex",
    "MegatronIndex",
    "IndexHeader",
    "HEADER_BYTES",
    "is_megatron",
    "parse_header",
    "read_index",
    "iter_document_ids",
    "bad_index",
]

MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents: 34 bytes
HEADER_BYTES = _HEADER.size
# megatron-core's DType codes; the float codes (6 float64, 7 float32) hold no token ids
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
_BLOCK = 1 << 20  # sequences or documents checked (and tokens copied) per step


class DocumentIndex(Protocol):
    """Token ids in one file with their document boundaries (Megatron's, datatrove's)."""

    @property
    def bin_path(self) -> Path: ...
    @property
    def dtype(self) -> np.dtype: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_documents(self) -> int: ...
    def token_bounds(self, lo: int, hi: int) -> np.ndarray: ...


@dataclass(frozen=True)
class MegatronIndex:
    """A validated `.idx` with its `.bin`: the arrays stay memory-mapped."""

    bin_path: Path
    idx_path: Path
    dtype: np.dtype
    num_tokens: int
    doc_ends: np.ndarray
    """Document indices (int64, memmap): 0, then the sequence index ending each document."""
    pointers: np.ndarray
    """Sequence pointers (int64, memmap): byte offsets into the .bin."""

    @property
    def num_documents(self) -> int:
        return len(self.doc_ends) - 1

    def token_bounds(self, lo: int, hi: int) -> np.ndarray:
        """Token offsets of document boundaries lo..hi (hi - lo + 1 values, int64)."""
        seq = np.asarray(self.doc_ends[lo : hi + 1])
        num_seq = len(self.pointers)
        inside = self.pointers[np.minimum(seq, num_seq - 1)] if num_seq else np.zeros_like(seq)
        end = self.num_tokens * self.dtype.itemsize  # the pointer past the last sequence
        return np.where(seq < num_seq, inside, end) // self.dtype.itemsize


def is_megatron(path: Path) -> bool:
    """A `.bin` beside a `.idx` of the same prefix is a Megatron dataset (nanoGPT's have none)."""
    return path.name.endswith(".bin") and path.with_suffix(".idx").is_file()


def bad_index(path: Path, what: str) -> ConfigError:
    """One line naming `path`, what is wrong with it and the fix (a Megatron dataset)."""
    return ConfigError(
        "data.source",
        str(path),
        f"{what}: not a Megatron indexed dataset as megatron-core writes it; rewrite it with "
        "preprocess_data.py or check the prefix",
    )


@dataclass(frozen=True)
class IndexHeader:
    """The fixed header of a `.idx`, checked against the file's size (`parse_header`)."""

    dtype: np.dtype
    num_seq: int
    num_doc: int

    @property
    def lengths_offset(self) -> int:
        return _HEADER.size

    @property
    def pointers_offset(self) -> int:
        return _HEADER.size + 4 * self.num_seq

    @property
    def documents_offset(self) -> int:
        return _HEADER.size + 12 * self.num_seq


def parse_header(idx: Path, head: bytes, size: int) -> IndexHeader:
    """The header's magic, version and integer dtype code, and the `.idx` size (`size` bytes)
    against its sequence and document counts; `head` is the file's first bytes (at least the
    34 of the header, when the file has them)."""
    if len(head) < _HEADER.size or head[:9] != MAGIC:
        raise bad_index(idx, f"the header is not {MAGIC!r}")
    _, version, code, num_seq, num_doc = _HEADER.unpack(head[: _HEADER.size])
    if version != 1:
        raise bad_index(idx, f"version {version} (only version 1 exists)")
    if code not in _DTYPES:
        raise bad_index(idx, f"dtype code {code} is not an integer id type ({sorted(_DTYPES)})")
    want = _HEADER.size + num_seq * (4 + 8) + num_doc * 8
    if size not in (want, want + num_seq):  # (+ the int8 modes of a multimodal dataset)
        raise bad_index(
            idx,
            f"{size} bytes where {num_seq:,} sequences and {num_doc:,} document indices take "
            f"{want:,} (truncated?)",
        )
    return IndexHeader(np.dtype(_DTYPES[code]), num_seq, num_doc)


def read_index(bin_path: Path) -> MegatronIndex:
    """Open and check `bin_path` and its `.idx` (see the module docstring for what is checked)."""
    idx = bin_path.with_suffix(".idx")
    size = idx.stat().st_size
    with open(idx, "rb") as f:
        head = f.read(_HEADER.size)
    h = parse_header(idx, head, size)
    dtype, num_seq, num_doc = h.dtype, h.num_seq, h.num_doc
    off = h.lengths_offset
    lengths = np.memmap(idx, np.int32, "r", off, (num_seq,)) if num_seq else np.zeros(0, np.int32)
    off = h.pointers_offset
    pointers = np.memmap(idx, np.int64, "r", off, (num_seq,)) if num_seq else np.zeros(0, np.int64)
    off = h.documents_offset
    doc_ends = np.memmap(idx, np.int64, "r", off, (num_doc,)) if num_doc else np.zeros(0, np.int64)
    num_tokens = _check_sequences(idx, lengths, pointers, dtype.itemsize)
    _check_documents(idx, doc_ends, num_seq)
    bin_size = bin_path.stat().st_size
    if bin_size != num_tokens * dtype.itemsize:
        raise bad_index(
            bin_path,
            f"{bin_size:,} bytes where the .idx lists {num_tokens:,} {dtype.name} ids "
            f"({num_tokens * dtype.itemsize:,} bytes)",
        )
    return MegatronIndex(bin_path, idx, dtype, num_tokens, doc_ends, pointers)


def _check_sequences(idx: Path, lengths: np.ndarray, pointers: np.ndarray, item: int) -> int:
    """The token count, once the lengths are >= 0 and each pointer follows the previous
    sequence (checked in blocks: memory stays bounded for billions of sequences)."""
    total = 0
    for lo in range(0, len(lengths), _BLOCK):
        n = np.asarray(lengths[lo : lo + _BLOCK], dtype=np.int64)
        if n.size and int(n.min()) < 0:
            raise bad_index(idx, f"a negative sequence length near sequence {lo}")
        expect = (total + np.concatenate(([0], np.cumsum(n)[:-1]))) * item
        bad = np.flatnonzero(np.asarray(pointers[lo : lo + _BLOCK]) != expect)
        if bad.size:
            i = lo + int(bad[0])
            raise bad_index(
                idx,
                f"sequence {i} points at byte {int(pointers[i])}, not {int(expect[bad[0]])} "
                "(sequences must lie back to back from byte 0)",
            )
        total += int(n.sum())
    return total


def _check_documents(idx: Path, doc_ends: np.ndarray, num_seq: int) -> None:
    if len(doc_ends) == 0 or int(doc_ends[0]) != 0 or int(doc_ends[-1]) != num_seq:
        raise bad_index(idx, f"the document indices must run from 0 to the {num_seq:,} sequences")
    for lo in range(0, len(doc_ends), _BLOCK):
        if (np.diff(np.asarray(doc_ends[lo : lo + _BLOCK + 1])) < 0).any():
            raise bad_index(idx, f"the document indices fall near document {lo}")


def iter_document_ids(
    index: DocumentIndex, *, eos: int | None, bos: int | None, block: int = _BLOCK
) -> Iterator[tuple[np.ndarray, int, int]]:
    """(ids, documents ended, .bin bytes read so far), in order, the documents with the
    separators added that they lack (module docstring): whole documents up to about `block`
    tokens at a time, a longer document alone in pieces, so memory stays bounded."""
    data = np.memmap(index.bin_path, index.dtype, "r") if index.num_tokens else np.zeros(0)
    item = index.dtype.itemsize
    for lo in range(0, index.num_documents, block):
        hi = min(lo + block, index.num_documents)
        bounds = index.token_bounds(lo, hi)  # (hi - lo + 1,) token offsets
        i = 0
        while i < hi - lo:
            # as many whole documents as end within `block` tokens of this one's start
            j = int(np.searchsorted(bounds, bounds[i] + block, side="right")) - 1
            j = min(max(j, i + 1), hi - lo)
            a, b = int(bounds[i]), int(bounds[j])
            if b - a <= block:
                yield _with_separators(data, bounds[i : j + 1], eos, bos), j - i, b * item
            else:  # one document longer than `block`
                for k in range(a, b, block):
                    ids = np.asarray(data[k : min(k + block, b)], dtype=np.int64)
                    if k == a and bos is not None and ids[0] != bos:
                        ids = np.concatenate(([bos], ids))
                    last = k + block >= b
                    if last and eos is not None and ids[-1] != eos:
                        ids = np.append(ids, eos)
                    yield ids, int(last), min(k + block, b) * item
            i = j


def _with_separators(
    data: np.ndarray, bounds: np.ndarray, eos: int | None, bos: int | None
) -> np.ndarray:
    """The tokens of the documents between `bounds` (token offsets), each preceded by BOS and
    followed by EOS where it lacks them (an empty document gets both)."""
    ids = np.asarray(data[int(bounds[0]) : int(bounds[-1])], dtype=np.int64)
    starts, ends = bounds[:-1] - bounds[0], bounds[1:] - bounds[0]
    n = len(starts)
    nonempty = ends > starts
    first = ids[np.minimum(starts, len(ids) - 1)] if len(ids) else np.full(n, -1)
    last = ids[np.maximum(ends - 1, 0)] if len(ids) else np.full(n, -1)
    # per document: (BOS at its start, EOS at its end), interleaved so that equal positions
    # keep document order; np.insert orders equal indices stably
    pos = np.stack([starts, ends], axis=1).reshape(-1)  # (2n,)
    val = np.tile(np.array([bos or 0, eos or 0], dtype=np.int64), n)
    lacks = np.zeros((n, 2), dtype=bool)  # (n, [BOS, EOS])
    if bos is not None:
        lacks[:, 0] = ~nonempty | (first != bos)
    if eos is not None:
        lacks[:, 1] = ~nonempty | (last != eos)
    keep = lacks.reshape(-1)  # (2n,)
    return np.insert(ids, pos[keep], val[keep])
