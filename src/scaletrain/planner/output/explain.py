"""`explain(estimate)`: the arithmetic of one layout, formula by formula, numbers filled in.

Every displayed intermediate comes from the planner core's public functions or the Estimate, so
the walk-through cannot drift from what `plan` predicts.
"""

from __future__ import annotations

from scaletrain.config import GB, byte_unit, expert_split, fmt_bytes, fused_head_loss

from ..memory.states import stage_layer_counts, state_bytes_per_param
from ..recipes.dist_optim import stated_optimizer
from ..recipes.memory import bf16_optimizer_runs
from ..recipes.registry import recipe_named
from ..recipes.schema import DEFAULT_RECIPE, Recipe
from ..recipes.stages import RecipeStages, recipe_stages
from ..time.flops import (
    attention_core_flops_per_token,
    forward_flops_per_token,
    head_forward_flops_per_token,
    layer_forward_flops_per_token,
)
from ..time.pipeline import bubble_fraction, inflight_microbatches, last_stage_rank
from ..types import Estimate

__all__ = ["explain"]

_OPTIMIZER_STATES = {
    "adamw": "Adam m and v fp32",
    "sgd": "momentum fp32",
    "adamw8bit": "m and v uint8 + an fp32 absmax per 256 values each",
    "adafactor": "fp32 row and column second moments, at 1024 x 1024",
}
"""What `OPTIMIZER_BYTES` counts for each optimizer, in the words of the explain line."""

_FIRST_MOMENT = " + fp32 first moment 4 (beta1 {beta1:g})"
"""Adafactor's first moment in the explain line (`states.optimizer_bytes`)."""


def _pipeline_split(est: Estimate) -> RecipeStages:
    """The layers per pipeline rank and the head's rank that the estimate's memory and time
    used: a foreign recipe's split (`recipes.stages.recipe_stages`, e.g. Megatron's even
    L / (pp x v) per stage), else scaletrain's (`memory.states.stage_layer_counts`)."""
    p, L, m_ = est.plan, est.plan.layout, est.plan.model
    if p.recipe != DEFAULT_RECIPE:
        return recipe_stages(p, recipe_named(p.recipe))
    counts = stage_layer_counts(m_.num_layers, L.pp, L.pp_virtual, L.pp_schedule)
    return RecipeStages(layers=counts, head_rank=last_stage_rank(L))


def _parameters(est: Estimate) -> list[str]:
    """Header and section 1: the exact parameter count and the pipeline split."""
    p, L, m_, hw = est.plan, est.plan.layout, est.plan.model, est.plan.hardware
    mem = est.memory
    m = max(1, p.grad_accum)
    out: list[str] = []
    add = out.append
    pc = m_.param_counts()
    add(
        f"== {m_.name} on {p.num_gpus} x {hw.name}: dp={L.dp} zero={L.zero} tp={L.tp} "
        f"sp={L.sp} pp={L.pp} ({L.pp_schedule}, v={L.pp_virtual}) cp={L.cp} ep={L.ep}"
    )
    add(f"   world size = dp*tp*pp*cp = {L.dp}*{L.tp}*{L.pp}*{L.cp} = {L.world_size}")
    add(
        f"   batch: global {p.global_batch} seq = micro_batch {p.micro_batch} x grad_accum {m}"
        f" x dp {L.dp}; seq_len {p.seq_len} -> {p.global_batch * p.seq_len:,} tokens/step"
    )
    add("-- 1. parameters (exact count per component)")
    add(f"   embedding V*h = {m_.vocab_size}*{m_.dim} = {pc.embedding:,}")
    add(
        f"   per layer: attention {pc.attention:,} + mlp {pc.mlp:,} + router {pc.router:,} + "
        f"norms {pc.norms:,} = {pc.per_layer:,}"
    )
    add(
        f"   x {pc.num_layers} layers = {pc.num_layers * pc.per_layer:,}; head {pc.head:,}; "
        f"final norm {pc.final_norm:,}; total {pc.total:,}"
    )
    counts = _pipeline_split(est).layers
    held = mem.detail.get("params.count", 0.0)
    add(
        f"   pipeline split (layers per rank) = {counts}; worst-memory rank {mem.rank} holds "
        f"{held:,.0f} params after /tp={L.tp} (experts /{expert_split(L)}: "
        f"{'tp' if L.ep == 1 else 'ep'})"
    )
    return out


_FP8_BACKEND_LINES = {
    "torchao": "fp8 linears planned: torchao's Float8Linear (precision.fp8_backend resolved "
    "for this device, config.fp8_backend_for): 16-bit inputs saved, eager casts through two "
    "fp32 copies (memory.torchao_fp8)",
    "scaletrain": "fp8 linears planned: scaletrain's Float8Linear (precision.fp8_backend "
    "resolved for this device, config.fp8_backend_for): 1-byte inputs saved "
    "(memory.buffers.fp8_quantize_bytes)",
}
"""`explain`'s line naming the fp8 backend a plan models (`PlanInput.fp8_backend`)."""


