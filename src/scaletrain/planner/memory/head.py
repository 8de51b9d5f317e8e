"""The last and first stage's activation terms per GPU, per micro-batch (torch-free): the head's
stored inputs (`head_activation_bytes`), the fused loss's chunk and backward temporaries
(`fused_loss_chunk`, `loss_backward_bytes`), the head weight's gradient the fused loss
returns (`head_grad_bytes`), the logits the training loop holds
(`held_logits_bytes`) and the embedding backward's temporaries (`embedding_backward_bytes`).

Units: bytes; `GB` in docstrings means 1e9 bytes. Every function answers for ONE rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scaletrain.config import ModelConfig, compute_bytes

if TYPE_CHECKING:
    from ..types import PlanInput

__all__ = [
    "MicroBatchShape",
    "head_activation_bytes",
    "fused_loss_chunk",
    "head_grad_bytes",
    "loss_backward_bytes",
    "embedding_backward_bytes",
    "held_logits_bytes",
]


@dataclass(kw_only=True, slots=True, frozen=True)
class MicroBatchShape:
    """One micro-batch as one rank holds it: its tokens (s_l * b, s_l = seq_len / cp), how tp
    splits them, and the compute dtype."""

    seq_len: int
    micro_batch: int
    tp: int = 1
    sp: bool = False
    """Sequence parallelism: the residual stream is split tp ways too."""
    cp: int = 1
    precision: str = "bf16"

    @property
    def tokens(self) -> float:
        """s_l * b: the tokens of one micro-batch on this rank."""
        return float(self.seq_len) / self.cp * self.micro_batch

    @classmethod
    def of(cls, plan: PlanInput) -> MicroBatchShape:
        """A plan's micro-batch as each of its ranks holds it."""
        L = plan.layout
        return cls(
            seq_len=plan.seq_len,
            micro_batch=plan.micro_batch,
            tp=L.tp,
            sp=L.sp,
            cp=L.cp,
            precision=plan.saved_precision,  # bf16's saved set under torchao's fp8
        )


def head_activation_bytes(
    model: ModelConfig, mb: MicroBatchShape, *, residual_fp32: bool = False, fused: bool = True
) -> float:
    """Last stage's extra activations per micro-batch: final-norm input r*s_l*b*h (/t with SP)
    and the head input e*s_l*b*h (the 16-bit cast the head reads; full tokens under SP, whose
    norm output is all-gathered for the vocabulary-parallel head), plus:
    - fused (the trainer's `model(x, targets=y)`, models/loss.py; a pipeline's last stage
      too): the per-token fp32 log-sum-exp 4*s_l*b; no logits are kept.
    - not fused (a logits path, `model(x)` then cross-entropy: the training step's last
      stage under a split backward, zero-bubble and DualPipeV, `config.fused_head_loss`):
      s_l*b*V*(2 + 4) in 16-bit (bf16 logits and the fp32 log-softmax output; the fp32 upcast
      is consumed by log-softmax and freed: the dry-run measures 6 B, not the 10 B of
      docs/DESIGN.md §5) or (4 + 4) in fp32, the whole vocabulary on every tp rank: pipeline
      stages are parallelized without loss_parallel (`trainer.build`), so the head's
      vocabulary-sharded output is all-gathered to plain (B, T, V) logits (dry-run, llama-1024
      tp2+sp pp2 zero-bubble, last rank: 99.4 MB a micro-batch before I, these terms 100.4 MB;
      -5.8% on the step with V/t). Until the micro-batch's input-gradient pass only: then
      `split_backward.head_after_input_bytes`.
    The loss backward's own temporaries are `loss_backward_bytes`.
    """
    e = compute_bytes(mb.precision)
    r = 4 if residual_fp32 else e
    tok = mb.tokens
    if fused:
        tail = 4.0 * tok
    else:
        tail = (8.0 if e == 4 else 6.0) * tok * model.vocab_size
    return r * tok * model.dim / (mb.tp if mb.sp else 1) + e * tok * model.dim + tail


LOSS_WEIGHT_CAST_BYTES = 256 * 2**20
"""models/loss.py WEIGHT_CAST_BYTES: the largest 16-bit copy of an fp32 head's rows the fused
loss makes at once (tests/unit/test_loss_chunked.py checks the two agree)."""


