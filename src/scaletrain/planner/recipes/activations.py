"""A foreign recipe's activation bytes (registry.py): one layer's stored set under the
recipe's activation model and AC mode (`recipe_layer_bytes`: Korthikanti et al. 2022 for
Megatron's layer, `memory.activations.layer_activation_bytes` for SDPA Llamas, torchtitan's
op-level SAC, Nanotron's decoder layer), and the last stage's head, loss and logits
(`recipe_head_bytes`). Units: bytes, one rank, one micro-batch. Torch-free;
`memory.recipe_rank_memory` composes them.
"""

from __future__ import annotations

import dataclasses

from scaletrain.config import expert_tp

from ..memory.activations import layer_activation_bytes
from ..types import PlanInput
from .schema import Recipe

__all__ = ["recipe_layer_bytes", "recipe_head_bytes", "megatron_moe_applies"]


def _korthikanti(plan: PlanInput, recipe: Recipe, ac: str) -> float:
    """One Megatron transformer layer's stored bytes per micro-batch (Korthikanti et al. 2022
    Table 2, generalised): per token, e = element bytes, masks = 1-byte dropout masks kept for
    GPT-2-family models (recipe.dropout_masks):
      replicated over tp without SP: two norm inputs 2e*h, QKV input e*h, fc1 input e*h, the
        two residual dropout masks 2*masks*h (= 10 h with e = 2: the '10' of 10 + 24/t);
      split over tp: Q e*h, K and V e*kv each, out-projection input e*h, fc1 output and GELU
        output 2e*f (SwiGLU: the fused swiglu keeps its 2f input and the f-wide output fc2
        reads, 3e*f), flash attention's fp32 log-sum-exp 4a; 'naive' attention keeps the
        scores, softmax and dropout (e + masks + e)*a*s instead (the 5as/h term), which
        selective recompute (core attention) drops;
      SP divides everything by t; full recompute keeps the layer input e*h (/t with SP).
    With e = 2, MHA, GELU f = 4h and masks this is 34 + 5as/h (SP) and 10 + 24/t + 5as/(ht).
    Under fp8 with Transformer Engine layers (recipe.te_fp8_gemm_inputs) the GEMM inputs are
    saved as fp8: the two layernorm outputs take h each instead of e*h, the activation output
    f instead of e*f, and the output projection adds an fp8 copy h of the attention output
    (TransformerEngine v1.8 transformer_engine/pytorch/module/layernorm_linear.py and
    layernorm_mlp.py: ln_out is uint8 under fp8 and saved; layernorm_mlp.py saves gelu_out as
    the fp8 GEMM2 input; linear.py saves the fp8 inputmat or its transpose): SP, e = 2,
    f = 4h: 34 -> 29 per sbh/t.
    """
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    h, a, f, kv = m.dim, m.num_heads, m.ffn_dim, m.kv_dim
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    sp = L.sp or recipe.sp_with_tp
    tsp = L.tp if sp else 1
    if ac == "full":
        return e * tok * h / tsp
    masks = 1.0 if (recipe.dropout_masks and m.norm == "layernorm") else 0.0
    rep = 2 * e * h + e * h + e * h + 2 * masks * h
    mlp = (3 if m.gated_mlp else 2) * e * f
    split = float(e * (h + 2 * kv) + e * h + mlp)
    if (m.attention == "naive" or recipe.attention == "naive") and ac != "selective":
        split += (2 * e + masks) * a * plan.seq_len
    else:
        split += 4.0 * a
    if plan.precision == "fp8" and recipe.te_fp8_gemm_inputs:
        # Transformer Engine under fp8 (Recipe.te_fp8_gemm_inputs): the QKV and fc1 inputs
        # (the layernorm outputs) and the fc2 input (the activation output, f wide) are saved
        # as fp8, 1 B instead of e; the output projection saves an fp8 copy of the attention
        # output beside the 16-bit one the attention core keeps
        rep -= 2 * (e - 1) * h
        split += h - (e - 1) * f
    return tok * (rep / tsp + split / L.tp)


