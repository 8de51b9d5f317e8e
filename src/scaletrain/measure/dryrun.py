"""Dry-run: the trainer's real training step under fake tensors, as one rank of any world size.

No memory is allocated and no kernel runs: `FakeTensorMode` propagates shapes and dtypes, the
`fake` process-group backend (with a `FakeStore`) answers every collective locally, and
`torch.distributed._tools`' trackers (`FSDPMemTracker` for FSDP, `MemTracker` otherwise) count
the bytes each storage would hold, by category. The model, mesh, parallelization and optimizer
come from the trainer's own build functions (`build_model`, `ParallelDims`, `parallelize`,
`materialize`, `build_optimizer`), so what is measured is what `scaletrain train` would run.

Two optimizer steps run; the second one is reported (the first allocates the optimizer states
and warms lazy state). Each step runs min(grad_accum, 2) micro-batches: the second micro-batch
already sees accumulated gradients, which is every state a longer accumulation reaches (peak
activations are per micro-batch), so running all of them would only cost time.

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
no foreach temporaries). FLOPs are counted with `FlopCounterMode` for one step of this rank
(scaled from the micro-batches run to all of them): matmuls only, attention over the full
T x T matrix, flash backward with its QK^T recomputation; DTensor (TP) matmuls are counted at
their global shapes, so under tp > 1 the figure is the tensor-parallel group's.

Not supported yet (raise `ConfigError`): pipeline parallelism (the schedules call `.item()`
under fake mode, DESIGN.md §3) and MoE (the expert dispatch reads token counts with
`.tolist()`, a data-dependent value fake tensors do not have).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

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
    if layout.pp > 1:
        raise ConfigError("parallel.pp", layout.pp, "the dry-run does not drive pipeline "
                          "schedules yet: dry-run one stage's layers with pp=1 and fewer "
                          "layers, or use `scaletrain plan`")
    if job.model.is_moe:
        raise ConfigError("model", job.model.name, "the dry-run cannot run MoE layers yet "
                          "(their expert dispatch reads token counts, which fake tensors do "
                          "not have): use `scaletrain plan`")
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

    def __init__(self, tracker: Any, model: torch.nn.Module) -> None:
        self.events: list[tuple[str, int]] = []
        self.recording = False
        self._tracker = tracker
        self._handles = []
        modules = [("model", model)]
        modules += [(f"layers.{n}", b) for n, b in getattr(model, "layers", {}).items()]
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
          state: dict[str, float] | None = None, tracker: Any = None) -> None:
    """One optimizer step as the trainer runs it: micro-batches, backward, clip, update.

    `state` (if given) receives the exact local bytes of parameters, gradients (after the
    last backward) and optimizer states (after the update): the sizes at rest, whereas the
    tracker's peak breakdown is read at one moment.
    """
    from scaletrain.models import causal_lm_loss
    from scaletrain.parallel import clip_grad_norm_, local_state_bytes, loss_context, maybe_no_sync

    def record() -> None:
        if state is not None:
            for k, v in local_state_bytes(model, optimizer).items():
                state[f"state.{k}"] = max(state.get(f"state.{k}", 0.0), float(v))
    from scaletrain.trainer.build import tp_mesh
    from scaletrain.trainer.precision import autocast

    for k, (inputs, targets, positions) in enumerate(batches):
        if tracker is not None:
            # the trackers refuse a second forward of the root without a reset of their
            # per-module statistics (the running totals and the peak are kept)
            tracker.reset_mod_stats()
        last = k == len(batches) - 1
        with maybe_no_sync(model, last), loss_context(tp_mesh(dims)):
            with autocast(job.precision, "cpu"):
                logits = model(inputs, positions=positions)
                loss = causal_lm_loss(logits, targets)
            timeline.mark(f"loss:{k}")
            (loss / len(batches)).backward()
        timeline.mark(f"backward_done:{k}")
    record()
    clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                    job.optim.grad_clip or float("inf"))
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

    Returns the second step's peak memory by category (`Measurement.memory`), a timeline of
    allocated bytes at block boundaries, and this rank's FLOPs for that step.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from scaletrain.models import build_model, materialize
    from scaletrain.parallel import ParallelDims, parallelize
    from scaletrain.trainer.optim import build_optimizer

    layout = job.layout(world_size)
    _unsupported(job, layout)
    if not 0 <= rank < world_size:
        raise ConfigError("rank", rank, f"choose a rank in [0, {world_size})")
    t0 = time.perf_counter()
    grad_accum = job.batch.global_batch // (job.batch.micro_batch * layout.dp)
    n_micro = min(grad_accum, DRYRUN_MICROBATCHES)
    notes = [f"dry-run ran {n_micro} of {grad_accum} micro-batches per step"]
    capacity = job.hardware.spec().memory_bytes if job.hardware.gpu != "cpu" else 0.0
    with _fake_world(rank, world_size), _real_mesh_tensors():
        dims = ParallelDims.from_layout(layout, world_size)
        if world_size > 1:
            dims.build_mesh("cpu")
        # Built and parallelized on meta outside fake mode, as the trainer does; only the
        # materialization (and everything after) is fake.
        model = build_model(job.model, device="meta")
        with _ddp_as_buffer_term() as ddp_wrapped:
            model = parallelize(model, dims, precision=job.precision, memory=job.memory,
                                compile=False)
        with FakeTensorMode(allow_non_fake_inputs=True):
            materialize(model, device="cpu", seed=job.train.seed)
            params = [p for p in model.parameters() if p.requires_grad]
            # the optimizer the target device would run: fused AdamW on GPUs (no foreach
            # temporaries; torch has a fused CPU kernel too), foreach on CPU
            target = "cpu" if job.hardware.gpu == "cpu" else "cuda"
            optimizer = build_optimizer(params, optim=job.optim, device_type=target, dims=dims)
            fsdp = dims.zero >= 2 and dims.fsdp_enabled
            tracker = FSDPMemTracker(model, optimizer) if fsdp else MemTracker()
            if not fsdp:
                tracker.track_external(model, optimizer)
            timeline = _Timeline(tracker, model)
            flops = 0.0
            state: dict[str, float] = {}
            with tracker:
                _step(model, optimizer, _batches(job, dims, n_micro), job=job, dims=dims,
                      timeline=timeline, tracker=tracker)
                tracker.reset_mod_stats()
                # peak of step 2 only: restart the peak from what is allocated now
                tracker._peak_mem_snap = tracker.get_tracker_snapshot()
                tracker._peak_mem = {d: s["Total"] for d, s in tracker._peak_mem_snap.items()}
                timeline.recording = True
                timeline.mark("step_start")
                counter = _flop_counter() if count_flops else None
                with counter or contextlib.nullcontext():
                    _step(model, optimizer, _batches(job, dims, n_micro), job=job, dims=dims,
                          timeline=timeline, state=state, tracker=tracker)
                if counter is not None:
                    flops = float(counter.get_total_flops()) * grad_accum / n_micro
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
    return Measurement(source="dryrun", rank=rank, world_size=world_size, memory=memory,
                       timeline=timeline.events, flops=flops, plan=plan_dict(job, layout),
                       wall_s=time.perf_counter() - t0, notes=notes)
