"""What torch 2.13 forces on a dry-run, kept in one place (each with the reason, and a test
pinned to the torch version in tests/unit/test_dryrun_torch_compat.py that fails when the reason
goes away).

1. `ActionSchedule`: torch's pipeline schedules cannot run under fake tensors (their P2P
   warm-up vote and shape inference call `.item()`: docs/DESIGN.md §3). This schedule class has
   their constructor and `step` signature and runs this rank's stages through the same
   actions, lowered by torch's own passes (FSDP UNSHARD/RESHARD, REDUCE_GRAD), calling the
   same `PipelineStage` methods; the trainer's `build_run(schedule_cls=...)` takes it, so the
   dry-run runs the trainer's `train_step` unchanged.
2. `gradless_module_hooks`: torch's `ModTracker` (inside `MemTracker` / `FSDPMemTracker`)
   keeps gradients alive that the trainer never holds (see its docstring).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Literal
from unittest import mock

import torch

from scaletrain.config import JobConfig

__all__ = [
    "ActionSchedule",
    "frozen_aware_mem_tracker",
    "gradless_module_hooks",
    "pp_actions",
    "pp_io_dtype",
]


def pp_actions(schedule: str, p: int, m: int, v: int, pp_rank: int) -> list[Any]:
    """This rank's actions for one step, lowered the way torch.distributed.pipelining does.

    The compute order is the planner's `pipeline_order` (torch's order without its no-op
    padding); torch's own lowering passes then add what its runtime adds: UNSHARD / RESHARD
    of FSDP stages (multi-stage schedules only, `_add_unshard_reshard`, 3 stages prefetched)
    and REDUCE_GRAD after a stage's last backward (`_add_reduce_grad`). Zero-bubble's B is
    torch's BACKWARD_INPUT ('I'), its W the deferred BACKWARD_WEIGHT. DualPipeV's order is
    torch's own (`ScheduleDualPipeV._calculate_single_rank_operations`, which reads nothing
    of the schedule but its pp size and micro-batch count; the planner has no DualPipeV order
    yet), its OVERLAP_F_B pairs run one after the other, as torch's runtime runs them.
    """
    from torch.distributed.pipelining.schedules import (
        _Action,
        _add_reduce_grad,
        _add_unshard_reshard,
        _ComputationType,
    )

    from scaletrain.planner.time.pipeline import pipeline_order

    if schedule == "dualpipev":
        return _dualpipev_actions(p, m, pp_rank)
    zb = schedule == "zero-bubble"
    kind = {
        "F": _ComputationType.FORWARD,
        "W": _ComputationType.BACKWARD_WEIGHT,
        "B": _ComputationType.BACKWARD_INPUT if zb else _ComputationType.FULL_BACKWARD,
    }
    actions: list[_Action | None] = [
        _Action(a.stage, kind[a.kind], a.microbatch)
        for a in pipeline_order(schedule, p, m, v)[pp_rank]
    ]
    if schedule not in ("gpipe", "1f1b"):
        actions = [*_add_unshard_reshard(actions)]
    return _add_reduce_grad(actions, m)


def _dualpipev_actions(p: int, m: int, pp_rank: int) -> list[Any]:
    """torch's DualPipeV order of `pp_rank` (see `pp_actions`), lowered the same way."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import (
        ScheduleDualPipeV,
        _Action,
        _add_reduce_grad,
        _add_unshard_reshard,
    )

    # the method reads only these two attributes of its schedule (no stages needed), so a
    # namespace stands in for `self`: the stubs want a ScheduleDualPipeV
    shape = SimpleNamespace(pp_group_size=p, _n_microbatches=m)
    order = ScheduleDualPipeV._calculate_single_rank_operations(shape, pp_rank)  # type: ignore[arg-type]
    actions: list[_Action | None] = [
        s for a in order if a is not None for s in (a.sub_actions or [a])
    ]
    return _add_reduce_grad([*_add_unshard_reshard(actions)], m)


