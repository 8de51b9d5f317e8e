"""Memory of one rank under a framework recipe (registry.py), and the layouts a recipe refuses.

The `scaletrain` recipe is the planner's own model (`planner.memory.rank.worst_rank`, exact against
the dry-run) and never comes here. A foreign recipe is composed from the planner's shared pieces:
the pipeline split and in-flight micro-batches (`recipes.stages.recipe_stages`,
`time.pipeline.inflight_microbatches`), the per-layer activation models of
`planner.memory.activations`
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
  end of a micro-batch's backward (recipes whose 16-bit .grad lives until then, Nanotron) =
    states + buffers + that .grad + the other in-flight micro-batches' activations;
  total = max(all) + CUDA context; reserved = total + fragmentation x (total - context);
  DeepSpeed 0.4's ZeRO-1 (Recipe.zero1_flat_buffers) adds its reduction phase (states + the
    bucket copies) to the max and the new segments its post-backward copies cost to the
    reservation (recipes.zero1_flats).
  DeepSpeed's ZeRO-1/2 optimizer step (Recipe.zero_step_check_copies; not BF16_Optimizer, not
    ZeRO-3, no optimizer offload) copies its largest gradient slice to fp32 (overflow check)
    and fp64 (norm), one slice at a time, then flattens the partition and casts it to fp32:
    what no block the backward freed can hold is new segments on top of the forward/backward's
    reservation (recipes.zero1_flats.step_check_copies, step_segments).
DeepSpeed's BF16_Optimizer (`bf16_optimizer_runs`: Recipe.bf16_optimizer, bf16 at ZeRO-1):
  gradients = the bf16 .grad of every parameter + an unsharded fp32 accumulation buffer
    (4 B x the rank's parameters, on every dp rank); the step's temporaries = the gradient
    all-reduce's bf16 cast of that buffer (2 B x params) instead of ZeRO's fp32 partition copy;
    no ZeRO ipg bucket. Read at microsoft/DeepSpeed 15293139f (2022-02-28, an ancestor of
    ab61edb02, the olruwase/bf16-updates commit BigScience's chronicles-prequel.md names; the
    branch was merged as 56c522386, #1801) and at the default branch today (38327e07f):
    deepspeed/runtime/bf16_optimizer.py BF16_Optimizer.__init__
    (fp32_groups_gradients_flat = torch.zeros_like(bf16_groups_flat[i], dtype=float32) for the
    whole flat group; fp32_groups_gradient_flat_partition, the dp partition Adam steps on, is a
    narrow() of it; fp32_groups_flat_partition, the fp32 master, is the partition only) and
    update_hp_grads (hp_grad.add_(lp.grad.to(float32)); clear_lp_grads=False keeps lp.grad);
    runtime/pipe/engine.py _exec_backward_pass (clear_lp_grads() before, update_hp_grads(
    clear_lp_grads=False) after each backward) and _exec_reduce_grads -> _bf16_reduce_grads ->
    runtime/engine.py buffered_allreduce_fallback(get_grads_for_reduction(), 5e8) ->
    allreduce_no_retain -> allreduce_bucket: tensor.to(communication_data_type), bf16 under
    bf16 (engine.py communication_data_type), for the whole flat group (one tensor over 5e8
    elements is its own bucket). BigScience's tr11 README ('Deepspeed config': ZERO_STAGE=0,
    'BF16_Optimizer implements its own ZeRO Stage 1'; 'It doesn't shard the static fp32
    buffer it reuses, which consumes 4 bytes * params of additional memory') and
    chronicles-prequel.md 'Rebalancing layers' say the same. Not counted: update_hp_grads'
    fp32 cast of one parameter's .grad at a time (4 B x the largest parameter, at the end of
    each backward, while the other in-flight micro-batches keep their activations).
LoRA / QLoRA (Recipe.lora, a plan with adapters, one pipeline stage): the states, FSDP2 units in
flight, activations and dequantization temporaries are recipes.lora's; the head and loss as above.
Ignores: gradients filling during the first micro-batch's backward (the whole gradient buffer
is counted from the start: Megatron and Nanotron allocate it up front), NCCL's internal
buffers beyond the context term, per-op temporaries inside a layer (< 1 layer's activations).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import (
    ConfigError,
    Layout,
    offload_states,
    offloads_activations,
)
from scaletrain.config.choices import FsdpEnds, literal_names

from ..memory.states import OPTIMIZER_BYTES
from ..time.pipeline import inflight_microbatches
from ..types import MemoryBreakdown, PlanInput
from .activations import naive_attention_backward_temp, recipe_head_bytes, recipe_layer_bytes
from .dist_optim import stated_optimizer
from .lora import recipe_lora, recipe_optimizer_bytes
from .registry import RECIPES, recipe_named
from .schema import Recipe
from .stages import recipe_stage_layers, recipe_stages
from .zero1_flats import step_check_copies, step_segments, zero1_flats

__all__ = [
    "bf16_optimizer_runs",
    "lora_refusals",
    "recipe_problems",
    "recipe_rank_memory",
    "recipe_worst_rank",
    "recipe_stage_layers",
]


def recipe_problems(
    recipe: Recipe | str,
    layout: Layout,
    *,
    ac: str = "none",
    offload: str = "none",
    lora: int = 0,
) -> list[ConfigError]:
    """What `recipe`'s framework cannot run, each with the reason (empty: it runs the layout).
    Composed on top of `config.layout_problems` (the rules of the model and the batch): a
    foreign recipe refuses only what its framework cannot do (sources in `Recipe.sources`).
    `lora`: the rank of the plan's adapters over a frozen base (`PlanInput.lora_rank`; 0: none);
    a recipe without `Recipe.lora` refuses them rather than plan every parameter as trained."""
    r = recipe_named(recipe) if isinstance(recipe, str) else recipe
    if r.name == "scaletrain":
        return []  # scaletrain's own rules are config.layout_problems / option_problems
    L, out = layout, lora_refusals(r, layout, lora)
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
    if L.pp > 1 and not r.pp_schedules:
        refuse(
            "parallel.pp", L.pp, f"{fw} has no pipeline parallelism{why('pp_schedules')}: set pp=1"
        )
    elif L.pp > 1 and L.pp_schedule not in r.pp_schedules:
        refuse(
            "parallel.pp_schedule",
            L.pp_schedule,
            f"{fw} has the schedules {', '.join(r.pp_schedules)}{why('pp_schedules')}",
        )
    if L.tp > 1 and not r.tp_available:
        refuse(
            "parallel.tp", L.tp, f"{fw} has no tensor parallelism{why('pp_schedules')}: set tp=1"
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
    if offloads_activations(offload):
        refuse(
            "memory.offload",
            offload,
            f"activation offload is modelled for scaletrain's own trainer only, not {fw}'s: "
            "use --recipe scaletrain or an offload without activations",
        )
    if offload == "params" and L.zero < 3:
        refuse(
            "memory.offload", offload, "parameter offload shards parameters: set parallel.zero=3"
        )
    return out


def lora_refusals(recipe: Recipe, layout: Layout, lora: int) -> list[ConfigError]:
    """Why `recipe` cannot plan adapters of rank `lora` (0: none) on `layout`: a recipe
    without `Recipe.lora` plans full training only; a LoRA recipe's terms (recipes.lora) are
    one pipeline stage without tensor or context parallelism (torchtune and PEFT under the HF
    Trainer run none of them; AutoModel's LoRA path is planned the same)."""
    r, L = recipe, layout
    if not lora or r.name == "scaletrain":
        return []
    if not r.lora:
        fix = (
            f"the {r.name} recipe plans full training only ({r.framework}: no LoRA model "
            f"here); use --recipe {_or(_lora_recipes())} for adapters, or set "
            "lora.rank 0 to plan full training"
        )
        return [ConfigError("lora.rank", lora, fix)]
    out = []
    for axis, degree in (("tp", L.tp), ("pp", L.pp), ("cp", L.cp)):
        if degree > 1:
            fix = f"the {r.name} recipe plans LoRA without {axis} (recipes.lora): set {axis}=1"
            out.append(ConfigError(f"parallel.{axis}", degree, fix))
    return out


def _or(names: list[str]) -> str:
    """'a, b or c'."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def _lora_recipes() -> list[str]:
    """The recipes that plan a LoRA run (`Recipe.lora`), scaletrain's own first."""
    return ["scaletrain"] + [n for n, r in RECIPES.items() if r.lora]


@dataclass(kw_only=True, slots=True, frozen=True)
class RecipeRankParams:
    """Parameters of a pipeline rank under a foreign recipe (`recipe_rank_params`)."""

    params: float
    """Everything the rank holds."""
    block: float
    """One block's parameters."""
    root: float
    """What is not a block: embedding + positions and/or final norm + head."""
    head: float
    """The head alone (the embedding when tied and pp = 1)."""
    expert: float = 0.0
    """Of `params`: the routed experts the rank holds after EP (and TP) division."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RecipeStates:
    """Model-state bytes of a rank under a foreign recipe (`recipe_states`)."""

    weights: float
    master: float
    """The fp32 master copy (recipes that keep 16-bit weights)."""
    grads: float
    optimizer: float
    offloaded: float
    """Bytes moved to the CPU by offload."""
    fp32_grad_accum: float = 0.0
    """Of `grads`: BF16_Optimizer's unsharded fp32 accumulation buffer (`bf16_optimizer_runs`)."""


def bf16_optimizer_runs(plan: PlanInput, recipe: Recipe) -> bool:
    """Whether `plan` runs under DeepSpeed's BF16_Optimizer (Recipe.bf16_optimizer; the module
    docstring for its terms): bf16 at ZeRO-1 without optimizer offload. DeepSpeed picks it
    for bf16 when its own ZeRO is off (Megatron-DeepSpeed's --bf16 with ZeRO stage 0 in the
    config, as BigScience ran it: the optimizer shards itself over dp, i.e. ZeRO-1) and, today,
    for bf16 at ZeRO stage 1 with an fp32 grad_accum_dtype and no offload (runtime/engine.py
    _do_optimizer_sanity_check, at 38327e07f). Not counted: a plan at ZeRO-0 (DeepSpeed
    would still shard the master and Adam states over dp under BF16_Optimizer) and today's
    bf16 ZeRO-1 with the default grad_accum_dtype (bf16, DeepSpeedZeroOptimizer instead):
    the planner's layout has no gradient-accumulation dtype and takes BF16_Optimizer."""
    return (
        recipe.bf16_optimizer
        and plan.precision == "bf16"
        and plan.layout.zero == 1
        and offload_states(plan.offload) == "none"
    )


def recipe_rank_params(plan: PlanInput, first: bool, last: bool, layers: int) -> RecipeRankParams:
    """The parameters of a pipeline rank under a foreign recipe, after TP/EP division."""
    m, L = plan.model, plan.layout
    pc = m.param_counts()
    dense_mlp = 0 if m.is_moe else pc.mlp
    block = (pc.attention + dense_mlp) / L.tp + pc.norms + pc.router
    expert = pc.mlp / (L.tp * L.ep) if m.is_moe else 0.0
    block += expert
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
    return RecipeRankParams(
        params=params, block=block, root=root, head=head, expert=layers * expert
    )


def _largest_module(plan: PlanInput) -> float:
    """Parameters of the largest single module per tp rank: the fused QKV projection
    h x (h + 2kv), the MLP input projection h x f (2f for a fused SwiGLU gate/up), or the
    embedding V x h (Megatron-style fused linears)."""
    m, t = plan.model, plan.layout.tp
    f_in = 2 * m.ffn_dim if m.gated_mlp else m.ffn_dim
    return max(m.dim * (m.dim + 2 * m.kv_dim), m.dim * f_in, m.vocab_size * m.dim) / t


def _rank_largest_param(plan: PlanInput, rp: RecipeRankParams, first: bool, layers: int) -> float:
    """The largest single parameter of a pipeline rank per tp rank: a layer's fused QKV or MLP
    input projection (`_largest_module` without the vocabulary), the word embedding on the
    first rank, the head (or the tied embedding's copy) on the head's rank."""
    m, t = plan.model, plan.layout.tp
    f_in = 2 * m.ffn_dim if m.gated_mlp else m.ffn_dim
    layer = max(m.dim * (m.dim + 2 * m.kv_dim), m.dim * f_in) / t if layers else 0.0
    emb = m.param_counts().embedding / t if first else 0.0
    return max(layer, emb, rp.head)


def _largest_slice(
    plan: PlanInput, recipe: Recipe, rp: RecipeRankParams, first: bool, layers: int
) -> tuple[float, float]:
    """(the parameter with the largest dp slice on a pipeline rank, the parameters of its ZeRO
    group). One weight group per rank (the rank's parameters) unless Recipe.wd_group_halved:
    then the rank's weight matrices in module order (the word embedding first on the first
    rank; each layer's QKV, attention output, MLP input and output projections; the tied head
    last) are cut in two groups at count // 2 (bigscience-workshop/Megatron-DeepSpeed
    megatron/optimizer/__init__.py _get_params_for_weight_decay_optimization, 541b967f), and a
    parameter's slice is at most its group's dp partition."""
    largest = _rank_largest_param(plan, rp, first, layers)
    if not recipe.wd_group_halved:
        return largest, rp.params
    m, t = plan.model, plan.layout.tp
    f_in = 2 * m.ffn_dim if m.gated_mlp else m.ffn_dim
    layer = [m.dim * (m.dim + 2 * m.kv_dim), m.q_dim * m.dim, m.dim * f_in, m.ffn_dim * m.dim]
    emb = [m.param_counts().embedding / t] if first else []
    seq = emb + [x / t for x in layer] * layers + ([rp.head] if rp.head else [])
    if not seq:
        return largest, rp.params
    half = len(seq) // 2
    groups = (sum(seq[:half]), sum(seq[half:]))
    n = plan.layout.zero_shards
    best = max(range(len(seq)), key=lambda i: min(seq[i], groups[i >= half] / n))
    return seq[best], groups[best >= half]


def expert_state_shards(plan: PlanInput) -> int:
    """Ranks a recipe's ZeRO / FSDP shards the routed experts' states over: the dp*cp/ep ranks
    that hold the same experts (at least 1), not all zero_shards ranks, since EP already split
    the experts ep ways inside the shard group. torchtitan: apply_fsdp
    (torchtitan/models/llama4/infra/parallelize.py, which qwen3's parallelize_qwen3 reuses;
    read at pytorch/torchtitan 022f885) calls fully_shard(transformer_block.moe.experts) on the
    'dp_shard_mod_ep' mesh of dp_shard * cp / ep ranks (torchtitan/distributed/parallel_dims.py
    ParallelDims._build_mesh_with_ep), the rest of the block on the whole dp_shard * cp mesh;
    NeMo AutoModel does the same (nemo_automodel/components/moe/parallelizer.py at 36044ad:
    fully_shard(moe_module.experts, mesh=ep_shard_mesh), the experts left out of FSDP when
    that mesh has one rank). Megatron-Core (and NeMo / Megatron-Bridge on it) does the same
    with its distributed optimizer (read at NVIDIA/Megatron-LM d98e8a6):
    megatron/core/optimizer/__init__.py get_megatron_optimizer builds the expert-parallel
    params' optimizer (_get_param_groups_and_buffers on 'expert_parallel_buffers') over
    intra_expt_dp_group, the dense params' over intra_dp_cp_group, and
    megatron/core/parallel_state.py initialize_model_parallel sizes the expert data-parallel
    group world_size // (expert_tp * ep * pp) = dp * cp / ep with expert_tp defaulting to tp
    (as recipe_rank_params splits the experts). Counts: each rank's E/ep experts sharded over
    that group, for recipes with Recipe.experts_shard_over_ep_group (the others keep every
    ZeRO rank). Ignores: EP that borrows tp ranks (dp_shard * cp * tp / ep under ETP 1, whose
    per-rank state bytes are the same), Megatron's partial distributed optimizer instances
    (num_distributed_optimizer_instances > 1) and the Shard(1) placement used when the group
    outnumbers the local experts (same bytes)."""
    L = plan.layout
    return max(1, L.zero_shards // max(1, L.ep))


def recipe_states(plan: PlanInput, recipe: Recipe, P: float, expert: float = 0.0) -> RecipeStates:
    """The model states of a rank holding `P` parameters under `recipe`, sharded by its ZeRO
    stage (optimizer offload moves the optimizer and master copy to the CPU). `expert`: the
    part of `P` that is routed experts, whose sharded states divide over `expert_state_shards`
    ranks instead of zero_shards."""
    L = plan.layout
    N: float = L.zero_shards
    if expert and L.zero and L.ep > 1 and recipe.experts_shard_over_ep_group:
        # one effective shard count: the dense part over N, the experts over N / ep
        N = P / ((P - expert) / N + expert / expert_state_shards(plan))
    fp32 = plan.precision == "fp32"
    wb, mb, gb = (
        (4.0, 0.0, 4.0) if fp32 else (recipe.weight_bytes, recipe.master_bytes, recipe.grad_bytes)
    )
    ob = recipe_optimizer_bytes(plan, recipe) if plan.optimizer in OPTIMIZER_BYTES else 8.0
    z = L.zero
    weights = wb * P / (N if z >= 3 else 1)
    master = mb * P / (N if (z >= 3 or (z >= 1 and recipe.shards_master)) else 1)
    grads = gb * P / (N if (z >= 2 or (z == 1 and not recipe.grad_buffer_full_under_zero1)) else 1)
    # BF16_Optimizer: the unsharded fp32 accumulation buffer beside the bf16 .grad (module
    # docstring; bf16_optimizer.py BF16_Optimizer.__init__ fp32_groups_gradients_flat)
    fp32_accum = 4.0 * P if bf16_optimizer_runs(plan, recipe) else 0.0
    grads += fp32_accum
    optim = ob * P / (N if z >= 1 else 1)
    offloaded = 0.0
    offload = offload_states(plan.offload)
    if offload == "optimizer":
        offloaded, optim, master = optim + master, 0.0, 0.0
    elif offload == "params" and z >= 3:
        offloaded = weights + master + grads + optim
        weights = master = grads = optim = 0.0
    return RecipeStates(
        weights=weights,
        master=master,
        grads=grads,
        optimizer=optim,
        offloaded=offloaded,
        fp32_grad_accum=fp32_accum,
    )


def fsdp_end_units(plan: PlanInput, rp: RecipeRankParams, last: bool) -> tuple[float, float]:
    """(parameters of the rank's end units an FSDP2 rank holds gathered at its backward's
    peak, parameters of an end unit reduce-scattered while every block's activations are
    stored) under ZeRO-3 with pp = 1 (`PlanInput.fsdp_ends`, `config.choices.FsdpEnds`).
    'root' / 'unstated': the root unit (embedding, final norm, head: `rp.root`) is not
    resharded after forward (FSDP2 leaves the root unsharded after its forward) and is
    reduce-scattered at the end of backward, after the blocks' activations are freed
    (torchtitan torchtitan/parallelisms/parallelize_llama.py apply_fsdp at 9dec370 and
    torchtitan/models/llama3/parallelize_llama.py apply_fsdp at 5de055e (2025-05, version
    0.0.2): fully_shard per block, then fully_shard(model)): (root, 0).
    'own_units': torchtitan from 83e6941 (2025-07-28, 'Improve reshard_after_forward logic';
    torchtitan/models/llama3/infra/parallelize.py apply_fsdp at 2c8b594 and 6fc499f):
    fully_shard(model.tok_embeddings) with the blocks' reshard_after_forward (True without
    PP), so the embedding is freed after its forward and gathered again only for block 0's
    backward, when the stored activations are gone; fully_shard([model.norm, model.output])
    with reshard_after_forward only under the 'always' policy, so the final norm and head
    stay gathered into the backward and their unit's post-backward reduce-scatters the head's
    gradient (fp32 copy-in, as a block's) right after the head's backward, every block's
    activations still stored; the root module holds no parameters: (final norm + head on the
    head's rank, the same). Ignores: a tied head (its weight is the embedding unit's; kept
    as 'root')."""
    if plan.fsdp_ends not in (literal_names(FsdpEnds) or ()):
        raise ConfigError("fsdp_ends", plan.fsdp_ends, f"use one of {literal_names(FsdpEnds)}")
    L = plan.layout
    fsdp2 = L.pp == 1 and L.zero >= 3 and L.zero_shards > 1
    if plan.fsdp_ends != "own_units" or not fsdp2 or not plan.model.param_counts().head:
        return rp.root, 0.0
    tail = plan.model.param_counts().final_norm + rp.head if last else 0.0
    return tail, tail


def _recipe_in_flight(
    plan: PlanInput,
    recipe: Recipe,
    P: float,
    block: float,
    root: float,
    head: float,
    held_root: float | None = None,
) -> tuple[float, float, dict[str, float]]:
    """(gathered parameters, unsharded gradients, the FSDP reduce-scatter buffer) in flight
    during a rank's backward under `recipe`; `held_root`: the end units' parameters an FSDP2
    rank holds gathered at that peak (`fsdp_end_units`; None: the root, `root`)."""
    pp, z, N = plan.layout.pp, plan.layout.zero, plan.layout.zero_shards
    fp32 = plan.precision == "fp32"
    wc = plan.compute_bytes
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
            ends = root if held_root is None else held_root
            in_params = wc * (block * (1 + recipe.fsdp_prefetch_units) + ends)
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
    elif L.dp > 1 and z == 0 and recipe.ddp_reducer_copy_bytes:
        # torch DDP's bucket copy beside the framework's own fp32 buffer (Nanotron)
        bufs["ddp_buckets"] = recipe.ddp_reducer_copy_bytes * P
    elif (
        recipe.ddp_bucket == "ipg"
        and z >= 1
        and not bf16_optimizer_runs(plan, recipe)
        and not (recipe.zero1_flat_buffers and z == 1)
    ):
        # the ZeRO optimizer reduces through its ipg buffer at any dp, dp = 1 included
        # (DeepSpeed stage_1_and_2.py reduce_gradients: 'with PP we must create ipg buffer');
        # DeepSpeed 0.4's stage 1 has none: its bucket copies come after the backward
        # (recipes.zero1_flats)
        bufs["reduce_bucket"] = recipe.bucket_count * recipe.bucket_bytes(L.dp)
    e = plan.compute_bytes
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    sp = L.sp or recipe.sp_with_tp
    if L.tp > 1 and sp:
        # async linears (Nanotron) keep two persistent gather buffers: MemoryBuffer
        # 'allgather' (the column linears' inputs) and 'allgather2' (the row linears'
        # output gradients in backward), each T x h (Recipe.tp_comm)
        n_gather = 2 if recipe.tp_comm == "async_linears" else 1
        bufs["tp_all_gather"] = n_gather * e * tok * plan.model.dim
    if L.pp > 1:
        bufs["pp_p2p"] = 2 * e * tok * plan.model.dim / (L.tp if sp else 1)
    if L.cp > 1 and recipe.cp_ring == "torch_allgather":
        # torch's all-gather rotater (time/cp_ring.py): the K and V of all cp ranks gathered
        # into one buffer that lives through every sub-SDPA of the block (_AllGatherRotater
        # ._aggregated_buffer), with the query's heads when the model repeats them before SDPA
        kv_dim = plan.model.q_dim if recipe.cp_kv_repeated else plan.model.kv_dim
        bufs["cp_ring"] = L.cp * 2 * e * tok * kv_dim / L.tp
    elif L.cp > 1:
        bufs["cp_ring"] = 2 * 2 * e * tok * plan.model.kv_dim / L.tp
    ctx = (
        0.0
        if plan.hardware.is_cpu
        else recipe.cuda_context_bytes
        if plan.runtime_context_bytes is None
        else plan.runtime_context_bytes
    )
    bufs["runtime_context"] = ctx
    return ctx


def torch_stage_buffers(
    plan: PlanInput, recipe: Recipe, first: bool, last: bool, inflight: float
) -> float:
    """Stage-boundary bytes a pipeline rank holds under torch.distributed.pipelining
    (Recipe.pp_stage_buffers 'torch_per_microbatch'), `inflight` micro-batches in flight (in
    units of one micro-batch through all v = pp_virtual chunks of the rank). One unit is one
    micro-batch's residual stream, e x s_l x b x h (/t with SP: the block output is the
    sequence shard). Counts, per chunk of the rank:
      - the activation receive buffers: torch/distributed/pipelining/stage.py
        PipelineStage._prepare_forward_infra allocates one per micro-batch for every stage
        but the first (`for chunk_id in range(num_microbatches)` ... `_make_tensor_from_meta`,
        kept in args_recv_info for the whole run). An in-flight micro-batch's buffer is the
        chunk's first block's saved input, already counted by the activations, so m - inflight
        per chunk here;
      - the gradient receive buffers: _PipelineStageBase._prepare_backward_infra builds
        grad_recv_info for every micro-batch (`_create_grad_recv_info` ->
        `_make_tensor_from_meta`) on every stage but the last: m per chunk;
      - the stage outputs: forward_one_chunk keeps each micro-batch's output in fwd_cache until
        backward_one_chunk pops it: inflight per chunk that sends (the last stage's output is
        the loss head's, counted with the head).
    m is the micro-batches of one schedule call (`PlanInput.pp_call_microbatches`): the stage
    sizes these for its schedule's n_microbatches (schedules.py `_initialize_stage`), which a
    run calling the schedule once per local batch (NeMo AutoModel,
    `time.pipeline.schedule_microbatches`) sets below the step's micro-batches.
    Read in copies of torch's stage.py of the 2.4 to 2.9 era (the loops are the same in each;
    torchtitan 9dec370's torch 1963fc8 lies inside it, not read itself). Approximates: the
    interleaved chunks' in-flight share is spread evenly over the rank's chunks. Ignores: the
    gradient sends' input gradients (transient), NCCL's staging."""
    L = plan.layout
    m = float(plan.pp_call_microbatches)  # the schedule call's micro-batches (n_microbatches)
    v = float(L.pp_virtual)
    unit = plan.compute_bytes * float(plan.seq_len) / L.cp * plan.micro_batch * plan.model.dim
    unit /= L.tp if (L.sp or recipe.sp_with_tp) else 1
    receivers = v - (1.0 if first else 0.0)
    senders = v - (1.0 if last else 0.0)
    per_chunk = inflight  # in-flight micro-batches of each chunk (chunk-activations / v)
    return unit * (receivers * max(0.0, m - per_chunk) + senders * (m + per_chunk))


def recipe_rank_memory(plan: PlanInput, recipe: Recipe, rank: int) -> MemoryBreakdown:
    """Memory of pipeline rank `rank` under `recipe` (see the module docstring)."""
    L = plan.layout
    m = max(1, plan.grad_accum)
    pp = L.pp
    split = recipe_stages(plan, recipe)
    first, last = rank == 0, rank == split.head_rank
    layers = split.layers[rank]
    rp = recipe_rank_params(plan, first, last, layers)
    P, block, root, head = rp.params, rp.block, rp.root, rp.head
    N, z = L.zero_shards, L.zero
    fp32 = plan.precision == "fp32"
    held = recipe_states(plan, recipe, P, rp.expert)
    weights, master, grads, optim = held.weights, held.master, held.grads, held.optimizer
    offloaded = held.offloaded
    emb_fp32 = 0.0
    if recipe.fp32_embedding_grads and first and not fp32:
        # the embedding's gradient buckets are fp32 whatever the others' (recipes.dist_optim)
        pc = plan.model.param_counts()
        emb_fp32 = max(0.0, 4.0 - recipe.grad_bytes) * (pc.embedding / L.tp + pc.position)
        grads += emb_fp32
    held_root, tail_rs = fsdp_end_units(plan, rp, last)
    in_params, in_grads, bufs = _recipe_in_flight(plan, recipe, P, block, root, head, held_root)
    ctx = _recipe_buffers(plan, recipe, P, bufs)
    e = plan.compute_bytes
    tok = float(plan.seq_len) / L.cp * plan.micro_batch
    per_layer = recipe_layer_bytes(plan, recipe)
    # in flight within one schedule call (PlanInput.pp_call_microbatches): each call drains
    mc = plan.pp_call_microbatches
    inflight = 1.0 if pp == 1 else inflight_microbatches(L.pp_schedule, pp, mc, rank, L.pp_virtual)
    if pp > 1 and recipe.pp_stage_buffers == "torch_per_microbatch":
        bufs["pp_p2p"] = torch_stage_buffers(plan, recipe, first, last, inflight)
    acts = inflight * layers * per_layer
    recompute = recipe_layer_bytes(plan, recipe, "none") if plan.ac == "full" and layers else 0.0
    if layers:
        recompute += naive_attention_backward_temp(plan, recipe)
    head_stored = loss_tmp = head_freed = 0.0
    fp32_accum = held.fp32_grad_accum
    lora = recipe.lora and plan.lora is not None  # pp 1, tp 1: lora_refusals
    if lora:
        # a frozen base with adapters (Recipe.lora, recipes.lora): its states, units in flight,
        # saved activations and dequantization temporaries replace the full-training ones
        lo = recipe_lora(plan, recipe, P, root)
        weights, master, optim = lo.weights, lo.master, lo.optimizer
        # BF16_Optimizer's fp32 accumulation buffer holds what the optimizer trains: the adapters
        fp32_accum = 4.0 * lo.adapters if held.fp32_grad_accum else 0.0
        grads = lo.grads + fp32_accum
        in_params, in_grads = lo.in_params, lo.in_grads
        bufs.pop("fsdp_reduce_scatter", None)
        if lo.reduce_scatter:
            bufs["fsdp_reduce_scatter"] = lo.reduce_scatter
        if lo.dequantize:
            bufs["lora_dequantize"] = lo.dequantize
        acts, recompute, per_layer = lo.activations, lo.recompute, lo.activations / layers
        P = lo.adapters
    if last:
        head_stored, loss_tmp = recipe_head_bytes(plan, recipe)
        # what the head and loss saved for backward (the final norm's and the head's inputs,
        # the logits the loss keeps) is freed by their backward, which autograd runs before
        # any block's: a block's recompute never meets it. Not under a pipeline engine that
        # keeps the stage's output (Recipe.pipe_output_buffers): the logits the loss saves are
        # that buffer's tensor, alive until the stage's backward ends (ignores the final
        # norm's and the head's inputs, e*T*h each, freed there all the same)
        head_freed = 0.0 if recipe.pipe_output_buffers else head_stored
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
    # backward, with the head's saved tensors), a block's recompute and its fp32
    # reduce-scatter input (FSDP, after the head's saved tensors are freed)
    rs = bufs.get("fsdp_reduce_scatter", 0.0)
    # an end unit reduce-scattered among the stored activations (fsdp_end_units
    # 'own_units'): its fp32 copy-in as a block's, after the loss backward's temporaries
    tail = 4.0 * tail_rs if rs and not recipe.fsdp_prefetch_params else 0.0
    peak_acts = acts + max(recompute + rs - head_freed, loss_tmp, tail)
    fwdbwd = states + in_params + in_grads + buffers - rs + peak_acts
    if recipe.grads_set_to_none and pp == 1 and m == 1:
        # gradients freed after every step (Recipe.grads_set_to_none): the backward's start
        # holds every activation and the loss temporaries but no gradient; its end every
        # gradient and the first block's activations (the block recomputing, its
        # reduce-scatter input); the memory in between moves linearly from one to the other
        # block by block, so the larger end is the peak
        base = states - grads + in_params + in_grads + buffers - rs
        first_block = per_layer if layers else 0.0
        fwdbwd = max(base + peak_acts, base + grads + first_block + recompute + rs)
    step_tmp = 4.0 * P / (N if z >= 1 else 1) if recipe.step_grad_fp32_copy and not fp32 else 0.0
    if held.fp32_grad_accum:
        # BF16_Optimizer: the fp32 partition the step reads is a view of the accumulation
        # buffer (no copy); the all-reduce before it casts the whole flat buffer to bf16
        # (engine.py allreduce_bucket; module docstring)
        step_tmp = 2.0 * P
    if recipe.grad_shard_step_bytes and z >= 1:
        # the reduce-scattered gradient shard kept apart from the buffer through the step
        # (Recipe.grad_shard_step_bytes, recipes.dist_optim)
        step_tmp += recipe.grad_shard_step_bytes * P / N
    if recipe.zero1_gather_flat_copies and z == 1 and N > 1:
        # the ZeRO-1 parameter all-gather through flattened copies (Recipe.zero1_gather_flat
        # _copies): the rank's updated shard and one flat buffer per dp rank, P weights in all
        step_tmp += (weights / P if P else 0.0) * P * (1.0 + 1.0 / N)
    checks: tuple[float, ...] = ()
    if (
        recipe.zero_step_check_copies
        and not lora  # an adapter's gradient slice is rank x width: its copies are negligible
        and z in (1, 2)
        and not bf16_optimizer_runs(plan, recipe)
        and not offloaded
    ):
        # the step's fp32 and fp64 copies of its largest gradient slice, one at a time
        # (recipes.zero1_flats.step_check_copies)
        checks = step_check_copies(plan, *_largest_slice(plan, recipe, rp, first, layers))
    # the slice checks come before the step's flat and fp32 copy, one at a time
    step = states + max([step_tmp, *checks]) + buffers - rs
    # the end of a micro-batch's backward (Recipe.param_grads_until_backward_end): the 16-bit
    # .grad of every parameter of the rank, the other in-flight micro-batches' activations
    grads_end = e * P if recipe.param_grads_until_backward_end and not fp32 else 0.0
    end_bwd = states + buffers - rs + grads_end + max(0.0, inflight - 1) * layers * per_layer
    total = max(fwdbwd, step, end_bwd if grads_end else 0.0)
    reserved = total + recipe.fragmentation * (total - ctx)
    flats = (
        zero1_flats(plan, recipe, P, last, checks) if recipe.zero1_flat_buffers and z == 1 else None
    )
    step_segs = 0.0
    if checks and flats is None:
        # copies no block the backward freed can hold are new segments on top of the
        # forward/backward's reservation (recipes.zero1_flats.step_segments)
        step_segs = step_segments(plan, recipe, P, last, checks)
        fb_reserved = fwdbwd + recipe.fragmentation * (fwdbwd - ctx)
        reserved = max(reserved, fb_reserved + step_segs)
    if flats is not None:
        # DeepSpeed 0.4's ZeRO-1 after the backward (recipes.zero1_flats): the reduction's
        # bucket copies beside the states and the pipeline's output buffers; the copies that
        # no freed activation block holds are new segments on top of the forward/backward's
        # reservation
        reduction = states + buffers - rs + head_stored + sum(flats.reduce_flats)
        base_reserved = reserved
        total = max(total, reduction)
        reserved = max(total + recipe.fragmentation * (total - ctx), base_reserved + flats.segments)
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
            "grads.fp32_accumulation": fp32_accum,
            "grads.fp32_embedding": emb_fp32,
            "optimizer.master": master,
            "offloaded.cpu": offloaded,
            "activations.per_layer": per_layer,
            "activations.in_flight": inflight,
            "activations.head": head_stored,
            "optimizer_step.temp": step_tmp,
            "grads.param_dtype_at_backward_end": grads_end,
            "allocator_reserve": reserved - total,
            "zero1.reduce_flats": sum(flats.reduce_flats) if flats else 0.0,
            "zero1.gather_flats": sum(flats.gather_flats) if flats else 0.0,
            "zero1.new_segments": flats.segments if flats else 0.0,
            "zero_step.check_copies": sum(checks),
            "zero_step.new_segments": step_segs,
            "params.count": P,
            "pipeline_rank": rank,
        },
    )


def recipe_worst_rank(plan: PlanInput) -> tuple[MemoryBreakdown, float]:
    """The worst pipeline rank's memory under `plan.recipe` (by reserved bytes) and the largest
    parameter count of any rank (what paces gradient synchronisation)."""
    recipe = stated_optimizer(plan, recipe_named(plan.recipe))
    refused = lora_refusals(recipe, plan.layout, plan.lora_rank if plan.lora else 0)
    if refused:  # never plan stated adapters as full training
        raise refused[0]
    worst: MemoryBreakdown | None = None
    max_params = 0.0
    for rank in range(plan.layout.pp):
        mem = recipe_rank_memory(plan, recipe, rank)
        if worst is None or mem.reserved > worst.reserved:
            worst = mem
        max_params = max(max_params, mem.detail["params.count"])
    assert worst is not None
    return worst, max_params
