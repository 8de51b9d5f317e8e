"""An MoE layer's token permutation, done once, with an optional expert capacity.

`permute` sorts the N*k (token, expert) assignments of a forward by expert and returns, per
row of the expert-sorted buffer, its source token, its combine weight and where its output
goes (`Permutation`); `combine` weights the experts' rows and adds them back to their tokens.
The experts run between the two on `x[token_of]`, one gather and one scatter-add per forward
whatever the capacity, and the number of ops does not grow with the number of experts.

Expert capacity (token dropping; GShard, Lepikhin et al. 2020 sec. 2.2; Switch Transformer,
Fedus et al. 2022 sec. 2.2). With `Capacity`, expert e keeps at most C of the assignments
routed to it (`config.model.expert_capacity`: C = ceil(c * N * k / E), N the tokens of this
forward on this rank, so under expert parallelism each source rank caps its own tokens). The
semantics are Megatron-Core's (megatron/core/transformer/moe/moe_utils.py
`apply_router_token_dropping`, applied by router.py after `topk_routing_with_score_function`):

- a dropped assignment contributes nothing: the token's output is the weighted sum over its
  kept experts only, and the block's residual carries it past the layer where all of its
  assignments were dropped;
- the kept assignments keep their routing weights (no renormalization);
- 'probs' keeps, per expert, the C assignments of largest routing weight; 'position' the C
  earliest tokens in (sequence position, sequence) order, Megatron's (s, b) flattening.
  Megatron's top-k over equal keys leaves ties unspecified; here ties keep the earlier
  position, so the choice is deterministic (activation checkpointing's recompute repeats it);
- the load-balancing losses and `last_tokens_per_expert` count the router's choice before
  dropping (Megatron computes its aux losses from the undropped top-k as well); DeepSeek's
  bias load (`DeepSeekMoE.expert_load`) too, where Megatron counts the map after dropping
  (with padding, its C rows per expert on every expert, which stops the bias).
- C is capped at N (no expert can take more), where Megatron pads to its uncapped C only if
  C <= N: a larger factor drops nothing and pads nothing here.

Padding (`Capacity.pad`, Megatron's `moe_pad_expert_input_to_capacity`): every expert runs
exactly C rows, its kept ones in position order then padding rows, which read the last token,
weigh 0 and add into a spare output row that is cut off: they change no value or gradient.
The buffer is E*C rows with no value-dependent shape, so the counts are host ints (no sync),
expert parallelism needs no count exchange, and the dry-run's fake tensors take this very path
and measure a real step. Unpadded, the kept rows are selected by value (one host sync, as the
counts already need); under fake tensors the dispatch then assumes the balanced router of
`models.moe` (each expert min(N*k/E, C) rows: `ModelConfig.expert_rows_per_token`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..config import expert_capacity
from ..config.choices import MoEDropPolicy

__all__ = ["Capacity", "Permutation", "balanced_counts", "combine", "permute"]


class Capacity(NamedTuple):
    """An expert capacity: `factor` c > 0 of `config.ModelConfig.moe_capacity_factor`, the drop
    policy and whether every expert is padded to C rows."""

    factor: float
    policy: MoEDropPolicy = "probs"
    pad: bool = False

    def rows(self, tokens: int, top_k: int, num_experts: int) -> int:
        """C for a forward of `tokens` tokens (`config.expert_capacity`)."""
        return expert_capacity(tokens, top_k, num_experts, self.factor)


class Permutation(NamedTuple):
    """The expert-sorted rows of one forward (`permute`)."""

    token_of: torch.Tensor
    """(R,) int64: the token each row reads."""
    weight: torch.Tensor
    """(R,) the row's combine weight (0 on a padding row), differentiable w.r.t. the router."""
    counts: torch.Tensor | list[int]
    """Rows per expert: a tensor (from the routing's values) or host ints every rank of an
    expert-parallel group shares (the dry-run's balanced dispatch, the padded capacity)."""
    dest: torch.Tensor | None
    """(R,) int64: the output row each row adds into, N for a padding row (a spare row);
    None: `token_of`."""
    kept: torch.Tensor
    """(E,) int64: the assignments each expert keeps (the routed counts without a capacity)."""


def balanced_counts(assignments: int, num_experts: int) -> list[int]:
    """Tokens per expert under a perfectly balanced router (fake-tensor dispatch only).

    >>> balanced_counts(10, 4)  # 10 assignments over 4 experts
    [3, 3, 2, 2]
    """
    base, rest = divmod(assignments, num_experts)
    return [base + (1 if e < rest else 0) for e in range(num_experts)]


