"""DeepSpeed 0.4's ZeRO-1 after the backward: bucket flats, all-gather copies, new segments.

Read at DeepSpeed's big-science branch (c7f3bc51c, 2021-08-30, version.txt 0.4.2: what the
BigScience 1B3 benchmarks ran, bigscience jz/envs/README.md at 8d58bc5) with torch's c10d and
caching allocator of that year (torch/lib/c10d/ProcessGroupNCCL.cpp,
c10/cuda/CUDACachingAllocator.cpp):

- engine.py `_configure_zero_optimizer`: at stage 1 overlap_comm and contiguous_gradients are
  forced off, so `FP16_DeepSpeedZeroOptimizer` (zero/stage2.py) keeps no ipg buffer during the
  backward; the model's own 16-bit .grad accumulate the micro-batches.
- pipe/engine.py `_exec_reduce_grads` (after the batch's last backward) -> stage2.py
  `reduce_gradients` -> `reduce_independent_p_g_buckets_and_remove_grads` -> `reduce_ipg_grads`
  -> `buffered_reduce_fallback` -> `allreduce_and_copy` -> `allreduce_bucket`:
  `self.flatten(bucket)`, a new 16-bit tensor per bucket of at most reduce_bucket_size (5e8)
  elements, at any dp (dp = 1 too).
- ProcessGroupNCCL `collective` records its input on the NCCL stream (recordStream) and a
  synchronous all_reduce's wait() only makes the current stream wait (blockingWait_ off by
  default); nothing in reduce_gradients waits for the GPU, so the host flattens the next bucket
  while the NCCL stream still reduces the previous one, and the caching allocator does not hand
  out a freed block before its recorded stream's work is done: a rank's bucket copies are alive
  together.
- stage2.py `step`: `has_overflow` reads overflow_gpu[0].item() (the host waits: the bucket
  copies are free again); the partition's gradients are flattened (16-bit) and cast to fp32;
  after the optimizer step the updated partition is all-gathered in num_shards = max(1,
  partition x dp // allgather_bucket_size) calls of dist.all_gather into a list of dp views.
  ProcessGroupNCCL `allgather` flattens that list (`flatten_for_scatter_gather` -> `newLikeFlat`:
  a new dp x shard tensor) and records it on the NCCL stream: the shards' copies are alive
  together, P_rank x 2 B in all.
- CUDACachingAllocator (the file's header): a request takes the smallest cached free block that
  fits, else cudaMalloc; segments are never merged; cached memory returns to the driver only
  when a cudaMalloc fails or on empty_cache. A copy larger than every block freed before it is
  therefore a new segment, reserved for the rest of the run even though the allocated peak may
  lie elsewhere (nvidia-smi sees it).

The step's slice checks (Recipe.zero_step_check_copies, every DeepSpeed ZeRO-1/2 version read:
c7f3bc51c, 2151c787a, 38327e07f): before the flat, `step` -> `check_overflow` casts each
gradient slice of the rank's dp partition to fp32 (`_has_inf_or_nan`: x.float()) and
`get_grad_norm_direct` takes each slice's norm on an fp64 copy (g.data.double()); each copy is
freed before the next, so the largest slice sets the blocks. Under today's DeepSpeed (a
persistent ipg bucket, no cached copy free before the step) they and the partition's flat are
replayed alone (`step_segments`); under 0.4 between the reduction's freed copies and the step's
flat (`zero1_flats`).

Counts (bytes, one rank): the reduction phase's copies, the step's all-gather copies, and the
new segments they add to the reservation (a best-fit replay: the reduction's copies, then the
step's 16-bit flat and fp32 copy of the partition, then the all-gather copies). A copy finds a
cached block when the backward freed a tensor at least as large: the largest of one layer's
attention scores (Megatron's naive core attention, mb x heads/tp x s x s), its MLP
intermediate (T x ffn/tp) and, on the head's rank, the 16-bit logits (T x V/tp).
Ignores: how many blocks of that size the cache holds (any number is assumed: an under-count at
large micro-batches, where the freed blocks are few but large), Megatron's second
(no-weight-decay) parameter group (biases and norms, < 0.1% of a GPT's parameters),
DeepSpeed's alignment padding, context parallelism (DeepSpeed 0.4 has none). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..types import PlanInput
from .schema import Recipe

__all__ = [
    "Zero1Flats",
    "largest_freed_tensor",
    "step_check_copies",
    "step_segments",
    "zero1_flats",
]


@dataclass(frozen=True, slots=True)
class Zero1Flats:
    """The post-backward copies of one rank under DeepSpeed 0.4's ZeRO-1 (bytes)."""

    reduce_flats: tuple[float, ...]
    """One 16-bit copy per gradient bucket, alive together during the reduction."""
    gather_flats: tuple[float, ...]
    """One dp x shard copy per all-gather call of the step, alive together."""
    largest_freed: float
    """The largest activation tensor the backward freed (what a cached block can hold)."""
    segments: float
    """New caching-allocator segments the copies add to the reservation."""


def largest_freed_tensor(plan: PlanInput, recipe: Recipe, head: bool) -> float:
    """The largest single tensor a rank's backward frees: one layer's attention scores under
    Megatron's naive core attention (megatron/model/transformer.py ParallelAttention: baddbmm
    into an (mb x heads/tp, s, s) 16-bit buffer; its softmax and dropout outputs the same size),
    its MLP intermediate (T x ffn/tp) and, on the head's rank, the 16-bit logits (T x V/tp, cast
    to fp32 by GPTModelPipe's float16_to_fp32 and freed)."""
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    tok = float(plan.seq_len) * plan.micro_batch
    sizes = [tok * m.ffn_dim / L.tp * e]
    if recipe.attention == "naive":
        sizes.append(plan.micro_batch * m.num_heads / L.tp * float(plan.seq_len) ** 2 * e)
    if head:
        sizes.append(tok * m.vocab_size / L.tp * e)
    return max(sizes)


