"""Adafactor (Shazeer & Stern 2018) with its optional first moment, on plain and DTensor shards.

The algorithm is torch.optim.Adafactor's (torch 2.13, `_single_tensor_adafactor`): for an
m x n gradient G, an EMA of its row means R (m) and column means C (n) of G^2 stands for the
second moment, V = R C / mean(R) (the paper's Algorithm 4; a vector keeps an EMA of G^2 whole),
with the decay 1 - beta2_t = t^beta2_decay (t^-0.8: the paper's section 7.2); the update
U = G / sqrt(V) is clipped to RMS d (`Û = U / max(1, RMS(U) / d)`, section 6) and scaled by the
relative step alpha_t = max(eps2, RMS(X)) * min(lr, 1/sqrt(t)) (section 8: the scheduled lr caps
the paper's 1/sqrt(t)); decoupled weight decay multiplies X by 1 - lr * weight_decay.

What it adds to torch's:

- **beta1**, the first moment of the paper's section 5 / Algorithm 1 as T5X (Mesh TensorFlow's
  `AdafactorOptimizer`: `beta1 * old_m + (1 - beta1) * subtrahend`) and Hugging Face's
  `transformers.optimization.Adafactor` keep it: an EMA of the clipped, scaled update,
  M_t = beta1 M_{t-1} + (1 - beta1) alpha_t Û_t, X_t = X_{t-1} - M_t (no bias correction). It
  costs one parameter-sized state (`exp_avg`, the parameter's dtype); beta1 = 0 keeps none and
  steps as torch's Adafactor (its operations, in its order; the step's scalars are tensors here,
  not Python floats, so they round once more: equal within float rounding, tested).
- **relative_step=False**: alpha_t = lr, the scheduled lr as an absolute step (Hugging Face's
  `relative_step=False, scale_parameter=False`); True is the paper's relative step (above).
- **DTensor parameters** (FSDP2's Shard(0), tensor-parallel shards): the row/column means, the
  mean of R and the RMS of X and U reduce over the whole tensor, not one shard. torch's kernel
  squares its partial norms in place, which DTensor refuses; here every reduction whose result
  is partial is settled (all-reduced) before it is used, so the states keep the shard layout
  the operations give them (R sharded like the rows, C replicated under FSDP2) and DCP saves them
  as DTensors. The cost under FSDP2, per matrix: all-reduces of C (n values) and of three
  scalars (mean(R), RMS(X), RMS(U)); per vector, of the two RMS values. No host sync: the
  step's scalars stay on the device (torch's kernel reads two norms with `.item()`), which is
  also what lets the dry-run's fake tensors, which have no values, run it.

Why not Hugging Face's Adafactor (it has beta1): `transformers` is a dev (test) dependency of
scaletrain only, and its step builds states with `torch.zeros(shape).to(grad)` (a plain tensor
beside a DTensor gradient) and reduces per shard, so it cannot step FSDP2's shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, overload

import torch
from torch.optim.optimizer import ParamsT

from scaletrain.dtensor import is_dtensor

__all__ = ["Adafactor"]


def _settled(t: torch.Tensor) -> torch.Tensor:
    """`t` with every partial (pending-reduction) placement reduced to Replicate: a reduction
    over a sharded dim is whole only then. A plain tensor, or a DTensor with no partial
    placement, as is (no communication)."""
    if not is_dtensor(t) or not any(pl.is_partial() for pl in t.placements):
        return t
    from torch.distributed.tensor import Replicate

    placements = [Replicate() if pl.is_partial() else pl for pl in t.placements]
    return t.redistribute(t.device_mesh, placements)


class Adafactor(torch.optim.Optimizer):
    """Adafactor with an optional first moment, for plain and DTensor parameters (module
    docstring). Arguments as torch.optim.Adafactor's, plus `beta1` (0 = no first moment)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        beta1: float = 0.0,
        beta2_decay: float = -0.8,
        eps: tuple[float | None, float] = (None, 1e-3),
        d: float = 1.0,
        weight_decay: float = 0.0,
        relative_step: bool = True,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr should be >= 0, got {lr}")
        if not 0.0 <= beta1 < 1.0:
            raise ValueError(f"beta1 should be in [0, 1), got {beta1}")
        if not beta2_decay <= 0.0:
            raise ValueError(f"beta2_decay should be <= 0, got {beta2_decay}")
        if not d >= 1.0:
            raise ValueError(f"clipping threshold d should be >= 1, got {d}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay should be >= 0, got {weight_decay}")
        defaults = {
            "lr": lr,
            "beta1": beta1,
            "beta2_decay": beta2_decay,
            "eps": eps,
            "d": d,
            "weight_decay": weight_decay,
            "relative_step": relative_step,
        }
        super().__init__(params, defaults)

    # torch.optim.Optimizer.step's two overloads: the loss comes back only with a closure
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_one(p, p.grad, self.state[p], group)
        return loss

    def _step_one(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        """One parameter's update, in torch's order of operations (module docstring). The
        step's scalars stay tensors on the parameter's device: no host sync, and the dry-run's
        fake tensors (which have no values to read) take the same path."""
        if torch.is_complex(p) or grad.is_sparse:
            raise RuntimeError("Adafactor takes real, dense parameters and gradients")
        lr, beta1, d, wd = float(group["lr"]), group["beta1"], group["d"], group["weight_decay"]
        eps1, eps2 = group["eps"]
        if eps1 is None:
            eps1 = torch.finfo(p.dtype).eps
        if "step" not in state:
            # a CPU scalar as torch's (float32: exact for step counts up to 2^24)
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["step"] += 1
        # the step's scalars in the parameter's precision (at least fp32), on its device
        t = state["step"].to(grad.device, torch.promote_types(p.dtype, torch.float32))
        one_minus_beta2_t = t.pow(group["beta2_decay"])
        alpha: torch.Tensor | float = lr
        if group["relative_step"]:
            rho_t = t.rsqrt().clamp_(max=lr)  # min(lr, 1/sqrt(t))
            rms_x = _settled(p.norm(2)) / math.sqrt(p.numel())
            alpha = rms_x.clamp(min=eps2) * rho_t
        if wd != 0:
            p.mul_(1 - lr * wd)
        if grad.dim() > 1:
            # (g * g).mean over the columns / the rows, without a gradient-sized temporary
            row_mean = _settled(torch.norm(grad, dim=-1, keepdim=True)).square_()
            row_mean.div_(grad.size(-1))
            col_mean = _settled(torch.norm(grad, dim=-2, keepdim=True)).square_()
            col_mean.div_(grad.size(-2))
            if "row_var" not in state:
                state["row_var"] = torch.zeros_like(row_mean)
                state["col_var"] = torch.zeros_like(col_mean)
            row_var, col_var = state["row_var"], state["col_var"]
            row_var.lerp_(row_mean, one_minus_beta2_t)
            col_var.lerp_(col_mean, one_minus_beta2_t)
            var_estimate = row_var @ col_var  # (m, 1) @ (1, n): the outer product R C
            # mean(R) as a sum over the rows over their count (a sharded dim's sum is exact;
            # a per-shard mean is not when the shards are uneven)
            mean_r = _settled(row_var.sum(dim=-2, keepdim=True)).div_(row_var.size(-2))
            var_estimate.div_(mean_r.clamp_(min=eps1))
        else:
            if "variance" not in state:
                state["variance"] = torch.zeros_like(grad)
            state["variance"].lerp_(grad * grad, one_minus_beta2_t)
            var_estimate = state["variance"].clone()  # not written into by the update
        # eps1 squared: its square root keeps eps1's magnitude
        update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
        update.mul_(grad)
        rms_u = _settled(update.norm(2)) / math.sqrt(update.numel())
        # the clipped, scaled update alpha_t U / max(1, RMS(U) / d)
        update.mul_(alpha / (rms_u / d).clamp_(min=1.0))
        if beta1 == 0:
            p.sub_(update)
            return
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p)
        exp_avg = state["exp_avg"]
        exp_avg.mul_(beta1).add_(update, alpha=1 - beta1)
        p.sub_(exp_avg)
