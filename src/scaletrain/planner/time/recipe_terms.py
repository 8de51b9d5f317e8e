"""Time terms a framework recipe adds to the shared step-time model (step_time.step_time), each
switched on by a `Recipe` field and read off the framework's source. Torch-free.

- `recipe_comm`: the data-parallel families as the recipe's framework runs them (DDP buckets,
  ZeRO-1's reduce-scatter or all-reduce + weight all-gather, DeepSpeed's ZeRO-3 fetches and
  BF16_Optimizer's all-reduce, `_BF16_OPTIMIZER_COMM`), and the all-reduce of a tied
  embedding's gradient across pipeline stages (Nanotron, DeepSpeed's BF16_Optimizer);
- `recipe_exposed`: the exposed seconds of the families a framework runs its own way, which
  step_time charges as given instead of exposure.exposed_by_family's rules;
- `async_tp_terms` (Recipe.tp_comm 'async_linears'): tensor parallelism as Nanotron's
  REDUCE_SCATTER-mode linears with tp_linear_async_communication run it, the all-gathers its
  column linears hide behind their GEMMs and the reduce-scatters its row linears leave exposed.
- `grad_accum_pass_s` (Recipe.grad_accum_pass_bytes): the fp32 gradient-accumulation pass after
  every micro-batch's backward.
- `post_backward_s` (Recipe.post_backward_pass_bytes, master_copy_bytes,
  zero1_gather_flat_copies): the memory-bound passes between the gradient sync and the next step.
- `zero1_gather_host_s` (Recipe.zero1_gather_host_copies): the host time of ZeRO-1's weight
  all-gather, assembled and copied back one (dp rank, parameter tensor) pair at a time, beyond
  the GPU work queued after the backward.

Sources are Nanotron at c252843 (the commit of its v0.5 benchmarks, the Ultra-Scale Playbook's
runs): src/nanotron/parallel/tensor_parallel/functional.py, optim/gradient_accumulator.py,
optim/clip_grads.py, optim/zero.py, trainer.py, parallel/tied_parameters.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.config import precision_spec

from ..recipes.memory import bf16_optimizer_runs
from ..recipes.schema import Recipe
from ..types import PlanInput
from .comm import (
    Link,
    allreduce_seconds,
    allreduce_time,
    axis_link,
    dp_allreduce_latency,
    gather_time,
)
from .cp_ring import torch_ring_terms
from .zero3_fetch import zero3_module_fetch_terms

__all__ = [
    "AsyncTP",
    "async_tp_terms",
    "grad_accum_pass_s",
    "post_backward_s",
    "recipe_comm",
    "recipe_exposed",
    "stage_param_tensors",
    "zero1_gather_host_s",
    "COPY_CALL_S",
    "CXX_OP_S",
    "VIEW_CALL_S",
]

COPY_CALL_S = 10e-6
"""Host seconds of one eager `Tensor.copy_` between small CUDA tensors, issued from Python:
the dispatcher and the kernel launch, fully exposed when the GPU has nothing queued.
pytorch/pytorch issue #37048 ('copy_ slowness', 2020-04-22): 100,000 calls of
torch.addmm(a, b, c) on 100 x 100 CUDA tensors take 2.578 s with the copy_ and
torch.addmm(a, b, c, out=a) 1.502 s without (10.8 us per call; the out=out pair 8.6 us);
ngimel there: 'The difference per call is ~10 us which can be explained by fully exposed
overheads and cuda launch latency'. Her ~10 us is taken."""

VIEW_CALL_S = 2e-6
"""Host seconds of one simple eager tensor op that launches no kernel (a slice view):
pytorch/pytorch issue #41383 (2020-07-14), ngimel: 'benchmarking x*x with
requires_grad=False is approx 2 us. Approx half of it is python parsing overhead'."""

CXX_OP_S = VIEW_CALL_S / 2
"""Host seconds of one tensor op issued from C++ (no Python frame to parse): the half of
VIEW_CALL_S that ngimel's 'approx half of it is python parsing overhead' (pytorch/pytorch
issue #41383) leaves to the dispatcher and the op itself. Charged for the views ATen's
flatten_dense_tensors / unflatten_dense_tensors make per tensor (`zero1_gather_host_s`)."""


