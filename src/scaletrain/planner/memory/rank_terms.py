"""A model's memory terms per layout, cached for the search (`ModelTerms`): a pipeline rank's
model states (`rank_states` -> `RankStates`), a block's activation terms (`activation_terms` ->
`ActivationTerms`) and the communication/allocator buffers (`rank_buffers` -> `RankBuffers`).
`rank.py` combines them into a rank's moments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from scaletrain.config import (
    HardwareSpec,
    ModelConfig,
    ParamCounts,
    compute_bytes,
    expert_split,
    expert_tp,
    expert_zero_shards,
    fsdp_reshard_after_forward,
    fused_head_loss,
    offload_states,
    offloads_activations,
)
from scaletrain.config.lora import tp_shapes

from ..types import PlanInput
from .activations import (
    layer_activation_bytes,
    mlp_saved_bytes,
    naive_backward_net_bytes,
    rope_table_bytes,
    selective_recompute_bytes,
)
from .block_ends import mlp_forward_end_bytes, norm_backward_bytes
from .buffers import buffer_terms
from .head import (
    MicroBatchShape,
    embedding_backward_bytes,
    head_activation_bytes,
)
from .lora import (
    LoraTerms,
    bnb_dequantize_work_bytes,
    bnb_saved_input_bytes,
    bnb_stored_bytes_per_value,
    first_block_saving,
    lora_layer_activation_bytes,
    lora_stage,
    lora_terms,
)
from .pipeline_fsdp import FsdpRank, fsdp_rank
from .rank_moments import root_in_backward
from .split_backward import block_recorded_bytes, head_after_input_bytes
from .states import (
    OptimizerSpec,
    StageParams,
    fp8_linear_params,
    model_state_bytes,
    state_bytes_per_param,
)

if TYPE_CHECKING:  # step_time and rank import this module
    from ..time.step_time import BlockTime, ModelFlops
    from .rank import LayoutFacts

__all__ = [
    "ModelTerms",
    "model_terms",
    "StageParams",
    "BackwardTerms",
    "RankStates",
    "ActivationTerms",
    "RankBuffers",
    "rank_states",
    "activation_terms",
    "rank_buffers",
    "fsdp_units",
]


# The records below are built once per cache key (not per layout), so they can be frozen.
@dataclass(kw_only=True, slots=True, frozen=True)
class BackwardTerms:
    """What the ZeRO-2/3 and embedding-backward moments of a rank add (bytes / parameters)."""

    root_unit: float
    """The root unit's unsharded parameters through a ZeRO-3 backward (`root_in_backward`)."""
    head_grad_held: float
    """The head's unsharded gradient (or the tied head's contribution) held to the end."""
    block_params: float
    """One block's parameters on this rank (a block's FSDP unit)."""
    embedding_temp: float
    """The embedding backward's temporaries (`embedding_backward_bytes`), first stage only."""
    root_sharded_grads: float
    """The root unit's sharded gradients (ZeRO-2/3): grad bytes per parameter x its parameters
    / zero shards; what its reduce-scatter's output becomes."""
    unit_gathered: float
    """Bytes of one block's FSDP unit as gathered: compute dtype x block_params, or under LoRA
    the frozen projections in their gathered form (`lora.LoraStage.block_unit_bytes`)."""
    unit_grads: float
    """Parameters of one block with gradients: block_params, or under LoRA its adapters."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RankStates:
    """A pipeline rank's model states (`rank_states`)."""

    states: dict[str, float]
    """`memory.states.model_state_bytes` of the rank."""
    params: float
    """Parameters the rank holds (dense + expert)."""
    unit: float
    """Its largest FSDP unit (parameters)."""
    sharded: float
    """Its trainable parameters after ZeRO sharding (what its optimizer steps)."""
    trainable: float
    """Parameters with gradients (all of `params`, or under LoRA the adapters)."""
    host_casts: float = 0.0
    """Activation offload under autocast (DDP / ZeRO-1): the 16-bit weight casts the
    matmuls save go to the host with the activations (per micro-batch), off the device's
    in-flight parameters."""
    fixed: float
    """params + optimizer bytes: resident through the whole step."""
    backward: BackwardTerms


