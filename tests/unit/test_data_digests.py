"""The cache key's content digests read once per cache directory (`data/digests.py`): a record
is used while the file's stat holds (a planted digest comes back: nothing was read), an edit
with size and mtime restored is read again (its ctime moved), a file younger than the settle
time is never recorded, ranks starting together read the file once between them, and a cache
that cannot be written only costs the saving."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

from scaletrain.config import DataConfig
from scaletrain.data.digests import DigestMemo
from scaletrain.data.shards import DIGESTS, load_or_build_shards

TEXT = b"the quick brown fox jumps over the lazy dog.\n" * 200


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _records(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.json"))


def test_a_record_is_used_while_the_stat_holds(tmp_path):
    f, memo_dir = tmp_path / "c.txt", tmp_path / "digests"
    f.write_bytes(TEXT)
    first = DigestMemo(memo_dir, settle_ns=0)
    assert first.digest(f) == _sha(TEXT) and first.hashed == [f]
    (record,) = _records(memo_dir)
    again = DigestMemo(memo_dir, settle_ns=0)  # the next start (or another rank)
    assert again.digest(f) == _sha(TEXT) and again.hashed == []
    rec = json.loads(record.read_text())
    record.write_text(json.dumps({**rec, "sha256": "a" * 64}))
    assert DigestMemo(memo_dir, settle_ns=0).digest(f) == "a" * 64  # the record, not the file
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))  # touched: stat moved
    touched = DigestMemo(memo_dir, settle_ns=0)
    assert touched.digest(f) == _sha(TEXT) and touched.hashed == [f]


def test_an_edit_with_size_and_mtime_restored_is_read_again(tmp_path):
    f, memo_dir = tmp_path / "c.txt", tmp_path / "digests"
    f.write_bytes(TEXT)
    DigestMemo(memo_dir, settle_ns=0).digest(f)
    recorded = json.loads(_records(memo_dir)[0].read_text())
    edited = TEXT.replace(b"fox", b"cat", 1)
    st = f.stat()
    # ctime is set to the clock's tick at each write: write until it leaves the recorded one
    while f.stat().st_ctime_ns == recorded["ctime_ns"]:
        f.write_bytes(edited)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (recorded["size"], recorded["mtime_ns"])
    memo = DigestMemo(memo_dir, settle_ns=0)
    assert memo.digest(f) == _sha(edited) and memo.hashed == [f]


def test_a_file_younger_than_the_settle_time_is_not_recorded(tmp_path):
    f, memo_dir = tmp_path / "c.txt", tmp_path / "digests"
    f.write_bytes(TEXT)
    for _ in range(2):
        memo = DigestMemo(memo_dir)  # the default 2 s: the file was written just now
        assert memo.digest(f) == _sha(TEXT) and memo.hashed == [f]
    assert _records(memo_dir) == []


def _rank(args) -> tuple[str, int]:
    path, memo_dir, barrier = args
    barrier.wait()
    memo = DigestMemo(Path(memo_dir), settle_ns=0)
    return memo.digest(Path(path)), len(memo.hashed)


def test_ranks_starting_together_read_the_file_once(tmp_path):
    f, memo_dir = tmp_path / "c.txt", tmp_path / "digests"
    f.write_bytes(TEXT * 2000)  # 9 MB: long enough to hash that the others must wait
    ctx = mp.get_context("fork")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            out = pool.map(_rank, [(str(f), str(memo_dir), barrier)] * 4)
    assert {d for d, _ in out} == {_sha(TEXT * 2000)}
    assert sum(n for _, n in out) == 1  # one rank read it; three waited and read its record


def test_a_cache_that_cannot_be_written_only_costs_the_saving(tmp_path):
    f, blocker = tmp_path / "c.txt", tmp_path / "file"
    f.write_bytes(TEXT)
    blocker.write_text("x")
    memo = DigestMemo(blocker / "digests", settle_ns=0)  # under a regular file
    assert memo.digest(f) == _sha(TEXT) and memo.hashed == [f]


def test_the_shard_key_reads_the_record_on_the_next_start(tmp_path):
    src, cache = tmp_path / "corpus.txt", tmp_path / "cache"
    src.write_bytes(TEXT)
    time.sleep(2.1)  # older than the settle time (a corpus is; a test's file is not)
    cfg = DataConfig(source=str(src), tokenizer="char", cache_dir=str(cache), val_fraction=0.1)
    first = load_or_build_shards(cfg, train_need=64, val_need=16)
    (record,) = _records(cache / DIGESTS)
    rec = json.loads(record.read_text())
    assert rec["sha256"] == _sha(TEXT) and rec["path"] == str(src.resolve())
    assert load_or_build_shards(cfg, train_need=64, val_need=16).directory == first.directory
    # a planted digest is what the next start's key hashes: the corpus was not read for it
    record.write_text(json.dumps({**rec, "sha256": "b" * 64}))
    planted = load_or_build_shards(cfg, train_need=64, val_need=16)
    assert planted.directory != first.directory
