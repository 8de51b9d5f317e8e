"""The run report's figures, each returned as PNG bytes (embedded in the HTML as base64).

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly, not pyplot: no
global figure registry, no backend switch, nothing left open between calls.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scaletrain.config import byte_unit

__all__ = [
    "loss_curve",
    "throughput_curve",
    "optimizer_curve",
    "memory_bars",
    "memory_timeline",
    "split_rollbacks",
    "stack_segments",
    "Segment",
    "OTHER",
]

_CATEGORY_COLORS = {
    "params": "#4c72b0",
    "grads": "#55a868",
    "optimizer": "#c44e52",
    "activations": "#8172b2",
    "buffers": "#ccb974",
}


def _figure(width: float = 9.0, height: float = 4.0):  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig


def _png(fig) -> bytes:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


@dataclass(frozen=True)
class Segment:
    """One piece of a stacked memory bar, in bytes."""

    label: str
    """A memory category, or `OTHER` (the total's bytes no category names)."""
    bottom: float
    height: float
    beyond_total: bool = False
    """Above the bar's total: a part whose own peak is not held at the total's moment (the
    planner's fields are each term's own peak: a backward trades activations for gradients),
    or a term the total leaves out (off-GPU, the CUDA-only buffers). Drawn hatched, unfilled."""


OTHER = "other (total − parts)"


def stack_segments(d: dict[str, float], categories: Sequence[str]) -> list[Segment]:
    """The segments of one bar: the categories stacked in order, so the filled ones end
    exactly at `d['total']` when it is given. Parts that reach past the total continue as
    `beyond_total` segments; a total above the parts' sum gets an `OTHER` segment up to it."""
    total = max(0.0, float(d.get("total") or 0.0))
    out: list[Segment] = []
    bottom = 0.0
    for c in categories:
        v = max(0.0, float(d.get(c) or 0.0))
        if not v:
            continue
        below = v if not total else min(v, max(0.0, total - bottom))
        if below:
            out.append(Segment(c, bottom, below))
        if v - below > 0:
            out.append(Segment(c, bottom + below, v - below, beyond_total=True))
        bottom += v
    if total > bottom:
        out.append(Segment(OTHER, bottom, total - bottom))
    return out


def split_rollbacks(
    metrics: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept, discarded): a rollback re-logs the steps it redoes, so for each step the last
    record is the one the final model descends from; earlier records of the step were undone."""
    last = {int(r["step"]): i for i, r in enumerate(metrics) if "step" in r}
    kept = [metrics[i] for i in sorted(last.values())]
    discarded = [r for i, r in enumerate(metrics) if "step" in r and last[int(r["step"])] != i]
    return kept, discarded


def _xy(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def loss_curve(
    metrics: Sequence[dict[str, Any]],
    *,
    guard_events: Sequence[dict[str, Any]] = (),
    best_loss: float | None = None,
) -> bytes:
    """Train loss per step, validation loss, the best achievable loss, and guard rollbacks."""
    fig = _figure()
    ax = fig.add_subplot()
    kept, discarded = split_rollbacks(metrics)
    x, y = _xy(kept, "loss")
    ax.plot(x, y, color="#4c72b0", lw=1.5, label="train loss")
    if discarded:
        dx, dy = _xy(discarded, "loss")
        ax.plot(dx, dy, "x", color="#999999", ms=5, label="undone by a rollback")
    vx, vy = _xy(kept, "val_loss")
    if vx:
        ax.plot(vx, vy, "o-", color="#dd8452", ms=5, lw=1.2, label="validation loss")
    names = dict.fromkeys(k[9:] for r in kept for k in r if k.startswith("val_loss/"))
    for name in names:  # data.eval_sources, in the order logged
        ex, ey = _xy(kept, f"val_loss/{name}")
        ax.plot(ex, ey, "s--", ms=4, lw=1.0, label=f"eval {name}")
    if best_loss is not None:
        ax.axhline(
            best_loss,
            color="#2ca02c",
            ls="--",
            lw=1.2,
            label=f"best achievable {best_loss:.3f} (corpus entropy)",
        )
    for i, e in enumerate(guard_events):
        spike = e.get("spike_step")
        if spike is None:
            continue
        ax.axvline(
            spike,
            color="#d62728",
            lw=1.2,
            alpha=0.8,
            label="loss spike (rolled back)" if i == 0 else None,
        )
        restored = e.get("restored_step")
        if restored is not None:
            ax.annotate(
                "",
                xy=(restored, 0.92),
                xytext=(spike, 0.92),
                xycoords=("data", "axes fraction"),
                arrowprops={"arrowstyle": "->", "color": "#d62728"},
            )
            ax.text(
                spike,
                0.95,
                f" rollback → {restored}",
                color="#d62728",
                fontsize=8,
                transform=ax.get_xaxis_transform(),
                ha="left",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("Loss")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def _planned_line(
    ax, value: float | None, measured: Sequence[float], *, color: str, ls: str, label: str
) -> None:
    """The planner's figure as a horizontal line, or only in the legend when it is more than
    5x off the measured curve (drawn, it would flatten the curve into the x axis)."""
    if not value:
        return
    top = max(measured, default=0.0)
    if top and not top / 5 <= value <= 5 * top:
        ax.plot([], [], color=color, ls=ls, lw=1, label=f"{label} (off scale)")
        return
    ax.axhline(value, color=color, ls=ls, lw=1, label=label)


def throughput_curve(
    metrics: Sequence[dict[str, Any]],
    *,
    predicted_tokens_per_s: float | None = None,
    predicted_mfu: float | None = None,
) -> bytes:
    """Tokens per second (left axis) and MFU (right axis) per step, with the planner's lines."""
    fig = _figure()
    ax = fig.add_subplot()
    kept, _ = split_rollbacks(metrics)
    x, y = _xy(kept, "tokens_per_s")
    ax.plot(x, y, color="#4c72b0", lw=1.5, label="tokens/s")
    _planned_line(
        ax,
        predicted_tokens_per_s,
        y,
        color="#4c72b0",
        ls="--",
        label=f"planned {predicted_tokens_per_s or 0:,.0f} tokens/s",
    )
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s (whole job)")
    ax.grid(alpha=0.3)
    mx, my = _xy(kept, "mfu")
    ax2 = ax.twinx()
    # MFU is tokens/s times a constant, so the two curves coincide when both axes start at 0:
    # MFU is drawn dotted over the solid tokens/s line so both stay visible
    ax2.plot(mx, [100 * v for v in my], color="#c44e52", lw=1.5, ls=":", label="MFU")
    _planned_line(
        ax2,
        100 * predicted_mfu if predicted_mfu else None,
        [100 * v for v in my],
        color="#c44e52",
        ls=":",
        label=f"planned MFU {predicted_mfu or 0:.2%}",
    )
    ax2.set_ylabel("MFU (%)")
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="best", fontsize=8)
    ax.set_title("Throughput (the first step pays one-time start-up costs)")
    return _png(fig)


