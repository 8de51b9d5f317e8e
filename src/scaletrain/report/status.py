"""Where a run is, read from its directory alone (it may be running on other hosts): step, loss,
speed, ETA, last checkpoint, health and state. Reads files the loop writes; imports no torch.

State, first that applies:
- hung: the watchdog wrote a report after the last heartbeat;
- finished: run_info.json is written and the last step is train.steps;
- stopped: every rank exited cleanly before train.steps (rerun the command to resume);
- running: the newest heartbeat is younger than `stall_after_s`;
- crashed: no recent heartbeat, and no recorded process of this host is alive;
- stalled: no recent heartbeat, and a process is alive (or on another host, unknowable here).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError
from scaletrain.measure.run_files import finite, read_object, read_records, whole

__all__ = ["RunStatus", "format_status", "run_status"]

MIN_STALL_S = 300.0
"""A heartbeat younger than this is alive, however fast the steps were (evals and checkpoint
saves fall between heartbeats)."""


@dataclass
class RunStatus:
    run_dir: Path
    state: str
    detail: str
    step: int
    total_steps: int
    loss: float | None = None
    val_loss: float | None = None
    eval_losses: dict[str, float] = field(default_factory=dict)
    """Last loss on each `data.eval_sources` set, by name."""
    tokens_per_s: float | None = None
    step_s: float | None = None
    eta_s: float | None = None
    checkpoint: str | None = None
    health: dict[str, Any] = field(default_factory=dict)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The object lines (a line being written right now, or a damaged one, is skipped)."""
    return read_records(path)