def _states_and_activations(est: Estimate) -> list[str]:
    """Sections 2-4: model states, activations, buffers."""
    p, L, mem = est.plan, est.plan.layout, est.memory
    out: list[str] = []
    add = out.append
    unit = byte_unit(mem.reserved)  # sections 2-4 in one unit, the largest figure's

    def _mem(x: float) -> str:
        return fmt_bytes(x, digits=2, unit=unit)

    add("-- 2. model states")
    if p.recipe != DEFAULT_RECIPE:
        out += _recipe_states(est)
    else:
        pb, gbp, ob = state_bytes_per_param(p.precision, p.optimizer, beta1=p.beta1)
        states = _OPTIMIZER_STATES.get(p.optimizer, "its states")
        if ob != state_bytes_per_param(p.precision, p.optimizer)[2]:
            states += _FIRST_MOMENT.format(beta1=p.beta1)
        add(
            f"   bytes/param ({p.precision}, {p.optimizer}, scaletrain convention: fp32 master "
            f"params {pb:g} + fp32 grads {gbp:g} + optimizer {ob:.4g} ({states}))"
        )
    if p.lora_rank:
        out += _lora_lines(est)
    zs = L.zero_shards
    add(
        f"   ZeRO-{L.zero}: shards over dp_shard*cp = {zs} ranks "
        f"(stage>=1 optimizer, >=2 grads, 3 params)"
    )
    add(
        f"   params {_mem(mem.params)} (in-flight 16-bit copies "
        f"{_mem(mem.detail.get('params.in_flight', 0.0))}), grads {_mem(mem.grads)}, "
        f"optimizer {_mem(mem.optimizer)}; offloaded to CPU "
        f"{_mem(mem.detail.get('offloaded.cpu', 0.0))}"
    )
    add("-- 3. activations")
    per_layer = mem.detail.get("activations.per_layer", 0.0)
    what = "modern SDPA model"
    if p.recipe != DEFAULT_RECIPE:
        r = recipe_named(p.recipe)
        what = f"[{r.name}] {r.activations}, selective={r.selective}"
    add(
        f"   per layer per micro-batch ({what}, ac={p.ac}, tp={L.tp}, sp={L.sp}, "
        f"cp={L.cp}) = {_mem(per_layer)}"
    )
    if p.precision == "fp8" and p.recipe == DEFAULT_RECIPE:
        add(f"   {_FP8_BACKEND_LINES.get(p.fp8_backend, p.fp8_backend)}")
    stage = int(mem.detail.get("pipeline_rank", 0))
    inflight = (
        inflight_microbatches(L.pp_schedule, L.pp, p.pp_call_microbatches, stage, L.pp_virtual)
        if L.pp > 1
        else 1.0
    )
    add(
        f"   micro-batches in flight ({L.pp_schedule}, pipeline rank {stage}, the worst) = "
        f"{inflight:g} (exact for torch's order; time.pipeline.inflight_microbatches)"
    )
    # a split backward (zero-bubble, DualPipeV): a micro-batch past its I holds what it recorded
    recorded = "" if fused_head_loss(L) else "; + what each I records for its W"
    add(
        f"   activations = in_flight x layers x per_layer (+ head/logits on the last rank"
        f"{recorded}) = {_mem(mem.activations)}"
    )
    add("-- 4. buffers")
    for k, v in mem.buffer_terms.items():
        add(f"   {k:<22} {_mem(v)}")
    segments = mem.detail.get("zero1.new_segments", 0.0) + mem.detail.get(
        "zero_step.new_segments", 0.0
    )
    plus = " + post-backward segments" if segments else ""
    add(
        f"   total allocated peak {_mem(mem.total)}; reserved (+fragmentation{plus}) "
        f"{_mem(mem.reserved)} vs capacity {fmt_bytes(mem.capacity, digits=2)} -> "
        f"{'fits' if mem.fits else 'DOES NOT FIT'}"
    )
    if mem.moment:
        add(f"   peak moment: {mem.moment}")
    out += _host_lines(est)
    return out


_BASE_FORMAT = {
    "auto": "fp32 like the trainable parameters",
    "bf16": "bfloat16",
    "int8": "int8 codes + an fp32 scale per row (torchao's per-row weight-only format)",
    "nf4": "QLoRA's NF4 (Dettmers et al. 2023): 4-bit codes, an int8 absmax per 64 values, "
    "an fp32 factor per 256 absmaxes (torchao's NF4Tensor)",
}


def _lora_lines(est: Estimate) -> list[str]:
    """Section 2 under LoRA: the adapters, the frozen base's bytes per value, what trains; per
    tensor-parallel rank (`memory.lora.lora_terms`: each adapter split with its base)."""
    from ..memory.rank_terms import plan_lora_terms

    p, m_ = est.plan, est.plan.model
    lt = plan_lora_terms(p)
    assert lt is not None
    n, t = m_.num_layers, lt.tp
    split, per = "r*(in+out) per projection", "per block"
    if t > 1:
        split = (
            f"split with W over tp={t}: r*(out/{t}+in) beside a column-parallel W (B with its "
            f"rows), r*(out+in/{t}) beside a row-parallel one (A with its columns)"
        )
        per = "per block per tp rank"
    stages = f" over {p.layout.pp} pipeline stages" if p.layout.pp > 1 else ""
    return [
        f"   LoRA rank {lt.rank} on {', '.join(lt.targets)}: adapters {split} = "
        f"{lt.adapters:,.0f} {per} x {n} blocks{stages} = {n * lt.adapters:,.0f} trainable "
        f"params{' per tp rank' if t > 1 else ''}: the only fp32 grads and optimizer states "
        "(all else is frozen)",
        f"   frozen projections {lt.frozen:,.0f} {per} stored as {p.lora_base} "
        f"({_BASE_FORMAT.get(p.lora_base, p.lora_base)}) = {lt.stored / lt.frozen:.4f} B/value"
        f" -> {fmt_bytes(n * lt.stored, digits=2)}; as FSDP2 gathers them "
        f"{lt.gathered / lt.frozen:.4f} B/value; embedding, norms and head frozen fp32",
        *(
            [
                "   dequantization temporary (largest projection) "
                + fmt_bytes(lt.dequantize, digits=2)
            ]
            if lt.dequantize
            else []
        ),
    ]


