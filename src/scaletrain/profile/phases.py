"""Where the wall time of a step goes: a phase clock driven by hooks placed from the outside.

The trainer's `train_step` is called unchanged. Every instant of a step belongs to exactly one
phase; hooks on the batch iterator, the model and the autograd engine switch the phase:

  data       `next(batches)` (loader wait) and the host-to-device copy up to the forward
  forward    the model's forward (pipeline: every stage module's forward)
  loss       model output -> gradient of the output: the loss, its backward, `.backward()` entry
             (pipeline: "schedule", i.e. P2P sends/receives and waits between stage calls)
  backward   from the output gradient until the autograd engine finishes
  recompute  activation checkpointing: module forwards re-run inside the backward
  post       after the backward: grad sync, unscale, clip (and accumulation bookkeeping)
  optimizer  `trainer.step.apply_update`: optimizer step, scaler update, zero_grad (our driver)

Each phase is also a `record_function("scaletrain::<phase>")` range, so the Chrome trace shows the
same boundaries and every profiler event can be attributed to a phase by its start time.
On CUDA the clock synchronizes the device at every switch (a phase then means device work done,
not kernels queued), which removes overlap across phase boundaries: that is the price of a
per-phase answer.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch.autograd.profiler import record_function

__all__ = ["PhaseClock", "PHASES", "TimedBatches", "install_hooks"]

PHASES = (
    "data",
    "forward",
    "loss",
    "schedule",
    "backward",
    "recompute",
    "post",
    "optimizer",
    "other",
)
RANGE_PREFIX = "scaletrain::"


class PhaseClock:
    """A state machine: `switch(phase)` closes the current phase's range and opens the next."""

    def __init__(self, *, sync_cuda: bool = False) -> None:
        self.sync_cuda = sync_cuda
        self.totals: dict[str, float] = defaultdict(float)
        self.phase: str | None = None
        self._t = 0.0
        self._range: record_function | None = None
        self.in_backward = False
        self._module_stack: list[bool] = []
        self._recompute_depth = 0

    def _now(self) -> float:
        if self.sync_cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def switch(self, phase: str | None) -> None:
        now = self._now()
        if self.phase is not None:
            self.totals[self.phase] += now - self._t
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        self.phase, self._t = phase, now
        if phase is not None:
            self._range = record_function(RANGE_PREFIX + phase)
            self._range.__enter__()

    def start_step(self) -> None:
        self.in_backward, self._recompute_depth, self._module_stack = False, 0, []
        self.switch("other")

    def end_step(self) -> None:
        self.switch(None)
        self.in_backward = False

    def reset(self) -> None:
        self.totals.clear()

    # -- hooks ------------------------------------------------------------------------------
    def _backward_started(self, _grad: torch.Tensor) -> None:
        if self.in_backward:
            return
        self.in_backward = True
        self.switch("backward")
        # runs once the engine has drained the whole graph (the hook DDP uses for its reducer)
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self.in_backward, self._recompute_depth, self._module_stack = False, 0, []
        self.switch("post")

    def top_pre(self, _module, _args) -> None:
        if not self.in_backward:
            self.switch("forward")

    def top_post(self, after: str):
        def hook(_module, _args, output) -> None:
            if self.in_backward:
                return
            self.switch(after)
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._backward_started)

        return hook

    def any_pre(self, _module, _args) -> None:
        # a module forward inside the backward is activation-checkpoint recomputation
        recomputing = self.in_backward
        self._module_stack.append(recomputing)
        if recomputing:
            if self._recompute_depth == 0:
                self.switch("recompute")
            self._recompute_depth += 1

    def any_post(self, _module, _args, _output) -> None:
        if self._module_stack and self._module_stack.pop():
            self._recompute_depth -= 1
            if self._recompute_depth == 0 and self.in_backward:
                self.switch("backward")


class TimedBatches(Iterator):
    """Wraps the trainer's batch iterator: each `next()` opens the data phase."""

    def __init__(self, inner: Iterator, clock: PhaseClock) -> None:
        self.inner, self.clock = inner, clock

    def __next__(self):
        self.clock.switch("data")
        return next(self.inner)


class _AttentionRange:
    """`record_function("scaletrain::attention")` around every attention-core forward, so the
    op classifier can tell the attention core's matmuls and softmax from the projections'."""

    def __init__(self) -> None:
        self.stack: list[record_function] = []

    def pre(self, _module, _args) -> None:
        rf = record_function(RANGE_PREFIX + "attention")
        rf.__enter__()
        self.stack.append(rf)

    def post(self, _module, _args, _output) -> None:
        if self.stack:
            self.stack.pop().__exit__(None, None, None)


def _is_attention_core(name: str, module: torch.nn.Module) -> bool:
    return name.endswith("attention.core") or type(module).__name__.endswith("AttentionCore")


def install_hooks(
    tops: list[torch.nn.Module], clock: PhaseClock, *, pipelined: bool, submodules: bool = True
) -> list:
    """Hooks on the top modules (phase switches), every submodule (recompute detection) and
    the attention cores (attention ranges); returns the handles to remove afterwards.

    `submodules=False` (torch.compile runs: hooks inside compiled regions would be traced or
    break graphs) keeps only the phase switches: no recompute split, no attention ranges.
    """
    handles = []
    after = "schedule" if pipelined else "loss"
    attention = _AttentionRange()
    for top in tops:
        handles.append(top.register_forward_pre_hook(clock.top_pre))
        handles.append(top.register_forward_hook(clock.top_post(after)))
        for name, mod in top.named_modules():
            if mod is top or not submodules:
                continue
            handles.append(mod.register_forward_pre_hook(clock.any_pre))
            # always_call: non-reentrant checkpointing stops a recomputation early by raising
            # once it has what backward needs; the post-hook must still close the range
            handles.append(mod.register_forward_hook(clock.any_post, always_call=True))
            if _is_attention_core(name, mod):
                handles.append(mod.register_forward_pre_hook(attention.pre))
                handles.append(mod.register_forward_hook(attention.post, always_call=True))
    return handles
