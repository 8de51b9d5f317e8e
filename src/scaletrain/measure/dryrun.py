"""Dry-run: the trainer's real training step under fake tensors, as one rank of any world size.

No memory is allocated and no kernel runs: `FakeTensorMode` propagates shapes and dtypes, the
`fake` process-group backend (with a `FakeStore`) answers every collective locally, and
`torch.distributed._tools`' trackers (`FSDPMemTracker` for FSDP, `MemTracker` otherwise) count
the bytes each storage would hold, by category. The model, mesh, parallelization and optimizer
come from the trainer's own build functions (`build_model`, `ParallelDims`, `parallelize`,
`materialize`, `build_optimizer`), so what is measured is what `scaletrain train` would run.

Two optimizer steps run; the second one is measured. The first (optimizer-state creation,
FSDP lazy init, DTensor sharding caches) runs before the tracker is created: the tracker's
per-op bookkeeping costs about as much as the step, and what step 1 leaves behind
(parameters, gradients, optimizer states) is registered when the tracker is built, so the
figures are the same as tracking both steps (checked to the byte on zero 0/1/2/3, tp+sp, and
llama2-7b fsdp2 x tp8). Initial weight values are not drawn (`materialize` without
`init_weights`): fake tensors hold no values, and drawing them was a large model's biggest
build cost. Each step runs min(grad_accum, 2) micro-batches: the second micro-batch already
sees accumulated gradients, which is every state a longer accumulation reaches (peak
activations are per micro-batch), so running all of them would only cost time.

Pipeline parallelism (pp > 1): the stages are this rank's stages from the trainer's own
`_build_pipeline` (`split_stage`, the `stage_layer_ranges` rule, parallelized like the
trainer's); their materialization is deferred into fake mode. torch's schedules cannot run
under fake tensors (their P2P warm-up vote calls `.item()`, DESIGN.md §3), so `_Pipeline`
drives the stages' `PipelineStage` objects through the planner's `pipeline_order` for this pp
rank, lowered with torch's own passes (FSDP UNSHARD/RESHARD for multi-stage schedules,
REDUCE_GRAD after a stage's last backward). Every micro-batch of the step runs, so the
activations in flight at the peak are the schedule's (GPipe: all m; 1F1B: p - rank), and the
memory the schedule keeps is allocated as torch does: per-micro-batch receive buffers for
activations and gradients (the trainer calls the schedule with `return_outputs=False`, so the
last stage keeps no logits beyond each micro-batch's own backward). The loss is computed on
the last stage only. Not supported: pp with cp (the trainer's pipeline does not shard the
sequence).

MoE / expert parallelism: the expert dispatch needs token counts as Python ints, which fake
tensors do not have; under fake tensors `models.moe` and `parallel.expert_parallel` assume a
perfectly balanced router (N*k/E assignments per expert on every rank). Real runs with a
skewed router hold more activations on their busiest expert than this measures.

Reading the categories: they are the tracker's breakdown *at the peak moment* (so they add up
to `total`), which is not the size of each state at rest: gradients of step 1 are freed by
`zero_grad`, so at a forward-time peak `grads` is small. The exact sizes at rest are in
`memory.detail['state.params' | 'state.grads' | 'state.optimizer']` (local bytes, shards
counted as held). Known attribution quirks of torch 2.13's trackers: under an FSDP2
mixed-precision policy the unsharded bf16 copies are not always filed as 'Unsharded Param'
(seen on gpt2-124m: they land in activations/temp; `total` is unaffected), nor are FSDP+TP
unsharded DTensor parameters; every
allocation inside `optimizer.step()` is filed as optimizer state, so the excess over the states
is moved to `buffer_terms['optimizer_step_temp']`.

DDP cannot be built under fake tensors (its reducer verifies parameter shapes across ranks by
reading storage): zero 0/1 are measured without the DDP wrapper (the local computation is the
same) and its gradient buckets are added as `buffer_terms['ddp_buckets']`.

The optimizer is the one the target device would run (`--gpu` other than 'cpu': fused AdamW,
no foreach temporaries). FLOPs are counted with `FlopCounterMode` on step 1 (the same
computation as step 2; under the tracker the counter would keep alive what activation
checkpointing frees) for one step of this rank (scaled from the micro-batches run to all of
them): matmuls only, attention over the full
T x T matrix, flash backward with its QK^T recomputation; DTensor (TP) matmuls are counted at
their global shapes, so under tp > 1 the figure is the tensor-parallel group's.

Not supported (raise `ConfigError`): pp > 1 with cp > 1, and offload other than 'none'.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

from scaletrain.config import ConfigError, JobConfig, Layout
from scaletrain.planner.types import MemoryBreakdown

from .schema import Measurement

__all__ = ["dryrun", "plan_dict", "DRYRUN_MICROBATCHES"]

DRYRUN_MICROBATCHES = 2
"""Micro-batches run per dry-run step at most (see module docstring)."""

# Tracker category -> schema category. FSDPMemTracker's names first, MemTracker's after.
_CATEGORY = {
    "Sharded Param": "params", "Unsharded Param": "params", "Parameter": "params",
    "Sharded Grad": "grads", "Unsharded Grad": "grads", "Gradient": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations",
    "Buffer": "buffers", "Temp": "buffers", "All Gather": "buffers", "Reduce Scatter": "buffers",
    "Inputs": "buffers", "Other": "buffers",
}
_BUFFER_NAMES = {"Buffer": "module_buffers", "Temp": "temp", "All Gather": "all_gather",
                 "Reduce Scatter": "reduce_scatter", "Inputs": "inputs", "Other": "other"}
_DETAIL_NAMES = {"Unsharded Param": "params.unsharded", "Sharded Param": "params.sharded",
                 "Unsharded Grad": "grads.unsharded", "Sharded Grad": "grads.sharded"}


def plan_dict(job: JobConfig, layout: Layout) -> dict[str, Any]:
    """The `plan` object of DESIGN.md §4 for `job` run with `layout`."""
    b = job.batch
    return {"model": job.model.name, "params": job.model.num_params(),
            "gpus": layout.world_size, "dp": layout.dp, "zero": layout.zero, "tp": layout.tp,
            "sp": layout.sp, "pp": layout.pp, "pp_schedule": layout.pp_schedule,
            "pp_virtual": layout.pp_virtual, "cp": layout.cp, "ep": layout.ep,
            "micro_batch": b.micro_batch,
            "grad_accum": b.global_batch // (b.micro_batch * layout.dp),
            "seq_len": b.seq_len, "precision": job.precision.dtype, "ac": job.memory.ac,
            "offload": job.memory.offload}


def _unsupported(job: JobConfig, layout: Layout) -> None:
    if job.memory.offload != "none":
        raise ConfigError("memory.offload", job.memory.offload,
                          "the dry-run measures device memory without offload: use 'none'")


@contextlib.contextmanager
def _fake_world(rank: int, world_size: int) -> Iterator[None]:
    """A `fake` process group as `rank` of `world_size`, destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("dryrun: a process group is already initialized in this process")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _real_mesh_tensors() -> Iterator[None]:
    """Keep `DeviceMesh` rank tensors real while fake mode is on.

    `parallelize` slices submeshes (`mesh["tp"]`) inside fake mode; a mesh whose rank tensor is
    fake cannot answer which ranks it holds (DESIGN.md §3, recipes/fake_fsdp_tp_memory.py).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    orig = DeviceMesh.__init__

    def init(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        with unset_fake_temporarily():
            orig(self, *args, **kwargs)

    DeviceMesh.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        DeviceMesh.__init__ = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """`materialize` without drawing initial values: fake tensors hold no values anyway.

    Drawing them is most of a large model's build time under fake mode (each parameter's full
    value is generated and re-distributed to its shard, through DTensor dispatch); the
    allocation (`to_empty`) and the buffer recomputation are kept, so memory is unchanged.
    """
    from scaletrain.models import init as init_mod

    with mock.patch.object(init_mod, "init_weights", lambda model, **kw: None):
        yield


@contextlib.contextmanager
def _deferred_materialize() -> Iterator[None]:
    """Run the trainer's `_build_pipeline` with its per-stage `materialize` skipped.

    Stages must be split and parallelized on meta outside fake mode (a meta parameter deep-
    copied under fake mode cannot be swapped for its materialized value); the dry-run then
    materializes the stages inside fake mode, as it does a whole model.
    """
    from scaletrain.trainer import build as build_mod

    with mock.patch.object(build_mod, "materialize", lambda model, **kw: None):
        yield


@contextlib.contextmanager
def _ddp_as_buffer_term() -> Iterator[list[bool]]:
    """Run `parallelize` with its DDP step recorded instead of applied.

    DDP's reducer checks parameter shapes across ranks by reading parameter storage, which
    fake tensors do not have, so it cannot be built under fake mode. Without it the step is
    the same local computation (DDP only all-reduces gradients); its memory, the gradient
    buckets, is added back as a named buffer term by `_add_ddp_buckets`.
    """
    from scaletrain.parallel import parallelize as parallelize_mod

    module = __import__(parallelize_mod.__module__, fromlist=["apply_ddp"])
    orig = module.apply_ddp
    wrapped: list[bool] = []

    def record(model, mesh, **kw):  # noqa: ANN001, ANN003
        wrapped.append(True)
        return model

    module.apply_ddp = record
    try:
        yield wrapped
    finally:
        module.apply_ddp = orig


@contextlib.contextmanager
def _gradless_module_hooks() -> Iterator[None]:
    """Module trackers whose post-backward hooks keep no gradients.

    `ModTracker` (under MemTracker and FSDPMemTracker) registers an "all"-mode
    `register_multi_grad_hook` on each module's inputs, and torch's implementation buffers the
    gradients it sees per autograd graph task until every input has had one. Zero-bubble's
    split backward runs a micro-batch as two graph tasks (`autograd.grad` to the stage input,
    then to the weights), so the input pass's buffers never complete and kept ~47 MB per
    micro-batch of gradients alive until the step ended on llama-1024-L4: memory the trainer,
    which registers no such hook, never holds. This hook counts the same calls per graph task
    and hands `fn` Nones (the trackers ignore the gradients).
    """
    from torch.autograd.graph import _get_grad_fn_or_grad_acc, _MultiHandle
    from torch.distributed._tools import mod_tracker

    original = mod_tracker.register_multi_grad_hook

    def register(tensors, fn, *, mode: str = "all"):  # noqa: ANN001, ANN202
        if mode != "all":
            return original(tensors, fn, mode=mode)
        refs = [weakref.ref(t) for t in tensors]
        pending: dict[int, int] = {}

        def hook(_grad: torch.Tensor) -> None:
            task = torch._C._current_graph_task_id()
            if task not in pending:
                alive = [t for t in (r() for r in refs) if t is not None]
                pending[task] = sum(torch._C._will_engine_execute_node(
                    _get_grad_fn_or_grad_acc(t)) for t in alive)
            pending[task] -= 1
            if pending[task] <= 0:
                del pending[task]
                fn([None] * len(refs))

        return _MultiHandle(tuple(t.register_hook(hook) for t in tensors))

    with mock.patch.object(mod_tracker, "register_multi_grad_hook", register):
        yield


def _add_ddp_buckets(memory: MemoryBreakdown, model: torch.nn.Module, notes: list[str]) -> None:
    """DDP's reducer buckets: one flat copy of every gradient (`gradient_as_bucket_view=False`,
    torch's default, keeps `param.grad` and the bucket separately), allocated at the first
    backward and kept for the run, so they add to the peak."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    memory.buffer_terms["ddp_buckets"] = float(nbytes)
    memory.buffers += nbytes
    memory.total += nbytes
    notes.append("DDP cannot be built under fake tensors: measured without its wrapper, its "
                 "gradient buckets added as buffer_terms['ddp_buckets']")