def _host_lines(est: Estimate) -> list[str]:
    """Section 4's host memory: what each offload puts there, per rank and per node."""
    p, mem = est.plan, est.memory
    terms = {k.removeprefix("host."): v for k, v in mem.detail.items() if k.startswith("host.")}
    if not terms:
        return []
    ranks = max(1, min(p.num_gpus, p.hardware.gpus_per_node))
    out = ["-- 4b. host memory (memory.offload)"]
    for k, v in terms.items():
        out.append(f"   {k:<40} {fmt_bytes(v, digits=2)} per rank")
    cap = mem.host_capacity
    verdict = (
        "not checked: set hardware.host_memory_gib"
        if cap <= 0
        else ("fits" if mem.host <= cap else "DOES NOT FIT")
    )
    out.append(
        f"   per node = worst rank x {ranks} ranks = {fmt_bytes(mem.host, digits=2)} vs host RAM "
        f"{fmt_bytes(cap, digits=2) if cap > 0 else 'unknown'} -> {verdict}"
    )
    return out


def _recipe_states(est: Estimate) -> list[str]:
    """Section 2 under a foreign recipe: each term with the recipe and the source it comes
    from (recipes.schema.Recipe.sources)."""
    p = est.plan
    r = stated_optimizer(p, recipe_named(p.recipe))
    src = r.sources
    fp32 = p.precision == "fp32"
    wb, mb, gb = (4.0, 0.0, 4.0) if fp32 else (r.weight_bytes, r.master_bytes, r.grad_bytes)
    out = [f"   recipe {r.name!r} ({r.framework}); every term below is this recipe's:"]
    grads = (
        (
            "gradients",
            f"{gb:g} B/param bf16 .grad + 4 B/param fp32 accumulation buffer, both unsharded "
            "(BF16_Optimizer: bf16 at ZeRO-1)",
            "bf16_optimizer",
        )
        if bf16_optimizer_runs(p, r)
        else (
            "gradients",
            f"{gb:g} B/param (full buffer under ZeRO-1: {r.grad_buffer_full_under_zero1})",
            "grad_bytes",
        )
    )
    rows: tuple[tuple[str, str, str], ...] = (
        ("weights", f"{wb:g} B/param", "weight_bytes"),
        ("fp32 master", f"{mb:g} B/param (sharded by ZeRO-1: {r.shards_master})", "master_bytes"),
        grads,
        ("optimizer", f"{p.optimizer} moments", "optimizer"),
        ("activations", f"{r.activations}, selective={r.selective}", "activations"),
        ("attention", f"{r.attention} (s x s scores kept: {r.attention == 'naive'})", "attention"),
        ("loss/logits", r.loss, "loss"),
        (
            "grad buckets",
            "none: BF16_Optimizer all-reduces its fp32 buffer cast to bf16, 2 B/param at the reduce"
            if bf16_optimizer_runs(p, r)
            else f"{r.ddp_bucket}, {fmt_bytes(r.bucket_bytes(p.layout.dp), digits=0)}",
            "bf16_optimizer" if bf16_optimizer_runs(p, r) else "ddp_bucket",
        ),
        (
            "allocator",
            f"fragmentation {r.fragmentation:g}, context "
            f"{fmt_bytes(r.cuda_context_bytes, digits=2)}",
            "fragmentation",
        ),
    )
    if p.layout.pp > 1:
        p2p = fmt_bytes(est.memory.buffer_terms.get("pp_p2p", 0.0), digits=2)
        rows += (
            (
                "pp buffers",
                f"{r.pp_stage_buffers} ({p2p} on the planned rank)",
                "pp_stage_buffers",
            ),
        )
    if r.grad_shard_step_bytes:
        rows += (
            (
                "grad shard",
                f"{r.grad_shard_step_bytes:g} B/param / dp x cp, from the gradient sync "
                "through the step",
                "grad_shard_step_bytes",
            ),
        )
    if r.fp32_embedding_grads:
        rows += (("embedding", "fp32 gradients on the first stage", "fp32_embedding_grads"),)
    for name, value, key in rows:
        out.append(f"   [{r.name}] {name:<13} {value} -- {src.get(key, 'see recipes.py')}")
    d = est.memory.detail
    if r.zero1_flat_buffers and d.get("zero1.reduce_flats"):
        out.append(
            f"   [{r.name}] after bwd     bucket copies "
            f"{fmt_bytes(d['zero1.reduce_flats'], digits=2)}, step all-gather copies "
            f"{fmt_bytes(d['zero1.gather_flats'], digits=2)}; new allocator segments "
            f"{fmt_bytes(d['zero1.new_segments'], digits=2)} (in reserved; "
            f"recipes.zero1_flats) -- {src.get('zero1_flat_buffers', '')}"
        )
    if r.zero_step_check_copies and d.get("zero_step.check_copies"):
        seg = d.get("zero_step.new_segments", 0.0)
        where = (
            "in the post-backward segments above"
            if r.zero1_flat_buffers and d.get("zero1.reduce_flats")
            else f"new allocator segments {fmt_bytes(seg, digits=2)} (in reserved)"
        )
        out.append(
            f"   [{r.name}] step checks   fp32 + fp64 copies of the largest gradient slice "
            f"{fmt_bytes(d['zero_step.check_copies'], digits=2)}, one at a time; {where} "
            f"-- {src.get('zero_step_check_copies', '')}"
        )
    return out + _recipe_defaults(est)