@dataclass(kw_only=True, slots=True, frozen=True)
class ActivationTerms:
    """Activation bytes per micro-batch of one layout (`activation_terms`)."""

    per_layer: float
    """Stored bytes per block under the plan's AC (an MoE model's MoE block)."""
    dense_per_layer: float = 0.0
    """The same for one of an MoE model's dense first blocks (DeepSeek); 0 when none."""
    recompute: float
    """What one block adds in backward: full AC its no-AC set, selective
    `selective_recompute_bytes`, none 0; + naive attention's S x S gradients."""
    head: float
    """The head + loss activations (`head_activation_bytes`)."""
    head_after_input: float = 0.0
    """Split backward (zero-bubble, DualPipeV): what a micro-batch's head keeps after its
    input-gradient pass until its weight pass (`split_backward.head_after_input_bytes`);
    0 otherwise."""
    recorded_per_layer: float = 0.0
    """Split backward: what a block's input-gradient pass records for its weight pass, on top
    of `per_layer` (`split_backward.block_recorded_bytes`; an MoE model's MoE block); 0
    otherwise."""
    dense_recorded_per_layer: float = 0.0
    """The same for one of an MoE model's dense first blocks (DeepSeek); 0 when none."""
    held_logits: float
    """Logits the training loop holds after the loss backward: none, 0 (`held_logits_bytes`
    with the fused loss; a split backward's schedule keeps no outputs)."""
    first_block_less: float = 0.0
    """What the first stage's first block keeps less than `per_layer` (LoRA: its first
    norm's input, which needs no gradient: `lora.first_block_saving`)."""
    host_per_layer: float = 0.0
    """Activation offload: what a block's forward sends to host memory per micro-batch (the
    `per_layer` it would keep on the device; `per_layer` is then 0)."""
    host_head: float = 0.0
    """Activation offload: the head's share of it (the last stage)."""
    norm_backward: float = 0.0
    """What a norm's backward holds beyond the stored activations and the recompute
    (`block_ends.norm_backward_bytes`; 0 for LayerNorm, LoRA and offloaded activations)."""
    mlp_forward_end: float = 0.0
    """What the last block's MLP forward holds at its end beyond the stored activations
    (`block_ends.mlp_forward_end_bytes`: fp8 only; 0 for MoE, LoRA, offloaded activations)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RankBuffers:
    """A rank's communication and allocator buffers (`rank_buffers`)."""

    terms: dict[str, float]
    """Named buffer terms (`memory.buffers.buffer_terms`, + rope_tables)."""
    total: float
    """Their sum."""
    runtime_context: float
    """The CUDA context term (outside every moment's tensors)."""
    fsdp: float
    """The FSDP collectives' buffers (the fsdp_* terms)."""
    fp8_quantize: float
    """fp8's quantization temporary (alive only inside a converted linear)."""
    pipeline: dict[tuple[str, int, int, int], tuple[dict[str, float], float]] = field(
        default_factory=dict
    )
    """A pipeline rank's (terms, total) with its own receive buffers and rotary tables
    (`pipeline_ranks.pipeline_buffers`), by (schedule, virtual stages, micro-batches, pipeline
    rank), kept once found: what else they read is in this record's cache key."""


class ModelTerms:
    """One model's memory terms, reused by every layout of a search: its parameter counts and,
    keyed by the layout fields each depends on, the rank states (`rank_states`), activation
    terms (`activation_terms`), buffers (`rank_buffers`), FLOPs per token
    (`step_time.model_flops`), the loss and MLP backward temporaries of the moments and what
    the plans of one layout share (`rank.LayoutFacts`).
    `search.layouts.search` builds one per search; a caller that passes none gets a fresh one
    per call. Also the default time model's block seconds on one hardware
    (`step_time._block_time`)."""

    __slots__ = (
        "model",
        "counts",
        "states",
        "acts",
        "bufs",
        "flops",
        "loss",
        "mlp_work",
        "fsdp",
        "blocks",
        "blocks_hardware",
        "layouts",
    )

    def __init__(self, model: ModelConfig) -> None:
        self.model = model
        self.counts: ParamCounts = model.param_counts()
        self.flops: dict[tuple, ModelFlops] = {}
        self.states: dict[tuple, RankStates] = {}
        self.acts: dict[tuple, ActivationTerms] = {}
        self.bufs: dict[tuple, RankBuffers] = {}
        self.loss: dict[tuple, tuple[float, float]] = {}
        """(loss backward temporaries, head gradient) of the last stage
        (`rank_moments.loss_moment`), by micro-batch shape, fused loss and head bytes."""
        self.mlp_work: dict[tuple, float] = {}
        """`activations.mlp_backward_work_bytes` by tokens, tp, sp and bytes
        (`rank_moments._early_block_backward`)."""
        self.fsdp: dict[tuple, FsdpRank | None] = {}
        """A ZeRO-2/3 pipeline rank's stages (`pipeline_fsdp.fsdp_rank`)."""
        self.blocks: dict[tuple, BlockTime] = {}
        """A block's and the head's seconds per token under the default recipe on
        `blocks_hardware` (`step_time._block_time`), by AC, tp, ep, sequence length, causal
        halving, LoRA, precision and the plan's efficiency."""
        self.blocks_hardware: HardwareSpec | None = None
        """The hardware `blocks` holds the seconds of (another empties it)."""
        self.layouts: dict[tuple, LayoutFacts] = {}
        """What every plan of one layout shares whatever its micro-batch and AC
        (`rank.layout_facts`), by the layout and the plan fields its ranks' states read."""


