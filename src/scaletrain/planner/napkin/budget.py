"""Napkin math of a training budget (seed 002's playbook, seed 004's "Napkin Math" boxes): the
job's FLOPs (`train_flops`), the GPUs it needs in a deadline (`min_gpus`), renting against
buying (`rent_vs_buy`) and the data loader's tokenizer throughput (`tokenizer_budget`). Each
function cites its source and what it ignores; napkin.py re-exports them. Torch-free.

Units: bytes, seconds, FLOPs; GB = 1e9 bytes (the seeds' GB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.config import ConfigError

__all__ = [
    "TrainFlops",
    "train_flops",
    "min_gpus",
    "rent_vs_buy",
    "RentBuy",
    "tokenizer_budget",
    "TokenizerBudget",
]


@dataclass(frozen=True)
class TrainFlops:
    flops: float
    formula: str


def train_flops(
    *, flops: float | None = None, params: float | None = None, tokens: float | None = None
) -> TrainFlops:
    """Training FLOPs: given, or C = 6 N D (Kaplan et al. 2020; seed 004 Napkin Math 1.5: 2
    FLOPs per parameter per token forward, backward twice that). Ignores attention's s^2
    FLOPs and activation recomputation."""
    if flops is not None:
        if flops <= 0:
            raise ConfigError("--flops", flops, "give a positive FLOP count such as 8.4e23")
        return TrainFlops(flops, f"given {flops:.3g}")
    if params is None or tokens is None:
        raise ConfigError("--flops", None, "give --flops, or --params and --tokens")
    for flag, v in (("--params", params), ("--tokens", tokens)):
        if v <= 0:
            raise ConfigError(flag, v, "give a positive count such as 7e9")
    if not math.isfinite(6 * params * tokens):
        raise ConfigError(
            "--tokens",
            tokens,
            f"6 x N x D overflows with N = {params:.3g}: "
            "give realistic --params and --tokens (or --flops)",
        )
    return TrainFlops(
        6 * params * tokens,
        f"6 x N x D = 6 x {params:.3g} x {tokens:.3g} = {6 * params * tokens:.3g}",
    )


def min_gpus(total_flops: float, sustained_per_gpu: float, days: float) -> int:
    """Fewest GPUs that finish `total_flops` in `days` at `sustained_per_gpu` FLOP/s each:
    ceil(FLOPs / (sustained x days x 86400)). Perfect scaling: ignores communication growth
    with the GPU count, restarts and the batch-size limit."""
    return max(1, math.ceil(total_flops / (sustained_per_gpu * days * 86400) - 1e-9))


@dataclass(frozen=True)
class RentBuy:
    rent_usd: float
    buy_usd: float
    energy_usd: float
    runs_to_break_even: float


def rent_vs_buy(
    gpus: int,
    hours: float,
    *,
    usd_per_gpu_hour: float,
    buy_usd_per_gpu: float,
    kwh_per_run: float = 0.0,
    usd_per_kwh: float = 0.0,
) -> RentBuy:
    """Seed 004 Napkin Math 1.5: rent = gpus x hours x $/GPU-hour; buy = gpus x price;
    break-even = buy / (rent - electricity an owner pays per run). Ignores hosts, network,
    hosting and staff, depreciation and resale, financing, and an owner's idle time."""
    rent = gpus * hours * usd_per_gpu_hour
    buy = gpus * buy_usd_per_gpu
    energy = kwh_per_run * usd_per_kwh
    saving = rent - energy
    return RentBuy(rent, buy, energy, buy / saving if saving > 0 else math.inf)


@dataclass(frozen=True)
class TokenizerBudget:
    tokens_per_step: int
    needed_tokens_per_s: float
    one_core_s: float
    workers_s: float
    cores_needed: int
    utilization: float
    batch_bytes: float
    h2d_s: float


def tokenizer_budget(
    global_batch: int,
    seq_len: int,
    step_s: float,
    *,
    tokens_per_s_per_core: float,
    workers: int,
    h2d_bytes_per_s: float,
    id_bytes: int = 8,
) -> TokenizerBudget:
    """Seed 004 Example 1.1 and Eq. 10-11: a step consumes global_batch x seq_len tokens; one
    core tokenizes them in tokens / rate; `workers` cores in parallel in 1/workers of that; the
    system runs at min(pipeline, compute) so utilization = min(1, pipeline rate / compute
    rate) with prefetching overlapping the two; the int64 batch crosses PCIe in bytes / BW.
    Ignores storage reads, packing and padding cost, Python/GIL overhead and worker imbalance."""
    tokens = global_batch * seq_len
    needed = tokens / step_s
    one = tokens / tokens_per_s_per_core
    par = one / workers
    nbytes = float(tokens * id_bytes)
    return TokenizerBudget(
        tokens,
        needed,
        one,
        par,
        math.ceil(needed / tokens_per_s_per_core - 1e-9),
        min(1.0, workers * tokens_per_s_per_core / needed),
        nbytes,
        nbytes / h2d_bytes_per_s,
    )
