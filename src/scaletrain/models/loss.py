"""Fused head + cross-entropy that never holds the (tokens x vocab) logits of a whole batch.

`linear_cross_entropy(hidden, weight, targets)` equals
`F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=...)` (mean over the valid
targets) but runs over the tokens in chunks of `chunk_tokens`:

- forward, per chunk: logits (c, V) in the compute dtype, upcast to fp32, reduced to the
  per-token log-sum-exp and target logit, then freed. Kept for backward: the hidden states
  (N, h) (the plain head's backward keeps them too), the per-token lse (N,) in fp32 and the
  targets. Nothing of size N x V.
- backward, per chunk: the logits are recomputed (one more head matmul), turned in place into
  softmax - onehot, scaled, cast to the compute dtype, and multiplied into the hidden-state
  gradient (c, h) and the weight gradient (V, h), the latter accumulated in the weight's
  dtype. Peak temporaries: about c x V x (4 + 2) bytes.
- an fp32 head under 16-bit compute (DDP / ZeRO-1 autocast): the head is cast and multiplied
  in blocks of at most `WEIGHT_CAST_BYTES` (`_cast_block`), so neither its 16-bit copy nor a
  chunk's weight-gradient product is ever a whole (V, h) tensor (a 256k x 4096 head would
  otherwise add 2 x 2.1 GB at the loss backward).

Vocabulary parallelism: `vocab` (a `VocabShard`) says this rank holds rows
[start, start + V_local) of the head and how to all-reduce across the vocabulary group; the
row max, the sum of exponentials and the target logit are reduced there, nothing is gathered.
The hidden-state gradient it returns is then this rank's partial sum (the caller reduces it:
`scaletrain.parallel.tensor_parallel.vocab_parallel_head_loss`). The collectives are passed in
as callables, so this module imports nothing from torch.distributed (models know nothing of
distribution).

Final-logit soft-capping (`softcap` c > 0, Gemma 2): each chunk's fp32 logits z become
c * tanh(z / c) in place before the loss; the backward multiplies d loss / d capped logit by
the cap's derivative 1 - tanh^2, which takes one more (c, V_local) fp32 buffer per chunk
(the recomputed tanh beside the softmax).

The same algorithm is what fused linear-cross-entropy kernels do (e.g. Wijmans et al. 2024,
"Cut Your Losses in Large-Vocabulary Language Models"); here it is plain PyTorch ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..numerics import acc_dtype

__all__ = ["VocabShard", "auto_chunk_tokens", "linear_cross_entropy"]

LOSS_CHUNK_BYTES = 256 * 2**20
"""Auto chunking (`chunk_tokens=0`): tokens per chunk so that one chunk's fp32 logits take at
most this many bytes (e.g. 523 tokens for a 128,256 vocabulary, 1,335 for GPT-2's 50,257)."""


WEIGHT_CAST_BYTES = 256 * 2**20
"""The largest 16-bit copy of (rows of) an fp32 head weight the loss makes at once; also the
largest weight-gradient product it makes per chunk in that case."""


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice of a vocabulary-parallel head and its group's in-place all-reduces."""

    start: int
    """First vocabulary row held by this rank."""
    all_reduce_max: Callable[[torch.Tensor], None]
    all_reduce_sum: Callable[[torch.Tensor], None]


def auto_chunk_tokens(vocab_local: int) -> int:
    """Tokens per chunk for `chunk_tokens=0`: fp32 logits of one chunk <= LOSS_CHUNK_BYTES."""
    return max(1, LOSS_CHUNK_BYTES // (4 * max(1, vocab_local)))


def _chunk_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (h @ w.t()).to(acc_dtype(h.dtype))  # (c, V_local), fp32 at least


def _cap_(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    """In place: softcap * tanh(logits / softcap), or the logits unchanged for 0."""
    return logits.div_(softcap).tanh_().mul_(softcap) if softcap else logits


def _cast_block(weight: torch.Tensor, dtype: torch.dtype) -> int:
    """Head rows cast and multiplied at once: all of them when the weight is already in the
    compute dtype (no copy), else as many as fit WEIGHT_CAST_BYTES in `dtype`."""
    if weight.dtype == dtype:
        return weight.shape[0]
    per_row = weight.shape[1] * dtype.itemsize
    return max(1, min(weight.shape[0], WEIGHT_CAST_BYTES // per_row))


def _blocked_logits(h: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
    """`_chunk_logits(h, weight.to(h.dtype))` with the weight cast `block` rows at a time."""
    out = torch.empty(h.shape[0], weight.shape[0], dtype=acc_dtype(h.dtype), device=h.device)
    for v in range(0, weight.shape[0], block):
        out[:, v : v + block] = h @ weight[v : v + block].to(h.dtype).t()  # (c, block)
    return out


def _blocked_grads(
    g: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    block: int,
    grad_h: torch.Tensor | None,
    grad_w: torch.Tensor | None,
) -> None:
    """One chunk's hidden and weight gradients from g = d loss / d logits (c, V) in the compute
    dtype, the weight cast `block` rows at a time; the hidden gradient's partial products over
    the blocks are summed in fp32 and rounded once, as one matmul would."""
    acc_h = torch.zeros(h.shape, dtype=acc_dtype(h.dtype), device=h.device)
    for v in range(0, weight.shape[0], block):
        gb = g[:, v : v + block]  # (c, block)
        if grad_h is not None:
            acc_h.add_(gb @ weight[v : v + block].to(g.dtype))  # (c, h)
        if grad_w is not None:
            grad_w[v : v + block].add_(gb.t() @ h)  # (block, h), accumulated in fp32
    if grad_h is not None:
        grad_h.copy_(acc_h)


def _local_targets(
    targets: torch.Tensor, start: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of targets in this rank's rows, their local row ids; 0 where not local)."""
    local = (targets >= start) & (targets < start + size)
    return local, torch.where(local, targets - start, torch.zeros_like(targets))


def _forward_whole_vocab(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    w: torch.Tensor | None,
    block: int,
    targets: torch.Tensor,
    chunk: int,
    valid: torch.Tensor,
    lse: torch.Tensor,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward when this rank holds every head row (no vocabulary parallelism): each
    chunk's logits become log-probabilities in place (`log_softmax(out=)`, one fused pass
    instead of max, subtract, exp, sum and log: about a fifth of their CPU time for a 768 x 128
    chunk, one thread), the loss gathers -log p(target), and the per-token log-sum-exp the
    backward needs is logit - log p of column 0. `w`: the head in the compute dtype, or None
    to cast `weight` in blocks of `block` rows (`_cast_block`). Fills `lse`; returns (loss,
    count)."""
    nll = torch.empty_like(lse)
    rows = torch.where(valid, targets, torch.zeros_like(targets))  # ignored: any valid row
    for i in range(0, hidden.shape[0], chunk):
        h = hidden[i : i + chunk]
        logits = _chunk_logits(h, w) if w is not None else _blocked_logits(h, weight, block)
        logits = _cap_(logits, softcap)
        first = logits[:, 0].clone()
        logp = torch.log_softmax(logits, dim=1, out=logits)  # in place: no second buffer
        lse[i : i + chunk] = first - logp[:, 0]
        nll[i : i + chunk] = logp.gather(1, rows[i : i + chunk, None]).squeeze(1).neg_()
        del logits, logp  # free this chunk before the next one's matmul allocates
    count = valid.sum()
    return (nll * valid).sum() / count.clamp(min=1), count


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk: int,
        ignore_index: int,
        vocab: VocabShard | None,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        # hidden: (N, h) in the compute dtype; weight: (V_local, h) in any float dtype.
        block = _cast_block(weight, hidden.dtype)
        w = weight.to(hidden.dtype) if block == weight.shape[0] else None  # (V_local, h)
        start = vocab.start if vocab is not None else 0
        valid = targets != ignore_index
        lse = torch.empty(hidden.shape[0], dtype=acc_dtype(hidden.dtype), device=hidden.device)
        if vocab is None:
            loss, count = _forward_whole_vocab(
                hidden, weight, w, block, targets, chunk, valid, lse, softcap
            )
            ctx.save_for_backward(hidden, weight, targets, lse, count)
            ctx.chunk, ctx.ignore_index, ctx.start = chunk, ignore_index, start
            ctx.softcap = softcap
            return loss
        tgt_logit = torch.zeros_like(lse)
        for i in range(0, hidden.shape[0], chunk):
            h = hidden[i : i + chunk]
            logits = _chunk_logits(h, w) if w is not None else _blocked_logits(h, weight, block)
            logits = _cap_(logits, softcap)
            local, rows = _local_targets(targets[i : i + chunk], start, weight.shape[0])
            picked = logits.gather(1, rows[:, None]).squeeze(1) * local
            row_max = logits.max(dim=1).values  # (c,)
            if vocab is not None:
                vocab.all_reduce_max(row_max)
            # in place: no second (c, V_local) buffer (torch.logsumexp would allocate one)
            sums = torch.stack([logits.sub_(row_max[:, None]).exp_().sum(dim=1), picked])
            if vocab is not None:
                vocab.all_reduce_sum(sums)  # (2, c): sum of exp and the target logit
            lse[i : i + chunk] = row_max + sums[0].log()
            tgt_logit[i : i + chunk] = sums[1]
            del logits  # free this chunk before the next one's matmul allocates
        count = valid.sum()
        loss = ((lse - tgt_logit) * valid).sum() / count.clamp(min=1)
        ctx.save_for_backward(hidden, weight, targets, lse, count)
        ctx.chunk, ctx.ignore_index, ctx.start = chunk, ignore_index, start
        ctx.softcap = softcap
        return loss

    @staticmethod
    # the stubs' backward is (ctx, *grad_outputs: Any): a named one-output signature "overrides" it
    def backward(ctx, grad_loss: torch.Tensor):  # type: ignore[override]
        hidden, weight, targets, lse, count = ctx.saved_tensors
        block = _cast_block(weight, hidden.dtype)
        w = weight.to(hidden.dtype) if block == weight.shape[0] else None  # (V_local, h)
        chunk = ctx.chunk
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        # d loss / d logit = (softmax - onehot) * g / count, for valid targets only
        acc = lse.dtype
        scale = (targets != ctx.ignore_index).to(acc) * (grad_loss.to(acc) / count.clamp(min=1))
        for i in range(0, hidden.shape[0], chunk):
            h = hidden[i : i + chunk]
            logits = _chunk_logits(h, w) if w is not None else _blocked_logits(h, weight, block)
            cap = ctx.softcap
            tanh = logits.div_(cap).tanh_() if cap else None  # in place: the capped / cap
            z = logits.mul(cap) if cap else logits  # the capped logits (a second buffer)
            g = z.sub_(lse[i : i + chunk, None]).exp_()  # softmax (c, V_local)
            del logits, z
            local, rows = _local_targets(targets[i : i + chunk], ctx.start, weight.shape[0])
            g.scatter_add_(1, rows[:, None], -local.to(acc)[:, None])
            if tanh is not None:  # through the cap: d(c tanh(x / c))/dx = 1 - tanh^2
                g.mul_(tanh.mul_(tanh).neg_().add_(1.0))
                del tanh
            g = g.mul_(scale[i : i + chunk, None]).to(hidden.dtype)
            if w is None:
                gh = grad_h[i : i + chunk] if grad_h is not None else None
                _blocked_grads(g, h, weight, block, gh, grad_w)
                del g
                continue
            if grad_h is not None:
                torch.mm(g, w, out=grad_h[i : i + chunk])  # (c, h)
            if grad_w is not None:
                if grad_w.dtype == g.dtype:
                    # the out= form, not addmm_: torch's FlopCounterMode counts it
                    torch.addmm(grad_w, g.t(), h, out=grad_w)
                else:  # accumulate in the weight's dtype (fp32 master), not in bf16
                    grad_w.add_(g.t() @ h)
            del g  # free this chunk before the next one's logits are recomputed
        return grad_h, grad_w, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int = 0,
    ignore_index: int = -100,
    vocab: VocabShard | None = None,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy of the logits `hidden @ weight.T` over targets != ignore_index.

    hidden: (..., h) (cast to the autocast dtype when autocast is on, as the head Linear
    would); weight: (V_local, h); targets: (...) with hidden's leading shape. chunk_tokens:
    tokens per chunk, 0 = `auto_chunk_tokens`. softcap: c > 0 caps the logits at
    c * tanh(logit / c) first (module docstring). Returns an fp32 scalar.
    """
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        hidden = hidden.to(torch.get_autocast_dtype(device_type))
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, h)
    chunk = chunk_tokens if chunk_tokens > 0 else auto_chunk_tokens(weight.shape[0])
    with torch.autocast(device_type, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden, weight, targets.reshape(-1), chunk, ignore_index, vocab, softcap
        )