def plan_lora_terms(plan: PlanInput) -> LoraTerms | None:
    """The plan's per-block LoRA sizes on one tensor-parallel rank (`lora.lora_terms`), None
    without LoRA."""
    if not plan.lora_rank:
        return None
    terms = lora_terms(
        plan.model,
        plan.lora_rank,
        plan.lora_targets,
        plan.lora_base,
        plan.precision,
        tp=plan.layout.tp,
    )
    if _bnb(plan):  # bitsandbytes' NF4 layout at rest (memory.lora)
        dq = plan.lora_quantizer == "bitsandbytes-dq"
        stored = sum(
            r * c * bnb_stored_bytes_per_value(r, c, dq)
            for r, c in (
                sh.weight for sh in tp_shapes(plan.model, plan.lora_rank, plan.layout.tp).values()
            )
        )
        terms = dataclasses.replace(terms, stored=stored)
    return terms


def _bnb(plan: PlanInput) -> bool:
    """Whether bitsandbytes' 4-bit layers run the plan's base (`memory.lora`)."""
    return plan.lora_base == "nf4" and plan.lora_quantizer.startswith("bitsandbytes")


def fsdp_units(
    plan: PlanInput, terms: ModelTerms, *, rank: int, layers: int, states: RankStates
) -> FsdpRank | None:
    """`pipeline_fsdp.fsdp_rank` of a pipeline rank, cached in `terms` by what it reads."""
    L = plan.layout
    if L.pp == 1 or L.zero < 2:
        return None
    key = (
        L.tp,
        L.zero,
        L.pp,
        L.pp_virtual,
        L.pp_schedule,
        rank,
        layers,
        plan.precision,
        bool(plan.lora_rank),
        states.trainable,
        states.backward.unit_gathered,
    )
    if key not in terms.fsdp:
        terms.fsdp[key] = fsdp_rank(
            plan, rank=rank, layers=layers, counts=terms.counts, states=states
        )
    return terms.fsdp[key]


def model_terms(plan: PlanInput, terms: ModelTerms | None) -> ModelTerms:
    """`terms` if it was built for the plan's model, else a fresh one."""
    return terms if terms is not None and terms.model is plan.model else ModelTerms(plan.model)


