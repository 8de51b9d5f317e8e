"""Shared matplotlib helpers for the benchmark scripts (Agg backend: files only, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt", "save", "gantt", "stacked_bars", "KIND_COLORS"]

KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "idle": "#DDDDDD"}
"""Forward, backward (or input-gradient B), weight-gradient W, idle."""


def save(fig: Any, path: Path, *, dpi: int = 110) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def gantt(
    ax: Any,
    ranks: Sequence[Sequence[tuple[float, float, str, int]]],
    *,
    title: str,
    makespan: float | None = None,
    unit: str = "ms",
    scale: float = 1e3,
) -> None:
    """One row per rank; each event (start, end, kind, micro-batch) a labelled bar.

    The idle time between 0 and the makespan is shaded grey: that is the bubble.
    """
    end = (
        makespan if makespan is not None else max((e[1] for evs in ranks for e in evs), default=0.0)
    )
    for r, evs in enumerate(ranks):
        y = len(ranks) - 1 - r  # rank 0 on top
        ax.broken_barh([(0, end * scale)], (y - 0.4, 0.8), facecolors=KIND_COLORS["idle"])
        for start, stop, kind, mb in evs:
            w = (stop - start) * scale
            ax.broken_barh(
                [(start * scale, w)],
                (y - 0.4, 0.8),
                facecolors=KIND_COLORS.get(kind, "#999999"),
                edgecolor="white",
                linewidth=0.5,
            )
            if w > end * scale / 60:  # label only bars wide enough to read
                ax.text(
                    start * scale + w / 2,
                    y,
                    f"{kind}{mb}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {len(ranks) - 1 - i}" for i in range(len(ranks))])
    ax.set_xlim(0, end * scale * 1.01)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=9)


def stacked_bars(
    ax: Any,
    labels: Sequence[str],
    parts: dict[str, Sequence[float]],
    *,
    ylabel: str,
    capacity: float | None = None,
) -> None:
    """Stacked bars: one bar per label, one colour per part (same order for every bar)."""
    bottom = [0.0] * len(labels)
    for name, vals in parts.items():
        ax.bar(labels, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if capacity is not None:
        ax.axhline(capacity, color="red", linestyle="--", linewidth=1, label="GPU capacity")
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7)