def _recipe_defaults(est: Estimate) -> list[str]:
    """The framework defaults a foreign recipe filled in for what the plan did not give, and
    the framework settings its terms rest on, each with where it is read from
    (recipes/defaults.py)."""
    from ..recipes.defaults import KNOB_DEFAULTS

    name = est.plan.recipe
    out = []
    if est.plan.assumed:
        out.append(f"   [{name}] defaults assumed for what was not given:")
        out += [f"     {line}" for line in est.plan.assumed]
    knobs = KNOB_DEFAULTS.get(name, ())
    if knobs:
        out.append(f"   [{name}] framework settings the terms assume at their defaults:")
        out += [f"     {k.name} = {k.value} [{k.source}]" for k in knobs]
    return out


def _recipe_time(est: Estimate) -> list[str]:
    """The foreign recipe's time-model terms and where their constants come from."""
    from ..time.efficiency import GENERATION_EFFICIENCY, gemm_shape_factor, generation_of

    p, L, hw = est.plan, est.plan.layout, est.plan.hardware
    r = stated_optimizer(p, recipe_named(p.recipe))
    bucket = (
        f"   [{r.name}] last gradient bucket exposed: "
        f"{fmt_bytes(r.bucket_bytes(L.dp), digits=0)} "
        f"({r.sources.get('ddp_bucket', '')}); all-reduce latency: NCCL's ring / tree model, "
        f"nccl src/graph/tuning.cc (efficiency.allreduce_latency)"
    )
    from ..time.attention_core import attention_kernel
    from ..time.efficiency import COMM_OVERLAP, STATED_OVERLAPS

    kernel = attention_kernel(r.name, r.attention, p.model.attention)
    from ..time.attention_core import attention_ceiling, triton_flash1_rates

    why = {
        "flash2": f"ceiling: {attention_ceiling(hw)[1]}",
        "triton_flash1": f"ceiling: {triton_flash1_rates(hw)[2]}",
        "fused": "Transformer Engine, at the matmul rate",
        "naive": "full s x s + score traffic: attention_core.NAIVE_SCORE_BYTES"
        f"['{'scaletrain' if r.name == 'scaletrain' else r.naive_scores}']",
    }[kernel]
    bucket += (
        f"\n   [{r.name}] attention core: {kernel} ({why}); overlapped: "
        f"{', '.join(COMM_OVERLAP.get(r.name, ())) or 'gradient reduce only'}"
    )
    if not r.nccl_nvls and hw.nvls_allreduce_busbw > 0:
        bucket += (
            f"\n   [{r.name}] NVLink SHARP off: every all-reduce a ring "
            f"({r.sources.get('nccl_nvls', '')})"
        )
    stated = [f for f in p.comm_overlap if f not in COMM_OVERLAP.get(r.name, ())]
    if stated and r.name != "scaletrain":
        bucket += f"; and as the run states: {', '.join(stated)} ({STATED_OVERLAPS[stated[0]]})"
    from ..time.elementwise import eager_elementwise_s

    eager = eager_elementwise_s(p, r)
    if eager > 0:
        kind, fn = ("eager", "eager_elementwise_bytes")
        if p.model.is_moe and r.eager_block == "mcore":
            kind, fn = ("fused (Transformer Engine), MoE layer", "mcore_elementwise_bytes")
        elif p.model.is_moe:
            kind, fn = ("eager MoE block", "torchtitan_moe_elementwise_bytes")
        elif p.compile:
            kind, fn = ("compiled (fused)", "compiled_elementwise_bytes")
        elif r.eager_block == "mpt":
            fn = "mpt_eager_elementwise_bytes"
        elif r.eager_block == "hf_gpt2":
            fn = "hf_gpt2_eager_elementwise_bytes"
        elif r.eager_block == "torchtune":
            fn = "eager_elementwise_bytes + tune_rope_bytes"
        elif r.eager_block == "mcore":
            kind, fn = ("fused (Transformer Engine)", "mcore_elementwise_bytes")
        bucket += (
            f"\n   [{r.name}] {kind} elementwise kernels: "
            f"{eager * hw.memory_bw / 1e6:.2f} MB per token per block over memory "
            f"bandwidth (elementwise.{fn})"
        )
    from ..time.elementwise import eager_loss_s

    loss_s = eager_loss_s(p, r)
    if loss_s > 0:
        bucket += (
            f"\n   [{r.name}] eager loss over 16-bit logits: {loss_s * hw.memory_bw / 1e6:.2f} MB "
            "per token on the head's rank (elementwise."
            + ("TUNE_LOSS_BYTES" if r.eager_block == "torchtune" else "HF_GPT2_LOSS_BYTES")
            + ")"
        )
    from ..time.moe_traffic import moe_row_seconds_per_token

    moe_rows = moe_row_seconds_per_token(p, r)
    if moe_rows > 0:
        bucket += (
            f"\n   [{r.name}] MoE routed rows (permute / unpermute, weighted SwiGLU, fp8 "
            f"grouped casts): {moe_rows * hw.memory_bw / 1e3:,.0f} kB per token per MoE block "
            "over memory bandwidth (time.moe_traffic); kernel launch gaps not modelled"
        )
    bucket += _recipe_mechanisms(est, r)
    if r.time_model != "generation" or p.efficiency > 0 or hw.is_cpu:
        return [
            f"   [{r.name}] efficiency: time.step_time.default_efficiency "
            "(recipes.schema.FOREIGN_TIME_MODEL)",
            bucket,
        ]
    gen = generation_of(hw)
    tokens = float(p.seq_len) * p.micro_batch / L.cp
    shape = gemm_shape_factor(p.model, tokens, L.tp, p.precision, hw)
    fp8 = " x fp8 0.64 (torchtitan docs/performance.md Table 1)" if p.precision == "fp8" else ""
    return [
        f"   [{r.name}] efficiency = {gen} {GENERATION_EFFICIENCY[gen]:.2f} (published large-"
        f"run fraction of peak, efficiency.GENERATION_EFFICIENCY) x GEMM roofline "
        f"{shape:.3f} ({tokens:,.0f} rows per rank){fp8}",
        bucket,
    ]


