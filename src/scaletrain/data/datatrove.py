"""datatrove's tokenized output (`DocumentTokenizer`, `DocumentTokenizerMerger`) as a
pre-tokenized source: `NAME.ds` files with their `NAME.ds.index`.

The format, as read from datatrove's `src/datatrove/pipeline/tokens/tokenizer.py`
(`TokenizedFile`), all little-endian:

    NAME.ds           token ids back to back, uint16 (token_size 2, the default) or uint32 (4)
    NAME.ds.index     uint64 per document: the token offset where it ends (no leading 0)
    NAME.ds.metadata  text, optional: "<tokenizer>|<token_size>", then the token count
    NAME.ds.loss      optional loss mask, one byte per token (not read: every token is trained)

The token size comes from the `.metadata` file, else from `data.token_dtype`. Checked before a
token is read, each failure one `ConfigError` naming the file: the `.ds` a whole number of ids,
the index a whole number of uint64, its ends rising and the last one the `.ds`'s token count,
the metadata's token size 2 or 4 and its count the `.ds`'s. datatrove's tokenizer appends EOS
to each document itself; the separators a document lacks are added as for a Megatron dataset
(`megatron.iter_document_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scaletrain.config import ConfigError

__all__ = ["DatatroveIndex", "is_datatrove", "read_datatrove", "parse_metadata", "bad_ds"]

_BLOCK = 1 << 20


def is_datatrove(path: Path) -> bool:
    """A `.ds` file beside its `.ds.index`."""
    return path.name.endswith(".ds") and Path(f"{path}.index").is_file()


def bad_ds(path: Path, what: str) -> ConfigError:
    """One line naming `path`, what is wrong with it and the fix (datatrove output)."""
    return ConfigError(
        "data.source",
        str(path),
        f"{what}: not datatrove tokenized output as DocumentTokenizer writes it; re-run the "
        "tokenization or check the files",
    )


@dataclass(frozen=True)
class DatatroveIndex:
    """A validated `.ds` with its `.ds.index` (memory-mapped)."""

    bin_path: Path
    dtype: np.dtype
    num_tokens: int
    ends: np.ndarray
    """uint64 token offsets where each document ends."""

    @property
    def num_documents(self) -> int:
        return len(self.ends)

    def token_bounds(self, lo: int, hi: int) -> np.ndarray:
        """Token offsets of document boundaries lo..hi (hi - lo + 1 values, int64)."""
        start = int(self.ends[lo - 1]) if lo > 0 else 0
        return np.concatenate(([start], np.asarray(self.ends[lo:hi], dtype=np.int64)))


def parse_metadata(meta: Path, text: str) -> tuple[np.dtype, int]:
    """(id dtype, token count) from the text of a `.ds.metadata` file."""
    lines = text.splitlines()
    try:
        size, count = int(lines[0].rsplit("|", 1)[1]), int(lines[1])
    except (IndexError, ValueError):
        raise bad_ds(meta, "expected '<tokenizer>|<token size>' then the token count") from None
    if size not in (2, 4):
        raise bad_ds(meta, f"token size {size} (datatrove writes 2 or 4)")
    return np.dtype(np.uint16 if size == 2 else np.uint32), count


def _token_size(path: Path, token_dtype: str) -> tuple[np.dtype, int | None]:
    meta = Path(f"{path}.metadata")
    if not meta.is_file():
        return np.dtype(token_dtype), None
    return parse_metadata(meta, meta.read_text(errors="replace"))


def read_datatrove(path: Path, token_dtype: str) -> DatatroveIndex:
    """Open and check `path` (a `.ds`) and its index (see the module docstring)."""
    dtype, count = _token_size(path, token_dtype)
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise bad_ds(path, f"{size} bytes, not a whole number of {dtype.name} ids (truncated?)")
    num_tokens = size // dtype.itemsize
    if count is not None and count != num_tokens:
        raise bad_ds(path, f"holds {num_tokens:,} ids where its .metadata counts {count:,}")
    index = Path(f"{path}.index")
    isize = index.stat().st_size
    if isize % 8:
        raise bad_ds(index, f"{isize} bytes, not a whole number of uint64 document ends")
    n = isize // 8
    ends = np.memmap(index, np.dtype("<u8"), "r", shape=(n,)) if n else np.zeros(0, np.uint64)
    if n and int(ends[-1]) != num_tokens:
        raise bad_ds(index, f"the last document ends at {int(ends[-1]):,}, not {num_tokens:,}")
    if not n and num_tokens:
        raise bad_ds(index, "no document ends for a non-empty .ds")
    for lo in range(0, n, _BLOCK):
        block = np.asarray(ends[max(lo - 1, 0) : lo + _BLOCK], dtype=np.int64)
        if (np.diff(block) < 0).any():
            raise bad_ds(index, f"the document ends fall near document {lo}")
    return DatatroveIndex(path, dtype, num_tokens, ends)
