"""Context parallelism as torch's ring attention runs it (Recipe.cp_ring 'torch_allgather'):
torchtitan's CP. Torch-free.

Source: pytorch/pytorch torch/distributed/tensor/experimental/_attention.py, read at 0123248a,
a later version than the torch 1963fc8 torchtitan's Dec 2024 benchmark ran (which already has
the all-gather rotater, pytorch PR #132820, Aug 2024, and `set_rotate_method`, #142093, Dec 2024):
- `_templated_ring_attention` (forward): cp sub-SDPAs per block, the first causal on the local
  chunk, the other cp-1 non-causal on half of it (`_is_causal_behavior` with
  `_ContextParallelOptions.enable_load_balance` True: the round-robin load balancer), so every
  sub-SDPA does 1/cp of the block's attention FLOPs;
- the K/V exchange with `_RotateMethod.ALL_GATHER` (torchtitan's default at 9dec370:
  config_manager.py --experimental.context_parallel_rotate_method 'allgather'):
  `_AllGatherRotater.exchange_buffers` issues one all-gather of the rank's K and V at the first
  sub-step and `next_buffer` waits for it at the second, so it hides behind the first sub-SDPA
  only ("we can overlap the communication with the first sharded kv computation", PR #132820);
- `_SDPAMerger.step` / `_merge_one` (`convert_to_f32` True): every sub-step's output is cast to
  fp32 and merged with the running output by elementwise ops (out - sigmoid(lse' - lse) *
  (out - out')), the final one cast back;
- `_templated_ring_attention_backward`: K/V all-gathered again; fp32 dQ, dK, dV accumulators
  (`torch.zeros_like(..., dtype=float32)`); after every sub-step's SDPA backward the dK/dV
  accumulator (concatenated, fp32) goes to the next rank by `_AllToAllRotater`
  (`ft_c.permute_tensor`), waited for after the next sub-step's SDPA backward, the last one
  after the loop with nothing left to hide it.
torchtitan's Attention.forward repeats the K/V heads to the query heads before SDPA
(torchtitan/models/llama/model.py `repeat_kv` at 9dec370), so the ring moves query-head K/V
(Recipe.cp_kv_repeated).

The busiest rank is the last CP rank: with the load balancer every one of its sub-steps after
the first takes the whole local query against half the K/V (`i <= rank`), so its merges run on
the whole output and its dK/dV updates go through `_partial_update` (an in-place add on half,
then torch.cat of the halves).
The merge and accumulation passes are counted as the file reads at 0123248a; a version nearer
Dec 2024 (with `_RotateMethod.PRE_ALL_GATHER`, pytorch PR #144986, Jan 2025) has the same
options, rotaters, `_SDPAMerger` and backward loop (the Dec 2024 file itself was not read).
Ignores: torch.compile fusing the merge ops: torchtitan compiles every TransformerBlock with
fullgraph=True, CP runs included (torchtitan 9dec370 torchtitan/parallelisms/parallelize_llama.py
`apply_compile`, called whatever the cp degree), so the ring is traced into the block's graph (a
graph break would raise); what Inductor fuses there was not read, and the passes are counted as
eager kernels, an upper bound on their traffic. Also ignored: the merge's per-token LSE tensors
(1/d of the output), the SDPA kernels' own rate on the half-size, non-causal sub-steps (the
attention core's one rate, attention_core.py; the FlashAttention-3 paper's two FA2 forward
figures at head dim 128 plateau at 335 and 370 TFLOP/s, and if, as the bars' shapes suggest,
the transcriptions read naming neither mask, 370 is the unmasked one, the unmasked sub-steps
would run faster, not slower), NCCL kernels taking SMs or memory bandwidth from the sub-SDPAs
they overlap (inside a node the all-gather's 24 ring CTAs of 132 SMs, overlap_sm.py, over its
overlapped seconds: a few tenths of a percent of a step with 32k-token chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import compute_bytes

from ..recipes.schema import Recipe
from ..types import PlanInput
from .comm import Link, gather_time, p2p_time

__all__ = [
    "MERGE_BYTES",
    "TorchRing",
    "torch_ring_pass_bytes",
    "torch_ring_passes_s",
    "torch_ring_terms",
    "ring_recomputes",
]

MERGE_BYTES = 32.0
"""Bytes per output element of one `_SDPAMerger._merge_one` after the first sub-step, fp32:
out - block_out (read 4 + 4, write 4), x sigmoid(block_lse - lse) (read 4, write 4; the
per-token LSE broadcast), out - that (read 4 + 4, write 4)."""


def torch_ring_pass_bytes(
    cp: int, e: int, *, q_elems: float, kv_elems: float
) -> tuple[float, float]:
    """(forward, backward) bytes one block's ring attention moves through memory on the busiest
    rank in its elementwise passes (module docstring), for `q_elems` output / query elements
    and `kv_elems` elements of each of K and V, e-byte activations.
    Forward: key/value .contiguous() (the (b, h, s, d) transposes: read + write e each) and the
    torch.cat of both for the exchange (read + write e each) at every sub-step but the last
    (`if i < (size - 1)`: the all-gather rotater sends once, but the loop builds the
    concatenated buffer each time, at 0123248a as in torch 2.13's
    _context_parallel/_attention.py): (2 + 2(cp - 1))e = 2cp e per element of K and of V;
    per sub-step out.to(float32) (e + 4), every merge after the first
    MERGE_BYTES, the final cast to e (4 + e).
    Backward: the three fp32 zeros_like (4 each), the same K/V copies (2cp e per K and V
    element: `if i != size - 1` builds the buffer at every sub-step but the last);
    per sub-step dQ += (read 4 + e, write 4), dK and dV: the first sub-step an add (8 + e), the
    others `_partial_update` on half (8 + e) / 2 then the torch.cat of the halves (8), and the
    fp32 torch.cat of dK and dV for the send (8 each); the final casts of dQ, dK, dV to e
    (4 + e each)."""
    if cp <= 1:
        return 0.0, 0.0
    kv_copies = 2 * kv_elems * 2 * cp * e  # .contiguous() + cp - 1 torch.cat, K and V
    fwd = kv_copies + q_elems * (cp * (e + 4) + (cp - 1) * MERGE_BYTES + (4 + e))
    acc = 8 + e
    bwd = 4 * (q_elems + 2 * kv_elems) + kv_copies
    bwd += q_elems * (cp * acc + (4 + e))
    bwd += 2 * kv_elems * (acc + (cp - 1) * (acc / 2 + 8) + cp * 8 + (4 + e))
    return fwd, bwd


def ring_recomputes(plan: PlanInput, recipe: Recipe | None) -> bool:
    """The backward recomputes the attention forward, ring included: full AC, or selective AC
    other than torchtitan's per-op SAC (which saves the SDPA output: step_time._block_seconds)."""
    if plan.ac == "full":
        return True
    op_sac = recipe is not None and recipe.selective == "torchtitan_op"
    return plan.ac == "selective" and not (op_sac and not plan.model.is_moe)


