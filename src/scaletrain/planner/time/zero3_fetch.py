"""DeepSpeed ZeRO-3's parameter gathers and gradient reduce-scatters, as its runtime issues them.

DeepSpeed stage 3 (read at deepspeedai/DeepSpeed master, 2026) differs from FSDP's one collective
per wrapped block, which `comm._fsdp_terms` prices:
- gathers per module: `runtime/zero/partitioned_param_coordinator.py`
  PartitionedParameterCoordinator.fetch_sub_module runs in every leaf module's pre-forward hook
  (and again for the backward) and issues one `all_gather_coalesced` for the module's partitioned
  parameters, then one more for the prefetch, which stops once it holds
  `stage3_prefetch_bucket_size` elements (5e7 by default, zero/config.py): a Llama-3-70B MLP
  matrix alone is 235M, so the prefetch is the next module and each module is its own
  collective. Parameters of at most `stage3_param_persistence_threshold` elements (1e5) are
  never partitioned, each tensor judged on its own (runtime/zero/parameter_offload.py
  DeepSpeedZeRoOffload.mark_persistent_parameters: `param.ds_numel <= param_threshold`): the
  norms' weights and every bias up to 1e5 elements stay whole on every rank (a few MB for a
  dense model: h to 4h elements per tensor), so a biased Linear gathers its weight alone.
  Two gathers per module per micro-batch: the forward's, and the backward's (the module is
  released after its forward; under activation checkpointing the recompute gathers it and
  `stage3_max_reuse_distance` keeps it for its backward);
- the gradients are reduce-scattered every micro-batch in the engine's communication dtype
  (`runtime/engine.py` DeepSpeedEngine.communication_data_type: bf16 when bf16 is enabled, fp16
  under fp16, fp32 otherwise; `Recipe.bucket_elem_bytes`) from the `reduce_bucket_size` bucket
  (5e8 elements: `Recipe.bucket_elements`), one collective per full bucket
  (stage3.py reduce_independent_p_g_buckets_and_remove_grads,
  __reduce_and_partition_ipg_grads -> __avg_scatter_grads -> reduce_scatter_coalesced);
- what overlaps: the gathers run on their own stream and the reductions on another
  (overlap_comm, on by default at stage 3), but both are collectives of the same data-parallel
  process group, which NCCL runs in issue order, and only one module is prefetched ahead.
  Published measurements of eager ZeRO-3 put them on the critical path: DeepSpeed issue #1174
  (a 5B BERT's forward 480 ms under ZeRO-3 against 60 ms under ZeRO-2 on 8 A100 with NVLink,
  'bounded by the parameter gathering'), issue #5047 ('ZeRO3 launches too many all_gathers',
  one per nn.Linear, slower than FSDP), and the DeepCompile benchmark of Llama-3-70B on 32
  H100 (DeepSpeedExamples benchmarks/deepcompile, the corpus rows ds-h100-llama3-70b-*): step
  time grows with the tokens at the compute rate from an intercept of the whole step's gather
  and reduce-scatter time, so `exposure.exposed_by_family` charges these two families in full.

Counts: ring bandwidth terms ((n-1)/n x bytes / bw) of the 16-bit parameters twice and of the
gradients once per micro-batch, and one (n-1) x alpha latency per collective: per partitioned
module for the gathers, per reduce bucket for the reduce-scatters. Ignores: the copy of each
gathered flat buffer into the parameter (AllGatherCoalescedHandle.wait's torch.cat, taken only
by a module with more than one partitioned tensor) and the hooks' CPU time (charged apart as a
floor under the step, `zero3_hook_host_s`, with the host cost of issuing each gather when the
parameters are partitioned over more than one rank, `GATHER_ISSUE_HOST_S`), hpZ / qwZ / qgZ
(ZeRO++) and offload.
"""

from __future__ import annotations

import math

from scaletrain.config import ModelConfig, precision_spec

from ..recipes.schema import Recipe
from ..types import PlanInput
from .comm import axis_link

__all__ = [
    "partitioned_modules",
    "zero3_module_fetch_terms",
    "zero3_hook_host_s",
    "PERSISTENCE_THRESHOLD",
    "HOOK_HOST_S_PER_VISIT",
    "GATHER_ISSUE_HOST_S",
    "partition_world_size",
]

