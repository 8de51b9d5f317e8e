"""Mixture-of-experts feed-forward (Mixtral style): top-k router + stacked expert weights.

The layer is split so that expert parallelism can replace only the dispatch: `MoE.forward`
routes tokens, sorts them by expert and calls `GroupedExperts.forward(x_sorted,
num_tokens_per_expert)`; an all_to_all around that call moves the sorted tokens to the ranks
that own the experts without touching the routing or the expert math.

Under fake tensors (the dry-run) the token counts per expert have no values, and the dispatch
needs them as Python ints (split sizes). There the layer assumes a perfectly balanced router:
each of the E experts receives N·k/E of the N·k (token, expert) assignments (the remainder
spread one each over the first experts), on every rank alike (`balanced_counts`). Memory of a
real step then matches when the router is balanced (what the load-balancing loss drives it
to); a skewed router makes the busiest expert's activations larger than measured. Real
tensors always take the exact data-dependent path.

The permutation (sort by expert, gather, weighted scatter-add back) is done once per forward
(`models.moe_dispatch`), with an optional expert capacity (token dropping, padded or not:
`config.ModelConfig.moe_capacity_factor`). With padding every shape is static, so the dry-run
takes the real path (no balanced-router assumption); unpadded, under fake tensors each expert
runs min(N·k/E, C) rows of the balanced router.

The experts run as grouped GEMMs on the expert-sorted tokens (`grouped_expert_mlp`): one
`torch._grouped_mm` per projection where torch 2.13 runs it on every backend and under fake
tensors (bf16 with 16-byte-aligned rows), else one `torch.bmm` per projection over a padded
(E, C, h) block (C = the busiest expert's rows); either way the number of ops per forward does
not grow with the number of experts. fp8 experts keep one GEMM per expert (each expert has its
own float8 scales: `precision.fp8.Float8ExpertLinear`); that loop takes its experts' weights
with one `unbind` (`ExpertWeights.unbind`): `w[e]` slices each received their gradient as a
full zero-filled (E, f, h) stack plus an add (autograd's SelectBackward), O(E^2) bytes per step,
72% of a 64-expert layer's backward on this project's CPU (benchmarks/moe_experts.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..config.choices import MoEDropPolicy
from ..numerics import upcast
from .moe_dispatch import Capacity, balanced_counts, combine, permute

__all__ = [
    "EXPERT_WEIGHTS",
    "ExpertWeights",
    "ExpertKernel",
    "GroupedExperts",
    "expert_kernel",
    "grouped_expert_mlp",
    "MoE",
    "balanced_counts",
    "expert_mlp",
    "gate_activation",
    "host_counts",
    "is_fake",
    "moe_aux_loss",
]


def is_fake(t: torch.Tensor) -> bool:
    """True for a `FakeTensor` (shapes only, no values): the dry-run's tensors."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return bool(_is_fake(t))


def expert_mlp(
    x: torch.Tensor,
    activation: str,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor | None = None,
    b1: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    b3: torch.Tensor | None = None,
    *,
    linear: Callable[..., torch.Tensor] = F.linear,
) -> torch.Tensor:
    """One expert's MLP on its tokens, x: (n_e, h) -> (n_e, h); weights (out, in) as nn.Linear.

    SwiGLU with `w3`: w2(silu(w1 x) * w3 x) (GeGLU: tanh-GELU for silu); GELU without:
    w2(gelu(w1 x)), the tanh form unless `activation` is 'gelu_exact'.
    """
    up = linear(x, w1, b1)  # (n_e, f)
    if w3 is not None:
        up = gate_activation(up, activation) * linear(x, w3, b3)
    else:
        up = F.gelu(up, approximate="none" if activation == "gelu_exact" else "tanh")
    return linear(up, w2, b2)


def gate_activation(gate: torch.Tensor, activation: str) -> torch.Tensor:
    """A gated MLP's gate nonlinearity: tanh-GELU for 'geglu' (Gemma), SiLU for 'swiglu'."""
    return F.gelu(gate, approximate="tanh") if activation == "geglu" else F.silu(gate)