@dataclass(kw_only=True, slots=True, frozen=True)
class TorchRing:
    """One step's ring attention on the busiest rank (`torch_ring_terms`)."""

    bytes: float
    """Bytes this rank sends: the K/V all-gathers ((cp-1)/cp of cp shards each) and the fp32
    dK/dV sends, per block and micro-batch."""
    seconds: float
    """Every collective's alpha-beta time, overlapped or not."""
    wait_per_mb: float
    """Seconds per micro-batch the sub-SDPAs wait on a collective no sub-step hides."""


def torch_ring_terms(
    plan: PlanInput,
    recipe: Recipe,
    *,
    link: Link,
    core_s_layer: float,
    layers: int,
) -> TorchRing:
    """Ring attention of `plan` under torch's all-gather rotater (module docstring) on a rank
    with `layers` blocks whose attention core takes `core_s_layer` seconds per block and
    micro-batch (forward 1, backward FLASH_BACKWARD_FACTOR, + a forward when recomputed: the
    split of attention_core.attention_seconds_per_token). Per block and micro-batch:
    each forward (and its recompute) waits max(0, all-gather - first sub-SDPA), the backward
    max(0, all-gather - first sub-SDPA backward) + (cp-1) x max(0, dK/dV send - one sub-SDPA
    backward) + the last dK/dV send whole."""
    from .flops import FLASH_BACKWARD_FACTOR

    cp = plan.layout.cp
    if cp <= 1:
        return TorchRing(bytes=0.0, seconds=0.0, wait_per_mb=0.0)
    bw, lat, _ = link
    e = compute_bytes(plan.precision)
    _, kv_elems = _elements(plan, recipe)
    recompute = ring_recomputes(plan, recipe)
    passes_f = 2 if recompute else 1
    units = 1.0 + FLASH_BACKWARD_FACTOR + (1.0 if recompute else 0.0)
    sub_f = core_s_layer / units / cp
    sub_b = sub_f * FLASH_BACKWARD_FACTOR
    kv = 2 * e * kv_elems  # this rank's K and V
    dkv = 2 * 4 * kv_elems  # its fp32 dK and dV
    t_ag = gather_time(cp * kv, cp, bw, lat)
    t_dkv = p2p_time(dkv, bw, lat)
    wait = passes_f * max(0.0, t_ag - sub_f) + max(0.0, t_ag - sub_b)
    wait += (cp - 1) * max(0.0, t_dkv - sub_b) + t_dkv
    m = max(1, plan.grad_accum)
    moved = (passes_f + 1) * (cp - 1) * kv + cp * dkv
    secs = (passes_f + 1) * t_ag + cp * t_dkv
    return TorchRing(
        bytes=moved * layers * m,
        seconds=secs * layers * m,
        wait_per_mb=wait * layers,
    )


def _elements(plan: PlanInput, recipe: Recipe) -> tuple[float, float]:
    """(query / output elements, elements of each of K and V) of one block's ring attention
    on one rank per micro-batch: tokens / cp x heads / tp x head dim, K and V with the query's
    heads when the framework repeats them before SDPA (Recipe.cp_kv_repeated)."""
    L, model = plan.layout, plan.model
    tokens = float(plan.seq_len) * plan.micro_batch / L.cp
    kv_dim = model.q_dim if recipe.cp_kv_repeated else model.kv_dim
    return tokens * model.q_dim / L.tp, tokens * kv_dim / L.tp


def torch_ring_passes_s(plan: PlanInput, recipe: Recipe, *, layers: int) -> float:
    """Seconds per micro-batch of a rank with `layers` blocks in the ring's elementwise passes
    (`torch_ring_pass_bytes`, the forward's twice when recomputed) over memory bandwidth: on
    the compute stream, between the sub-SDPAs (module docstring); 0 without CP."""
    cp = plan.layout.cp
    if cp <= 1:
        return 0.0
    q_elems, kv_elems = _elements(plan, recipe)
    fwd_b, bwd_b = torch_ring_pass_bytes(
        cp, compute_bytes(plan.precision), q_elems=q_elems, kv_elems=kv_elems
    )
    passes_f = 2 if ring_recomputes(plan, recipe) else 1
    return (passes_f * fwd_b + bwd_b) * layers / plan.hardware.memory_bw
