"""`scaletrain napkin TOOL`: the seeds' back-of-envelope tools, formula by formula (no torch).

Tools: memory (bytes-per-parameter conventions, ZeRO, Korthikanti activations), ckpt (sqrt(N)
and every-k checkpoint placement), waves (warp/tile/wave quantization of a size), gemm
(tensor-core alignment and wave count of a model's GEMMs on a GPU), tokenizer (data-pipeline
throughput a step needs), deadline (fewest GPUs for a deadline), rentbuy (rent vs buy
break-even), run (time, cost, energy and CO2 of a FLOP budget), allreduce (ring all-reduce vs
compute), flops (a layer's matmul FLOPs). Each prints its formula with the numbers filled in,
its source and what it ignores (planner/napkin/). This module is the command (flags,
their checks, dispatch); `napkin_tools` and `napkin_budget` hold the reports.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from scaletrain.config import AC_MODES, ConfigError, HardwareConfig

from ._types import check_finite_output, finite_float, given_numbers
from .napkin_budget import BUDGET_REPORTS
from .napkin_tools import REPORTS as _TOOL_REPORTS

__all__ = ["add_arguments", "run", "TOOLS"]

REPORTS = {**_TOOL_REPORTS, **BUDGET_REPORTS}
"""Tool name -> the function printing its report."""

TOOLS = {
    "memory": "model + optimizer state under a bytes/param convention, ZeRO, activations",
    "ckpt": "activation checkpoint placement: sqrt(N) and every-k memory/compute trade",
    "waves": "warp/tile/wave quantization: units = ceil(n/q), utilization = n/(units*q)",
    "gemm": "tensor-core alignment and wave count of a model's GEMMs on a GPU",
    "tokenizer": "tokens/s the GPUs consume vs a tokenizer's rate; workers needed",
    "deadline": "fewest GPUs to train a FLOP budget within a deadline",
    "rentbuy": "rent vs buy: break-even number of training runs",
    "run": "time, GPU-hours, cost, energy and CO2 of a FLOP budget on N GPUs",
    "allreduce": "ring all-reduce of the gradients: bytes per GPU, steps, time vs compute",
    "flops": "matmul FLOPs of one layer, one step and a run (2 per multiply-add)",
}


class _OneLine(argparse.ArgumentParser):
    """Bad flags: one line naming the tool and the problem (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


NAPKIN_SEQ_LEN = 2048
"""The napkin tools' default context: GPU-scale pretraining (GPT-3 and Llama-2 trained at 2048
and 4096; the seeds' worked examples use 2048), not the embedded CPU job's 128."""


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="tool", metavar="TOOL", parser_class=_OneLine)
    for tool, help_ in TOOLS.items():
        p = sub.add_parser(tool, help=help_, description=help_)
        _model_tool_flags(p, tool)
        _budget_tool_flags(p, tool)


