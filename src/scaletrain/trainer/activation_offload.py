"""Activation offload (`memory.offload` = 'activations' / '...+activations'): what autograd
saves for backward goes to host memory during forward and comes back in backward.

`ActivationOffload` installs `torch.autograd.graph.saved_tensors_hooks` around the step's
forwards, the mechanism of torch's `save_on_cpu`: the pack hook copies each saved tensor into
a host tensor (pinned on CUDA, so the copy is asynchronous to the host), the device tensor is
then freed as soon as the forward drops it, and the unpack hook copies it back when its
backward op runs. Two differences from `save_on_cpu`, the reasons this is written out:

- parameters and views of them stay where they are (FSDP2's unsharded parameters are
  `nn.Parameter`s too; `F.linear` saves its weight as the view `weight.t()`; an NF4 weight is
  a Parameter): they are not activations, they outlive the step on the device anyway, and
  `save_on_cpu` would copy every weight a linear saves to the host on every micro-batch
  (torchtune's `OffloadActivations` skips parameters too);
- the host device is an argument: the trainer passes the CPU; the dry-run passes 'meta'
  (`build_run(activation_host=...)`), so that its fake tensors' host copies are told apart from
  device memory and measured as host bytes (on a CPU device `save_on_cpu` is a no-op, and a
  dry-run on fake CPU tensors would see nothing move).

A tensor saved by several ops is copied once per forward: an RMSNorm's fp32 input (two of
its ops), the normed input q, k and v each save as their own 2-D view, the attention output
SDPA and the output projection both save. The hooks remember each copy by the view it is
(storage, offset, shape, strides, dtype) while that storage is alive and unmodified (its
version counter, which views share): the host holds each saved view once (on llama2-7b
widths, 0.83 -> 0.70 GB per micro-batch-block in the dry-run).

On a CPU run the host is the device: the pack hook still copies each saved tensor (the device
one is freed as on a GPU, so memory is unchanged) and the unpack returns the copy: the same code
path runs and moves nothing (`save_on_cpu` would return the tensor itself there), so CPU tests
exercise the copy and its return exactly. The copies run in
the compute stream's order (`non_blocking` into pinned memory): they do not overlap with the
kernels on the device; a side stream with events (torchtune's) would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["ActivationOffload", "NO_OFFLOAD", "build_activation_offload"]


class ActivationOffload:
    """The saved-tensor hooks of one run (see the module docstring). `host`: where saved
    tensors go; `pin`: page-locked host copies (on CUDA devices)."""

    def __init__(self, host: torch.device, *, pin: bool) -> None:
        self.host = host
        self.pin = pin
        self._copies: dict[tuple, tuple[StorageWeakRef, int, Any]] = {}

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            self._copies.clear()  # the graph holds the copies it needs

    def _pack(self, t: torch.Tensor) -> Any:
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return t  # a weight (or a view of one), not an activation
        storage = t.untyped_storage()
        ref = StorageWeakRef(storage)  # (its cdata: the storage itself, fake or real)
        key = (ref.cdata, t.storage_offset(), t.shape, t.stride(), t.dtype, t.device)
        seen = self._copies.get(key)
        if seen is not None and not seen[0].expired() and seen[1] == t._version:
            return seen[2]  # this forward already copied this very view, unmodified
        packed = torch.empty(
            t.size(), dtype=t.dtype, layout=t.layout, device=self.host, pin_memory=self.pin
        )
        packed.copy_(t, non_blocking=self.pin)
        out = (t.device, packed)
        self._copies[key] = (ref, t._version, out)
        return out

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, t = packed
        return t.to(device, non_blocking=self.pin)


class _NoOffload(ActivationOffload):
    def __init__(self) -> None:
        super().__init__(torch.device("cpu"), pin=False)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        yield


NO_OFFLOAD: ActivationOffload = _NoOffload()
"""Runs without activation offload: no hooks installed."""


def build_activation_offload(
    offload: bool, device: torch.device, host: torch.device | None = None
) -> ActivationOffload:
    """The run's offload hooks: `NO_OFFLOAD` unless `offload`; the host is the CPU (pinned
    when `device` is CUDA) unless given (the dry-run's 'meta')."""
    if not offload:
        return NO_OFFLOAD
    pin = device.type == "cuda" and host is None
    return ActivationOffload(host or torch.device("cpu"), pin=pin)
