"""The ingestion progress line: throttled to one per interval, counts that match the shard,
on-disk byte positions that reach the file size (plain and gzip), silent unless asked."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pytest

from scaletrain.config import DataConfig
from scaletrain.data import build_data
from scaletrain.data.corpus import _Appender, encode_file
from scaletrain.data.encode_pool import EncodePool
from scaletrain.data.progress import Progress
from scaletrain.data.tokenizer import ByteTokenizer


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_line_is_throttled_and_reports_rate_and_eta():
    clock, out = _Clock(), io.StringIO()
    p = Progress(10 * 2**20, enabled=True, every_s=5.0, out=out, clock=clock)
    p.docs, p.tokens, p.cursor.pos = 3, 700, 2**20
    clock.t += 4.9
    p.tick()
    assert out.getvalue() == ""  # inside the interval: nothing
    clock.t += 0.1  # 5 s since the start, 1 MiB read: 0.2 MB/s, 9 MiB left -> 45 s
    p.tick()
    assert out.getvalue() == (
        "tokenizing: 1.0/10.0 MB (10%) | 3 docs | 700 tokens | 0.20 MB/s | ETA 45s\n"
    )
    p.tick()  # same instant: throttled
    assert out.getvalue().count("\n") == 1
    p.file_done(10 * 2**20)
    clock.t += 45
    p.finish()
    assert out.getvalue().splitlines()[-1] == (
        "tokenizing: done, 10.0 MB | 3 docs | 700 tokens in 50s"
    )


def test_disabled_or_short_builds_print_nothing():
    clock, out = _Clock(), io.StringIO()
    p = Progress(100, enabled=False, every_s=0.0, out=out, clock=clock)
    clock.t += 10
    p.tick()
    p.finish()
    quick = Progress(100, enabled=True, every_s=5.0, out=out, clock=clock)
    clock.t += 1
    quick.tick()
    quick.finish()  # no progress line was printed, so no closing line either
    assert out.getvalue() == ""


class _Recording(Progress):
    """Records the byte position at every tick instead of printing."""

    seen: list[int]

    def tick(self) -> None:
        self.seen = [*getattr(self, "seen", []), self.bytes]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_counts_match_the_shard_and_bytes_reach_the_file_size(tmp_path, suffix):
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    docs = ["".join(rng.choice(letters, size=int(rng.integers(1, 600)))) for _ in range(3000)]
    body = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    path = tmp_path / f"c{suffix}"
    if suffix == ".parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.table({"text": docs}), path, row_group_size=500)
    else:
        path.write_bytes(gzip.compress(body) if suffix.endswith(".gz") else body)
    p = _Recording(path.stat().st_size, enabled=True)
    app = _Appender(tmp_path / "ids.bin", np.dtype(np.uint16))
    with EncodePool(ByteTokenizer(), 2) as pool:
        encode_file(
            path,
            ByteTokenizer(),
            app,
            text_field="text",
            token_dtype="uint16",
            progress=p,
            pool=pool,
        )
        pool.drain()  # the batches still with the workers
    app.close()
    assert p.docs == len(docs)
    assert p.tokens == app.count == sum(len(d) + 1 for d in docs)  # + "\n" per document
    seen = p.seen  # on-disk position at each tick: advances while the file is read
    assert len(seen) > 3 and seen == sorted(seen) and 0 < seen[0] < path.stat().st_size
    assert p.bytes == path.stat().st_size


def test_build_data_is_quiet_by_default(tmp_path, capfd):
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": "abc " * 50}) + "\n" for _ in range(200)))
    cfg = DataConfig(source=str(src), cache_dir=str(tmp_path / "cache"), val_fraction=0.1)
    with build_data(cfg, seq_len=16, micro_batch=2):
        pass
    assert capfd.readouterr().err == ""