def _torchtitan_op_sac(plan: PlanInput) -> float:
    """torchtitan's op-level selective AC per layer per micro-batch: the block input e*h (/t
    with SP), the outputs of the 1st, 3rd, 5th and 7th matmul of a Llama block (wq h/t, wv
    kv/t, w1 f/t, w2: this rank's partial sum h, or h when tp = 1), SDPA's output e*h/t and
    fp32 log-sum-exp 4a/t, and with tp > 1 the two reduce-scatter outputs e*h/t (saved ops).
    The 2nd, 4th and 6th matmuls (wk, wo, w3) and every pointwise op are recomputed.
    plan.sdpa_saved False: the run's SDPA kernel is not in the save list, so its output and
    log-sum-exp are recomputed too (torchtitan/models/attention.py ScaledDotProductAttention
    ._init_backend puts SDPBackend.CUDNN_ATTENTION first when has_cuda_capability(10, 0),
    from 3b85aa3, 2025-05-14; torchtitan/models/llama3/infra/parallelize.py _save_list at
    6fc499f lists aten._scaled_dot_product_flash_attention and _efficient_attention only;
    b39377f, 2025-12-01, added _scaled_dot_product_cudnn_attention 'to avoid recomputing
    attention during backward'). Ignores: the recomputed output alive during one layer's
    backward (one layer's e*h/t, inside the recompute transient)."""
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    h, a, f, kv, t = m.dim, m.num_heads, m.ffn_dim, m.kv_dim, L.tp
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    sdpa = e * h / t + 4.0 * a / t if plan.sdpa_saved is not False else 0.0
    per = e * (h / t + h / t + kv / t + f / t + h) + sdpa
    if t > 1:
        per += 2 * e * h / t
    return tok * per


def _nanotron_layer(plan: PlanInput, recipe: Recipe, ac: str) -> float:
    """One Nanotron LlamaDecoderLayer's saved tensors per micro-batch (nanotron c252843
    src/nanotron/models/llama.py, training path), per token, e = element bytes, t = tp,
    tsp = t under tp_mode REDUCE_SCATTER (SP), q = heads x d, kv = kv_heads x d:
      two TritonRMSNorms (flash-attn layer_norm_fn saves x and an fp32 rstd): 2 x (e*h + 4)/tsp;
      qkv_proj and gate_up_proj save their normed input: 2 x e*h, /tsp with tp_recompute_allgather
        (Recipe.sp_linear_saves_shard: the sequence shard, re-gathered in backward);
      attention: CausalSelfAttention.forward without GQA views qkv_states as (3, b, s, heads, d)
        and makes it contiguous; q stays a view of that buffer (rotated in place by flash-attn's
        RotaryEmbedding and saved by flash_attn_varlen_func), so all of it lives, e*(q + 2kv)/t;
        with GQA q, k, v are split and copied apart (q alone lives, e*q/t); k and v are
        concatenated and made contiguous as (b, s, 2, kv_heads, d), rotated in place and saved
        as views, e*2kv/t; the output e*q/t (o_proj's saved input, a view of it) and the fp32
        log-sum-exp 4*heads/t;
      MLP: gate_up's merged output (SiLU saves its gate view, the mul its up view) 2e*f/t, the
        SiLU output e*f/t and the product (down_proj's saved input) e*f/t;
      recompute_layer (ac='full'): CheckpointFunction keeps the layer input e*h/tsp.
    Ignores: the boolean sequence mask, the residual adds (save nothing), the rotary cos/sin
    caches (buffers)."""
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    h, t = m.dim, L.tp
    q, kv, f = m.q_dim, m.kv_dim, m.ffn_dim
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    tsp = t if (L.sp or recipe.sp_with_tp) else 1
    if ac == "full":
        return e * tok * h / tsp
    norms = 2 * (e * h + 4.0) / tsp
    inputs = 2 * e * h / (tsp if recipe.sp_linear_saves_shard else 1)
    q_live = q + 2 * kv if m.num_kv_heads in (0, m.num_heads) else q
    attn = e * (q_live + 2 * kv + q) / t + 4.0 * m.num_heads / t
    mlp = (4 if m.gated_mlp else 2) * e * f / t
    return tok * (norms + inputs + attn + mlp)


