"""Command-line entry point: thin subcommands mapped to typed functions.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported lazily so `scaletrain plan` never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
import threading
from typing import Any, NoReturn

# Idle OpenMP threads spin for 20k iterations, then sleep (libgomp reads GOMP_SPINCOUNT when
# torch loads it, so it is set before any command imports torch; a wait policy or spin count
# you set wins). libgomp's default spins ~300k iterations: with another training on the same
# 2 cores, spinning threads wait out each other's time slices at every parallel region (818
# tokens/s each, against 3,653 with 20k and 9,572 sleeping at once); alone, sleeping at once
# cost up to 1.4x on an idle host and 20k was the fastest of the three (benchmarks/threads.py).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "20000")

from scaletrain.config import ConfigError, split_overrides  # noqa: E402

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
    "data": ("scaletrain.cli.data", "check a pre-tokenized corpus (data check PATH --index-only)"),
    "napkin": (
        "scaletrain.cli.napkin",
        "the seeds' napkin math: memory conventions, checkpoint "
        "placement, waves, tokenizer, deadline, rent vs buy, energy",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block): `prog: error: what (see --help)`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser(argv: list[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = _Parser(
        prog="scaletrain",
        description="Plan, dry-run, train and verify parallel transformer training: will it "
        "fit, how fast will it run, which strategy should I use.",
    )
    parser.add_argument("--version", action="version", version=f"scaletrain {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            importlib.import_module(module).add_arguments(p, name)
            _both_config_forms(p)
    return parser, chosen


def _version() -> str:
    from scaletrain import __version__

    return __version__


def _both_config_forms(parser: argparse.ArgumentParser) -> None:
    """Every verb that reads a job TOML takes it both ways: `scaletrain VERB F.toml` and
    `scaletrain VERB --config F.toml` (the verb declares one; the other is added here, and
    `_one_config` merges them)."""
    dests = {a.dest: a for a in parser._actions}
    config = dests.get("config")
    if config is None:
        return
    if config.option_strings:  # declared as --config: accept the positional form too
        parser.add_argument(
            "config_positional", nargs="?", metavar="CONFIG.toml", help="same as --config"
        )
    else:  # declared positional: accept --config too
        parser.add_argument(
            "--config", dest="config_option", metavar="F.toml", help="same as the positional CONFIG"
        )


def _one_config(args: argparse.Namespace) -> None:
    """`args.config` from whichever form was given; both, naming different files, is an error."""
    other = getattr(args, "config_positional", None) or getattr(args, "config_option", None)
    if other is None:
        return
    if args.config not in (None, other):
        raise ConfigError(
            "config", other, f"two config files given ({args.config} and {other}): give one"
        )
    args.config = other


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, chosen = _parser(argv)
    if chosen is None:
        if argv[:1] == ["--version"]:
            parser.parse_args(argv)  # prints the version, exits 0
        if argv and not argv[0].startswith("-"):
            parser.error(f"unknown command {argv[0]!r}; choose one of {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    module = importlib.import_module(SUBCOMMANDS[chosen][0])
    # overrides bypass argparse, which took `--data.source="a@0.7, b@0.3"` (a space) or the
    # shell's second piece of it unquoted for the config file
    rest, overrides = split_overrides(argv)
    args, unknown = parser.parse_known_args(rest)
    extra = overrides + unknown
    previous = _exit_on_sigint(chosen)
    try:
        _one_config(args)
        return int(module.run(args, extra) or 0)
    except ConfigError as e:
        print(f"scaletrain {chosen}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `scaletrain verify RUN | head`: the reader has all it wanted
        with contextlib.suppress(OSError):  # (and no second error when Python flushes at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside the training loop's handler (or a second one)
        print(
            f"scaletrain {chosen}: interrupted (SIGINT); nothing was saved since the last "
            "checkpoint",
            file=sys.stderr,
        )
        return 130
    except OSError as e:  # the disk filled or turned read-only mid-run: one line naming it
        if e.errno not in _STORAGE_ERRNOS:
            raise
        where = f" writing {e.filename}" if e.filename else ""
        what = e.strerror or os.strerror(e.errno)
        print(
            f"scaletrain {chosen}: error: {what}{where}; what was already "
            "written is kept (checkpoints are published only when complete): free space or "
            "fix the mount, then run the same command to resume",
            file=sys.stderr,
        )
        return 3
    except RuntimeError as e:  # run-time failures with a prepared message (OOM, rollbacks)
        prepared = ("OutOfMemory", "TooManyRollbacks", "CheckpointError", "RankDied")
        if type(e).__name__ not in prepared:
            raise
        print(f"scaletrain {chosen}: {e}", file=sys.stderr)
        return 3
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


_STORAGE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG)
"""Storage faults a run meets after its start checks passed (disk full, quota, a mount turned
read-only): said in one line, not a traceback."""


def _exit_on_sigint(command: str) -> Any:
    """Ctrl-C outside the training loop (start-up: imports, data, model; the end) exits at once
    with one line and 130; returns the handler it replaced (None off the main thread).

    A KeyboardInterrupt cannot be caught reliably there: raised inside an import (torch's take
    seconds) it leaves half-initialised modules behind, and the next import fails with an
    unrelated traceback (a RecursionError in numpy's lazy loader, seen). Nothing needs saving
    before the loop; inside it `trainer.signals` takes SIGINT over (finish the step, save) and
    hands it back after the first signal, so a second Ctrl-C lands here and stops at once.
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        sys.stderr.write(
            f"scaletrain {command}: interrupted (SIGINT); nothing was saved since "
            "the last checkpoint\n"
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(130)

    return signal.signal(signal.SIGINT, handler)
