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

from scaletrain.config import ConfigError, PrecisionConfig, precision_problem, precision_spec
from scaletrain.config.hardware_rules import CPU_ARCH, GpuArch, amd_arch, nvidia_arch, runs_tf32
from scaletrain.dtensor import to_local

from .host import host_float

__all__ = [
    "compute_dtype",
    "autocast",
    "LossScaler",
    "device_arch",
    "check_device_precision",
    "set_tf32",
]


def compute_dtype(precision: PrecisionConfig) -> torch.dtype:
    """Dtype of matmul inputs (fp8 linears run their own float8 kernels; the rest is bf16)."""
    return getattr(torch, precision_spec(precision.dtype).compute)


def autocast(precision: PrecisionConfig, device_type: str) -> contextlib.AbstractContextManager:
    dtype = compute_dtype(precision)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def device_arch(device: torch.device) -> GpuArch:
    """The generation of the device a rank runs on, for `config.hardware_rules`: a CUDA
    device's compute capability (a ROCm device's gfx target); `CPU_ARCH` off CUDA."""
    if device.type != "cuda":
        return CPU_ARCH
    if torch.version.hip:  # ROCm reports gfx9xx as capability 9.x: the gfx target is exact
        return amd_arch(torch.cuda.get_device_properties(device).gcnArchName)
    return nvidia_arch(torch.cuda.get_device_capability(device))


def check_device_precision(precision: PrecisionConfig, device: torch.device) -> None:
    """Refuse, before any work, a precision the device cannot run (bf16 on a V100, fp8 on an
    A100): one `ConfigError` naming precision.dtype and the GPU. A CPU runs every precision."""
    arch = device_arch(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    problem = precision_problem(precision.dtype, arch, name)
    if problem is not None:
        raise ConfigError("precision.dtype", precision.dtype, problem)


def set_tf32(precision: PrecisionConfig, device: torch.device) -> bool:
    """Run fp32 matmuls on TF32 tensor cores when `precision.tf32` and the device has them
    (NVIDIA sm80+), IEEE fp32 otherwise; returns whether TF32 is on. The planner times fp32
    matmuls by the same rule (`HardwareSpec.flops(tf32=...)`). Set through torch's
    per-backend API (`torch.backends.cuda.matmul.fp32_precision`), the one torch 2.13 asks
    for: mixing it with the legacy `allow_tf32`/`set_float32_matmul_precision` is an error
    when the precision is read."""
    on = precision.tf32 and runs_tf32(device_arch(device))
    torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
    return on


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