def megatron_moe_applies(plan: PlanInput, recipe: Recipe) -> bool:
    """Whether `_megatron_moe_layer` counts this plan's layer: a Megatron-Core recipe
    (recipe.activations 'korthikanti') on a dropless top-k-softmax MoE without shared experts
    or MLA (Qwen3-MoE, Mixtral); DeepSeek-style layers keep the general MoE model."""
    m = plan.model
    return (
        recipe.activations == "korthikanti"
        and m.is_moe
        and not m.is_mla
        and not m.num_shared_experts
        and not m.num_dense_layers
        and m.router_scoring == "topk_softmax"
        and not m.moe_capacity_factor
    )


def _megatron_moe_layer(plan: PlanInput, recipe: Recipe, ac: str) -> float:
    """One Megatron-Core MoE transformer layer's saved bytes per micro-batch (Transformer Engine
    layers, the alltoall / flex dispatcher with moe_permute_fusion, TEGroupedMLP with
    moe_grouped_gemm and the fused weighted SwiGLU), per saved tensor, T = s*b/cp tokens of
    this rank, e = element bytes, g = 1 byte under fp8 (`Recipe.te_fp8_gemm_inputs`) else e:
      attention: the QKV LayerNormLinear's input e*h + fp32 rstd 4 and its GEMM input g*h (the
        norm's output); Qwen3's q / k RMSNorms (model.qk_norm) their inputs e*(q + kv) + an
        fp32 rstd per head 4*(a + a_kv); the fused attention's q, k, v and output
        e*(2q + 2kv) + its fp32 softmax statistics 4a; the output projection's GEMM input
        g*q (TE's fp8 Linear: the fp8 copy; in 16 bits the output tensor itself, counted);
      MoE: the pre-MLP RMSNorm's input e*h + 4; the router's gating linear input e*h
        (megatron/core/transformer/moe/moe_utils.py RouterGatingLinearFunction saves inp,
        weight); under moe_router_fusion Transformer Engine's fused top-k and aux-loss
        score functions each save an fp32 (T, E) intermediate and the top-k its bool routing
        map, 9E (TransformerEngine transformer_engine/pytorch/router.py
        FusedTopkScoreFunction, FusedComputeScoresForMoEAuxLoss; csrc/extensions/router.cpp:
        kFloat); the fused permute saves only its int32 row_id_map (T, 2E + 1), 4*(2E + 1),
        which the unpermute reuses (transformer_engine/pytorch/permutation.py
        _moe_permute_mask_map_setup_context / _moe_unpermute_mask_map_setup_context without
        merging probs: the probs are applied inside the experts), the chunk sorts an int32
        map per row each, 2 x 4k; the k routed rows per token run by this rank (balanced
        routing: the Megatron-Bridge performance configs set moe_router_force_load_balancing),
        per row: fc1's GEMM input g*h (GroupedLinear keeps the column-wise fp8 copy only,
        module/grouped_linear.py `update_usage(rowwise_usage=False, columnwise_usage=True)`),
        the weighted SwiGLU's input e*2f/t_e and its fp32 prob 4 (megatron/core/fusions/
        fused_bias_swiglu.py WeightedSwiGLUFunction saves input, weights), fc2's GEMM input
        g*f/t_e; t_e = `config.layout.expert_tp` (the rows gathered over it, f split by it).
      SP divides the sequence terms by t (the MoE's input is the sequence shard); full
      recompute keeps the layer input e*h (/t with SP), as `_korthikanti`.
    Counts the per-token tensors the backward reads. Ignores: fp8 scale tensors (MXFP8: 1/32
    of a GEMM input), the fp8 padding split sizes, the a2a split metadata, RoPE's freqs (a
    buffer), the residual adds (save nothing); the dispatcher's receive buffers and the
    expert outputs live only inside the layer's forward (not saved)."""
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    g = 1 if plan.precision == "fp8" and recipe.te_fp8_gemm_inputs else e
    h, a, q, kv, f = m.dim, m.num_heads, m.q_dim, m.kv_dim, m.ffn_dim
    E, k = m.num_experts, m.experts_per_token
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    sp = L.sp or recipe.sp_with_tp
    tsp = L.tp if sp else 1
    if ac == "full":
        return e * tok * h / tsp
    te = expert_tp(L.tp, L.ep)
    kv_heads = m.num_kv_heads or a
    rep = (e * h + 4.0) + g * h + (e * h + 4.0)  # QKV norm + its GEMM input; pre-MLP norm
    split = float(e * (2 * q + 2 * kv) + 4 * a + g * q)
    if m.qk_norm:
        split += e * (q + kv) + 4.0 * (a + kv_heads)
    router = e * h + 9.0 * E + 4.0 * (2 * E + 1) + 2 * 4.0 * k
    rows = k * te  # routed rows per token of this rank's sequence shard
    experts = rows * (g * h + (2 * e * f + g * f) / te + 4.0)
    return tok * ((rep + router + experts) / tsp + split / L.tp)


