"""Plots: memory breakdown per layout (stacked bars) and a pipeline Gantt chart.

matplotlib is imported inside each function (Agg backend) so the planner stays import-light.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from scaletrain.config import byte_unit

from ..time.pipeline import PipelineTimeline
from ..types import Estimate

__all__ = ["plot_memory", "plot_pipeline"]

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_memory(estimates: Sequence[Estimate], path: str | Path) -> Path:
    """Stacked bars (binary units per GPU, worst rank) per layout with the capacity as a line."""
    from ..types import layout_label

    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(estimates) + 3), 5))
    labels = [layout_label(e) for e in estimates]
    bottom = [0.0] * len(estimates)
    unit, size = byte_unit(max((e.memory.capacity for e in estimates), default=0.0))
    for cat in CATEGORIES:
        vals = [getattr(e.memory, cat) / size for e in estimates]
        ax.bar(range(len(estimates)), vals, bottom=bottom, label=cat)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if estimates:
        ax.axhline(
            estimates[0].memory.capacity / size, color="red", linestyle="--", label="capacity"
        )
    ax.set_xticks(range(len(estimates)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(f"{unit} per GPU (worst rank)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_pipeline(timeline: PipelineTimeline, path: str | Path) -> Path:
    """Gantt chart: one row per rank, boxes labelled by micro-batch (F forward, B full
    backward, I and W a split backward's input and weight halves; a rank's later chunks
    lighter: under dualpipev the V's way back), idle time shaded."""
    plt = _plt()
    colors = {"F": "tab:blue", "B": "tab:orange", "I": "tab:red", "W": "tab:green"}
    fig, ax = plt.subplots(figsize=(10, 0.6 * timeline.p + 1.5))
    for r, events in enumerate(timeline.ranks):
        ax.barh(r, timeline.makespan, left=0, color="lightgrey", height=0.8)  # idle = bubble
        for e in events:
            ax.barh(
                r,
                e.end - e.start,
                left=e.start,
                color=colors[e.kind],
                height=0.8,
                edgecolor="black",
                linewidth=0.3,
                alpha=1.0 - 0.3 * e.chunk / timeline.v,
            )
            if e.end - e.start > timeline.makespan / 80:
                ax.text(
                    (e.start + e.end) / 2,
                    r,
                    str(e.microbatch),
                    ha="center",
                    va="center",
                    fontsize=6,
                )
    kinds = sorted({e.kind for events in timeline.ranks for e in events}, key="FBIW".index)
    names = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad"}
    for k in kinds:
        ax.barh(0, 0, color=colors[k], label=names[k])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(timeline.p), [f"rank {r}" for r in range(timeline.p)])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    ax.set_title(
        f"{timeline.schedule} p={timeline.p} m={timeline.m} v={timeline.v}: bubble "
        f"{100 * timeline.bubble_fraction:.1f}% of compute (grey = idle)"
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
