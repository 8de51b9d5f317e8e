"""The naive attention core's S x S memory (models/attention.py `NaiveAttentionCore`): what its
forward keeps for backward (`naive_saved_bytes`, in `activations.layer_activation_bytes`)
and what its backward holds at once beyond that (`naive_backward_bytes`; the block-level net of
it is `activations.naive_backward_net_bytes`). Torch-free.
"""

from __future__ import annotations

from scaletrain.config import ModelConfig

__all__ = ["naive_saved_bytes", "naive_backward_bytes"]


def naive_saved_bytes(
    model: ModelConfig, *, seq_len: int, micro_batch: int, tp: int, cp: int, e: int
) -> float:
    """The S x S tensors one block's naive attention core (models/attention.py
    `NaiveAttentionCore.forward`) keeps for backward, on one rank; P = a*s_l*s*b/t scores.

    Op by op: `qg @ k^T` saves its inputs (q, K: counted in `attention_saved_bytes`); the scalar
    scale, `.float()` and `.to(q.dtype)` save nothing; `masked_fill(~mask, -inf)` saves the
    boolean mask, repeated over the a/g query heads of a KV group, (a/g)*s_l*s bytes (no
    batch dimension: broadcast over b and the g groups); softmax (fp32) saves its fp32 output,
    4P; `probs @ v` saves probs, the e-byte cast, eP — the same tensor as softmax's output
    under fp32 (`.to` of the same dtype returns it), so 4P then, (4 + e)P in 16-bit.
    Soft-capping (`model.attn_softcap`, Gemma 2: c * tanh(scores / c) on the fp32 scores,
    before the mask): tanh saves its fp32 output, 4P more (the divide and multiply by the
    scalar c save nothing).
    Ignores: a document (block-causal) mask's batch dimension (the planner knows no documents).
    Source: the op sequence above and torch's derivatives.yaml (softmax saves `result`,
    masked_fill saves `mask`, mm saves both inputs); the dry-run (tests/planner/
    test_naive_attention.py) measures exactly this set per block."""
    a = model.num_heads
    s_l = float(seq_len) / cp
    scores = a * s_l * seq_len * micro_batch / tp
    mask = a / model.num_kv_heads * s_l * seq_len
    cap = 4.0 if model.attn_softcap else 0.0
    return (4.0 + cap if e == 4 else 4.0 + cap + e) * scores + mask


def naive_backward_bytes(
    model: ModelConfig, *, seq_len: int, micro_batch: int, tp: int, cp: int, e: int
) -> float:
    """Bytes one block's naive attention core adds on top of its saved set
    (`naive_saved_bytes`) while it runs backward, at its largest; P = a*s_l*s*b/t.

    Backward walks the forward's ops in reverse (models/attention.py `NaiveAttentionCore`):
    `probs @ v` writes grad_probs (eP) and autograd then frees that node's saved probs
    (torch/csrc/autograd/engine.cpp: release_variables() after each node when the graph is
    not retained); `.to` casts it to fp32 (4P; the eP copy is freed on return); softmax's
    backward (`_softmax_backward_data`) reads its saved fp32 output and that incoming fp32
    gradient and writes a new fp32 gradient: three fp32 S x S tensors alive at once, 12P,
    the largest moment (masked_fill's backward then holds two, the 16-bit casts less). Over
    the saved set that is 12P - (4 + e)P = 6P in 16-bit, 12P - 4P = 8P in fp32. Soft-capping
    adds its saved tanh output to both sides (the cap's backward, after softmax's, holds at
    most its saved output, an incoming and an outgoing gradient: 12P again): the same net.
    Ignores: the core's small (s, hd) gradients of q, K and V; the mask (stays saved).
    Source: that op order; dry-run, llama3-8b L1 dp8 z1 s4096 b8 bf16: the peak sits 25.6 GB
    (6P = 25.8 GB) above the start of the block's backward."""
    a = model.num_heads
    scores = a * float(seq_len) / cp * seq_len * micro_batch / tp
    return (8.0 if e == 4 else 8.0 - e) * scores