class _Timeline:
    """(event, allocated bytes) through the measured step, read from the tracker's running total.

    Own hooks on the root and on each block (the trackers' hooks differ between MemTracker and
    FSDPMemTracker): forward entry and exit, and backward entry (a hook on the block output's
    gradient). The loss, backward end and optimizer events are marked by the step itself.
    """

    def __init__(self, tracker: Any, roots: list[tuple[str, torch.nn.Module]]) -> None:
        self.events: list[tuple[str, int]] = []
        self.recording = False
        self._tracker = tracker
        self._handles = []
        modules = []
        for root_name, root in roots:  # the model, or each pipeline stage of this rank
            modules.append((root_name, root))
            layers = getattr(root, "layers", None) or {}
            modules += [(f"layers.{n}", b) for n, b in layers.items()]
        for name, mod in modules:
            self._handles.append(mod.register_forward_pre_hook(self._pre_fw(name)))
            self._handles.append(mod.register_forward_hook(self._post_fw(name)))

    def _total(self) -> int:
        snap = self._tracker.get_tracker_snapshot()
        return int(sum(d.get("Total", 0) for d in snap.values()))

    def mark(self, event: str) -> None:
        if self.recording:
            self.events.append((event, self._total()))

    def _pre_fw(self, name: str) -> Any:
        def hook(module, args):  # noqa: ANN001
            self.mark(f"fw_pre:{name}")
        return hook

    def _post_fw(self, name: str) -> Any:
        def hook(module, args, output):  # noqa: ANN001
            self.mark(f"fw_post:{name}")
            if self.recording and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self.mark(f"bw_pre:{name}"))
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

