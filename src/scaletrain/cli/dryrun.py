"""`scaletrain dryrun`: one rank's real training step under fake tensors, next to the planner.

Same layout flags as `scaletrain plan` (or a TOML job file), plus `--rank`. Prints measured
memory per category in GB beside the planner's prediction for the same layout, with relative
errors; `--json` prints {"plan", "memory", "flops_per_step", "predicted", ...}.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from scaletrain.config import ConfigError, JobConfig, load_config

__all__ = ["add_arguments", "run", "job_from_args"]

# flag -> (section, key) of the job config
_FLAGS: dict[str, tuple[str, str]] = {
    "model": ("model", "name"), "gpu": ("hardware", "gpu"), "gpus": ("hardware", "gpus"),
    "gpus_per_node": ("hardware", "gpus_per_node"), "seq_len": ("batch", "seq_len"),
    "global_batch": ("batch", "global_batch"), "micro_batch": ("batch", "micro_batch"),
    "dp": ("parallel", "dp"), "zero": ("parallel", "zero"), "tp": ("parallel", "tp"),
    "sp": ("parallel", "sp"), "pp": ("parallel", "pp"),
    "pp_schedule": ("parallel", "pp_schedule"), "pp_virtual": ("parallel", "pp_virtual"),
    "cp": ("parallel", "cp"), "ep": ("parallel", "ep"), "ac": ("memory", "ac"),
    "precision": ("precision", "dtype"), "offload": ("memory", "offload"),
    "compile": ("train", "compile"),
}


def add_arguments(parser: argparse.ArgumentParser, name: str = "dryrun") -> None:
    parser.add_argument("--config", help="a job TOML file (flags below override it)")
    parser.add_argument("--model", help="preset name or a Hugging Face config.json")
    parser.add_argument("--gpus", type=int, help="world size to simulate")
    parser.add_argument("--gpu", help="GPU type for the capacity check (e.g. h100-sxm)")
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--global-batch", type=int,
                        help="sequences per step (default: micro-batch x dp, no accumulation)")
    parser.add_argument("--micro-batch", type=int)
    parser.add_argument("--dp", type=int)
    parser.add_argument("--zero", type=int, choices=(0, 1, 2, 3))
    parser.add_argument("--tp", type=int)
    parser.add_argument("--sp", action="store_const", const=True)
    parser.add_argument("--pp", type=int)
    parser.add_argument("--pp-schedule", choices=("gpipe", "1f1b", "interleaved", "zero-bubble"))
    parser.add_argument("--pp-virtual", type=int)
    parser.add_argument("--cp", type=int)
    parser.add_argument("--ep", type=int)
    parser.add_argument("--ac", choices=("none", "selective", "full"))
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16", "fp8"))
    parser.add_argument("--compile", action="store_const", const=True,
                        help="accepted for flag parity with plan; the dry-run runs eagerly")
    parser.add_argument("--offload", choices=("none", "optimizer", "params"))
    parser.add_argument("--rank", type=int, default=0, help="which rank to simulate")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def job_from_args(args: argparse.Namespace) -> tuple[JobConfig, int]:
    """The job and world size the flags describe (flags override --config)."""
    overrides: dict[str, dict[str, Any]] = {}
    for flag, (section, key) in _FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.setdefault(section, {})[key] = value
    job = load_config(getattr(args, "config", None), overrides)
    world = job.hardware.gpus
    if world <= 0:
        raise ConfigError("--gpus", world, "give the world size to simulate, e.g. --gpus 8")
    if args.global_batch is None and args.config is None:
        # no batch given: one micro-batch per data-parallel rank (no accumulation)
        dp = job.parallel.resolve(world).dp
        overrides.setdefault("batch", {})["global_batch"] = job.batch.micro_batch * dp
        job = load_config(None, overrides)
    return job, world


def _pp_ep(plan: dict[str, Any]) -> str:
    """' pp 4 (1f1b)' / ' ep 8' for the title, when those axes are used."""
    out = ""
    if plan.get("pp", 1) > 1:
        virtual = f" x{plan['pp_virtual']}" if plan.get("pp_virtual", 1) > 1 else ""
        out += f" pp {plan['pp']} ({plan['pp_schedule']}{virtual})"
    if plan.get("ep", 1) > 1:
        out += f" ep {plan['ep']}"
    return out


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.dryrun import dryrun
    from scaletrain.measure.verify import compare, format_table, predict

    if extra:
        raise ConfigError("dryrun", " ".join(extra), "unknown arguments: see --help")
    if args.model is None and args.config is None:
        args.model = "gpt2-124m"
    job, world = job_from_args(args)
    measurement = dryrun(job, world_size=world, rank=args.rank)
    estimate = predict(job, job.layout(world))
    comparison = compare(measurement, estimate)
    if args.json:
        out = measurement.to_json()
        out["predicted"] = estimate.to_json() if estimate is not None else None
        out["comparison"] = comparison.to_json()
        print(json.dumps(out, indent=1))
        return 0
    plan = measurement.plan
    title = (f"dry-run {plan['model']} rank {measurement.rank}/{world}: dp {plan['dp']} zero "
             f"{plan['zero']} tp {plan['tp']} cp {plan['cp']}{_pp_ep(plan)} | seq "
             f"{plan['seq_len']} micro "
             f"{plan['micro_batch']} x {plan['grad_accum']} | {plan['precision']} ac "
             f"{plan['ac']}  ({measurement.wall_s:.1f} s)")
    print(format_table(comparison, title=title))
    for k, v in sorted(measurement.memory.buffer_terms.items()):
        if v:
            print(f"  buffers.{k:<22} {v / 1e9:8.3f} GB")
    for k, v in sorted(measurement.memory.detail.items()):
        print(f"  {k:<30} {v / 1e9:8.3f} GB")
    print(f"FLOPs this rank per step: {measurement.flops:.4g}")
    for note in measurement.notes:
        print(f"note: {note}")
    return 0
