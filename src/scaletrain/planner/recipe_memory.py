"""Memory of one rank under a framework recipe (recipes.py), and the layouts a recipe refuses.

The `scaletrain` recipe is the planner's own model (`rank_memory.worst_rank`, exact against the
dry-run) and never comes here. A foreign recipe is composed from the planner's shared pieces:
the pipeline split and in-flight micro-batches (`memory.stage_layer_counts`,
`pipeline.inflight_microbatches`), the per-layer activation models of `memory.py`
(`layer_activation_bytes` for SDPA Llamas, Korthikanti et al. 2022 for Megatron's layer), the
parameter counts of `ModelConfig.param_counts`, and the recipe's own bytes per state, loss,
buffers and allocator terms. Units: bytes, one rank. Torch-free.

Peak model (every rank that can be the worst is evaluated; the worst by reserved bytes wins):
  fwd/bwd peak = states (weights + master + grads + optimizer, sharded as the recipe shards
    them) + 16-bit copies in flight (FSDP units, autocast casts) + buffers + stored activations
    (in-flight micro-batches x layers x per-layer bytes) + on the last stage the head's inputs,
    the loss's stored logits and its backward temporaries + under full AC one layer's full set
    while it is recomputed;
  step peak = states + the step's temporaries + buffers;
  total = max(both) + CUDA context; reserved = total + fragmentation x (total - context).
Ignores: gradients filling during the first micro-batch's backward (the whole gradient buffer
is counted from the start: Megatron and Nanotron allocate it up front), NCCL's internal
buffers beyond the context term, per-op temporaries inside a layer (< 1 layer's activations).
"""

from __future__ import annotations

import dataclasses

from scaletrain.config import ConfigError, Layout

from .memory import OPTIMIZER_BYTES, layer_activation_bytes, stage_layer_counts
from .pipeline import inflight_microbatches
from .recipes import Recipe, recipe_named
from .types import MemoryBreakdown, PlanInput

__all__ = [
    "recipe_problems",
    "recipe_layer_bytes",
    "recipe_head_bytes",
    "recipe_rank_memory",
    "recipe_worst_rank",
    "recipe_stage_layers",
]


def recipe_problems(
    recipe: Recipe | str, layout: Layout, *, ac: str = "none", offload: str = "none"
) -> list[ConfigError]:
    """What `recipe`'s framework cannot run, each with the reason (empty: it runs the layout).
    Composed on top of `config.layout_problems` (the rules of the model and the batch): a
    foreign recipe refuses only what its framework cannot do (sources in `Recipe.sources`)."""
    r = recipe_named(recipe) if isinstance(recipe, str) else recipe
    if r.name == "scaletrain":
        return []  # scaletrain's own rules are config.layout_problems / option_problems
    L, out = layout, []
    fw = r.framework

    def why(key: str) -> str:
        src = r.sources.get(key, "")
        return f" ({src})" if src else ""

    def refuse(field: str, value: object, fix: str) -> None:
        out.append(ConfigError(field, value, fix))

    if L.zero not in r.zero_stages:
        refuse(
            "parallel.zero",
            L.zero,
            f"{fw} runs ZeRO stages {', '.join(map(str, r.zero_stages))}{why('zero_stages')}",
        )
    if L.pp > 1 and L.pp_schedule not in r.pp_schedules:
        refuse(
            "parallel.pp_schedule",
            L.pp_schedule,
            f"{fw} has the schedules {', '.join(r.pp_schedules)}{why('pp_schedules')}",
        )
    if L.pp > 1 and L.zero not in r.pp_with_zero:
        refuse(
            "parallel.zero",
            L.zero,
            f"{fw} runs pipeline parallelism with ZeRO stages "
            f"{', '.join(map(str, r.pp_with_zero))} only{why('pp_with_zero')}",
        )
    if L.cp > 1 and not r.cp:
        refuse("parallel.cp", L.cp, f"{fw} has no context parallelism{why('cp')}: set cp=1")
    if (
        L.zero == 0
        and L.dp > 1
        and not r.ddp_with_model_parallel
        and (L.tp > 1 or L.pp > 1 or L.cp > 1)
    ):
        refuse(
            "parallel.zero",
            0,
            f"{fw}'s DDP runs only as 1-D data parallelism"
            f"{why('ddp_with_model_parallel')}: use zero 2 or 3 (FSDP) with tp/pp/cp",
        )
    if ac not in r.ac_modes:
        refuse("memory.ac", ac, f"{fw} offers ac modes {', '.join(r.ac_modes)}{why('selective')}")
    if offload == "params" and L.zero < 3:
        refuse(
            "memory.offload", offload, "parameter offload shards parameters: set parallel.zero=3"
        )
    return out


