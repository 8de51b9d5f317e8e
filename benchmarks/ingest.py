"""Ingestion throughput and peak memory: a JSONL corpus -> checksummed token shards.

Writes a synthetic JSONL corpus (documents of scaletrain's generated grammar, lines shuffled, so
the text is realistic-ish English and any size can be made without a download), trains a
byte-level BPE `tokenizer.json` (vocab 8192) on a 2 MB sample, then runs the streamed build
(`scaletrain.data.build_data` with that tokenizer, `data.source = corpus.jsonl`) in a fresh
process per corpus size and reports tokens/s of ingestion and that process's peak RSS
(`ru_maxrss`, the ingesting process and its largest worker). Two sizes (`--small-mb` and
`--mb`, 4 and 100 MB by default) show whether memory grows with the corpus: the streamed path
holds at most 2 x workers batches of 256 documents and 1 Mi-token copy chunks, so it should not.

Each size is ingested with 1 and with 2 workers (`data.workers`: one tokenizer thread per worker
process), side by side in the same run, alternating which goes first, and the shards of the two
are compared byte for byte. The reference is `tokenizers`' own `encode_batch` of the same
tokenizer on one core (`TOKENIZERS_PARALLELISM=false`, a fresh process, the documents already in
memory): tokens per CPU-second of encoding alone, the most ingestion could reach per core.

    OMP_NUM_THREADS=1 python benchmarks/ingest.py [--mb 100] [--small-mb 4]

The ingesting process prints the progress line (`scaletrain.data.progress`) on stderr.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402


def make_corpus(path: Path, num_bytes: int, seed: int = 0) -> int:
    import numpy as np

    from scaletrain.data import generate_text

    lines = [s for s in generate_text(2_000_000, seed).splitlines() if s.strip()]
    rng = np.random.default_rng(seed)
    written, docs = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < num_bytes:
            idx = rng.integers(0, len(lines), size=int(rng.integers(1, 8)))
            line = json.dumps({"text": " ".join(lines[i] for i in idx)}) + "\n"
            f.write(line)
            written += len(line)
            docs += 1
    return docs


def make_tokenizer(out: Path, sample: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    with open(sample, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 4000:
                break
            texts.append(json.loads(line)["text"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=8192,
            special_tokens=["<|endoftext|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return out


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the pool's workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _ingest(corpus: str, tokenizer: str, cache: str, workers: int, q) -> None:
    from scaletrain.config import DataConfig
    from scaletrain.data import build_data

    t0, c0 = time.perf_counter(), _cpu_s()
    cfg = DataConfig(source=corpus, tokenizer=tokenizer, cache_dir=cache, workers=workers)
    with build_data(cfg, seq_len=1024, micro_batch=1, progress=True) as data:
        tokens = data.num_train_tokens + data.num_val_tokens
        shard = str(data.shard_dir)
    wall = time.perf_counter() - t0
    # CPU seconds (all processes, from the start of the build): the figure that machine load
    # from other processes does not inflate, unlike the wall time on a shared 2-core machine
    q.put(
        {
            "workers": workers,
            "tokens": tokens,
            "wall_s": wall,
            "cpu_s": _cpu_s() - c0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "shard": shard,
        }
    )


def _fresh_process(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    out = q.get()
    p.join()
    return out


def _encode_batch(corpus: str, tokenizer: str, max_docs: int, q) -> None:
    """`tokenizers`' encode_batch on one thread: tokens per CPU-second of encoding alone."""
    import os

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before the first encode: one thread
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    with open(corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(max_docs), f, strict=False)]
    tokens = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(0, len(texts), 256):  # the batch ingestion uses
        tokens += sum(len(e.ids) for e in tok.encode_batch(texts[i : i + 256]))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    q.put({"docs": len(texts), "tokens": tokens, "cpu_s": cpu, "wall_s": wall})