PERSISTENCE_THRESHOLD = 1e5
"""`stage3_param_persistence_threshold`'s default (deepspeed/runtime/zero/config.py): parameters
with fewer elements stay whole on every rank and are never gathered."""


HOOK_HOST_S_PER_VISIT = 0.1042 / (2 * 51)
"""Host seconds ZeRO-3's runtime spends per partitioned module per pass (forward, backward or
recompute), from a published run that isolates it: DeepSpeedExamples training/bf16_master_weight
README.md (read at 516082c65853d48b50850a05782267f36bcdc170), '1-GPU Results', 'Baseline (fp32
master)': 0.1042 s per step of train.py's 254M SimpleTransformerModel (12 blocks, hidden 1024,
batch 4 x seq 512, ZeRO-3, bf16, one H100). On one GPU nothing crosses a link and the step's
device work is about a tenth of that (6 x 254M x 2048 tokens = 3.1 TFLOP, a few ms at H100
rates), so the step is the host's: DeepSpeed's hooks on every module (runtime/zero/
parameter_offload.py DeepSpeedZeRoOffload._register_hooks_recursively: pre/post forward hooks
and the backward hooks on module outputs; partitioned_param_coordinator.py
PartitionedParameterCoordinator.fetch_sub_module / release_sub_module: trace bookkeeping,
all_gather_coalesced launch, prefetch decisions, per call) and the per-parameter gradient hooks
(stage3.py reduce_independent_p_g_buckets_and_remove_grads). Divided by that model's 2 x 51
partitioned-module visits (`partitioned_modules`: 12 x 4 linears + token and position tables +
head; forward and backward), it also carries the parameterless modules' hooks (GELU, the
containers: 8 hooked modules per block of that model against 4 partitioned) and the ZeRO-3
optimizer step's host work, in that model's proportion. The calibration row is in the corpus as
ds-h100-simple-254m-zero3-1g (tuned on). A 2025 x86 host under DeepSpeed of 2025; older hosts and
DeepSpeed versions (the 2021-22 V100 rows) are charged the same."""


GATHER_ISSUE_HOST_S = (0.1189 - 0.1042) / (2 * 51)
"""Host seconds ZeRO-3's runtime adds per parameter gather when the parameters are partitioned
over more than one rank: issuing the collective that a one-rank run never issues.
runtime/zero/partition_parameters.py (deepspeedai/DeepSpeed, read at edaa7221, 2026-08-22)
Init._convert_to_deepspeed_param's all_gather_coalesced returns `_no_gather_coalesced(params)`
(a status flip per parameter, no buffer, no collective) when every parameter's partition world
size is 1; over n > 1 ranks each gather sorts the module's parameters by process group,
allocates the flat output buffer, launches the NCCL all-gather through torch.distributed and
returns a handle, whose wait() in PartitionedParameterCoordinator.fetch_sub_module is followed
by a fetch event recorded and polled (partitioned_param_coordinator.py). The one-GPU
calibration of `HOOK_HOST_S_PER_VISIT` therefore holds none of it. Figure: the same source as
that constant, DeepSpeedExamples training/bf16_master_weight/README.md (read at
516082c65853d48b50850a05782267f36bcdc170), 'Baseline (fp32 master)' rows of the 254M
SimpleTransformerModel at the same batch per GPU (4 x 512, no activation checkpointing): 0.1189
s per step on 4 H100 against 0.1042 s on one. Both runs are host-bound (the device's terms are
a tenth of the step, `zero3_hook_host_s`), so the 14.7 ms between them is the 4-rank run's host
work, over its 2 x 51 gathers (`partitioned_modules`: the forward's and the backward's). It
also carries, in that run's proportion, the other host work that grows with the rank count (the
reduce-scatter's interleave of every gradient into world-size chunks, runtime/comm/
coalesced_collectives.py reduce_scatter_coalesced) and the 4-rank run's device-side
collective time when it stalls the host (the fetch events' synchronize). Calibration rows:
ds-h100-simple-254m-zero3-dp4 and -1g (tuned on). Charged per gather, at any n > 1 (a larger n
slices more chunks per gradient: not modelled)."""


