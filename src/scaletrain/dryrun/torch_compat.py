"""What torch 2.13 forces on a dry-run, kept in one place (each with the reason, and a test
pinned to the torch version in tests/unit/test_dryrun_torch_compat.py that fails when the reason
goes away).

1. `ActionSchedule`: torch's pipeline schedules cannot run under fake tensors (their P2P
   warm-up vote and shape inference call `.item()`: docs/DESIGN.md §3). This schedule class has
   their constructor and `step` signature and runs this rank's stages through the same
   actions, lowered by torch's own passes (FSDP UNSHARD/RESHARD, REDUCE_GRAD, sends and
   receives), calling the same `PipelineStage` methods and holding receive buffers and sent
   tensors as the trainer's stages do (`parallel/pipeline_stage.py`); the trainer's
   `build_run(schedule_cls=...)` takes it, so the dry-run runs the trainer's `train_step`
   unchanged.
2. `gradless_module_hooks`: torch's `ModTracker` (inside `MemTracker` / `FSDPMemTracker`)
   keeps gradients alive that the trainer never holds (see its docstring).
3. `frozen_aware_mem_tracker` / `fsdp_mem_tracker`: the trackers with the process-wide peak
   only (`_GlobalPeakOnly`): torch's update of per-module peaks after every operator walks
   every module seen so far, 25-40% of a dry-run's time, for statistics it never reads.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator
from typing import Any, Literal
from unittest import mock

import torch

from scaletrain.config import JobConfig

__all__ = [
    "ActionSchedule",
    "frozen_aware_mem_tracker",
    "fsdp_mem_tracker",
    "gradless_module_hooks",
    "pp_actions",
    "pp_io_dtype",
]


def pp_actions(schedule: str, p: int, m: int, v: int, pp_rank: int) -> list[Any]:
    """This rank's events of one step (`planner.time.pipeline_comms.Op`s), as the trainer runs
    them: compute, receives posted, sends fired and let go, UNSHARD / RESHARD / REDUCE_GRAD.

    Multi-stage schedules (interleaved, zero-bubble, dualpipev): every rank's compute order
    (the planner's `rank_groups`, torch's order: tests/unit/test_pipeline_orders_torch.py) lowered
    by torch's own passes as its runtime lowers it (`_add_unshard_reshard`, 3 stages
    prefetched; `_add_reduce_grad`; `_add_send_recv`, which places the receives), then the
    sends let go where the trainer's `SendLedger` lets them go
    (`pipeline_comms.with_releases`). gpipe / 1f1b: torch's single-stage loop posts and waits
    its own (`pipeline_comms.rank_events`), and reduces the gradients after the last backward.
    """
    from scaletrain.planner.time.pipeline_comms import SINGLE_STAGE, Op, rank_events

    if schedule in SINGLE_STAGE:
        events = list(rank_events(schedule, p, m, v, pp_rank))
        return [*events, Op(pp_rank, "REDUCE_GRAD")]
    return _lowered_by_torch(schedule, p, m, v)[pp_rank]


def _lowered_by_torch(schedule: str, p: int, m: int, v: int) -> dict[int, list[Any]]:
    """Every rank's events of a multi-stage schedule, lowered by torch (see `pp_actions`)."""
    from torch.distributed.pipelining.schedules import (
        _Action,
        _add_reduce_grad,
        _add_send_recv,
        _add_unshard_reshard,
        _ComputationType,
    )

    from scaletrain.parallel.pipeline_stage import planner_op
    from scaletrain.planner.time.pipeline import rank_groups, stage_rank
    from scaletrain.planner.time.pipeline_comms import with_releases

    kind = {
        "F": _ComputationType.FORWARD,
        "B": _ComputationType.FULL_BACKWARD,
        "I": _ComputationType.BACKWARD_INPUT,
        "W": _ComputationType.BACKWARD_WEIGHT,
    }

    def action(g: tuple) -> _Action:
        subs = tuple(_Action(a.stage, kind[a.kind], a.microbatch) for a in g)
        return subs[0] if len(subs) == 1 else _Action(-1, _ComputationType.OVERLAP_F_B, None, subs)

    compute: dict[int, list[_Action | None]] = {
        r: [action(g) for g in rank_groups(schedule, p, m, v, r)] for r in range(p)
    }
    fsdp_aware: dict[int, list[_Action]] = {}
    for r, acts in compute.items():
        with_fsdp: list[_Action | None] = [*_add_unshard_reshard(acts)]
        fsdp_aware[r] = [a for a in _add_reduce_grad(with_fsdp, m) if a is not None]
    lowered = _add_send_recv(
        fsdp_aware, stage_to_rank=lambda s: stage_rank(schedule, p, s), num_stages=p * v
    )
    orders = {
        r: [planner_op(s) for a in acts for s in (a.sub_actions or (a,))]
        for r, acts in lowered.items()
    }
    return with_releases(orders, lambda s: stage_rank(schedule, p, s), p * v)


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
    """Runs this rank's pipeline stages through one step's events, under fake tensors.

    Constructed like torch's schedules (`stages, n_microbatches, loss_fn=, scale_grads=`) plus
    what torch's runtime learns by communicating, bound with `functools.partial`: the events
    (`pp_actions`), the shape and dtype of the residual stream between stages, and the step's
    hooks (`trainer.step.StepHooks`: `stage_forward` before each stage forward,
    `backward_done:<stage>.<mb>` events). Each compute event makes the call torch's runtime
    makes: `forward_maybe_with_nosync`, `backward_maybe_with_nosync` ('full', or 'input' +
    'weight' for a split backward), `perform_reduce_grad` (reduce-scatter, reshard, 1/m
    scaling) and FSDP `unshard` / `reshard`. Communication is replaced by what it leaves in
    memory, held as the trainer's stages hold it (`parallel/pipeline_stage.py`):

    - a receive allocates its (B, T_local, h) buffer when it is posted; the received
      activation *is* that buffer, kept by the stage (as torch's `fwd_cache`) until the
      micro-batch's backward; a received gradient until the backward (W after a split one);
    - on the V's turn (dualpipev) the previous stage's output, detached, is the input;
    - a send keeps its tensor (the stage's output, or its input gradient) until the event that
      lets it go;
    - the last stage's loss is cut from its graph after its backward, as the trainer's stage
      does (`let_go_of_graph`); no kept outputs (`return_outputs=False`).
    The loss (`loss_fn`, the trainer's `PipelineRuntime.staged_loss`) is computed on the last
    stage right after its forward. `peak_boundary` counts, as `pipeline_comms.boundary_tensors`
    defines them, the stage-boundary tensors held at once (bytes: `peak_boundary_bytes`).
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
        self.peak_boundary = 0
        self._state = _StepState()

    @property
    def peak_boundary_bytes(self) -> float:
        one = torch.empty((), dtype=self.io_dtype).element_size()
        return float(self.peak_boundary * one * int(torch.Size(self.io_shape).numel()))

    def release_buffers(self) -> None:
        """Forget the step's peak (every buffer is dropped by the end of a step)."""
        self.peak_boundary = 0
        self._state = _StepState()

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
        inputs = list(torch.tensor_split(args[0], self.m)) if args else [None] * self.m
        kw_mbs = [
            {k: v[mb] for k, v in ((k, torch.tensor_split(t, self.m)) for k, t in kwargs.items())}
            for mb in range(self.m)
        ]
        targets = list(torch.tensor_split(target, self.m)) if target is not None else None
        st = self._state = _StepState()
        for a in self.actions:
            kind, sid, mb = a.kind, a.stage, a.microbatch
            if kind == "RECV_F":
                st.recv[(sid, mb)] = torch.empty(self.io_shape, dtype=self.io_dtype)
            elif kind == "RECV_B":
                st.grad[(sid, mb)] = torch.empty(self.io_shape, dtype=self.io_dtype)
            elif kind == "F":
                self._forward(sid, mb, inputs, kw_mbs, targets, losses)
            elif kind in ("B", "I"):
                self._backward(sid, mb, full=kind == "B")
            elif kind == "W":
                self._weight(sid, mb)
            elif kind == "SEND_F":
                st.sent[(kind, sid, mb)] = st.cache[(sid, mb)][0]
            elif kind == "SEND_B":
                st.sent[(kind, sid, mb)] = st.input_grad.pop((sid, mb))
            elif kind == "RELEASE":
                del st.sent[(a.detail, sid, mb)]
            elif kind == "UNSHARD":
                for mod in _fsdp_modules(self.stages[sid].submod):
                    mod.unshard()
            elif kind == "RESHARD":
                for mod in _fsdp_modules(self.stages[sid].submod):
                    mod.reshard()
            elif kind == "REDUCE_GRAD":
                self.stages[sid].perform_reduce_grad(self.m)  # scale_grads=True: mean over mbs
            self.peak_boundary = max(self.peak_boundary, st.boundary(self.num_stages))
        assert not (st.recv or st.grad or st.sent or st.cache or st.pending_w), "step left over"

    def _forward(
        self, sid: int, mb: int, inputs: list, kw_mbs: list, targets: Any, losses: Any
    ) -> None:
        st, stage = self._state, self.stages[sid]
        if sid == 0:
            x = inputs[mb]
        elif sid - 1 in self.stages:  # the V's turn: the previous stage's output, detached
            x = st.cache[(sid - 1, mb)][0].detach().requires_grad_()
        else:
            x = st.recv.pop((sid, mb)).requires_grad_()
        self.hooks.stage_forward(stage.submod)
        # Under a split backward's autograd.grad the trackers' multi-grad hooks reject a leaf
        # among a module's inputs: feed the stage a view of its input (no memory; the
        # gradient still reaches the input itself).
        fx = x.view_as(x) if self.split_backward and sid > 0 else x
        out = stage.forward_maybe_with_nosync(fx, **kw_mbs[mb])
        logits = None
        if sid == self.num_stages - 1:
            assert targets is not None
            logits, out = out, self.loss_fn(out, targets[mb])
            if losses is not None:
                losses.append(out)
        st.cache[(sid, mb)] = (out, [x], logits)

    def _backward(self, sid: int, mb: int, *, full: bool) -> None:
        from scaletrain.parallel.pipeline_stage import let_go_of_graph

        st, stage = self._state, self.stages[sid]
        out, inputs, logits = st.cache.pop((sid, mb))
        last = sid == self.num_stages - 1
        if last:
            kw = {"stage_output": out, "output_grads": None, "input_values": inputs}
        else:
            g = (
                st.input_grad.pop((sid + 1, mb))
                if sid + 1 in self.stages
                else st.grad.pop((sid, mb))
            )
            kw = {"stage_output": (out,), "output_grads": (g,), "input_values": inputs}
        grads: Any = (None,)
        if full:
            grads, _ = stage.backward_maybe_with_nosync("full", kw)
        elif sid == 0:
            st.pending_w[(sid, mb)] = (None, kw)  # torch: stage 0 defers it all to W
        else:
            if isinstance(kw["stage_output"], torch.Tensor):
                kw["stage_output"] = (kw["stage_output"],)
            grads, groups = stage.backward_maybe_with_nosync("input", kw)
            st.pending_w[(sid, mb)] = (groups, kw)
        if sid > 0 and grads[0] is not None:
            st.input_grad[(sid, mb)] = grads[0]  # sent, or the previous stage's on the V
        if logits is not None and sid > 0 and not logits._is_view():
            logits.detach_()  # as torch's backward_one_chunk: drop the graph ref
        if last and full:
            let_go_of_graph(out)
        self.hooks.event(f"backward_done:{sid}.{mb}")

    def _weight(self, sid: int, mb: int) -> None:
        from scaletrain.parallel.pipeline_stage import let_go_of_graph

        groups, kw = self._state.pending_w.pop((sid, mb))
        stage = self.stages[sid]
        if sid == 0:
            stage.backward_maybe_with_nosync("full", kw)
        else:
            stage.backward_maybe_with_nosync(
                "weight", {"stage_output": kw["stage_output"], "param_groups": groups}
            )
        if sid == self.num_stages - 1:
            let_go_of_graph(kw["stage_output"][0])


