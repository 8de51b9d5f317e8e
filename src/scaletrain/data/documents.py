"""The documents of one source file, read one at a time: `.txt` (one document, in ~1 MiB pieces
of strictly decoded UTF-8), JSONL (+ gzip), parquet and Arrow (`datasets`' save_to_disk
shards) (one document per record). Every
malformed input is one `ConfigError` naming the file, line or row, and the fix.
"""

from __future__ import annotations

import codecs
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError

from .progress import Cursor

__all__ = ["decode_utf8", "iter_documents", "jsonl_records", "not_utf8"]

_TXT_PIECE = 1 << 20


def not_utf8(path: Path, where: str, err: UnicodeDecodeError, offset: int) -> ConfigError:
    """The one error for text that is not UTF-8: the file, the byte offset and the fix."""
    return ConfigError(
        "data.source",
        f"{path}{where}",
        f"byte {offset} is not UTF-8 ({err.reason}): convert the file to UTF-8 "
        "(a single .txt source with data.tokenizer=byte keeps raw bytes)",
    )


def decode_utf8(path: Path, data: bytes) -> str:
    """`data` (the whole of `path`) as text; bytes that are not UTF-8 are refused, never
    replaced by U+FFFD (that silently changed the corpus)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise not_utf8(path, "", e, e.start) from None


def _iter_txt(path: Path, cursor: Cursor) -> Iterator[tuple[str, bool]]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    fed = 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(_TXT_PIECE)
            pending = decoder.getstate()[0]
            try:
                piece = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:  # e.start counts from the held-back bytes
                raise not_utf8(path, "", e, fed - len(pending) + e.start) from None
            fed += len(raw)
            cursor.pos = fed
            if piece:
                yield piece, False
            if not raw:
                break
    yield "", True


def _has_lone_surrogate(obj: Any) -> bool:
    """True if a string in the parsed JSON `obj` holds an unpaired surrogate (JSON's
    '\\ud800' escape parses to one; no tokenizer can encode it, UTF-8 has no bytes for it)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(obj, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_lone_surrogate(v) for v in obj)
    return False