def stage_params(
    plan: PlanInput, pc: ParamCounts, first: bool, last: bool, layers: int, dense_blocks: int = 0
) -> StageParams:
    """The parameters of a pipeline stage holding `layers` blocks (first/last: it holds the
    embedding / the final norm and head), `dense_blocks` of them an MoE model's dense first
    blocks (DeepSeek: `states.dense_layers_on_rank`)."""
    L, model = plan.layout, plan.model
    tp, ep = L.tp, L.ep
    dense_mlp = 0 if model.is_moe else pc.mlp
    # MLA's latent projections stay whole on every tp rank (attention_per_tp); DeepSeekMoE's
    # shared experts are split like the routed ones (tp with ep = 1, else whole)
    block = (
        pc.attention_per_tp(tp)
        + dense_mlp / tp
        + pc.norms
        + pc.router
        + pc.shared_mlp / expert_tp(tp, ep)
    )
    moe_blocks = layers - dense_blocks if model.is_moe else 0
    dense_block = pc.attention_per_tp(tp) + pc.dense_mlp / tp + pc.norms
    dense = (layers - dense_blocks) * block + dense_blocks * dense_block
    # experts split tp ways (ep = 1) or ep ways (config.layout.expert_split)
    expert = moe_blocks * pc.mlp / expert_split(L) if model.is_moe else 0.0
    # FSDP2 ignores expert-parallel experts (parallel/parallelize.py): not in any unit
    experts_in_fsdp = not (model.is_moe and ep > 1 and L.zero >= 2)
    unit = block + (pc.mlp / expert_split(L) if model.is_moe and experts_in_fsdp else 0.0)
    if model.is_moe and layers and not moe_blocks:  # only dense first blocks here
        unit = dense_block
    # FSDP2's root unit (parallel/fsdp.py: fully_shard(model) after the blocks) holds all that
    # is not a block on this stage: embedding + positions and/or final norm + head, gathered as
    # ONE unit (the dry-run's unsharded root of llama2-7b is embedding + head).
    root = 0.0
    # what autocast never casts (`StageParams.uncast`): embeddings, norms, and
    # the head when the fused loss reads it (zero-bubble's plain head Linear is autocast's)
    uncast = float(layers * pc.norms)
    if model.is_mla:  # the latent norms'
        uncast += layers * (model.q_lora_rank + model.kv_lora_rank)
    if first:
        dense += pc.embedding / tp + pc.position
        root += pc.embedding / tp + pc.position
        uncast += pc.embedding / tp + pc.position
    if last:
        head = pc.head or (pc.embedding if L.pp > 1 else 0)  # tied head: a copy on the last stage
        dense += pc.final_norm + head / tp
        root += pc.final_norm + head / tp
        uncast += pc.final_norm + (head / tp if fused_head_loss(L) else 0.0)
    return StageParams(
        block=block,
        dense=dense,
        expert=expert,
        unit=max(unit, root),
        uncast=uncast,
        experts_in_fsdp=experts_in_fsdp,
        # ZeRO-1's busiest rank: the embedding/head on an end stage, else a block
        largest=(pc.embedding / tp) if (first or last) else block,
        # q/k/v/o, the dense MLP or local experts of this stage's blocks
        fp8=fp8_linear_params(model, layers, tp, dense_blocks) + expert,
        keep_gathered=L.zero >= 3 and not fsdp_reshard_after_forward(L),
        gathered_fp8=(
            fp8_linear_params(model, 1, tp) if plan.gathers_fp8 and unit >= root else 0.0
        ),
    )


