"""Frozen base projections stored in 16, 8 or 4 bits (QLoRA, Dettmers et al. 2023).

`FrozenLinear` is an `nn.Linear` whose weight never trains and is stored as `lora.base_dtype`
says (`config.choices.LoraBaseDtype`):

- 'auto': as the trainable parameters (nn.Linear unchanged; today's LoRA);
- 'bf16': the weight in bfloat16, 2 bytes per value;
- 'nf4': torchao's `NF4Tensor`, QLoRA's NormalFloat4 with double quantization: 4-bit codes, one
  absmax per block of 64 values quantized to int8 per block of 256 scales (+ one float
  factor per 256 scales and one mean per tensor), 0.5 + 1/64 + 4/16384 bytes per value;
- 'int8': torchao's int8 weight-only format (`Int8Tensor.from_hp(w, PerRow())`: symmetric
  per output row, scale = absmax / 127.5, codes clamped to [-128, 127]) kept as two plain
  parameters, `weight` (int8 codes) and `weight_scale` (one float per row), 1 + 4/in bytes
  per value.

The forward dequantizes the weight into the compute dtype and multiplies; the backward
dequantizes it again for the input gradient (the weight has none): only the stored form is
kept between forward and backward, never a float copy (torchao's `linear_nf4` for NF4, the
same autograd function written here for int8 and bf16).

Why the libraries: torchao's `NF4Tensor` is what torchtune's QLoRA shards with FSDP2 (it
implements `fsdp_pre_all_gather` / `fsdp_post_all_gather`, so FSDP2 all-gathers the 4-bit
codes and the scales, never a float weight), and its int8 quantization is the one
`Int8WeightOnlyConfig` applies. torchao's `Int8Tensor` itself is not used as the parameter:
it has no FSDP2 all-gather hooks and its linear keeps a full-size float copy of the weight for
backward; plain int8 codes and float scales shard along dim 0 with the weight's rows.

Quantization is of the WHOLE weight (`quantize_weight`), then each rank keeps its rows
(`models.init.copy_full_into`): NF4's per-tensor mean of the block scales is then the same
on every rank and in one process, so the sharded model dequantizes to the single-process one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.config.lora import NF4_BLOCK, nf4_scaler_block

__all__ = [
    "FrozenLinear",
    "quantize_weight",
    "is_quantized_storage",
]


def _torchao_nf4() -> Any:
    # imported when a model asks for NF4: torchao's import is slow and chatty
    from torchao.quantization import to_nf4

    return to_nf4


def quantize_weight(weight: torch.Tensor, base_dtype: str) -> dict[str, torch.Tensor]:
    """The stored form of a whole (out, in) weight: {'weight': ...} and, for int8, the
    per-row 'weight_scale'. Works on meta tensors (shapes only)."""
    w = weight.detach()
    if base_dtype == "bf16":
        return {"weight": w.to(torch.bfloat16)}
    if base_dtype == "nf4":
        block = nf4_scaler_block(w.numel())
        return {"weight": _torchao_nf4()(w.contiguous(), NF4_BLOCK, block)}
    if base_dtype == "int8":
        from torchao.quantization.granularity import PerRow
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

        # torchao quantizes fp32/bf16/fp16 only: a float64 weight (the parity tests) is
        # rounded to fp32 first; the scale is fp32 as torchao keeps it
        q = Int8Tensor.from_hp(w.float() if w.dtype == torch.float64 else w, PerRow())
        return {"weight": q.qdata, "weight_scale": q.scale.to(w.dtype)}
    raise ValueError(f"base_dtype={base_dtype!r}")


def is_quantized_storage(t: torch.Tensor) -> bool:
    """Whether `t` (or a DTensor's local shard) is a tensor subclass holding other tensors
    (NF4), which must be copied piece by piece."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return type(local) not in (torch.Tensor, nn.Parameter) and hasattr(local, "__tensor_flatten__")


def _dequantize(weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype):
    """The float weight of int8 codes x per-row scale, or of a bf16 weight, in `dtype`. The
    product torchao's `dequantize_affine` computes, written out because that function refuses
    float64 (the parity tests' dtype)."""
    if scale is None:
        return weight.to(dtype)
    return weight.to(dtype) * scale.to(dtype)  # (out, in) x (out, 1)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matmul runs in: autocast's where it is on (so the weight is dequantized
    straight to it), else the input's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class _DequantLinear(torch.autograd.Function):
    """y = x W^T for a frozen W kept as int8 codes + scales or bf16: W dequantized in forward
    and again in backward, nothing but its stored form saved (torchao's LinearNF4 for int8)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None):
        ctx.save_for_backward(weight, scale)
        return F.linear(x, _dequantize(weight, scale, _compute_dtype(x)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]  # torch's stub is generic
        weight, scale = ctx.saved_tensors
        return grad @ _dequantize(weight, scale, grad.dtype), None, None


class FrozenLinear(nn.Linear):
    """A projection with a frozen weight stored as `base_dtype` (module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        base_dtype: str = "auto",
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.base_dtype = base_dtype
        self.float_dtype = self.weight.dtype
        """The float dtype of the weight's values (NF4 keeps it for its scales and output)."""
        if base_dtype != "auto":
            self.weight.requires_grad_(False)
            # the stored form of the (uninitialized) weight: its shapes and dtypes
            self._set_storage(quantize_weight(self.weight, base_dtype))

    @property
    def quantized(self) -> bool:
        """Whether the weight is stored in another form than a trainable one."""
        return self.base_dtype != "auto"

    def _set_storage(self, pieces: dict[str, torch.Tensor]) -> None:
        for name, value in pieces.items():
            setattr(self, name, nn.Parameter(value, requires_grad=False))

    def storage_names(self) -> tuple[str, ...]:
        """The parameters holding the weight's stored form ('weight' and, for int8,
        'weight_scale')."""
        return ("weight", "weight_scale") if self.base_dtype == "int8" else ("weight",)

    def allocate_shared(self, device: torch.device | str) -> None:
        """After `to_empty`: give NF4's per-tensor pieces (the scales' mean and the 16-value
        code book) storage on `device`. torchao's `empty_like` re-allocates only the pieces
        it splits into shards, so a meta-built NF4 keeps those two on meta."""
        if self.base_dtype != "nf4":
            return
        local = _local(self.weight)
        for name in ("scaler_mean", "nf4"):
            setattr(local, name, torch.empty_like(getattr(local, name), device=device))

    def stored_pieces(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """`full` (the whole float weight) in this module's stored form, whole."""
        return quantize_weight(full.to(self.float_dtype), self.base_dtype)

    def dequantized(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """This rank's stored weight as floats (a shard's rows under FSDP2; no communication)."""
        local = [_local(getattr(self, n)) for n in self.storage_names()]
        out_dtype = dtype or self.float_dtype
        if self.base_dtype == "nf4":  # torchao's NF4Tensor
            return local[0].get_original_weight().to(out_dtype)  # type: ignore[attr-defined]
        return _dequantize(local[0], local[1] if len(local) > 1 else None, out_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.base_dtype == "auto":
            return super().forward(x)
        if self.base_dtype == "nf4":
            from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4

            y = linear_nf4(x, self.weight)
        else:
            scale = self.weight_scale if self.base_dtype == "int8" else None
            y = _DequantLinear.apply(x, self.weight, scale)
        return y if self.bias is None else y + self.bias


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (the object FSDP2 keeps, not a view), else `t`."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t
