"""Converting a model to fp8 training (`apply_fp8`: its Linears to `Float8Linear`, its MoE
experts to `Float8ExpertLinear`, or torchao's conversion on CUDA) and the delayed-scaling
histories of a converted model. What runs in float8 and what it costs: `fp8.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.config.precision import fp8_backend_for, torchao_installed

from .fp8 import _DIM_MULTIPLE, Float8ExpertLinear, Float8Linear
from .scaling import AmaxHistory

__all__ = [
    "apply_fp8",
    "maybe_apply_fp8",
    "fp8_eligible",
    "fp8_backend_of",
    "amax_histories",
    "sync_amax_histories",
]


def fp8_eligible(mod: nn.Module) -> bool:
    """A plain nn.Linear whose in and out dims are multiples of 16 (the fp8 GEMM constraint)."""
    return (
        type(mod) is nn.Linear
        and mod.in_features % _DIM_MULTIPLE == 0
        and mod.out_features % _DIM_MULTIPLE == 0
    )


def _skipped(fqn: str, skip: Sequence[str]) -> bool:
    # "output" skips the head, "router" every MoE router, "layers.0.attention.wq" one layer.
    parts = fqn.split(".")
    return any(s in parts or fqn == s or fqn.endswith("." + s) for s in skip)


def _use_torchao(
    model: nn.Module,
    backend: str,
    scaling: str,
    amax: str,
    matmul: str,
    device_type: str | None = None,
) -> bool:
    """Whether the Linears go to torchao: `config.fp8_backend_for` (the rule the planner and
    the dry-run read too) for the device the model will run on: `device_type` where given
    (the trainer's device, or the dry-run's target, whose fake tensors are CPU tensors
    standing for a GPU's), else the parameters' (a model built on meta: this host's CUDA)."""
    if device_type is None:
        p = next(model.parameters(), None)
        on_cuda = p is not None and (
            p.device.type == "cuda" or (p.device.type == "meta" and torch.cuda.is_available())
        )
        device_type = "cuda" if on_cuda else "cpu"
    chosen = fp8_backend_for(
        backend, scaling=scaling, amax=amax, matmul=matmul, device_type=device_type
    )
    if chosen != "torchao":
        return False
    # torchao has no tile/delayed recipe, and always runs `_scaled_mm`
    fits = scaling == "tensorwise" and amax == "current" and matmul != "emulated"
    if not (torchao_installed() and device_type == "cuda" and fits):
        raise ValueError(
            "fp8 backend 'torchao' needs torchao installed, a CUDA model, "
            "scaling='tensorwise', amax='current' and matmul other than 'emulated'; "
            "use backend='auto'"
        )
    return True


def apply_fp8(
    model: nn.Module,
    *,
    scaling: str = "tensorwise",
    amax: str = "current",
    skip: Sequence[str] = ("output", "router"),
    history_len: int = 16,
    backend: str = "auto",
    matmul: str = "auto",
    device_type: str | None = None,
    all_gather: bool = False,
) -> list[str]:
    """Convert eligible Linears and MoE experts of `model` in place; returns the converted
    module names.

    Apply before tensor, expert parallelism and FSDP (like torchtitan's float8 converter).
    `backend`: 'auto' (torchao on CUDA when importable and the recipe is tensorwise/current,
    else ours), 'scaletrain' or 'torchao' — for the Linears; experts always run
    `Float8ExpertLinear` (current amax whatever `amax` says, see the module docstring). Skip the
    experts with `skip=(..., "experts")`. `matmul`: the GEMM kernel of ours ('auto',
    'scaled_mm' or 'emulated': `fp8_matmul.py`). `device_type`: the device type the model
    will run on ('cuda', 'cpu'), which 'auto' decides by; None: its parameters' device (a
    meta model's: whether this host has CUDA). `all_gather`: FSDP2 will gather the weights
    in float8 (`precision.fp8_all_gather` under ZeRO-2/3): torchao's Linears get its own
    recipe (`Float8LinearConfig.enable_fsdp_float8_all_gather`); ours are wrapped later, by
    `fp8_fsdp.enable_fp8_all_gather`.
    """
    if backend not in ("auto", "scaletrain", "torchao"):
        raise ValueError(f"fp8 backend {backend!r}: use 'auto', 'scaletrain' or 'torchao'")
    targets = [
        (fqn, mod)
        for fqn, mod in model.named_modules()
        if fqn and fp8_eligible(mod) and not _skipped(fqn, skip)
    ]
    experts = _convert_experts(model, scaling, skip, matmul)
    if _use_torchao(model, backend, scaling, amax, matmul, device_type):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        names = {fqn for fqn, _ in targets}
        convert_to_float8_training(
            model,
            config=Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather),
            module_filter_fn=lambda _m, fqn: fqn in names,
        )
        return sorted(names | set(experts))
    for fqn, mod in targets:
        parent_name, _, leaf = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(
            parent,
            leaf,
            Float8Linear.from_linear(
                mod, scaling=scaling, amax=amax, history_len=history_len, matmul=matmul
            ),
        )
    return [fqn for fqn, _ in targets] + experts


def _convert_experts(model: nn.Module, scaling: str, skip: Sequence[str], matmul: str) -> list[str]:
    """Give every unconverted `GroupedExperts` a `Float8ExpertLinear`; returns their names."""
    from scaletrain.models.moe import GroupedExperts

    names = []
    for fqn, mod in model.named_modules():
        if (
            isinstance(mod, GroupedExperts)
            and not _skipped(fqn, skip)
            and not isinstance(mod.linear, Float8ExpertLinear)
        ):
            mod.linear = Float8ExpertLinear(scaling, matmul)
            names.append(fqn)
    return names


def maybe_apply_fp8(model: nn.Module, precision: Any, **kwargs: Any) -> list[str]:
    """`apply_fp8` with `precision.fp8_scaling` when `precision.dtype == 'fp8'`; else a no-op.

    `precision` is a `scaletrain.config.PrecisionConfig` (`dtype` and the `fp8_*` fields);
    `kwargs` go to `apply_fp8` over them (`device_type`, or a `backend` in place of
    `precision.fp8_backend`).
    """
    if precision.dtype != "fp8":
        return []
    options: dict[str, Any] = {
        "scaling": precision.fp8_scaling,
        "amax": precision.fp8_amax,
        "history_len": precision.fp8_history_len,
        "matmul": precision.fp8_matmul,
        "backend": precision.fp8_backend,
    }
    return apply_fp8(model, **{**options, **kwargs})


def fp8_backend_of(model: nn.Module) -> str:
    """Which backend converted `model`'s Linears: 'torchao', 'scaletrain' or 'none'."""
    for m in model.modules():
        if type(m).__module__.startswith("torchao.float8"):
            return "torchao"
        if isinstance(m, Float8Linear):
            return "scaletrain"
    return "none"


def amax_histories(model: nn.Module) -> list[AmaxHistory]:
    """Every delayed-scaling history of `model`'s Float8Linears, in module order."""
    return [
        h for m in model.modules() if isinstance(m, Float8Linear) for h in m.fp8_state.histories()
    ]


@torch.no_grad()
def sync_amax_histories(model: nn.Module, group: Any = None) -> int:
    """Make every rank's delayed-scaling histories the elementwise max over `group`.

    Data-parallel (and context-parallel) ranks quantize different tokens, so the activation and
    gradient amaxes they record differ; after this they hold the amax of the whole batch, as
    one process would (the max over the shards is the max over the batch), every rank scales
    the next micro-batches alike, and the checkpoint — which saves the histories once, from
    rank 0 — resumes every rank exactly. Transformer Engine reduces amaxes over the
    data-parallel group the same way. One all-reduce (MAX) per call over all histories; call it
    once per step, after backward. Every rank must hold the same histories (the same model and
    micro-batch count do). Returns the number of values reduced.
    """
    hists = [h for h in amax_histories(model) if h.history is not None]
    if not hists:
        return 0
    flat = torch.cat([h.history for h in hists if h.history is not None])
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    for h, part in zip(hists, flat.split([h.length for h in hists]), strict=True):
        h.history = part.clone()
    return flat.numel()
