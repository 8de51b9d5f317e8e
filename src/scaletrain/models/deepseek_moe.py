"""DeepSeekMoE (DeepSeek-V2 arXiv:2405.04434 sec. 2.2; DeepSeek-V3 arXiv:2412.19437 sec. 2.1.2):
routed experts chosen by softmax or sigmoid affinities with group-limited top-k, plus shared
experts every token goes through.

`DeepSeekMoE` is an `MoE` (same `router`, `experts`, `aux_loss`, `aux_grad_scale`), so expert
parallelism replaces its `experts` and tensor parallelism gathers its input exactly as for
Mixtral; only the routing (`deepseek_route`) and the shared experts differ:

- affinities s = softmax(router x) over all E experts (V2) or sigmoid(router x) (V3), computed in
  at least fp32 (autocast off: the router runs in fp32 as in DeepSeek's and transformers' code);
- group limit (V2's device-limited routing, V3's node-limited one; n_group / topk_group): the
  E experts form G groups, a group is scored by its best affinity (softmax) or the sum of its
  two best (sigmoid + bias), and a token picks its k experts inside its best `topk_groups`;
- the k experts are chosen on s + b for sigmoid routing (b: `expert_bias`, below), on s
  otherwise; their weights are s (not s + b), divided by their sum with `norm_topk`, times
  `scale` (routed_scaling_factor);
- shared experts: `num_shared` experts of width f fused into one SwiGLU MLP of width
  num_shared * f (DeepSeek's checkpoints store them so), run on every token; held as a
  one-expert `GroupedExperts` so tensor parallelism splits it like the routed experts and
  expert parallelism leaves it alone (every rank runs it on its own tokens).

Auxiliary-loss-free balancing (Wang et al. 2024, arXiv:2408.15664, Algorithm 1; DeepSeek-V3
sec. 2.1.2): `expert_bias` (E,) fp32, a persistent buffer (checkpointed and exported as
Hugging Face's `e_score_correction_bias`), is added to the sigmoid affinities for choosing
experts only. Every forward outside backward adds the expert counts of its tokens to
`expert_load`; after each optimizer step `parallel.update_router_biases` sums the loads of the
step's whole global batch over the data-parallel ranks and calls `update_expert_bias`:
b_i <- b_i + gamma * sign(mean_j load_j - load_i), gamma = `bias_rate` (the paper's update
speed u; DeepSeek-V3 used 0.001, then 0 for its last 500B tokens): an overloaded expert's bias
falls by gamma, an underloaded one's rises.

Auxiliary loss (`aux_loss`, weighted by `aux_loss_coef`): the sequence-wise balance loss of
DeepSeek-V3 (eqs. 17-20; V2's expert-level loss, eqs. 12-14, is the same formula with softmax
affinities): per sequence of T tokens, sum_i f_i P_i with f_i = E / (k T) * (tokens routed to
i) and P_i = the mean over the sequence of s'_i (s normalized to sum 1 over the experts),
averaged over the sequences of the forward. Under context parallelism a "sequence" is this
rank's shard of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config.choices import MoEDropPolicy
from ..numerics import upcast
from .moe import GroupedExperts, MoE, _AuxLossGrad, _in_backward

__all__ = ["DeepSeekMoE", "deepseek_route", "sequence_balance_loss"]


def deepseek_route(
    logits: torch.Tensor,
    *,
    top_k: int,
    scoring: str,
    groups: int = 1,
    topk_groups: int = 1,
    norm_topk: bool = False,
    scale: float = 1.0,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights (N, k), expert ids (N, k), affinities (N, E)) of router `logits` (N, E); see
    the module docstring for the rule."""
    n, num_experts = logits.shape
    scores = logits.sigmoid() if scoring == "sigmoid" else logits.softmax(dim=-1)  # (N, E)
    choice = scores + bias if bias is not None else scores
    if groups > 1:
        per = num_experts // groups
        grouped = choice.view(n, groups, per)  # (N, G, E/G)
        if scoring == "sigmoid":
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
        else:
            group_score = grouped.amax(dim=-1)  # (N, G)
        keep = group_score.topk(topk_groups, dim=-1).indices  # (N, topk_groups)
        allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        allowed = allowed.unsqueeze(-1).expand(n, groups, per).reshape(n, num_experts)
        choice = choice.masked_fill(~allowed, float("-inf"))
    idx = choice.topk(top_k, dim=-1).indices  # (N, k)
    weights = scores.gather(1, idx)  # (N, k)
    if norm_topk:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale, idx, scores


