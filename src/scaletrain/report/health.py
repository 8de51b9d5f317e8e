"""The run report's "Stragglers and hangs" section: the straggler reports the loop added to
metrics.jsonl every `monitor.straggler_every` steps, and the hang watchdog's report."""

from __future__ import annotations

import html
import json

from .data import RunData

__all__ = ["health_section"]


def _row(cells: list[object]) -> str:
    return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def health_section(run: RunData) -> str:
    parts = []
    gathered = [r for r in run.metrics if "stragglers" in r]
    slow = [r for r in gathered if r["stragglers"]]
    if not gathered:
        parts.append(
            "<p>No straggler report (monitor.straggler_every = 0, or the run was "
            "shorter than one report interval).</p>"
        )
    elif not slow:
        parts.append(
            f"<p>No straggler in {len(gathered)} report(s): every rank within "
            "monitor.straggler_factor of the median step and data-wait time.</p>"
        )
    else:
        rows = [
            _row(
                [
                    r["step"],
                    ", ".join(map(str, r["stragglers"])),
                    " / ".join(f"{x:.3f}" for x in r["rank_step_s"]),
                    " / ".join(f"{x:.3f}" for x in r["rank_data_wait_s"]),
                ]
            )
            for r in slow
        ]
        parts.append(
            f"<p>Stragglers in {len(slow)} of {len(gathered)} report(s) (per-rank "
            "mean seconds per step over each interval, rank 0 first):</p>"
        )
        parts.append(
            '<table class="kv"><tr><th>step</th><th>straggler rank(s)</th>'
            "<th>step s per rank</th><th>data wait s per rank</th></tr>"
            + "".join(rows)
            + "</table>"
        )
    try:
        hang = json.loads((run.run_dir / "watchdog" / "report.json").read_text())
    except (OSError, ValueError):
        hang = None
    if hang is None:
        parts.append("<p>No hang: the watchdog never fired.</p>")
    else:
        parts.append(f'<p class="alert">{html.escape(hang.get("line", "hang reported"))}</p>')
    return "\n".join(parts)
