"""Text, JSON and roofline plot of a profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .driver import ProfileResult
from .ops import OP_CLASSES
from .verdict import Verdict, memory_bound_share, ridge_point

__all__ = ["breakdown_rows", "render", "to_json", "plot_roofline", "write_outputs"]

_LABELS = {
    "data": "data (loader wait + host->device)",
    "forward": "forward",
    "loss": "loss (+ its backward, backward() entry)",
    "schedule": "pipeline schedule (P2P, waits)",
    "backward": "backward",
    "recompute": "  of which AC recompute",
    "post": "grad sync + unscale + clip",
    "optimizer": "optimizer step + zero_grad",
    "other": "other (step bookkeeping)",
}
_ORDER = (
    "data",
    "forward",
    "loss",
    "schedule",
    "backward",
    "recompute",
    "post",
    "optimizer",
    "other",
)


def breakdown_rows(r: ProfileResult) -> list[tuple[str, float]]:
    """(label, seconds per step); recompute is listed inside backward, so the rows without it
    add up to the step."""
    rows = []
    for k in _ORDER:
        v = r.phase_s.get(k, 0.0)
        if k == "backward":
            v += r.phase_s.get("recompute", 0.0)
        if v or k in ("data", "forward", "backward", "optimizer"):
            rows.append((k, v))
    return rows


def _ms(s: float) -> str:
    return f"{s * 1e3:10.2f} ms"


def _header_lines(r: ProfileResult) -> list[str]:
    """Title and step time."""
    return [
        f"scaletrain profile: {r.model} | {r.layout} | world {r.world_size} on {r.device} "
        f"| hardware preset {r.hardware} | {r.steps} profiled steps",
        "",
        f"step time (mean of profiled steps) {_ms(r.step_s)}"
        + (f" | without profiler {_ms(r.unprofiled_step_s)}" if r.unprofiled_step_s else ""),
        "",
        "where a step goes                          time      share",
    ]


def _step_lines(r: ProfileResult) -> list[str]:
    """Where a step goes: phases, exposed communication, the pipeline bubble."""
    step, a = r.step_s or 1e-12, r.analysis
    lines: list[str] = []
    for k, val in breakdown_rows(r):
        lines.append(f"  {_LABELS[k]:<38}{_ms(val)} {val / step:7.1%}")
    parts = r.parts_s
    lines.append(f"  {'sum of phases':<38}{_ms(parts)} {parts / step:7.1%} of the measured step")
    overlapped = max(0.0, a.comm_total_s - a.comm_exposed_s)
    lines.append(
        f"  {'communication exposed / overlapped':<38}"
        f"{_ms(a.comm_exposed_s)} / {overlapped * 1e3:.2f} ms"
        + ("  (single process: none)" if r.world_size == 1 else "")
    )
    if a.p2p_exposed_s:
        lines.append(f"  {'  of which pipeline P2P (send/recv)':<38}{_ms(a.p2p_exposed_s)}")
    bubble = (r.predicted or {}).get("bubble_fraction", 0.0)
    if bubble:
        lines.append(
            f"  {'pipeline bubble (planner (p-1)/m, not measured)':<38}{bubble:7.1%} of compute"
        )
    return lines


def _class_lines(r: ProfileResult) -> list[str]:
    """Self op time per op class, and the time outside ops."""
    step, a = r.step_s or 1e-12, r.analysis
    total_ops = sum(a.class_s.values()) or 1e-12
    lines = ["", "op classes (self op time per step, all phases)"]
    for c in OP_CLASSES:
        t = a.class_s.get(c, 0.0)
        lines.append(f"  {c:<38}{_ms(t)} {t / total_ops:7.1%}")
    lines.append(
        f"  {'time outside ops (Python, dispatch)':<38}"
        f"{_ms(max(0.0, r.step_s - total_ops))} {max(0.0, 1 - total_ops / step):7.1%}"
        " of the step"
    )
    return lines


def _roofline_lines(r: ProfileResult, top: int) -> list[str]:
    """The roofline table of the `top` ops by time."""
    a = r.analysis
    ridge = ridge_point(r)
    lines = [
        "",
        f"roofline: peak {r.peak_flops / 1e12:.3g} TFLOP/s, memory "
        f"{r.memory_bw / 1e9:.0f} GB/s -> ridge {ridge:.1f} FLOP/B; "
        f"{memory_bound_share(r):.0%} of compute op time under it",
        f"  {'op':<40}{'calls':>6}{'ms/step':>10}{'FLOP/B':>9}{'GFLOP/s':>10}  bound",
    ]
    for op in a.ops[:top]:
        bound = "memory" if op.intensity < ridge else "compute"
        lines.append(
            f"  {op.name[:40]:<40}{op.count:6d}{op.time_s * 1e3:10.2f}"
            f"{op.intensity:9.2f}{op.achieved_flops / 1e9:10.2f}  {bound} "
            f"({op.op_class})"
        )
    return lines


def _mfu_lines(r: ProfileResult) -> list[str]:
    """The iron law and measured vs predicted MFU."""
    o, peak = r.model_flops_per_step, r.peak_flops * r.world_size
    t = r.unprofiled_step_s or r.step_s
    lines = [
        "",
        f"iron law T = O / (R_peak * eta): O = {o / 1e9:,.2f} GFLOP per step (model "
        f"FLOPs), R_peak = {peak / 1e12:.3g} TFLOP/s -> O / R_peak = "
        f"{o / peak * 1e3:.2f} ms; measured T = {t * 1e3:.2f} ms -> eta = "
        f"{o / peak / t:.2%}",
    ]
    lines += ["", "MFU (model FLOPs, planner convention)"]
    lines.append(f"  measured  {r.mfu:8.2%}  ({r.tokens_per_s:,.0f} tokens/s)")
    if r.predicted:
        p = r.predicted
        lines.append(
            f"  predicted {p['mfu']:8.2%}  ({p['tokens_per_s']:,.0f} tokens/s, step "
            f"{p['step_s'] * 1e3:.2f} ms: compute {p['compute_s'] * 1e3:.2f}, comm "
            f"exposed {p['comm_exposed_s'] * 1e3:.2f}, bubble {p['bubble_s'] * 1e3:.2f}"
            f", optimizer {p['optimizer_s'] * 1e3:.2f} ms)"
        )
    else:
        lines.append(f"  predicted: planner unavailable ({r.planner_error})")
    return lines


def _verdict_lines(r: ProfileResult, v: Verdict) -> list[str]:
    """The verdict, its evidence and what to do."""
    lines = ["", f"verdict: {v.kind.upper()}: {v.detail}"]
    lines += [f"  - {e}" for e in v.evidence]
    lines.append("what to do (seed 004: profile -> fix the dominant term -> re-profile)")
    for i, rec in enumerate(v.recommendations, 1):
        lines.append(f"  {i}. {rec.technique}\n     why: {rec.why}")
        if rec.planner:
            lines.append(f"     {rec.planner}")
    if r.trace_path is not None:
        lines += [
            "",
            f"Chrome trace (Perfetto: ui.perfetto.dev, or chrome://tracing): {r.trace_path}",
        ]
    return lines


def render(r: ProfileResult, v: Verdict, *, top: int = 12) -> str:
    lines = _header_lines(r)
    lines += _step_lines(r)
    lines += _class_lines(r)
    lines += _roofline_lines(r, top)
    lines += _mfu_lines(r)
    lines += _verdict_lines(r, v)
    return "\n".join(lines)


def to_json(r: ProfileResult, v: Verdict) -> dict[str, Any]:
    a = r.analysis
    return {
        "model": r.model,
        "layout": r.layout,
        "device": r.device,
        "world_size": r.world_size,
        "hardware": r.hardware,
        "steps": r.steps,
        "step_s": r.step_s,
        "step_times": r.step_times,
        "unprofiled_step_s": r.unprofiled_step_s,
        "phases_s": r.phase_s,
        "clock_phases_s": r.clock_s,
        "phase_ops_s": a.phase_op_s,
        "phase_overlap_s": a.phase_overlap_s,
        "op_classes_s": a.class_s,
        "compute_op_classes_s": a.compute_class_s,
        "comm_exposed_s": a.comm_exposed_s,
        "comm_total_s": a.comm_total_s,
        "comm_ops_s": a.comm_op_s,
        "p2p_exposed_s": a.p2p_exposed_s,
        "peak_flops": r.peak_flops,
        "memory_bw": r.memory_bw,
        "ridge_flop_per_byte": ridge_point(r),
        "tokens_per_s": r.tokens_per_s,
        "mfu": r.mfu,
        "model_flops_per_step": r.model_flops_per_step,
        "predicted": r.predicted,
        "planner_error": r.planner_error,
        "verdict": v.to_json(),
        "ops": [o.to_json() for o in a.ops[:50]],
        "trace": str(r.trace_path) if r.trace_path else None,
    }


def plot_roofline(r: ProfileResult, path: str | Path, *, title: str | None = None) -> Path:
    """Roofline (log-log): attainable FLOP/s = min(peak, AI * bandwidth); each op a point at
    (its arithmetic intensity, its achieved FLOP/s), area proportional to its time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [o for o in r.analysis.ops if o.flops > 0 and o.bytes > 0 and o.time_s > 0]
    ridge = ridge_point(r)
    xs = [o.intensity for o in ops] or [ridge]
    lo, hi = min(min(xs), ridge) / 4, max(max(xs), ridge) * 4
    fig, ax = plt.subplots(figsize=(8, 5.5))
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(
        grid,
        [min(r.peak_flops, x * r.memory_bw) for x in grid],
        "k-",
        lw=2,
        label=f"roofline ({r.hardware}: {r.peak_flops / 1e12:.3g} TFLOP/s, "
        f"{r.memory_bw / 1e9:.0f} GB/s)",
    )
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    # the roof is DRAM bandwidth; small tensors that stay in cache can sit above it
    ax.text(
        0.02,
        0.97,
        "bytes: shapes x dtype, no cache reuse; points above the memory roof are cache-resident",
        transform=ax.transAxes,
        fontsize=7,
        va="top",
        color="gray",
    )
    ax.text(ridge, r.peak_flops * 1.15, f"ridge {ridge:.1f} FLOP/B", ha="center", fontsize=8)
    colors = {"attention": "tab:red", "matmul": "tab:blue", "elementwise/norm": "tab:green"}
    total = sum(o.time_s for o in ops) or 1.0
    for cls, color in colors.items():
        sel = [o for o in ops if o.op_class == cls]
        if sel:
            ax.scatter(
                [o.intensity for o in sel],
                [o.achieved_flops for o in sel],
                s=[20 + 2000 * o.time_s / total for o in sel],
                c=color,
                alpha=0.55,
                edgecolors="k",
                linewidths=0.5,
                label=cls,
            )
    for o in sorted(ops, key=lambda o: -o.time_s)[:6]:
        ax.annotate(
            o.name.removeprefix("aten::")[:28],
            (o.intensity, o.achieved_flops),
            fontsize=7,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved, estimated from shapes)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(title or f"roofline: {r.model} on {r.device} (point area ~ time)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(r: ProfileResult, v: Verdict, out_dir: str | Path) -> dict[str, Path]:
    """profile.txt, profile.json and roofline.png beside the trace."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"text": d / "profile.txt", "json": d / "profile.json", "roofline": d / "roofline.png"}
    paths["text"].write_text(render(r, v) + "\n")
    paths["json"].write_text(json.dumps(to_json(r, v), indent=1, default=str) + "\n")
    plot_roofline(r, paths["roofline"])
    return paths