def _recipe_mechanisms(est: Estimate, r: Recipe) -> str:
    """Lines for the time terms a recipe's framework runs its own way (time/recipe_terms.py)
    that apply to this plan, each with its source."""
    p, L = est.plan, est.plan.layout
    terms = est.time.comm_terms
    out = ""
    if r.tp_comm == "async_linears" and "tp" in terms and L.sp and not p.model.is_moe:
        out += (
            f"\n   [{r.name}] TP: async linears, column all-gathers under their GEMMs, row "
            f"reduce-scatters exposed ({terms['tp']:.3g} s of collectives per step; "
            f"time.recipe_terms.async_tp_terms; {r.sources.get('tp_comm', '')})"
        )
    if r.tp_comm == "exposed" and "tp" in terms and not L.sp and r.sources.get("tp_comm"):
        from ..time.comm import axis_link

        bw, _, inter = axis_link(L, p.hardware, "tp")
        where = "across nodes" if inter else "inside a node"
        out += (
            f"\n   [{r.name}] TP: every all-reduce exposed, {where} at {bw / 1e9:.0f} GB/s bus "
            f"bandwidth ({terms['tp']:.3g} s of collectives per step; comm._tp_term; "
            f"{r.sources['tp_comm']})"
        )
    if r.zero1_grad_sync == "allreduce_after_backward" and L.zero == 1 and "dp_allreduce" in terms:
        out += (
            f"\n   [{r.name}] ZeRO-1 gradients: one fp32 all-reduce after the backward, "
            f"exposed ({terms['dp_allreduce']:.3g} s; {r.sources.get('zero1_grad_sync', '')})"
        )
    if r.single_hw_queue and L.zero == 0 and L.dp > 1 and "dp_allreduce" in terms:
        out += (
            f"\n   [{r.name}] CUDA_DEVICE_MAX_CONNECTIONS=1: the DDP gradient all-reduce "
            f"launched during the backward holds back the kernels queued behind it, exposed "
            f"({terms['dp_allreduce']:.3g} s; time.recipe_terms.recipe_exposed; "
            f"{r.sources.get('single_hw_queue', '')})"
        )
    bf16_opt = bf16_optimizer_runs(p, r)
    if bf16_opt and "dp_allreduce" in terms:
        out += (
            f"\n   [{r.name}] BF16_Optimizer gradients: one bf16 all-reduce of the whole fp32 "
            f"buffer after the last backward, then the bf16 weights' all-gather, both exposed "
            f"({terms['dp_allreduce']:.3g} s + {terms.get('zero_all_gather', 0.0):.3g} s; "
            f"time.recipe_terms._BF16_OPTIMIZER_COMM)"
        )
    if "pp_tied_allreduce" in terms:
        why = "time.recipe_terms._BF16_OPTIMIZER_COMM" if bf16_opt else ""
        out += (
            f"\n   [{r.name}] tied embedding and head on pipeline stages 0 and {L.pp - 1}: one "
            f"fp32 all-reduce of the tied gradient after the backward, exposed "
            f"({terms['pp_tied_allreduce']:.3g} s; {r.sources.get('tied_grad_sync', '') or why})"
        )
    if r.cp_ring == "torch_allgather" and "cp_ring" in terms and L.cp > 1:
        from ..time.cp_ring import torch_ring_passes_s
        from ..time.step_time import attention_core_step_s

        heads = "query heads (K/V repeated)" if r.cp_kv_repeated else "K/V heads"
        layers = max(recipe_stages(p, r).layers)
        passes = torch_ring_passes_s(p, r, layers=layers) * max(1, p.grad_accum)
        core = attention_core_step_s(p, r, layers=layers)
        out += (
            f"\n   [{r.name}] CP: torch ring attention, K/V of the {heads} all-gathered once "
            f"per forward behind the first sub-SDPA only, fp32 dK/dV sent each sub-step, fp32 "
            f"merges over memory bandwidth ({terms['cp_ring']:.3g} s of collectives per step; "
            f"time.cp_ring; {r.sources.get('cp_ring', '')}; {r.sources.get('cp_kv_repeated', '')})"
            f"\n   [{r.name}] CP ring on the busiest rank per step: {L.cp} sub-SDPAs per block, "
            f"{core:.3g} s at the attention core's rate (in compute), elementwise passes "
            f"{passes:.3g} s "
            f"(merges, K/V and dK/dV copies: cp_ring.torch_ring_passes_s), collectives "
            f"{terms['cp_ring']:.3g} s of which the part no sub-SDPA hides is exposed"
        )
    if r.grad_accum_pass_bytes:
        out += (
            f"\n   [{r.name}] fp32 accumulation pass: {r.grad_accum_pass_bytes:g} B per "
            f"parameter per micro-batch over memory bandwidth "
            f"({r.sources.get('grad_accum_pass_bytes', '')})"
        )
        if r.ddp_hook_accumulates and L.zero == 0 and L.dp > 1:
            out += (
                f"\n   [{r.name}] ZeRO-0 DDP hook: the sync micro-batch's grads added to the "
                f"fp32 buffer once more, one more pass per step "
                f"({r.sources.get('ddp_hook_accumulates', '')})"
            )
    if r.post_backward_pass_bytes or r.master_copy_bytes:
        out += (
            f"\n   [{r.name}] after the backward: {r.post_backward_pass_bytes:g} B per "
            f"parameter (gradient clipping, zero_grad) + {r.master_copy_bytes:g} B per updated "
            f"parameter (fp32 -> 16-bit copy), with the optimizer step "
            f"(time.recipe_terms.post_backward_s)"
        )
    if r.zero1_gather_host_copies and L.zero == 1 and L.dp > 1:
        out += (
            f"\n   [{r.name}] ZeRO-1 gather on the host: dp x parameter tensors slices, "
            f"flatten / unflatten views and copy_ calls, beyond the GPU work queued after the "
            f"backward, with the optimizer step (time.recipe_terms.zero1_gather_host_s)"
        )
    if r.optimizer_pass_bytes:
        out += (
            f"\n   [{r.name}] optimizer and clipping beyond a fused AdamW: "
            f"{r.optimizer_pass_bytes:g} B per updated parameter over memory bandwidth, with the "
            f"optimizer step ({r.sources.get('optimizer_pass_bytes', '')})"
        )
    return out