def rank_states(
    plan: PlanInput,
    terms: ModelTerms,
    zs: int,
    first: bool,
    last: bool,
    layers: int,
    convention: str,
    dense_blocks: int = 0,
) -> RankStates:
    """A rank's model states, cached, with the backward terms the ZeRO-2/3 and embedding
    moments of `rank.py` read (`dense_blocks`: see `stage_params`)."""
    L, model = plan.layout, plan.model
    key = (
        L.tp,
        L.ep,
        L.zero,
        fsdp_reshard_after_forward(L),
        zs,
        L.pp > 1,
        first,
        last,
        layers,
        dense_blocks,
        plan.precision,
        plan.optimizer,
        plan.beta1,
        plan.offload,
        convention,
        plan.lora,
        plan.gathers_fp8,
    )
    hit = terms.states.get(key)
    if hit is not None:
        return hit
    pc = terms.counts
    tp = L.tp
    sp = stage_params(plan, pc, first, last, layers, dense_blocks)
    dense, expert, unit = sp.dense, sp.expert, sp.unit
    st = model_state_bytes(
        sp,
        precision=plan.precision,
        optimizer=OptimizerSpec(plan.optimizer, plan.beta1),
        zero=L.zero,
        zero_shards=zs,
        expert_shards=expert_zero_shards(L),
        offload=offload_states(plan.offload),
        convention=convention,
    )
    sharded = (dense / zs + expert / expert_zero_shards(L)) if L.zero else dense + expert
    wc = plan.compute_bytes
    trainable, blk = dense + expert, _block_params(plan, pc)
    unit_gathered, unit_grads = wc * blk, blk
    if plan.gathers_fp8:  # torchao's fp8 all-gather: the block's converted weights at 1 B
        unit_gathered -= (wc - 1.0) * fp8_linear_params(plan.model, 1, L.tp)
    lora = plan_lora_terms(plan)
    if lora is not None:
        ls = lora_stage(lora, plan, sp, layers=layers, zero_shards=zs)
        st, trainable = ls.states, ls.adapters
        sharded = trainable / zs if L.zero else trainable
        unit_gathered, unit_grads = ls.block_unit_bytes, ls.block_adapters
    host_casts = 0.0
    if offloads_activations(plan.offload) and L.zero < 2 and st["params.in_flight"]:
        # the saved weight casts are activations to the offload hooks (not Parameters)
        host_casts = st["params.in_flight"]
        st = dict(st, params=st["params"] - host_casts, **{"params.in_flight": 0.0})
    fixed = st["params"] + st["optimizer"]
    root_live, head_held = root_in_backward(plan, pc, first, last, wc)
    if lora is not None:
        head_held = 0.0  # a frozen head: the fused loss returns no weight gradient
    emb_tmp = 0.0
    if first and lora is None:  # (a frozen embedding has no backward)
        # the weight's dtype as used: FSDP2's 16-bit unit, or fp32 (also under autocast)
        grad_bytes = plan.compute_bytes if L.zero >= 2 else 4
        emb_tmp = embedding_backward_bytes(
            model, tp=tp, grad_bytes=grad_bytes, tied=model.tie_embeddings and L.pp == 1
        )
    _, grad_bytes_per, _ = state_bytes_per_param(plan.precision, plan.optimizer, convention)
    offloaded = plan.offload == "params" and L.zero >= 3  # (grads live on the host)
    root_sharded = 0.0 if offloaded else grad_bytes_per * root_live / wc / max(1, zs)
    backward = BackwardTerms(
        root_unit=root_live,
        head_grad_held=head_held,
        block_params=blk,
        embedding_temp=emb_tmp,
        root_sharded_grads=root_sharded,
        unit_gathered=unit_gathered,
        unit_grads=unit_grads,
    )
    out = RankStates(
        states=st,
        trainable=trainable,
        host_casts=host_casts,
        params=dense + expert,
        unit=unit,
        sharded=sharded,
        fixed=fixed,
        backward=backward,
    )
    terms.states[key] = out
    return out


def _expert_casts(plan: PlanInput, terms: ModelTerms) -> float:
    """A block's saved compute-dtype casts of its routed experts' weights, per micro-batch.

    The experts' weights reach their GEMMs in fp32 wherever autocast is what makes the step
    16-bit: ZeRO-0/1 (DDP, fp32 parameters), and the expert-parallel experts under ZeRO-2/3,
    which FSDP2 ignores (parallel/parallelize.py). The grouped kernels cast the stacked weights
    themselves in every forward (models/moe.grouped_expert_mlp: autocast does not cast
    `_grouped_mm`'s inputs), and the per-expert loop's weights are views, not leaves: autocast's
    cache keeps neither. The GEMMs save those casts for backward, so each micro-batch whose
    activations are stored holds its own: 2 bytes x the block's local expert parameters
    (dry-run, tiny-moe dp2 z3 ep2: -3.0% total without this term; DeepSeek-V3 at 1/8 widths,
    dp1 cp4 z1: an MoE block's forward keeps 338 MiB that do not shrink with cp, its 256
    experts' 336 MiB of casts; pp32 cp8 ep8 was -41.6% with the casts counted once per step).
    ZeRO-0/1's other matmul weights are leaves in autocast's cache, one cast per step
    (`states._in_flight`). Ignores the shared experts' casts (1 of DeepSeek-V3's 257 experts:
    counted once per step with the dense weights). fp8 experts save no cast: they re-quantize
    the fp32 weight in backward (precision/fp8.py).
    """
    L = plan.layout
    if not plan.model.is_moe or plan.precision in ("fp32", "fp8"):
        return 0.0
    if L.zero < 2 or L.ep > 1:
        return 2.0 * terms.counts.mlp / expert_split(L)
    return 0.0