def step_check_copies(
    plan: PlanInput, largest_param: float, group_params: float
) -> tuple[float, ...]:
    """The ZeRO-1/2 step's copies of its largest gradient slice (bytes, in order), one slice at
    a time (Recipe.zero_step_check_copies): `has_overflow_partitioned_grads_serial` ->
    `_has_inf_or_nan` casts each slice of the rank's dp partition to fp32 (x.float(): 4 B per
    element, no copy under fp32), then `get_grad_norm_direct` takes each slice's norm on an fp64
    copy (g.data.double(): 8 B). Read at microsoft/DeepSpeed 2151c787a (the default branch on
    2022-02-25, version.txt 0.6.0, which BigScience's 176B topology search ran: bigscience
    jz/envs/README.md b2a790a 'switch to deepspeed@master'), big-science c7f3bc51c (0.4.2) and
    the default branch today (38327e07f, torch.linalg.vector_norm(g.data.double())): all three
    deepspeed/runtime/zero/stage_1_and_2.py (stage2.py) `step` check the slices so.
    BF16_Optimizer's norm (runtime/utils.py get_global_norm_of_tensors on the fp32 partition)
    copies nothing. The largest slice is the rank's largest parameter, at most the partition
    of its ZeRO group (`group_params` / dp shards; the rank's parameters unless the framework
    splits its groups, Recipe.wd_group_halved): the embedding on the first and the head's rank
    (Megatron puts the word embedding first in the weight-decay group, so dp rank 0's
    partition starts with it).
    Ignores: the bool masks of today's check (1 B per element, freed before the norm)."""
    piece = min(largest_param, group_params / plan.layout.zero_shards)
    cast = () if plan.precision == "fp32" else (4.0 * piece,)
    return (*cast, 8.0 * piece)


def step_segments(
    plan: PlanInput, recipe: Recipe, params: float, head: bool, checks: tuple[float, ...]
) -> float:
    """New segments of the step's temporaries of a rank holding `params` parameters under a
    ZeRO-1/2 optimizer that reduces through a persistent bucket (today's DeepSpeed: no cached
    copy is free before the step): the slice copies `checks` one at a time
    (`step_check_copies`), then the partition's 16-bit flat and its fp32 copy, alive together
    (stage_1_and_2.py `step`: flatten(averaged_gradients).to(fp32)); replayed best-fit against
    the backward's largest freed tensor (module docstring). Ignores: that the step flattens
    group by group (one flat per ZeRO group, its fp32 copy kept): the rank's whole partition is
    taken as one flat, an over-count of the 16-bit flat when a framework splits its groups."""
    wb = 4.0 if plan.precision == "fp32" else recipe.weight_bytes
    part = params / plan.layout.zero_shards
    big = largest_freed_tensor(plan, recipe, head)
    new: list[float] = []
    free: list[float] = []
    _one_at_a_time(checks, free, big, new)
    _alloc(part * wb, free, big, new)
    if recipe.step_grad_fp32_copy:
        _alloc(part * 4.0, free, big, new)
    return sum(new)


def _one_at_a_time(
    sizes: tuple[float, ...], free: list[float], big: float, new: list[float]
) -> None:
    """Replay copies that are each freed before the next: a block taken or newly allocated
    goes back to the cache (`free`) for the next copy."""
    for size in sizes:
        block = _alloc(size, free, big, new)
        if block is not None:
            free.append(block)


def _alloc(size: float, free: list[float], big: float, new: list[float]) -> float | None:
    """Best fit: the smallest cached copy block >= `size` (taken and returned), else a block
    the backward freed when `size` <= `big` (None), else a new segment of `size`."""
    fits = [s for s in free if s >= size]
    if fits:
        block = min(fits)
        free.remove(block)
        return block
    if size <= big:
        return None
    new.append(size)
    return size


def zero1_flats(
    plan: PlanInput, recipe: Recipe, params: float, head: bool, checks: tuple[float, ...] = ()
) -> Zero1Flats:
    """The post-backward copies and new segments of a rank holding `params` parameters (module
    docstring); `head`: the rank holds the head and the loss; `checks`: the step's slice
    copies before its flat (`step_check_copies`), one at a time."""
    n = plan.layout.zero_shards
    wb = 4.0 if plan.precision == "fp32" else recipe.weight_bytes
    bucket = recipe.bucket_elements
    full, rest = divmod(params, bucket)
    reduce = (bucket * wb,) * int(full) + ((rest * wb,) if rest else ())
    part = params / n
    shards = max(1, int(part * n // bucket))
    gather = (n * part / shards * wb,) * shards
    big = largest_freed_tensor(plan, recipe, head)
    new: list[float] = []
    held = [_alloc(b, [], big, new) for b in reduce]
    free = [b for b in held if b is not None]  # the step's .item() waited: free again
    _one_at_a_time(checks, free, big, new)  # one slice at a time
    step = [_alloc(part * wb, free, big, new)]
    if recipe.step_grad_fp32_copy:
        step.append(_alloc(part * 4.0, free, big, new))
    free += [b for b in step if b is not None]  # freed before the all-gather
    for g in gather:
        _alloc(g, free, big, new)
    return Zero1Flats(
        reduce_flats=reduce, gather_flats=gather, largest_freed=big, segments=sum(new)
    )
