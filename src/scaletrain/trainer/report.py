"""End-of-run text: the summary and the memory ledger (planned vs measured, per category)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scaletrain.config import byte_unit, fmt_bytes

from .metrics import perplexity

if TYPE_CHECKING:
    from scaletrain.planner.types import PlanInput

    from .build import Run
    from .result import RunResult

__all__ = ["memory_ledger", "summary", "plan_input", "OutOfMemory", "out_of_memory"]

_CATEGORIES = ("params", "grads", "optimizer", "activations")


def plan_input(run: Run) -> PlanInput:
    """The planner's view of this run (same model, layout, batch, precision, hardware)."""
    from scaletrain.planner.types import plan_input_from_job

    return plan_input_from_job(run.job, run.dims.layout, hardware=run.hardware)


def memory_ledger(run: Run, measured: dict[str, Any]) -> str:
    """A table of planned vs measured bytes for this rank's training state and activations.

    Measured on CPU: parameters, gradients and optimizer states by their storage (exact), and
    activations as the bytes autograd saved for backward in one micro-batch; the planned side
    in the same terms (`measure.verify.live_terms`), its in-flight copies on their own line.
    """
    try:
        from scaletrain.planner import pipeline_rank_memory

        planned = pipeline_rank_memory(plan_input(run), run.dims.pp_rank)  # this rank's stage
    except Exception as e:  # the ledger must never take a finished run down with it
        return f"memory ledger: planner unavailable for this layout ({type(e).__name__}: {e})"
    return ledger_table(planned, measured)


def ledger_table(planned: Any, measured: dict[str, Any]) -> str:
    """`memory_ledger`'s table from a planner MemoryBreakdown and the measured categories."""
    from scaletrain.measure.verify import live_terms

    d = planned.detail
    resident = live_terms(planned)
    flight = d.get("params.in_flight", 0.0) + d.get("grads.in_flight", 0.0)
    figures = [resident[c] for c in _CATEGORIES] + [measured.get(c) or 0.0 for c in _CATEGORIES]
    unit, size = byte_unit(max([*figures, flight, planned.buffers]))  # one unit per table
    rows = [f"memory ledger (this rank, {unit}){' ' * (6 - len(unit))}planned   measured   error"]
    for cat in _CATEGORIES:
        p, m = resident[cat], measured.get(cat)
        if m is None:
            continue
        err = f"{(p - m) / m:+.0%}" if m else "n/a"
        label = "activations (one micro-batch)" if cat == "activations" else cat
        rows.append(f"  {label:<29} {p / size:9.1f} {m / size:10.1f} {err:>7}")
    if flight:
        rows.append(f"  {'16-bit params/grads in flight':<29} {flight / size:9.1f}")
    if d.get("offloaded.cpu"):
        rows.append(f"  {'offloaded to host (planned)':<29} {d['offloaded.cpu'] / size:9.1f}")
    rows.append(f"  {'buffers (planned terms)':<29} {planned.buffers / size:9.1f}")
    return "\n".join(rows)


def summary(r: RunResult) -> str:
    line = f"done: {r.steps} steps | final loss {r.final_loss:.4f}"
    if r.val_loss is not None:
        line += f" | val loss {r.val_loss:.4f}"
    for name, loss in r.eval_losses.items():
        line += f" | {name} {loss:.4f} (ppl {perplexity(loss):.2f})"
    if r.best_loss is not None:
        line += f" | best achievable {r.best_loss:.4f} (corpus entropy)"
    lines = [
        line,
        f"throughput {r.tokens_per_s:,.0f} tokens/s | MFU {r.mfu:.2%} | "
        f"skipped steps {r.skipped_steps} | rollbacks {r.rollbacks}",
    ]
    if r.ledger:
        lines.append(r.ledger)
    peak = {k: v for k, v in r.measured.items() if k.startswith("peak_")}
    if peak:
        lines.append(
            "peak process memory: " + ", ".join(f"{k[5:]} {fmt_bytes(v)}" for k, v in peak.items())
        )
    if r.sample:
        lines.append("sample:\n" + printable(r.sample))
    lines.append(f"run directory: {r.run_dir.resolve()}")
    return "\n".join(lines)