def _n(x: float) -> str:
    """A quantity to about three significant figures, thousands separated."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _cost_lines(est: Estimate, tokens: float, energy: dict[str, float]) -> list[str]:
    """Time, cost, energy and CO2 for `tokens` (cost.training_cost), formula by formula."""
    from ..time.cost import num_nodes, training_cost

    p, hw = est.plan, est.plan.hardware
    c = training_cost(est, tokens, **energy)
    pue = energy.get("pue", 1.2)
    grid = energy.get("kg_co2_per_kwh", 0.43)
    host = energy.get("host_watts_per_node", 0.0)
    hours = c.seconds / 3600
    nodes = num_nodes(est)
    g = max(1, p.num_gpus)
    return [
        f"   {tokens:.3g} tokens -> {c.seconds / 86400:.1f} days, {c.gpu_hours:,.0f} "
        f"GPU-hours, ${c.usd:,.0f}, {c.kwh:,.0f} kWh",
        f"-- 9. time, cost, energy, CO2 for {tokens:.3g} tokens",
        f"   time = tokens / tokens/s = {tokens:.3g} / {est.tokens_per_s:,.0f} = "
        f"{_n(c.seconds)} s = {_n(hours)} h = {_n(c.seconds / 86400)} days",
        f"   cost = gpus x hours x $/GPU-hour = {g} x {_n(hours)} x {hw.usd_per_hour:g} = "
        f"${c.usd:,.0f}",
        f"   energy = (gpus x board power + nodes x host power) x hours x PUE = ({g} x "
        f"{hw.power_w:g} W + {nodes} x {host:g} W) x {_n(hours)} h x {pue:g} = "
        f"{_n(c.kwh)} kWh",
        f"     board power {hw.power_w:g} W: the {hw.name} datasheet TDP "
        f"(config/hardware.py), an upper bound on the average draw",
        f"   CO2 = energy x grid intensity = {_n(c.kwh)} kWh x {grid:g} kg/kWh = "
        f"{_n(c.kg_co2)} kg CO2",
        "   ignores: idle, restarts and evaluation time, network/storage power, cooling "
        "beyond PUE, embodied carbon (seed 004, Napkin Math 1.11)",
    ]


def _input_lines(est: Estimate) -> list[str]:
    """The input rate the step needs from storage, per node, and its margin (input_rate.py)."""
    from ..time.input_rate import PAGE_BYTES, input_rate

    r, p = input_rate(est), est.plan
    margin = f"{r.margin:,.0f}x" if r.margin >= 10 else f"{r.margin:.2f}x"
    verdict = "" if r.margin >= 1 else " -- the GPUs would wait for data"
    return [
        f"   input per node = replicas on the node x tokens/s per dp replica = "
        f"{r.replicas_per_node} x {r.replica_tokens_per_s:,.0f} = "
        f"{r.node_tokens_per_s:,.0f} tokens/s",
        "     (a replica's ranks load the same windows, read once per node through its page cache)",
        f"   storage read per node = tokens/s / seq_len x pages per window x {PAGE_BYTES} B = "
        f"{r.node_tokens_per_s:,.0f} / {p.seq_len} x {r.window_bytes / PAGE_BYTES:.2f} x "
        f"{PAGE_BYTES} = {r.node_bytes_per_s / 1e6:,.3f} MB/s",
        f"     ({r.bytes_per_token} B ids, seq_len + 1 per window; ignores readahead and "
        "page-cache reuse)",
        f"   storage bandwidth per node {r.storage_bytes_per_s / GB:.3g} GB/s "
        f"([hardware] storage_gb_per_s): margin {margin}{verdict}",
    ]


_FP8_CAST_SOURCES = {
    "torchao_fused": "torchao's roofline, testing/training/roofline_utils.py "
    "get_tensor_memory_traffic_ovhd_s, tensorwise, one fused cast kernel per tensor",
    "torchao_eager": "torchao float8_linear.py matmul_with_hp_or_float8_args, eager casts "
    "through fp32, each tensor cast once per GEMM layout",
    "scaletrain": "precision/scaling.py abs_max + cast_to_fp8, eager, through fp32",
    "transformer_engine": "Transformer Engine module/linear.py, one cast-transpose kernel per "
    "tensor, delayed scaling; weights cached per step",
}


def _fp8_lines(est: Estimate) -> list[str]:
    """fp8's GEMM rate and casts (time/fp8_casts.py) as `step_time` charges them."""
    from ..recipes.registry import recipe_named
    from ..time.fp8_casts import (
        fp8_cast_bytes_per_token,
        fp8_cast_kernels,
        fp8_gemm_share,
        fp8_weight_cast_s,
    )

    p = est.plan
    r = None if p.recipe == DEFAULT_RECIPE else recipe_named(p.recipe)
    out = [
        f"   fp8 GEMMs: {fp8_gemm_share(p.hardware):.3f} of the bf16 efficiency against the fp8 "
        "peak (fp8 / bf16 MAMF shares, stas00/ml-engineering MAMF tables; "
        "time.fp8_casts.fp8_gemm_share); attention core and head at the bf16 rate"
    ]
    kind = fp8_cast_kernels(p, r)
    if not kind or p.efficiency > 0:
        return [
            *out,
            "   fp8 casts: not charged (no fp8 path read for this recipe, or a set efficiency)",
        ]
    layers = max(
        stage_layer_counts(
            p.model.num_layers, p.layout.pp, p.layout.pp_virtual, p.layout.pp_schedule
        )
    )
    per_tok = fp8_cast_bytes_per_token(p, r)
    w_s = fp8_weight_cast_s(p, r, layers=layers)
    return [
        *out,
        f"   fp8 casts ({kind}: {_FP8_CAST_SOURCES[kind]}): {per_tok / 1e3:,.0f} kB per token "
        f"per block (AC recompute included) + weights {w_s * 1e3:.1f} ms per micro-batch, over "
        "memory bandwidth (time.fp8_casts.CAST_BYTES)",
    ]


