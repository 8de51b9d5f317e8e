"""End-of-run text: the summary and the memory ledger (planned vs measured, per category)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .build import Run
    from .loop import RunResult

__all__ = ["memory_ledger", "summary", "plan_input"]

MiB = 1024**2
_CATEGORIES = ("params", "grads", "optimizer", "activations")


def plan_input(run: Run):
    """The planner's view of this run (same model, layout, batch, precision, hardware)."""
    from scaletrain.planner.types import PlanInput

    job = run.job
    return PlanInput(model=job.model, hardware=run.hardware, num_gpus=run.env.world_size,
                     layout=run.dims.layout, seq_len=job.batch.seq_len,
                     global_batch=job.batch.global_batch, micro_batch=job.batch.micro_batch,
                     precision=job.precision.dtype, ac=job.memory.ac, offload=job.memory.offload,
                     optimizer=job.optim.name, compile=job.train.compile)


def memory_ledger(run: Run, measured: dict[str, Any]) -> str:
    """A table of planned vs measured bytes for this rank's training state and activations.

    Measured on CPU: parameters, gradients and optimizer states by their storage (exact), and
    activations as the bytes autograd saved for backward in one micro-batch.
    """
    try:
        from scaletrain.planner import estimate

        planned = estimate(plan_input(run)).memory
    except Exception as e:  # the ledger must never take a finished run down with it
        return f"memory ledger: planner unavailable for this layout ({type(e).__name__}: {e})"
    rows = ["memory ledger (this rank, MiB)   planned   measured   error"]
    for cat in _CATEGORIES:
        p, m = getattr(planned, cat), measured.get(cat)
        if m is None:
            continue
        err = f"{(p - m) / m:+.0%}" if m else "n/a"
        rows.append(f"  {cat:<29} {p / MiB:9.1f} {m / MiB:10.1f} {err:>7}")
    rows.append(f"  {'buffers (planned terms)':<29} {planned.buffers / MiB:9.1f}")
    return "\n".join(rows)


def summary(r: RunResult) -> str:
    line = f"done: {r.steps} steps | final loss {r.final_loss:.4f}"
    if r.val_loss is not None:
        line += f" | val loss {r.val_loss:.4f}"
    if r.best_loss is not None:
        line += f" | best achievable {r.best_loss:.4f} (corpus entropy)"
    lines = [line, f"throughput {r.tokens_per_s:,.0f} tokens/s | MFU {r.mfu:.2%} | "
                   f"skipped steps {r.skipped_steps} | rollbacks {r.rollbacks}"]
    if r.ledger:
        lines.append(r.ledger)
    peak = {k: v for k, v in r.measured.items() if k.startswith("peak_")}
    if peak:
        lines.append("peak process memory: " + ", ".join(f"{k[5:]} {v / MiB:,.0f} MiB"
                                                         for k, v in peak.items()))
    if r.sample:
        lines.append("sample:\n" + r.sample)
    lines.append(f"run directory: {r.run_dir.resolve()}")
    return "\n".join(lines)
