"""A timeline of allocated bytes through the dry-run's measured step."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Timeline"]


class Timeline:
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
