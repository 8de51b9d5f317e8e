"""Readable output of estimates and searches: a rich table, the losers' reasons, JSON lists."""

from __future__ import annotations

import io
from typing import Any

from scaletrain.config import GB

from .search import SearchResult
from .types import Estimate, layout_label

__all__ = ["layout_label", "estimate_rows", "render_estimates", "render_search", "to_json"]


def estimate_rows(estimates: list[Estimate]) -> list[list[str]]:
    """One row per estimate: layout, memory per category (GB), step time, tokens/s, MFU, fits."""
    rows = []
    for e in estimates:
        m = e.memory
        rows.append([layout_label(e), *(f"{x / GB:.1f}" for x in (
            m.params, m.grads, m.optimizer, m.activations, m.buffers, m.total, m.reserved)),
            f"{e.time.step_s:.3f}", f"{e.tokens_per_s:,.0f}", f"{100 * e.mfu:.1f}%",
            "yes" if m.fits else f"NO (rank {m.rank})"])
    return rows


HEADERS = ["layout", "params", "grads", "optim", "acts", "buffers", "total", "reserved",
           "step s", "tokens/s", "MFU", "fits"]


def _table(title: str, estimates: list[Estimate]) -> Any:
    from rich.table import Table  # lazy: keeps `import scaletrain.planner` light

    cap = estimates[0].memory.capacity / GB if estimates else 0.0
    t = Table(title=f"{title} (memory in GB per GPU, capacity {cap:.0f} GB)")
    for i, h in enumerate(HEADERS):
        t.add_column(h, justify="left" if i == 0 else "right")
    for row in estimate_rows(estimates):
        t.add_row(*row)
    return t


def render_estimates(estimates: list[Estimate], title: str = "plan") -> str:
    """The table as text (rich, no colour)."""
    from rich.console import Console

    console = Console(width=160, record=True, color_system=None, file=io.StringIO())
    console.print(_table(title, estimates))
    return console.export_text()


def render_search(result: SearchResult) -> str:
    """Top-K table, then one line per losing family with its reason."""
    out = [render_estimates(result.top, title=f"top {len(result.top)} layouts")]
    if not result.top:
        out.append("No layout fits. Closest miss per family:")
    else:
        out.append(f"best: {layout_label(result.top[0])}")
        out.append("why the other strategy families lost:")
    for fam, why in result.why_others_lost().items():
        out.append(f"  {fam:<12} {why}")
    out.append(f"({result.evaluated} layouts evaluated, {result.legal} legal candidates, "
               f"{result.fitting} fit, {result.elapsed_s:.2f} s)")
    return "\n".join(out)


def to_json(estimates: list[Estimate]) -> list[dict[str, Any]]:
    """DESIGN.md §4 objects, best first."""
    return [e.to_json() for e in estimates]
