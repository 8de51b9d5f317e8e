"""Optimizer (optionally with its states offloaded to host memory) and learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, overload

import torch
from torch._guards import detect_fake_mode
from torch.optim.adamw import adamw
from torch.optim.optimizer import ParamsT

from scaletrain.config import BatchConfig, ConfigError, OptimConfig
from scaletrain.dtensor import local_bytes
from scaletrain.parallel import ParallelDims, wrap_optimizer

from .adafactor import Adafactor

__all__ = [
    "build_optimizer",
    "lr_at",
    "lr_scale",
    "lr_scale_line",
    "set_lr",
    "CPUOffloadAdamW",
    "state_bytes",
]


class CPUOffloadAdamW(torch.optim.Optimizer):
    """AdamW whose moments live in host memory and whose update runs on the CPU.

    ZeRO-Offload's split (Ren et al. 2021): the accelerator keeps parameters and gradients, the
    host keeps the optimizer states and runs the step. Per step and parameter the gradient and
    the fp32 parameter go to the host (8 B), the updated parameter comes back (4 B); the
    moments (8 B/param) never touch device memory. scaletrain's parameters are fp32, so there is
    no separate master copy. The update is torch's own fused AdamW kernel on the host copies
    (the kernel `build_optimizer` picks for CPU runs), so results equal
    `torch.optim.AdamW(fused=True)` on the same values (tested bitwise on CPU, where the host
    copies are the parameters themselves). Plain tensors only: FSDP/TP
    (DTensor) parameters use `memory.offload=params` instead.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )
        self._pin = torch.cuda.is_available()  # pinned host buffers: async copies

    def _host_zeros(self, p: torch.Tensor) -> torch.Tensor:
        return torch.zeros(p.shape, dtype=torch.float32, device="cpu", pin_memory=self._pin)

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
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            host, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in live:
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32)
                    st["exp_avg"], st["exp_avg_sq"] = self._host_zeros(p), self._host_zeros(p)
                host.append(p.detach().to("cpu", torch.float32, non_blocking=True))
                grads.append(p.grad.detach().to("cpu", torch.float32, non_blocking=True))
                exp_avgs.append(st["exp_avg"])
                exp_avg_sqs.append(st["exp_avg_sq"])
                steps.append(st["step"])
            if any(p.device.type == "cuda" for p in live):
                torch.cuda.synchronize()  # the host copies have landed
            beta1, beta2 = group["betas"]
            adamw(
                host,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                fused=True,
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )
            for p, h in zip(live, host, strict=True):
                if h is not p:  # on a CPU run the host copy *is* the parameter
                    p.copy_(h, non_blocking=True)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # torch moves loaded states to each parameter's device: bring them back to the host
        for st in self.state.values():
            for k, v in st.items():
                if torch.is_tensor(v) and v.device.type != "cpu":
                    st[k] = v.to("cpu")


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    optim: OptimConfig,
    device_type: str,
    dims: ParallelDims | None = None,
    offload: str = "none",
) -> torch.optim.Optimizer:
    """AdamW (torch's fused kernel, on CUDA and CPU), 8-bit AdamW (torchao), Adafactor or
    SGD with momentum; ZeRO-1 shards its states; offload='optimizer' keeps AdamW's states on
    the host (`CPUOffloadAdamW`).

    Weight decay applies to matrices only (embeddings and linears), not to norms or biases, the
    GPT-2/Llama convention.
    """
    # groups by (decay?, DTensor?): foreach/fused kernels cannot mix DTensors (TP shards) with
    # plain tensors (parameters TP leaves replicated) in one group
    by_kind: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for p in params:
        if p.requires_grad:
            by_kind.setdefault((p.ndim >= 2, hasattr(p, "device_mesh")), []).append(p)
    groups: list[dict[str, Any]] = [
        {"params": ps, "weight_decay": optim.weight_decay if decay else 0.0}
        for (decay, _), ps in sorted(by_kind.items(), key=lambda kv: kv[0], reverse=True)
    ]
    if offload == "optimizer" and optim.name != "adamw":
        raise ConfigError(
            "memory.offload",
            offload,
            "optimizer offload runs AdamW on the host: set optim.name=adamw or memory.offload=none",
        )
    cls: type[torch.optim.Optimizer]
    kw: dict[str, Any]
    if offload == "optimizer":
        cls, kw = (
            CPUOffloadAdamW,
            {"lr": optim.lr, "betas": (optim.beta1, optim.beta2), "eps": optim.eps},
        )
    elif optim.name == "sgd":
        cls, kw = torch.optim.SGD, {"lr": optim.lr, "momentum": optim.momentum}
    elif optim.name == "adamw8bit":
        cls = _adamw8bit_class(eager=device_type != "cuda")
        kw = {"lr": optim.lr, "betas": (optim.beta1, optim.beta2), "eps": optim.eps}
    elif optim.name == "adafactor":
        # Shazeer & Stern 2018: a factored second moment (a row and a column vector per
        # matrix), the update clipped to RMS d=1, optim.beta1 > 0 adds the first moment (an
        # EMA of the update), optim.relative_step scales the step by each parameter's RMS;
        # beta2 does not apply (its decay follows 1 - step^-0.8). torch.optim.Adafactor's
        # algorithm plus those two, stepping FSDP2's DTensor shards (`adafactor.py`)
        cls = Adafactor
        kw = {"lr": optim.lr, "beta1": optim.beta1, "relative_step": optim.relative_step}
    else:
        # fused on CPU too (torch >= 2.4): one kernel per group instead of foreach's per-tensor
        # fallback on CPU; 3.5 -> 0.74 ms per step for the nanoGPT CPU recipe's 35 tensors (one
        # thread), parameters equal to foreach's within fp32 rounding (2.4e-7 after 50 steps)
        fused = device_type in ("cuda", "cpu")
        cls, kw = (
            torch.optim.AdamW,
            {
                "lr": optim.lr,
                "betas": (optim.beta1, optim.beta2),
                "eps": optim.eps,
                "fused": fused or None,
                "foreach": None if fused else True,
            },
        )
    if dims is None:
        return cls(groups, **kw)
    return wrap_optimizer(cls, groups, dims, **kw)


