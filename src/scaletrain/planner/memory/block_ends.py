"""Two ends of a block the stored-activation moments miss (torch-free; one rank, bytes): a
norm's backward, with the fp32 temporaries an RMSNorm's backward holds over its tokens, and
the end of the MLP's forward, where a linear's unsaved input is still alive."""

from __future__ import annotations

from scaletrain.config import ModelConfig, compute_bytes

from .head import MicroBatchShape

__all__ = ["NORM_BACKWARD_FP32_TEMPS", "norm_backward_bytes", "mlp_forward_end_bytes"]

NORM_BACKWARD_FP32_TEMPS = {False: 3, True: 4}
"""fp32 (tokens x h) temporaries alive at once inside an RMSNorm's backward, by whether the
residual stream is fp32 (autocast over fp32 parameters: DDP / ZeRO-0/1):
- 16-bit stream: models/norms.py `_RMSNorm16.backward` recomputes the fp32 normalized value
  and keeps it beside the fp32 upcast of the gradient (or g = gf * weight) and one product
  (gf * normed for the weight's gradient, g * normed for the mean), 3 (its docstring: "at
  most three tokens x h alive");
- fp32 stream: autograd through `weight * F.rms_norm(x)` (`rms_norm16`'s fp32 branch), 4
  (measured: the dry-run of a dim-256 llama, dp1 ZeRO-0 tp4, fp8, peaks inside the final
  norm's backward with four fp32 (4, 512, 256) temporaries of its own, pow / div / mul /
  mul, beside the fp32 gradient it received)."""


def norm_backward_bytes(
    model: ModelConfig,
    mb: MicroBatchShape,
    *,
    residual_fp32: bool,
    mlp_saved: float,
    recompute: float,
    full_ac: bool,
) -> float:
    """What a block's backward holds at a norm's backward beyond the stored activations
    (`layer_activation_bytes`, plus what a recompute re-created): the larger over the final
    norm's backward (before any block's) and the last block's MLP norm's (after its MLP's
    backward). tokens = s_l*b (`mb`), tsp = t under SP (else 1), e = the compute dtype's
    bytes, r = 4 on an fp32 stream (else e).

    Counts, each over the norm's tokens (tokens/tsp):
    - the norm's fp32 temporaries, 4 x `NORM_BACKWARD_FP32_TEMPS` per element;
    - two stream-dtype tensors, r each: the norm output's gradient (the reduced head's or
      MLP's input gradient; under autocast the fp32 gradient of the cast the linears read)
      and the residual stream's gradient (at the final norm: its saved input instead, which
      the head's activations count, with the rest of them freed by then);
    less what is freed by then, only where a recompute re-created it (`recompute`; without AC
    the final norm's moment, which frees nothing, is the larger): the MLP's saved set at its
    own norm (`mlp_saved`, the block's no-AC MLP inputs and intermediates) and, under full
    AC, the block input, which the recompute's first norm saves again (the checkpoint's
    tensor: one copy, counted with the stored blocks).
    Measured (dry-run, planner vs dry-run before the term): a dim-256 llama tp4 without SP,
    dp2 ZeRO-3, fp8, no AC, peaks inside the final norm's backward with three fp32 (4, 512,
    256) temporaries and the all-reduced bf16 gradient (-15.0%); Llama-3-70B tp8 without SP,
    fp8 full AC, inside the last block's MLP-norm backward in its recompute: 3 x 4 GiB of
    fp32 temporaries, the residual gradient, the all-reduced MLP input gradient and the
    recomputed norm input, 2 GiB each (-6.8% at 4 blocks).
    Ignores: LayerNorm (its fused native backward allocates no (tokens x h) fp32 temporary:
    0), the weight's gradient (h elements), Gemma's post-norms (the pre-norms' count is used).
    """
    if model.norm != "rmsnorm":
        return 0.0
    h, tokens, e = model.dim, mb.tokens, compute_bytes(mb.precision)
    tsp = mb.tp if mb.sp else 1
    r = 4 if residual_fp32 else e
    temps = 4.0 * NORM_BACKWARD_FP32_TEMPS[residual_fp32] * tokens * h / tsp
    grads = 2.0 * r * tokens * h / tsp
    freed = mlp_saved + (r * tokens * h / tsp if full_ac else 0.0)
    return temps + grads - min(freed, recompute)


def mlp_forward_end_bytes(model: ModelConfig, mb: MicroBatchShape, *, residual_fp32: bool) -> float:
    """What the last block's MLP forward holds at its end beyond the stored activations
    (`layer_activation_bytes`, this block's counted whole) under fp8, where its linears save
    1-byte copies of their inputs and the 16-bit inputs are not saved but still referenced
    (models/mlp.py: `w2(act(w1(x)) * w3(x))` holds x in the module's frame and p, w2's input,
    in w2's call until w2 returns). tokens = s_l*b (`mb`), f = ffn_dim, e = the compute
    dtype's bytes, r = 4 on an fp32 stream (autocast over fp32 parameters, whose norm outputs
    fp32), else e.

    Counts: x, r*tokens*h (whole under TP: all-gathered under SP, where the sequence-sharded
    norm output the gather read, r*tokens*h/t, is alive too); p, e*tokens*f/t; and the larger
    of w2's input cast (its fp32 quotient 4*tokens*f/t) and w2's output with its reduction:
    the row-parallel partial sum over the whole width, e*tokens*h, and under SP the
    reduce-scatter's re-laid input (DTensor concatenates the sequence chunks, e*tokens*h) and
    output (e*tokens*h/t); without SP the all-reduce's output (e*tokens*h); at tp 1 nothing.
    Measured (dry-run, dim-256 llama tp4+SP dp2 ZeRO-3 fp8 no AC): the peak is the last
    block's w2 reduce-scatter in forward, holding x (4, 512, 256), the sharded norm output,
    p (4, 512, 224), w2's output, the concatenated input and the (4, 128, 256) output beside
    the stored set (-4.5% before the term); dp1 ZeRO-0 (autocast, an fp32 stream) tp4+SP:
    the same tensors, x and the sharded norm output in fp32 (-3.7%).
    Ignores (0 where not fp8): the 16-bit tail (x and p are saved there, and w2's output and
    its reduction stay below the backward's moments: the forward moments ignore a matmul's
    output before it is saved), GELU's single input (the gated form is counted), MoE."""
    if mb.precision != "fp8":
        return 0.0
    tp, sp, tokens, e = mb.tp, mb.sp, mb.tokens, compute_bytes(mb.precision)
    h, f = model.dim, model.ffn_dim / tp
    r = 4 if residual_fp32 else e
    x = r * tokens * h + (r * tokens * h / tp if sp and tp > 1 else 0.0)
    if tp == 1:
        out = e * tokens * h
    elif sp:
        out = 2.0 * e * tokens * h + e * tokens * h / tp
    else:
        out = 2.0 * e * tokens * h
    return x + e * tokens * f + max(4.0 * tokens * f, out)
