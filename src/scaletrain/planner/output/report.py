"""Readable output of estimates and searches: a rich table, the losers' reasons, JSON lists."""

from __future__ import annotations

import io
import textwrap
from typing import Any

from scaletrain.config import byte_unit, fmt_bytes

from ..search.result import SearchResult
from ..types import Estimate, MemoryBreakdown, layout_label

__all__ = [
    "fp8_eager_note",
    "estimate_rows",
    "memory_unit",
    "render_estimates",
    "render_search",
    "to_json",
    "fit_width",
    "terminal_width",
]


def memory_unit(estimates: list[Estimate]) -> tuple[str, float]:
    """The one binary unit of a table of `estimates` (`config.units`): its largest figure's."""
    return byte_unit(max((e.memory.reserved for e in estimates), default=0.0))


def estimate_rows(
    estimates: list[Estimate], unit: tuple[str, float] | None = None
) -> list[list[str]]:
    """One row per estimate: layout, memory per category (in `unit`, default `memory_unit`),
    step time, tokens/s, MFU, fits."""
    _, size = unit or memory_unit(estimates)
    rows = []
    for e in estimates:
        m = e.memory
        rows.append(
            [
                layout_label(e),
                *(
                    f"{x / size:.1f}"
                    for x in (
                        m.params,
                        m.grads,
                        m.optimizer,
                        m.activations,
                        m.buffers,
                        m.total,
                        m.reserved,
                    )
                ),
                f"{e.time.step_s:.3f}",
                f"{e.tokens_per_s:,.0f}",
                f"{100 * e.mfu:.1f}%",
                "yes" if m.fits else _no(m),
            ]
        )
    return rows


HEADERS = [
    "layout",
    "params",
    "grads",
    "optim",
    "acts",
    "buffers",
    "total",
    "reserved",
    "step s",
    "tokens/s",
    "MFU",
    "fits",
]
# the columns kept when the full table is wider than the terminal (an 80-column one): the
# per-category split is in `scaletrain explain` and in the JSON
NARROW = ("layout", "total", "reserved", "step s", "tokens/s", "MFU", "fits")


def _table(title: str, estimates: list[Estimate], width: int) -> Any:
    from rich import box
    from rich.table import Table  # lazy: keeps `import scaletrain.planner` light

    unit = memory_unit(estimates)
    rows = estimate_rows(estimates, unit)
    keep = list(range(len(HEADERS)))
    natural = max((sum(map(len, r)) + len(r) - 1 for r in [HEADERS, *rows]), default=0)
    if natural > width:
        keep = [HEADERS.index(h) for h in NARROW]
    cap = estimates[0].plan.hardware.memory_bytes if estimates else 0.0
    # no vertical rules and one space between columns; the layout column wraps at its spaces
    # when even the narrow table is wider than the terminal
    t = Table(
        title=f"{title} (memory in {unit[0]} per GPU, capacity {fmt_bytes(cap, digits=2)})",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )
    for i in keep:
        t.add_column(HEADERS[i], justify="left" if i == 0 else "right", no_wrap=i > 0)
    for row in rows:
        t.add_row(*(row[i] for i in keep))
    return t


def terminal_width() -> int:
    """The terminal's columns (the COLUMNS variable first); 160 when output is a file or a
    pipe, so that saved output keeps every column."""
    import os
    import shutil
    import sys

    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        return 160
    return shutil.get_terminal_size((160, 24)).columns


def fit_width(text: str, width: int | None = None) -> str:
    """Wrap each line longer than the terminal at word boundaries, continuation lines indented
    two past the line's own indentation (tables are sized by `render_estimates` already)."""
    width = width or terminal_width()
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        lead = " " * (len(line) - len(line.lstrip()))
        out.append(
            textwrap.fill(
                line.strip(),
                width,
                initial_indent=lead,
                subsequent_indent=lead + "  ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    return "\n".join(out)


def _no(m: MemoryBreakdown) -> str:
    """Why a layout does not fit: its GPU rank, or the host's RAM per node."""
    if m.reserved <= m.capacity and not m.host_fits:
        return f"NO (host {fmt_bytes(m.host)} > {fmt_bytes(m.host_capacity)})"
    return f"NO (rank {m.rank})"


def render_estimates(
    estimates: list[Estimate], title: str = "plan", *, width: int | None = None
) -> str:
    """The table as text (rich, no colour), as wide as the terminal (`width` overrides)."""
    from rich.console import Console

    width = width or terminal_width()
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(_table(title, estimates, width))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def render_search(result: SearchResult) -> str:
    """Top-K table (in the rule of thumb's order: search.layouts.rule_order), the pick and,
    when it is not the fastest layout, why; then one line per losing family with its reason."""
    out = [render_estimates(result.top, title=f"top {len(result.top)} layouts")]
    if not result.top:
        out.append("No layout fits. Closest miss per family:")
    else:
        out.append(f"best: {layout_label(result.top[0])}")
        why_pick = result.preference()
        if why_pick:
            out.append(why_pick)
        out.append("why the other strategy families lost:")
    width = terminal_width()
    for fam, why in result.why_others_lost().items():
        out.append(
            textwrap.fill(
                f"{fam:<12} {why}",
                width,
                initial_indent="  ",
                subsequent_indent=" " * 15,
                break_on_hyphens=False,
            )
        )
    out.append(
        f"({result.evaluated} layouts evaluated, {result.legal} legal candidates, "
        f"{result.fitting} fit, {result.elapsed_s:.2f} s)"
    )
    return "\n".join(out)


def to_json(estimates: list[Estimate]) -> list[dict[str, Any]]:
    """docs/DESIGN.md §4 objects, best first."""
    return [e.to_json() for e in estimates]


def fp8_eager_note(est: Estimate) -> str | None:
    """The line that warns a plan in fp8 without torch.compile whose fp8 casts run as eager
    kernels (time/fp8_casts.py: torchao's Float8Linear or scaletrain's own chain, one aten
    kernel per amax / scale / clamp / cast) that it may be slower than bf16: the same plan is
    timed again in bf16 and with compile on, and the three throughputs are printed. None for
    any other plan (another precision, compile on, a foreign recipe whose fp8 path is Transformer
    Engine's or unread, a user-set efficiency, a CPU)."""
    from dataclasses import replace

    from ..estimate import estimate
    from ..recipes.registry import recipe_named
    from ..recipes.schema import DEFAULT_RECIPE
    from ..time.fp8_casts import fp8_cast_kernels

    plan = est.plan
    if plan.precision != "fp8" or plan.compile or plan.efficiency > 0:
        return None
    recipe = recipe_named(plan.recipe) if plan.recipe != DEFAULT_RECIPE else None
    if fp8_cast_kernels(plan, recipe) not in ("torchao_eager", "scaletrain"):
        return None
    bf16 = estimate(replace(plan, precision="bf16")).tokens_per_s
    fused = estimate(replace(plan, compile=True)).tokens_per_s
    ours = est.tokens_per_s
    verdict = "slower than" if ours < bf16 else "faster than"
    return (
        f"note: fp8 without compile runs its casts as eager kernels: {ours:,.0f} tokens/s, "
        f"{verdict} bf16's {bf16:,.0f} on the same layout; with compile on (--compile, "
        f"training.compile = true) they fuse: {fused:,.0f} tokens/s (time/fp8_casts.py)"
    )