class _StepState:
    """What one step of `ActionSchedule` holds between events, keyed by (stage, micro-batch)."""

    def __init__(self) -> None:
        self.recv: dict[tuple[int, int], torch.Tensor] = {}
        """Activation receive buffers posted, not yet consumed."""
        self.grad: dict[tuple[int, int], torch.Tensor] = {}
        """Gradient receive buffers posted, not yet consumed."""
        self.cache: dict[tuple[int, int], tuple[Any, list[torch.Tensor], Any]] = {}
        """Forward output, inputs and logits until the backward (torch's `fwd_cache`)."""
        self.pending_w: dict[tuple[int, int], tuple[Any, Any]] = {}
        """A split backward's state until its W (torch's `backward_state`)."""
        self.input_grad: dict[tuple[int, int], torch.Tensor] = {}
        """Input gradients until sent (torch's `bwd_cache`) or read by the previous stage."""
        self.sent: dict[tuple[str, int, int], torch.Tensor] = {}
        """Tensors of sends not yet let go."""

    def boundary(self, num_stages: int) -> int:
        """Distinct stage-boundary tensors held (as `pipeline_comms.boundary_tensors` counts
        them): receive buffers posted, outputs and received gradients kept for backward, input
        gradients, sends; not a tensor a stage holds as its input (an activation)."""
        from torch.multiprocessing.reductions import StorageWeakRef

        held = [*self.recv.values(), *self.grad.values(), *self.input_grad.values()]
        held += self.sent.values()
        acts: list[Any] = []
        for (sid, _), (out, ins, _logits) in self.cache.items():
            acts += ins
            if sid < num_stages - 1:
                held.append(out)
        for _groups, kw in self.pending_w.values():
            acts += kw["input_values"]
            if kw["output_grads"] is not None:  # not the last stage: its output and gradient
                held += [kw["stage_output"][0], kw["output_grads"][0]]

        def ref(t: torch.Tensor) -> Any:
            return StorageWeakRef(t.untyped_storage())  # a view and its base share it

        mine = {ref(t) for t in acts if isinstance(t, torch.Tensor)}
        return len({ref(t) for t in held} - mine)


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


