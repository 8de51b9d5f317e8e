"""What keying the token-shard cache on content costs: the source's sha256 when it is read.

`scaletrain.data.shards.file_identity` reads every byte of every source file to key the cache
(issue 38 item 7: an edit that keeps size and mtime must rebuild), once per cache directory: a
later start (or another rank) reads the digest recorded then while the file's stat, ctime
included, holds (`scaletrain.data.digests`). This measures that read, with no record, per corpus
size, in one process on one core: the seconds of that read-and-hash (the file page-cached, just
written), and a whole cache hit (`load_or_build_shards` when the shards exist: the key, then the
shards' own sha256 verification), so the key's share of a warm start is visible. The corpus is
the project's generated grammar text, byte-tokenized (shards as large as the source).

    python benchmarks/cache_key.py [--mb 16 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(root: Path, mb: int, reps: int) -> dict:
    from scaletrain.config import load_config
    from scaletrain.data import generate_text
    from scaletrain.data.shards import file_identity, load_or_build_shards

    src = root / f"corpus-{mb}mb.txt"
    block = generate_text(1 << 20, 0).encode()
    with src.open("wb") as f:
        for _ in range(mb):
            f.write(block[: 1 << 20])
    cfg = load_config(
        None,
        [f"--data.source={src}", "--data.tokenizer=byte", f"--data.cache_dir={root / 'c'}"],
    ).data

    def load() -> None:
        load_or_build_shards(cfg, train_need=1024, val_need=1024)

    t0 = time.perf_counter()
    load()  # builds
    build_s = time.perf_counter() - t0
    key_s = _best(lambda: file_identity([src]), reps)
    hit_s = _best(load, reps)
    return {
        "mb": mb,
        "build_s": build_s,
        "key_s": key_s,
        "key_mb_per_s": mb / key_s,
        "cache_hit_s": hit_s,
        "key_share_of_hit": key_s / hit_s,
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# cache_key: what the content-keyed shard cache costs per start",
        "",
        f"best of {meta['reps']}, one process, 1 thread, page-cached files, load average "
        f"{meta['load_average'][0]:.1f} on {os.cpu_count()} shared cores.",
        "",
        "| corpus MB | first build s | content key s | key MB/s | whole cache hit s | "
        "key share of the hit |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mb']} | {r['build_s']:.2f} | {r['key_s']:.3f} | {r['key_mb_per_s']:.0f} | "
            f"{r['cache_hit_s']:.3f} | {r['key_share_of_hit']:.0%} |"
        )
    lines += [
        "",
        "Content key: `file_identity` (sha256 of every source byte, hashlib.file_digest). "
        "Whole cache hit: the key, then the cached shards' own sha256 check (byte-tokenized, "
        "so the shards are as large as the source); a cold disk reads at its own speed.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cache_key-") as tmp:
        rows = [measure(Path(tmp), mb, a.reps) for mb in a.mb]
    meta = {"reps": a.reps, "load_average": os.getloadavg()}
    md = markdown(rows, meta)
    print(md)
    write_results("cache_key", {"meta": meta, "rows": rows}, md)


if __name__ == "__main__":
    main()