def activation_terms(plan: PlanInput, terms: ModelTerms, modern: bool) -> ActivationTerms:
    """A block's activation terms per micro-batch (naive attention's S x S gradients from
    `_naive_backward`), cached."""
    L, model = plan.layout, plan.model
    # autocast on fp32 params: DDP and ZeRO-1; ZeRO-2/3 are FSDP2 with 16-bit parameters
    residual_fp32 = plan.precision != "fp32" and L.zero < 2
    key = (
        plan.seq_len,
        plan.micro_batch,
        L.tp,
        L.sp,
        L.cp,
        L.ep,
        plan.ac,
        plan.saved_precision,
        plan.compile,
        modern,
        residual_fp32,
        plan.lora,
        plan.lora_quantizer,
        plan.lora_dropout,
        plan.lora_fused_qkv,
        offloads_activations(plan.offload),
        # the head (fused or logits) and a split backward's terms: the schedule's
        fused_head_loss(L),
    )
    hit = terms.acts.get(key)
    if hit is not None:
        return hit
    # the saved set's precision: a bf16 Linear's under torchao's fp8 (`PlanInput.saved_precision`)
    s, b, p = plan.seq_len, plan.micro_batch, plan.saved_precision
    block_acts = partial(
        layer_activation_bytes,
        model,
        seq_len=s,
        micro_batch=b,
        tp=L.tp,
        sp=L.sp,
        cp=L.cp,
        precision=p,
        modern=modern,
        compile=plan.compile,
        residual_fp32=residual_fp32,
        ep=L.ep,
    )
    per_layer, full = block_acts(ac=plan.ac), block_acts(ac="none")
    first_less = 0.0
    lora = plan_lora_terms(plan) if modern else None
    # the fused head + loss (models/loss.py) runs on the last stage, pipelined or not (a
    # pipeline's last stage is given the targets: parallel/pipeline.py), but zero-bubble
    fused = fused_head_loss(L)
    shape = MicroBatchShape.of(plan)
    if lora is not None:
        r = 4 if residual_fp32 else compute_bytes(p)
        full = lora_layer_activation_bytes(
            model,
            lora,
            shape,
            r=r,
            autocast=residual_fp32,
            dropout=plan.lora_dropout,
            fused_qkv=plan.lora_fused_qkv,
        )
        if _bnb(plan):
            # bitsandbytes' MatMul4Bit keeps each quantized matmul's input (memory.lora)
            full += bnb_saved_input_bytes(model, shape.tokens, p)
        if plan.ac == "none":
            per_layer = full
            sp_tp = L.tp if L.sp else 1
            first_less = first_block_saving(model, tokens=s / L.cp * b, r=r, sp_tp=sp_tp)
    head = head_activation_bytes(model, shape, residual_fp32=residual_fp32, fused=fused)
    # a split backward (`config.fused_head_loss`): what I keeps until W
    split = _split_backward_terms(plan, shape, residual_fp32) if not fused else (0.0, 0.0, 0.0)
    # the step holds no logits after its loss backward: the fused loss forms none, and a split
    # backward's schedule keeps no outputs (`return_outputs=False`) and its I frees them
    held = 0.0
    casts = _expert_casts(plan, terms)
    if casts:
        if plan.ac != "full":  # under full recompute only the block being recomputed has them
            per_layer += casts
        full += casts
    recompute = 0.0
    if plan.ac == "full":
        recompute = full
    elif plan.ac == "selective":
        recompute = selective_recompute_bytes(
            model,
            full=full,
            stored=per_layer,
            tokens=s / L.cp * b,
            tp=L.tp,
            sp=L.sp,
            e=compute_bytes(p),
        )
    recompute += _naive_backward(plan, modern, residual_fp32)
    dense_per_layer = 0.0
    if model.is_moe and model.num_dense_layers:  # DeepSeek's dense first blocks
        dense_view = model.dense_layer_view()
        dense_per_layer = layer_activation_bytes(
            dense_view,
            seq_len=s,
            micro_batch=b,
            tp=L.tp,
            sp=L.sp,
            cp=L.cp,
            precision=p,
            modern=modern,
            compile=plan.compile,
            residual_fp32=residual_fp32,
            ep=L.ep,
            ac=plan.ac,
        )
    norm_bwd = fwd_end = 0.0
    if not plan.lora_rank and modern:
        mlp_saved = mlp_saved_bytes(
            model,
            tok=shape.tokens,
            tp=L.tp,
            ep=L.ep,
            e=compute_bytes(p),
            fp8=p == "fp8",
            compile=plan.compile,
            residual_fp32=residual_fp32,
        )
        norm_bwd = norm_backward_bytes(
            model,
            shape,
            residual_fp32=residual_fp32,
            mlp_saved=mlp_saved,
            recompute=recompute,
            full_ac=plan.ac == "full",
        )
        if not model.is_moe:
            fwd_end = mlp_forward_end_bytes(model, shape, residual_fp32=residual_fp32)
    host_layer = host_head = 0.0
    if offloads_activations(plan.offload):  # (the config allows it with ac none only)
        host_layer, host_head = _offloaded_host_terms(
            plan, model, shape, per_layer, head, residual_fp32
        )
        per_layer, first_less, dense_per_layer = 0.0, 0.0, 0.0
        head, recompute = _offloaded_device_terms(plan, model, shape, fused, recompute)
        norm_bwd = fwd_end = 0.0
    out = ActivationTerms(
        per_layer=per_layer,
        recompute=recompute,
        head=head,
        head_after_input=split[0],
        recorded_per_layer=split[1],
        dense_recorded_per_layer=split[2],
        held_logits=held,
        dense_per_layer=dense_per_layer,
        first_block_less=first_less,
        host_per_layer=host_layer,
        host_head=host_head,
        norm_backward=norm_bwd,
        mlp_forward_end=fwd_end,
    )
    terms.acts[key] = out
    return out