def _ep_cross_node_lines(est: Estimate) -> list[str]:
    """`explain`'s line for an EP all-to-all whose group spans nodes (time.comm._ep_term):
    which bytes cross a NIC; none inside one node."""
    from ..time.comm import axis_link, expected_remote_nodes

    p, L, m_ = est.plan, est.plan.layout, est.plan.model
    _, _, crosses = axis_link(L, p.hardware, "ep")
    if not crosses:
        return []
    g = max(1, min(L.ep, p.hardware.gpus_per_node // max(1, L.tp)))
    nodes = L.ep // g
    if p.moe_dispatcher == "flex":
        grouped = m_.router_groups > 1
        r = expected_remote_nodes(
            m_.num_experts,
            m_.experts_per_token,
            nodes,
            m_.router_topk_groups if grouped else 0,
            m_.router_groups if grouped else 0,
        )
        what = (
            f"flex (DeepEP / HybridEP): a token crosses once per destination node, "
            f"{r:.2f} remote nodes per token expected (uniform routing over {nodes} nodes)"
        )
    else:
        what = f"NCCL's per-peer sends: {L.ep - g}/{L.ep} of the routed bytes on each rank's NIC"
    return [
        f"   ep_all_to_all spans {nodes} nodes ({g} ranks each): the slower of the NIC and "
        f"NVLink shares, {what} (time.comm._ep_term)"
    ]


def _time_lines(
    est: Estimate, tokens: float | None, energy: dict[str, float] | None = None
) -> list[str]:
    """Sections 5-8 and the notes: compute, communication, bubble, step."""
    p, L, m_, t = est.plan, est.plan.layout, est.plan.model, est.time
    m = max(1, p.grad_accum)
    out: list[str] = []
    add = out.append
    split = _pipeline_split(est)  # the split the compute time used (a recipe's own)
    counts, head = split.layers, split.head_rank
    add("-- 5. compute")
    if p.recipe != DEFAULT_RECIPE:
        out += _recipe_time(est)
    lf = layer_forward_flops_per_token(m_, p.seq_len)
    hf = head_forward_flops_per_token(m_)
    fwd = forward_flops_per_token(m_, p.seq_len)
    add(f"   forward FLOPs/token = L*{lf:,.0f} (block) + {hf:,.0f} (head) = {fwd:,.0f}")
    add(
        f"   training FLOPs/token = 3 x forward = {est.flops_per_token:,.0f} "
        f"(matmuls only, causal attention halved; recompute excluded from MFU)"
    )
    # hardware FLOPs per token of each rank: its blocks (with recompute), the head on its rank
    extra = {"full": lf, "selective": attention_core_flops_per_token(m_, p.seq_len)}
    block = 3 * lf + extra.get(p.ac, 0.0)
    per_rank = [c * block + (3 * hf if r == head else 0.0) for r, c in enumerate(counts)]
    slow = max(range(len(counts)), key=per_rank.__getitem__)
    add(
        f"   compute time/step = m x tokens/micro-batch x FLOPs of the slowest pipeline rank "
        f"(rank {slow}: {counts[slow]} blocks{' + head' if slow == head else ''}) "
        f"/ (tp*cp) / (peak x efficiency) = {t.compute_s:.3f} s"
    )
    foreign = p.recipe != DEFAULT_RECIPE
    if foreign and L.pp > 1 and p.head_wgrad_deferred:
        add(
            f"   head weight gradients of {min(m, p.head_wgrad_deferred)} of {m} micro-batches "
            "deferred to the pipeline flush (Megatron-Core defer_embedding_wgrad_compute, "
            "PlanInput.head_wgrad_deferred): off the head rank's steady state, run in its "
            "flush idle (the backward share of its bubble), any excess added"
        )
    if not p.hardware.is_cpu:
        from ..time.attention_core import kernel_ceilings

        add(f"   kernel ceilings of {p.hardware.name} (own figure or another device's):")
        out += [f"     {line}" for line in kernel_ceilings(p.hardware)]
    if p.precision == "fp8" and not p.hardware.is_cpu:
        out += _fp8_lines(est)
    add("-- 6. communication (per step per rank: all time; exposed after overlap)")
    for k, v in t.comm_terms.items():
        add(f"   {k:<22} {v:.4f} s")
    if "ep_all_to_all" in t.comm_terms:
        out += _ep_cross_node_lines(est)
    if foreign and L.pp > 1 and p.pp_scatter_gather:
        add(
            "   pp_p2p as Megatron-LM 2021-2023 sends it (PlanInput.pp_scatter_gather): 1/tp of "
            "the tensor per tp rank + a tp all-gather on receipt, blocking (not overlapped)"
        )
    add(f"   exposed communication = {t.comm_exposed_s:.4f} s")
    if t.overlap_sm_s:
        add(
            f"   overlapped NCCL kernels' SMs taken from the compute = {t.overlap_sm_s:.4f} s "
            "(overlapped seconds x CTAs / SMs; time.overlap_sm)"
        )
    add("-- 7. pipeline bubble")
    if L.pp > 1:
        bf = bubble_fraction(L.pp_schedule, L.pp, m, L.pp_virtual)
        form = {
            "gpipe": "(p-1)/m",
            "1f1b": "(p-1)/m",
            "interleaved": "(p-1)/(v*m)",
            "zero-bubble": "(p-1)/(3*v*m) (ZB-H1: torch's zero-bubble order)",
        }
        full = bf * t.compute_s
        share = t.bubble_s / full if full > 0 and L.pp_schedule in ("1f1b", "gpipe") else 1.0
        unequal = (
            f" x {share:.3f}: unequal stages (the head's heavier), the other stages' fill and "
            "drain only (time.step_time._fill_drain_share)"
            if share < 1 - 1e-9
            else ""
        )
        add(
            f"   bubble fraction ({L.pp_schedule}) = {form.get(L.pp_schedule, '')} = {bf:.4f} "
            f"of compute{unequal} -> {t.bubble_s:.3f} s"
        )
    else:
        add("   pp = 1: no bubble")
    add("-- 8. step")
    over = f" + calibrated overhead {t.overhead_s:.3f}" if t.overhead_s else ""
    sm = f" + NCCL SMs {t.overlap_sm_s:.3f}" if t.overlap_sm_s else ""
    host = (
        f" + host-bound {t.host_bound_s:.3f} (ZeRO-3's module hooks issue the step slower "
        "than the device runs it: time.zero3_fetch.zero3_hook_host_s)"
        if t.host_bound_s
        else ""
    )
    add(
        f"   step = compute {t.compute_s:.3f} + bubble {t.bubble_s:.3f} + exposed comm "
        f"{t.comm_exposed_s:.3f}{sm} + optimizer {t.optimizer_s:.3f}{over}{host} = "
        f"{t.step_s:.3f} s"
    )
    add(
        f"   tokens/s (whole job) = {est.tokens_per_s:,.0f}; MFU = FLOPs/token x tokens/s / "
        f"(gpus x peak) = {100 * est.mfu:.1f}%"
    )
    out += _input_lines(est)
    if tokens:
        out += _cost_lines(est, tokens, energy or {})
    add("-- notes")
    for n in est.notes:
        if n.startswith("pipeline split:") and p.recipe != DEFAULT_RECIPE:
            r = recipe_named(p.recipe)
            src = r.sources.get("pp_split", "recipes/stages.py recipe_stages")
            n = (
                f"pipeline split: recipe {r.name!r}, pp_split {r.pp_split!r} "
                f"(recipes.stages.recipe_stages; {src}); head on rank {head}; the slowest "
                "rank paces compute."
            )
        add(f"   * {n}")
    return out


def explain(
    est: Estimate,
    *,
    tokens: float | None = None,
    pue: float = 1.2,
    kg_co2_per_kwh: float = 0.43,
    host_watts_per_node: float = 0.0,
) -> str:
    """A learner-readable derivation of `est` (one line per formula); with `tokens`, the
    training run's time, cost, energy and CO2 from the [hardware] energy inputs."""
    energy = {
        "pue": pue,
        "kg_co2_per_kwh": kg_co2_per_kwh,
        "host_watts_per_node": host_watts_per_node,
    }
    return "\n".join(
        [*_parameters(est), *_states_and_activations(est), *_time_lines(est, tokens, energy)]
    )