class ExpertWeights(NamedTuple):
    """`GroupedExperts`' weights in `expert_mlp`'s argument order: stacked (E, ...) or one
    expert's; `w1`, `w2` always exist, the others are None where absent."""

    w1: torch.Tensor
    w2: torch.Tensor
    w3: torch.Tensor | None
    b1: torch.Tensor | None
    b2: torch.Tensor | None
    b3: torch.Tensor | None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ExpertWeights:
        """`fn` applied to every present weight (e.g. the local shard of a DTensor)."""

        def opt(w: torch.Tensor | None) -> torch.Tensor | None:
            return None if w is None else fn(w)

        return ExpertWeights(
            fn(self.w1), fn(self.w2), opt(self.w3), opt(self.b1), opt(self.b2), opt(self.b3)
        )

    def unbind(self) -> list[ExpertWeights]:
        """Every expert's weights, from stacked ones, in one `unbind` per weight: its backward
        stacks the E gradients once, where E `w[e]` selects would each zero-fill a full
        (E, ...) gradient (O(E^2) bytes)."""
        w1, w2 = self.w1.unbind(0), self.w2.unbind(0)
        rest = [None if w is None else w.unbind(0) for w in (self.w3, self.b1, self.b2, self.b3)]
        return [
            ExpertWeights(w1[e], w2[e], *(None if p is None else p[e] for p in rest))
            for e in range(len(w1))
        ]


EXPERT_WEIGHTS = ExpertWeights._fields
"""`GroupedExperts`' stacked parameters, in `expert_mlp`'s argument order."""

ExpertKernel = Literal["auto", "grouped_mm", "padded_bmm", "loop"]
"""How `grouped_expert_mlp` runs the experts' GEMMs: 'grouped_mm' (`torch._grouped_mm`, one
per projection), 'padded_bmm' (`torch.bmm` over (E, C, h) blocks padded to the busiest
expert), 'loop' (one `linear` per expert: the reference, and fp8's path), 'auto' (the first
that is valid: `expert_kernel`)."""


def expert_kernel(x: torch.Tensor, weights: ExpertWeights, linear: Callable) -> ExpertKernel:
    """The kernel 'auto' picks for these tokens and stacked weights.

    - 'loop' for a `linear` other than F.linear (fp8: per-expert scales) or weights that are
      tensor subclasses (a DTensor has no grouped-GEMM sharding rule);
    - 'grouped_mm' where torch 2.13's `_grouped_mm` runs and every operand's row stride is a
      multiple of 16 bytes (checked on CPU too): bf16 anywhere (CUDA: CUTLASS on sm90/sm100,
      a bmm fallback elsewhere; CPU; its meta kernel, i.e. fake tensors, takes bf16 only), and
      fp32 on real CPU tensors (its CPU kernel: as fast as the loop, benchmarks/moe_experts.py);
    - 'padded_bmm' otherwise (fp32 on CUDA or under fake tensors, fp16, float64, unaligned).
    """
    plain = (torch.Tensor, nn.Parameter)
    if linear is not F.linear or not all(
        type(w) in plain or is_fake(w) for w in weights if w is not None
    ):
        return "loop"
    f, h = weights.w1.shape[-2:]
    dtype = _matmul_dtype(x)
    if not all(d * dtype.itemsize % 16 == 0 for d in (f, h)):
        return "padded_bmm"
    if dtype == torch.bfloat16:
        return "grouped_mm"
    cpu_fp32 = dtype == torch.float32 and x.device.type == "cpu" and not is_fake(x)
    return "grouped_mm" if cpu_fp32 else "padded_bmm"


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype F.linear would compute in: autocast's where it is on and x is eligible (16-
    or 32-bit float; autocast leaves float64 alone, and does not cast `_grouped_mm`'s inputs,
    so the grouped kernels cast them themselves), else x's."""
    dev = x.device.type
    eligible = x.dtype in (torch.float32, torch.float16, torch.bfloat16)
    return torch.get_autocast_dtype(dev) if eligible and torch.is_autocast_enabled(dev) else x.dtype