# ---- pipeline parallelism ---------------------------------------------------------------------

def _pp_actions(schedule: str, p: int, m: int, v: int, pp_rank: int) -> list[Any]:
    """This rank's actions for one step, lowered the way torch.distributed.pipelining does.

    The compute order is the planner's `pipeline_order` (torch's order without its no-op
    padding); torch's own lowering passes then add what its runtime adds: UNSHARD / RESHARD
    of FSDP stages (multi-stage schedules only, `_add_unshard_reshard`, 3 stages prefetched)
    and REDUCE_GRAD after a stage's last backward (`_add_reduce_grad`). Zero-bubble's B is
    torch's BACKWARD_INPUT ('I'), its W the deferred BACKWARD_WEIGHT.
    """
    from torch.distributed.pipelining.schedules import (
        _Action,
        _add_reduce_grad,
        _add_unshard_reshard,
        _ComputationType,
    )

    from scaletrain.planner.pipeline import pipeline_order

    zb = schedule == "zero-bubble"
    kind = {"F": _ComputationType.FORWARD, "W": _ComputationType.BACKWARD_WEIGHT,
            "B": _ComputationType.BACKWARD_INPUT if zb else _ComputationType.FULL_BACKWARD}
    actions = [_Action(a.stage, kind[a.kind], a.microbatch)
               for a in pipeline_order(schedule, p, m, v)[pp_rank]]
    if schedule not in ("gpipe", "1f1b"):
        actions = _add_unshard_reshard(actions)
    return _add_reduce_grad(actions, m)


