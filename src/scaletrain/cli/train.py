"""`scaletrain train [F.toml] [--section.key=value ...]`; no arguments: the embedded default run."""

from __future__ import annotations

import argparse
import os
import sys

from scaletrain.config import load_config

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("config", nargs="?", help="TOML plan file (default: the embedded run)")
    parser.add_argument("--nproc", type=int, default=1,
                        help="spawn N local gloo processes (a laptop stand-in for torchrun)")
    parser.epilog = ("Any field can be overridden: --section.key=value, e.g. --train.steps=100 "
                     "--model.name=gpt2-124m --parallel.tp=2 --precision.dtype=bf16")


def _train_main(config_path: str | None, overrides: list[str]) -> None:
    from scaletrain.orchestrate import train_job

    train_job(load_config(config_path, overrides))


def run(args: argparse.Namespace, extra: list[str]) -> int:
    job = load_config(args.config, extra)  # validate everything before any work starts
    if args.nproc < 1:
        print("scaletrain train: error: --nproc must be >= 1", file=sys.stderr)
        return 2
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        job.layout(args.nproc)  # the layout must fit the world size we are about to spawn
        from scaletrain.parallel.launch import spawn

        spawn(_train_main, args.nproc, args.config, extra, threads=1)
        return 0
    from scaletrain.orchestrate import train_job

    train_job(job)
    return 0
