"""The token-shard cache is keyed on the bytes of the source, not on its mtime: a file touched
without a change reuses its shards, a file edited in place with its size and mtime restored
(os.utime) is tokenized again. Both for a whole-text source (.txt), a streamed one (JSONL) and
a held-out eval source; the shards built before are left as they were."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scaletrain.config import load_config
from scaletrain.data import build_data
from scaletrain.data.shards import file_identity, load_or_build_shards

pytestmark = pytest.mark.fault("data_cache_content")

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 200
EDITED = TEXT.replace("fox", "cat", 1)  # same length, other bytes
assert len(EDITED) == len(TEXT) and EDITED != TEXT


def _write(path: Path, text: str) -> None:
    if path.suffix == ".jsonl":
        text = json.dumps({"text": text}) + "\n"
    path.write_text(text)


def _shard_dirs(cache: Path, prefix: str) -> set[str]:
    return {p.name for p in cache.glob(f"{prefix}*") if (p / "meta.json").is_file()}


def _touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def _edit_keeping_mtime(path: Path, text: str) -> None:
    st = path.stat()
    _write(path, text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime a stat key would trust
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize(("name", "tokenizer"), [("corpus.txt", "char"), ("d.jsonl", "byte")])
def test_cache_follows_the_bytes_not_the_mtime(tmp_path, name, tokenizer):
    src, cache = tmp_path / name, tmp_path / "cache"
    _write(src, TEXT)
    cfg = load_config(
        None,
        [
            f"--data.source={src}",
            f"--data.tokenizer={tokenizer}",
            f"--data.cache_dir={cache}",
            "--data.val_fraction=0.1",
        ],
    ).data

    def load():
        return load_or_build_shards(cfg, train_need=64, val_need=16)

    first = load()
    built = _shard_dirs(cache, "text-")
    assert len(built) == 1
    meta_mtime = (first.directory / "meta.json").stat().st_mtime_ns

    _touch_later(src)  # mtime moves, bytes do not: the same shards, not rebuilt
    again = load()
    assert again.directory == first.directory and _shard_dirs(cache, "text-") == built
    assert (again.directory / "meta.json").stat().st_mtime_ns == meta_mtime

    _edit_keeping_mtime(src, EDITED)  # bytes change, size and mtime do not: rebuilt
    edited = load()
    assert edited.directory != first.directory
    assert _shard_dirs(cache, "text-") == built | {edited.directory.name}  # the old one kept
    head = edited.tokenizer.decode([int(i) for i in edited.train[:100]])
    assert "brown cat" in head, head  # the new bytes were read
    old = first.tokenizer.decode([int(i) for i in first.train[:100]])
    assert "brown fox" in old and first.directory.is_dir(), old


def test_eval_source_cache_follows_the_bytes(tmp_path):
    ev, cache = tmp_path / "held.jsonl", tmp_path / "cache"
    _write(ev, TEXT)
    cfg = load_config(
        None,
        [
            "--data.num_tokens=20000",
            f"--data.cache_dir={cache}",
            f"--data.eval_sources=held={ev}",
        ],
    ).data

    def build() -> set[str]:
        build_data(cfg, seq_len=16, micro_batch=2)
        return _shard_dirs(cache, "eval-held-")

    first = build()
    assert len(first) == 1
    _touch_later(ev)
    assert build() == first  # reused
    _edit_keeping_mtime(ev, EDITED)
    both = build()
    assert len(both) == 2 and first < both  # rebuilt, the old shard kept


def test_identity_names_path_size_and_content_digest(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"abc")
    # sha256("abc"), the FIPS 180-2 example digest
    want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_identity([f]) == [[str(f.resolve()), 3, want]]