def partition_world_size(plan: PlanInput) -> int:
    """Ranks ZeRO-3 partitions each parameter over: the data-parallel shard group (dp x cp over
    the replicas of hybrid sharding), as the gathers of `zero3_module_fetch_terms` span."""
    L = plan.layout
    return max(1, (L.dp * L.cp) // max(1, L.dp_replicate))


def zero3_hook_host_s(plan: PlanInput) -> float:
    """Host seconds per step of ZeRO-3's module hooks (`HOOK_HOST_S_PER_VISIT` per partitioned
    module per pass): the forward and the backward visit every partitioned module once per
    micro-batch, full activation checkpointing's recompute visits the blocks' modules once more
    (its forward hooks fetch again). The step cannot be shorter: the device runs no kernel before
    the host issues it. `step_time` takes this as a floor under the device-side step (max, not
    sum: the hooks do not synchronize the device, so the host runs ahead while the device is the
    slower; runs with thousands of tokens per GPU stay device-bound and unchanged). Counts
    partitioned modules (`partitioned_modules`) at the default persistence threshold; ignores
    which hooked modules an implementation adds beyond those (folded into the constant in the
    calibration model's proportion) and the host CPU's speed. Over more than one rank
    (`partition_world_size`) each of the two gathers per partitioned module per micro-batch
    (the forward's and the backward's or recompute's, as `zero3_module_fetch_terms` counts)
    adds `GATHER_ISSUE_HOST_S`: the collective a one-rank run skips."""
    model = plan.model
    m = max(1, plan.grad_accum)
    blocks = partitioned_modules(model, model.num_layers, embedding=False, head=False)
    modules = partitioned_modules(model, model.num_layers, embedding=True, head=True)
    ends = modules - blocks
    block_passes = 3 if plan.ac == "full" else 2
    hooks = m * (block_passes * blocks + 2 * ends) * HOOK_HOST_S_PER_VISIT
    if partition_world_size(plan) <= 1:
        return hooks
    return hooks + 2 * m * modules * GATHER_ISSUE_HOST_S


def partitioned_modules(model: ModelConfig, layers: int, *, embedding: bool, head: bool) -> int:
    """Leaf modules whose weight DeepSpeed partitions (gathered one collective each): per block
    the attention's linears (the GPT-2 family's fused QKV and output projection, 2; the Llama
    family's separate q, k, v and o, 4: the Hugging Face definitions) and the MLP's (2, or 3
    gated), the router and every expert's under MoE; the token embedding, a learned position
    table and an untied head once. Norm weights (h elements) persist below the threshold."""
    attn = 2 if model.norm == "layernorm" else 4
    mats = 3 if model.gated_mlp else 2
    if model.is_moe:
        mlp = 1 + model.num_experts * mats + (mats if model.num_shared_experts else 0)
    else:
        mlp = mats
    out = layers * (attn + mlp)  # the norms' h-element weights: below PERSISTENCE_THRESHOLD
    if embedding:
        out += 1 + (1 if model.position == "learned" else 0)
    if head and not model.tie_embeddings:
        out += 1
    return out


def zero3_module_fetch_terms(
    plan: PlanInput, recipe: Recipe, stage_params: float, gpus_per_node: int | None
) -> dict[str, tuple[float, float]]:
    """(bytes moved per rank, seconds) per step of `zero3_param_gather` (two gathers per module
    per micro-batch) and `zero3_grad_reduce_scatter` (one per reduce bucket per micro-batch)
    for a rank holding `stage_params` parameters (module docstring)."""
    L, hw, model = plan.layout, plan.hardware, plan.model
    m = max(1, plan.grad_accum)
    bw, lat, _ = axis_link(L, hw, "dp", gpus_per_node)
    n = partition_world_size(plan)
    if n <= 1:
        return {}
    spec = precision_spec(plan.precision)
    wb = 2.0 if spec.mixed else float(spec.compute_bytes)
    rb = recipe.bucket_elem_bytes if spec.mixed else float(spec.compute_bytes)
    modules = partitioned_modules(model, model.num_layers, embedding=True, head=True)
    ring = (n - 1) / n
    gather_bytes = ring * stage_params * wb
    gather_s = gather_bytes / bw + modules * (n - 1) * lat
    buckets = max(1, math.ceil(stage_params / max(1.0, recipe.bucket_elements)))
    reduce_bytes = ring * stage_params * rb
    reduce_s = reduce_bytes / bw + buckets * (n - 1) * lat
    return {
        "zero3_param_gather": (2 * m * gather_bytes, 2 * m * gather_s),
        "zero3_grad_reduce_scatter": (m * reduce_bytes, m * reduce_s),
    }