def _pp_io_dtype(job: JobConfig, dims) -> torch.dtype:
    """dtype of the residual stream sent between stages.

    Under an FSDP mixed-precision policy the embedding runs in the policy's param dtype (and
    FSDP casts stage inputs to it), so the stream is in that dtype; otherwise the fp32
    embedding output keeps the residual sum in fp32 even under autocast.
    """
    from scaletrain.parallel.fsdp import mp_policy

    if dims.zero >= 2 and dims.fsdp_enabled:
        dtype = mp_policy(job.precision.dtype, job.precision.reduce_dtype).param_dtype
        if dtype is not None:
            return dtype
    return torch.float32


class _Pipeline:
    """Drives this rank's pipeline stages through one step's actions, without a schedule.

    torch's schedules cannot run under fake tensors (their P2P warm-up vote calls `.item()`),
    so the stages' `PipelineStage` objects from the trainer's own `build_pipeline` are driven
    directly, with the same calls the schedule makes per action: `forward_maybe_with_nosync`,
    `backward_maybe_with_nosync` ('full', or 'input' + 'weight' under zero-bubble, which also
    sets the FSDP no-reshard / no-sync flags torch uses between micro-batches),
    `perform_reduce_grad` (reduce-scatter, reshard and the 1/m scaling) and FSDP
    `unshard` / `reshard`. The communication is replaced by what it leaves in memory:

    - forward receive buffers: one (B, T_local, h) tensor per micro-batch on every non-first
      stage, allocated once and kept (torch's `_setup_forward_recv_info`); the received
      activation *is* that buffer;
    - gradient receive buffers: one per micro-batch on every non-last stage, allocated at the
      first backward and kept (`_setup_backward_recv_info`);
    - no kept outputs: the trainer runs the schedule with `return_outputs=False`, so a
      micro-batch's logits live only until its backward (`output_chunks` stays empty).
    Sends hold nothing extra (the tensor sent is one the stage already keeps). The loss
    (`causal_lm_loss`) is computed on the last stage only, right after its forward.
    """

    def __init__(self, runtime: Any, *, job: JobConfig, dims, n_micro: int) -> None:
        self.runtime = runtime
        self.job = job
        self.m = n_micro
        self.stages = {sid: ps for sid, ps in zip(runtime.stage_ids, runtime._pipeline_stages,
                                                  strict=True)}
        self.num_stages = runtime.num_stages
        layout = dims.layout
        self.pp_rank = dims.pp_rank
        self.split_backward = layout.pp_schedule == "zero-bubble"
        self.actions = _pp_actions(layout.pp_schedule, layout.pp, n_micro, layout.pp_virtual,
                                   self.pp_rank)
        b, t = job.batch.micro_batch, job.batch.seq_len
        # the residual stream is sequence-sharded under sp (the block plans' Shard(1) local
        # tensors), whole otherwise
        t_local = t // dims.tp if (dims.sp and dims.tp > 1) else t
        self.io_shape = (b, t_local, job.model.dim)
        self.io_dtype = _pp_io_dtype(job, dims)
        self.recv: dict[int, list[torch.Tensor]] = {}
        self.grad_recv: dict[int, list[torch.Tensor]] = {}

    def release_buffers(self) -> None:
        """Drop the receive buffers (the next step allocates them again)."""
        self.recv.clear()
        self.grad_recv.clear()

    def _forward_buffers(self) -> None:
        for sid in self.stages:
            if sid > 0 and sid not in self.recv:
                self.recv[sid] = [torch.empty(self.io_shape, dtype=self.io_dtype,
                                              requires_grad=True) for _ in range(self.m)]

    def step(self, batches, timeline: _Timeline, tracker: Any = None) -> None:
        """One step's forwards and backwards of this rank's stages (no optimizer)."""
        from torch.distributed.pipelining.schedules import _ComputationType as C

        from scaletrain.models import causal_lm_loss
        from scaletrain.trainer.precision import autocast

        self._forward_buffers()
        last = self.num_stages - 1
        cache: dict[tuple[int, int], tuple[Any, list[torch.Tensor], Any]] = {}
        pending_w: dict[tuple[int, int], tuple[Any, Any]] = {}
        with autocast(self.job.precision, "cpu"):
            for a in self.actions:
                sid, kind, mb = a.stage_index, a.computation_type, a.microbatch_index
                stage = self.stages[sid]
                if kind == C.FORWARD:
                    inputs, targets, _ = batches[mb]
                    x = inputs if sid == 0 else self.recv[sid][mb]
                    if tracker is not None and stage.submod in tracker.memory_tracking:
                        # the trackers refuse a second forward of a root module: forget this
                        # stage's own entry only (other stages' entries are still needed by
                        # the backward of their in-flight micro-batches)
                        del tracker.memory_tracking[stage.submod]
                    # Under zero-bubble's autograd.grad the trackers' multi-grad hooks reject
                    # a leaf among a module's inputs: feed the stage a view of its receive
                    # buffer (no memory; the gradient still reaches the buffer itself).
                    fx = x.view_as(x) if self.split_backward and sid > 0 else x
                    out = stage.forward_maybe_with_nosync(fx)
                    logits = None
                    if sid == last:
                        logits = out
                        out = causal_lm_loss(logits, targets)
                        timeline.mark(f"loss:{mb}")
                    cache[(sid, mb)] = (out, [x], logits)
                elif kind in (C.FULL_BACKWARD, C.BACKWARD_INPUT):
                    out, inputs_, logits = cache.pop((sid, mb))
                    kw = self._bwd_kwargs(sid, mb, out, inputs_)
                    if kind == C.FULL_BACKWARD:
                        stage.backward_maybe_with_nosync("full", kw)
                    elif sid == 0:
                        pending_w[(sid, mb)] = (None, kw)  # torch: stage 0 defers it all to W
                    else:
                        if isinstance(kw["stage_output"], torch.Tensor):
                            kw["stage_output"] = (kw["stage_output"],)
                        _, groups = stage.backward_maybe_with_nosync("input", kw)
                        pending_w[(sid, mb)] = (groups, kw)
                    if logits is not None and sid > 0 and not logits._is_view():
                        logits.detach_()  # as torch's backward_one_chunk: drop the graph ref
                    timeline.mark(f"backward_done:{sid}.{mb}")
                elif kind == C.BACKWARD_WEIGHT:
                    groups, kw = pending_w.pop((sid, mb))
                    if sid == 0:
                        stage.backward_maybe_with_nosync("full", kw)
                    else:
                        stage.backward_maybe_with_nosync(
                            "weight", {"stage_output": kw["stage_output"],
                                       "param_groups": groups})
                elif kind == C.UNSHARD:
                    for mod in _fsdp_modules(stage.submod):
                        mod.unshard()
                elif kind == C.RESHARD:
                    for mod in _fsdp_modules(stage.submod):
                        mod.reshard()
                elif kind == C.REDUCE_GRAD:
                    stage.perform_reduce_grad(self.m)  # scale_grads=True: mean over mbs

    def _bwd_kwargs(self, sid: int, mb: int, out: Any, inputs: list[torch.Tensor]
                    ) -> dict[str, Any]:
        if sid == self.num_stages - 1:
            return {"stage_output": out, "output_grads": None, "input_values": inputs}
        if sid not in self.grad_recv:
            self.grad_recv[sid] = [torch.empty_like(out) for _ in range(self.m)]
        return {"stage_output": (out,), "output_grads": (self.grad_recv[sid][mb],),
                "input_values": inputs}


