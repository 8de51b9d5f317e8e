"""Mixed precision: autocast contexts and a dynamic loss scaler that works under any sharding.

fp32: nothing. bf16: autocast to bfloat16 for matmuls, fp32 master weights and optimizer states
(with FSDP2 the MixedPrecisionPolicy casts instead; autocast is then a no-op on bf16 params).
fp16: the same with float16 plus dynamic loss scaling (Micikevicius et al. 2018): multiply the
loss by S, unscale the gradients, skip the step and halve S when any gradient is inf/NaN, double S
after `growth_interval` clean steps. The overflow check is all-reduced (MAX) over every rank so
sharded ranks (FSDP, TP, PP) agree on skipping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.distributed as dist

from scaletrain.config import PrecisionConfig, precision_spec
from scaletrain.dtensor import to_local

from .host import host_float

__all__ = ["compute_dtype", "autocast", "LossScaler"]


def compute_dtype(precision: PrecisionConfig) -> torch.dtype:
    """Dtype of matmul inputs (fp8 linears run their own float8 kernels; the rest is bf16)."""
    return getattr(torch, precision_spec(precision.dtype).compute)


def autocast(precision: PrecisionConfig, device_type: str) -> contextlib.AbstractContextManager:
    dtype = compute_dtype(precision)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


class LossScaler:
    """Dynamic loss scaling; disabled (scale 1, never skips unless non-finite) outside fp16."""

    def __init__(self, precision: PrecisionConfig):
        self.enabled = precision.dtype == "fp16"
        self.scale = float(precision.loss_scale_init) if self.enabled else 1.0
        self.growth_interval = precision.loss_scale_growth_interval
        self.good_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_and_check(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Unscale grads in place; return True when every grad on every rank is finite.

        Outside fp16 there is nothing to unscale and the check is the gradient norm's (a
        non-finite gradient makes the global norm non-finite), so this costs nothing there.
        In fp16 one fused kernel unscales and checks all local grads (torch's AMP kernel), and
        the verdict is all-reduced (MAX) so every rank skips the same step.
        """
        if not self.enabled:
            return True
        grads = [to_local(p.grad) for p in params if p.grad is not None]
        device = grads[0].device if grads else torch.device("cpu")
        found_inf = torch.zeros(1, dtype=torch.float32, device=device)
        inv_scale = torch.full((1,), 1.0 / self.scale, dtype=torch.float32, device=device)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for group in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
        if dist.is_initialized():
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        return host_float(found_inf, unknown=0.0) == 0

    def update(self, finite: bool) -> None:
        if not finite:
            self.skipped_steps += 1
            self.good_steps = 0
            if self.enabled:
                self.scale = max(self.scale / 2.0, 1.0)
            return
        self.good_steps += 1
        if self.enabled and self.good_steps % self.growth_interval == 0:
            self.scale *= 2.0

    def state_dict(self) -> dict[str, float | int]:
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, sd: dict[str, float | int]) -> None:
        self.scale = float(sd["scale"])
        self.good_steps = int(sd["good_steps"])
        self.skipped_steps = int(sd["skipped_steps"])
