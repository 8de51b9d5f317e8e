"""benchmarks/memory_recipe.py's results: the markdown (table, acceptance checks) and the merge of
re-measured rows (--only) into the existing ones."""

from __future__ import annotations

import json
from typing import Any

from _common import RESULTS

TORCHTITAN_GIB = 82.4  # torchtitan docs/performance.md (2024-12-26), Table 1: Llama 3.1 8B


def gb(r: dict[str, Any], key: str = "peak_gb") -> str:
    v = r.get(key)
    return "n/a" if v is None else f"{v:.2f}" if v >= 1 else f"{v:.4f}"


def cell(r: dict[str, Any], key: str = "peak_gb") -> str:
    return gb(r, key) if r.get(key) is not None else f"n/a ({r.get('reason', '?')})"


def _ok(flag: bool) -> str:
    return "PASS" if flag else "FAIL"


def _row(r: dict[str, Any]) -> str:
    pl = r["planned"]
    pcell = (
        "n/a (" + pl.get("reason", "?") + ")"
        if pl["allocated_gb"] is None
        else f"{pl['allocated_gb']:.2f} / {pl['reserved_gb']:.2f}"
    )
    saved = "n/a" if r["saved_pct"] is None else f"{r['saved_pct']:.1f}"
    when = r.get("measured") or {}
    stamp = f"{when.get('git', '?')} {str(when.get('date', '?'))[:10]}"
    return (
        f"| {r['model']} | {r['layout']} | {r['ac']} | {cell(r['before'])} | "
        f"{cell(r['after'])} | {saved} | {pcell} | {stamp} |"
    )


def _loss_lines(checks: dict[str, Any]) -> list[str]:
    out = []
    lt = checks.get("loss_temp")
    if lt:
        out.append(
            f"- loss-backward temporaries (planner's `loss_backward_temp`, `scaletrain "
            f"explain {' '.join(lt['flags'])}`): before {lt['before_gb']} GB, after "
            f"{lt['after_gb']} GB vs 1 GB -> {_ok(lt['ok'])}."
        )
    for c in checks.get("loss_temp_256k", []):
        out.append(
            f"- loss-backward temporaries, 256,000-token vocabulary at llama3-8b widths "
            f"(`scaletrain explain {' '.join(c['flags'])}`): `loss_backward_temp` "
            f"{c['loss_backward_temp']} GB vs 1 GB -> {_ok(c['ok'])}; the head weight's "
            f"gradient the fused loss returns is its own term, `head_grad` {c['head_grad']} GB "
            "(it was counted in `loss_backward_temp` before)."
        )
    return out


def _throughput_line(thr: dict[str, Any]) -> str:
    ratios = ", ".join(f"{p['ratio']:.3f}" for p in thr["pairs"])
    return (
        f"- default CPU job (`scaletrain train`, embedded default, {thr['steps']} steps,"
        f" OMP_NUM_THREADS=1), {thr['reps']} alternated before/after pairs: median "
        f"before {thr['median_before']:.0f} tok/s, after {thr['median_after']:.0f}"
        f" tok/s; after/before per pair {ratios}; median ratio "
        f"{thr['median_ratio']:.3f} -> {_ok(thr['median_ratio'] >= 0.95)}"
        " (may not drop by more than 5%). Tokens/s: steady steps of metrics.jsonl"
        " (first step dropped). The host is shared (2 cores), dry-runs ran beside."
    )


def markdown(
    rows: list[dict[str, Any]], checks: dict[str, Any], thr: dict[str, Any], quick: bool
) -> str:
    out = [
        "# Memory recipe (issue 16): dry-run peak before and after",
        "",
        "Rank-0 peak allocated (GB = 1e9 B) measured by `scaletrain dryrun` (fake tensors, the",
        "real step) from the tree before the recipe (56e20cf^1) and from this tree; planned:",
        "this tree's `scaletrain plan` for the same flags (allocated / reserved). H100-SXM,",
        "bf16, one micro-batch per step. " + ("QUICK smoke run (tiny models)." if quick else ""),
        "Measured: the commit and date of the row's run (rows re-measured with `--only` carry",
        "their own; the others are from the last full run).",
        "",
        "| model | layout | ac | before GB | after GB | saved % | planned GB (alloc / reserved)"
        " | measured |",
        "|---|---|---|---:|---:|---:|---:|---|",
        *(_row(r) for r in rows),
        "",
        "## Checks (acceptance of issue 16)",
        "",
    ]
    tt = checks.get("torchtitan")
    if tt:
        out.append(
            f"- torchtitan layout (`{' '.join(tt['flags'])}`): dry-run {tt['after_gb']}"
            f" GB = {tt['after_gib']} GiB allocated vs {TORCHTITAN_GIB} GiB published"
            f" -> {_ok(tt['dryrun_ok'])}; planned reserved"
            f" {tt['planned_reserved_gb']} GB vs 80 GB"
            f" -> {_ok(tt['plan_ok'])} (before: {tt['before_gb']} GB)."
        )
    out += _loss_lines(checks)
    if thr:
        out.append(_throughput_line(thr))
    return "\n".join(out) + "\n"


def key(r: dict[str, Any]) -> tuple[str, str, str]:
    return r["model"], r["layout"], r["ac"]


def previous() -> dict[str, Any]:
    """The existing results, each row stamped with the run it came from."""
    path = RESULTS / "memory_recipe.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    for r in data.get("rows", []):
        r.setdefault("measured", {"git": data.get("git_revision"), "date": data.get("date")})
    return data


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fresh = {key(r): r for r in new}
    out = [fresh.pop(key(r), r) for r in old]
    return out + [r for r in new if key(r) in fresh]