def optimizer_curve(metrics: Sequence[dict[str, Any]]) -> bytes:
    """Gradient norm (left axis) and learning rate (right axis) per step; skipped steps marked."""
    fig = _figure(9.0, 3.2)
    ax = fig.add_subplot()
    kept, _ = split_rollbacks(metrics)
    x, y = _xy(kept, "grad_norm")
    ax.plot(x, y, color="#55a868", lw=1.2, label="grad norm (before clipping)")
    sx = [int(r["step"]) for r in kept if r.get("skipped")]
    if sx:
        ax.plot(sx, [0.0] * len(sx), "v", color="#d62728", label="skipped (non-finite grads)")
    ax.set_xlabel("step")
    ax.set_ylabel("grad norm")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    lx, ly = _xy(kept, "lr")
    ax2.plot(lx, ly, color="#8172b2", lw=1.2, ls="--", label="learning rate")
    ax2.set_ylabel("learning rate")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="best", fontsize=8)
    ax.set_title("Optimizer")
    return _png(fig)


def memory_bars(
    predicted: dict[str, float] | None,
    measured: dict[str, float] | None,
    *,
    categories: Sequence[str] = tuple(_CATEGORY_COLORS),
) -> bytes:
    """Stacked bars per category, planned next to measured; a black tick marks each total.

    The filled parts of a bar add up to its total (`stack_segments`): bytes of the total no
    category names are a grey `OTHER` part, and parts beyond the total (own peaks held at
    other moments, or terms the total leaves out) are hatched outlines above it."""
    bars = [(name, d) for name, d in (("planned", predicted), ("measured", measured)) if d]
    fig = _figure(6.5, 4.2)
    ax = fig.add_subplot()
    stacks = [stack_segments(d, categories) for _, d in bars]
    largest = max((s.bottom + s.height for st in stacks for s in st), default=0.0)
    unit, size = byte_unit(largest)
    labelled: set[str] = set()
    for i, ((_, d), segments) in enumerate(zip(bars, stacks, strict=True)):
        for s in segments:
            color = "#bbbbbb" if s.label == OTHER else _CATEGORY_COLORS.get(s.label)
            key = (
                f"{s.label} beyond the total (not held at its moment)"
                if s.beyond_total
                else s.label
            )
            label = None if key in labelled else key
            labelled.add(key)
            ax.bar(
                i,
                s.height / size,
                bottom=s.bottom / size,
                width=0.55,
                color="none" if s.beyond_total else color,
                hatch="//" if s.beyond_total else None,
                edgecolor=color if s.beyond_total else "white",
                label=label,
                lw=0.8 if s.beyond_total else 0.5,
            )
        if d.get("total"):
            ax.plot(
                [i - 0.35, i + 0.35],
                [d["total"] / size] * 2,
                color="black",
                lw=2,
                label="total (peak)" if i == 0 else None,
            )
    ax.set_xticks(range(len(bars)), [name for name, _ in bars])
    ax.set_xlim(-0.8, max(1, len(bars)) - 0.2)
    ax.set_ylabel(f"{unit} per rank")
    ax.set_title("Memory by category (this rank)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return _png(fig)


def memory_timeline(timeline: Sequence[tuple[str, int] | list[Any]]) -> bytes:
    """Allocated bytes at each recorded event of one step; phase boundaries labelled."""
    names = [str(e[0]) for e in timeline]
    values = [float(e[1]) for e in timeline]
    unit, size = byte_unit(max(values, default=0.0))
    fig = _figure(9.0, 3.8)
    ax = fig.add_subplot()
    xs = list(range(len(values)))
    ax.step(xs, [v / size for v in values], where="post", color="#4c72b0", lw=1.5)
    ax.fill_between(xs, [v / size for v in values], step="post", alpha=0.2, color="#4c72b0")
    if values:
        peak = max(range(len(values)), key=values.__getitem__)
        ax.annotate(
            f"peak {values[peak] / size:,.1f} {unit}\n{names[peak]}",
            xy=(peak, values[peak] / size),
            xytext=(0, -30),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            arrowprops={"arrowstyle": "->"},
        )
    # events without a module path (loss, backward_done, optimizer_step) are phase boundaries
    for x, name in zip(xs, names, strict=True):
        if not any(name.startswith(p) for p in ("fw_", "bw_")):
            ax.axvline(x, color="#999999", lw=0.8, ls=":")
            ax.text(
                x,
                1.0,
                name,
                rotation=90,
                va="top",
                ha="right",
                fontsize=7,
                color="#555555",
                transform=ax.get_xaxis_transform(),
            )
    ax.set_xlabel("event in the step (forward and backward module boundaries)")
    ax.set_ylabel(f"allocated ({unit})")
    ax.set_ylim(bottom=0)
    ax.set_title("Memory over one step")
    ax.grid(alpha=0.3)
    return _png(fig)
