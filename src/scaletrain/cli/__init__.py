"""Command-line entry point: thin subcommands mapped to typed functions.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported lazily so `scaletrain plan` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from scaletrain.config import ConfigError

__all__ = ["main", "SUBCOMMANDS"]

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("scaletrain.cli.train", "train a model (no arguments: the embedded default run)"),
    "plan": ("scaletrain.cli.plan", "predict memory/time/cost of a layout, or search the best"),
    "explain": ("scaletrain.cli.plan", "walk through the arithmetic of one layout"),
    "dryrun": ("scaletrain.cli.dryrun", "run the real step under fake tensors at any world size"),
    "verify": ("scaletrain.cli.verify", "predicted vs measured for a run directory"),
    "bench": ("scaletrain.cli.bench", "run a benchmark from benchmarks/"),
    "profile": ("scaletrain.cli.profile", "profile a few steps: breakdown, roofline, bottleneck"),
    "report": ("scaletrain.cli.report", "write a self-contained HTML report of a run directory"),
    "status": ("scaletrain.cli.status", "where a (possibly running) run is: step, ETA, health"),
    "napkin": ("scaletrain.cli.napkin", "the seeds' napkin math: memory conventions, checkpoint "
               "placement, waves, tokenizer, deadline, rent vs buy, energy"),
}


def _parser(argv: list[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(
        prog="scaletrain",
        description="Plan, dry-run, train and verify parallel transformer training: will it "
                    "fit, how fast will it run, which strategy should I use.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            importlib.import_module(module).add_arguments(p, name)
    return parser, chosen


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, chosen = _parser(argv)
    if chosen is None:
        if argv and not argv[0].startswith("-"):
            parser.error(f"unknown command {argv[0]!r}; choose one of {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    module = importlib.import_module(SUBCOMMANDS[chosen][0])
    args, extra = parser.parse_known_args(argv)
    try:
        return int(module.run(args, extra) or 0)
    except ConfigError as e:
        print(f"scaletrain {chosen}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # run-time failures with a prepared message (OOM, rollbacks)
        if type(e).__name__ not in ("OutOfMemory", "TooManyRollbacks", "CheckpointError"):
            raise
        print(f"scaletrain {chosen}: {e}", file=sys.stderr)
        return 3
