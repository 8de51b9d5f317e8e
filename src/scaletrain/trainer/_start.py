"""The line a run prints at its start: whether it resumes (from which checkpoint and step) or
starts afresh, and why, so re-running a command never leaves the user guessing."""

from __future__ import annotations

from pathlib import Path

__all__ = ["start_line"]


def start_line(
    checkpoint: Path | None, step: int, *, resume: str, ckpt_dir: Path, total_steps: int
) -> str:
    if checkpoint is not None:
        return (
            f"resuming from {checkpoint} at step {step} of {total_steps} "
            f"(checkpoint.resume={resume})"
        )
    why = "checkpoint.resume=never" if resume == "never" else f"no good checkpoint in {ckpt_dir}"
    return f"starting afresh at step 0 of {total_steps}: {why}"