def _fsdp_modules(module: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *_, **__) -> int:  # noqa: ANN001
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *_, **__
                             ) -> int:  # noqa: ANN001
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _flop_counter() -> Any:
    """FlopCounterMode that also counts the CPU flash-attention kernels.

    torch's counter has formulas for the CUDA SDPA kernels only; the CPU ones (what a dry-run
    on this machine dispatches to) get the same formula: QK^T and AV over the *full* T x T
    matrix (2 x 2*B*nh*T*T*hd forward, 2x that backward), i.e. no causal halving. Counted are
    matmuls (mm, addmm, bmm, baddbmm, SDPA) only, like the planner.
    """
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    mapping = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
               aten._scaled_dot_product_flash_attention_for_cpu_backward:
                   _sdpa_cpu_backward_flops}
    return FlopCounterMode(display=False, custom_mapping=mapping)


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Local bytes of every optimizer state tensor (ZeRO-1: this rank's partition only)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local part
    total = 0
    for state in inner.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                v = v.to_local() if hasattr(v, "to_local") else v
                total += v.numel() * v.element_size()
    return total


def _breakdown(peak: dict[Any, dict[str, int]], rank: int, capacity: float) -> MemoryBreakdown:
    mem = MemoryBreakdown(rank=rank, capacity=capacity)
    for dev_snap in peak.values():
        for key, nbytes in dev_snap.items():
            if key == "Total":
                mem.total += nbytes
                continue
            cat = _CATEGORY.get(key, "buffers")
            setattr(mem, cat, getattr(mem, cat) + nbytes)
            if cat == "buffers":
                name = _BUFFER_NAMES.get(key, key.lower().replace(" ", "_"))
                mem.buffer_terms[name] = mem.buffer_terms.get(name, 0.0) + nbytes
            if key in _DETAIL_NAMES:
                mem.detail[_DETAIL_NAMES[key]] = mem.detail.get(_DETAIL_NAMES[key], 0.0) + nbytes
    mem.fits = capacity <= 0 or mem.total <= capacity
    return mem


def _step(model, optimizer, batches, *, job: JobConfig, dims, timeline: _Timeline,
          state: dict[str, float] | None = None, tracker: Any = None,
          pipe: _Pipeline | None = None) -> None:
    """One optimizer step as the trainer runs it: micro-batches, backward, clip, update.

    `pipe` (pipeline parallelism): the micro-batches run through this rank's stages in the
    schedule's order instead. `state` (if given) receives the exact local bytes of
    parameters, gradients (after the last backward) and optimizer states (after the update):
    the sizes at rest, whereas the tracker's peak breakdown is read at one moment.
    """
    from scaletrain.models import moe_aux_loss
    from scaletrain.parallel import (
        clip_grad_norm_,
        local_state_bytes,
        loss_context,
        maybe_no_sync,
        sync_gradients,
    )
    from scaletrain.trainer.build import tp_mesh
    from scaletrain.trainer.precision import autocast

    def record() -> None:
        if state is not None:
            for k, v in local_state_bytes(model, optimizer).items():
                state[f"state.{k}"] = max(state.get(f"state.{k}", 0.0), float(v))

    if pipe is not None:
        pipe.step(batches, timeline, tracker)
    for k, (inputs, targets, positions) in enumerate(batches if pipe is None else []):
        if tracker is not None:
            # the trackers refuse a second forward of the root without a reset of their
            # per-module statistics (the running totals and the peak are kept)
            tracker.reset_mod_stats()
        last = k == len(batches) - 1
        with maybe_no_sync(model, last), loss_context(tp_mesh(dims)):
            with autocast(job.precision, "cpu"):
                loss = model(inputs, positions=positions, targets=targets) + moe_aux_loss(model)
            timeline.mark(f"loss:{k}")
            (loss / len(batches)).backward()
        timeline.mark(f"backward_done:{k}")
    sync_gradients(model)  # EP's data parallelism, as the trainer's train_step
    record()
    extra = pipe.runtime.group if pipe is not None else None
    clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                    job.optim.grad_clip or float("inf"), extra_group=extra)
    optimizer.step()
    record()
    timeline.mark("optimizer_step")
    optimizer.zero_grad(set_to_none=True)
    timeline.mark("zero_grad")