def grouped_expert_mlp(
    x: torch.Tensor,
    counts: list[int],
    activation: str,
    weights: ExpertWeights,
    *,
    linear: Callable[..., torch.Tensor] = F.linear,
    kernel: ExpertKernel = "auto",
) -> torch.Tensor:
    """Every expert's `expert_mlp` on its rows: x (N, h) sorted by expert, `counts[e]` rows
    of expert e (sum N), stacked weights (E, ...) -> (N, h), rows in x's order."""
    if kernel == "auto":
        kernel = expert_kernel(x, weights, linear)
    if kernel == "loop":
        outs = [
            expert_mlp(chunk, activation, *w_e, linear=linear)
            for w_e, chunk in zip(weights.unbind(), torch.split(x, counts), strict=True)
        ]
        return torch.cat(outs, dim=0) if outs else x.new_zeros(0, x.shape[-1])
    dtype = _matmul_dtype(x)
    x = x.to(dtype)
    w = weights.map(lambda t: t.to(dtype))
    n, num_experts = x.shape[0], len(counts)
    rows = torch.tensor(counts, dtype=torch.int64, device=x.device)  # (E,)
    expert_of = torch.repeat_interleave(  # (N,) expert of each sorted row
        torch.arange(num_experts, device=x.device), rows, output_size=n
    )
    if kernel == "grouped_mm" and n > 0:  # (no rows, e.g. an EP rank nobody routed to: bmm)
        offs = torch.cumsum(rows, 0).to(torch.int32)  # (E,) end row of each expert

        def project(a: torch.Tensor, wt: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            y = torch._grouped_mm(a, wt.transpose(-2, -1), offs=offs)  # (N, out)
            return y if b is None else y + b[expert_of]

        y = _mlp(x, activation, w, project)
        return _ContiguousGrad.apply(y)
    # padded_bmm: row i of expert e goes to slot e*C + (i - start_e) of an (E*C, h) block
    cap = max(counts, default=0)
    starts = torch.cumsum(rows, 0) - rows  # (E,)
    slot = torch.arange(n, device=x.device) - starts[expert_of] + expert_of * cap  # (N,)
    padded = x.new_zeros(num_experts * cap, x.shape[-1]).index_copy(0, slot, x)
    padded = padded.view(num_experts, cap, x.shape[-1])  # (E, C, h)

    def project_bmm(a: torch.Tensor, wt: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.bmm(a, wt.transpose(-2, -1))  # (E, C, out)
        return y if b is None else y + b.unsqueeze(1)

    y = _mlp(padded, activation, w, project_bmm)  # (E, C, h)
    return y.reshape(num_experts * cap, y.shape[-1])[slot]  # (N, h)


def _mlp(
    x: torch.Tensor,
    activation: str,
    w: ExpertWeights,
    project: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """`expert_mlp`'s math with every projection a grouped one."""
    up = project(x, w.w1, w.b1)  # (..., f)
    if w.w3 is not None:
        up = gate_activation(up, activation) * project(x, w.w3, w.b3)
    else:
        up = F.gelu(up, approximate="none" if activation == "gelu_exact" else "tanh")
    return project(up, w.w2, w.b2)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient: `_grouped_mm`'s backward
    refuses a broadcast one (zero strides, e.g. from a `.sum()` straight after it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    # the stubs' backward is (ctx, *grad_outputs: Any): a named one-output signature "overrides" it
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad.contiguous()


class GroupedExperts(nn.Module):
    """E expert MLPs as stacked parameters.

    SwiGLU: `w1` gate (E, f, h), `w3` up (E, f, h), `w2` down (E, h, f).
    GELU:   `w1` up (E, f, h), `w2` down (E, h, f).
    Weights use nn.Linear's (out, in) orientation per expert, so expert e's `w1[e]` is the
    weight of a dense FeedForward's `w1` (and of Mixtral's `experts.e.w1`). Optional biases
    `b1`, `b3` (E, f) and `b2` (E, h) exist only with `bias=True` (the Llama/Mixtral presets
    have none).
    """

    def __init__(
        self, dim: int, hidden_dim: int, num_experts: int, *, activation: str, bias: bool
    ) -> None:
        super().__init__()
        self.num_experts, self.activation = num_experts, activation
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = (
            nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
            if activation in ("swiglu", "geglu")
            else None
        )
        self.b1 = nn.Parameter(torch.empty(num_experts, hidden_dim)) if bias else None
        self.b2 = nn.Parameter(torch.empty(num_experts, dim)) if bias else None
        self.b3 = (
            nn.Parameter(torch.empty(num_experts, hidden_dim))
            if bias and activation in ("swiglu", "geglu")
            else None
        )
        # The matmul of every expert projection, `linear(x, weight, bias)`: F.linear, or a
        # float8 one set by `scaletrain.precision.apply_fp8` (kept by expert parallelism).
        self.linear: Callable[..., torch.Tensor] = F.linear
        self.kernel: ExpertKernel = "auto"
        """`grouped_expert_mlp`'s kernel ('auto': the fastest valid one)."""

    def weights(self) -> ExpertWeights:
        """The `EXPERT_WEIGHTS` in order, None where absent."""
        return ExpertWeights(*(getattr(self, name) for name in EXPERT_WEIGHTS))

    def forward(
        self, x_sorted: torch.Tensor, num_tokens_per_expert: torch.Tensor | list[int]
    ) -> torch.Tensor:
        """x_sorted: (N, h) tokens grouped by local expert; counts: (E_local,) -> (N, h)."""
        return grouped_expert_mlp(
            x_sorted,
            host_counts(num_tokens_per_expert),
            self.activation,
            self.weights(),
            linear=self.linear,
            kernel=self.kernel,
        )


def host_counts(num_tokens_per_expert: torch.Tensor | list[int]) -> list[int]:
    """Rows per expert as Python ints (the split sizes; one device sync for a tensor)."""
    if torch.is_tensor(num_tokens_per_expert):
        return [int(n) for n in num_tokens_per_expert.tolist()]
    return list(num_tokens_per_expert)


class MoE(nn.Module):
    """Top-k routed mixture of experts (Shazeer et al. 2017; Mixtral, Jiang et al. 2024).

    Routing: `router` logits (N, E); each token goes to its k largest logits, weighted by a
    softmax over those k logits (equal to Mixtral's and Qwen3-MoE's softmax-then-renormalize
    over the top k), or with `norm_topk=False` by their probabilities under the softmax over
    all E experts (Qwen3-MoE's `norm_topk_prob = false`: the k weights sum to less than one).
    After every forward `self.aux_loss` holds the unscaled load-balancing loss of the Switch
    Transformer (Fedus et al. 2022, eq. 4): `E * sum_i f_i * P_i`, with f_i the fraction of the
    N*k token-to-expert assignments that went to expert i and P_i the mean over tokens of the
    full softmax router probability of expert i. Normalizing f over N*k (not N) makes perfectly
    uniform routing give exactly 1 for any k; HF's `load_balancing_loss_func` normalizes f over
    N and so reports k times this value. `moe_aux_loss` multiplies by `aux_loss_coef`.

    Pipeline stages cannot add the auxiliary loss to a loss they do not compute (only the last
    stage sees one): with `aux_grad_scale` set (a callable giving the factor the loss is scaled
    by, e.g. fp16's loss scale), the layer attaches `aux_loss_coef * aux_loss` to its output's
    backward (`_AuxLossGrad`), which is the gradient of adding it to the loss.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        num_experts: int,
        top_k: int,
        *,
        activation: str,
        bias: bool,
        aux_loss_coef: float,
        norm_topk: bool = True,
        capacity_factor: float = 0.0,
        drop_policy: MoEDropPolicy = "probs",
        pad_to_capacity: bool = False,
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.aux_loss_coef = num_experts, top_k, aux_loss_coef
        self.norm_topk = norm_topk
        self.capacity: Capacity | None = (
            Capacity(capacity_factor, drop_policy, pad_to_capacity) if capacity_factor else None
        )
        """The expert capacity (`models.moe_dispatch`); None: no token is dropped."""
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = GroupedExperts(
            dim, hidden_dim, num_experts, activation=activation, bias=bias
        )
        self.aux_loss: torch.Tensor | None = None
        self.last_tokens_per_expert: torch.Tensor | None = None
        """(E,) the router's assignments per expert in the last forward, before dropping."""
        self.last_kept_per_expert: torch.Tensor | None = None
        """(E,) the assignments each expert kept (ran) in the last forward."""
        self.aux_grad_scale: Callable[[], float] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(b * t, h)  # (N, h)
        logits = upcast(self.router(flat))  # (N, E), routing math in fp32
        top_logits, top_idx = torch.topk(logits, self.top_k, dim=-1)  # (N, k)
        probs = None if self.norm_topk else torch.softmax(logits, dim=-1)  # (N, E)
        if probs is None:
            weights = torch.softmax(top_logits, dim=-1)  # (N, k)
        else:
            weights = probs.gather(1, top_idx)  # (N, k), not renormalized

        # Load balancing (Switch eq. 4, f over the N*k assignments; see class docstring),
        # on the router's choice before any dropping (as Megatron-Core's aux loss)
        counts = self._count(top_idx)  # (E,)
        frac = counts.to(logits.dtype) / top_idx.numel()
        probs_mean = (torch.softmax(logits, dim=-1) if probs is None else probs).mean(dim=0)
        aux = self.num_experts * (frac * probs_mean).sum()
        if not _in_backward():
            # Kept for the loss only from a forward outside backward. Activation
            # checkpointing re-runs this forward inside backward; an aux loss stored from
            # that recompute would hold its never-used graph (the recomputed router input,
            # norms, attention tensors: 0.34 GB per Mixtral-8x7B block at 4096 tokens) until
            # the next forward, across the rest of backward and the optimizer step.
            self.aux_loss = aux
            self.last_tokens_per_expert = counts.detach()
        out = self._experts_combine(flat, top_idx, weights, counts, batch=b)  # (N, h)
        out = out.view(b, t, h)
        if self.aux_grad_scale is not None and torch.is_grad_enabled():
            out = _AuxLossGrad.apply(out, aux, self.aux_loss_coef * self.aux_grad_scale())
        return out

    def _count(self, top_idx: torch.Tensor) -> torch.Tensor:
        """(E,) int64 assignments per expert of `top_idx` (N, k). Under fake tensors
        bincount's output size would depend on values they lack: a fixed-size scatter_add
        counts the same."""
        idx = top_idx.reshape(-1)
        if is_fake(idx):
            counts = torch.zeros(self.num_experts, dtype=torch.int64, device=idx.device)
            return counts.scatter_add_(0, idx, torch.ones_like(idx))
        return torch.bincount(idx, minlength=self.num_experts)

    def _experts_combine(
        self,
        flat: torch.Tensor,
        top_idx: torch.Tensor,
        weights: torch.Tensor,
        counts: torch.Tensor,
        *,
        batch: int,
    ) -> torch.Tensor:
        """(N, h): the experts on the expert-sorted rows of the assignments (`top_idx`,
        `weights`: (N, k)), dropped past the capacity, weighted back into their tokens."""
        perm = permute(
            top_idx, weights, counts, batch=batch, capacity=self.capacity, fake=is_fake(flat)
        )
        if not _in_backward():
            self.last_kept_per_expert = perm.kept.detach()
        out_sorted = self.experts(flat[perm.token_of], perm.counts)  # (R, h)
        return combine(out_sorted, perm, flat)


def _in_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread: a forward run there
    is an activation checkpoint's recompute (FSDP2's `is_bw` asks the engine the same way;
    torch has no public call for it)."""
    return torch._C._current_graph_task_id() != -1


class _AuxLossGrad(torch.autograd.Function):
    """Identity on `x` whose backward also gives `aux` the gradient `scale`: the same gradient
    as adding `scale * aux` to the loss, for code that never sees the loss (pipeline stages;
    Megatron-LM attaches its MoE auxiliary loss the same way)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.aux_meta = (aux.shape, aux.dtype, aux.device)
        return x.view_as(x)

    @staticmethod
    # the stubs' backward is (ctx, *grad_outputs: Any): a named one-output signature "overrides" it
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        shape, dtype, device = ctx.aux_meta
        return grad, torch.full(shape, ctx.scale, dtype=dtype, device=device), None


def moe_aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum over MoE layers of `aux_loss_coef * aux_loss` from the last forward (0-dim).

    Zero for dense models, for layers that have not run, and on pipeline stages without MoE
    layers.
    """
    total: torch.Tensor | None = None
    for m in model.modules():
        if isinstance(m, MoE) and m.aux_loss is not None:
            term = m.aux_loss_coef * m.aux_loss
            total = term if total is None else total + term
    if total is None:
        p = next(model.parameters(), None)
        return torch.zeros((), device=p.device if p is not None else "cpu")
    return total
