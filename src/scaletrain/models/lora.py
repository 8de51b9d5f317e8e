"""LoRA (Hu et al. 2021): a trainable low-rank update beside each targeted frozen projection.

`LoRALinear` is an `nn.Linear` (the frozen base W, its names unchanged: checkpoints, the HF
export and the initialization see the same `...wq.weight`) with two more Linears, `lora_A`
(rank x in) and `lora_B` (out x rank), and computes y = W x + b + scale * B A dropout(x),
scale = alpha / rank: PEFT's `LoraLayer` forward, with PEFT's module names, so an adapter's
weights are PEFT's `...q_proj.lora_A.weight` under another prefix. B starts at zero (the
model starts as the base), A Kaiming-uniform with a = sqrt(5) as PEFT's `reset_lora_parameters`
(`models.init` draws both, by name, rank-independently).

With `lora.base_dtype` other than 'auto' the frozen weight is stored in bf16, NF4 or int8
(`models.quantized.FrozenLinear`, which `LoRALinear` extends), and the block's projections
without an adapter become `FrozenLinear`s too (QLoRA quantizes every linear of the blocks).

`apply_lora` swaps the targeted projections of every block on the (meta) model before it is
parallelized and freezes every other parameter: only the adapters have gradients, so the
trainer's optimizer (built over the parameters that require a gradient) holds only their
states. Applied from outside like a parallel strategy, but it changes the function, so it
lives with the model; rank 0 is a no-op.
"""

from __future__ import annotations

import torch
from torch import nn

from scaletrain.config.lora import LoraConfig

from .quantized import FrozenLinear
from .transformer import Transformer

__all__ = [
    "FrozenLinear",
    "LoRALinear",
    "apply_lora",
    "is_adapter",
    "merge_adapters",
    "merged_weight",
]

_ATTENTION = ("wq", "wk", "wv", "wo")
_PROJECTIONS = (*_ATTENTION, "w1", "w2", "w3")


class LoRALinear(FrozenLinear):
    """A frozen Linear plus its low-rank adapter (see the module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        rank: int,
        scale: float,
        dropout: float,
        base_dtype: str = "auto",
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            in_features, out_features, bias=bias, base_dtype=base_dtype, device=device, dtype=dtype
        )
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=device, dtype=dtype)
        self.lora_dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale


def is_adapter(name: str) -> bool:
    """Whether a parameter name is an adapter's (`lora_A` / `lora_B`)."""
    return ".lora_A." in name or ".lora_B." in name


def apply_lora(model: Transformer, lora: LoraConfig) -> Transformer:
    """Give `lora.targets` of every block an adapter and freeze all else, in place (a model on
    any device; the adapters are allocated like their base, initialized by `materialize`)."""
    if not lora.enabled:
        return model
    for block in model.blocks():
        for name in lora.target_names:
            _swap(block, name, lora)
        if lora.quantized:  # the projections without an adapter are frozen and stored alike
            for name in _PROJECTIONS:
                if name not in lora.target_names:
                    _swap(block, name, lora, adapter=False)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return model


def _swap(block: nn.Module, name: str, lora: LoraConfig, adapter: bool = True) -> None:
    """Replace projection `name` of `block` by a LoRALinear (or, adapter=False, a
    FrozenLinear) of the same shape, device and dtype; absent projections (w3 of a GELU MLP)
    are left alone."""
    parent = block.attention if name in _ATTENTION else block.feed_forward
    base = getattr(parent, name, None)
    if base is None:
        return
    assert isinstance(base, nn.Linear), f"{name} is not a Linear"  # config checked
    bias, device, dtype = base.bias is not None, base.weight.device, base.weight.dtype
    if adapter:
        swapped: FrozenLinear = LoRALinear(
            base.in_features,
            base.out_features,
            bias=bias,
            rank=lora.rank,
            scale=lora.scale,
            dropout=lora.dropout,
            base_dtype=lora.base_dtype,
            device=device,
            dtype=dtype,
        )
    else:
        swapped = FrozenLinear(
            base.in_features,
            base.out_features,
            bias=bias,
            base_dtype=lora.base_dtype,
            device=device,
            dtype=dtype,
        )
    setattr(parent, name, swapped)


def merged_weight(
    weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float
) -> torch.Tensor:
    """W + scale * B A, in W's dtype (the product in at least fp32)."""
    acc = torch.promote_types(weight.dtype, torch.float32)
    delta = lora_b.to(acc) @ lora_a.to(acc)  # (out, rank) @ (rank, in)
    return (weight.to(acc) + scale * delta).to(weight.dtype)


def merge_adapters(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A full state dict with every adapter folded into its base weight and dropped."""
    out = {k: v for k, v in state.items() if not is_adapter(k)}
    for key in state:
        if key.endswith(".lora_A.weight"):
            base = key.removesuffix(".lora_A.weight")
            out[f"{base}.weight"] = merged_weight(
                state[f"{base}.weight"], state[key], state[f"{base}.lora_B.weight"], scale
            )
    return out