def _adamw8bit_class(*, eager: bool) -> type[torch.optim.Optimizer]:
    """torchao's AdamW8bit (imported here only: the `lowbit` extra), stepped eagerly off CUDA.

    Its states are `OptimState8bit` tensors: uint8 codes plus one fp32 absmax per block of 256
    values, dequantized through a 256-entry dynamic map (signed for m, unsigned for v;
    Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"); tensors under 4,096
    values (norms, biases) keep fp32 states, bitsandbytes' rule. They are wrapped as DTensors
    for DTensor parameters (FSDP2/TP), so DCP saves and reshards them like AdamW's.
    torchao compiles its per-parameter step with torch.compile; on CPU that costs about a
    minute of C++ compilation per parameter shape on our loaded hosts, so off CUDA it runs
    eagerly (`torch.compiler.set_stance("force_eager")`): the same operations, unfused. So
    does the dry-run's step (fake tensors; the dry-run runs the model eagerly as well).
    """
    try:
        from torchao.optim import AdamW8bit
    except ImportError as e:  # an optional dependency: say how to get it
        raise ConfigError(
            "optim.name",
            "adamw8bit",
            f"needs torchao ({e}): pip install 'scaletrain[lowbit]' (or pip install torchao), "
            "or use optim.name=adamw",
        ) from e
    _warm_quantization_maps()

    class EagerAdamW8bit(AdamW8bit):
        @torch.no_grad()
        def step(self, closure: Callable[[], float] | None = None) -> float | None:
            # under fake tensors (the dry-run, which runs the model eagerly too) torch.compile
            # cannot trace: a non-infra dispatch mode is active
            if eager or detect_fake_mode() is not None:
                with torch.compiler.set_stance("force_eager"):
                    return super().step(closure)
            return super().step(closure)

    return EagerAdamW8bit


def _warm_quantization_maps() -> None:
    """Build torchao's two 256-entry dynamic maps now, on real tensors: they are made lazily at
    the first step (`subclass_8bit.get_qmap_signed` / `_unsigned`, cached) through `.tolist()`,
    which a step under fake tensors (the dry-run) cannot run: it has no data."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torchao.optim import subclass_8bit

    with unset_fake_temporarily():
        subclass_8bit.get_qmap_signed()
        subclass_8bit.get_qmap_unsigned()


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors on this rank (local shards of DTensors; torchao's
    8-bit states count their codes, block scales and shared map), scalars such as `step` too."""
    total = 0
    for st in optimizer.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                total += local_bytes(v)
    return total


def lr_scale(optim: OptimConfig, *, batch: BatchConfig) -> float:
    """The factor `optim.lr_scaling` applies to `optim.lr` for this global batch, in tokens per
    step against `optim.lr_reference_batch`: linear (Goyal et al. 2017, "Accurate, Large
    Minibatch SGD": k times the batch, k times the lr) or its square root (Krizhevsky 2014;
    Malladi et al. 2022's square-root rule for Adam); 1 with 'none'."""
    if optim.lr_scaling == "none":
        return 1.0
    ratio = batch.global_batch * batch.seq_len / optim.lr_reference_batch
    return ratio if optim.lr_scaling == "linear" else math.sqrt(ratio)


def lr_scale_line(optim: OptimConfig, *, batch: BatchConfig) -> str | None:
    """The line a run prints once at its start when its lr is scaled (None with 'none')."""
    if optim.lr_scaling == "none":
        return None
    tokens = batch.global_batch * batch.seq_len
    k = lr_scale(optim, batch=batch)
    return (
        f"lr scaled {optim.lr_scaling}: {tokens} tokens/step vs reference "
        f"{optim.lr_reference_batch} -> x{k:.4g}, peak lr {optim.lr:g} -> {optim.lr * k:.4g}"
    )


def lr_at(step: int, *, optim: OptimConfig, batch: BatchConfig, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then the decay; the
    peak is `optim.lr` times `lr_scale` (the floor follows it, min_lr_ratio of the peak)."""
    peak = optim.lr * lr_scale(optim, batch=batch)
    floor = peak * optim.min_lr_ratio
    if optim.warmup_steps and step < optim.warmup_steps:
        return peak * (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return peak
    span = max(1, total_steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / span)
    if optim.schedule == "linear":
        return peak + (floor - peak) * progress
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if torch.is_tensor(group["lr"]):
            # torchao's optimizers keep lr as a tensor (so that a compiled step need not
            # recompile per value) and refuse a float in its place
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
