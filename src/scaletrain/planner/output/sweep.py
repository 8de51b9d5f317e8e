"""The table of a hardware sweep (`plan --sweep`): per value of one figure, the best layout's
step time, tokens/s and MFU, and its speed against the device's own figure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..types import Estimate, layout_label

__all__ = ["SweepRow", "render_sweep", "sweep_json"]


@dataclass(frozen=True)
class SweepRow:
    label: str
    """The value as written ('2x', '900')."""
    value: float
    """In the figure's unit."""
    best: Estimate | None
    """The best layout that fits at this value, or the pinned layout (fitting or not); None:
    no layout fits."""


def _num(v: float) -> str:
    return f"{v:,.6g}"


def render_sweep(
    field: str,
    unit: str,
    base: float,
    base_best: Estimate | None,
    rows: list[SweepRow],
    *,
    what: str,
) -> str:
    """One line per value; 'vs base' is tokens/s over the device's own figure's (`base_best`).
    what: 'best layout' for a search, 'layout' for a pinned one."""
    head = ["hardware." + field + f" ({unit})", "step s", "tokens/s", "MFU", "vs base", what]
    table = [head]
    ref = base_best.tokens_per_s if base_best is not None else 0.0
    for r in rows:
        label = _num(r.value) + ("" if r.label == _num(r.value) else f" ({r.label})")
        if r.best is None:
            table.append([label, "-", "-", "-", "-", "no layout fits"])
            continue
        e = r.best
        vs = f"{e.tokens_per_s / ref:.2f}x" if ref > 0 else "-"
        table.append(
            [
                label,
                f"{e.time.step_s:.3f}",
                f"{e.tokens_per_s:,.0f}",
                f"{100 * e.mfu:.1f}%",
                vs,
                layout_label(e) + ("" if e.memory.fits else " (DOES NOT FIT)"),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [
        f"sweep of hardware.{field} on {what}s (device's own figure: {_num(base)} {unit})",
        "",
    ]
    for k, row in enumerate(table):
        cells = [
            c.rjust(w) if 0 < i < len(head) - 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    if base_best is None:
        lines.append("(no layout fits at the device's own figure: 'vs base' not shown)")
    return "\n".join(lines)


def sweep_json(field: str, unit: str, base: float, rows: list[SweepRow]) -> list[dict[str, Any]]:
    """One object per value: the figure, its value and unit, and the best estimate's
    docs/DESIGN.md §4 object (null when no layout fits)."""
    return [
        {
            "field": f"hardware.{field}",
            "value": r.value,
            "unit": unit,
            "base": base,
            "best": r.best.to_json() if r.best is not None else None,
        }
        for r in rows
    ]