def recipe_layer_bytes(plan: PlanInput, recipe: Recipe, ac: str | None = None) -> float:
    """Stored activation bytes of one layer per micro-batch under `recipe` (ac = plan.ac)."""
    ac = plan.ac if ac is None else ac
    L = plan.layout
    if recipe.activations == "korthikanti" and not plan.model.is_moe:
        return _korthikanti(plan, recipe, ac)
    if megatron_moe_applies(plan, recipe):
        return _megatron_moe_layer(plan, recipe, ac)
    if recipe.activations == "nanotron" and not plan.model.is_moe:
        return _nanotron_layer(plan, recipe, ac)
    if ac == "selective" and recipe.selective == "torchtitan_op" and not plan.model.is_moe:
        return _torchtitan_op_sac(plan)
    # SDPA Llama with a 16-bit residual stream (the modern model of
    # memory.activations.layer_activation_bytes; MoE models under every foreign recipe too)
    model = plan.model
    if recipe.sdpa_kv_expanded:
        # K and V expanded to the query heads before SDPA (Recipe.sdpa_kv_expanded): the core
        # saves them at the query heads
        model = dataclasses.replace(model, num_kv_heads=model.num_heads)
    if recipe.attention == "naive" and model.attention != "naive":
        model = dataclasses.replace(model, attention="naive")
    sp = L.sp or recipe.sp_with_tp
    out = layer_activation_bytes(
        model,
        seq_len=plan.seq_len,
        micro_batch=plan.micro_batch,
        tp=L.tp,
        sp=sp,
        cp=L.cp,
        ac=ac,
        precision=plan.precision,
        modern=True,
        compile=plan.compile,
        residual_fp32=False,
        ep=L.ep,
        naive_probs_only=True,  # a fused 16-bit softmax: no fp32 S x S copy is kept
        # an eager RMSNorm on x.float() saves the fp32 upcast beside the cast-back output
        # (torchtitan/models/llama3/model.py RMSNorm: self._norm(x.float()).type_as(x) *
        # self.weight); a fused kernel saves its 16-bit input and rstd (torchtitan
        # models/norms.py TritonFusedRMSNorm.forward: save_for_backward(x, weight, rstd))
        # or the recipe's framework has only a fused norm (Recipe.fused_rmsnorm)
        rmsnorm_upcast=not (plan.fused_norm or recipe.fused_rmsnorm),
    )
    return out