def _split_backward_terms(
    plan: PlanInput, shape: MicroBatchShape, residual_fp32: bool
) -> tuple[float, float, float]:
    """(a micro-batch's head past its I, a block's recorded gradients, a dense first block's)
    under a split backward (`memory.split_backward`). Under LoRA the head and the final norm
    are frozen: no weight path joins the head, so I frees its whole graph with the loss's."""
    model, L = plan.model, plan.layout
    head = 0.0
    if not plan.lora_rank:
        offloaded = offloads_activations(plan.offload)
        head = head_after_input_bytes(
            model, shape, residual_fp32=residual_fp32, offloaded=offloaded
        )
    recorded = partial(
        block_recorded_bytes,
        mb=shape,
        residual_fp32=residual_fp32,
        ep=L.ep,
        lora_rank=plan.lora_rank,
        lora_targets=plan.lora_targets,
    )
    dense = 0.0
    if model.is_moe and model.num_dense_layers:  # DeepSeek's dense first blocks
        dense = recorded(model.dense_layer_view())
    return head, recorded(model), dense


def _offloaded_host_terms(
    plan: PlanInput,
    model: ModelConfig,
    shape: MicroBatchShape,
    per_layer: float,
    head: float,
    residual_fp32: bool,
) -> tuple[float, float]:
    """(a block's, the head's) bytes sent to the host per micro-batch under activation
    offload: what they would keep on the device, plus the second host copy of a tensor saved
    as two different views (the offload hooks copy each view once: `trainer.activation_offload`):
    SDPA saves its output as (b, heads, s, d) and the output projection the same memory as a
    (b*s, h) matrix, e*s_l*b*h/t per block; an fp32 stream's final RMSNorm whose weight trains
    saves its normalized fp32 output beside its input, 4*s_l*b*h (its 'head' term counts the
    input only). Source: the dry-run's host bytes, llama2-7b-L1 dp8 z3 b2 s2048 (0.7315 GB)
    and llama-1024-L4 dp2 z0 b2 s1024 (0.5737 GB), and saved-tensor hooks on the same blocks.
    Ignores: RoPE's cos/sin views, 4 x s x d x 2-4 B per block (< 0.5%)."""
    e = compute_bytes(plan.precision)
    tok = shape.tokens
    out_view = e * tok * model.dim / plan.layout.tp if model.attention != "naive" else 0.0
    norm_out = 4.0 * tok * model.dim if residual_fp32 and not plan.lora_rank else 0.0
    return per_layer + out_view, head + norm_out


def _offloaded_device_terms(
    plan: PlanInput, model: ModelConfig, shape: MicroBatchShape, fused: bool, recompute: float
) -> tuple[float, float]:
    """(head, a block's backward extra) on the device under activation offload
    (`trainer.activation_offload`): every saved tensor but the parameters went to the host in
    forward; in backward each op brings its own back and frees it when it is done. Kept on
    the device: what the head's backward brings back for the fused loss, its input and fp32
    log-sum-exp, e*s_l*b*h + 4*s_l*b (the loss backward is the first op to run); and, in a
    block's backward, what its largest op brings back: SwiGLU's product backward, the gate's
    silu and the up projection, 2 x e*s_l*b*f/t (GELU's, its input, one), on top of the
    recompute term. Source: the dry-run, llama-1024-L4 dp2 z0 b2 s1024 (stored activations
    0.557 GB and the autocast weight casts 0.090 GB on the host, 0.653 measured there)."""
    e = compute_bytes(plan.precision)
    tok = shape.tokens
    head = e * tok * model.dim + 4.0 * tok if fused else 0.0
    n = 2.0 if model.activation == "swiglu" else 1.0
    return head, recompute + n * e * tok * model.ffn_dim / plan.layout.tp