def _json(path: Path) -> dict[str, Any] | None:
    return read_object(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _checkpoint(run_dir: Path) -> str | None:
    """The newest published checkpoint (a manifest means the write finished)."""
    ckpts = sorted(
        p for p in (run_dir / "checkpoints").glob("step_*") if (p / "manifest.json").is_file()
    )
    return ckpts[-1].name if ckpts else None


def _health(run_dir: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    stragglers = _jsonl(run_dir / "stragglers.jsonl")
    rollbacks = [g for g in _jsonl(run_dir / "guard.jsonl") if g.get("event") == "rollback"]
    return {
        "stragglers": {
            r: s["step"]
            for s in stragglers
            if isinstance(s.get("stragglers"), list) and "step" in s
            for r in s["stragglers"]
            if whole(r) is not None
        },
        "rollbacks": len(rollbacks),
        "skipped_steps": sum(1 for r in records if r.get("skipped")),
        "watchdog": (_json(run_dir / "watchdog" / "report.json") or {}).get("line"),
    }


def _state(
    run_dir: Path, *, step: int, total: int, stall_after_s: float, now: float
) -> tuple[str, str]:
    # a heartbeat or hang report without a finite time (damaged, hand-edited) is ignored
    beats = [
        b
        for p in sorted((run_dir / "heartbeat").glob("rank*.json"))
        if (b := _json(p)) is not None and finite(b.get("time")) is not None
    ]
    newest = max((float(b["time"]) for b in beats), default=None)
    hang = _json(run_dir / "watchdog" / "report.json")
    if (
        hang is not None
        and finite(hang.get("time")) is not None
        and (newest is None or hang["time"] >= newest)
    ):
        return "hung", str(hang.get("line", "the watchdog reported a hang"))
    if (run_dir / "run_info.json").is_file() and step >= total:
        return "finished", f"{step} of {total} steps"
    if beats and all(b.get("state") == "exited" for b in beats):
        return "stopped", f"exited cleanly at step {step} of {total}: rerun to resume"
    if newest is None:
        return "not started", "no heartbeat yet (or monitor.heartbeat=false)"
    age = now - newest
    if age <= stall_after_s:
        return "running", f"last heartbeat {age:.0f} s ago, {len(beats)} rank(s)"
    here = socket.gethostname()
    local = [b for b in beats if b.get("host") == here]
    if len(local) == len(beats) and not any(
        _alive(pid) for b in local if (pid := whole(b.get("pid"))) is not None
    ):
        return "crashed", f"no heartbeat for {age:.0f} s and no process of the run is alive"
    return "stalled", (
        f"no heartbeat for {age:.0f} s (stall limit {stall_after_s:.0f} s); "
        "processes are alive or on other hosts"
    )


def run_status(run_dir: str | Path, *, now: float | None = None) -> RunStatus:
    d = Path(run_dir)
    if not (d / "config.json").exists():
        raise ConfigError(
            "run_dir",
            str(d),
            "give a run directory that holds config.json (written when training starts)",
        )
    config = read_object(d / "config.json", required=True)
    assert config is not None  # (required: raised otherwise)
    train = config.get("train")
    total = whole(train.get("steps")) if isinstance(train, dict) else None
    if total is None or total < 0:
        raise ConfigError(
            "run_dir",
            str(d / "config.json"),
            "it has no whole train.steps: restore the run's config.json",
        )
    # metrics rows whose step is not a whole number are damaged: skipped
    records = [r for r in _jsonl(d / "metrics.jsonl") if whole(r.get("step", 0)) is not None]
    last = records[-1] if records else {}
    step = whole(last.get("step", 0)) or 0
    recent = [v for r in records[-50:] if (v := finite(r.get("step_s"))) is not None]
    step_s = statistics.median(recent) if recent else None
    monitor = config.get("monitor")
    watchdog = (
        finite(monitor.get("watchdog_timeout_s")) if isinstance(monitor, dict) else None
    ) or 0.0
    stall_after = max(MIN_STALL_S, watchdog, 10 * (step_s or 0.0))
    state, detail = _state(
        d,
        step=step,
        total=total,
        stall_after_s=stall_after,
        now=time.time() if now is None else now,
    )
    vals = [v for r in records if (v := finite(r.get("val_loss"))) is not None]
    evals = {
        k[9:]: v
        for r in records
        for k, raw in r.items()
        if k.startswith("val_loss/") and (v := finite(raw)) is not None
    }  # later win
    tok = [v for r in records[-50:] if (v := finite(r.get("tokens_per_s"))) is not None]
    eta = (total - step) * step_s if step_s is not None and state == "running" else None
    return RunStatus(
        run_dir=d,
        state=state,
        detail=detail,
        step=step,
        total_steps=total,
        loss=finite(last.get("loss")),
        val_loss=vals[-1] if vals else None,
        eval_losses=evals,
        tokens_per_s=statistics.median(tok) if tok else None,
        step_s=step_s,
        eta_s=eta,
        checkpoint=_checkpoint(d),
        health=_health(d, records),
    )


def _duration(s: float) -> str:
    h, rest = divmod(int(s), 3600)
    return f"{h} h {rest // 60:02d} min" if h else f"{rest // 60} min {rest % 60:02d} s"


def format_status(s: RunStatus) -> str:
    h = s.health
    pct = f" ({s.step / s.total_steps:.0%})" if s.total_steps else ""
    loss = "-" if s.loss is None else f"{s.loss:.4f}"
    if s.val_loss is not None:
        loss += (
            f" (last val {s.val_loss:.4f}"
            + "".join(f"; {k} {v:.4f}" for k, v in s.eval_losses.items())
            + ")"
        )
    speed = "-" if s.tokens_per_s is None else f"{s.tokens_per_s:,.0f} tok/s"
    if s.step_s is not None:
        speed += f", {s.step_s:.3f} s/step (median of the last 50)"
    stragglers = ", ".join(f"rank {r} (last at step {t})" for r, t in h["stragglers"].items())
    rows = [
        ("run", str(s.run_dir)),
        ("state", f"{s.state}: {s.detail}"),
        ("step", f"{s.step} / {s.total_steps}{pct}"),
        ("loss", loss),
        ("speed", speed),
        ("ETA", "-" if s.eta_s is None else _duration(s.eta_s)),
        ("checkpoint", s.checkpoint or "none yet"),
        ("stragglers", stragglers or "none"),
        ("rollbacks", str(h["rollbacks"])),
        ("skipped", f"{h['skipped_steps']} step(s) (non-finite gradients)"),
        ("watchdog", h["watchdog"] or "no hang reported"),
    ]
    return "\n".join(f"{k:<11} {v}" for k, v in rows)
