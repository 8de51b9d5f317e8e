"""Before a resume loads any tensor: compare the saved run's config with this one.

Loading first and judging after gave 50-300-line tracebacks from DCP's planner (a shape that
does not match, a key that is missing). The checkpoint's `trainer_state.json` holds the model
it was written for, and the run directory's `config.json` the job that wrote it; both are
JSON, read before anything else. Changes that reshard (the parallel layout, the world size)
and schedule knobs are allowed; a different model, sequence length or optimizer is refused in
one line naming every field that changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError, JobConfig

__all__ = ["check_resume", "REFUSED"]

REFUSED = (("batch", "seq_len"), ("optim", "name"))
"""Job fields (besides every model field) a checkpoint cannot be resumed across."""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing or torn: the checkpoint's own verification reports it
    return out if isinstance(out, dict) else None


def changes(saved: dict[str, Any], job: JobConfig) -> list[str]:
    """'field: old -> new' for every refused difference between a saved job dict and `job`."""
    now = job.to_dict()
    out = [
        f"model.{k}: {v!r} -> {now['model'].get(k)!r}"
        for k, v in (saved.get("model") or {}).items()
        if now["model"].get(k) != v
    ]
    for section, key in REFUSED:
        old = (saved.get(section) or {}).get(key, now[section][key])
        if old != now[section][key]:
            out.append(f"{section}.{key}: {old!r} -> {now[section][key]!r}")
    return out


def check_resume(path: Path, job: JobConfig) -> None:
    """Raise a one-line ConfigError if checkpoint `path` was written for another model,
    sequence length or optimizer than `job`."""
    saved: dict[str, Any] = {}
    config = _read(path.parent.parent / "config.json")  # RUN/checkpoints/step_N
    if config is not None:
        saved.update(config)
    state = _read(path / "trainer_state.json")
    if state is not None and isinstance(state.get("model"), dict):
        saved["model"] = state["model"]
    diff = changes(saved, job)
    if diff:
        raise ConfigError(
            "checkpoint.resume",
            str(path),
            f"it was written for another run ({'; '.join(diff)}); only the "
            "layout and world size may change on resume: restore those "
            "settings, or use --checkpoint.resume=never / another "
            "train.run_dir",
        )
