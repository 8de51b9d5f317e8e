"""Activation checkpointing: trade recomputation for activation memory, in place.

- "none": no-op.
- "full": every block in `model.layers` recomputes its forward during backward; only the block
  inputs (2*s*b*h bytes per layer in 16-bit) stay alive between forward and backward
  (Korthikanti et al. 2022, sec. 4; costs about one extra forward).
- "selective": only the attention core (softmax(QK^T)V, the `5as/h` term of Korthikanti's
  Table 2) is recomputed; wraps `block.attention.core`. With the SDPA core the saved tensors
  are already small (no S x S scores), so the saving is mostly for the naive core.

Wrappers are torch's non-reentrant `checkpoint_wrapper` (torch.utils.checkpoint with
use_reentrant=False). It keeps the block under its name in `model.layers`, adds
`_checkpoint_wrapped_module.` to parameter names (stripped again by its state-dict hooks, so
state_dict keys stay clean; `scaletrain.models.clean_fqn` strips it from named_parameters).
Apply before FSDP, after TP/CP/EP (STYLE.md #2), so the wrapper sees the final submodules.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)

from scaletrain.config import AC_MODES

__all__ = ["apply_ac"]


def _wrap(module: nn.Module) -> nn.Module:
    if isinstance(module, CheckpointWrapper):  # idempotent: applying twice changes nothing
        return module
    return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                              preserve_rng_state=True)


def apply_ac(model: nn.Module, mode: str) -> None:
    """Apply activation checkpointing mode none|selective|full to `model.layers` in place."""
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode {mode!r}: use one of {AC_MODES}")
    if mode == "none":
        return
    layers: nn.ModuleDict = model.layers  # type: ignore[assignment]
    for name in list(layers.keys()):
        if mode == "full":
            layers[name] = _wrap(layers[name])
        else:
            block = layers[name]
            block = getattr(block, "_checkpoint_wrapped_module", block)
            block.attention.core = _wrap(block.attention.core)