def _same_shards(a: str, b: str) -> bool:
    names = ("train.bin", "val.bin")
    return all((Path(a) / n).read_bytes() == (Path(b) / n).read_bytes() for n in names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--small-mb", type=float, default=4.0)
    args = ap.parse_args()
    rows, refs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n, mb in enumerate((args.small_mb, args.mb)):
            corpus = root / f"corpus-{mb}.jsonl"
            docs = make_corpus(corpus, int(mb * 2**20))
            tok = make_tokenizer(root / "tok", corpus) if not rows else root / "tok"
            size_mb = corpus.stat().st_size / 2**20
            pair = []
            for workers in (1, 2) if n % 2 == 0 else (2, 1):  # alternate who goes first
                cache = root / f"cache-{mb}-{workers}"
                load = os.getloadavg()[0]  # what others ran on this host just before
                r = _fresh_process(_ingest, str(corpus), str(tok), str(cache), workers)
                r.update(
                    load_before=load,
                    load_after=os.getloadavg()[0],
                    mb=round(size_mb, 1),
                    docs=docs,
                    tokens_per_s=r["tokens"] / r["wall_s"],
                    tokens_per_cpu_s=r["tokens"] / r["cpu_s"],
                    mb_per_s=size_mb / r["wall_s"],
                )
                pair.append(r)
                print(
                    f"{r['mb']:8.1f} MB {workers} worker(s) {r['tokens']:12,d} tokens "
                    f"{r['tokens_per_s']:12,.0f} tok/s {r['tokens_per_cpu_s']:12,.0f} tok/cpu-s "
                    f"{r['mb_per_s']:6.2f} MB/s peak RSS {r['peak_rss_mib']:7.1f} MiB "
                    f"(worker {r['worker_peak_rss_mib']:.1f})"
                )
            same = _same_shards(pair[0].pop("shard"), pair[1].pop("shard"))
            for r in pair:
                r["identical_shards"] = same
            rows += sorted(pair, key=lambda r: r["workers"])
            ref = _fresh_process(_encode_batch, str(corpus), str(tok), 40_000)
            ref.update(mb=round(size_mb, 1), tokens_per_cpu_s=ref["tokens"] / ref["cpu_s"])
            refs.append(ref)
            print(
                f"{size_mb:8.1f} MB encode_batch, 1 thread: "
                f"{ref['tokens_per_cpu_s']:,.0f} tok/cpu-s"
            )
    write_results("ingest", _report(rows, refs, args), _markdown(rows, refs))


def _report(rows: list[dict], refs: list[dict], args) -> dict:
    one, two = rows[-2], rows[-1]
    return {
        "rows": rows,
        "encode_batch_one_core": refs,
        "speedup_2_workers_wall": two["tokens_per_s"] / one["tokens_per_s"],
        "cpu_efficiency_vs_encode_batch": one["tokens_per_cpu_s"] / refs[-1]["tokens_per_cpu_s"],
        "rss_growth_mib": rows[-1]["peak_rss_mib"] - rows[1]["peak_rss_mib"],
        "meta": {"mb": [args.small_mb, args.mb], "vocab": 8192, "batch_docs": 256},
    }


def _markdown(rows: list[dict], refs: list[dict]) -> str:
    md = [
        "# Ingestion: JSONL -> checksummed token shards (pretrained BPE, vocab 8192)",
        "",
        "| corpus MB | workers | documents | tokens | tokens/s (wall) | tokens per CPU-s | "
        "MB/s | peak RSS MiB (main / worker) | shards = 1 worker's | load avg before / after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:--|---:|",
    ]
    md += [
        f"| {r['mb']} | {r['workers']} | {r['docs']:,} | {r['tokens']:,} | "
        f"{r['tokens_per_s']:,.0f} | {r['tokens_per_cpu_s']:,.0f} | {r['mb_per_s']:.2f} | "
        f"{r['peak_rss_mib']:.0f} / {r['worker_peak_rss_mib']:.0f} | "
        f"{'identical' if r['identical_shards'] else 'DIFFERENT'} | "
        f"{r['load_before']:.1f} / {r['load_after']:.1f} |"
        for r in rows
    ]
    md += [
        "",
        "`tokenizers`' own `encode_batch` of the same tokenizer, one thread, documents in memory "
        "(the first 40,000 of each corpus), measured in the same run:",
        "",
        "| corpus MB | documents | tokens | tokens per CPU-s |",
        "|---:|---:|---:|---:|",
    ]
    md += [
        f"| {r['mb']} | {r['docs']:,} | {r['tokens']:,} | {r['tokens_per_cpu_s']:,.0f} |"
        for r in refs
    ]
    one, two, ref = rows[-2], rows[-1], refs[-1]
    speedup = two["tokens_per_s"] / one["tokens_per_s"]
    eff = one["tokens_per_cpu_s"] / ref["tokens_per_cpu_s"]
    eff2 = two["tokens_per_cpu_s"] / ref["tokens_per_cpu_s"]
    growth = rows[-1]["peak_rss_mib"] - rows[1]["peak_rss_mib"]
    written = rows[-1]["tokens"] * 2 / 2**20  # uint16 ids of the larger corpus
    verdict = (
        "not proportional to the corpus: the tokens are not held in memory"
        if growth < 0.25 * written
        else "it GROWS with the corpus"
    )
    md += [
        "",
        f"At {two['mb']} MB: 2 workers ingest **{speedup:.2f}x** the tokens/s (wall) of 1 "
        f"worker (issue 40 asks >= 1.8x); tokens per CPU-second of the whole ingest (reading, "
        f"JSON, encoding, writing, checksums, process start-up) are **{eff:.0%}** (1 worker) and "
        f"**{eff2:.0%}** (2 workers) of `encode_batch` alone on one core (asked: >= 90%).",
        "",
        f"Peak RSS of the main process changes by {growth:+.1f} MiB from the small to the large "
        f"corpus (2 workers), against {written:.0f} MiB of token ids written: {verdict}.",
        "",
        "**The host is shared**: other engineers' jobs run on the same 2 cores (the 1-minute "
        "load average, in the table, counts runnable processes: above 2 no core is idle), so "
        "wall-clock "
        "rates (tokens/s, MB/s, the 2-worker speedup) are lower bounds that depend on their load "
        "at the time; tokens per CPU-second are much less affected. 1 and 2 workers ran one "
        "after the other, alternating which went first.",
    ]
    return "\n".join(md)


if __name__ == "__main__":
    main()
