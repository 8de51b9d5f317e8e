"""The legality rules tying memory and precision options (offload, fp8, gradient compression)
to a parallel layout: what the trainer's `parallelize` can build. Part of `config.layout`'s
rules (re-exported there, with the layout rules in `layout_problems`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import ConfigError
from .layout_facts import expert_tp
from .offload import offload_states

if TYPE_CHECKING:
    from .job import JobConfig
    from .layout import Layout

__all__ = ["ignored_options", "option_problems"]


def option_problems(
    layout: Layout,
    *,
    offload: str,
    fp8_all_gather: bool = False,
    precision: str = "fp32",
    grad_compression: str = "none",
    moe: bool = False,
    optimizer: str = "adamw",
) -> list[ConfigError]:
    """The rules tying memory and precision options to the layout (what the trainer's
    `parallelize` can build); `world_size` is the layout's; `moe`: the model has MoE layers;
    `optimizer`: optim.name. `offload` is `memory.offload`; its model-state part
    (`offload.offload_states`) is what these rules read (activation offload runs with any
    layout)."""
    L, out = layout, []
    offload = offload_states(offload)
    if optimizer == "adafactor" and (L.tp > 1 or L.ep > 1):
        # trainer/adafactor.py steps DTensor shards (FSDP2's rows: parity-tested), but under
        # TP/EP its row or column moments are shards that ZeRO-1's per-rank checkpoint
        # (parallel.zero.zero1_local_state) does not wrap back as DTensors, and no trainer
        # parity test covers them: refused until one does
        out.append(
            ConfigError(
                "optim.name",
                optimizer,
                "Adafactor runs with data parallelism (DDP, ZeRO-1, FSDP2 zero 2/3), not with "
                "tensor or expert parallelism: use parallel.tp=1 and parallel.ep=1, or "
                "optim.name=adamw8bit for small optimizer states with TP/EP",
            )
        )
    if precision == "fp8" and moe and expert_tp(L.tp, L.ep) > 1:
        # Float8ExpertLinear takes each weight's amax where it multiplies: on a tp shard it
        # would scale by the shard's, not the expert's (no parity with one process, untested)
        out.append(
            ConfigError(
                "precision.dtype",
                precision,
                "float8 experts are not split "
                "over tensor-parallel ranks: with an MoE model and tp > 1 set "
                "parallel.ep > 1 (experts whole per tp rank) or use bf16",
            )
        )
    if offload == "optimizer" and (L.zero >= 2 or L.tp > 1 or L.ep > 1):
        out.append(
            ConfigError(
                "memory.offload",
                offload,
                "optimizer-only offload runs with "
                "DDP / ZeRO-1 (plain parameters): with FSDP, TP or EP use "
                "memory.offload=params with parallel.zero=2 or 3 (FSDP2 keeps "
                "parameters, gradients and optimizer states on the host)",
            )
        )
    if offload == "optimizer" and optimizer != "adamw":
        out.append(
            ConfigError(
                "memory.offload",
                offload,
                "optimizer offload runs AdamW on the host (CPUOffloadAdamW): set "
                "optim.name=adamw or memory.offload=none",
            )
        )
    if offload == "params" and L.zero < 2:
        out.append(
            ConfigError(
                "memory.offload", offload, "parameter offload needs FSDP: set parallel.zero=2 or 3"
            )
        )
    elif offload == "params" and L.world_size == 1:
        out.append(
            ConfigError(
                "memory.offload",
                offload,
                "parameter offload uses FSDP2, which "
                "needs a process group and mesh: launch with torchrun/--nproc",
            )
        )
    if grad_compression != "none" and L.zero < 2 and (L.tp > 1 or L.ep > 1 or L.pp > 1):
        out.append(
            ConfigError(
                "precision.grad_compression",
                grad_compression,
                "PowerSGD compresses DDP's buckets, and DDP / ZeRO-1 over "
                "tensor- or expert-parallel parameters or pipeline stages syncs "
                "them without DDP: set grad_compression=none",
            )
        )
    if precision == "fp8" and fp8_all_gather and L.tp > 1:
        out.append(
            ConfigError(
                "precision.fp8_all_gather",
                True,
                "the float8 all-gather wraps "
                "plain weight shards, not tensor-parallel DTensors: set "
                "fp8_all_gather=false with parallel.tp > 1",
            )
        )
    return out


def ignored_options(job: JobConfig, layout: Layout) -> list[str]:
    """Options the job sets that this layout and precision never read: one note each, said
    once at the start (by rank 0), so that a setting that does nothing is not taken for one
    that works. Compared with the defaults, so an untouched field is never named."""
    from .job import PrecisionConfig

    p, d = job.precision, PrecisionConfig()
    notes = []
    if layout.sp and layout.tp == 1:
        notes.append(
            "parallel.sp=true does nothing with parallel.tp=1 (sequence parallelism splits "
            "the tensor-parallel group's norm and dropout work)"
        )
    if p.dtype != "fp8":
        for name in ("fp8_all_gather", "fp8_amax", "fp8_scaling", "fp8_matmul", "fp8_backend"):
            if getattr(p, name) != getattr(d, name):
                notes.append(
                    f"precision.{name}={getattr(p, name)!r} does nothing with "
                    f"precision.dtype={p.dtype!r} (it configures fp8 training)"
                )
    if p.grad_compression != "none" and (layout.dp == 1 or layout.zero >= 2):
        where = "one data-parallel rank" if layout.dp == 1 else "FSDP (parallel.zero >= 2)"
        notes.append(
            f"precision.grad_compression={p.grad_compression!r} does nothing with {where}: "
            "PowerSGD compresses DDP's gradient buckets"
        )
    if p.reduce_dtype != d.reduce_dtype and (layout.zero < 2 or p.dtype == "fp32"):
        why = (
            "DDP / ZeRO-1 reduce in the gradients' own dtype"
            if layout.zero < 2
            else ("fp32 training has no mixed-precision policy")
        )
        notes.append(f"precision.reduce_dtype={p.reduce_dtype!r} does nothing here: {why}")
    return notes