def recipe_head_bytes(plan: PlanInput, recipe: Recipe) -> tuple[float, float]:
    """(stored, loss-backward temporaries) of the last stage per micro-batch, T = s*b/cp tokens,
    V_l = V/tp vocabulary rows on this rank:
    stored: the final norm's input e*T*h (/t with SP; an eager fp32-upcast RMSNorm keeps its
      fp32 upcast and 16-bit output instead, 4*T*h more) and the head's input e*T*h, plus
      'vocab_parallel_fp32': the fp32 logits the loss softmaxes in place and saves, 4*T*V_l;
      'materialized_fp32': log-softmax's fp32 output 4*T*V_l (the 16-bit logits and their
        fp32 upcast are freed before backward);
    temporaries at the loss backward:
      'vocab_parallel_fp32': the 16-bit logits gradient 2*T*V_l (the fp32 gradient is computed
        in place in the saved softmax);
      'materialized_fp32': nll_loss's fp32 gradient and log-softmax's fp32 input gradient,
        8*T*V_l, alive together with the saved output.
    Under tensor parallelism a 'materialized_fp32' loss with sp_with_tp is torchtitan's
    loss_parallel: its forward holds (e + 12)*T*V_l at once, (e + 8)*T*V_l beyond the saved
    output, and its fused nll_loss + log-softmax backward 16*T*V_l at once, 12*T*V_l beyond
    the saved output (torch/distributed/tensor/parallel/loss.py _log_softmax and
    _nll_loss_and_log_softmax_backward); the larger replaces the backward's 8*T*V_l.
    A compiled 'materialized_fp32' loss (recipe.loss_compiles under compile, or
    plan.compile_loss) keeps the 16-bit logits 2*T*V_l (and 8 B of per-token fp32 statistics)
    instead of the fp32 log-softmax, and its backward writes the 16-bit gradient 2*T*V_l from
    one fused kernel (saved tensors measured with torch 2.13, Recipe.sources['loss_compiles']).
    'chunked_fp32' (torchtune): the same saved fp32 log-softmax, with temporaries of one chunk
    of the k = Recipe.loss_chunks (and the 16-bit chunks at the loss forward); a run stating
    the unchunked loss (PlanInput.chunked_loss False) is 'materialized_fp32' over logits the
    model already upcast. A run stating a chunked loss (PlanInput.chunked_loss True) over a
    recipe with one (Recipe.chunked_loss_tokens, torchtitan's ChunkedLossWrapper) stores only
    the final norm's tensors: its head and loss run forward and backward inside the loss call
    (temporaries: `_chunked_wrapper_temp`). Under a recipe's LoRA (Recipe.lora) a frozen
    head saves no input and the frozen final norm only its fp32 upcast and rstd."""
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    tsp = L.tp if (L.sp or recipe.sp_with_tp) else 1
    v_l = m.vocab_size / L.tp
    # the head's saved input: its sequence shard under Recipe.sp_linear_saves_shard
    head_in = e * tok * m.dim / (tsp if recipe.sp_linear_saves_shard else 1)
    stored = e * tok * m.dim / tsp + head_in + 4.0 * tok * v_l
    if (
        recipe.activations == "sdpa_bf16"
        and m.norm == "rmsnorm"
        and not (plan.fused_norm or recipe.fused_rmsnorm)
    ):
        # the final norm is the blocks' eager RMSNorm (torchtitan/models/norms.py at 9dec370
        # RMSNorm.forward: self._norm(x.float()).type_as(x) * self.weight; apply_compile
        # compiles the blocks only): pow and mul save the fp32 upcast, the weight's mul the
        # 16-bit output, not the 16-bit input counted above: 4 B more per element (the
        # per-layer model's rmsnorm_upcast, recipe_layer_bytes)
        stored += 4.0 * tok * m.dim / tsp
    loss = recipe.loss
    if plan.chunked_loss and recipe.chunked_loss_tokens > 0 and loss == "materialized_fp32":
        return stored - head_in - 4.0 * tok * v_l, _chunked_wrapper_temp(plan, recipe)
    temp = (2.0 if e == 2 else 0.0) * tok * v_l
    if loss == "chunked_fp32" and plan.chunked_loss is False:
        # the run's unchunked loss (PlanInput.chunked_loss): torchtune's TransformerDecoder
        # .forward upcasts the whole logits (self.output(h).float()) for torch's
        # CrossEntropyLoss, i.e. F.cross_entropy(logits.float())
        loss = "materialized_fp32"
    if loss == "materialized_fp32":
        temp = 8.0 * tok * v_l
        compiled = (
            plan.compile and recipe.loss_compiles
            if plan.compile_loss is None
            else plan.compile_loss
        )
        if compiled and loss != recipe.loss:
            # torchtune's compiled loss over logits the model already upcast: the graph
            # saves its fp32 input and per-token statistics, its backward writes the fp32
            # gradient, cast back to 16 bits beside it (ToCopyBackward of the .float())
            stored += 8.0 * tok
            temp = (4.0 + e) * tok * v_l
        elif compiled:
            stored += (e - 4.0) * tok * v_l + 8.0 * tok
            temp = e * tok * v_l
        elif L.tp > 1 and recipe.sp_with_tp:
            # loss_parallel (torchtitan's TP plan): DTensor's vocab-parallel log-softmax
            # (torch/distributed/tensor/parallel/loss.py _log_softmax) holds its fp32 input,
            # x - max and exp(x - max) together, beside the 16-bit logits the train step still
            # references: e + 4 + 4 + 4 B per logit at the loss forward, i.e. 10 B beyond the
            # saved output when e = 2. Its backward is not nll_loss's and log_softmax's: the
            # same file's _nll_loss_and_log_softmax_backward (the nll_loss_backward handler;
            # _log_softmax_backward_handler computes nothing) builds grad_input =
            # zeros_like(x) from the saved fp32 output x, then torch.exp(x) and their sum, all
            # fp32 and alive together at the add (then the sum and its product with
            # grad_output, grad_input still referenced): 12 B per logit beyond the saved
            # output. The 16-bit logits are gone by then (train.py: 'del pred' before
            # backward), and the fp32 -> bf16 cast's backward (6 B) comes after.
            temp = max(temp, (e + 8.0) * tok * v_l, 12.0 * tok * v_l)
    elif loss == "chunked_fp32":
        # torchtune's CEWithChunkedOutputLoss (torchtune/modules/loss/ce_chunked_output_loss.py
        # forward / compute_cross_entropy; TransformerDecoder.chunked_output): the head writes
        # k 16-bit chunks of the logits along the sequence, each is upcast and
        # cross-entropied on its own, every chunk's fp32 log-softmax saved for backward (the
        # 4*T*V_l above); the 16-bit chunks stay referenced until the recipe's `del logits`
        # after the loss, beside one chunk's fp32 upcast (the forward's e*T*V_l + 4*T*V_l/k);
        # the backward runs chunk by chunk: nll_loss's and log-softmax's fp32 gradients and
        # their 16-bit cast of one chunk, (8 + e)*T*V_l/k. Compiled (training.compile_loss
        # compiles compute_cross_entropy, the upcast and the loss of one chunk): each chunk's
        # graph saves its 16-bit input and per-token fp32 statistics (the measured
        # 'loss_compiles' model above) and its backward writes one chunk's 16-bit gradient.
        k = max(1, recipe.loss_chunks)
        compiled = (
            plan.compile and recipe.loss_compiles
            if plan.compile_loss is None
            else plan.compile_loss
        )
        if compiled:
            stored += (e - 4.0) * tok * v_l + 8.0 * tok
            temp = e * tok * v_l / k
        else:
            temp = max(e * tok * v_l + 4.0 * tok * v_l / k, (8.0 + e) * tok * v_l / k)
    if recipe.lora and plan.lora is not None:
        # a frozen head (no adapter on the output projection) saves no input, and a frozen
        # final norm scale no normalized output: of the final norm only its fp32 upcast (the
        # 4*T*h above) and the per-token rstd stay (torchtune/modules/rms_norm.py
        # RMSNorm.forward; recipes.lora)
        stored -= e * tok * m.dim / tsp + head_in - 4.0 * tok
    if recipe.loss_casts_logits and recipe.loss == "vocab_parallel_fp32":
        # Nanotron: a separate block casts the 16-bit logits to fp32 and the vocab-parallel
        # loss subtracts the max out of place into the tensor it softmaxes and saves, so at the
        # loss forward the 16-bit logits, their fp32 cast and the saved softmax coexist:
        # (e + 4) B per logit beyond the saved 4 B (Recipe.sources['loss_casts_logits'])
        temp = max(temp, (e + 4.0) * tok * v_l)
    return stored, temp


