"""Model-state memory per GPU: parameters, gradients and optimizer states under each byte
convention, ZeRO sharding and offload, and how a pipeline splits the blocks (torch-free).

Units: bytes; `GB` in docstrings means 1e9 bytes. Every function answers for ONE rank.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from scaletrain.config import (
    PRECISION_TABLE,
    Layout,
    ModelConfig,
    ParamCounts,
    compute_bytes,
    expert_tp,
    stage_ids,
    stage_layer_ranges,
)

__all__ = [
    "OPTIMIZER_BYTES",
    "ADAFACTOR_FIRST_MOMENT_BYTES",
    "optimizer_bytes",
    "ADAMW8BIT_EAGER_STEP_BYTES",
    "eager_step_bytes",
    "OptimizerSpec",
    "CONVENTIONS",
    "state_bytes_per_param",
    "model_state_bytes",
    "StageParams",
    "UNITS_IN_FLIGHT",
    "fp8_linear_params",
    "stage_layer_counts",
    "dense_layers_on_rank",
]

OPTIMIZER_BYTES = {
    "adamw": 8.0,
    "sgd": 4.0,
    "adamw8bit": 2.0 + 2 * 4 / 256,
    "adafactor": 4 * (1024 + 1024) / (1024 * 1024),
}
"""Optimizer state bytes per parameter. AdamW: m and v in fp32 (Kingma & Ba 2015). SGD: fp32
momentum. adamw8bit (torchao's AdamW8bit, Dettmers et al. 2022): one uint8 code per moment plus
one fp32 absmax per block of 256 values per moment, 2 + 8/256; ignores that tensors (or FSDP
shards) under 4,096 values keep fp32 moments (8 B: norms, biases; < 1% of a large model's
parameters) and the 1 KiB code map per tensor. adafactor (Shazeer & Stern 2018, as
torch.optim.Adafactor and scaletrain's `trainer/adafactor.py` keep it): its second moment only;
an m x n matrix keeps a row and a column of fp32 second moments, 4(m+n)/(mn) per parameter,
taken at m = n = 1024 (0.0078 B): the table has no shapes, and the figure is < 0.01 B/param for
any matrix of 1024 x 1024 or more; ignores that vectors (norms, biases) keep a full fp32 second
moment (4 B each) and that small models' matrices have larger ratios (a 128 x 512 matrix:
0.039 B). Its optional first moment is `ADAFACTOR_FIRST_MOMENT_BYTES`; `optimizer_bytes` adds
it."""

ADAFACTOR_FIRST_MOMENT_BYTES = 4.0
"""Adafactor's first moment (optim.beta1 > 0; Shazeer & Stern 2018 section 5, T5X's beta1): one
value per parameter in the parameter's dtype, fp32 here (`trainer/adafactor.py`'s `exp_avg`,
`torch.zeros_like(p)`)."""


def optimizer_bytes(optimizer: str, beta1: float = 0.0) -> float:
    """Optimizer-state bytes per parameter: `OPTIMIZER_BYTES[optimizer]`, plus
    `ADAFACTOR_FIRST_MOMENT_BYTES` for 'adafactor' with beta1 > 0 (`optim.beta1`). The other
    optimizers keep their first moment whatever beta1 (torch's AdamW and torchao's AdamW8bit
    allocate m at beta1 = 0 too; SGD's momentum buffer is counted always)."""
    first = ADAFACTOR_FIRST_MOMENT_BYTES if optimizer == "adafactor" and beta1 > 0 else 0.0
    return OPTIMIZER_BYTES[optimizer] + first


ADAMW8BIT_EAGER_STEP_BYTES = 24.0
"""Bytes per value of the parameter being stepped that torchao's AdamW8bit step holds at once
when it runs eagerly: `torchao/optim/adam.py` `single_param_adam` is a chain of whole-tensor
fp32 ops (the decayed parameter, m and v dequantized and lerped, the squared gradient, the
re-quantization of m and v, the denominator), compiled into fused kernels by `step()`'s
`torch.compile(single_param_adam, fullgraph=True)` but run op by op eagerly. Measured: the
dry-run of llama-1024-L4 dp2 ZeRO-0 adamw8bit peaks inside the step of the 32,000 x 1,024
embedding with 786,432,000 B of temporaries, 24 B per value (benchmarks/results/
planner_accuracy.md, `optimizer_step_temp`)."""


def eager_step_bytes(
    model: ModelConfig,
    counts: ParamCounts,
    layout: Layout,
    *,
    first: bool,
    last: bool,
    layers: int,
    zero_shards: int,
) -> float:
    """The eager AdamW8bit step's temporaries on one rank: `ADAMW8BIT_EAGER_STEP_BYTES` x the
    largest parameter it steps (the step runs parameter by parameter, so one parameter's
    temporaries are alive at a time).

    The candidates, as this rank holds them: the token embedding (first stage) and the head
    (last stage), V*h/t (vocabulary-parallel under tp); a block's largest matrix, an MLP
    projection h*f/t or the q/out projection h*q/t, and an MoE layer's stacked experts,
    E/ep experts of h*f/t_e each (`config.expert_tp`). ZeRO-2/3 (FSDP2) steps each
    parameter's dim-0 shard, /zero_shards; ZeRO-1 (ZeroRedundancyOptimizer) and DDP step
    whole parameters. Ignores: tensors under 4,096 values (fp32 states, torch ops of their
    own size), LoRA's adapters (callers pass no frozen base: the trained adapters are rank x
    h, small).
    """
    t = layout.tp
    biggest = 0.0
    if first:
        biggest = counts.embedding / t
    if last:
        biggest = max(biggest, (counts.head or (counts.embedding if layout.pp > 1 else 0)) / t)
    if layers:
        h = model.dim
        biggest = max(biggest, h * model.q_dim / t)
        if model.is_moe:
            local_experts = model.num_experts / max(1, layout.ep)
            biggest = max(biggest, local_experts * h * model.ffn_dim / expert_tp(t, layout.ep))
        else:
            biggest = max(biggest, h * model.ffn_dim / t)
    if layout.zero >= 2:
        biggest /= max(1, zero_shards)
    return ADAMW8BIT_EAGER_STEP_BYTES * biggest


@dataclass(frozen=True, slots=True)
class OptimizerSpec:
    """What sizes an optimizer's states: `optim.name` (an `OPTIMIZER_BYTES` key) and
    `optim.beta1` (Adafactor keeps a first moment only while it is > 0: `optimizer_bytes`)."""

    name: str = "adamw"
    beta1: float = 0.0


CONVENTIONS = ("scaletrain", "moments_only", "master_and_moments", "megatron", "full_copies")
"""How model-state bytes are counted (the seeds disagree, docs/DESIGN.md §5):
- 'scaletrain' (default): what scaletrain's trainer allocates. States stay fp32 (param 4 + grad 4
  + optimizer); mixed precision adds 16-bit working copies: FSDP2 (ZeRO-3) all-gathers bf16
  copies of the units in flight (current + prefetched block) and holds the unit's unsharded bf16
  grads before the fp32 reduce-scatter; DDP/ZeRO-1/2 + autocast keeps bf16 casts of every matmul
  weight alive from its forward to its backward (autograd saves them). fp8 (precision/fp8.py)
  keeps no weight copy between forward and backward (the weight is re-quantized in backward),
  so its converted linears hold no 16-bit cast either; FSDP2 still gathers bf16 units. fp16's
  loss scaler is one scalar (ignored).
- 'moments_only': 16-bit params + 16-bit grads + optimizer moments (2+2+8 = 12 B/param for
  AdamW; fp8: 1+1+8 = 10). Seeds 000 (20B: 240 GB) and 004 (7B: 84 GB).
- 'master_and_moments': 16-bit params + grads + (fp32 master + moments) counted as optimizer
  (2+2+12 = 16; ZeRO paper k=12). Seed 003 (7B on 8 GPUs table), seed 002's ZeRO table.
- 'megatron': bf16 params + fp32 grads + fp32 master + moments (2+4+4+8 = 18; Megatron-LM and
  Nanotron's default with fp32 gradient accumulation).
- 'full_copies': seed 002's 20 B/param (bf16 params 2 + bf16 grads 2 + fp32 master 4 + fp32
  grads 4 + moments 8); master counted as optimizer, fp32 grads as grads.
In fp32 there is no master copy: every convention is 4 + 4 + optimizer.
"""

ELEM_BYTES = {name: spec.bytes for name, spec in PRECISION_TABLE.items()}

UNITS_IN_FLIGHT = 2
"""FSDP2's 16-bit unit copies gathered at once under ZeRO-3: the current and the prefetched."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StageParams:
    """Parameter counts of one pipeline stage on one rank (after TP/EP division): what
    `model_state_bytes` counts the states of. Built by `rank_terms.stage_params`; a field left
    out is 0 (no experts, no FSDP unit, nothing uncast or fp8-converted)."""

    dense: float
    """Every parameter FSDP/ZeRO shards over dp*cp: the blocks', embedding, final norm, head."""
    block: float = 0.0
    """One block's parameters (attention, dense MLP, norms, router)."""
    expert: float = 0.0
    """The stage's expert parameters (split tp or ep ways, `config.expert_split`), ZeRO-sharded
    over `expert_shards` (= zero_shards / ep) ranks."""
    unit: float = 0.0
    """The largest FSDP unit: a block with its experts, or the root unit (its 16-bit copies are
    in flight under 'scaletrain'; excludes the experts when not `experts_in_fsdp`)."""
    uncast: float = 0.0
    """Parameters autocast never casts (`_in_flight`)."""
    experts_in_fsdp: bool = True
    """False when FSDP2 ignores the expert-parallel experts (ep > 1 under ZeRO-2/3)."""
    largest: float = 0.0
    """The largest single parameter (ZeRO-1's whole-parameter partition, `model_state_bytes`)."""
    fp8: float = 0.0
    """Weights in float8-converted linears (`fp8_linear_params` + the local experts)."""
    keep_gathered: bool = False
    """ZeRO-3 whose units FSDP2 keeps gathered through the step, as ZeRO-2's: a
    split-backward pipeline's stages (`config.fsdp_reshard_after_forward`)."""
    gathered_fp8: float = 0.0
    """Under torchao's fp8 all-gather (`PlanInput.gathers_fp8`): the weights of `unit` that
    FSDP2 gathers as float8, 1 B each instead of the compute dtype's (0 otherwise, or where
    the largest unit is the root's: embedding and head are not converted)."""


def state_bytes_per_param(
    precision: str,
    optimizer: str = "adamw",
    convention: str = "scaletrain",
    *,
    beta1: float = 0.0,
) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per parameter before any sharding (see CONVENTIONS);
    `beta1`: optim.beta1 (`optimizer_bytes`: Adafactor's first moment)."""
    opt = optimizer_bytes(optimizer, beta1)
    if precision == "fp32" or convention == "scaletrain":
        return 4.0, 4.0, opt
    w = float(ELEM_BYTES[precision])
    if convention == "moments_only":
        return w, w, opt
    if convention == "master_and_moments":
        return w, w, opt + 4
    if convention == "megatron":
        return w, 4.0, opt + 4
    if convention == "full_copies":
        return w, w + 4, opt + 4
    raise ValueError(f"convention={convention!r}: use one of {', '.join(CONVENTIONS)}")


def model_state_bytes(
    params: StageParams,
    *,
    precision: str = "bf16",
    optimizer: OptimizerSpec = OptimizerSpec(),
    zero: int = 0,
    zero_shards: int = 1,
    expert_shards: int = 1,
    offload: str = "none",
    convention: str = "scaletrain",
) -> dict[str, float]:
    """Bytes of params/grads/optimizer states on one GPU, plus what offload moved to the host.
    `optimizer`: its name and beta1 (`optimizer_bytes`).

    params.dense: dense parameters this rank holds after TP/PP division; params.expert: its
    expert parameters after EP division, ZeRO-sharded over `expert_shards` (= zero_shards / ep)
    ranks.
    ZeRO (Rajbhandari et al. 2020): stage >= 1 divides optimizer states, >= 2 gradients, 3
    parameters by the shard count. params.unit: the largest FSDP unit (a block, or the
    embedding/head) whose 16-bit copies are in flight under 'scaletrain'. offload='optimizer'
    moves optimizer states (incl. any master copy counted there) to the CPU (ZeRO-Offload);
    'params' (FSDP2 CPUOffloadPolicy, needs ZeRO-3) moves sharded params, grads and optimizer
    states; the GPU keeps the units in flight. Ignores: the int8 scales of 8-bit Adam, the fp16
    loss scaler, DDP bucket copies (see buffer_terms). params.fp8: this rank's weights in
    float8-converted linears (attention q/k/v/o, dense MLP and MoE experts; not the head,
    router or embeddings), which under precision='fp8' keep no 16-bit cast (measured with
    MemTracker on a dim-256 llama: only the head's bf16 copy remains). ZeRO-1 is torch's
    ZeroRedundancyOptimizer, which gives whole parameters to ranks: the busiest rank holds at
    least the states of the largest parameter (`params.largest`, the embedding; source: the
    dry-run, benchmarks/results/planner_accuracy.md). The 16-bit copies in flight under
    'scaletrain' (params.experts_in_fsdp, params.uncast): `_in_flight`.
    """
    pb, gb, ob = state_bytes_per_param(precision, optimizer.name, convention, beta1=optimizer.beta1)
    num_params, expert_params = params.dense, params.expert
    d_dense, d_exp = max(1, zero_shards), max(1, expert_shards)

    def shard(nbytes_per: float, stage: int) -> float:
        if zero >= stage:
            return nbytes_per * (num_params / d_dense + expert_params / d_exp)
        return nbytes_per * (num_params + expert_params)

    param_bytes, grads, optim = (
        shard(pb, 2 if convention == "scaletrain" else 3),
        shard(gb, 2),
        shard(ob, 1),
    )
    if zero == 1 and params.largest:
        # ZeroRedundancyOptimizer partitions whole parameters greedily by size: the busiest
        # rank's dense share is at least the largest parameter. The experts are partitioned
        # apart, over the ep_replicate ranks only (parallel/zero.py `_LocalShardZero`: every
        # rank steps its own expert shard of the parameters its replica owns), so their
        # states come on top of that dense share, not under the same max (dry-run,
        # deepseek-v3-w896 4 blocks dp2 z1 cp8 ep16 rank 0: Adam states 1,190.9 MB = the
        # embedding's 926.4 + its experts' 264.5; planned 949.1 while the max took both)
        dense_share = max(num_params / d_dense, params.largest)
        optim = max(optim, ob * (dense_share + expert_params / d_exp))
    in_params = in_grads = 0.0
    if convention == "scaletrain":
        in_params, in_grads = _in_flight(params, precision=precision, zero=zero)
    offloaded = 0.0
    if offload == "optimizer":
        offloaded, optim = optim, 0.0
    elif offload == "params" and zero >= 3:
        offloaded, param_bytes, grads, optim = param_bytes + grads + optim, 0.0, 0.0, 0.0
    elif offload == "params":  # without sharding the replicated params must stay on the GPU
        offloaded, optim = optim, 0.0
    return {
        "params": param_bytes + in_params,
        "grads": grads + in_grads,
        "optimizer": optim,
        "params.in_flight": in_params,
        "grads.in_flight": in_grads,
        "offloaded": offloaded,
    }


def _in_flight(params: StageParams, *, precision: str, zero: int) -> tuple[float, float]:
    """(params, grads) in flight under 'scaletrain': the 16-bit copies `model_state_bytes` adds.

    ZeRO-2 is FSDP2 with reshard_after_forward=False (parallel/fsdp.py): the parameters are
    sharded at rest like ZeRO-3, and every unit's compute-dtype copy stays unsharded from its
    forward to its backward (params.in_flight = all of them); so is ZeRO-3 on a
    split-backward pipeline (`params.keep_gathered`). Source: the dry-run
    (benchmarks/results/planner_accuracy.md).
    params.experts_in_fsdp=False: FSDP2 leaves the expert-parallel experts alone (ignored_params,
    parallel/parallelize.py), so ZeRO-2 keeps no gathered 16-bit copy of them (dry-run,
    tiny-moe dp4 z2 ep4) and `params.unit` should exclude them.
    params.uncast: parameters autocast (ZeRO-0/1 with 16-bit compute) never casts, so no 16-bit
    copy of them is in flight: the token and position embeddings (F.embedding is not on
    autocast's lower-precision op list), the norms' weights (elementwise ops and fp32
    layer_norm), and the head, which the fused loss casts itself for its forward and its
    backward only (`head.loss_backward_bytes` counts that cast). Dry-run,
    llama3-8b-L1 tp8+sp z0: at the loss-backward peak the only 16-bit weight copies are
    the block's linears (54.5 MB) and the head's cast inside the loss (131 MB); none of
    the embedding (+10% total when every parameter was counted cast).
    """
    num_params, expert_params, unit_params = params.dense, params.expert, params.unit
    in_params = in_grads = 0.0
    # FSDP2 gathers and reduces units in the 16-bit compute dtype (bf16 under fp8 too:
    # parallel/fsdp.py's policy); fp32 runs gather fp32
    wc = compute_bytes(precision)
    # torchao's fp8 all-gather: the converted weights are gathered and kept as float8, 1 B
    less = (wc - 1.0) * (params.fp8 if params.gathered_fp8 else 0.0)
    if zero == 2 or (zero >= 3 and params.keep_gathered):
        # FSDP2 without reshard after forward: every unit stays all-gathered (compute
        # dtype) from its forward to its backward (ZeRO-3 too on a split-backward
        # pipeline, `config.fsdp_reshard_after_forward`)
        in_params = wc * (num_params + (expert_params if params.experts_in_fsdp else 0.0))
        in_params -= less
    elif zero >= 3:
        # FSDP2 all-gathers compute-dtype copies of the current and prefetched unit and
        # holds one unit's unsharded grads before the reduce-scatter.
        in_params = (wc * unit_params - (wc - 1.0) * params.gathered_fp8) * UNITS_IN_FLIGHT
        in_grads = wc * unit_params
    elif precision != "fp32":
        # autocast keeps a 16-bit cast of every matmul weight from forward to backward
        # (not of `params.uncast`); fp8-converted linears keep none (their weight is
        # re-quantized in backward). The routed experts' casts are not autocast's: made in
        # every forward and saved with each micro-batch's activations
        # (`rank_terms._expert_casts`)
        converted = params.fp8 if precision == "fp8" else 0.0
        experts = expert_params if precision == "fp8" else 0.0
        in_params = 2 * (num_params + experts - converted - params.uncast)
    return in_params, in_grads


def fp8_linear_params(model: ModelConfig, layers: int, tp: int = 1, dense: int = 0) -> float:
    """Parameters in the Float8Linears of `layers` blocks, per tp rank: q/k/v/o (MLA's
    projections, its latent ones whole on every rank) and a dense MLP, `dense` of the blocks
    being an MoE model's dense first blocks (precision/fp8.py `apply_fp8` skips the head and
    the router; MoE experts become Float8ExpertLinear, counted apart by the callers that need
    them)."""
    pc = model.param_counts()
    mlp = dense * pc.dense_mlp if model.is_moe else layers * pc.mlp
    return layers * pc.attention_per_tp(tp) + mlp / tp


@functools.lru_cache(maxsize=4096)
def stage_layer_counts(
    num_layers: int, pp: int, virtual: int = 1, schedule: str = ""
) -> tuple[int, ...]:
    """Layers held by each pipeline rank, by the trainer's own rule.

    `scaletrain.config.stage_layer_ranges` (the one balancing rule, shared with
    `parallel/pipeline.py`) splits the L layers over pp*v stages counting the embedding and the
    head as one unit each; rank r holds stages r, r+pp, ... (the interleaved assignment of
    Narayanan et al. 2021), or r and 2pp-1-r under 'dualpipev' (`time.pipeline.stage_rank`).
    The embedding lives on rank 0, the final norm and head on the last stage's rank (pp-1;
    0 under dualpipev).
    """
    from ..time.pipeline import stage_rank

    counts = [0] * pp
    for stage, layers in enumerate(stage_layer_ranges(num_layers, pp * virtual)):
        counts[stage_rank(schedule, pp, stage)] += len(layers)
    return tuple(counts)


@functools.lru_cache(maxsize=4096)
def dense_layers_on_rank(
    num_layers: int, num_dense: int, pp: int, virtual: int, rank: int, schedule: str = ""
) -> int:
    """How many of an MoE model's dense first blocks (layers 0 .. num_dense - 1, DeepSeek's
    first_k_dense_replace) pipeline rank `rank` holds: its stages (`config.stage_ids`, the
    trainer's assignment) intersected with them (`stage_layer_ranges`). DeepSeek-V3's 3 over
    pp 16: all on rank 0."""
    if not num_dense:
        return 0
    ranges = stage_layer_ranges(num_layers, pp * virtual)
    return sum(
        len(range(ranges[sid].start, min(ranges[sid].stop, num_dense)))
        for sid in stage_ids(rank, pp, virtual, schedule=schedule)
    )