def _model_tool_flags(p: argparse.ArgumentParser, tool: str) -> None:
    """Flags of the tools about one model or collective: memory, ckpt, gemm, flops,
    allreduce, waves."""
    a = p.add_argument
    if tool in ("memory", "ckpt", "gemm", "flops"):
        a(
            "--model",
            metavar="NAME|config.json|org/name",
            help="model preset, config.json or a hub id in the local Hugging Face cache",
        )
    if tool in ("memory", "gemm", "flops", "ckpt"):
        # Napkin math is about GPU-scale runs of real models, so its defaults are those of
        # such a run (seq 2048, one sequence per micro-batch, bf16), not the embedded CPU
        # job's (seq 128, micro-batch 16, fp32): the help says so, not a hidden difference.
        a(
            "--seq-len",
            type=int,
            default=NAPKIN_SEQ_LEN,
            metavar="S",
            help=f"default {NAPKIN_SEQ_LEN}, a GPU-scale context (the embedded CPU job: 128)",
        )
        a(
            "--micro-batch",
            type=int,
            default=1,
            metavar="B",
            help="default 1 sequence, as GPU-scale runs (the embedded CPU job: 16)",
        )
    if tool == "flops":
        a("--steps", type=int, metavar="N", help="training steps (total FLOPs)")
        a("--gpu", metavar="TYPE", help="time one step at this preset's peak")
        a(
            "--precision",
            default="bf16",
            choices=("bf16", "fp16", "fp8", "fp32"),
            help="default bf16, as GPU-scale runs (the embedded CPU job: fp32)",
        )
    if tool == "allreduce":
        a("--bytes", type=finite_float, metavar="M", help="gradient bytes (or --params)")
        a("--params", type=finite_float, metavar="N")
        a(
            "--grad-bytes",
            type=finite_float,
            default=2.0,
            metavar="B",
            help="bytes per gradient element (default 2: fp16/bf16)",
        )
        a("--gpus", type=int, required=True, metavar="N")
        a(
            "--gbps",
            type=finite_float,
            required=True,
            metavar="GB/s",
            help="per-GPU link bandwidth, GB/s (100 Gb/s = 12.5)",
        )
        a("--compute-s", type=finite_float, metavar="SEC", help="forward+backward time to compare")
    if tool in ("memory", "gemm"):
        a("--tp", type=int, default=1, metavar="T")
    if tool == "memory":
        a(
            "--params",
            type=finite_float,
            metavar="N",
            help="parameter count (default: the model's exact count; the seeds round it, e.g. 7e9)",
        )
        a("--convention", type=int, default=16, metavar="BYTES", help="12, 16, 18 or 20")
        a("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
        a("--dp", type=int, default=1, metavar="N", help="ranks ZeRO shards over")
        a("--zero", type=int, default=0, choices=(0, 1, 2, 3))
        a("--sp", action="store_true")
        a("--ac", default="none", choices=AC_MODES)
        a(
            "--ckpt-every",
            type=int,
            default=1,
            metavar="K",
            help="keep 1 in K layers' activations (seed 004's GPT-2 walk-through)",
        )
        a("--gpu", metavar="TYPE", help="compare with this preset's memory")
    if tool == "ckpt":
        a("--layers", type=int, metavar="N", help="layers (default: the model's)")
        a("--k", type=int, metavar="K", help="also show K checkpoints")
        a(
            "--layer-gb",
            type=finite_float,
            metavar="A",
            help="activation GB of one layer "
            "(default with --model: Korthikanti's s*b*h*(34 + 5as/h), 16-bit)",
        )
    if tool == "waves":
        a("--size", type=int, required=True, metavar="N", help="batch, rows or tiles")
        a("--quantum", type=int, default=32, metavar="Q", help="warp 32, tile, SMs")
    if tool == "gemm":
        a("--gpu", default="h100-sxm", metavar="TYPE")
        a("--tile", default="128x128", metavar="MxN", help="output tile per SM")


def _budget_tool_flags(p: argparse.ArgumentParser, tool: str) -> None:
    """Flags of the tools about throughput, time and money: tokenizer, deadline, rentbuy,
    run."""
    a = p.add_argument
    hw = HardwareConfig()
    if tool == "tokenizer":
        a("--global-batch", type=int, required=True, metavar="B")
        a("--seq-len", type=int, required=True, metavar="S")
        when = p.add_mutually_exclusive_group(required=True)
        when.add_argument(
            "--step-s",
            type=finite_float,
            metavar="SEC",
            help="accelerator step time (plan/explain print it)",
        )
        when.add_argument(
            "--tokens-per-s",
            type=finite_float,
            metavar="R",
            help="tokens/s the whole job trains (explain's 'tokens/s')",
        )
        a(
            "--tokens-per-s-per-core",
            type=finite_float,
            default=5e5,
            metavar="R",
            help="tokenizer rate of one CPU core (default 5e5, seed 004's BPE figure)",
        )
        a("--workers", type=int, default=1, metavar="W")
        a(
            "--pcie-gbps",
            type=finite_float,
            default=15.75,
            metavar="GB/s",
            help="host-to-device GB/s (default PCIe Gen3 x16, 15.75)",
        )
    if tool in ("deadline", "rentbuy", "run"):
        a("--flops", type=finite_float, metavar="C", help="training FLOPs (or --params/--tokens)")
        a("--params", type=finite_float, metavar="N", help="parameters (or --model)")
        a(
            "--model",
            metavar="NAME|config.json|org/name",
            help="take N from this model's exact count",
        )
        a("--tokens", type=finite_float, metavar="D")
        a("--gpu", default="h100-sxm", metavar="TYPE")
        a("--precision", default="bf16", choices=("bf16", "fp16", "fp8", "fp32"))
        a(
            "--efficiency",
            type=finite_float,
            default=0.4,
            metavar="F",
            help="sustained fraction of peak (default 0.4)",
        )
        a("--peak-tflops", type=finite_float, metavar="TF", help="override the preset's peak")
    if tool == "deadline":
        a("--days", type=finite_float, required=True, metavar="D")
    if tool in ("rentbuy", "run"):
        a("--gpus", type=int, required=True, metavar="N")
        a("--usd-per-gpu-hour", type=finite_float, metavar="USD", help="default: the preset's")
        a("--pue", type=finite_float, default=hw.pue, help=f"default {hw.pue}")
    if tool == "rentbuy":
        a("--buy-usd-per-gpu", type=finite_float, required=True, metavar="USD")
        a(
            "--usd-per-kwh",
            type=finite_float,
            default=0.0,
            metavar="USD",
            help="electricity an owner pays (default 0: not counted)",
        )
    if tool == "run":
        a(
            "--host-watts",
            type=finite_float,
            default=hw.host_watts_per_node,
            metavar="W",
            help="host power per node",
        )
        a("--grid-co2", type=finite_float, default=hw.grid_kg_co2_per_kwh, metavar="KG")


def _positive(args: argparse.Namespace, *names: str) -> None:
    for n in names:
        v = getattr(args, n, None)
        if v is not None and v <= 0:
            raise ConfigError(f"--{n.replace('_', '-')}", v, "use a positive number")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError("argument", " ".join(extra), "remove it (see --help)")
    if args.tool is None:
        raise ConfigError("napkin", "", f"name a tool: {', '.join(TOOLS)}")
    _positive(
        args,
        "seq_len",
        "micro_batch",
        "tp",
        "dp",
        "ckpt_every",
        "layers",
        "k",
        "layer_gb",
        "size",
        "quantum",
        "global_batch",
        "step_s",
        "tokens_per_s",
        "tokens_per_s_per_core",
        "workers",
        "pcie_gbps",
        "days",
        "gpus",
        "peak_tflops",
        "buy_usd_per_gpu",
        "steps",
        "bytes",
        "grad_bytes",
        "gbps",
        "compute_s",
        "params",
        "flops",
        "tokens",
    )
    for n in ("usd_per_gpu_hour", "usd_per_kwh", "host_watts", "grid_co2"):
        v = getattr(args, n, None)
        if v is not None and v < 0:
            raise ConfigError(f"--{n.replace('_', '-')}", v, "use a number >= 0")
    if getattr(args, "pue", None) is not None and args.pue < 1:
        raise ConfigError("--pue", args.pue, "use >= 1.0")
    eff = getattr(args, "efficiency", None)
    if eff is not None and not 0 < eff <= 1:
        raise ConfigError("--efficiency", eff, "use a fraction in (0, 1], e.g. 0.4")
    try:
        lines = REPORTS[args.tool](args)
    except ConfigError:
        raise
    except (ArithmeticError, ValueError) as e:  # finite inputs whose arithmetic overflows
        raise ConfigError(
            f"napkin {args.tool}",
            given_numbers(args),
            f"the arithmetic overflows ({e}): give realistic magnitudes",
        ) from None
    text = "\n".join(lines)
    check_finite_output(text, f"napkin {args.tool}", args)
    print(text)
    return 0
