"""What a split backward keeps between a micro-batch's input-gradient pass (I) and its weight
pass (W), per micro-batch on one rank (torch-free): the zero-bubble and DualPipeV schedules
(`config.layout_facts.split_backward`). Read by `pipeline_ranks.schedule_moments` (which
micro-batches are past their I) and `rank_moments` (their bytes).

The mechanism (torch/distributed/pipelining/_backward.py and stage.py, torch 2.13, as the
trainer's `parallel.pipeline` runs them: `ScheduleInterleavedZeroBubble` / `ScheduleDualPipeV`
over `parallel.pipeline_stage.InFlightStage`): `stage_backward_input` finds, for every weight,
the nodes of the graph where the weight's path joins the stage input's (`get_param_groups`'
"intermediates": a linear's matmul, a norm's weight product, the grouped experts' matmuls,
the head's matmul), records in a pre-hook the gradient reaching each of them, runs
autograd.grad to the stage input with retain_graph=True and then `detach_()`es the stage
outputs (the loss, on the last stage). The recorded gradients and every saved tensor of the
retained graph stay in `backward_state` until `stage_backward_weight` runs autograd.grad from
the recorded gradients to the weights (W). The first stage skips I and runs its whole backward
at W (`_PipelineStageBase.backward_one_chunk`): it records nothing.

Units: bytes; every function answers for ONE rank, one micro-batch.
"""

from __future__ import annotations

from scaletrain.config import ModelConfig, compute_bytes, expert_tp
from scaletrain.config.lora import tp_shapes

from .head import MicroBatchShape

__all__ = ["block_recorded_bytes", "head_after_input_bytes", "head_weight_pass_bytes"]


def block_recorded_bytes(
    model: ModelConfig,
    mb: MicroBatchShape,
    *,
    residual_fp32: bool = False,
    ep: int = 1,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = (),
) -> float:
    """The gradients I records for W in one block (on top of its saved tensors, which the
    retained graph keeps as before I): the gradient of the output of every node where a
    weight joins, s_l*b tokens (the whole sequence under SP for the column-parallel linears,
    whose input is all-gathered, and the row-parallel ones, whose output is reduce-scattered
    after the matmul), t = mb.tp, e = the matmul's output dtype (the compute dtype), r = the
    norms' output dtype (the residual dtype: an fp32 weight times the normalized value under
    autocast, else the compute dtype):
    - each norm with a weight, r*h (/t under SP): the two pre-norms, Gemma 2's two post-norms;
      Qwen3's per-head q/k norms r*(q + kv)/t;
    - attention: q, k, v e*(q + 2kv)/t (one fused qkv matmul records the same) and the
      output projection e*h; MLA (models/mla.py): the latent projections and their norms,
      whole on every tp rank, (e + r)*(r_q + r_kv) + e*d_rope, the up-projections
      e*a*(d_qk + d_nope + d_v)/t (without a q latent, wq's e*a*d_qk/t), the output e*h;
    - MLP: the input projections e*f/t each (2 gated, 1 GELU) and the down projection e*h;
      MoE: the router's logits (e*E, or 4*E for DeepSeek's fp32 router, models/deepseek_moe.py)
      and the routed experts' grouped matmuls for k copies of each token,
      k*e*(n_in*f/t_e + h) (t_e = `config.layout.expert_tp`), the shared experts' one MLP
      e*(n_in*n_s*f/t_e + h);
    - LoRA (a frozen base): only the adapters' matmuls, e*(rank + out_local) per target.
    Ignores: experts' and linears' bias adds (recorded with the matmul: nn.Linear runs one
    addmm; expert biases would add their own), the residual adds and activations (no weight),
    what the recompute of an AC block re-creates in I (the existing recompute term).
    Source: the dry-run's timeline around each I: llama-1024 with 8 blocks, pp4 zero-bubble z0
    bf16 s256 b2, rank 2 (3 blocks): its I adds 43.0 MB, 3 x 13.6 MB as recorded here and the
    2.1 MB input gradient it sends (rank 1 and 2 were -8.6% / -12.1% without this term, -0.8% /
    -1.0% with it); DeepSeek-V3 at 1/8 widths, dp16 z1 pp16 zero-bubble cp8 ep64, the last
    rank's two MoE blocks: 20.9 MiB a block and micro-batch more after I than before (this
    formula 18.9 MiB); llama-1024 tp2+sp pp2 zero-bubble, last rank: a micro-batch past its I
    holds 69.5 MB (these terms with the head's, 68.3 MB)."""
    e = compute_bytes(mb.precision)
    r = 4 if residual_fp32 else e
    h, t, tok = model.dim, mb.tp, mb.tokens
    if lora_rank:
        shapes = tp_shapes(model, lora_rank, t)
        per_tok = sum(e * (lora_rank + shapes[n].lora_b[0]) for n in lora_targets if n in shapes)
        return per_tok * tok
    norms = (4 if model.post_norms else 2) * r * h / (t if mb.sp else 1)
    if model.is_mla:
        latents = (e + r) * (model.q_lora_rank + model.kv_lora_rank)
        a = model.num_heads
        up = model.qk_head_dim + model.qk_nope_head_dim + model.v_head_dim
        attn = latents + e * model.qk_rope_head_dim + e * a * up / t + e * h
    else:
        q, kv = model.q_dim, model.kv_dim
        attn = e * (q + 2 * kv) / t + e * h
        if model.qk_norm:
            attn += r * (q + kv) / t
    n_in = 2 if model.gated_mlp else 1
    if model.is_moe:
        te = expert_tp(t, ep)
        deepseek = model.num_shared_experts or model.router_scoring != "topk_softmax"
        mlp = float((4 if deepseek else e) * model.num_experts)
        kr = model.expert_rows_per_token(tok)  # permuted rows per token (k: no capacity)
        mlp += kr * e * (n_in * model.ffn_dim / te + h)
        if model.num_shared_experts:
            mlp += e * (n_in * model.num_shared_experts * model.ffn_dim / te + h)
    else:
        mlp = e * (n_in * model.ffn_dim / t + h)
    return (norms + attn + mlp) * tok