_BF16_OPTIMIZER_COMM = (
    "DeepSpeed's BF16_Optimizer, read at microsoft/DeepSpeed ab61edb02 (2022-03-09, the "
    "olruwase/bf16-updates commit BigScience's chronicles-prequel.md names) and at 38327e07f "
    "(2025-02-21): the gradient sync is runtime/engine.py buffered_allreduce_fallback over "
    "BF16_Optimizer.get_grads_for_reduction, the whole fp32 flat gradient buffer of each param "
    "group (fp32_groups_gradients_flat; non_expert_gradients at 38327e07f), "
    "allreduce_no_retain -> allreduce_bucket: cast to communication_data_type (bf16 when bf16 "
    "is on and the config sets none) and one dist.all_reduce over the data-parallel group, "
    "not a reduce-scatter; it runs once per step after the last micro-batch's backward "
    "(pipe/engine.py _exec_reduce_grads -> _bf16_reduce_grads at the schedule's ReduceGrads, "
    "pipe/schedule.py TrainSchedule: ReduceTiedGrads, ReduceGrads, OptimizerStep after the last "
    "step; without a pipeline engine.py allreduce_gradients at the accumulation boundary, "
    "after loss.backward()), so no backward is left to hide it. pipe/engine.py "
    "_exec_reduce_tied_grads all-reduces the tied weights' weight._hp_grad (fp32, no cast) "
    "over each tied group (the first and last stage). BF16_Optimizer.step: the global norm of "
    "the fp32 gradients (get_global_norm_of_tensors: one fp32 scalar all-reduced over the "
    "model-parallel group), clip_tensors_by_global_norm in place, the optimizer on the fp32 "
    "partition, then update_lp_params copies it into the bf16 partition and "
    "all_gather_dp_groups all-gathers the bf16 weights over dp, inside step()."
)
"""Where `recipe_comm` / `recipe_exposed` take BF16_Optimizer's communication from. Ignored:
the norm's scalar all-reduce (latency only), the clip's and the casts' memory passes over the
fp32 buffer (read 4 + write 2 B per element for the cast, the reverse after, 12 B for the
clip: tens of ms at 3.7e9 parameters on 2 TB/s), the all-reduce's split per param group (one
latency term charged)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class AsyncTP:
    """One step's tensor-parallel communication on the busiest rank (`async_tp_terms`)."""

    bytes: float
    """Bytes this rank's collectives move ((tp-1)/tp of each all-gathered or reduce-scattered
    activation, 2(tp-1)/tp of the loss's all-reduced per-token values)."""
    seconds: float
    """Every collective's alpha-beta time, overlapped or not."""
    exposed: float
    """What no GEMM hides: the critical-path share of `seconds`."""


def _linear_exposed(
    g: float, *, fwd_shard: float, dgrad: float, wgrad: float, row: bool
) -> tuple[float, float]:
    """(forward, backward) exposed seconds of one async TP linear whose all-gather or
    reduce-scatter takes g seconds (functional.py, c252843):
    - column (_ColumnLinearAsyncCommunication): forward all-gathers its sequence-sharded input
      while it multiplies the shard it holds (fwd_shard: 1/tp of the GEMM), exposed
      max(0, g - fwd_shard); backward all-gathers the input again (tp_recompute_allgather)
      under the input-gradient GEMM (dgrad) and reduce-scatters that gradient under the weight
      gradient GEMM (wgrad): max(0, g - dgrad) + max(0, g - wgrad);
    - row (_RowLinearAsyncCommunication): forward reduce-scatters its output after the GEMM
      (differentiable_reduce_scatter_sum, synchronous): g; backward all-gathers the output
      gradient while it multiplies the shard it holds (1/tp of dgrad): max(0, g - dgrad/tp)."""
    if row:
        return g, max(0.0, g - fwd_shard)
    return max(0.0, g - fwd_shard), max(0.0, g - dgrad) + max(0.0, g - wgrad)


