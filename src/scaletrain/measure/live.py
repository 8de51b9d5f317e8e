"""Live measurements of a real run: exact state bytes, saved activations, peak memory.

On CPU there is no allocator to ask, so the categories are measured exactly from the tensors
themselves: parameters, gradients and optimizer states by their local storage (shards count what
this rank holds), activations by the bytes autograd saves for backward in one micro-batch
(`saved_tensors_hooks`, storages de-duplicated). On CUDA the allocator's peaks are added.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator, Sequence

import torch

from scaletrain.dtensor import to_local

__all__ = ["tensor_bytes", "state_bytes", "SavedActivations", "peak_process_memory"]


def tensor_bytes(t: torch.Tensor) -> int:
    t = to_local(t)
    return t.numel() * t.element_size()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer states (local shards;
    ZeRO-1's local partition): `scaletrain.parallel.local_state_bytes`."""
    from scaletrain.parallel.zero import local_state_bytes

    return local_state_bytes(model, optimizer)


class SavedActivations:
    """Context manager summing the bytes autograd saves for backward (unique storages)."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        self.bytes = 0
        # parameters saved for backward are not activations: pre-mark their storages as seen
        self._seen: set[int] = set()
        for p in model.parameters() if model is not None else ():
            with contextlib.suppress(RuntimeError, NotImplementedError):
                self._seen.add(to_local(p).untyped_storage().data_ptr())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        local = to_local(t)
        try:
            key = local.untyped_storage().data_ptr()
            size = local.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            key, size = id(local), local.numel() * local.element_size()
        if key not in self._seen:
            self._seen.add(key)
            self.bytes += size
        return t

    @contextlib.contextmanager
    def track(self) -> Iterator[SavedActivations]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    @contextlib.contextmanager
    def track_first_forward(self, modules: Sequence[torch.nn.Module]) -> Iterator[SavedActivations]:
        """Count what each module's first forward saves: one micro-batch of each pipeline
        stage, where a schedule runs every micro-batch inside one call (and later ones may
        reuse the storages backward freed, which `track` would not count again)."""
        done: set[int] = set()
        active: list[contextlib.AbstractContextManager] = []

        def pre(mod: torch.nn.Module, _args: object) -> None:
            if id(mod) not in done:
                ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
                ctx.__enter__()
                active.append(ctx)

        def post(mod: torch.nn.Module, _args: object, _out: object) -> None:
            if id(mod) not in done:
                done.add(id(mod))
                active.pop().__exit__(None, None, None)

        handles = [
            h
            for m in modules
            for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))
        ]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            while active:  # a forward that raised
                active.pop().__exit__(None, None, None)


def peak_process_memory(device: torch.device) -> dict[str, int]:
    """Peak memory so far: CUDA allocator peaks on GPU, the process's max RSS on CPU."""
    if device.type == "cuda":
        return {
            "allocated": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.max_memory_reserved(device),
        }
    return {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