def head_after_input_bytes(
    model: ModelConfig, mb: MicroBatchShape, *, residual_fp32: bool = False, offloaded: bool = False
) -> float:
    """What one micro-batch's head (final norm, output projection, loss) keeps on the last stage
    between its I and its W. Under a split backward the trainer runs the head as a plain
    Linear and the loss as the schedule's `loss_fn` (`config.fused_head_loss`,
    `models.transformer.causal_lm_loss`); I has popped the logits from torch's `fwd_cache` and
    detached the loss, so the loss's nodes above the head's matmul (the fp32 upcast,
    log-softmax, nll) are freed with their saved tensors and the logits with them. What stays:
    - the stored inputs, as `head.head_activation_bytes` counts them: the final norm's input
      r*s_l*b*h (/t with SP) and the head's 16-bit input e*s_l*b*h;
    - the logits' gradient recorded at the head's matmul, e*s_l*b*V/t, in place of the logits
      and their fp32 log-softmax output (6 or 8 B a logit before I);
    - the final norm's output gradient recorded at its weight, r*s_l*b*h (/t with SP).
    offloaded (activation offload): the stored inputs are on the host; the recorded gradients
    are not saved tensors and stay on the device.
    Ignores: the stage input's own gradient (torch sets it as the input's .grad and sends it:
    the pipeline's boundary buffers, `buffers.pp_boundary_bytes`), the fp32 per-token rstd and
    the fp32 normalized output an fp32-stream norm saves (r*s_l*b*h: 1.5% of a micro-batch's
    bytes at a 128,000-row head).
    Source: the dry-run, llama-1024 with a 128,000-row head, pp4 zero-bubble z0 bf16 s512 (the
    last rank holds the head alone): 140.5 MB a micro-batch after I (this formula 136.3 MB),
    396.4 MB before; DeepSeek-V3 at 1/8 widths, dp8 z1 pp32 zero-bubble cp8 ep64, last rank:
    140.6 MB (137.0 MB)."""
    e = compute_bytes(mb.precision)
    r = 4 if residual_fp32 else e
    tok = mb.tokens
    sp_tp = mb.tp if mb.sp else 1
    recorded = e * tok * model.vocab_size / mb.tp + r * tok * model.dim / sp_tp
    if offloaded:
        return recorded
    return recorded + r * tok * model.dim / sp_tp + e * tok * model.dim


def head_weight_pass_bytes(
    model: ModelConfig, *, tp: int = 1, precision: str = "bf16", weight_bytes: int = 4
) -> float:
    """The head weight's gradient as W makes it, alive beside everything the stage still
    stores: `stage_backward_weight` runs autograd.grad from the recorded logits' gradient to
    the weight and then adds the result into .grad (sets it on the first W). The matmul's
    weight gradient is in its compute dtype, e*V_l*h (V_l = V/t rows); under autocast
    (`weight_bytes` 4: the fp32 parameter read through autocast's 16-bit cast) the cast's
    backward makes the fp32 gradient 4*V_l*h from it, both alive at once; an fp32 model makes
    the fp32 one only, FSDP2's 16-bit unsharded weight (ZeRO-2/3, `weight_bytes` = e) the
    16-bit one only.
    Ignores: the blocks' and the final norm's weight gradients of the same pass (one weight at
    a time, each below the head's), FSDP2's fp32 accumulation of the unsharded gradient across
    micro-batches (the accumulated grads are counted, `rank_moments._loss_resting`).
    Source: the dry-run, llama-1024 with a 128,000-row head, pp4 zero-bubble z0 bf16: the last
    rank's W adds 781 MB over its start ((2 + 4) B x 128,000 x 1024 = 786 MB), and the step's
    peak there ties with its loss backward's (3706.9 and 3705.8 MB)."""
    e = compute_bytes(precision)
    table = float(-(-model.vocab_size // tp)) * model.dim
    return (e + (4 if weight_bytes > e else 0)) * table
