"""What `search.layouts.search` returns: the ranked layouts (`SearchResult`) and, per strategy
family, its best layout or closest miss and why it lost (`FamilyOutcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaletrain.config import byte_unit, fmt_bytes

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

    def reason(self, winner: Estimate | None, margin: float = 0.0) -> str:
        if self.best is not None and winner is not None:
            if self.best is winner:
                return "winner"
            slow = self.best.time.step_s / winner.time.step_s
            if self.best.time.step_s < winner.time.step_s:  # faster, but within the margin
                return (
                    f"best member {layout_label(self.best)}: {self.best.time.step_s:.3f} s/step "
                    f"vs {winner.time.step_s:.3f} s, {1 - slow:.1%} faster: under the "
                    f"{margin:.0%} margin a more complex layout needs (the simpler pick wins)"
                )
            if self.best.time.step_s == winner.time.step_s:  # a tie lost on the rule
                if _complexity(self.best) != _complexity(winner):
                    return (
                        f"best member {layout_label(self.best)}: as fast, and the pick is the "
                        "simpler layout (ties go to the rule of thumb)"
                    )
                ours, theirs = self.best.memory.reserved, winner.memory.reserved
                u = byte_unit(max(ours, theirs))  # one unit for the two figures
                return (
                    f"best member {layout_label(self.best)}: as fast, but reserves "
                    f"{fmt_bytes(ours, unit=u)} vs {fmt_bytes(theirs, unit=u)}"
                )
            return (
                f"best member {layout_label(self.best)}: {self.best.time.step_s:.3f} s/step "
                f"vs {winner.time.step_s:.3f} s ({slow:.2f}x slower, MFU "
                f"{self.best.mfu:.1%} vs {winner.mfu:.1%})"
            )
        if self.closest_miss is not None:
            mem = self.closest_miss.memory
            if mem.reserved <= mem.capacity and not mem.host_fits:
                hu = byte_unit(mem.host)
                return (
                    f"never fits: best needs {fmt_bytes(mem.host, unit=hu)} of host memory per "
                    f"node > {fmt_bytes(mem.host_capacity, unit=hu, digits=2)} "
                    f"(hardware.host_memory_gib; {layout_label(self.closest_miss)})"
                )
            u = byte_unit(mem.reserved)  # the larger of the two: it did not fit
            cap = self.closest_miss.plan.hardware.memory_bytes
            return (
                f"never fits: best needs {fmt_bytes(mem.reserved, unit=u)} > "
                f"{fmt_bytes(cap, unit=u, digits=2)} (rank {mem.rank}, "
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
    fastest: Estimate | None = None
    """The layout with the shortest planned step (the pick when no simpler one is within
    `margin` of it)."""
    margin: float = 0.0
    """How much faster a more complex layout must be to win
    (search.layouts.SIMPLER_LAYOUT_MARGIN)."""

    @property
    def best(self) -> Estimate | None:
        """The pick: the simplest layout within `margin` of the fastest
        (search.layouts.rule_order)."""
        return self.top[0] if self.top else None

    def why_others_lost(self) -> dict[str, str]:
        return {
            f: o.reason(self.best, self.margin)
            for f, o in self.families.items()
            if o.best is not self.best or self.best is None
        }

    def preference(self) -> str | None:
        """One line saying why the pick is not the fastest layout (None when it is)."""
        best, fast = self.best, self.fastest
        if best is None or fast is None or fast is best:
            return None
        gain = 1 - fast.time.step_s / best.time.step_s
        if gain <= 0:
            return None
        added = _added_axes(fast, best)
        return (
            f"rule of thumb: {layout_label(best)} is picked over the fastest, "
            f"{layout_label(fast)} ({gain:.1%} shorter step{added}), because a more complex "
            f"layout must be more than {self.margin:.0%} faster to win "
            "(planner.search.layouts.SIMPLER_LAYOUT_MARGIN; plain DP, then ZeRO, then TP, PP "
            "only when needed)"
        )


def _complexity(e: Estimate) -> Any:
    """search.layouts.complexity of `e`'s layout (imported here: layouts imports this module)."""
    from .layouts import complexity  # the rule's one home

    return complexity(e.plan.layout, e.plan.offload)


def _added_axes(more: Estimate, less: Estimate) -> str:
    """', it adds PP and TP' for what `more` runs beyond `less` (empty when nothing)."""
    a, b = more.plan.layout, less.plan.layout
    names = [
        n
        for n, x, y in (
            ("PP", a.pp, b.pp),
            ("CP", a.cp, b.cp),
            ("TP", a.tp, b.tp),
            ("EP", a.ep, b.ep),
        )
        if x > 1 and y == 1
    ]
    if a.zero > b.zero:
        names.append(f"ZeRO-{a.zero}")
    if more.plan.offload != "none" and less.plan.offload == "none":
        names.append("offload")
    return f"; it adds {' and '.join(names)}" if names else ""