class OutOfMemory(RuntimeError):
    """A training step ran out of device or host memory; the report says what and what next."""


def out_of_memory(run: Run, *, step: int, error: BaseException) -> OutOfMemory:
    """Write oom_report.json (+ a CUDA memory snapshot) and build the exception to raise.

    Nothing is saved: the last good checkpoint stays as it was.
    """
    import torch

    from scaletrain.measure.live import state_bytes

    measured = state_bytes(run.model, run.optimizer)
    report: dict[str, Any] = {
        "step": step,
        "rank": run.env.rank,
        "error": str(error)[:2000],
        "device": run.device.type,
        "measured": measured,
    }
    if run.device.type == "cuda":
        report["cuda"] = {
            "allocated": torch.cuda.memory_allocated(run.device),
            "reserved": torch.cuda.memory_reserved(run.device),
            "max_allocated": torch.cuda.max_memory_allocated(run.device),
        }
        try:
            snapshot = run.run_dir / f"oom_snapshot_rank{run.env.rank}.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
            report["snapshot"] = str(snapshot)
        except Exception:  # recording may be off; the breakdown above still helps
            pass
    advice = "lower batch.micro_batch, set memory.ac=full, or raise parallel.zero / tp / pp"
    try:
        from scaletrain.planner import estimate

        planned = estimate(plan_input(run)).memory
        report["planned"] = planned.to_json()
        # which planned category the state overflowed first, compared with what was measured
        over = {k: measured[k] - getattr(planned, k) for k in ("params", "grads", "optimizer")}
        worst = max(over, key=lambda k: over[k])
        if over[worst] > 0:
            report["overflowed_category"] = worst
        advice = _next_layout_advice(run) or advice
    except Exception as e:  # the report must be written whatever the planner says
        report["planner_error"] = f"{type(e).__name__}: {e}"
    report["advice"] = advice
    run.run_dir.mkdir(parents=True, exist_ok=True)
    path = run.run_dir / f"oom_report_rank{run.env.rank}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    return OutOfMemory(
        f"out of memory at step {step} on rank {run.env.rank} "
        f"({type(error).__name__}); breakdown written to {path}; the last good "
        f"checkpoint is untouched. Next: {advice}"
    )


def _next_layout_advice(run: Run) -> str | None:
    """The planner's best layout that fits this world size, as a command-line hint."""
    try:
        from scaletrain.planner.search.layouts import search
    except ImportError:
        return None
    job = run.job
    result = search(
        job.model,
        run.hardware,
        run.env.world_size,
        seq_len=job.batch.seq_len,
        global_batch=job.batch.global_batch,
        precision=job.precision.dtype,
        top_k=2,
    )
    current = (run.dims.layout, job.batch.micro_batch, job.memory.ac)
    # the layout that just ran out of memory is no advice, though the planner calls it fitting
    # (its estimate was short of what the device holds): the best other one
    best = next(
        (
            c
            for c in getattr(result, "top", None) or ()
            if (c.plan.layout, c.plan.micro_batch, c.plan.ac) != current
        ),
        None,
    )
    if best is None:
        return None
    p, L = best.plan, best.plan.layout
    return (
        f"the planner's best fitting layout: --parallel.dp={L.dp} --parallel.zero={L.zero} "
        f"--parallel.tp={L.tp} --parallel.sp={str(L.sp).lower()} --parallel.pp={L.pp} "
        f"--parallel.cp={L.cp} "
        f"--batch.micro_batch={p.micro_batch} --memory.ac={p.ac}"
    )


def printable(text: str) -> str:
    """`text` with control and undecodable characters escaped (keeps newlines and tabs): an
    untrained byte-level model samples arbitrary bytes, which must not reach the terminal raw."""
    return "".join(
        c if c.isprintable() or c in "\n\t" else (f"\\x{ord(c):02x}" if ord(c) < 256 else "?")
        for c in text
    )