def _chunked_wrapper_temp(plan: PlanInput, recipe: Recipe) -> float:
    """Bytes torchtitan's chunked head + loss holds at the loss call beyond the stored
    activations (ChunkedLossWrapper.__call__, torchtitan/components/loss.py at 94609ad), with
    T = s*b/cp tokens of this rank, h the model width, V_l = V/tp and c = min(T, chunk)
    tokens per chunk (Recipe.chunked_loss_tokens, PlanInput.loss_chunk_tokens if > 0).

    Counts:
    - the hidden states the chunks are views of, e*T*h: the final norm all-gathers the TP
      sequence shard back to replicated hidden states before the head
      (torchtitan/models/common/decoder_sharding.py pre_lm_head_norm_config), so h is not
      divided by tp even with SP; they are freed after the call (trainer.py
      _forward_backward_body: `del pred` before loss.backward());
    - the fp32 GradAccumulator of their gradient, 4*T*h (zeros_like(hidden, dtype=float32)),
      alive through the loop and at its end beside the 16-bit cast that
      _DecoderOutputGradientBackProp saves for the decoder's backward, e*T*h;
    - one chunk at a time: the chunk's loss runs forward and backward inside the loop
      (chunk_loss.backward()), its 16-bit logits e*c*V_l still referenced by the loop variable.
      Eager under TP (_LossParallelCrossEntropy): the backward's zeros_like, exp and their sum
      beside the saved fp32 log-probs, 16 B per logit (the forward's upcast, shifted logits
      and exp are 12); without TP, F.cross_entropy(pred.float()): the saved fp32 log-softmax
      and the nll_loss / log-softmax fp32 gradients, 12 B. Compiled (the loss, not the head,
      under compile.components 'loss': BaseLoss._maybe_compile): the measured compiled-loss
      model (Recipe.sources['loss_compiles']), the 16-bit logits and their 16-bit gradient
      plus 8 B per token.
    Ignores the chunk's hidden-state gradient (e*c*h) and the head's unsharded gradient that
    FSDP accumulates across chunks (set_requires_gradient_sync(False) until the last chunk):
    the parameter terms count the head unit."""
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    v_l = m.vocab_size / L.tp
    c = min(tok, float(plan.loss_chunk_tokens or recipe.chunked_loss_tokens))
    compiled = (
        plan.compile and recipe.loss_compiles if plan.compile_loss is None else plan.compile_loss
    )
    if compiled:
        chunk = 2.0 * e * c * v_l + 8.0 * c
    else:
        per_logit = 16.0 if L.tp > 1 and recipe.sp_with_tp else 12.0
        chunk = (e + per_logit) * c * v_l
    hidden = tok * m.dim
    return (e + 4.0) * hidden + max(chunk, e * hidden)