def recipe_stage_layers(plan: PlanInput, recipe: Recipe) -> tuple[int, ...]:
    """Layers per pipeline rank: L/pp each (remainder to the first ranks) for frameworks that
    split by layer count, else scaletrain's balance (`stage_layer_counts`)."""
    L, n = plan.layout, plan.model.num_layers
    if not recipe.even_pp_split:
        return stage_layer_counts(n, L.pp, L.pp_virtual)
    stages = L.pp * L.pp_virtual
    per = [n // stages + (1 if i < n % stages else 0) for i in range(stages)]
    counts = [0] * L.pp
    for s, k in enumerate(per):
        counts[s % L.pp] += k
    return tuple(counts)


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
    """
    m, L = plan.model, plan.layout
    e = 4 if plan.precision == "fp32" else 2
    h, a, f, kv = m.dim, m.num_heads, m.ffn_dim, m.kv_dim
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    sp = L.sp or recipe.sp_with_tp
    tsp = L.tp if sp else 1
    if ac == "full":
        return e * tok * h / tsp
    masks = 1.0 if (recipe.dropout_masks and m.norm == "layernorm") else 0.0
    rep = 2 * e * h + e * h + e * h + 2 * masks * h
    mlp = (3 if m.activation == "swiglu" else 2) * e * f
    split = float(e * (h + 2 * kv) + e * h + mlp)
    if (m.attention == "naive" or recipe.attention == "naive") and ac != "selective":
        split += (2 * e + masks) * a * plan.seq_len
    else:
        split += 4.0 * a
    return tok * (rep / tsp + split / L.tp)


def _torchtitan_op_sac(plan: PlanInput) -> float:
    """torchtitan's op-level selective AC per layer per micro-batch: the block input e*h (/t
    with SP), the outputs of the 1st, 3rd, 5th and 7th matmul of a Llama block (wq h/t, wv
    kv/t, w1 f/t, w2: this rank's partial sum h, or h when tp = 1), SDPA's output e*h/t and
    fp32 log-sum-exp 4a/t, and with tp > 1 the two reduce-scatter outputs e*h/t (saved ops).
    The 2nd, 4th and 6th matmuls (wk, wo, w3) and every pointwise op are recomputed."""
    m, L = plan.model, plan.layout
    e = 4 if plan.precision == "fp32" else 2
    h, a, f, kv, t = m.dim, m.num_heads, m.ffn_dim, m.kv_dim, L.tp
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    per = e * (h / t + h / t + kv / t + h / t + f / t + h) + 4.0 * a / t
    if t > 1:
        per += 2 * e * h / t
    return tok * per


def recipe_layer_bytes(plan: PlanInput, recipe: Recipe, ac: str | None = None) -> float:
    """Stored activation bytes of one layer per micro-batch under `recipe` (ac = plan.ac)."""
    ac = plan.ac if ac is None else ac
    L = plan.layout
    if recipe.activations == "korthikanti" and not plan.model.is_moe:
        return _korthikanti(plan, recipe, ac)
    if ac == "selective" and recipe.selective == "torchtitan_op" and not plan.model.is_moe:
        return _torchtitan_op_sac(plan)
    # SDPA Llama with a 16-bit residual stream (memory.layer_activation_bytes' modern model;
    # MoE models under every foreign recipe too)
    model = plan.model
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
    )
    if plan.fused_norm and model.norm == "rmsnorm" and ac == "none":
        # a fused RMSNorm kernel saves its 16-bit input and rstd, not the fp32 upcast that
        # layer_activation_bytes counts for each of the block's two norms (torchtitan
        # models/norms.py TritonFusedRMSNorm.forward: save_for_backward(x, weight, rstd))
        out -= 2 * 4.0 * plan.seq_len / L.cp * plan.micro_batch * model.dim / (L.tp if sp else 1)
    return out


def recipe_head_bytes(plan: PlanInput, recipe: Recipe) -> tuple[float, float]:
    """(stored, loss-backward temporaries) of the last stage per micro-batch, T = s*b/cp tokens,
    V_l = V/tp vocabulary rows on this rank:
    stored: the final norm's input e*T*h (/t with SP) and the head's input e*T*h, plus
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
    output, which replaces the backward's 8*T*V_l as the loss transient when larger.
    A compiled 'materialized_fp32' loss (recipe.loss_compiles under compile, or
    plan.compile_loss) keeps the 16-bit logits 2*T*V_l (and 8 B of per-token fp32 statistics)
    instead of the fp32 log-softmax, and its backward writes the 16-bit gradient 2*T*V_l from
    one fused kernel (saved tensors measured with torch 2.13, Recipe.sources['loss_compiles'])."""
    m, L = plan.model, plan.layout
    e = 4 if plan.precision == "fp32" else 2
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    tsp = L.tp if (L.sp or recipe.sp_with_tp) else 1
    v_l = m.vocab_size / L.tp
    stored = e * tok * m.dim / tsp + e * tok * m.dim + 4.0 * tok * v_l
    temp = (2.0 if e == 2 else 0.0) * tok * v_l
    if recipe.loss == "materialized_fp32":
        temp = 8.0 * tok * v_l
        compiled = (
            plan.compile and recipe.loss_compiles
            if plan.compile_loss is None
            else plan.compile_loss
        )
        if compiled:
            stored += (e - 4.0) * tok * v_l + 8.0 * tok
            temp = e * tok * v_l
        elif L.tp > 1 and recipe.sp_with_tp:
            # loss_parallel (torchtitan's TP plan): DTensor's vocab-parallel log-softmax
            # (torch/distributed/tensor/parallel/loss.py _log_softmax) holds its fp32 input,
            # x - max and exp(x - max) together, beside the 16-bit logits the train step still
            # references: e + 4 + 4 + 4 B per logit at the loss forward, i.e. 10 B beyond the
            # saved output when e = 2, more than the backward's 8
            temp = max(temp, (e + 8.0) * tok * v_l)
    return stored, temp


def _naive_attention_backward_temp(plan: PlanInput, recipe: Recipe) -> float:
    """Bytes a Megatron-style unfused attention core adds on top of its stored tensors while
    one layer runs backward (0 for flash/SDPA cores or other activation models): the bmm with
    V returns the gradient of the dropped-out probabilities (e*a*s^2*b/t) and dropout's
    backward writes a new one (e*a*s^2*b/t) while the saved softmax, mask and dropout output
    are still held; the fused scale-mask-softmax backward then works in place
    (Megatron-LM megatron/model/transformer.py ParallelAttention.forward, fused_softmax.py
    ScaledUpperTriangMaskedSoftmax.backward; torch's dropout backward is out of place). Under
    ac='selective' the core is recomputed first, so its stored 5as^2b/t come back too."""
    m, L = plan.model, plan.layout
    naive = m.attention == "naive" or recipe.attention == "naive"
    if not naive or recipe.activations != "korthikanti" or m.is_moe:
        return 0.0
    e = 4 if plan.precision == "fp32" else 2
    masks = 1.0 if (recipe.dropout_masks and m.norm == "layernorm") else 0.0
    per_score = float(m.num_heads) * plan.seq_len * (plan.seq_len / L.cp) * plan.micro_batch / L.tp
    temp = 2 * e * per_score
    if plan.ac == "selective":
        temp += (2 * e + masks) * per_score
    return temp


def _rank_params(plan: PlanInput, first: bool, last: bool, layers: int) -> tuple[float, ...]:
    """(parameters on this rank, one block's parameters, root unit: embedding and/or final norm
    + head, the head alone) after TP/EP division."""
    m, L = plan.model, plan.layout
    pc = m.param_counts()
    dense_mlp = 0 if m.is_moe else pc.mlp
    block = (pc.attention + dense_mlp) / L.tp + pc.norms + pc.router
    if m.is_moe:
        block += pc.mlp / (L.tp * L.ep)
    params = layers * block
    root = head = 0.0
    if first:
        root += pc.embedding / L.tp + pc.position
    if last:
        head = (pc.head or (pc.embedding if L.pp > 1 else 0)) / L.tp
        root += pc.final_norm + head
        if not pc.head and L.pp == 1:
            head = pc.embedding / L.tp  # tied: the embedding is the head
    params += root
    return params, block, root, head


def _largest_module(plan: PlanInput) -> float:
    """Parameters of the largest single module per tp rank: the fused QKV projection
    h x (h + 2kv), the MLP input projection h x f (2f for a fused SwiGLU gate/up), or the
    embedding V x h (Megatron-style fused linears)."""
    m, t = plan.model, plan.layout.tp
    f_in = 2 * m.ffn_dim if m.activation == "swiglu" else m.ffn_dim
    return max(m.dim * (m.dim + 2 * m.kv_dim), m.dim * f_in, m.vocab_size * m.dim) / t


def _recipe_states(
    plan: PlanInput, recipe: Recipe, P: float
) -> tuple[float, float, float, float, float]:
    """(weights, master, grads, optimizer, offloaded to the CPU) of a rank holding `P`
    parameters under `recipe`, sharded by its ZeRO stage."""
    L = plan.layout
    N = L.zero_shards
    fp32 = plan.precision == "fp32"
    wb, mb, gb = (
        (4.0, 0.0, 4.0) if fp32 else (recipe.weight_bytes, recipe.master_bytes, recipe.grad_bytes)
    )
    ob = OPTIMIZER_BYTES.get(plan.optimizer, 8.0)
    z = L.zero
    weights = wb * P / (N if z >= 3 else 1)
    master = mb * P / (N if (z >= 3 or (z >= 1 and recipe.shards_master)) else 1)
    grads = gb * P / (N if (z >= 2 or (z == 1 and not recipe.grad_buffer_full_under_zero1)) else 1)
    optim = ob * P / (N if z >= 1 else 1)
    offloaded = 0.0
    if plan.offload == "optimizer":
        offloaded, optim, master = optim + master, 0.0, 0.0
    elif plan.offload == "params" and z >= 3:
        offloaded = weights + master + grads + optim
        weights = master = grads = optim = 0.0
    return weights, master, grads, optim, offloaded


def _recipe_in_flight(
    plan: PlanInput, recipe: Recipe, P: float, block: float, root: float, head: float
) -> tuple[float, float, dict[str, float]]:
    """(gathered parameters, unsharded gradients, the FSDP reduce-scatter buffer) in flight
    during a rank's backward under `recipe`."""
    pp, z, N = plan.layout.pp, plan.layout.zero, plan.layout.zero_shards
    fp32 = plan.precision == "fp32"
    wc = 4 if fp32 else 2
    unit = max(block, root)
    in_params = in_grads = 0.0
    bufs: dict[str, float] = {}
    if pp > 1 and z >= 2 and N > 1 and recipe.pp_fsdp_unsharded:
        # pipeline over FSDP: every unit of the stage stays unsharded from its first forward
        # to the last micro-batch's backward, and the unsharded gradients accumulate in the
        # fp32 reduce dtype (Recipe.sources['pp_fsdp_unsharded']); the unit computing holds its
        # 16-bit gradient before the upcast; the last backward reduce-scatters from an fp32
        # copy-in buffer of one unit
        in_params = wc * P
        in_grads = 4.0 * P + wc * unit
        bufs["fsdp_reduce_scatter"] = 4.0 * block
    elif z >= 3 and N > 1:
        if recipe.fsdp_prefetch_params:
            # DeepSpeed ZeRO-3 gathers per module (each Linear / the embedding, stage3.py
            # fetch_sub_module): the module computing and the prefetch bucket gathered, that
            # module's 16-bit gradient before its reduce-scatter (the 'largest layer' of
            # estimate_zero3_model_states_mem_needs: 4 B x its params)
            big = _largest_module(plan)
            in_params = wc * (big + recipe.fsdp_prefetch_params)
            in_grads = wc * big
        else:
            # FSDP2: current + prefetched unit; the root (embedding, final norm, head) is not
            # resharded after forward and its unsharded 16-bit head gradient waits for the
            # root's reduce-scatter at the end of backward; fp32 reduce-scatter input
            in_params = wc * (block * (1 + recipe.fsdp_prefetch_units) + root)
            in_grads = wc * max(block, head)
            bufs["fsdp_reduce_scatter"] = 4.0 * block
    elif z == 2 and N > 1 and recipe.name == "torchtitan":
        in_params = wc * P  # reshard_after_forward=False: every unit stays gathered
        in_grads = wc * unit
        bufs["fsdp_reduce_scatter"] = 4.0 * block
    elif recipe.autocast_weight_copy and not fp32:
        in_params = 2.0 * P  # autocast's saved 16-bit weight casts (fp32 parameters)
    return in_params, in_grads, bufs


def _recipe_buffers(plan: PlanInput, recipe: Recipe, P: float, bufs: dict[str, float]) -> float:
    """Add the gradient buckets, the TP / PP / CP communication buffers and the runtime
    context of a rank under `recipe` to `bufs` (in that order); returns the runtime context."""
    L, z, N = plan.layout, plan.layout.zero, plan.layout.zero_shards
    if (L.dp > 1 or N > 1) and recipe.ddp_bucket == "copy" and z < 2:
        bufs["ddp_buckets"] = recipe.bucket_elem_bytes * P
    elif recipe.ddp_bucket == "ipg" and z >= 1:
        # the ZeRO optimizer reduces through its ipg buffer at any dp, dp = 1 included
        # (DeepSpeed stage_1_and_2.py reduce_gradients: 'with PP we must create ipg buffer')
        bufs["reduce_bucket"] = recipe.bucket_count * recipe.bucket_bytes(L.dp)
    e = 4 if plan.precision == "fp32" else 2
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    sp = L.sp or recipe.sp_with_tp
    if L.tp > 1 and sp:
        bufs["tp_all_gather"] = e * tok * plan.model.dim
    if L.pp > 1:
        bufs["pp_p2p"] = 2 * e * tok * plan.model.dim / (L.tp if sp else 1)
    if L.cp > 1:
        bufs["cp_ring"] = 2 * 2 * e * tok * plan.model.kv_dim / L.tp
    ctx = (
        0.0
        if plan.hardware.name == "cpu"
        else recipe.cuda_context_bytes
        if plan.runtime_context_bytes is None
        else plan.runtime_context_bytes
    )
    bufs["runtime_context"] = ctx
    return ctx


def recipe_rank_memory(plan: PlanInput, recipe: Recipe, rank: int) -> MemoryBreakdown:
    """Memory of pipeline rank `rank` under `recipe` (see the module docstring)."""
    L = plan.layout
    m = max(1, plan.grad_accum)
    pp = L.pp
    first, last = rank == 0, rank == pp - 1
    layers = recipe_stage_layers(plan, recipe)[rank]
    P, block, root, head = _rank_params(plan, first, last, layers)
    N, z = L.zero_shards, L.zero
    fp32 = plan.precision == "fp32"
    weights, master, grads, optim, offloaded = _recipe_states(plan, recipe, P)
    in_params, in_grads, bufs = _recipe_in_flight(plan, recipe, P, block, root, head)
    ctx = _recipe_buffers(plan, recipe, P, bufs)
    e = 4 if fp32 else 2
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    per_layer = recipe_layer_bytes(plan, recipe)
    inflight = 1.0 if pp == 1 else inflight_microbatches(L.pp_schedule, pp, m, rank, L.pp_virtual)
    acts = inflight * layers * per_layer
    recompute = recipe_layer_bytes(plan, recipe, "none") if plan.ac == "full" and layers else 0.0
    if layers:
        recompute += _naive_attention_backward_temp(plan, recipe)
    head_stored = loss_tmp = 0.0
    if last:
        head_stored, loss_tmp = recipe_head_bytes(plan, recipe)
        # the pipeline engine's 2 output buffers (Recipe.sources['pipe_output_buffers']): under
        # Megatron-DeepSpeed's fp16 GPTModelPipe they hold fp32 logits (its last spec is
        # float16_to_fp32), the current one being the tensor the vocab-parallel loss softmaxes
        # in place and saves (counted above) and the other the previous micro-batch's, whose
        # fp32 gradient the loss backward wrote in place: 4 B x T x V_l beyond 'stored', which
        # is what 2 buffers x e (= 2 B) count
        head_stored += recipe.pipe_output_buffers * e * tok * plan.model.vocab_size / L.tp
        acts += head_stored
    states = weights + master + grads + optim
    buffers = sum(bufs.values())
    # transients that never coexist: the loss backward (last stage, before any block's
    # backward), a block's recompute and its fp32 reduce-scatter input (FSDP)
    rs = bufs.get("fsdp_reduce_scatter", 0.0)
    fwdbwd = states + in_params + in_grads + buffers - rs + acts + max(recompute + rs, loss_tmp)
    step_tmp = 4.0 * P / (N if z >= 1 else 1) if recipe.step_grad_fp32_copy and not fp32 else 0.0
    step = states + step_tmp + buffers - rs
    total = max(fwdbwd, step)
    reserved = total + recipe.fragmentation * (total - ctx)
    cap = plan.hardware.memory_bytes
    return MemoryBreakdown(
        params=weights + in_params,
        grads=grads + in_grads,
        optimizer=optim + master,
        activations=acts,
        buffers=buffers + loss_tmp,
        total=total,
        reserved=reserved,
        capacity=cap,
        fits=reserved <= cap,
        rank=rank * L.tp * L.cp * L.dp,
        buffer_terms=dict(bufs, loss_backward_temp=loss_tmp),
        detail={
            "params.in_flight": in_params,
            "grads.in_flight": in_grads,
            "optimizer.master": master,
            "offloaded.cpu": offloaded,
            "activations.per_layer": per_layer,
            "activations.in_flight": inflight,
            "activations.head": head_stored,
            "optimizer_step.temp": step_tmp,
            "allocator_reserve": reserved - total,
            "params.count": P,
            "pipeline_rank": rank,
        },
    )


def recipe_worst_rank(plan: PlanInput) -> tuple[MemoryBreakdown, float]:
    """The worst pipeline rank's memory under `plan.recipe` (by reserved bytes) and the largest
    parameter count of any rank (what paces gradient synchronisation)."""
    recipe = recipe_named(plan.recipe)
    worst: MemoryBreakdown | None = None
    max_params = 0.0
    for rank in range(plan.layout.pp):
        mem = recipe_rank_memory(plan, recipe, rank)
        if worst is None or mem.reserved > worst.reserved:
            worst = mem
        max_params = max(max_params, mem.detail["params.count"])
    assert worst is not None
    return worst, max_params