def async_tp_terms(
    plan: PlanInput,
    *,
    link: Link,
    rate: float,
    layers: int,
    m: int,
    recompute: bool,
) -> AsyncTP:
    """Tensor parallelism of one step under Nanotron's async REDUCE_SCATTER linears, dense
    blocks (`_linear_exposed` per linear) on the busiest rank: `layers` blocks, `m`
    micro-batches of T = seq x micro_batch tokens, GEMMs at `rate` FLOP/s, each all-gather or
    reduce-scatter of the e x T x h activation over the tp link (comm.gather_time).

    Per block: two column linears (qkv, N = q + 2 kv; gate_up, N = 2f gated else f) and two
    row linears (o_proj, K = q; down_proj, K = f); a column GEMM's forward shard is
    2 (T/tp) h (N/tp), its dgrad and wgrad 2 T h (N/tp) each; a row GEMM is 2 T h (K/tp), its
    forward shard window is its dgrad's 1/tp. Under full recompute (recompute_layer) the
    forward's collectives run again in backward. Embedding (TensorParallelEmbedding in
    REDUCE_SCATTER mode: reduce-scatter forward, all-gather backward, both exposed) and head
    (a column linear over V/tp, the vocab-parallel loss's three all-reduces of T fp32 values)
    are counted on one rank at pp > 1 (the larger), both at pp = 1.
    Ignores: the SMs the overlapped NCCL kernels take from the GEMMs, the GEMMs' split into
    before/own/after shards (smaller M), MoE blocks (dense only; callers keep comm._tp_term
    for MoE)."""
    L, model = plan.layout, plan.model
    tp = L.tp
    bw, lat, _ = link
    e = plan.compute_bytes
    T = float(plan.seq_len) * plan.micro_batch / L.cp
    h = model.dim
    g = gather_time(e * T * h, tp, bw, lat)
    moved_one = (tp - 1) / tp * e * T * h

    def gemm(k: float, n: float) -> float:  # one T x k by k x n GEMM, per tp rank
        return 2.0 * T * k * n / tp / rate

    f_in = 2 * model.ffn_dim if model.gated_mlp else model.ffn_dim
    fwd = bwd = 0.0
    for n_out in (model.q_dim + 2 * model.kv_dim, f_in):  # column linears
        full = gemm(h, n_out)
        a, b = _linear_exposed(g, fwd_shard=full / tp, dgrad=full, wgrad=full, row=False)
        fwd, bwd = fwd + a, bwd + b
    for k_in in (model.q_dim, model.ffn_dim):  # row linears
        full = gemm(k_in, h)
        a, b = _linear_exposed(g, fwd_shard=full / tp, dgrad=full, wgrad=full, row=True)
        fwd, bwd = fwd + a, bwd + b
    rc = 1 if recompute else 0
    per_block_exposed = fwd * (1 + rc) + bwd
    per_block_colls = 10 + 4 * rc  # fwd 2 AG + 2 RS; bwd 2 AG (recompute) + 2 RS + 2 AG

    head = gemm(h, model.vocab_size)
    head_fwd, head_bwd = _linear_exposed(g, fwd_shard=head / tp, dgrad=head, wgrad=head, row=False)
    loss_ar = 3 * allreduce_time(4.0 * T, tp, bw, lat)
    loss_moved = 3 * 2 * (tp - 1) / tp * 4.0 * T
    # (exposed, seconds, bytes) of each end of the model, per micro-batch
    embedding = (2 * g, 2 * g, 2 * moved_one)
    out_head = (head_fwd + head_bwd + loss_ar, 3 * g + loss_ar, 3 * moved_one + loss_moved)
    if L.pp > 1:  # rank 0 holds the embedding, rank pp-1 the head
        ends = max(embedding, out_head)
    else:
        ends = (embedding[0] + out_head[0], embedding[1] + out_head[1], embedding[2] + out_head[2])
    exposed = m * (layers * per_block_exposed + ends[0])
    seconds = m * (layers * per_block_colls * g + ends[1])
    moved = m * (layers * per_block_colls * moved_one + ends[2])
    return AsyncTP(bytes=moved, seconds=seconds, exposed=exposed)


def grad_accum_pass_s(plan: PlanInput, bytes_per_param: float, params: float) -> float:
    """Seconds per micro-batch of the pass that adds each parameter's 16-bit .grad into its
    fp32 accumulation buffer once the backward has run (FP32GradientAccumulator.backward ->
    _accumulate_grad: fp32_grad.add_(half_param.grad), then half_param.grad = None;
    PipelineEngine.backward calls it every micro-batch, on every pipeline rank): bytes_per_param
    x params over memory bandwidth, memory bound (1 add per 10 bytes). Ignores: the per-tensor
    launch cost (one add per parameter tensor)."""
    return bytes_per_param * params / plan.hardware.memory_bw