class _GlobalPeakOnly:
    """Mixed into torch's trackers: after each operator, update the process-wide peak only.

    torch 2.13's `MemTracker._update_peak_stats` (inherited by `FSDPMemTracker`) first walks
    the statistics of every module tracked so far to raise the local peaks of those still
    active, then the tracker's own peak. The dry-run reads the tracker's peak snapshot
    (`get_tracker_snapshot("peak")`) and its current one (the timeline), never a module's:
    the walk was 25-40% of a dry-run's CPU time (a 4-layer pipeline stage at 16 micro-batches:
    7.1 s -> 4.3 s, the same peak to the byte; llama3-8b's dry-run iterated 2.2 million weak
    references for it). The second half below is torch's, unchanged."""

    _curr_mem_snap: dict[Any, dict[str, int]]
    _peak_mem: dict[Any, int]
    _peak_mem_snap: dict[Any, dict[str, int]]

    def _update_peak_stats(self, peak_state: Any) -> None:
        from torch.distributed._tools.mem_tracker import _TOTAL_KEY

        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)


def fsdp_mem_tracker(root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """torch's `FSDPMemTracker` for `root`, keeping the process-wide peak only
    (`_GlobalPeakOnly`)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class _Tracker(_GlobalPeakOnly, FSDPMemTracker):
        pass

    return _Tracker(root, optimizer)


def frozen_aware_mem_tracker() -> Any:
    """torch's `MemTracker` for models with frozen parameters (LoRA's base).

    MemTracker registers a gradient hook on every parameter of a module it enters, and
    `register_hook` refuses a tensor that does not require a gradient. A frozen parameter never
    has a gradient to attribute, so it is entered in the tracker's own table of hooked
    parameters with handles that were never registered, and MemTracker skips it (it hooks a
    parameter only when that table has no entry); it keeps the process-wide peak only
    (`_GlobalPeakOnly`); everything else it does is unchanged."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class _Tracker(_GlobalPeakOnly, MemTracker):
        def _track_module_params_and_buffers(  # type: ignore[override]  # same signature
            self, module: torch.nn.Module, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            for p in module.parameters():
                if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[p] = (_NoHandle(), _NoHandle())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return _Tracker()
