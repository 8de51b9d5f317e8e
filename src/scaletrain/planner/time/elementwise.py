"""The elementwise (memory-bound) kernels of a block: the bytes per token its non-matmul,
non-attention kernels move, by the framework that runs them, and their seconds over memory
bandwidth (`eager_elementwise_s`). Torch-free.

What a recipe uses (step_time.step_time): a recipe that runs its block's elementwise ops as eager
kernels (torchtitan without torch.compile): their bytes over memory bandwidth
(`eager_elementwise_bytes`); under torch.compile the bytes Inductor's fused kernels still move
(`compiled_elementwise_bytes`); llm-foundry's MPT block (`mpt_eager_elementwise_bytes`);
Megatron-Core's decoder layer on Transformer Engine (megatron, nemo): the bytes its fused
norm, bias-dropout-add, activation and RoPE kernels move (`mcore_elementwise_bytes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scaletrain.config import ModelConfig

from .fp8_casts import fp8_cast_kernels

if TYPE_CHECKING:
    from ..recipes.schema import Recipe
    from ..types import PlanInput

__all__ = [
    "eager_elementwise_bytes",
    "COMPILED_FWD",
    "COMPILED_BWD",
    "COMPILED_RECOMPUTE",
    "COMPILED_V_REPEAT",
    "compiled_elementwise_bytes",
    "MPT_EAGER_FWD",
    "MPT_EAGER_BWD",
    "mpt_eager_elementwise_bytes",
    "MCORE_NORM",
    "mcore_elementwise_bytes",
    "TT_MOE_NORM",
    "TT_MOE_ROUTE_FWD",
    "TT_MOE_ROUTE_TOTAL",
    "torchtitan_moe_elementwise_bytes",
    "torchtitan_moe_block_eager",
    "HF_GPT2_EAGER_FWD",
    "HF_GPT2_EAGER_BWD",
    "hf_gpt2_eager_elementwise_bytes",
    "HF_GPT2_LOSS_BYTES",
    "TUNE_ROPE_EXTRA",
    "TUNE_LOSS_BYTES",
    "TUNE_LOSS_UPCAST_BYTES",
    "tune_rope_bytes",
    "eager_loss_s",
    "eager_elementwise_s",
]

# ---- eager elementwise kernels (torchtitan without torch.compile) ---------------------------

EAGER_BYTES_PER_TOKEN: dict[str, tuple[float, float]] = {
    # bytes per h element: (forward, forward + backward)
    "norms": (72.0, 264.0),  # two unfused RMSNorms on x.float() (fp32 pow/mean/rsqrt/mul)
    "fused_norms": (8.0, 20.0),  # two fused RMSNorm kernels: read x, write y; bwd x, dy -> dx
}
EAGER_REST_FWD = (40.25, 20.0, 10.0)
EAGER_REST_TOTAL = (95.5, 44.0, 28.0)
"""Bytes an eager torchtitan Llama block moves per token in its non-matmul, non-attention aten
kernels (bf16, under FSDP2 mixed precision): RoPE (view_as_complex on q.float() / k.float(), a
complex multiply, .type_as), SiLU and the gate product, the residual adds, their backward, plus
the two RMSNorms (torchtitan/models/llama3/model.py RMSNorm._norm on x.float(); the
fused_rmsnorm option of the April 2024 configs runs one Triton kernel each way instead).
Measured, not assumed: every aten op of such a block (written after torchtitan's model.py)
dispatched under fake tensors, bytes = inputs + outputs of each op that is not a matmul, SDPA
or a view, at 4 shapes (h 512/1024, kv 128/256, f 1024/2048, 2,048 tokens): the counts are
linear in h, kv and f with these coefficients (the per-token constants under 0.1%; Llama 3.1
8B: 1.92 MB per token per block unfused, 0.92 MB with fused norms). Each op is memory bound
(about 1 FLOP per byte, far below every GPU's ridge), so it costs bytes / memory bandwidth.
torch.compile (Inductor) fuses these chains: under compile the fused kernels' own traffic is
charged instead (COMPILED_*, `compiled_elementwise_bytes`)."""


def eager_elementwise_bytes(model: ModelConfig, *, fused_norm: bool, recompute: bool) -> float:
    """Bytes per token per block of the eager elementwise kernels (EAGER_REST_*, norms), forward
    + backward, plus one more forward when the block's elementwise ops are recomputed (full AC;
    torchtitan's op-level SAC saves matmul and SDPA outputs only, so it recomputes them too)."""
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    norm_fwd, norm_tot = EAGER_BYTES_PER_TOKEN["fused_norms" if fused_norm else "norms"]
    fwd = EAGER_REST_FWD[0] * h + EAGER_REST_FWD[1] * kv + EAGER_REST_FWD[2] * f + norm_fwd * h
    tot = (
        EAGER_REST_TOTAL[0] * h + EAGER_REST_TOTAL[1] * kv + EAGER_REST_TOTAL[2] * f + norm_tot * h
    )
    return tot + (fwd if recompute else 0.0)


# ---- the fused kernels of a compiled torchtitan Llama block ---------------------------------

COMPILED_FWD = (26.0, 4.0, 6.0)
COMPILED_BWD = (38.0, 4.0, 10.0)
COMPILED_RECOMPUTE = (20.0, 4.0, 2.0)
COMPILED_V_REPEAT = (2.0, 2.0, 0.0)
"""Bytes per token per block, as (per h, per kv, per f element), that Inductor's fused kernels
still move in a torchtitan Llama block compiled per block (torchtitan parallelize_llama.py
`apply_compile` at 9dec370: torch.compile(transformer_block, fullgraph=True), after AC and
before FSDP), 16-bit activations (e = 2 B: 2 per element read, 2 per element written).
Kernel boundaries: a fused kernel cannot fuse through a matmul (aten.mm, cuBLAS) or SDPA (the
flash kernel), so each fused region between them reads from HBM every matmul / SDPA output it
consumes and writes every matmul / SDPA input it produces; counted as a lower bound, one read
of each input and one write of each output per region (per-token reductions in registers).
Regions, from torchtitan/models/llama/model.py at 9dec370 (TransformerBlock.forward,
Attention.forward, apply_rotary_emb, repeat_kv, FeedForward.forward; models/norms.py RMSNorm:
_norm(x.float()).type_as(x) * weight, the fp32 upcast kept in registers):
- forward: attention_norm, read x write xn (4h); RoPE on q and k with repeat_kv of k and v
  (SDPA gets n_heads keys and values: the expand + reshape copy), read q (2h), k, v (2kv + 2kv)
  and write q, k, v at n_heads (6h): 8h + 4kv; the residual add and ffn_norm, read x and wo's
  output, write h1 and hn (8h); SiLU x gate, read w1's and w3's outputs, write the product
  (6f); the block's residual add, read h1 and w2's output, write out (6h). 26h + 4kv + 6f.
- backward: SiLU x gate backward, read dg, w1 and w3 outputs, write both gradients (10f);
  each RMSNorm backward fused with its residual gradient, read the matmul gradients that sum
  into dy (2 after the MLP, 3 after q/k/v), the norm's input and the residual gradient, write
  dx (ffn_norm 10h, attention_norm 12h), and the weight gradient, a reduction over tokens
  (another loop, its own kernel), read dy and the input (2 x 4h); the RoPE backward with
  repeat_kv's sum over the repeated heads, read dq, dk, dv at n_heads (6h), write them at
  q / kv width (2h + 4kv). 38h + 4kv + 10f.
- recompute: under torchtitan's op-level SAC (`_save_list`: mm outputs but every second one,
  SDPA) and full AC, the partitioner recomputes every elementwise op in the backward graph
  (torch/_functorch/partitioners.py must_recompute: PREFER_RECOMPUTE and MUST_RECOMPUTE):
  attention_norm again (4h: wk's recompute and the q/k/v weight gradients read xn), RoPE /
  repeat_kv again (SDPA backward reads q, k, v: 8h + 4kv), the residual add and ffn_norm again
  (h1, hn: 8h), and the SiLU x gate product for w2's weight gradient, fused into the SiLU
  backward kernel that reads the same inputs (its write only: 2f). 20h + 4kv + 2f. Without
  AC the forward's writes are saved instead (the lower bound: the partitioner saves no more).
- COMPILED_V_REPEAT: with as many kv heads as query heads (kv = h) repeat_kv returns v itself
  (no copy): its read and write (2h + 2kv) are not made, in each of forward, recompute and
  backward (the sum of dv).
Ignores: the RoPE table (a per-position read, 8 B per head-dim pair), the norms' fp32 rstd
(a scalar per token), the norm weights, kernels Inductor might split further than this (a
looped reduction reading its row twice at large h, a dy sum materialized for two
consumers: the lower bound assumes not), the fp8 casts of the matmul inputs (charged apart:
fp8_casts, torchao's `fuse_with_prev False` roofline, so the regions still write 16-bit
outputs), the embedding, final norm and loss. Llama 3.1 8B under SAC: 614,400 B per token per
block, against 2.54 MB eager (`eager_elementwise_bytes`, with its recompute). Each kernel is
memory bound (a few FLOPs per byte): bytes / memory bandwidth."""


def compiled_elementwise_bytes(model: ModelConfig, *, recompute: bool) -> float:
    """Bytes per token per block of the fused elementwise kernels of a compiled torchtitan
    Llama block (COMPILED_*), forward + backward, plus the recomputed regions under AC
    (selective per-op or full: both recompute every elementwise op in the backward graph).
    Source: torchtitan/models/llama/model.py and parallelisms/parallelize_llama.py (_save_list,
    apply_compile) at 9dec370; torch/_functorch/partitioners.py must_recompute."""
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    passes = 3.0 if recompute else 2.0  # forward, backward, and the recompute
    parts = [COMPILED_FWD, COMPILED_BWD] + ([COMPILED_RECOMPUTE] if recompute else [])
    total = sum(c[0] * h + c[1] * kv + c[2] * f for c in parts)
    if kv >= h:  # no GQA: repeat_kv(v) is v itself
        total -= passes * (COMPILED_V_REPEAT[0] * h + COMPILED_V_REPEAT[1] * kv)
    return total


# ---- torchtitan's MoE block, run eagerly --------------------------------------------------

TT_MOE_NORM = (4.0, 10.0)
"""Bytes per normalized element of one nn.RMSNorm of torchtitan's Qwen3 block (torchtitan/
models/qwen3/model/model.py at 022f885: attention_norm and ffn_norm on h, q_norm and k_norm on
each head of q and k) as one fused kernel each way (aten::_fused_rms_norm, pytorch PR #153666):
forward reads and writes 2 B (4), forward + backward 10 (the backward reads dy and x, writes dx:
6). The same per element as EAGER_BYTES_PER_TOKEN['fused_norms']."""

TT_MOE_ROUTE_FWD = (6.0, 4.0)
TT_MOE_ROUTE_TOTAL = (12.0, 8.0)
"""Bytes per token, as (per k*h routed-row element, per h element), forward and forward +
backward, of the two copies torchtitan's MoE makes of the routed rows, 16-bit (e = 2), counted
as the lower bound (each tensor read once and written once per kernel, atomics resolved in L2):
- the gather of each token's k rows in expert order (torchtitan/models/moe/moe.py MoE.forward:
  torch.gather(x, 0, token_indices_experts_sorted); on the DeepEP path torchtitan/distributed/
  deepep/utils.py permute: tokens.index_select(0, sorted_indices)): forward reads and writes
  the k rows, 4kh; backward scatters the k row gradients into a zeroed (T, h): zeros 2h, read
  2kh, write 2h;
- the combine of the k expert outputs back into the token (MoE.forward: out.scatter_add(0,
  index, routed_output) on zeros_like(x); deepep/utils.py unpermute: torch.zeros then
  scatter_add_, whose note says it 'takes up to 30% of training time'): forward zeros 2h,
  reads the k rows 2kh, writes 2h; backward gathers the k row gradients, read and write 4kh.
Forward 6kh + 4h, with the backward 12kh + 8h."""


def torchtitan_moe_block_eager(plan: PlanInput) -> bool:
    """Whether torchtitan runs an MoE block's ops as eager kernels: always without
    training.compile; with it, when the block is also activation-checkpointed (full or
    selective). torchtitan compiles each block after wrapping it for AC (models/qwen3/infra/
    parallelize.py parallelize_qwen3: apply_ac, then apply_compile), and MoE blocks with
    fullgraph=False because they graph-break (models/llama4/infra/parallelize.py apply_compile
    at 022f885: 'TODO: remove when torch.compile supports fullgraph=True for MoE'; the
    token-count .tolist() of the all-to-all splits, DeepEP's FusedDispatch building its
    per-expert counts from a host list). A graph break inside a checkpointed function makes
    Dynamo skip the whole frame, the block and the checkpointed function both running eager
    (pytorch PR #193143, 2026-08, still open: 'turn compile(ac(f)) with a graph break in f
    into ac(compile(f))'). Without AC the block's compiled regions are not counted here."""
    return not plan.compile or plan.ac != "none"


def torchtitan_moe_elementwise_bytes(model: ModelConfig, *, recompute: bool) -> float:
    """Bytes per token per MoE block of torchtitan's eager MoE block (torchtitan/models/qwen3/
    model/model.py and models/moe/moe.py at 022f885), forward + backward, plus one more
    forward under AC (`recompute`):
    - the attention side and the residual adds: EAGER_REST_* per h and kv (RoPE, the adds;
      measured on the Llama block) with no f term;
    - the norms: attention_norm and ffn_norm on h, and under `qk_norm` q_norm and k_norm on q
      and kv, each a fused nn.RMSNorm (TT_MOE_NORM);
    - SiLU and the gate product on each of the token's k routed rows and its shared experts'
      rows, f wide (models/moe/moe.py _run_experts_grouped_mm: F.silu of the first grouped
      mm, times the second, separate kernels): EAGER_REST_* per f, k + shared rows;
    - the routed rows' gather and combine (TT_MOE_ROUTE_*).
    Ignores: the router (a (T, E) softmax and top-k; E << k*h), the standard path's fp32 score
    multiply of the routed output (MoE.forward with score_before_experts False; the DeepEP
    path skips it), its EP padding copies (indices_padding_wrapper / generate_permute_indices),
    DeepEP's received-token count (about ep*(1 - (1 - 1/ep)^k) rows per token rather than one
    in the combine's zeros and writes), q wider than h in EAGER_REST's per-h RoPE counts (Qwen3
    30B-A3B: q = 2h), the embedding, final norm and loss. Each kernel is memory bound."""
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    rows = model.experts_per_token + model.num_shared_experts
    k = model.experts_per_token
    normed = 2.0 * h + ((model.q_dim + kv) if model.qk_norm else 0.0)
    fwd = (
        EAGER_REST_FWD[0] * h
        + EAGER_REST_FWD[1] * kv
        + TT_MOE_NORM[0] * normed
        + EAGER_REST_FWD[2] * rows * f
        + TT_MOE_ROUTE_FWD[0] * k * h
        + TT_MOE_ROUTE_FWD[1] * h
    )
    tot = (
        EAGER_REST_TOTAL[0] * h
        + EAGER_REST_TOTAL[1] * kv
        + TT_MOE_NORM[1] * normed
        + EAGER_REST_TOTAL[2] * rows * f
        + TT_MOE_ROUTE_TOTAL[0] * k * h
        + TT_MOE_ROUTE_TOTAL[1] * h
    )
    return tot + (fwd if recompute else 0.0)


# ---- eager elementwise kernels of llm-foundry's MPT block ------------------------------------

MPT_EAGER_FWD = (20.0, 4.0)
MPT_EAGER_BWD = (50.0, 6.0)
"""Bytes per token an MPT block (llm-foundry, 16-bit stream under amp_bf16 with FSDP's bf16
parameters) moves in its non-matmul, non-attention kernels, as (per h element, per ffn
element), forward and backward. Counted from the source, one kernel per op, e = 2 B
(mosaicml/llm-foundry at 061f2c7, the benchmark README's commit):
- forward (llmfoundry/models/layers/blocks.py MPTBlock.forward): norm_1 and norm_2 are
  LPLayerNorm (norm.py; submit_benchmarks.py mod_parameters sets norm_type
  'low_precision_layernorm'): F.layer_norm on the 16-bit input, read x and write y, 2 x 4h;
  the two residual adds x + b, read 2 x 2h and write 2h, 2 x 6h; MPTMLP's nn.GELU
  (ffn.py, approximate='none') reads and writes f elements, 4f. resid_pdrop 0.0
  (configuration_mpt.py) makes both nn.Dropout calls return their input. 20h + 4f.
- backward: GELU backward reads dy and x and writes dx, 6f; each F.layer_norm backward reads
  dy and x and writes dx (6h) and its weight/bias gradient kernel reads dy and x again (4h),
  2 x 10h; each residual branch's dx is added to the skip path's gradient, read 4h and write
  2h, 2 x 6h; attention.py splits the Wqkv output with qkv.split, whose backward concatenates
  dq, dk, dv into one (b, s, 3h) gradient, read 6h and write 6h, 12h; the Triton flash
  attention backward (layers/flash_attn_triton.py _flash_attn_backward) accumulates dq in an
  fp32 buffer (dq_accum) and copies it into dq, read 4h and write 2h, 6h. 50h + 6f.
Ignores: the per-token fp32 mean / rstd of the norms, the embedding and the final norm, the
loss (flash-attn's fused cross-entropy, one kernel each way over the 16-bit logits), and the
gradient-clipping and optimizer passes. Each kernel is memory bound (about 1 FLOP per byte), so
it costs bytes / memory bandwidth: per FLOP it costs an H100 (3.35 TB/s for 989 TFLOP/s bf16)
about 1.9 times what it costs an A100 (2.04 TB/s for 312 TFLOP/s)."""


def mpt_eager_elementwise_bytes(model: ModelConfig, *, recompute: bool) -> float:
    """Bytes per token per block of an MPT block's eager elementwise kernels (MPT_EAGER_*),
    forward + backward, plus the forward again when the block is recomputed (llm-foundry's
    activation checkpointing wraps whole MPTBlocks: modeling_mpt.py
    activation_checkpointing_fn)."""
    h, f = model.dim, model.ffn_dim
    fwd = MPT_EAGER_FWD[0] * h + MPT_EAGER_FWD[1] * f
    bwd = MPT_EAGER_BWD[0] * h + MPT_EAGER_BWD[1] * f
    return fwd * (2.0 if recompute else 1.0) + bwd


# ---- the fused kernels of a Megatron-Core block on Transformer Engine ------------------------

MCORE_NORM = (4.0, 12.0)
MCORE_RESIDUAL = (6.0, 0.0)
MCORE_DROPOUT = (1.0, 5.0)
MCORE_BIAS_GRAD = (0.0, 2.0)
MCORE_ROPE = (4.0, 4.0)
MCORE_Q_COPY = (4.0, 0.0)
MCORE_V_COPY = (4.0, 0.0)
MCORE_QKV_CAT = (0.0, 4.0)
MCORE_GATED_ACT = (6.0, 10.0)
MCORE_ACT = (4.0, 6.0)
MCORE_FP8_NORM_OUT = 1.0
"""Bytes per token per block, as (forward, backward) per element, that the non-GEMM,
non-attention kernels of a Megatron-Core decoder layer built with Transformer Engine's spec
move (megatron/core/models/gpt/gpt_layer_specs.py: TELayerNormColumnParallelLinear for QKV and
fc1, TERowParallelLinear for proj and fc2, TEDotProductAttention), 16-bit activations (e = 2 B).
Read at NVIDIA/Megatron-LM d98e8a6 and NVIDIA/TransformerEngine d0067d0; the fusion flags are
Megatron-LM's defaults (megatron/training/arguments.py --no-bias-swiglu-fusion,
--no-bias-gelu-fusion, --no-bias-dropout-fusion, --no-rope-fusion are store_false) and NeMo's
(nemo/collections/llm/gpt/model/llama.py LlamaConfig / Llama3Config: bias_activation_fusion,
bias_dropout_fusion, apply_rope_fusion True, hidden_dropout 0.0; the 2024 NeMo-Framework-
Launcher configs of the NeMo H100 rows, launcher_scripts/conf/training/llama/llama3_8b.yaml:
mcore_gpt, apply_rope_fusion and bias_activation_fusion true, hidden_dropout 0.0,
bias_dropout_add_fusion false, whose unfused path, fused_bias_dropout.py
bias_dropout_add_unfused, is with dropout 0 one eager add moving the same bytes; gpt3/
175b_fp8_performance.yaml: hidden_dropout 0.1, bias_dropout_add_fusion True). Per element of
the width named:
- MCORE_NORM (per h, each of the two norms): the norm runs inside the next GEMM's module
  (transformer_engine/pytorch/module/layernorm_linear.py _LayerNormLinear.forward:
  apply_normalization reads the input and writes ln_out, which it saves for the wgrad GEMM
  with the input, mu and rsigma): read 2, write 2. Backward (_LayerNormLinear.backward:
  tex.rmsnorm_bwd / tex.layernorm_bwd) reads the dgrad GEMM's output and the saved input and
  writes dx (6; gamma's gradient from per-block partial sums), and autograd sums dx into the
  residual stream's gradient (the layer input feeds the norm and the bias-dropout-add's
  residual: read 2 + 2, write 2): 12.
- MCORE_FP8_NORM_OUT (per h, each norm): under fp8 the norm writes its output quantized
  (`with_quantized_norm`: 1 B, not 2); the fp8 transpose of that output is charged in
  fp8_casts.CAST_BYTES['transformer_engine'].normed_input, not here.
- MCORE_RESIDUAL (per h, each of the two bias-dropout-adds): megatron/core/fusions/
  fused_bias_dropout.py bias_dropout_add_fused_train (`jit_fuser`: torch.compile from torch
  2.2, megatron/core/jit.py) reads the branch output and the residual and writes the sum, one
  kernel (the bias broadcast is a per-channel read): 6. Its backward hands the output gradient
  to both inputs (no kernel).
- MCORE_DROPOUT (per h, each bias-dropout-add, hidden dropout > 0: the GPT-family recipes,
  Recipe.dropout_masks): the 1-byte mask written (1); backward reads the gradient and the mask
  and writes the branch's gradient (5).
- MCORE_BIAS_GRAD (per h for each bias-dropout-add, per f for a GELU MLP's fc1, when the
  linears have biases): the bias gradient is a reduction over tokens reading the 16-bit
  gradient once (2).
- MCORE_ROPE (per q and per kv element): megatron/core/models/common/embeddings/rope_utils.py
  apply_rotary_pos_emb with apply_rope_fusion calls TE's FusedRoPEFunc
  (transformer_engine/pytorch/attention/rope.py: tex.fused_rope_forward reads t, writes a new
  tensor; tex.fused_rope_backward reads the gradient, writes a new one): 4 each way.
- MCORE_Q_COPY (per q element, GQA only): megatron/core/transformer/attention.py
  SelfAttention.get_query_key_value_tensors splits the fused QKV output per query group
  (SplitAlongDim: views) and `query.reshape(s, b, -1, d)` cannot view a group's heads merged
  across groups when a group holds more than one query head (the group stride is (q/g + 2)
  heads): a copy, 4. Its backward is a view.
- MCORE_V_COPY (per kv element, RoPE models): q and k come out of the RoPE kernel as new
  tensors while v stays a strided slice of the QKV output; TE's get_qkv_layout
  (transformer_engine/pytorch/attention/dot_product_attention/utils.py) finds k's and v's
  strides unequal ('not_supported') and makes q, k, v contiguous: v is copied, 4.
- MCORE_QKV_CAT (per q + 2 kv elements, RoPE models): the backward of SplitAlongDim
  (transformer_engine/pytorch/utils.py SplitAlongDim.backward) concatenates dq, dk, dv into the
  fused QKV gradient unless they already sit at their offsets of one buffer, which the RoPE
  backward's new tensors do not: torch.cat, read 2, write 2. Without RoPE (GPT) q, k, v reach
  the attention as the packed 'sbh3d' layout and come back as views of one gradient: neither
  copy is made.
- MCORE_GATED_ACT (per f): megatron/core/fusions/fused_bias_swiglu.py BiasSwiGLUFunction:
  bias_swiglu reads the 2f-wide fc1 output and writes f (6); swiglu_back reads the gradient
  (f) and the saved input (2f) and writes the 2f-wide gradient (10).
- MCORE_ACT (per f): fused_bias_gelu.py GeLUFunction: bias_gelu reads y (the bias is a
  per-channel read) and writes the output (4); bias_gelu_back reads g and y and writes the
  gradient (6), which autograd also reduces into the bias gradient (MCORE_BIAS_GRAD).
Recompute: full AC (megatron/core/transformer/transformer_block.py _checkpointed_forward)
runs the forward again: the forward's bytes again. Selective AC ('core_attn') recomputes the
attention core only: nothing here.
Ignores: the RoPE frequency table and norm weights (per channel or per position), a gated
MLP's fc1 bias gradient (BiasSwiGLUFunction's bias path, not read: Llama-style blocks have no
biases), mu and
rsigma (a scalar per token), the norm's gamma-gradient finalisation (per channel), the fp8
casts of GEMM inputs and output gradients (fp8_casts), the sequence-parallel all-gather and
reduce-scatter of the norm input and proj / fc2 output (communication terms), context
parallelism's K/V exchange buffers, the embedding, final norm and loss, and any TE kernel
fusing more than these (e.g. TE's fused QKV RoPE, `FusedQKVRoPEFunc`, newer than the
published runs): a lower bound, one read per input and one write per output per kernel.
Not the block it counts: NeMo 2's GPTConfig175B (nemo/collections/llm/gpt/model/base.py:
use_transformer_engine_full_layer_spec, hidden_dropout 0.0) runs TE's own TransformerLayer,
whose LayerNormMLP fuses the GELU with its fp8 cast; NeMo's Nemotron runs an unfused squared
ReLU (nemo/collections/llm/gpt/model/nemotron.py); both are charged as this block.
Llama 3 8B under fp8: 58h + 20kv + 16f = 487,424 B per token per block; Llama 2 7B (MHA)
74h + 16f = 479,232 B. Each kernel is memory bound (a few FLOPs per byte): bytes / memory
bandwidth."""


def mcore_elementwise_bytes(
    model: ModelConfig,
    *,
    fp8_norm_out: bool,
    dropout: bool,
    recompute: bool,
    moe_layer: bool = False,
) -> float:
    """Bytes per token per block of a Megatron-Core / Transformer Engine decoder layer's fused
    non-GEMM, non-attention kernels (MCORE_*), forward + backward, plus the forward again
    under full AC (`recompute`). fp8_norm_out: the norms write their output in fp8
    (Transformer Engine's fp8 LayerNormLinear); dropout: hidden dropout is on (1-byte masks).
    Source: megatron/core/transformer (transformer_layer.py, attention.py, mlp.py),
    megatron/core/fusions (fused_bias_dropout.py, fused_bias_swiglu.py, fused_bias_gelu.py),
    TransformerEngine module/layernorm_linear.py, attention/rope.py, utils.py SplitAlongDim.
    moe_layer: a Megatron-Core MoE layer (megatron/core/models/gpt/gpt_layer_specs.py
    get_gpt_layer_with_transformer_engine_submodules, read at 00611e6: linear_qkv a
    LayerNormLinear, pre_mlp_layernorm a standalone TENorm when num_experts, the MoE layer as
    the mlp): its attention side, both norms and both bias-dropout-adds as above, without the
    MLP's activation (the routed rows' weighted SwiGLU is moe_traffic's), and only the input
    norm writes fp8 (the pre-MLP norm's output feeds the router GEMM and the dispatcher in 16
    bits). The q / k TENorms of a qk_layernorm model are not counted (as for dense blocks)."""
    h, q, kv, f = model.dim, model.q_dim, model.kv_dim, model.ffn_dim
    parts: list[tuple[tuple[float, float], float]] = [
        (MCORE_NORM, 2.0 * h),
        (MCORE_RESIDUAL, 2.0 * h),
    ]
    if not moe_layer:
        parts.append((MCORE_GATED_ACT if model.gated_mlp else MCORE_ACT, float(f)))
    if dropout:
        parts.append((MCORE_DROPOUT, 2.0 * h))
    if model.bias:
        parts.append((MCORE_BIAS_GRAD, 2.0 * h + (0.0 if model.gated_mlp else f)))
    if model.position == "rope":
        parts += [
            (MCORE_ROPE, float(q + kv)),
            (MCORE_V_COPY, float(kv)),
            (MCORE_QKV_CAT, float(q + 2 * kv)),
        ]
        if kv < q:
            parts.append((MCORE_Q_COPY, float(q)))
    fwd = sum(c[0] * n for c, n in parts)
    bwd = sum(c[1] * n for c, n in parts)
    if fp8_norm_out:
        fwd -= MCORE_FP8_NORM_OUT * (1.0 if moe_layer else 2.0) * h
    return bwd + fwd * (2.0 if recompute else 1.0)


# ---- eager elementwise kernels of Hugging Face transformers' GPT-2 block ----------------------

HF_GPT2_EAGER_FWD = (66.0, 40.0)
HF_GPT2_EAGER_BWD = (80.0, 58.0)
"""Bytes per token a Hugging Face transformers GPT2Block moves in its non-matmul kernels
outside the attention scores (those are attention_core.NAIVE_SCORE_BYTES['hf_gpt2']), as
(per h element, per ffn element), forward and backward, every op an eager kernel on 16-bit
tensors (e = 2 B: DeepSpeed's fp16 engine halves the module; no autocast casts). Counted from
the source, one read per input and one write per output per kernel: transformers
models/gpt2/modeling_gpt2.py (read at 0010f602: GPT2Block.forward, GPT2Attention.forward /
_split_heads / _merge_heads, GPT2MLP.forward), pytorch_utils.py Conv1D.forward
(`torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)`), activations.py
NewGELUActivation (`gelu_new`, GPT-2's activation_function), under torch 1.x (2021):
aten/src/ATen/native/cuda/Blas.cpp addmm_out_cuda_impl copies the expanded bias into the
result (`at::native::copy_(result, self_)`) and runs the GEMM with beta 1 (no cublasLt bias
epilogue before torch 1.13), and at::native::matmul flattens 4-d operands with
`expand(...).reshape(...)`, a copy for the permuted head views.
- forward: ln_1, ln_2 (F.layer_norm, one kernel each: read 2, write 2 per h) 8h; the four
  Conv1D bias copies and the GEMMs' reads of them (write 2 + read 2 per output element:
  c_attn 3h, attn c_proj h, c_fc f, mlp c_proj h) 20h + 4f; q, k^T and v reshaped for bmm
  out of the (b, s, 3h) c_attn output (three copies, read 2 write 2) 12h; _merge_heads'
  permute().contiguous() 4h; resid_dropout and the MLP's dropout (p = 0.1: read 2, write 2
  and a 1-byte mask) 10h; the two residual adds (read 4, write 2) 12h; gelu_new as eight
  kernels, pow, two scalar muls, add, tanh, scalar add, the 0.5 x mul and the product (reads
  20, writes 16 per f element) 36f. 66h + 40f.
- backward: the two dropouts (read the gradient and the mask, write: 5) 10h; the residual
  stream's gradient summed at each block input of the two LayerNorm branches (read 4, write
  2) 12h; two native layer_norm backwards (dx: read dy and x, write dx, 6; the weight and
  bias gradients: read dy and x, 4) 20h; the four bias gradients (a sum over tokens reading
  the gradient once) 10h + 2f; the attention output gradient made contiguous for the bmm
  backward 4h; q, k, v gradients reshaped back to (b, s, h) through the permuted views (three
  copies) 12h and SplitBackward's concatenation into the c_attn gradient (read 6, write 6)
  12h; gelu_new's autograd graph: the product's two gradients (12), the 0.5 scale (4), tanh
  backward (6), the two scalar scales (8), pow's backward (torch's pow_backward, grad x
  (3 x x.pow(2)): 4 + 4 + 6 = 14) and the two adds summing x's three gradient paths (12) 56f
  (the 1.0 + t and x + a adds pass their gradient on: no kernel). 80h + 58f.
Recompute (HF gradient_checkpointing: torch.utils.checkpoint per block): the forward again.
Ignores: the embedding and positional adds, the final ln_f, the LM head and loss, per-token
mean / rstd, the autograd engine's gradient zero-fills, the `attention_mask` scalar ops.
GPT-2 medium (h 1024, f 4096): 146h + 98f = 550,912 B per token per block. Each kernel is
memory bound (about 1 FLOP per byte): bytes / memory bandwidth."""


def hf_gpt2_eager_elementwise_bytes(model: ModelConfig, *, recompute: bool) -> float:
    """Bytes per token per block of a Hugging Face GPT2Block's eager elementwise kernels
    (HF_GPT2_EAGER_*), forward + backward, plus the forward again when the block is recomputed
    (transformers' gradient_checkpointing wraps whole GPT2Blocks)."""
    h, f = model.dim, model.ffn_dim
    fwd = HF_GPT2_EAGER_FWD[0] * h + HF_GPT2_EAGER_FWD[1] * f
    bwd = HF_GPT2_EAGER_BWD[0] * h + HF_GPT2_EAGER_BWD[1] * f
    return fwd * (2.0 if recompute else 1.0) + bwd


HF_GPT2_LOSS_BYTES = 22.0
"""Bytes per logit (per token per vocabulary entry) the loss of a Hugging Face
GPT2LMHeadModel moves outside the head's GEMM, 16-bit logits (e = 2 B: the fp16 engine's
halved module, so the loss runs on fp16 logits). transformers models/gpt2/modeling_gpt2.py
GPT2LMHeadModel.forward (read at 0010f602): `shift_logits = lm_logits[..., :-1, :]
.contiguous()` then `CrossEntropyLoss()(shift_logits.view(-1, V), ...)`. Forward: the
contiguous copy (read e, write e) and log_softmax (read e, write e): 4e; nll_loss reads one
logit per token. Backward: nll_loss's gradient, a zero-filled (b s, V) tensor with one entry
per token set (write e), log_softmax's backward (read the gradient and the output, write:
3e), and the slice's backward, a zero-filled full-size gradient with the slice copied in
(write e, read e, write e): 7e. 11e = 22 B per logit. Memory bound: bytes / memory bandwidth.
Ignores: the last position's logits the shift drops (1 / s of them), the labels' copy."""


# ---- torchtune's eager RoPE and loss -------------------------------------------------------

TUNE_ROPE_EXTRA = (28.0, 72.0)
"""Bytes per rotated element (per q and per k element: q_dim + kv_dim per token), forward and
backward, that torchtune's eager RoPE moves beyond the complex-multiply RoPE counted in
EAGER_REST_* (torchtitan's apply_rotary_emb: 20 per element each way, the two casts and the
complex product). torchtune/models/llama3_1/_position_embeddings.py Llama3ScaledRoPE.forward
(read at 1814feb, the README optimization table's commit; modules/position_embeddings.py
RotaryPositionalEmbeddings has the same body): x.float().reshape(..., -1, 2), then
torch.stack of the two rotated halves, each the difference or sum of two products of a
strided half of the fp32 copy with the cache, flattened and .type_as(x), all on fp32:
forward the upcast 6, four products 4 each, the subtraction and the addition 6 each, the
stack 8, the downcast 6: 48 (9 kernels). Backward (14 kernels): the downcast's 6, the
subtraction's negated gradient 4, four products 4 each, a select_backward per indexing of
the fp32 copy (a full-size fp32 gradient with one half written: 6 each, 24), the three adds
summing those four (12 each, 36), the upcast's 6: 92. Less torchtitan's 20 and 20: 28 and
72. Checked by dispatch: the function (written after that source) and torchtitan's, run
under a TorchDispatchMode at (1, 256, 8, 128) bf16 (torch 2.13), bytes = inputs + outputs of
each non-view op: torchtune 49 and 93, torchtitan 20.5 and 22.5 per element (the difference
is the per-position cache, ignored as in EAGER_REST). Under torch.compile (torchtune's
training.compile_model compiles each TransformerSelfAttentionLayer) Inductor fuses it with
the rest of the block: COMPILED_* stands for it. Memory bound: bytes / memory bandwidth."""

TUNE_LOSS_BYTES = 36.0
"""Bytes per logit (per token per vocabulary entry) torchtune's eager loss moves outside the
head's GEMM: the 16-bit logits upcast to fp32 (TransformerDecoder.forward `self.output(h)
.float()` for the unchunked loss, or CEWithChunkedOutputLoss.compute_cross_entropy
`F.cross_entropy(logits.float(), ...)` per chunk, torchtune/modules/transformer.py and
modules/loss/ce_chunked_output_loss.py at 1814feb): forward the upcast (read 2, write 4) and
log_softmax (read 4, write 4), 14; backward nll_loss's zero-filled gradient (write 4),
log_softmax's backward (read 4 + 4, write 4) and the upcast's backward (read 4, write 2), 22.
Ops as dispatched by F.cross_entropy(x.float(), labels) under a TorchDispatchMode (_to_copy,
_log_softmax, nll_loss_forward; nll_loss_backward, _log_softmax_backward_data, _to_copy);
nll_loss reads one logit per token (not counted). Memory bound: bytes / memory bandwidth."""

TUNE_LOSS_UPCAST_BYTES = 12.0
"""Bytes per logit of torchtune's loss left eager under compile with the unchunked loss when
the recipe keeps the compiled loss: the model's `.float()` of the logits (outside the compiled
layers, training.compile_model) and its backward, 6 + 6. training/_compile.py compile_loss
compiles, for the chunked loss, compute_cross_entropy with its upcast in place (the loss
object's attribute), and for any other loss returns a new torch.compile(loss) module; at
1814feb (and torchtune's main of 2026-04) only recipes/lora_finetune_single_device.py assigns
that return (`self._loss_fn = training.compile_loss(...)`): full_finetune_single_device.py,
full_finetune_distributed.py and lora_finetune_distributed.py call it and drop it, so their
unchunked loss stays eager (TUNE_LOSS_BYTES). The compiled kernels are not counted, as no
recipe's compiled loss is."""


def tune_rope_bytes(plan: PlanInput) -> float:
    """Bytes per token per block that torchtune's eager RoPE moves beyond EAGER_REST's
    (TUNE_ROPE_EXTRA over q_dim + kv_dim elements, the forward again under AC); 0 under
    compile and for a model without RoPE."""
    model = plan.model
    if plan.compile or model.position != "rope":
        return 0.0
    fwd, bwd = TUNE_ROPE_EXTRA
    passes = fwd * (2.0 if plan.ac != "none" else 1.0) + bwd
    return passes * (model.q_dim + model.kv_dim)


def eager_loss_s(plan: PlanInput, recipe: Recipe | None) -> float:
    """Seconds per token of a recipe's eager loss kernels over the logits (bytes per logit x
    vocab over memory bandwidth): Hugging Face's GPT-2 (Recipe.eager_block 'hf_gpt2',
    HF_GPT2_LOSS_BYTES, 0 under compile); torchtune (eager_block 'torchtune': TUNE_LOSS_BYTES
    eager, and under compile with the unchunked loss, PlanInput.chunked_loss False, except
    LoRA on one GPU, TUNE_LOSS_UPCAST_BYTES; 0 for its compiled chunked loss); 0 for other
    recipes, with a user-set efficiency and on CPU."""
    hw = plan.hardware
    if recipe is None or not recipe.eager_elementwise or plan.efficiency > 0 or hw.is_cpu:
        return 0.0
    if recipe.eager_block == "torchtune":
        # compile_loss's compiled module is kept by lora_finetune_single_device only
        # (TUNE_LOSS_UPCAST_BYTES): the unchunked loss of the other recipes stays eager
        lora_single = plan.lora_rank > 0 and plan.num_gpus == 1
        if not plan.compile or (plan.chunked_loss is False and not lora_single):
            per_logit = TUNE_LOSS_BYTES
        elif plan.chunked_loss is False:
            per_logit = TUNE_LOSS_UPCAST_BYTES
        else:
            return 0.0
        return per_logit * plan.model.vocab_size / hw.memory_bw
    if recipe.eager_block != "hf_gpt2" or plan.compile:
        return 0.0
    return HF_GPT2_LOSS_BYTES * plan.model.vocab_size / hw.memory_bw


def eager_elementwise_s(plan: PlanInput, recipe: Recipe | None) -> float:
    """Seconds per token per block of a recipe's elementwise kernels (RoPE, SiLU, norms,
    residual adds) over memory bandwidth: eager, eager_elementwise_bytes; under
    torch.compile the fused kernels Inductor makes of them (torchtitan's per-block compile,
    compiled_elementwise_bytes: Llama blocks only). 0 for a recipe that fuses them
    (Recipe.eager_elementwise False), with a user-set efficiency (which stands for the whole
    block), on CPU, and for models other than the block the bytes were counted on
    (Recipe.eager_block: the dense RMSNorm Llama block, or llm-foundry's dense LayerNorm GELU
    MPT block, mpt_eager_elementwise_bytes, not counted under compile); for
    Megatron-Core on Transformer Engine (eager_block 'mcore') the fused kernels its layer runs
    (mcore_elementwise_bytes, dense models). MoE models: torchtitan's MoE block when it runs
    eager (Recipe.moe_block 'torchtitan', `_torchtitan_moe_s`); a Megatron-Core MoE layer's
    non-expert kernels (`_mcore_moe_s`); 0 otherwise."""
    model, hw = plan.model, plan.hardware
    if recipe is None or not recipe.eager_elementwise or plan.efficiency > 0 or hw.is_cpu:
        return 0.0
    if model.is_moe and recipe.eager_block == "mcore":
        return _mcore_moe_s(plan, recipe)
    if model.is_moe:
        return _torchtitan_moe_s(plan, recipe)
    if recipe.eager_block == "mcore":
        # Megatron-Core's Transformer Engine layer: its fused kernels (MCORE_*),
        # the norms writing fp8 under TE's fp8, dropout masks where the recipe keeps them
        fp8_out = fp8_cast_kernels(plan, recipe) == "transformer_engine"
        dropout = recipe.dropout_masks and model.norm == "layernorm"
        moved = mcore_elementwise_bytes(
            model, fp8_norm_out=fp8_out, dropout=dropout, recompute=plan.ac == "full"
        )
        return moved / hw.memory_bw
    if recipe.eager_block == "hf_gpt2":
        # Hugging Face's eager GPT2Block: LayerNorm and a GELU MLP (HF_GPT2_EAGER_FWD)
        if model.norm != "layernorm" or model.gated_mlp or plan.compile:
            return 0.0
        return hf_gpt2_eager_elementwise_bytes(model, recompute=plan.ac == "full") / hw.memory_bw
    if recipe.eager_block == "mpt":
        # llm-foundry's MPT block: LayerNorm and a GELU MLP (MPT_EAGER_FWD)
        if model.norm != "layernorm" or model.gated_mlp or plan.compile:
            return 0.0
        return mpt_eager_elementwise_bytes(model, recompute=plan.ac == "full") / hw.memory_bw
    if model.norm != "rmsnorm":
        return 0.0
    if plan.compile:
        return compiled_elementwise_bytes(model, recompute=plan.ac != "none") / hw.memory_bw
    moved = eager_elementwise_bytes(model, fused_norm=plan.fused_norm, recompute=plan.ac != "none")
    if recipe.eager_block == "torchtune":  # its stack-based fp32 RoPE (TUNE_ROPE_EXTRA)
        moved += tune_rope_bytes(plan)
    return moved / hw.memory_bw


def _torchtitan_moe_s(plan: PlanInput, recipe: Recipe) -> float:
    """Seconds per token per block (the mean over the model's blocks) of torchtitan's eager MoE
    model: its MoE blocks' torchtitan_moe_elementwise_bytes and its dense first blocks' fused-
    norm Llama count (eager_elementwise_bytes), over memory bandwidth; 0 for a recipe without
    torchtitan's MoE block, a block torchtitan compiles (torchtitan_moe_block_eager), MLA or a
    non-RMSNorm model (not counted)."""
    model, hw = plan.model, plan.hardware
    if (
        recipe.moe_block != "torchtitan"
        or not torchtitan_moe_block_eager(plan)
        or model.is_mla
        or model.norm != "rmsnorm"
    ):
        return 0.0
    recompute = plan.ac != "none"
    dense = model.num_dense_layers
    moe = model.num_layers - dense
    moved = moe * torchtitan_moe_elementwise_bytes(model, recompute=recompute)
    if dense:
        moved += dense * eager_elementwise_bytes(
            model.dense_layer_view(), fused_norm=True, recompute=recompute
        )
    return moved / model.num_layers / hw.memory_bw


def _mcore_moe_s(plan: PlanInput, recipe: Recipe) -> float:
    """Seconds per token per block of a Megatron-Core MoE layer's attention-side, norm and
    residual kernels (mcore_elementwise_bytes with `moe_layer`) over memory bandwidth, for the
    layers time.moe_traffic counts the routed rows of (recipes.activations
    megatron_moe_applies: dropless top-k softmax, no shared experts, no dense layers, no MLA);
    0 for other MoE layers (not counted)."""
    from ..recipes.activations import megatron_moe_applies

    model = plan.model
    if not megatron_moe_applies(plan, recipe):
        return 0.0
    fp8_out = fp8_cast_kernels(plan, recipe) == "transformer_engine"
    dropout = recipe.dropout_masks and model.norm == "layernorm"
    moved = mcore_elementwise_bytes(
        model,
        fp8_norm_out=fp8_out,
        dropout=dropout,
        recompute=plan.ac == "full",
        moe_layer=True,
    )
    return moved / plan.hardware.memory_bw