def permute(
    top_idx: torch.Tensor,
    weights: torch.Tensor,
    counts: torch.Tensor,
    *,
    batch: int,
    capacity: Capacity | None,
    fake: bool,
) -> Permutation:
    """The expert-sorted rows of the assignments `top_idx` (N, k) with combine `weights`
    (N, k), `counts` (E,) the routed assignments per expert, N = batch x T tokens in (b, t)
    order; see the module docstring for the capacity rules."""
    n, k = top_idx.shape
    num_experts, a = counts.shape[0], top_idx.numel()
    flat_expert = top_idx.reshape(-1)  # (A,)
    order = torch.argsort(flat_expert, stable=True)  # (A,) sorted by expert, then position
    cap = 0 if capacity is None else capacity.rows(n, k, num_experts)
    dispatch: torch.Tensor | list[int]
    if capacity is None or (cap >= n and not capacity.pad):  # no expert can overflow
        dispatch = balanced_counts(a, num_experts) if fake else counts
        return Permutation(order // k, weights.reshape(-1)[order], dispatch, None, counts)
    with torch.no_grad():
        starts = torch.cumsum(counts, 0) - counts  # (E,) first sorted row of each expert
        expert_sorted = flat_expert[order]  # (A,)
        within = torch.arange(a, device=order.device) - starts[expert_sorted]  # (A,)
        queue = _priority(capacity.policy, weights, batch=batch, n=n, k=k)  # (A,)
        # the assignments grouped by expert in priority order: an expert's first C stay
        by_priority = queue[torch.argsort(flat_expert[queue], stable=True)]  # (A,)
        place = torch.empty_like(order).scatter_(0, by_priority, within)  # (A,) queue place
        keep = place[order] < cap  # (A,) in the expert-sorted order
        kept = counts.clamp(max=cap)  # (E,)
    if capacity.pad:
        with torch.no_grad():
            # slot of each kept row in the (E*C) buffer: its expert's block, in position
            # order; dropped rows go to one spare slot past the end
            before = torch.cumsum(keep, 0) - keep.long()  # (A,) kept rows before this one
            kept_starts = torch.cumsum(kept, 0) - kept  # (E,)
            slot = expert_sorted * cap + before - kept_starts[expert_sorted]  # (A,)
            slot = slot.masked_fill(~keep, num_experts * cap)
            src = torch.full((num_experts * cap + 1,), a, dtype=order.dtype, device=order.device)
            src = src.scatter_(0, slot, order)[: num_experts * cap]  # (E*C,) A = padding
            dest = src // k  # (E*C,) a padding row's (A // k = N) is the spare output row
            token_of = dest.clamp(max=n - 1)  # padding rows read the last token
        weight = F.pad(weights.reshape(-1), (0, 1))[src]  # (E*C,) 0 on padding rows
        return Permutation(token_of, weight, [cap] * num_experts, dest, kept)
    if fake:  # no values to select by: the balanced router's rows (module docstring)
        dispatch = [min(c, cap) for c in balanced_counts(a, num_experts)]
        rows = order[: sum(dispatch)]
    else:
        dispatch = kept
        rows = order[keep]  # (R,) kept assignments, expert-sorted (one host sync)
    return Permutation(rows // k, weights.reshape(-1)[rows], dispatch, None, kept)


def _priority(
    policy: MoEDropPolicy, weights: torch.Tensor, *, batch: int, n: int, k: int
) -> torch.Tensor:
    """(A,) the assignments in the order an over-capacity expert keeps them: sequence-major
    position ((t, b) as Megatron's (s, b) tokens; an expert holds a token once, so its k
    slots need no order), and for 'probs' by descending weight first, ties by position."""
    a = n * k
    ids = torch.arange(a, device=weights.device).view(batch, n // batch, k)  # (B, T, k)
    by_position = ids.transpose(0, 1).reshape(-1)  # (A,) (t, b, slot) order
    if policy == "position":
        return by_position
    w = weights.reshape(-1)[by_position]
    return by_position[torch.argsort(w, descending=True, stable=True)]


def combine(out_sorted: torch.Tensor, perm: Permutation, flat: torch.Tensor) -> torch.Tensor:
    """(N, h) output of the experts' rows `out_sorted` (R, h): each weighted by its combine
    weight and added into its token, in the experts' output dtype (bf16 under autocast, like
    a dense FeedForward's; `flat`, the layer's (N, h) input, is the fp32 norm output there)."""
    out_sorted = out_sorted * perm.weight.unsqueeze(-1).to(out_sorted.dtype)
    n, h = flat.shape
    if perm.dest is None:
        return flat.new_zeros((n, h), dtype=out_sorted.dtype).index_add_(
            0, perm.token_of, out_sorted
        )
    out = flat.new_zeros((n + 1, h), dtype=out_sorted.dtype)  # row N: padding rows' sink
    return out.index_add_(0, perm.dest, out_sorted)[:n]
