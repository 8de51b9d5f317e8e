"""What `search.search` returns: the ranked layouts (`SearchResult`) and, per strategy family,
its best layout or closest miss and why it lost (`FamilyOutcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scaletrain.config import (
    GB,
)

from ..types import Estimate, layout_label

__all__ = ["SearchResult", "FamilyOutcome"]


@dataclass
class FamilyOutcome:
    family: str
    best: Estimate | None = None
    """The family's fastest layout that fits (None when none fits)."""
    closest_miss: Estimate | None = None
    """The family's layout that missed the memory budget by the least."""
    candidates: int = 0
    refusal: str | None = None
    """Why the family's first proposed layout was illegal (config/layout.py's rule), when no
    layout of the family was legal."""

    def reason(self, winner: Estimate | None) -> str:
        if self.best is not None and winner is not None:
            if self.best is winner:
                return "winner"
            slow = self.best.time.step_s / winner.time.step_s
            if self.best.time.step_s == winner.time.step_s:  # a tie lost on memory
                return (
                    f"best member {layout_label(self.best)}: as fast, but reserves "
                    f"{self.best.memory.reserved / GB:.1f} GB vs "
                    f"{winner.memory.reserved / GB:.1f} GB"
                )
            return (
                f"best member {layout_label(self.best)}: {self.best.time.step_s:.3f} s/step "
                f"vs {winner.time.step_s:.3f} s ({slow:.2f}x slower, MFU "
                f"{self.best.mfu:.1%} vs {winner.mfu:.1%})"
            )
        if self.closest_miss is not None:
            mem = self.closest_miss.memory
            if mem.reserved <= mem.capacity and not mem.host_fits:
                return (
                    f"never fits: best needs {mem.host / GB:.1f} GB of host memory per node > "
                    f"{mem.host_capacity / GB:.1f} GB (hardware.host_memory_gb; "
                    f"{layout_label(self.closest_miss)})"
                )
            return (
                f"never fits: best needs {mem.reserved / GB:.1f} GB > "
                f"{self.closest_miss.plan.hardware.capacity_text()} (rank {mem.rank}, "
                f"{layout_label(self.closest_miss)})"
            )
        if self.family == "offload" and winner is not None:
            return "not needed: layouts fit without offload (it only adds host traffic)"
        if self.refusal is not None:
            return f"no legal layout: {self.refusal}"
        return "no legal layout of this family for this GPU count"


@dataclass
class SearchResult:
    top: list[Estimate]
    """Fitting layouts, fastest first (at most top_k)."""
    families: dict[str, FamilyOutcome]
    evaluated: int
    """Legal layouts whose memory was computed (memory probes included; those that did not fit
    were not timed). Candidates skipped by pruning are not counted."""
    legal: int
    """Candidates that passed layout_problems."""
    fitting: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Estimate | None:
        return self.top[0] if self.top else None

    def why_others_lost(self) -> dict[str, str]:
        return {
            f: o.reason(self.best)
            for f, o in self.families.items()
            if o.best is not self.best or self.best is None
        }
