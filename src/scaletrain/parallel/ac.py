"""Activation checkpointing: trade recomputation for activation memory, in place.

What each `memory.ac` mode keeps for backward, per transformer block (s tokens of this rank,
h = dim, kv = KV-head width, f = ffn width, e = bytes of the compute dtype):

- "none": every tensor autograd saves (the `planner.memory.activations` per-layer ledger:
  norm inputs, each linear's input, the attention core's q/k/v/output/lse (or its S x S scores
  for the naive core), the MLP's pre-activations).
- "selective": the whole block runs under checkpoint with a per-op policy
  (`torch.utils.checkpoint.create_selective_checkpoint_contexts`): the outputs of the matmuls
  (`aten.mm` / `addmm` / fp8 `_scaled_mm`: q, k, v, wo, w1, w3, w2; e*s*(5h + 2kv + 2f) for a
  Llama block; MoE experts' `_grouped_mm` likewise — their padded-`bmm` fallback, fp32 on CUDA or
  under fake tensors, is recomputed like any bmm) and of the fused attention kernels (output e*s*h
  plus the fp32 log-sum-exp) are saved, and so is the block input (the checkpoint's own input);
  everything else — norms, RoPE, casts, SiLU/GELU, the SwiGLU product, residual adds, and the
  naive core's S x S `bmm` scores and softmax — is recomputed in backward from those (Korthikanti
  et al. 2022, sec. 5's selective recomputation, as a per-op policy the way torchtitan's "op" SAC
  does). Tensor-parallel reduce-scatters are saved too, so the recompute repeats no reduction (the
  all-gathers of sequence parallelism are redone, as Megatron's SP backward does).
- "full": every block in `model.layers` recomputes its whole forward during backward; only
  the block inputs (r*s*h bytes per layer, r the residual stream's bytes) stay alive between
  forward and backward (Korthikanti et al. 2022, sec. 4; costs about one extra forward).

Wrappers are torch's non-reentrant `checkpoint_wrapper` (torch.utils.checkpoint with
use_reentrant=False). It keeps the block under its name in `model.layers`, adds
`_checkpoint_wrapped_module.` to parameter names (stripped again by its state-dict hooks, so
state_dict keys stay clean; `scaletrain.models.clean_fqn` strips it from named_parameters).
Apply before FSDP, after TP/CP/EP (STYLE.md #2), so the wrapper sees the final submodules.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from scaletrain.config import AC_MODES
from scaletrain.models.transformer import Transformer

__all__ = ["apply_ac", "SELECTIVE_SAVED_OPS"]

_aten = torch.ops.aten
SELECTIVE_SAVED_OPS = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten._scaled_mm.default,
        _aten._grouped_mm.default,  # MoE experts' grouped GEMMs (models.moe)
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_reduce.default,
    }
)
"""Ops whose outputs `ac="selective"` keeps; every other op is recomputed in backward."""


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return (
        CheckpointPolicy.MUST_SAVE
        if op in SELECTIVE_SAVED_OPS
        else CheckpointPolicy.PREFER_RECOMPUTE
    )


def _selective_context():
    return create_selective_checkpoint_contexts(_selective_policy)


def _wrap(module: nn.Module, *, selective: bool) -> nn.Module:
    if isinstance(module, CheckpointWrapper):  # idempotent: applying twice changes nothing
        return module
    kw = {"context_fn": _selective_context} if selective else {}
    return checkpoint_wrapper(
        module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=True, **kw
    )


def apply_ac(model: Transformer, mode: str) -> None:
    """Apply activation checkpointing mode none|selective|full to `model.layers` in place."""
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode {mode!r}: use one of {AC_MODES}")
    if mode == "none":
        return
    layers = model.layers
    wrap = functools.partial(_wrap, selective=mode == "selective")
    for name in list(layers.keys()):
        layers[name] = wrap(layers[name])
