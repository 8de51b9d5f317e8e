"""`scaletrain profile [F.toml] [--section.key=value ...] [--steps N] [--warmup W] [--out DIR]`.

Builds the run with the trainer's `build_run`, profiles a few steps with torch.profiler, prints
where the step's time goes, the roofline placement of its ops, the bottleneck and what to do.
"""

from __future__ import annotations

import argparse
import os
import sys

from scaletrain.config import load_config

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("config", nargs="?", help="TOML plan file (default: the embedded run)")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="unprofiled steps first (allocation, lazy init; default 2)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where trace.json, profile.txt/json, roofline.png go (default: RUN_DIR/profile)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON instead of text")
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="spawn N local gloo processes (each rank writes its own trace)",
    )
    parser.epilog = (
        "Any field can be overridden: --section.key=value, e.g. "
        "--model.attention=naive --model.max_seq_len=512 --batch.seq_len=512"
    )


def _profile_main(
    config_path: str | None,
    overrides: list[str],
    steps: int,
    warmup: int,
    out: str | None,
    as_json: bool,
) -> None:
    import json

    from scaletrain.profile import classify, profile_job, render, to_json, write_outputs

    result = profile_job(
        load_config(config_path, overrides), steps=steps, warmup=warmup, out_dir=out
    )
    verdict = classify(result)
    if result.rank != 0:
        return
    assert result.trace_path is not None
    paths = write_outputs(result, verdict, result.trace_path.parent)
    if as_json:
        print(json.dumps(to_json(result, verdict), indent=1, default=str))
    else:
        print(render(result, verdict))
        print(f"written: {', '.join(str(p) for p in paths.values())}")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from scaletrain.config.launch_env import launch_env

    launch_env()  # validate everything before any work starts: the launcher's variables,
    job = load_config(args.config, extra)  # then the job
    if args.out is not None:
        from scaletrain.config.user_files import check_output_dir

        check_output_dir(args.out, "--out")
    if args.steps < 1 or args.warmup < 0 or args.nproc < 1:
        print(
            "scaletrain profile: error: use --steps >= 1, --warmup >= 0, --nproc >= 1",
            file=sys.stderr,
        )
        return 2
    call = (args.config, extra, args.steps, args.warmup, args.out, args.json)
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        job.layout(args.nproc)
        from scaletrain.parallel.launch import spawn

        spawn(_profile_main, args.nproc, *call, threads=1)
        return 0
    _profile_main(*call)
    return 0