def post_backward_s(
    plan: PlanInput,
    *,
    params: float,
    all_params_bytes: float,
    updated_bytes: float,
    zero1_flat_copies: bool,
) -> float:
    """Seconds of the memory-bound passes a step makes outside the backward and the optimizer
    kernel (trainer.py DistributedTrainer.training_step, c252843), over memory bandwidth:
    - `all_params_bytes` per parameter of the rank: clip_grad_norm (optim/clip_grads.py) reads
      every fp32 gradient buffer for the norms (4) and scales it in place (4 + 4) — all of them
      under ZeRO-1 ('In case of Zero1, we need to clip all fp32 grads') — and zero_grad zeroes
      the contiguous fp32 buffer (4);
    - `updated_bytes` per parameter this rank updates (its 1/dp shard under ZeRO-1): the fp32 ->
      16-bit weight copy of gradient_accumulator.step (read 4, write 2); for llm-foundry the
      unfused optimizer and the sharded gradient clipping (Recipe.optimizer_pass_bytes);
    - ZeRO-1's all-gather through flat buffers (optim/zero.py _all_gather_params ->
      distributed.all_gather_coalesced): each gathered 16-bit weight unflattened and copied
      back into its parameter (read 2, write 2 per parameter), when `zero1_flat_copies`.
    Ignores: the norms' all-reduce over the model-parallel group (one fp32 scalar); the host
    side of ZeRO-1's gather, which slices every parameter once per dp rank and copies every
    gathered slice back with its own copy_ (`zero1_gather_host_s`, charged by step_time)."""
    L = plan.layout
    shard = params / L.zero_shards if L.zero else params
    moved = all_params_bytes * params + updated_bytes * shard
    if zero1_flat_copies and L.zero == 1 and L.dp > 1:
        moved += 4.0 * params
    return moved / plan.hardware.memory_bw


def stage_param_tensors(plan: PlanInput, layers: int) -> int:
    """Parameter tensors of a rank holding `layers` decoder blocks of a dense Nanotron Llama
    (src/nanotron/models/llama.py, c252843): per block input_layernorm, qkv_proj (fused
    q, k, v), o_proj, post_attention_layernorm, gate_up_proj (fused), down_proj, all without
    bias: 6; at pp = 1 the embedding, the final norm and the lm_head (one tensor less when
    tied, the optimizer getting get_named_params_with_correct_tied); at pp > 1 the larger end,
    the last stage's final norm and lm_head (2). Ignores: MoE experts (dense blocks only)."""
    ends = (3 - (1 if plan.model.tie_embeddings else 0)) if plan.layout.pp == 1 else 2
    return 6 * layers + ends


