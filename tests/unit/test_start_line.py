"""A run says whether it resumes (from which checkpoint and step) or starts afresh, and why."""

from __future__ import annotations

from pathlib import Path

from scaletrain.trainer._start import start_line


def test_resumed_run_names_checkpoint_and_step() -> None:
    line = start_line(
        Path("runs/a/checkpoints/step_40"),
        40,
        resume="auto",
        ckpt_dir=Path("runs/a/checkpoints"),
        total_steps=100,
    )
    assert line.startswith("resuming from runs/a/checkpoints/step_40 at step 40 of 100")


def test_fresh_run_says_why() -> None:
    assert start_line(None, 0, resume="never", ckpt_dir=Path("c"), total_steps=5).endswith(
        "checkpoint.resume=never"
    )
    assert (
        start_line(None, 0, resume="auto", ckpt_dir=Path("c"), total_steps=5)
        == "starting afresh at step 0 of 5: no good checkpoint in c"
    )