def naive_attention_backward_temp(plan: PlanInput, recipe: Recipe) -> float:
    """Bytes a Megatron-style unfused attention core adds on top of its stored tensors while
    one layer runs backward (0 for flash/SDPA cores or other activation models): one e*a*s^2*b/t
    gradient beyond the stored set. The bmm with V writes the gradient of the dropped-out
    probabilities while its saved input (the dropout output) is held; autograd then releases
    that node's saved tensors (torch/csrc/autograd/engine.cpp evaluate_function:
    fn.release_variables() when the graph is not retained), so dropout's out-of-place backward
    writes its gradient in the freed dropout output's place, and the fused scale-mask-softmax
    backward works in place on it (Megatron-LM / Megatron-DeepSpeed
    megatron/model/transformer.py ParallelAttention.forward: baddbmm -> FusedScaleMaskSoftmax
    -> attention_dropout -> bmm; fused_softmax.py ScaledUpperTriangMaskedSoftmax.backward).
    Under ac='selective' the core is recomputed first, so its stored 5as^2b/t come back too."""
    m, L = plan.model, plan.layout
    naive = m.attention == "naive" or recipe.attention == "naive"
    if not naive or recipe.activations != "korthikanti" or m.is_moe:
        return 0.0
    e = plan.compute_bytes
    masks = 1.0 if (recipe.dropout_masks and m.norm == "layernorm") else 0.0
    per_score = float(m.num_heads) * plan.seq_len * (plan.seq_len / L.cp) * plan.micro_batch / L.tp
    temp = e * per_score
    if plan.ac == "selective":
        temp += (2 * e + masks) * per_score
    return temp
