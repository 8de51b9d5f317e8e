"""The step-time model of `estimate`: compute per block and per stage (`_block_seconds`),
collectives and their overlap (`comm_arguments`, `exposure.exposed_by_family`; a framework
recipe's own families in recipe_terms.py), the pipeline
bubble and the optimizer step (`_optimizer_time`), combined by `step_time` into a `StepTime`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from scaletrain.config import (
    HardwareSpec,
    ParamCounts,
    compute_bytes,
    expert_split,
    expert_tp,
    offload_states,
    offloads_activations,
)

from ..memory.rank_terms import ModelTerms, activation_terms, model_terms
from ..memory.states import (
    OPTIMIZER_BYTES,
    fp8_linear_params,
    optimizer_bytes,
    stage_layer_counts,
)
from ..recipes.schema import DEFAULT_RECIPE, Recipe
from ..recipes.stages import recipe_stages
from ..types import PlanInput
from .ac_early_stop import early_stop_applies, early_stop_skipped_forward_flops
from .attention_core import AttentionCore, attention_kernel, attention_seconds_per_token
from .calibration import calibrated_block
from .comm import CommInputs, comm_terms
from .cp_ring import torch_ring_passes_s
from .efficiency import matmul_efficiency, matmul_peak_factor
from .elementwise import eager_elementwise_s, eager_loss_s
from .exposure import ComputeWindow, exposed_by_family, fsdp2_end_exposure, run_overlap
from .flops import (
    attention_core_flops_per_token,
    capacity_rows_forward_flops,
    flops_per_token,
    head_forward_flops_per_token,
    layers_forward_flops_per_token,
    lora_flops,
    op_sac_recompute_flops_per_token,
)
from .fp8_casts import fp8_cast_s, fp8_gemm_share, fp8_weight_cast_s
from .fsdp_copies import fsdp2_copy_bytes
from .moe_traffic import moe_row_seconds_per_token
from .overlap_sm import node_local_families, overlap_sm_seconds
from .pipeline import bubble_fraction, last_stage_rank
from .recipe_terms import (
    grad_accum_pass_s,
    post_backward_s,
    recipe_comm,
    recipe_exposed,
    stage_param_tensors,
    zero1_gather_host_s,
)
from .zero3_fetch import zero3_hook_host_s

__all__ = [
    "default_efficiency",
    "plan_efficiency",
    "comm_arguments",
    "OPTIMIZER_TRAFFIC",
    "optimizer_traffic",
    "CPU_OPTIMIZER_BW",
    "ModelFlops",
    "model_flops",
    "StepTime",
    "step_time",
    "step_floor",
    "BlockTime",
    "fsdp2_copy_s",
    "attention_core_step_s",
]

OPTIMIZER_TRAFFIC = {"adamw": 28.0, "sgd": 20.0, "adamw8bit": 16.0, "adafactor": 12.0}
"""Bytes read+written per (sharded) parameter by one optimizer step: AdamW reads param, grad, m,
v (4 x 4) and writes param, m, v (3 x 4); SGD-momentum reads 3 and writes 2 fp32 tensors; 8-bit
Adam reads/writes 1-byte moments; Adafactor reads param and grad and writes param (its row and
column moments are negligible; ignores its temporary full-size update tensor), and with its
first moment (optim.beta1 > 0) reads and writes m too (`optimizer_traffic`). Memory-bandwidth
bound (arithmetic intensity < 1 FLOP/B)."""


def optimizer_traffic(optimizer: str, beta1: float) -> float:
    """`OPTIMIZER_TRAFFIC` of `optimizer` (AdamW's for an unknown name), plus a read and a write
    of Adafactor's first moment when beta1 > 0 (`memory.states.optimizer_bytes`)."""
    base = OPTIMIZER_TRAFFIC.get(optimizer, OPTIMIZER_TRAFFIC["adamw"])
    if optimizer in OPTIMIZER_BYTES:  # the first moment's bytes, read and written
        return base + 2 * (optimizer_bytes(optimizer, beta1) - OPTIMIZER_BYTES[optimizer])
    return base


CPU_OPTIMIZER_BW = 50e9
"""Host DRAM bandwidth a CPU optimizer step sees with offload (bytes/s; a 2-socket server)."""

_BASE_EFFICIENCY = {"fp32": 0.6, "bf16": 0.55, "fp16": 0.55}
_CPU_EFFICIENCY = 0.35


def default_efficiency(precision: str, hidden: int, hardware: HardwareSpec) -> float:
    """Achievable fraction of peak matmul FLOP/s: 0.55 for bf16/fp16 large matmuls (Megatron-LM
    and torchtitan report 40-55% MFU on A100/H100), 0.6 of the tf32 path in fp32, 0.35 on a
    CPU; fp8 GEMMs keep the share of bf16's that their measured MAMF keeps of the fp8 peak
    (fp8_casts.fp8_gemm_share: H100 0.88, H200 0.91, B200 0.98; ml-engineering's MAMF tables),
    their casts charged apart (fp8_casts, `fp8_cast_s`); scaled by (h/4096)^0.25 below
    h = 4096 (small GEMMs and kernel launches dominate small models). A calibration knob, not
    a law. On a GPU with a measured achievable matmul rate (`HardwareSpec.mamf_bf16`) also
    scaled by its share of the reference H100's (efficiency.matmul_peak_factor: an MI300X's
    best GEMMs reach 60% of its peak, an H100's 80%, so the same software keeps 0.75 of the
    fraction).

    Recipes that also charge their elementwise kernels apart (Recipe.eager_elementwise:
    torchtitan, automodel, torchtune, llm-foundry, megatron, nemo) keep this fraction rather
    than the device's measured MAMF share (A100 86.9%, H100 80.3%: efficiency.MAMF_REFERENCE
    and the presets' mamf_bf16). Measured on the published corpus (benchmarks/
    planner_vs_published.py, recipe column, 2026-11-29, branch gemm): GEMMs at the MAMF share
    of peak wherever the elementwise term is charged made every such framework's rows too fast
    (signed medians: torchtitan H100 -8% -> -26%, NeMo H100 -3% -> -31%, Megatron-LM A100 +2%
    -> -25%, llm-foundry A100 80GB +20% -> -18%, torchtune A100 +23% -> -18%; step median
    |error| 8.5% -> 20.7% over 263 rows; 19.5% with the share scaled by (h/4096)^0.25, 20.7%
    by the roofline, efficiency.gemm_shape_factor), while the elementwise term is 1-6% of
    those rows' predicted steps (13% on torchtitan's B200 rows, 19% on automodel's). So
    this fraction stands for more than the elementwise kernels (candidates, neither priced
    apart by any recipe nor measured here: model-shaped GEMMs below the best shape's rate,
    clocks sustained under load below MAMF's boost bursts, kernel launch gaps); what it may
    count twice is at most that few-% elementwise share, which the corpus does not isolate."""
    if hardware.is_cpu:
        return _CPU_EFFICIENCY * min(1.0, (hidden / 4096) ** 0.25)
    if precision == "fp8":
        base = _BASE_EFFICIENCY["bf16"] * fp8_gemm_share(hardware)
    else:
        base = _BASE_EFFICIENCY.get(precision, 0.5)
    base *= matmul_peak_factor(hardware)
    return base * min(1.0, (hidden / 4096) ** 0.25)


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelFlops:
    """FLOPs per token of one model at one sequence length (`model_flops`; time/flops.py)."""

    block_forward: float
    """One block's forward matmuls (the mean of `layers_forward_flops_per_token`)."""
    head_forward: float
    """The output head's forward matmul (`head_forward_flops_per_token`)."""
    attention_core: float
    """One block's attention core, QK^T and AV (`attention_core_flops_per_token`)."""
    block_hardware: float
    """One block's hardware FLOPs: forward + 2x forward in backward + what AC recomputes
    (full: the forward again; selective: the attention core)."""
    model: float
    """Model FLOPs per token, no recompute (`flops_per_token`): what MFU counts."""


def model_flops(
    terms: ModelTerms,
    seq_len: int,
    causal: bool,
    ac: str,
    lora: tuple[int, tuple[str, ...], str] | None = None,
    tp: int = 1,
) -> ModelFlops:
    """The FLOPs per token of `terms.model`, kept in the search's `ModelTerms` per
    (seq_len, causal, ac, lora, tp): a search evaluates one model thousands of times. lora
    (`PlanInput.lora`): the adapters' forward added, the frozen weights' gradients taken
    off (`flops.lora_flops`; the first block's skipped input gradients are ignored here);
    under tp > 1 the block's hardware FLOPs (the tp group's, divided by tp per rank) also
    count the adapter halves every tp rank computes whole (`LoraFlops.replicated_hardware`),
    which model FLOPs (MFU) count once."""
    key = (seq_len, causal, ac, lora, tp if lora is not None else 1)
    hit = terms.flops.get(key)
    if hit is not None:
        return hit
    model = terms.model
    # the mean block: an MoE model's dense first blocks (DeepSeek) differ from its MoE blocks;
    # ignores which pipeline rank holds them (DeepSeek-V3's: 0.3% apart)
    block_forward = layers_forward_flops_per_token(model, seq_len, causal=causal) / max(
        1, model.num_layers
    )
    core = attention_core_flops_per_token(model, seq_len, causal=causal)
    recomputed = block_forward if ac == "full" else (core if ac == "selective" else 0.0)
    block_hw = 3 * block_forward + recomputed
    total = flops_per_token(model, seq_len, causal=causal, recompute="none")
    if lora is not None:
        lf = lora_flops(model, lora[0], lora[1])
        block_forward += lf.adapters_forward
        block_hw += lf.adapters_forward * (2 if ac == "full" else 1) - lf.saved_per_block
        block_hw += lf.replicated_hardware(tp, ac)
        total += model.num_layers * (lf.adapters_forward - lf.saved_per_block) - lf.head_saved
    hit = terms.flops[key] = ModelFlops(
        block_forward=block_forward,
        head_forward=head_forward_flops_per_token(model),
        attention_core=core,
        block_hardware=block_hw,
        model=total,
    )
    return hit


@dataclass(kw_only=True, slots=True)
class StepTime:
    """One optimizer step's seconds (`step_time`). Built per timed plan of a search: not
    frozen (see `comm.CommInputs`), never mutated after construction."""

    step_s: float
    """compute + bubble + exposed communication + overlap_sm_s + optimizer + overhead."""
    compute_s: float
    bubble_s: float
    exposed_s: float
    """Communication left on the critical path after overlap."""
    optimizer_s: float
    overhead_s: float
    """A calibration's per-step time outside compute, communication and the optimizer."""
    comm: dict[str, tuple[float, float]]
    """(bytes moved, seconds) per collective family (`comm.comm_terms`, a recipe's variant)."""
    efficiency: float
    """The fraction of peak matmul FLOP/s used."""
    overlap_sm_s: float = 0.0
    """Compute lost to the SMs of the NCCL collectives overlapped with it
    (`overlap_sm.overlap_sm_seconds`); in step_s."""
    host_bound_s: float = 0.0
    """What the host's issue time adds beyond the device-side terms (ZeRO-3's module hooks,
    `zero3_fetch.zero3_hook_host_s`, when they exceed them); in step_s."""


def plan_efficiency(plan: PlanInput) -> float:
    """The plan's achievable fraction of peak matmul FLOP/s: its own, else `default_efficiency`."""
    if plan.efficiency > 0:
        return min(1.0, plan.efficiency)
    if plan.calibration is not None:
        return plan.calibration.matmul
    hw = plan.hardware
    # an fp8 plan's share depends on the device's generation (fp8_gemm_share: H100 0.88, H200
    # 0.91), which the other facts do not tell apart (an H200 has H100's peak and MAMF)
    fp8_share = fp8_gemm_share(hw) if plan.precision == "fp8" else 0.0
    key = (
        plan.precision,
        plan.model.dim,
        hw.is_cpu,
        hw.mamf_bf16,
        hw.peak_flops.get("bf16"),
        fp8_share,
    )
    eff = _EFF.get(key)
    if eff is None:
        eff = _EFF[key] = default_efficiency(plan.precision, plan.model.dim, plan.hardware)
    return eff


_EFF: dict[tuple, float] = {}  # default_efficiency reads only these facts


@functools.lru_cache(maxsize=1024)
def _most_layers_but(counts: tuple[int, ...], rank: int) -> int:
    """The most layers of a pipeline rank but `rank` (0 with one rank): cached, as the search
    asks per layout and pp reaches 64."""
    return max((c for r, c in enumerate(counts) if r != rank), default=0)


def comm_arguments(
    plan: PlanInput,
    max_params: float,
    gpus_per_node: int | None = None,
    counts: ParamCounts | None = None,
    recipe: Recipe | None = None,
) -> CommInputs:
    """The `comm_terms` inputs for `plan` whose busiest rank holds `max_params` parameters
    (after TP/PP/EP division): blocks of the fullest stage, tokens of one micro-batch per cp
    rank, this rank's expert weights (EP-local, TP-sharded like max_params). counts: the
    model's `ParamCounts` where the caller has them (the search's `ModelTerms`). recipe: a
    framework recipe's pipeline split (`recipes.stages.recipe_stages`, the one its compute
    uses: Megatron's even L / (pp x v) per stage) gives the fullest stage's blocks, else
    scaletrain's (`stage_layer_counts`, embedding and head counted as a layer each)."""
    L, model = plan.layout, plan.model
    if recipe is not None:
        layers = max(recipe_stages(plan, recipe).layers)
    else:
        layers = max(stage_layer_counts(model.num_layers, L.pp, L.pp_virtual, L.pp_schedule))
    moe_layers = min(layers, model.num_moe_layers)  # (DeepSeek's dense first blocks: none)
    mlp = (counts or model.param_counts()).mlp
    experts = moe_layers * mlp / expert_split(L)
    # fp8 all-gather (precision/fp8_fsdp.py): the Float8Linears' weights travel as 1-byte E4M3
    fp8_gather = (
        fp8_linear_params(model, layers, L.tp)
        if plan.fp8_all_gather and plan.precision == "fp8"
        else 0.0
    )
    return CommInputs(
        layout=L,
        hardware=plan.hardware,
        stage_params=max_params,
        layers=layers,
        moe_layers=moe_layers,
        tokens=float(plan.seq_len) * plan.micro_batch / L.cp,
        hidden=model.dim,
        kv_dim=model.kv_dim,
        experts_per_token=model.expert_rows_per_token(
            float(plan.seq_len) * plan.micro_batch / L.cp
        ),
        num_experts=model.num_experts,
        top_k=model.experts_per_token,
        topk_node_cap=model.router_topk_groups if model.router_groups > 1 else 0,
        router_groups=model.router_groups if model.router_groups > 1 else 0,
        moe_dispatcher=plan.moe_dispatcher,
        micro_batches=max(1, plan.grad_accum),
        precision=plan.precision,
        ac=plan.ac,
        ac_early_stop=early_stop_applies(plan, recipe),
        expert_params=experts,
        fp8_gather_params=fp8_gather,
        gpus_per_node=gpus_per_node,
        pp_scatter_gather=plan.pp_scatter_gather and recipe is not None,
        # the framework's FSDP reduce dtype (Recipe.fsdp_reduce_bytes), sharded plans only
        reduce_bytes=recipe.fsdp_reduce_bytes if recipe is not None and L.zero >= 2 else 4,
    )


def _block_seconds(
    plan: PlanInput,
    recipe: Recipe | None,
    *,
    rate: float,
    slow: float,
    lf: float,
    layer_hw: float,
    core: float,
) -> tuple[float, float, float]:
    """(seconds per token of one block, of its attention core, the block's hardware FLOPs per
    token) for `_time`: the matmuls at `rate` (`slow`: the bf16 rate fp8 runs the core at), the
    attention core as its kernel runs it, the eager elementwise kernels, a Megatron-Core MoE
    layer's routed-row traffic (moe_traffic.py), and MoE experts kept whole per tp rank charged
    tp / expert_tp times over."""
    L, model, hw = plan.layout, plan.model, plan.hardware
    core_hw = core * (4 if plan.ac != "none" else 3)  # selective / full recompute it once
    core_recompute = plan.ac != "none"
    if (
        recipe is not None
        and recipe.selective == "torchtitan_op"
        and plan.ac == "selective"
        and not model.is_moe
    ):
        # torchtitan's per-op SAC: every second matmul recomputed, SDPA saved (flops.py)
        layer_hw = 3 * lf + op_sac_recompute_flops_per_token(model)
        core_hw, core_recompute = 3 * core, False
    # a full recompute that stops early skips the dense blocks' down projection
    layer_hw -= early_stop_skipped_forward_flops(plan, recipe)
    # the attention core as its kernel runs it (attention_core.attention_seconds_per_token)
    rname = recipe.name if recipe is not None else DEFAULT_RECIPE
    kernel = attention_kernel(
        rname, recipe.attention if recipe is not None else "model", model.attention
    )
    dropout = recipe is not None and recipe.dropout_masks and model.norm == "layernorm"
    core_s = (
        attention_seconds_per_token(
            AttentionCore(
                kernel=kernel,
                core_flops=core,
                heads=model.num_heads,
                seq_len=plan.seq_len,
                recompute=core_recompute,
                dropout=dropout,
                scores=recipe.naive_scores
                if recipe is not None and rname != DEFAULT_RECIPE
                else "",
                kernel_seq_len=max(1, plan.seq_len // L.cp),
            ),
            recipe=rname,
            bf16_rate=slow,
            hardware=hw,
            kernel_efficiency=plan.efficiency <= 0,
        )
        if not hw.is_cpu
        else core_hw / slow
    )
    layer_s = (layer_hw - core_hw) / rate + core_s  # seconds per token per block
    layer_s += eager_elementwise_s(plan, recipe)
    layer_s += fp8_cast_s(plan, recipe)
    # a Megatron-Core MoE layer's permute / SwiGLU / fp8-cast traffic on its routed rows
    layer_s += moe_row_seconds_per_token(plan, recipe)
    te = expert_tp(L.tp, L.ep)
    if model.is_moe and te < L.tp:
        # the experts' matmuls (k routed copies of each token, n_mat x h x f each; forward,
        # backward 2x, + a forward under full recompute), charged tp / te times over
        n_mat = 3 if model.gated_mlp else 2
        kr = model.expert_rows_per_token(float(plan.seq_len) * plan.micro_batch / L.cp)
        expert_f = 2.0 * kr * n_mat * model.dim * model.ffn_dim
        expert_s = expert_f * (4 if plan.ac == "full" else 3) / rate
        layer_s += expert_s * (L.tp / te - 1)
    return layer_s, core_s, layer_hw


def _capacity_rows_flops(plan: PlanInput) -> float:
    """The mean block's share of `flops.capacity_rows_forward_flops` (the rows an expert
    capacity adds to, or drops from, one micro-batch's k routed rows per token): the dense
    first blocks (DeepSeek) have none, so the mean block carries num_moe_layers / num_layers
    of an MoE block's. The caller repeats it for the backward and a full recompute."""
    model = plan.model
    tokens = float(plan.seq_len) * plan.micro_batch / plan.layout.cp
    per_block = capacity_rows_forward_flops(model, tokens)
    return per_block * model.num_moe_layers / max(1, model.num_layers)


@dataclass(kw_only=True, slots=True)
class _ComputeSide:
    """The compute side of one step (`_compute_side`): what `step_time` and `step_floor`
    share. Not frozen, as `StepTime`."""

    window: ComputeWindow
    """The busiest rank's compute that communication can hide behind."""
    compute_s: float
    """m x the slowest rank's seconds per micro-batch (and a recipe's pass after each)."""
    bubble_s: float
    efficiency: float
    """The fraction of peak matmul FLOP/s used."""
    rate: float
    """The matmul FLOP/s the blocks run at (`BlockTime.rate`)."""


def _compute_side(
    plan: PlanInput,
    max_params: float,
    *,
    terms: ModelTerms,
    causal: bool,
    zero_bubble: str,
    recipe: Recipe | None,
) -> _ComputeSide:
    """Compute: the slowest pipeline rank paces every micro-batch. Rank r does
    counts[r] x block hardware FLOPs per token, the last stage's rank also the head (3 x
    forward; rank pp-1, rank 0 under dualpipev's V); the
    embedding lookup does no matmul. Summed over ranks this is the model's hardware FLOPs, so
    compute x gpus x rate >= model FLOPs per step and MFU <= efficiency (tested). Blocks split
    over tp x cp, except MoE experts kept whole per tp rank (ep > 1,
    `config.layout.expert_tp`): every tp rank runs them on the same (gathered) tokens, so their
    FLOPs split over cp only. A recipe's pass after every micro-batch's backward
    (`recipe_terms.grad_accum_pass_s`, over the rank's `max_params`) adds to each micro-batch,
    once more per step at ZeRO-0 with dp > 1 under Recipe.ddp_hook_accumulates (the DDP
    hook's own add), and so do the elementwise passes of torch's ring attention under CP
    (`cp_ring.torch_ring_passes_s`, Recipe.cp_ring 'torch_allgather').
    The pipeline bubble is a fraction of it (`pipeline.bubble_fraction`), for GPipe and 1F1B
    with unequal stages the other stages' fill and drain (`_fill_drain_share`); the fraction
    is one schedule call's (`PlanInput.pp_call_microbatches`, `pipeline.schedule_microbatches`:
    a run that calls torch's schedule once per local batch fills and drains once per call).
    Ignores: a call's drain overlapping the next call's fill (torch's step returns first)."""
    L, model, hw = plan.layout, plan.model, plan.hardware
    m = max(1, plan.grad_accum)
    counts = stage_layer_counts(model.num_layers, L.pp, L.pp_virtual, L.pp_schedule)
    head = last_stage_rank(L)
    if recipe is not None:
        stages = recipe_stages(plan, recipe)
        counts, head = stages.layers, stages.head_rank
    bt = _block_time(plan, terms=terms, causal=causal, recipe=recipe)
    layer_s, core_s, head_s = bt.layer_s, bt.core_s, bt.head_s
    tok_mb = float(plan.seq_len) * plan.micro_batch  # tokens of one micro-batch (one replica)
    split = L.tp * L.cp
    middle = _most_layers_but(tuple(counts), head) * layer_s
    t_mb = max(middle, counts[head] * layer_s + head_s) * tok_mb / split
    # a recipe's pass after every micro-batch's backward (recipe_terms.grad_accum_pass_s)
    foreign = recipe is not None and recipe.name != "scaletrain"
    t_acc = (
        grad_accum_pass_s(plan, recipe.grad_accum_pass_bytes, max_params)
        if foreign and recipe is not None and recipe.grad_accum_pass_bytes and not hw.is_cpu
        else 0.0
    )
    # torch's ring attention's fp32 merges and copies (cp_ring.torch_ring_passes_s)
    t_ring = (
        torch_ring_passes_s(plan, recipe, layers=max(counts))
        if foreign and recipe is not None and recipe.cp_ring == "torch_allgather" and not hw.is_cpu
        else 0.0
    )
    # the fp8 Linears' weight casts, once per micro-batch (fp8_casts.fp8_weight_cast_bytes)
    t_w8 = fp8_weight_cast_s(plan, recipe, layers=max(counts))
    compute_s = m * (t_mb + t_acc + t_ring + t_w8)
    # FSDP2's all-gather copy-outs and reduce-scatter copy-ins (fsdp_copies, Recipe.fsdp2_copies)
    compute_s += fsdp2_copy_s(plan, recipe, max_params, terms=terms)
    # the DDP hook's own fp32 add at the sync micro-batch (Recipe.ddp_hook_accumulates)
    if t_acc and recipe is not None and recipe.ddp_hook_accumulates and L.zero == 0 and L.dp > 1:
        compute_s += t_acc
    # the head's weight-gradient GEMMs a run defers to the pipeline flush
    # (PlanInput.head_wgrad_deferred): those micro-batches' head rank does 2 of the head's 3
    # GEMMs; the deferred ones run after its last backward, hidden in its flush idle
    d = min(m, plan.head_wgrad_deferred) if foreign and L.pp > 1 else 0
    wgrad_s = head_s / 3 * tok_mb / split  # one micro-batch's head weight gradient
    if d:
        light = max(middle, counts[head] * layer_s + head_s * 2 / 3) * tok_mb / split
        compute_s -= d * (t_mb - light)
    bubble_s = 0.0
    if L.pp > 1:
        # the fraction of one schedule call of mc micro-batches (PlanInput.pp_call_microbatches)
        # over the step's m: each of the m / mc calls fills and drains once
        mc = plan.pp_call_microbatches
        bubble_s = (
            bubble_fraction(L.pp_schedule, L.pp, mc, L.pp_virtual, zero_bubble=zero_bubble)
            * compute_s
            * _fill_drain_share(plan, counts, head, layer_s, head_s)
        )
    if d:
        # the last rank idles through the flush for the other ranks' remaining backwards:
        # the backward share of its bubble (1F1B: (p-1) backward slots after its last one)
        flush = bubble_s * (1.0 - bt.fwd_hw / bt.layer_hw)
        compute_s += max(0.0, d * wgrad_s - flush)
    layers = max(counts)
    t_fwd = t_mb * bt.fwd_hw / bt.layer_hw  # forward share of the hardware FLOPs
    t_core = tok_mb * layers * core_s / split * m
    window = ComputeWindow(
        microbatches=m,
        forward_s=t_fwd,
        backward_s=t_mb - t_fwd,
        core_s=t_core,
        layers=layers,
    )
    return _ComputeSide(
        window=window,
        compute_s=compute_s,
        bubble_s=bubble_s,
        efficiency=bt.efficiency,
        rate=bt.rate,
    )


def _fill_drain_share(
    plan: PlanInput, counts: tuple[int, ...] | list[int], head: int, layer_s: float, head_s: float
) -> float:
    """GPipe's and 1F1B's (v = 1) fill and drain with unequal stages, as a share of the
    uniform-stage bubble (p - 1) x t_max: the slowest stage paces the m micro-batches, and the
    pipeline fills through the forwards and drains through the backwards of the other p - 1
    stages, each at its own time, so the step is m x t_max + sum of the others' t (not
    (m + p - 1) x t_max). 1 when every stage takes the same time; below 1 where one stage is
    heavier (the last one holding the head). Checked against an event simulation of DeepSpeed's
    TrainSchedule (deepspeed/runtime/pipe/schedule.py, blocking send / recv between adjacent
    stages) and of 1F1B: exact when the slowest stage is the last. Ignores: a slowest stage in
    the middle (its upstream stages then also wait on it in the drain), per-stage passes that
    are not per layer (recipe_terms.grad_accum_pass_s)."""
    L = plan.layout
    if L.pp_schedule not in ("1f1b", "gpipe") or L.pp_virtual != 1 or L.pp < 2:
        return 1.0
    stage = [n * layer_s + (head_s if r == head else 0.0) for r, n in enumerate(counts)]
    t_max = max(stage)
    if t_max <= 0:
        return 1.0
    return (sum(stage) - t_max) / ((len(stage) - 1) * t_max)


@dataclass(kw_only=True, slots=True, frozen=True)
class BlockTime:
    """One block's and the head's seconds per token of a plan (`_block_time`); kept per
    search in `ModelTerms.blocks`, so frozen."""

    layer_s: float
    """A block's forward and backward (and recompute) seconds per token (`_block_seconds`)."""
    core_s: float
    """Its attention core's share."""
    head_s: float
    """The head's forward and backward seconds per token."""
    fwd_hw: float
    """The mean block's forward hardware FLOPs per token (`ModelFlops.block_forward`, and an
    expert capacity's rows: `_capacity_rows_flops`)."""
    layer_hw: float
    """A block's hardware FLOPs per token (with recompute; a recipe's per-op SAC)."""
    efficiency: float
    """The fraction of peak matmul FLOP/s used (`plan_efficiency`)."""
    rate: float
    """The matmul FLOP/s: the hardware's peak in the plan's precision x `efficiency` (a
    generation recipe's roofline efficiency)."""


def _block_time(
    plan: PlanInput, *, terms: ModelTerms, causal: bool, recipe: Recipe | None
) -> BlockTime:
    """The block's and the head's seconds per token at the plan's matmul rate (its
    efficiency of the hardware's peak, `_block_seconds`), or as a calibration measured them.
    Under the default recipe without a calibration they depend on the plan only through its
    AC, tp, ep, sequence length, LoRA, precision and efficiency (and the hardware), and under
    an expert capacity its micro-batch and cp too (the capacity's rows per token): kept in the
    search's `ModelTerms.blocks` by those (the 405B search asks 12,700 times, for 13 values)."""
    L, model, hw = plan.layout, plan.model, plan.hardware
    cached = recipe is None and plan.calibration is None
    if cached:
        if terms.blocks_hardware is not hw:
            terms.blocks.clear()
            terms.blocks_hardware = hw
        key: tuple = (plan.ac, L.tp, L.ep, plan.seq_len, causal, plan.lora)
        key += (plan.precision, plan.efficiency)
        if plan.precision == "fp8":  # the casts' kernels (fp8_casts.fp8_cast_kernels)
            key += (plan.compile, plan.fp8_backend)
        if model.moe_capacity_factor:  # (`ModelConfig.expert_rows_per_token` of the tokens)
            key += (plan.micro_batch, L.cp)
        hit = terms.blocks.get(key)
        if hit is not None:
            return hit
    fl = model_flops(terms, plan.seq_len, causal, plan.ac, plan.lora, L.tp)
    lf, hf, core, layer_hw = fl.block_forward, fl.head_forward, fl.attention_core, fl.block_hardware
    eff = plan_efficiency(plan)
    eff16 = eff
    generation = recipe is not None and recipe.time_model == "generation"
    if generation and plan.efficiency <= 0 and not hw.is_cpu:
        # efficiency.py: generation x GEMM-shape roofline x fp8 factor
        eff, eff16 = matmul_efficiency(
            model, hw, plan.precision, float(plan.seq_len) * plan.micro_batch / L.cp, L.tp
        )
    rate = hw.flops(plan.precision) * eff
    # fp8 (precision/fp8.py) runs float8 GEMMs in the converted linears and MoE experts only:
    # the attention core (SDPA) and the 16-bit head run at the bf16 rate. Every other
    # precision runs all of its matmuls at one rate.
    slow = hw.flops("bf16") * eff16 if plan.precision == "fp8" else rate
    fwd_hw = lf  # the mean block's forward hardware FLOPs
    if model.is_moe and model.moe_capacity_factor:
        rows = _capacity_rows_flops(plan)
        fwd_hw, layer_hw = lf + rows, layer_hw + rows * (4 if plan.ac == "full" else 3)
    layer_s, core_s, layer_hw = _block_seconds(
        plan, recipe, rate=rate, slow=slow, lf=lf, layer_hw=layer_hw, core=core
    )
    head_s = 3 * hf / slow
    # a recipe's eager loss over 16-bit logits (elementwise.eager_loss_s: Hugging Face GPT-2)
    head_s += eager_loss_s(plan, recipe)
    cal = plan.calibration
    if cal is not None and plan.efficiency <= 0:
        # the rates this device measured (time/calibration.py) replace the default model's
        core_hw = core * (4 if plan.ac != "none" else 3)
        skipped = early_stop_skipped_forward_flops(plan, recipe)
        block = calibrated_block(
            plan,
            linear_hw=layer_hw + skipped - core_hw,
            core_hw=core_hw,
            head_fwd=hf,
            skipped_fwd=skipped,
        )
        layer_s, core_s, head_s = block.layer_s, block.core_s, block.head_s
    out = BlockTime(
        layer_s=layer_s,
        core_s=core_s,
        head_s=head_s,
        fwd_hw=fwd_hw,
        layer_hw=layer_hw,
        efficiency=eff,
        rate=rate,
    )
    if cached:
        terms.blocks[key] = out
    return out


def attention_core_step_s(
    plan: PlanInput, recipe: Recipe | None, *, layers: int, terms: ModelTerms | None = None
) -> float:
    """Seconds per step of the attention core (forward, backward and any recompute, as its
    kernel runs it: `_block_seconds`) on a rank holding `layers` blocks: the part of
    `_compute_side`'s compute that `ComputeWindow.core_s` holds, causal attention. Under CP
    these are the ring's sub-SDPAs (time/cp_ring.py); `explain` prints them beside the ring's
    own passes and collectives."""
    bt = _block_time(plan, terms=model_terms(plan, terms), causal=True, recipe=recipe)
    L = plan.layout
    tokens = float(plan.seq_len) * plan.micro_batch * max(1, plan.grad_accum)
    return bt.core_s * tokens * layers / (L.tp * L.cp)


def step_time(
    plan: PlanInput,
    max_params: float,
    *,
    terms: ModelTerms,
    causal: bool,
    gpus_per_node: int | None,
    zero_bubble: str,
    recipe: Recipe | None = None,
) -> StepTime:
    """The seconds of one step of `plan` whose busiest rank holds `max_params` parameters:
    compute (`_compute_side`) + the pipeline bubble + the communication left exposed after
    overlap (`comm.comm_terms`, `exposure.exposed_by_family`; a recipe's own families as it computes
    them, `recipe_terms.recipe_exposed`) + the compute the overlapped NCCL collectives' SMs take
    from the GEMMs (`overlap_sm.overlap_sm_seconds`) + the optimizer step (`_optimizer_seconds`,
    and under Recipe.zero1_gather_host_copies the host time of its ZeRO-1 gather that the GPU's
    post-backward work does not hide, `recipe_terms.zero1_gather_host_s`)."""
    L = plan.layout
    if recipe is not None and not recipe.nccl_nvls and plan.hardware.nvls_allreduce_busbw > 0:
        # the framework's runs turn NCCL's NVLink SHARP off (Recipe.nccl_nvls): rings only
        plan = dataclasses.replace(
            plan, hardware=dataclasses.replace(plan.hardware, nvls_allreduce_busbw=0.0)
        )
    side = _compute_side(
        plan, max_params, terms=terms, causal=causal, zero_bubble=zero_bubble, recipe=recipe
    )
    m, layers = side.window.microbatches, side.window.layers
    foreign = recipe is not None and recipe.name != "scaletrain"
    cal = plan.calibration
    comm_inputs = comm_arguments(plan, max_params, gpus_per_node, terms.counts, recipe)
    comm = comm_terms(comm_inputs)
    if offloads_activations(plan.offload):
        comm["activation_offload"] = _activation_offload(plan, terms, layers=layers, m=m)
    if cal is not None and cal.collective:  # measured / planned seconds by collective kind
        comm = {k: (b, t * cal.collective_factor(k)) for k, (b, t) in comm.items()}
    bucket = 25.0 * 2**20
    override: dict[str, float] = {}
    if foreign and recipe is not None:
        comm = recipe_comm(comm, plan, recipe, max_params, gpus_per_node)
        bucket = recipe.bucket_bytes(L.dp)
        w = side.window
        override = recipe_exposed(
            comm,
            plan,
            recipe,
            rate=side.rate,
            layers=layers,
            gpus_per_node=gpus_per_node,
            core_s_layer=w.core_s / max(1, layers * m),
            stretch=1.0 + (side.bubble_s / side.compute_s if side.compute_s > 0 else 0.0),
        )
    # families a recipe runs its own way are charged as it computed them (`recipe_exposed`)
    own = {k: v for k, v in comm.items() if k not in override}
    window = dataclasses.replace(
        side.window, fsdp_ends=fsdp2_end_exposure(plan, recipe, comm_inputs, own)
    )
    by_family = exposed_by_family(
        own,
        plan,
        window,
        stage_params=max_params,
        gpus_per_node=gpus_per_node,
        bucket_bytes=bucket,
        tree=foreign,
        overlap=run_overlap(plan, recipe),
    )
    exposed = sum(override.values()) + sum(by_family.values())
    # the SMs the overlapped NCCL collectives hold beside the GEMMs (overlap_sm.py)
    overlap_sm_s = overlap_sm_seconds(
        own,
        by_family,
        plan.hardware,
        families=node_local_families(L, gpus_per_node or plan.hardware.gpus_per_node),
        nvls_allreduce=plan.hardware.nvls_allreduce_busbw > 0,
    )
    optimizer_s = _optimizer_seconds(plan, max_params, recipe)
    if foreign and recipe is not None and recipe.zero1_gather_host_copies:
        # ZeRO-1's gather built and copied back on the host, inside the optimizer's step,
        # beyond the GPU work queued after the backward (recipe_terms.zero1_gather_host_s)
        tail = ("dp_allreduce", "pp_tied_allreduce", "zero_all_gather")
        hidden = sum(comm[k][1] for k in tail if k in comm) + optimizer_s
        optimizer_s += zero1_gather_host_s(
            plan, recipe, tensors=stage_param_tensors(plan, layers), hidden_s=hidden
        )
    overhead = cal.step_overhead_s if cal is not None else 0.0
    compute_s, bubble_s = side.compute_s, side.bubble_s
    device_s = compute_s + bubble_s + exposed + overlap_sm_s + optimizer_s + overhead
    host_bound_s = 0.0
    if (
        foreign
        and recipe is not None
        and recipe.zero3_module_fetch
        and L.zero == 3
        and not plan.hardware.is_cpu
    ):
        # ZeRO-3's per-module hooks issue the step from the host: a floor under it
        # (zero3_fetch.zero3_hook_host_s)
        host_bound_s = max(0.0, zero3_hook_host_s(plan) - device_s)
    return StepTime(
        step_s=device_s + host_bound_s,
        compute_s=compute_s,
        bubble_s=bubble_s,
        exposed_s=exposed,
        optimizer_s=optimizer_s,
        overhead_s=overhead,
        comm=comm,
        efficiency=side.efficiency,
        overlap_sm_s=overlap_sm_s,
        host_bound_s=host_bound_s,
    )


def _optimizer_seconds(plan: PlanInput, max_params: float, recipe: Recipe | None) -> float:
    """The optimizer step's seconds (`_optimizer_time`), and a foreign recipe's passes after
    the backward on a GPU (`recipe_terms.post_backward_s`): what `step_time` and `step_floor`
    both add."""
    optimizer_s = _optimizer_time(plan, max_params)
    foreign = recipe is not None and recipe.name != "scaletrain"
    if foreign and recipe is not None and not plan.hardware.is_cpu:
        optimizer_s += post_backward_s(
            plan,
            params=max_params,
            all_params_bytes=recipe.post_backward_pass_bytes,
            updated_bytes=recipe.master_copy_bytes + recipe.optimizer_pass_bytes,
            zero1_flat_copies=recipe.zero1_gather_flat_copies,
        )
    return optimizer_s


def step_floor(
    plan: PlanInput,
    max_params: float,
    *,
    terms: ModelTerms,
    causal: bool,
    zero_bubble: str,
    recipe: Recipe | None = None,
) -> float:
    """A lower bound of `step_time(...).step_s` without its communication model: the same sum
    with the exposed communication replaced by its activation-offload share, which
    `exposure.exposed_by_family` charges whole (0 without activation offload). Why it is a
    lower bound, in floats too: every family `exposure.exposed_by_family` charges is a
    non-negative number of seconds (a max with 0, a min of two non-negative times, or the time
    itself), so its running sum is at least each of its terms, and a recipe's own families
    (`recipe_terms.recipe_exposed`: tp, dp_allreduce, never the activation offload) add non-negative
    seconds in front of it; step_s adds compute, bubble, exposed, the overlapped collectives' SM
    seconds (`overlap_sm.overlap_sm_seconds`, a sum of non-negative products, left out here),
    optimizer and overhead in this same order, each rounded addition increasing in its operands. The
    search times every layout that fits with it and the full model only where the pick could read
    the step (`search.layouts`)."""
    side = _compute_side(
        plan, max_params, terms=terms, causal=causal, zero_bubble=zero_bubble, recipe=recipe
    )
    cal = plan.calibration
    exposed = 0.0
    if offloads_activations(plan.offload):
        w = side.window
        exposed = _activation_offload(plan, terms, layers=w.layers, m=w.microbatches)[1]
        if cal is not None and cal.collective:  # as `step_time` scales it
            exposed = exposed * cal.collective_factor("activation_offload")
    optimizer_s = _optimizer_seconds(plan, max_params, recipe)
    overhead = cal.step_overhead_s if cal is not None else 0.0
    return side.compute_s + side.bubble_s + exposed + optimizer_s + overhead


def _activation_offload(
    plan: PlanInput, terms: ModelTerms, *, layers: int, m: int
) -> tuple[float, float]:
    """(bytes, seconds) of activation offload per step on the busiest rank: every saved
    tensor goes to the host in forward and comes back in backward (2x the host bytes per
    micro-batch, `rank_terms.activation_terms`) over the PCIe link (host_to_device_bw).
    Exposed whole: the trainer's copies run in the compute stream's order
    (trainer/activation_offload.py). Ignores: the autocast weight casts that go along
    (DDP / ZeRO-1), the head's share on the last stage."""
    acts = activation_terms(plan, terms, modern=True)
    moved = 2.0 * m * layers * acts.host_per_layer
    return moved, moved / plan.hardware.host_to_device_bw


def fsdp2_copy_s(
    plan: PlanInput, recipe: Recipe | None, max_params: float, *, terms: ModelTerms
) -> float:
    """Seconds per step of FSDP2's copies on the compute stream (fsdp_copies.fsdp2_copy_bytes
    over memory bandwidth) for a recipe that runs ZeRO-2/3 as torch's `fully_shard`
    (Recipe.fsdp2_copies); 0 for other recipes, below ZeRO-2, with a user-set efficiency and
    on CPU."""
    L, hw = plan.layout, plan.hardware
    if recipe is None or not recipe.fsdp2_copies or L.zero < 2 or plan.efficiency > 0:
        return 0.0
    if hw.is_cpu:
        return 0.0
    inputs = comm_arguments(plan, max_params, None, terms.counts, recipe)
    e = inputs.param_comm_bytes or compute_bytes(plan.precision)
    moved = fsdp2_copy_bytes(inputs, param_bytes=e, pp_unsharded=recipe.pp_fsdp_unsharded)
    return moved / hw.memory_bw


def _optimizer_time(plan: PlanInput, stage_params: float) -> float:
    """Optimizer step seconds: bytes touched / memory bandwidth (GPU), or with offload the PCIe
    round trip of grads and params (4 + 4 B/param over host_to_device_bw) plus the CPU step at
    CPU_OPTIMIZER_BW. Not overlapped with compute (ZeRO-Offload's delayed update is not
    modelled)."""
    L = plan.layout
    local = stage_params / L.zero_shards if L.zero else stage_params
    traffic = optimizer_traffic(plan.optimizer, plan.beta1) * local
    if offload_states(plan.offload) != "none":
        return 8.0 * local / plan.hardware.host_to_device_bw + traffic / CPU_OPTIMIZER_BW
    cal = plan.calibration
    if cal is not None and cal.optimizer_bw > 0:  # the bandwidth this device's run measured
        return traffic / cal.optimizer_bw
    return traffic / plan.hardware.memory_bw
