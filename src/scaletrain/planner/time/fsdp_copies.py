"""FSDP2's copies on the compute stream: what ZeRO-2/3 under `fully_shard` moves through HBM on
the stream that runs the blocks, beside the collectives themselves (comm.py). Torch-free.

Read in torch 2.13 (torch/distributed/fsdp/_fully_shard/):
- the all-gather copy-out: `FSDPParamGroup.wait_for_unshard` (_fsdp_param_group.py) calls
  `foreach_all_gather_copy_out` (_fsdp_collectives.py), which makes the current stream wait on
  the all-gather and runs `torch.ops.fsdp.split_with_sizes_copy(all_gather_output, ...,
  out=...)` on it: every unsharded parameter is copied out of the flat all-gather output into
  its own tensor, reading and writing each gathered byte once. It runs after every all-gather
  (forward, and the backward re-gather when units are resharded after forward).
- the reduce-scatter copy-in: `foreach_reduce` (_fsdp_collectives.py, called from
  `FSDPParamGroup.post_backward`) runs `foreach_reduce_scatter_copy_in` (`torch.ops.fsdp.
  chunk_cat` of the unsharded gradients into the reduce-scatter input, allocated in the reduce
  dtype) before it enters `with device_handle.stream(reduce_scatter_stream)`: on the current
  stream, reading each unsharded 16-bit gradient and writing it in the reduce dtype.
Not on the compute stream, so not charged here: the all-gather copy-in (`foreach_all_gather`
copies the shards into the all-gather input under `all_gather_copy_in_stream` for forward and
pre-backward's implicit prefetch; a 1/n shard only), the reduce-scatter's division and the
sharded gradient's accumulation (`post_reduce_stream`, the reduce-scatter stream).
Each copy is memory bound (no arithmetic): bytes / memory bandwidth, on the compute stream's
critical path (nothing overlaps it but the collectives of other units)."""

from __future__ import annotations

from scaletrain.config import fsdp_reshard_after_forward

from .comm import CommInputs

__all__ = ["fsdp2_copy_bytes"]


def fsdp2_copy_bytes(inputs: CommInputs, *, param_bytes: int, pp_unsharded: bool = False) -> float:
    """Bytes one step moves through HBM on the compute stream in FSDP2's all-gather copy-outs
    and reduce-scatter copy-ins on the busiest rank (module docstring: torch 2.13
    _fsdp_collectives.py `foreach_all_gather_copy_out`, `foreach_reduce`):
    - per all-gather, 2 x the gathered bytes (read the flat output, write the parameters):
      the FSDP-managed parameters (`CommInputs.stage_params` less the expert-parallel experts,
      which FSDP2 leaves alone) at `param_bytes` each, the fp8-gathered ones
      (`CommInputs.fp8_gather_params`) at 1 B; 2m all-gathers per step under ZeRO-3 with
      resharding after forward (m + 1 inside a pipeline), else once per reduce-scatter;
    - per reduce-scatter, the FSDP-managed parameters x (param_bytes + reduce_bytes): read the
      unsharded gradient in the parameter dtype, write it in the reduce dtype; m per step, once
      inside a pipeline (the same counts as comm._fsdp_terms).
    pp_unsharded (Recipe.pp_fsdp_unsharded, torchtitan under pp > 1: units stay gathered through
    the step and the unsharded gradients accumulate in the reduce dtype): one all-gather and one
    reduce-scatter per step, the copy-in reading the reduce-dtype accumulation.
    0 below ZeRO-2 and without data-parallel sharding (dp x cp / dp_replicate = 1: torchtitan
    applies fully_shard only when dp_shard or cp is enabled, parallelize_llama.py at 9dec370).
    Ignores: the world-size-1 path's own copy, the padding of uneven shards, the copy-out's
    chunk-cat for parameters sharded on a dim other than 0 (none in a dense block)."""
    L, m = inputs.layout, max(1, inputs.micro_batches)
    n = max(1, L.dp * L.cp // max(1, L.dp_replicate))
    if L.zero < 2 or n <= 1:
        return 0.0
    ep_experts = inputs.expert_params if L.ep > 1 else 0.0
    fsdp_params = inputs.stage_params - ep_experts
    fp8 = min(inputs.fp8_gather_params, fsdp_params)
    gathered = (fsdp_params - fp8) * param_bytes + fp8
    k_red = 1 if L.pp > 1 else m
    grad_bytes = param_bytes
    if L.pp > 1 and pp_unsharded:
        k_ag, grad_bytes = 1, inputs.reduce_bytes
    elif L.zero >= 3 and fsdp_reshard_after_forward(L):
        k_ag = m + 1 if L.pp > 1 else 2 * m
    else:
        k_ag = k_red
    copy_out = k_ag * 2.0 * gathered
    copy_in = k_red * fsdp_params * (grad_bytes + inputs.reduce_bytes)
    return copy_out + copy_in