def fused_loss_chunk(model: ModelConfig, *, tp: int = 1, chunk_tokens: int = 0) -> int:
    """Tokens per chunk of the fused loss: `chunk_tokens`, or for 0 the auto rule of
    models/loss.py (`auto_chunk_tokens`: one chunk's fp32 logits <= 256 MiB of V/tp rows)."""
    if chunk_tokens > 0:
        return chunk_tokens
    return max(1, 256 * 2**20 // (4 * max(1, -(-model.vocab_size // tp))))


def loss_backward_bytes(
    model: ModelConfig,
    mb: MicroBatchShape,
    *,
    fused: bool = True,
    weight_bytes: int = 4,
    chunk_tokens: int = 0,
) -> float:
    """Temporaries of the loss backward on the last stage, alive while every activation is
    still stored (the peak of most steps).

    fused (models/loss.py's backward, per chunk of c tokens and V_l = V/t head rows): the
    hidden-state gradient e*s_l*b*h; the chunk's recomputed logits, fp32 c*V_l*4 beside their
    16-bit matmul output or gradient cast c*V_l*e (none in fp32; the fp32 chunk is freed
    before one chunk's weight-gradient product, e*V_l*h, exists, so that product is not on
    top); an fp32 weight (`weight_bytes` 4) under 16-bit compute (DDP / ZeRO-1 autocast) adds
    the loss's own 16-bit cast of it, e*V_l*h. Not counted: the head weight's gradient, which
    the backward accumulates in place and returns as the parameter's gradient (AccumulateGrad
    takes it as .grad, FSDP2 reduce-scatters it): `head_grad_bytes`, a separate term.
    Everything is /t: nothing of the full vocabulary exists on a tp rank. Measured with
    MemTracker under fake tensors (1024 tokens, GPT-2's vocabulary): bf16 weight 387.6 MB
    (these terms with `head_grad_bytes` to 0.1 MB); fp32 weight under autocast 541.9 MB, with
    the weight's cast; dry-run, llama3-8b-L1 tp8+sp z0 bf16: the loss-backward peak's
    temporaries are these terms and the head gradient to the byte (607.8 MB, of which the
    cast 131.3 MB). Soft-capped logits (`model.logit_softcap`, Gemma 2): the backward holds the
    chunk's tanh (in place of the logits) beside the capped logits turned softmax, two fp32
    (c, V_l) buffers, 8*c*V_l instead of (4 + e)*c*V_l (the 16-bit cast comes once the tanh
    is freed); the forward caps in place (dry-run, gemma-2-9b-L2 dp8 z3 s1024: planner_accuracy).
    not fused (a logits path, as `head_activation_bytes`): the fp32 gradient of the
    log-softmax output and of the logits, 2 x 4*s_l*b*V, NOT divided by tp (the dry-run
    measures the full vocabulary under loss_parallel: the stored logits are sharded, the
    backward's temporaries are not).
    Source: the dry-run's 'temp' at the loss-backward moment (planner_accuracy.md).
    """
    tok, tp = mb.tokens, mb.tp
    if not fused:
        return 8.0 * tok * model.vocab_size
    e = compute_bytes(mb.precision)
    v_local = -(-model.vocab_size // tp)
    c = min(fused_loss_chunk(model, tp=tp, chunk_tokens=chunk_tokens), tok)
    table = float(v_local) * model.dim
    # fp32 compute: the matmul output is the fp32 chunk itself (no 16-bit companion);
    # soft-capped logits: the chunk's tanh and the capped logits, two fp32 chunks at once
    per_logit = 8.0 if model.logit_softcap else 4.0 + (e if e < 4 else 0)
    out = e * tok * model.dim + c * v_local * per_logit
    if weight_bytes > e:
        # an fp32 weight under 16-bit compute: the loss's own cast of it (the rank's autocast
        # in-flight copies leave the head out, `states.StageParams.uncast`), whole
        # (`weight.to(hidden.dtype)`, alive through the backward) or, above
        # LOSS_WEIGHT_CAST_BYTES, in blocks of b rows (`_cast_block`)
        b = min(float(v_local), max(1.0, LOSS_WEIGHT_CAST_BYTES // (e * model.dim)))
        if b >= v_local:
            return out + e * table
        chunk_logits = 4 * c * v_local  # fp32 (c, V_l)
        # recomputing the chunk's logits (a block's cast and 16-bit product beside them),
        # then their 16-bit gradient cast; or the blocked products into the hidden gradient
        # (fp32 (c, h) sum, a block's cast and its (c, h) product) and the weight gradient
        logits_phase = chunk_logits + max(e * (c * b + b * model.dim), e * c * v_local)
        if model.logit_softcap:  # the tanh and the capped logits, two fp32 chunks
            logits_phase = max(logits_phase, 2 * chunk_logits)
        grads_phase = e * c * v_local + 4 * c * model.dim + e * b * model.dim + e * c * model.dim
        return e * tok * model.dim + max(logits_phase, grads_phase)
    return out


def head_grad_bytes(
    model: ModelConfig, *, tp: int = 1, fused: bool = True, weight_bytes: int = 4
) -> float:
    """The head weight's gradient as the fused loss's backward returns it, weight_bytes*V_l*h
    (V_l = V/t rows; `weight_bytes`: 4 for fp32 parameters, 2 for FSDP2's 16-bit unsharded
    weight): models/loss.py allocates it once (`zeros_like(weight)`), accumulates every chunk
    into it in place and returns it as the weight's gradient, which AccumulateGrad takes as
    .grad without a copy (or adds into an existing .grad under gradient accumulation, where the
    states count .grad) and FSDP2 reduce-scatters. It is alive from the loss backward on; the
    ZeRO-2/3 moments after it hold it as the root unit's unsharded gradient
    (`rank_moments.root_in_backward`). Ignores: not fused (a plain head Linear), whose weight
    gradient is not counted at the loss backward. Source: the MemTracker measurement of
    `loss_backward_bytes` (the V x h accumulator in the weight's dtype)."""
    if not fused:
        return 0.0
    return float(weight_bytes) * -(-model.vocab_size // tp) * model.dim


def embedding_backward_bytes(
    model: ModelConfig, *, tp: int = 1, grad_bytes: int = 4, tied: bool | None = None
) -> float:
    """Temporaries of the token embedding's gradient at the very end of backward (first stage).

    Counts: the embedding backward's output, this rank's V/tp x h rows of the gradient in
    `grad_bytes` (the dtype the weight is used in: fp32 without FSDP mixed precision, also
    under autocast, which does not cast embeddings; the compute dtype of FSDP2's unsharded
    weight otherwise). Under tp > 1 the token embedding is vocabulary-parallel
    (`parallel.tensor_parallel.VocabParallelEmbedding`): its lookup and backward run on the
    local rows only, so nothing of size V x h exists on a tp rank. Tied embeddings (GPT-2)
    add the head's contribution, held by autograd until the embedding's arrives (V/tp x h;
    fp32 after autocast's cast backward), and their sum (V/tp x h): all alive at once, after
    every other gradient is complete.
    Source: measured with the dry-run, gpt2-124m-L2 dp2 z0 fp32 (temp at the peak = 3 x V x h
    x 4 B exactly); under tp the embedding backward's output has V/tp rows
    (tests/distributed/test_vocab_parallel_embedding.py).
    Ignores: the position embedding's gradient (already accumulated by then).
    """
    tied = model.tie_embeddings if tied is None else tied
    table = float(model.vocab_size) * model.dim * grad_bytes
    return (3 if tied else 1) * table / tp


def held_logits_bytes(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    precision: str = "bf16",
    fused: bool = True,
) -> float:
    """Logits still referenced after the loss backward. fused (the trainer's fused loss): none,
    0. Not fused (a logits path, as `head_activation_bytes`): the logits (B, T/cp, V/tp) of
    the output, e*s_l*b*V/tp, e = 4 in fp32 else 2 (the model's output dtype; the loss's fp32
    upcast is freed with the loss graph). Source: measured with the dry-run, gpt2-124m-L2 dp2
    z0 fp32: 'activations' at the end-of-backward peak were exactly 4*s*b*V before the fused
    loss."""
    if fused:
        return 0.0
    e = compute_bytes(precision)
    return e * float(seq_len) / cp * micro_batch * model.vocab_size / tp