def _naive_backward(plan: PlanInput, modern: bool, residual_fp32: bool) -> float:
    """The S x S gradients of the block whose naive attention core is in backward, beside what
    that block still holds then (`activations.naive_backward_net_bytes`); counted where
    the recompute is, as a block's backward extra. 0 for SDPA and for Korthikanti's model."""
    if not modern or plan.model.attention != "naive":
        return 0.0
    L = plan.layout
    shape = MicroBatchShape.of(plan)
    return naive_backward_net_bytes(
        plan.model,
        shape,
        compile=plan.compile,
        residual_fp32=residual_fp32,
        ep=L.ep,
    )


def rank_buffers(
    plan: PlanInput,
    terms: ModelTerms,
    zs: int,
    unit: float,
    device: str,
    count: float = 0.0,
    backward: BackwardTerms | None = None,
) -> RankBuffers:
    """A rank's buffers, cached. count: the rank's trainable parameters (DDP's bucket copy);
    backward: the rank's `BackwardTerms` (under LoRA its FSDP unit's gathered bytes and
    gradients set the FSDP buffers, and a quantized base adds its dequantization temporary,
    `lora.dequantize_work_bytes`, alive only inside a projection like fp8's quantization)."""
    L, model = plan.layout, plan.model
    tokens = plan.seq_len / L.cp * plan.micro_batch
    key = (
        tokens,
        plan.precision,
        L.zero,
        L.dp,
        L.tp,
        L.sp,
        L.pp,
        L.cp,
        L.ep,
        zs,
        device,
        # `buffer_terms` reads the unit under ZeRO-2/3 (FSDP's buffers) and the parameter
        # count only below (DDP's buckets): ranks with other blocks share the entry
        unit if L.zero >= 2 else count,
        plan.lora,
        plan.lora_quantizer,
    )
    hit = terms.bufs.get(key)
    if hit is not None:
        return hit
    lora = plan_lora_terms(plan)
    bufs = buffer_terms(
        plan,
        unit_params=unit,
        zero_shards=zs,
        device=device,
        bucket_params=count,
        unit_gather_bytes=backward.unit_gathered if lora is not None and backward else None,
        unit_grad_params=backward.unit_grads if lora is not None and backward else None,
    )
    if lora is not None and lora.dequantize:
        bufs["lora_dequantize"] = lora.dequantize
        if _bnb(plan):
            # bitsandbytes' fp16 dequantized copy and its cast, the head included (memory.lora)
            bufs["lora_dequantize"] = bnb_dequantize_work_bytes(model, plan.precision)
    if model.position == "rope":
        bufs["rope_tables"] = rope_table_bytes(model)
    fsdp = sum(v for k, v in bufs.items() if k.startswith("fsdp_"))
    out = RankBuffers(
        terms=bufs,
        total=sum(bufs.values()),
        runtime_context=bufs["runtime_context"],
        fsdp=fsdp,
        fp8_quantize=bufs.get("fp8_quantize", 0.0) + bufs.get("lora_dequantize", 0.0),
    )
    terms.bufs[key] = out
    return out


def _block_params(plan: PlanInput, pc: ParamCounts) -> float:
    """Parameters of one block on this rank (the FSDP unit of a block)."""
    model, L = plan.model, plan.layout
    if model.is_moe:
        # expert-parallel experts are not in the block's FSDP unit (FSDP2 ignores them)
        experts = 0.0 if (L.ep > 1 and L.zero >= 2) else pc.mlp / expert_split(L)
        shared = pc.shared_mlp / expert_tp(L.tp, L.ep)
        return pc.attention_per_tp(L.tp) + pc.norms + pc.router + shared + experts
    return pc.attention_per_tp(L.tp) + pc.mlp / L.tp + pc.norms