def pp_io_dtype(job: JobConfig, dims: Any) -> torch.dtype:
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


def _fsdp_modules(module: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


class ActionSchedule:
    """Runs this rank's pipeline stages through one step's actions, under fake tensors.

    Constructed like torch's schedules (`stages, n_microbatches, loss_fn=, scale_grads=`) plus
    what torch's runtime learns by communicating, bound with `functools.partial`: the action
    list (`pp_actions`), the shape and dtype of the residual stream between stages, and the
    step's hooks (`trainer.step.StepHooks`: `stage_forward` before each stage forward,
    `backward_done:<stage>.<mb>` events). Each action makes the call torch's runtime makes:
    `forward_maybe_with_nosync`, `backward_maybe_with_nosync` ('full', or 'input' + 'weight'
    under zero-bubble), `perform_reduce_grad` (reduce-scatter, reshard, 1/m scaling) and FSDP
    `unshard` / `reshard`. Communication is replaced by what it leaves in memory:

    - forward receive buffers: one (B, T_local, h) tensor per micro-batch on every non-first
      stage, allocated once and kept (torch's `_setup_forward_recv_info`); the received
      activation *is* that buffer;
    - gradient receive buffers: one per micro-batch on every non-last stage, allocated at the
      first backward and kept (`_setup_backward_recv_info`);
    - no kept outputs (`return_outputs=False`): a micro-batch's logits live until its backward.
    The loss (`loss_fn`, the trainer's `PipelineRuntime.staged_loss`) is computed on the last
    stage right after its forward.
    """

    def __init__(
        self,
        stages: Any,
        n_microbatches: int,
        *,
        loss_fn: Any,
        scale_grads: bool,
        actions: list[Any],
        io_shape: tuple[int, ...],
        io_dtype: torch.dtype,
        split_backward: bool,
        hooks: Any,
    ) -> None:
        stages = stages if isinstance(stages, list) else [stages]
        self.stages = {ps.stage_index: ps for ps in stages}
        self.num_stages = stages[0].num_stages
        self.m = n_microbatches
        self.loss_fn = loss_fn
        assert scale_grads, "the trainer's schedules scale gradients to the micro-batch mean"
        self.actions = actions
        self.io_shape, self.io_dtype = io_shape, io_dtype
        self.split_backward = split_backward
        self.hooks = hooks
        self.recv: dict[int, list[torch.Tensor]] = {}
        self.grad_recv: dict[int, list[torch.Tensor]] = {}

    def release_buffers(self) -> None:
        """Drop the receive buffers (the next step allocates them again)."""
        self.recv.clear()
        self.grad_recv.clear()

    def _forward_buffers(self) -> None:
        for sid in self.stages:
            if sid > 0 and sid not in self.recv:
                self.recv[sid] = [
                    torch.empty(self.io_shape, dtype=self.io_dtype, requires_grad=True)
                    for _ in range(self.m)
                ]

    def step(
        self,
        *args: torch.Tensor,
        target: torch.Tensor | None = None,
        losses: list[torch.Tensor] | None = None,
        return_outputs: bool = True,
        **kwargs: torch.Tensor,
    ) -> None:
        """One step's forwards and backwards of this rank's stages (no optimizer); `kwargs`
        go to every stage's forward split into micro-batches, as torch's schedules do."""
        from torch.distributed.pipelining.schedules import _ComputationType as C

        inputs = list(torch.tensor_split(args[0], self.m)) if args else [None] * self.m
        kw_mbs = [
            {k: v[mb] for k, v in ((k, torch.tensor_split(t, self.m)) for k, t in kwargs.items())}
            for mb in range(self.m)
        ]
        targets = list(torch.tensor_split(target, self.m)) if target is not None else None
        self._forward_buffers()
        last = self.num_stages - 1
        cache: dict[tuple[int, int], tuple[Any, list[torch.Tensor], Any]] = {}
        pending_w: dict[tuple[int, int], tuple[Any, Any]] = {}
        for a in self.actions:
            sid, kind, mb = a.stage_index, a.computation_type, a.microbatch_index
            stage = self.stages[sid]
            if kind == C.FORWARD:
                x = inputs[mb] if sid == 0 else self.recv[sid][mb]
                self.hooks.stage_forward(stage.submod)
                # Under zero-bubble's autograd.grad the trackers' multi-grad hooks reject a
                # leaf among a module's inputs: feed the stage a view of its receive buffer
                # (no memory; the gradient still reaches the buffer itself).
                fx = x.view_as(x) if self.split_backward and sid > 0 else x
                out = stage.forward_maybe_with_nosync(fx, **kw_mbs[mb])
                logits = None
                if sid == last:
                    assert targets is not None
                    logits, out = out, self.loss_fn(out, targets[mb])
                    if losses is not None:
                        losses.append(out)
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
                self.hooks.event(f"backward_done:{sid}.{mb}")
            elif kind == C.BACKWARD_WEIGHT:
                groups, kw = pending_w.pop((sid, mb))
                if sid == 0:
                    stage.backward_maybe_with_nosync("full", kw)
                else:
                    stage.backward_maybe_with_nosync(
                        "weight", {"stage_output": kw["stage_output"], "param_groups": groups}
                    )
            elif kind == C.UNSHARD:
                for mod in _fsdp_modules(stage.submod):
                    mod.unshard()
            elif kind == C.RESHARD:
                for mod in _fsdp_modules(stage.submod):
                    mod.reshard()
            elif kind == C.REDUCE_GRAD:
                stage.perform_reduce_grad(self.m)  # scale_grads=True: mean over mbs

    def _bwd_kwargs(
        self, sid: int, mb: int, out: Any, inputs: list[torch.Tensor]
    ) -> dict[str, Any]:
        if sid == self.num_stages - 1:
            return {"stage_output": out, "output_grads": None, "input_values": inputs}
        if sid not in self.grad_recv:
            self.grad_recv[sid] = [torch.empty_like(out) for _ in range(self.m)]
        return {
            "stage_output": (out,),
            "output_grads": (self.grad_recv[sid][mb],),
            "input_values": inputs,
        }


@contextlib.contextmanager
def gradless_module_hooks() -> Iterator[None]:
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

    def register(tensors, fn, *, mode: Literal["all", "any"] = "all"):  # noqa: ANN001, ANN202
        if mode != "all":
            return original(tensors, fn, mode=mode)
        refs = [weakref.ref(t) for t in tensors]
        pending: dict[int, int] = {}

        def hook(_grad: torch.Tensor) -> None:
            task = torch._C._current_graph_task_id()
            if task not in pending:
                alive = [t for t in (r() for r in refs) if t is not None]
                pending[task] = sum(
                    torch._C._will_engine_execute_node(_get_grad_fn_or_grad_acc(t)) for t in alive
                )
            pending[task] -= 1
            if pending[task] <= 0:
                del pending[task]
                fn([None] * len(refs))

        return _MultiHandle(tuple(t.register_hook(hook) for t in tensors))

    with mock.patch.object(mod_tracker, "register_multi_grad_hook", register):
        yield


class _NoHandle:
    """A hook handle for a hook that was never registered."""

    def remove(self) -> None:
        return None


def frozen_aware_mem_tracker() -> Any:
    """torch's `MemTracker` for models with frozen parameters (LoRA's base).

    MemTracker registers a gradient hook on every parameter of a module it enters, and
    `register_hook` refuses a tensor that does not require a gradient. A frozen parameter never
    has a gradient to attribute, so it is entered in the tracker's own table of hooked
    parameters with handles that were never registered, and MemTracker skips it (it hooks a
    parameter only when that table has no entry); everything else it does is unchanged."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class _Tracker(MemTracker):
        def _track_module_params_and_buffers(  # type: ignore[override]  # same signature
            self, module: torch.nn.Module, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            for p in module.parameters():
                if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[p] = (_NoHandle(), _NoHandle())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return _Tracker()