def _batches(job: JobConfig, dims, n: int) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
    """`n` fake micro-batches of this rank: (B, T / cp) ids with their positions under CP."""
    b, t, v = job.batch.micro_batch, job.batch.seq_len, job.model.vocab_size
    out = []
    for _ in range(n):
        inputs = torch.randint(0, v, (b, t))  # (B, T)
        targets = torch.randint(0, v, (b, t))  # (B, T)
        positions = None
        if dims.cp > 1:
            from scaletrain.parallel.context_parallel import cp_positions, cp_shard

            rank, size = dims.cp_rank, dims.cp
            positions = cp_positions(t, rank, size)
            inputs, targets = cp_shard(inputs, rank, size), cp_shard(targets, rank, size)
        out.append((inputs, targets, positions))
    return out


def dryrun(job: JobConfig, *, world_size: int, rank: int = 0, count_flops: bool = True
           ) -> Measurement:
    """Measure one training step of `job` as `rank` of `world_size` ranks, without allocating.

    Returns the step's peak memory by category (`Measurement.memory`), a timeline of allocated
    bytes at block boundaries, and this rank's FLOPs for that step.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from scaletrain.models import build_model, materialize
    from scaletrain.parallel import ParallelDims, parallelize
    from scaletrain.trainer.build import _build_pipeline
    from scaletrain.trainer.optim import build_optimizer
    from scaletrain.trainer.precision import LossScaler

    layout = job.layout(world_size)
    _unsupported(job, layout)
    if not 0 <= rank < world_size:
        raise ConfigError("rank", rank, f"choose a rank in [0, {world_size})")
    t0 = time.perf_counter()
    grad_accum = job.batch.global_batch // (job.batch.micro_batch * layout.dp)
    pp = layout.pp > 1
    # the schedule's peak in-flight activations need all of its micro-batches
    n_micro = grad_accum if pp else min(grad_accum, DRYRUN_MICROBATCHES)
    notes = [f"dry-run ran {n_micro} of {grad_accum} micro-batches per step"]
    capacity = job.hardware.spec().memory_bytes if job.hardware.gpu != "cpu" else 0.0
    with _fake_world(rank, world_size), _real_mesh_tensors():
        dims = ParallelDims.from_layout(layout, world_size)
        if world_size > 1:
            dims.build_mesh("cpu")
        # Built and parallelized on meta outside fake mode, as the trainer does; only the
        # materialization (and everything after) is fake. Pipeline stages: the trainer's
        # `_build_pipeline` splits and parallelizes them, their materialization is deferred.
        model = build_model(job.model, device="meta")
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        pipe: _Pipeline | None = None
        with _ddp_as_buffer_term() as ddp_wrapped:
            if pp:
                with _deferred_materialize():
                    model, runtime = _build_pipeline(job, dims, model, LossScaler(job.precision),
                                                     torch.device("cpu"), grad_accum)
                pipe = _Pipeline(runtime, job=job, dims=dims, n_micro=n_micro)
            else:
                model = parallelize(model, dims, precision=job.precision, memory=job.memory,
                                    compile=False)
        with fake:
            with _no_weight_init():
                materialize(model, device="cpu", seed=job.train.seed)
            params = [p for p in model.parameters() if p.requires_grad]
            # the optimizer the target device would run: fused AdamW on GPUs (no foreach
            # temporaries; torch has a fused CPU kernel too), foreach on CPU
            target = "cpu" if job.hardware.gpu == "cpu" else "cuda"
            optimizer = build_optimizer(params, optim=job.optim, device_type=target, dims=dims)
            roots = ([(f"stage{sid}", mod) for sid, mod in zip(runtime.stage_ids, runtime.stages,
                                                                strict=True)]
                     if pipe is not None else [("model", model)])
            flops = 0.0
            state: dict[str, float] = {}
            # Step 1 (warm-up: optimizer states, lazy FSDP / DTensor state) runs before the
            # tracker exists: its per-op bookkeeping costs as much as the step itself, and it
            # registers what persists (parameters, gradients, optimizer states) when created.
            # FLOPs are counted on this step too (the same computation as step 2): the counter
            # keeps what activation checkpointing would free alive, so under the tracker it
            # would inflate the measured activations.
            counter = _flop_counter() if count_flops else None
            with counter or contextlib.nullcontext():
                _step(model, optimizer, _batches(job, dims, n_micro), job=job, dims=dims,
                      timeline=_Timeline(None, []), pipe=pipe)
            if counter is not None:
                flops = float(counter.get_total_flops()) * grad_accum / n_micro
            if pipe is not None:
                pipe.release_buffers()  # re-allocated under the tracker by step 2
            if dims.zero >= 2 and dims.fsdp_enabled:
                # FSDPMemTracker takes one FSDP root; with several stages its walk over
                # `modules()` is pointed at all of them (the only use it makes of the root)
                tracker = FSDPMemTracker(roots[0][1], optimizer)
                tracker._root_mod = model
            else:
                tracker = MemTracker()
                # ZeroRedundancyOptimizer keeps its states in the local optimizer `.optim`
                inner = getattr(optimizer, "optim", None)
                extra = [inner] if isinstance(inner, torch.optim.Optimizer) else []
                tracker.track_external(model, optimizer, *extra)
            timeline = _Timeline(tracker, roots)
            with _gradless_module_hooks(), tracker:
                timeline.recording = True
                timeline.mark("step_start")
                _step(model, optimizer, _batches(job, dims, n_micro), job=job, dims=dims,
                      timeline=timeline, state=state, tracker=tracker, pipe=pipe)
            peak = tracker.get_tracker_snapshot("peak")
            timeline.remove()
    memory = _breakdown(peak, rank, capacity)
    # The trackers label every allocation inside optimizer.step() as optimizer state, so a
    # peak inside the step counts foreach temporaries (e.g. AdamW's denominators) there. Keep
    # `optimizer` = the states themselves, and name the rest.
    states = _optimizer_state_bytes(optimizer)
    if memory.optimizer > states:
        memory.buffer_terms["optimizer_step_temp"] = memory.optimizer - states
        memory.buffers += memory.optimizer - states
        memory.optimizer = float(states)
    memory.detail.update(state)
    if ddp_wrapped:
        _add_ddp_buckets(memory, model, notes)
    if pipe is not None:
        notes.append(f"pipeline: stages {runtime.stage_ids} of {runtime.num_stages} driven "
                     f"in the {layout.pp_schedule} order of pp rank {pipe.pp_rank}")
    return Measurement(source="dryrun", rank=rank, world_size=world_size, memory=memory,
                       timeline=timeline.events, flops=flops, plan=plan_dict(job, layout),
                       wall_s=time.perf_counter() - t0, notes=notes)
