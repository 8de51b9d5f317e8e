"""`scaletrain train [F.toml] [--section.key=value ...]`; no arguments: the embedded default run."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from scaletrain import clock
from scaletrain.cli._job import resolve_job
from scaletrain.config import JobConfig
from scaletrain.config.launch_env import launch_env

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("config", nargs="?", help="TOML plan file (default: the embedded run)")
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="spawn N local gloo processes (a laptop stand-in for torchrun)",
    )
    from scaletrain.cli._fields_help import fields_help

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Any field can be overridden: --section.key=value, e.g. --train.steps=100\n"
        "--model.name=gpt2-124m --parallel.tp=2 --precision.dtype=bf16\n\n" + fields_help()
    )


def _job(config_path: str | None, overrides: list[str], world_size: int) -> JobConfig:
    """The job with what the user left unset derived as plan/dryrun derive it (cli/_job.py)."""
    return resolve_job(config_path, overrides, world_size=world_size).job


def _train_main(config_path: str | None, overrides: list[str]) -> None:
    from scaletrain.orchestrate import train_job

    train_job(_job(config_path, overrides, launch_env().world_size))


def _ignored(job: JobConfig, world: int) -> list[str]:
    """The options this job sets that its layout never reads (`config.ignored_options`); none
    when the layout itself is refused (that error comes, in one line, from the run)."""
    from scaletrain.config import ConfigError
    from scaletrain.config.layout_options import ignored_options

    try:
        return ignored_options(job, job.layout(world))
    except ConfigError:
        return []


def run(args: argparse.Namespace, extra: list[str]) -> int:
    # validate everything before any work starts: the launcher's variables, then the job
    env = launch_env()
    world = env.world_size if "WORLD_SIZE" in os.environ else args.nproc
    with clock.phase("plan"):
        res = resolve_job(args.config, extra, world_size=max(world, 1))
    job = res.job
    from scaletrain.orchestrate import check_job_paths

    check_job_paths(job)  # before the notes, the fit check or any rank
    if env.rank == 0:
        for note in [*res.notes(), *_ignored(job, max(world, 1))]:
            print(f"note: {note}")
    if args.nproc < 1:
        print("scaletrain train: error: --nproc must be >= 1", file=sys.stderr)
        return 2
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        job.layout(args.nproc)  # the layout must fit the world size we are about to spawn
        from scaletrain.orchestrate import fit_check

        # the N ranks share this host's memory: summed, before any of them starts
        print(fit_check(job, world_size=args.nproc, local_ranks=args.nproc))
        from scaletrain.parallel.launch import Stopped, spawn

        try:
            spawn(_train_main, args.nproc, args.config, extra, threads=1, forward_signals=True)
        except Stopped as stop:
            if not stop.saved:  # rank 0 said nothing: stopped before its loop could save
                name = signal.Signals(stop.signum).name
                print(
                    f"scaletrain train: interrupted ({name}) before training could save; "
                    "nothing was saved since the last checkpoint",
                    file=sys.stderr,
                )
            return 128 + stop.signum
        return 0
    from scaletrain.orchestrate import train_job

    train_job(job)
    return 0