def jsonl_records(path: Path, cursor: Cursor | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) of every non-blank line of a `.jsonl` / `.jsonl.gz` file;
    a malformed line, a line that is not UTF-8 or a corrupt gzip stream is one error naming
    `file:line`. `cursor` follows the on-disk bytes read (for the progress line)."""
    cursor = cursor or Cursor()
    lineno = 0
    try:
        with open(path, "rb") as disk:
            f: Any = gzip.GzipFile(fileobj=disk) if path.name.endswith(".gz") else disk
            for lineno, raw in enumerate(f, 1):
                cursor.pos = disk.tell()  # read-ahead included: at most one buffer early
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise not_utf8(path, f":{lineno}", e, e.start) from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(
                        "data.source",
                        f"{path}:{lineno}",
                        f"malformed JSON line ({e.msg}): fix or remove it",
                    ) from None
                if "\\u" in line and _has_lone_surrogate(record):
                    raise ConfigError(
                        "data.source",
                        f"{path}:{lineno}",
                        "a string holds a lone "
                        "UTF-16 surrogate escape (\\ud800-\\udfff), which is no "
                        "text: fix the writer of this file or remove the line",
                    )
                yield lineno, record
    except (OSError, EOFError, zlib.error) as e:  # gzip: not gzip, truncated, bad CRC
        raise ConfigError(
            "data.source",
            f"{path}:{lineno + 1}",
            f"unreadable ({' '.join(str(e).split()) or type(e).__name__}): the "
            "file is corrupt or truncated; restore or remove it",
        ) from None


def _iter_jsonl(path: Path, field: str, cursor: Cursor) -> Iterator[tuple[str, bool]]:
    for lineno, record in jsonl_records(path, cursor):
        text = record.get(field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise ConfigError(
                "data.text_field",
                f"{path}:{lineno}",
                f"the line has no string field {field!r}: set "
                "data.text_field to the key holding the text",
            )
        yield text, True


def _pyarrow(path: Path, what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - loads the submodule for _iter_parquet
    except ImportError:
        raise ConfigError(
            "data.source",
            str(path),
            f"reading {what} needs pyarrow: pip install 'scaletrain[parquet]'",
        ) from None
    return pyarrow


def _no_column(path: Path, field: str, names: list[str], what: str) -> ConfigError:
    from scaletrain.config.strict import did_you_mean

    return ConfigError(
        "data.text_field",
        f"{path}",
        f"the {what} has no column {field!r}{did_you_mean(field, names)} (columns: "
        f"{', '.join(names)})",
    )


def _texts(values: list[Any], path: Path, field: str, first_row: int) -> Iterator[tuple[str, bool]]:
    """The documents of one column batch (rows numbered from `first_row` + 1); nulls skipped."""
    for row, text in enumerate(values, first_row + 1):
        if text is None:
            continue
        if not isinstance(text, str):  # never str() a number or a list into the corpus
            raise ConfigError(
                "data.text_field",
                f"{path} row {row}",
                f"column {field!r} holds {type(text).__name__}, not text: set "
                "data.text_field to a string column",
            )
        yield text, True


def _iter_parquet(path: Path, field: str, cursor: Cursor) -> Iterator[tuple[str, bool]]:
    pq = _pyarrow(path, ".parquet").parquet
    try:
        pf = pq.ParquetFile(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(
            "data.source",
            str(path),
            f"not a readable parquet file ({' '.join(str(e).split())[:200]}): restore or remove it",
        ) from None
    if field not in pf.schema_arrow.names:
        raise _no_column(path, field, pf.schema_arrow.names, "parquet file")
    size, rows, seen = path.stat().st_size, max(1, pf.metadata.num_rows), 0
    for batch in pf.iter_batches(columns=[field], batch_size=1024):
        yield from _texts(batch.column(0).to_pylist(), path, field, seen)
        seen += batch.num_rows
        cursor.pos = size * seen // rows  # bytes pro rata of the rows read


def _iter_arrow(path: Path, field: str, cursor: Cursor) -> Iterator[tuple[str, bool]]:
    """A Hugging Face `datasets` shard (`save_to_disk`'s data-*.arrow: the Arrow IPC streaming
    format, which its ArrowWriter writes with pyarrow's RecordBatchStreamWriter), or an Arrow
    IPC file (magic "ARROW1"), memory-mapped and read one record batch at a time."""
    pa = _pyarrow(path, ".arrow")
    seen = 0
    try:
        source = pa.memory_map(str(path))
        is_file = source.read(6) == b"ARROW1"
        source.seek(0)
        if is_file:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            reader = pa.ipc.open_stream(source)
            batches = iter(reader)
        names = reader.schema.names
        if field not in names:
            raise _no_column(path, field, names, "Arrow file")
        for batch in batches:
            texts = batch.column(names.index(field)).to_pylist()
            cursor.pos = source.tell()
            yield from _texts(texts, path, field, seen)
            seen += batch.num_rows
    except ConfigError:
        raise  # (a ValueError too) already names the file and the fix
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(
            "data.source",
            f"{path} row {seen + 1}",
            f"not a readable Arrow file ({' '.join(str(e).split())[:200]}): restore or remove it",
        ) from None


def iter_documents(
    path: Path, *, text_field: str, cursor: Cursor | None = None
) -> Iterator[tuple[str, bool]]:
    """(text, ends_document) pieces of one file: JSONL, parquet and Arrow one document per row,
    any other text file one document (in pieces). `cursor` follows the on-disk bytes read."""
    name, cursor = path.name, cursor or Cursor()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return _iter_jsonl(path, text_field, cursor)
    if name.endswith(".parquet"):
        return _iter_parquet(path, text_field, cursor)
    if name.endswith(".arrow"):
        return _iter_arrow(path, text_field, cursor)
    return _iter_txt(path, cursor)
