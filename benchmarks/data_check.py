"""What `scaletrain data check --index-only` reads and takes as a corpus grows to terabytes.

Megatron datasets whose `.bin` is a sparse file (zeros, no blocks on disk) of 1 MiB to 1 TiB
with the same index, and one with an index over the default budget (20 M sequences: 400 MB of
index), each checked index-only with 64 sampled windows of 4,096 ids; the whole check (every
id read) beside it up to `--whole-max-gib`. Bytes read are counted by the check itself
(`data.check.ByteCounter`); seconds are wall time, best of `--reps`, page-cached.

    python benchmarks/data_check.py [--whole-max-gib 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

_CODE_UINT16 = 8  # megatron-core's DType code of uint16


def make(prefix: Path, num_seq: int, bin_bytes: int, docs: int) -> Path:
    """A uint16 Megatron dataset of `num_seq` equal sequences filling a sparse `bin_bytes`."""
    seq_len = bin_bytes // 2 // num_seq
    idx = prefix.with_suffix(".idx")
    with idx.open("wb") as f:
        f.write(struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, _CODE_UINT16, num_seq, docs + 1))
        for lo in range(0, num_seq, 1 << 22):  # in blocks: bounded memory
            n = min(1 << 22, num_seq - lo)
            f.write(np.full(n, seq_len, np.int32).tobytes())
        for lo in range(0, num_seq, 1 << 22):
            n = min(1 << 22, num_seq - lo)
            f.write((np.arange(lo, lo + n, dtype=np.int64) * seq_len * 2).tobytes())
        f.write(np.linspace(0, num_seq, docs + 1).astype(np.int64).tobytes())
    with prefix.with_suffix(".bin").open("wb") as f:
        f.truncate(num_seq * seq_len * 2)
    return prefix.with_suffix(".bin")


def _timed(fn, reps: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(path: Path, *, whole: bool, reps: int) -> dict:
    from scaletrain.data.check import check_corpus

    s, r = _timed(lambda: check_corpus(str(path), sample=64, window=4096), reps)
    (rep,) = r.files
    assert rep.problem is None, rep.problem
    row = {
        "bin_bytes": rep.data_bytes,
        "index_bytes": rep.index_bytes,
        "index_checked": rep.index_checked,
        "index_only_read": r.bytes_read,
        "index_only_s": s,
        "whole_read": None,
        "whole_s": None,
    }
    if whole:
        s, r = _timed(lambda: check_corpus(str(path), index_only=False), 1)
        row.update(whole_read=r.bytes_read, whole_s=s)
    return row


def _size(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# data_check: what `data check --index-only` reads as the corpus grows",
        "",
        f"Megatron uint16 datasets, sparse `.bin`; index-only with 64 windows of 4,096 ids "
        f"(seed 0), best of {meta['reps']}, page-cached, load average "
        f"{meta['load_average'][0]:.1f} on {os.cpu_count()} shared cores.",
        "",
        "| ids (.bin) | index | index checked | index-only: read | s | whole check: read | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        whole = (
            f"{_size(r['whole_read'])} | {r['whole_s']:.2f}"
            if r["whole_read"] is not None
            else "not run | -"
        )
        lines.append(
            f"| {_size(r['bin_bytes'])} | {_size(r['index_bytes'])} | "
            f"{_size(r['index_checked'])} | {_size(r['index_only_read'])} | "
            f"{r['index_only_s']:.3f} | {whole} |"
        )
    lines += [
        "",
        "The index-only read is the header, the index (whole up to the 256 MiB budget, else "
        "seeded blocks), and the windows: the same bytes for 1 MiB and 1 TiB of ids.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--whole-max-gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="data_check-") as tmp:
        cases = [(100_000, 1 << 20, 10_000), (100_000, 1 << 30, 10_000)]
        cases += [(100_000, 1 << 40, 10_000), (20_000_000, 1 << 40, 10_000_000)]
        for i, (num_seq, size, docs) in enumerate(cases):
            path = make(Path(tmp) / f"c{i}", num_seq, size, docs)
            whole = size <= a.whole_max_gib * (1 << 30)
            rows.append(measure(path, whole=whole, reps=a.reps))
            for p in (path, path.with_suffix(".idx")):
                p.unlink()
    meta = {"reps": a.reps, "load_average": os.getloadavg()}
    md = markdown(rows, meta)
    print(md)
    write_results("data_check", {"meta": meta, "rows": rows}, md)


if __name__ == "__main__":
    main()
