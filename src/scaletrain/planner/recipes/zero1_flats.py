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

__all__ = ["Zero1Flats", "largest_freed_tensor", "zero1_flats"]


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


def zero1_flats(plan: PlanInput, recipe: Recipe, params: float, head: bool) -> Zero1Flats:
    """The post-backward copies and new segments of a rank holding `params` parameters (module
    docstring); `head`: the rank holds the head and the loss."""
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
    step = [_alloc(part * wb, free, big, new)]
    if recipe.step_grad_fp32_copy:
        step.append(_alloc(part * 4.0, free, big, new))
    free += [b for b in step if b is not None]  # freed before the all-gather
    for g in gather:
        _alloc(g, free, big, new)
    return Zero1Flats(
        reduce_flats=reduce, gather_flats=gather, largest_freed=big, segments=sum(new)
    )
