"""`scaletrain data check PATH`: a pre-tokenized corpus checked before a run trains on it
(`scaletrain.data.check`); `--index-only` reads its indexes and metadata, not its ids."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import get_args

from scaletrain.config import ConfigError, fmt_bytes
from scaletrain.config.choices import TokenDtype

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str = "data") -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = sub.add_parser(
        "check",
        help="check a pre-tokenized corpus (Megatron .bin/.idx, datatrove .ds, a shard "
        "directory) as a run's start does, or from its indexes alone",
        description="Check a pre-tokenized corpus: Megatron .bin/.idx, datatrove .ds or a "
        "shard directory of data.cache_dir, named as data.source names it (a file, a Megatron "
        "prefix, a folder, a glob, a mixture). Without --index-only every id is read, as a "
        "run's start reads them; with it, only headers, sizes and the indexes (whole up to "
        "--index-budget-mib, else sampled blocks), so a terabyte corpus is checked in seconds.",
    )
    p.add_argument("path", metavar="PATH", help="the corpus, as data.source names it")
    p.add_argument(
        "--index-only",
        action="store_true",
        help="read headers, metadata and indexes only (sizes, id type, document boundaries), "
        "never the ids: the bytes read do not grow with the corpus",
    )
    p.add_argument(
        "--tokenizer",
        metavar="SPEC",
        help="the tokenizer.json (or its directory) that wrote the corpus (data.tokenizer): "
        "its vocabulary bounds the ids and the id type; a shard directory has its own",
    )
    p.add_argument(
        "--token-dtype",
        choices=get_args(TokenDtype),
        default="uint16",
        help="id type of datatrove .ds files without a .metadata (data.token_dtype)",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="also read N windows of ids at random positions (seeded) and check their range",
    )
    p.add_argument("--window", type=int, default=4096, metavar="IDS", help="ids per window")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled blocks and windows")
    p.add_argument(
        "--index-budget-mib",
        type=float,
        default=256.0,
        metavar="MIB",
        help="index bytes read in all with --index-only (default 256): indexes larger than "
        "this together are checked in blocks drawn with --seed",
    )
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.epilog = "Exit status 0 when every file passes, 1 when one does not (one line each)."


def _checked_args(args: argparse.Namespace) -> None:
    for flag, value, ok, fix in (
        ("--sample", args.sample, args.sample >= 0, "give 0 or more windows"),
        ("--window", args.window, args.window >= 1, "give 1 or more ids"),
        (
            "--index-budget-mib",
            args.index_budget_mib,
            args.index_budget_mib > 0,
            "give a positive budget",
        ),
    ):
        if not ok:
            raise ConfigError(flag, value, fix)


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.data.check import check_corpus

    if extra:
        raise ConfigError("data", " ".join(extra), "unknown arguments: see --help")
    _checked_args(args)
    result = check_corpus(
        args.path,
        tokenizer=args.tokenizer,
        token_dtype=args.token_dtype,
        index_only=args.index_only,
        index_budget=int(args.index_budget_mib * (1 << 20)),
        sample=args.sample,
        window=args.window,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps({**asdict(result), "corpus_bytes": result.corpus_bytes}, indent=1))
    else:
        for rep in result.files:
            print(_line(rep, result.seed))
        print(_summary(result, args.sample, args.window))
    return 1 if result.bad else 0


def _line(rep, seed: int) -> str:
    if rep.problem is not None:
        return f"BAD  {rep.problem}"
    docs = f" in {rep.num_documents:,} documents" if rep.num_documents is not None else ""
    out = f"ok   {rep.path}: {rep.kind} {rep.dtype}, {rep.num_tokens:,} ids{docs}"
    if rep.index_bytes:
        whole = rep.index_checked == rep.index_bytes
        out += (
            f"; index read whole ({fmt_bytes(rep.index_bytes)})"
            if whole
            else f"; index sampled: {fmt_bytes(rep.index_checked)} of "
            f"{fmt_bytes(rep.index_bytes)} in blocks (seed {seed})"
        )
    if rep.windows:
        out += f"; {rep.windows} windows"
    if rep.max_id is not None:
        out += f"; largest id {rep.max_id:,}"
    if rep.vocab_size is not None:
        out += f" of a vocabulary of {rep.vocab_size:,}"
    return out + "".join(f"; {n}" for n in rep.notes)


def _summary(result, sample: int, window: int) -> str:
    n = len(result.files)
    how = "headers, metadata and indexes only" if result.index_only else "every id"
    if sample:
        how += f"; {sample} windows of {window:,} ids, seed {result.seed}"
    return (
        f"checked {n} file{'s' if n != 1 else ''} of {fmt_bytes(result.corpus_bytes)}: "
        f"read {fmt_bytes(result.bytes_read)} ({how}); {len(result.bad)} bad"
    )