def sequence_balance_loss(
    scores: torch.Tensor, idx: torch.Tensor, *, batch: int, sigmoid: bool
) -> torch.Tensor:
    """DeepSeek's sequence-wise balance loss (module docstring): scores (B*T, E) affinities,
    idx (B*T, k) chosen experts, `batch` sequences of B*T / batch tokens."""
    n, num_experts = scores.shape
    t, k = n // batch, idx.shape[1]
    if sigmoid:
        scores = scores / scores.sum(dim=-1, keepdim=True)
    p = scores.view(batch, t, num_experts).mean(dim=1)  # (B, E)
    chosen = idx.reshape(batch, t * k)  # (B, T*k)
    hits = torch.zeros(batch, num_experts, dtype=scores.dtype, device=scores.device)
    hits.scatter_add_(1, chosen, torch.ones_like(chosen, dtype=scores.dtype))  # (B, E)
    f = hits * (num_experts / (k * t))  # (B, E)
    return (f * p).sum(dim=-1).mean()


class DeepSeekMoE(MoE):
    """Routed experts (DeepSeek routing) + shared experts; see the module docstring."""

    expert_bias: torch.Tensor | None

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
        num_shared: int,
        scoring: str,
        groups: int,
        topk_groups: int,
        norm_topk: bool,
        scale: float,
        bias_rate: float,
        capacity_factor: float = 0.0,
        drop_policy: MoEDropPolicy = "probs",
        pad_to_capacity: bool = False,
    ) -> None:
        super().__init__(
            dim,
            hidden_dim,
            num_experts,
            top_k,
            activation=activation,
            bias=bias,
            aux_loss_coef=aux_loss_coef,
            capacity_factor=capacity_factor,
            drop_policy=drop_policy,
            pad_to_capacity=pad_to_capacity,
        )
        self.scoring, self.groups, self.topk_groups = scoring, groups, topk_groups
        self.norm_topk, self.scale, self.bias_rate = norm_topk, scale, bias_rate
        self.shared_experts: GroupedExperts | None = (
            GroupedExperts(dim, hidden_dim * num_shared, 1, activation=activation, bias=bias)
            if num_shared
            else None
        )
        if scoring == "sigmoid":
            self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32))
        else:
            self.expert_bias = None
        self.expert_load: torch.Tensor | None = None
        """Tokens routed to each expert by the forwards since the last bias update (E,)."""
        self.count_load = True
        """Whether a forward with gradients on adds to `expert_load` (a pipeline stage's shape
        inference, a forward no training step takes, turns it off: parallel/pipeline.py)."""

    def reset_state(self) -> None:
        """After materialization: a zero bias (buffers are not drawn) and no load or loss."""
        if self.expert_bias is not None:
            with torch.no_grad():
                self.expert_bias.zero_()
        self.expert_load = None
        self.aux_loss = None

    def take_load(self) -> torch.Tensor:
        """The accumulated `expert_load` (zeros if none), reset to none."""
        load, self.expert_load = self.expert_load, None
        if load is None:
            device = self.router.weight.device
            return torch.zeros(self.num_experts, dtype=torch.int64, device=device)
        return load

    @torch.no_grad()
    def update_expert_bias(self, load: torch.Tensor) -> None:
        """b_i += bias_rate * sign(mean(load) - load_i) (`load`: the step's global counts)."""
        if self.expert_bias is None or self.bias_rate == 0:
            return
        load = load.to(torch.float64)
        step = torch.sign(load.mean() - load).to(self.expert_bias.dtype)
        self.expert_bias.add_(step, alpha=self.bias_rate)

    def _route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weight = self.router.weight
        with torch.autocast(flat.device.type, enabled=False):  # the router in >= fp32
            logits = F.linear(upcast(flat), upcast(weight))  # (N, E)
        bias = self.expert_bias
        return deepseek_route(
            logits,
            top_k=self.top_k,
            scoring=self.scoring,
            groups=self.groups,
            topk_groups=self.topk_groups,
            norm_topk=self.norm_topk,
            scale=self.scale,
            bias=None if bias is None else bias.to(logits.dtype),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(b * t, h)  # (N, h)
        # shared experts first: the routed experts' down projection is then the block's last
        # matmul, the one full activation checkpointing does not recompute (planner/time/flops)
        shared = None
        if self.shared_experts is not None:
            shared = self.shared_experts(flat, [flat.shape[0]])  # (N, h)
        weights, top_idx, scores = self._route(flat)  # (N, k), (N, k), (N, E)
        counts = self._count(top_idx)  # (E,) the router's choice, before any dropping
        aux = sequence_balance_loss(scores, top_idx, batch=b, sigmoid=self.scoring == "sigmoid")
        if not _in_backward():  # not an activation checkpoint's recompute (see MoE.forward)
            self.aux_loss = aux
            self.last_tokens_per_expert = counts.detach()
            if torch.is_grad_enabled() and self.count_load:  # a training forward's load
                load = counts.detach()  # (E,) int64: exact at any batch size
                self.expert_load = load if self.expert_load is None else self.expert_load + load
        out = self._experts_combine(flat, top_idx, weights, counts, batch=b)  # (N, h)
        if shared is not None:
            out = out + shared.to(out.dtype)
        out = out.view(b, t, h)
        if self.aux_grad_scale is not None and torch.is_grad_enabled():
            out = _AuxLossGrad.apply(out, aux, self.aux_loss_coef * self.aux_grad_scale())
        return out