def zero1_gather_host_s(plan: PlanInput, recipe: Recipe, *, tensors: int, hidden_s: float) -> float:
    """Host seconds of ZeRO-1's weight all-gather that the GPU does not hide, under
    Recipe.zero1_gather_host_copies (Nanotron c252843), n the ZeRO group (dp x cp), T =
    `tensors` the rank's parameter tensors:
    - optim/zero.py ZeroDistributedOptimizer._all_gather_params builds output_tensor_lists with
      one `tensor[slice(...)]` per (parameter, dp rank) and input_tensor_list with one per
      parameter, in Python comprehensions: (n + 1) x T views (VIEW_CALL_S);
    - src/nanotron/distributed.py all_gather_coalesced flattens the input list and each dp
      rank's output list with torch._utils._flatten_dense_tensors (torch._C._nn.
      flatten_dense_tensors: ATen's flatten_dense_tensors, `t.contiguous().view({-1})` per
      tensor, then one at::cat): (n + 1) x T views from C++ (CXX_OP_S) and n + 1 cat calls
      (COPY_CALL_S: a Python call and a kernel launch each);
    - its update_output unflattens every dp rank's gathered buffer
      (torch._utils._unflatten_dense_tensors -> ATen's unflatten_dense_tensors,
      `flat.narrow(0, offset, numel).view(tensor.sizes())` per tensor: 2 n x T views from C++,
      CXX_OP_S) and copies each slice back with its own `original_buffer.copy_(gathered_buffer)`:
      n x T copies (COPY_CALL_S).
    ATen's flatten / unflatten read at pytorch/pytorch torch/csrc/utils/tensor_flatten.h
    (115c8d5) and aten/src/ATen/native/TensorShape.cpp (at::native, same per-tensor ops).
    The GPU runs the work the host launched after the backward (`hidden_s`: the gradient
    all-reduce, the tied sync, the optimizer and its passes, the gather itself) while the host
    builds the lists and launches the copies, so max(0, host - hidden_s) is charged.
    Counts: the host ops that grow with dp x tensors. Ignores: the host's lead over the GPU
    when the backward ends (hides more), the tail's other host work (clip_grad_norm's two
    launches per parameter and FP32GradientAccumulator.step's copy per parameter, the Python
    loops' own iteration, all_gather_coalesced's device and dtype asserts on each of the n x T
    outputs: expose more), empty slices' cheaper copies, and any difference between the runs'
    host CPU and the issues'. 0 unless the recipe says so, at ZeRO-1 with n > 1."""
    L = plan.layout
    n = L.dp * L.cp
    if L.zero:
        n = max(1, n // max(1, L.dp_replicate))
    if not recipe.zero1_gather_host_copies or L.zero != 1 or n <= 1 or plan.hardware.is_cpu:
        return 0.0
    py_views = (n + 1) * tensors * VIEW_CALL_S  # the output lists' and the input's slices
    copies = n * tensors * COPY_CALL_S  # update_output's copy_ per (dp rank, tensor)
    cxx_views = ((n + 1) * tensors + 2 * n * tensors) * CXX_OP_S  # flatten + unflatten views
    cats = (n + 1) * COPY_CALL_S  # one at::cat per flattened list
    return max(0.0, py_views + copies + cxx_views + cats - hidden_s)


def recipe_comm(
    terms: dict[str, tuple[float, float]],
    plan: PlanInput,
    recipe: Recipe,
    stage_params: float,
    gpus_per_node: int | None,
) -> dict[str, tuple[float, float]]:
    """The data-parallel families as `recipe`'s framework runs them (the others are
    comm_terms' own). DDP / ZeRO-0: all-reduce of the gradient in its reduction dtype
    (bucket_elem_bytes), one latency term per bucket, NCCL's ring / tree latency model
    (comm.dp_allreduce_latency). ZeRO-1 with a sharded master (Megatron's distributed
    optimizer, DeepSpeed stage 1, Nanotron ZeroDistributedOptimizer): reduce-scatter of the
    gradients, then all-gather of the updated 16-bit weights (weight_bytes per parameter)
    instead of scaletrain's all-reduce + fp32 broadcast. ZeRO-3 under a recipe that gathers per
    module (Recipe.zero3_module_fetch, DeepSpeed): `zero3_fetch.zero3_module_fetch_terms` in
    place of FSDP's families, charged in full by exposure.exposed_by_family. ZeRO-1 under a
    recipe that all-reduces after the backward (Recipe.zero1_grad_sync, Nanotron): one
    all-reduce of the whole fp32 gradient buffer, 2(n-1)/n of it per rank, one latency term (NCCL's
    ring / tree model), in place of the bucketed reduce-scatter; the same under DeepSpeed's
    BF16_Optimizer (`bf16_optimizer_runs`), whose all-reduce sends the buffer in bf16
    (`_BF16_OPTIMIZER_COMM`). A tied embedding and head on different pipeline stages under
    Recipe.tied_grad_sync 'allreduce_after_backward' (Nanotron) or BF16_Optimizer add
    `pp_tied_allreduce` (`_tied_grad_term`). Ignores: overlap of the param all-gather with the next
    forward (Megatron --overlap-param-gather): counted exposed."""
    L, hw = plan.layout, plan.hardware
    if L.zero >= 3 and recipe.zero3_module_fetch and "fsdp_all_gather" in terms:
        # DeepSpeed's per-module gathers and bucketed reduce-scatters, on the critical path
        # (time/zero3_fetch.py) in place of FSDP's per-block, overlapped families
        out = {
            k: v for k, v in terms.items() if k not in ("fsdp_all_gather", "fsdp_reduce_scatter")
        }
        out.update(zero3_module_fetch_terms(plan, recipe, stage_params, gpus_per_node))
        return out
    bf16_opt = bf16_optimizer_runs(plan, recipe)
    tied = _tied_grad_term(plan, recipe, gpus_per_node, bf16_opt=bf16_opt)
    if "dp_allreduce" not in terms:
        return {**terms, **tied}
    out = {**terms, **tied}
    link = axis_link(L, hw, "dp", gpus_per_node)
    bw, lat, _ = link
    n = L.dp * L.cp
    if L.zero:
        n = max(1, n // max(1, L.dp_replicate))
    # fp32 runs reduce and gather in fp32, their compute dtype; mixed runs in the recipe's dtypes
    spec = precision_spec(plan.precision)
    rb = recipe.bucket_elem_bytes if spec.mixed else float(spec.compute_bytes)
    if bf16_opt:  # communication_data_type: the bf16 compute dtype (_BF16_OPTIMIZER_COMM)
        rb = float(spec.compute_bytes)
    grads = stage_params * rb
    buckets = max(1, math.ceil(grads / max(1.0, recipe.bucket_bytes(L.dp))))
    if L.zero == 1 and recipe.shards_master and n > 1:
        wb = recipe.weight_bytes if spec.mixed else float(spec.compute_bytes)
        if recipe.zero1_grad_sync == "allreduce_after_backward" or bf16_opt:
            # one all-reduce of the whole buffer (`recipe_exposed` leaves it exposed)
            ar = 2 * (n - 1) / n * grads
            ring = ar / bw + dp_allreduce_latency(L, hw, gpus_per_node, n)
            out["dp_allreduce"] = (ar, allreduce_seconds(grads, n, link, hw, ring=ring))
        else:
            rs = (n - 1) / n * grads / bw + buckets * (n - 1) * lat
            out["dp_allreduce"] = ((n - 1) / n * grads, rs)
        params = stage_params * wb
        out["zero_all_gather"] = ((n - 1) / n * params, gather_time(params, n, bw, lat))
    elif n > 1:
        ring = 2 * (n - 1) / n * grads / bw + buckets * dp_allreduce_latency(
            L, hw, gpus_per_node, n
        )
        # NVLink SHARP inside a node (comm.allreduce_seconds), bucket by bucket
        per = grads / buckets
        secs = buckets * allreduce_seconds(per, n, link, hw, ring=ring / buckets)
        out["dp_allreduce"] = (2 * (n - 1) / n * grads, secs)
    return out


def _tied_grad_term(
    plan: PlanInput, recipe: Recipe, gpus_per_node: int | None, *, bf16_opt: bool = False
) -> dict[str, tuple[float, float]]:
    """{'pp_tied_allreduce': (bytes, seconds)} when `recipe` sums the gradient of an embedding
    tied to the head across pipeline stages after the backward (Recipe.tied_grad_sync
    'allreduce_after_backward', Nanotron: trainer.py DistributedTrainer.training_step ->
    parallel/tied_parameters.py sync_tied_weights_gradients, an all-reduce over the first and
    the last stage's ranks of the same tp and dp coordinates; or DeepSpeed's BF16_Optimizer,
    `bf16_opt`: `_BF16_OPTIMIZER_COMM`), else {}. Counts: one ring all-reduce
    (comm.allreduce_time) of the tied weight's vocab shard, vocab x dim / tp elements at
    Recipe.grad_bytes (Nanotron's fp32 accumulation buffer) or 4 B under BF16_Optimizer (its
    fp32 _hp_grad, all-reduced as it is, no cast), over the pp axis's link (the two stages sit
    pp - 1 stages apart: a node apart unless the whole pipeline fits in one node);
    exposure.exposed_by_family charges it whole (nothing runs beside it). Ignores: the norm
    weights the same call sums over tp under sequence parallelism (reduce_op SUM on the
    tp-replicated parameters: 2 x dim per block, microseconds), an untied model or pp = 1 (no
    group)."""
    L, model = plan.layout, plan.model
    syncs = recipe.tied_grad_sync == "allreduce_after_backward" or bf16_opt
    if not syncs or L.pp < 2 or not model.tie_embeddings:
        return {}
    spec = precision_spec(plan.precision)
    gb = recipe.grad_bytes if spec.mixed else float(spec.compute_bytes)
    if bf16_opt:
        gb = 4.0  # the fp32 _hp_grad (_BF16_OPTIMIZER_COMM)
    nbytes = gb * model.vocab_size * model.dim / L.tp
    bw, lat, _ = axis_link(L, plan.hardware, "pp", gpus_per_node)
    return {"pp_tied_allreduce": (nbytes, allreduce_time(nbytes, 2, bw, lat))}


def recipe_exposed(
    comm: dict[str, tuple[float, float]],
    plan: PlanInput,
    recipe: Recipe,
    *,
    rate: float,
    layers: int,
    gpus_per_node: int | None,
    core_s_layer: float = 0.0,
    stretch: float = 1.0,
) -> dict[str, float]:
    """Exposed seconds of the families a recipe's framework runs its own way (`step_time`
    charges them as given, exposure.exposed_by_family the rest); `comm` is updated in place
    where the recipe also changes what moves.
    - tp under Recipe.tp_comm 'async_linears' with sequence parallelism, dense models:
      `async_tp_terms` (Nanotron's async REDUCE_SCATTER linears) replaces
      comm._tp_term's bytes and seconds, and its exposed share is charged;
    - dp_allreduce under Recipe.zero1_grad_sync 'allreduce_after_backward' at ZeRO-1: all of
      it (trainer.py DistributedTrainer.training_step calls sync_gradients_across_dp once
      pipeline_engine.train_batch_iter has returned: no backward left to hide it);
    - dp_allreduce at ZeRO-0 under Recipe.single_hw_queue (CUDA_DEVICE_MAX_CONNECTIONS=1 in
      the framework's launcher): all of it. The DDP buckets' all-reduces are launched during
      the backward (Nanotron: optim/gradient_accumulator.py get_fp32_accum_hook ->
      dist.all_reduce_coalesced of the bucket's fp32 buffers, async_op=True), but with one
      hardware queue the backward kernels queued behind a bucket's collective wait for it
      (Recipe.single_hw_queue's sources: NVIDIA/Megatron-LM issue #1468's traces, DP 64,
      nothing overlapped with the variable at 1); the bucketed bytes and latency stay
      recipe_comm's. Ignores: the share of a collective that does start beside compute (the
      traces show none);
    - dp_allreduce and zero_all_gather under DeepSpeed's BF16_Optimizer (`bf16_optimizer_runs`):
      all of both (`_BF16_OPTIMIZER_COMM`: the all-reduce after the last micro-batch's backward,
      the bf16 weights' all-gather inside the optimizer step, nothing queued beside either);
    - cp_ring under Recipe.cp_ring 'torch_allgather': `cp_ring.torch_ring_terms` replaces
      comm._cp_term's bytes and seconds; its waits (the K/V all-gather past the first
      sub-SDPA, the dK/dV sends past one sub-SDPA backward, the last send) sit inside each
      micro-batch's stage time, so a pipeline's schedule repeats them `stretch` = 1 + the
      bubble fraction times per micro-batch (`core_s_layer`: the attention core's seconds per
      block and micro-batch)."""
    L, model = plan.layout, plan.model
    out: dict[str, float] = {}
    if recipe.cp_ring == "torch_allgather" and "cp_ring" in comm and L.cp > 1:
        cal = plan.calibration
        factor = cal.collective_factor("cp_ring") if cal is not None and cal.collective else 1.0
        ring = torch_ring_terms(
            plan,
            recipe,
            link=axis_link(L, plan.hardware, "cp", gpus_per_node),
            core_s_layer=core_s_layer,
            layers=layers,
        )
        comm["cp_ring"] = (ring.bytes, ring.seconds * factor)
        out["cp_ring"] = ring.wait_per_mb * max(1, plan.grad_accum) * stretch * factor
    if recipe.tp_comm == "async_linears" and "tp" in comm and L.sp and not model.is_moe:
        cal = plan.calibration
        factor = cal.collective_factor("tp") if cal is not None and cal.collective else 1.0
        t = async_tp_terms(
            plan,
            link=axis_link(L, plan.hardware, "tp", gpus_per_node),
            rate=rate,
            layers=layers,
            m=max(1, plan.grad_accum),
            recompute=plan.ac == "full",
        )
        comm["tp"] = (t.bytes, t.seconds * factor)
        out["tp"] = t.exposed * factor
    if (
        recipe.zero1_grad_sync == "allreduce_after_backward"
        and L.zero == 1
        and "dp_allreduce" in comm
    ):
        out["dp_allreduce"] = comm["dp_allreduce"][1]
    if bf16_optimizer_runs(plan, recipe):  # after the last backward: _BF16_OPTIMIZER_COMM
        for family in ("dp_allreduce", "zero_all_gather"):
            if family in comm:
                out[family] = comm[family][1]
    if recipe.single_hw_queue and L.zero == 0 and L.dp > 1 and "dp_allreduce" in comm:
        out["dp_allreduce"] = comm["dp_allreduce"][1]
    return out
