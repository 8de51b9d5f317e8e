"""`write_report(run_dir)`: one self-contained HTML page per run.

Self-contained means it opens from a mail attachment or a copied folder: figures are base64 PNG
`<img>` data URIs, the CSS is inline, nothing is fetched. The only hrefs are relative links to
the run's own files (checkpoints, metrics), which work when the page sits in its run directory.
"""

from __future__ import annotations

import base64
import datetime
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaletrain.config import byte_unit, fmt_bytes

from . import plots
from .data import MEMORY_CATEGORIES, Prediction, RunData, load_run, predict_run
from .health import health_section

__all__ = ["write_report", "render_report"]

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       max-width: 1000px; margin: 24px auto; padding: 0 16px; color: #222; background: #fff; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; font-size: 12px; }
.headline { display: flex; flex-wrap: wrap; gap: 8px; margin: 12px 0; }
.headline div { background: #f4f6fa; border-radius: 6px; padding: 6px 12px; }
.headline b { display: block; font-size: 16px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f6fa; }
table.kv td, table.kv th { text-align: left; }
td.good { color: #1a7f37; } td.warn { color: #9a6700; } td.bad { color: #cf222e; }
img { max-width: 100%; display: block; margin: 8px 0; }
pre { background: #f6f8fa; padding: 10px; white-space: pre-wrap; word-break: break-all; }
.note { color: #666; font-size: 12px; }
.alert { background: #fff1f0; border-left: 4px solid #cf222e; padding: 6px 12px; }
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _bytes(n: float | None, unit: tuple[str, float]) -> str:
    return "–" if n is None else fmt_bytes(n, digits=2, unit=unit)


def _rel(err: float | None) -> tuple[str, str]:
    """(text, css class) of a relative error: green within 10 %, amber within 25 %."""
    if err is None:
        return "–", ""
    cls = "good" if abs(err) <= 0.10 else "warn" if abs(err) <= 0.25 else "bad"
    return f"{err:+.1%}", cls


def _rel_of(pred: float | None, meas: float | None) -> float | None:
    return (pred - meas) / meas if pred is not None and meas else None


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Cells are escaped; a (text, css class) tuple sets the cell's class."""
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = []
        for c in row:
            text, cls = c if isinstance(c, tuple) else (c, "")
            cells.append(f'<td class="{cls}">{_e(text)}</td>' if cls else f"<td>{_e(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _figure(make, alt: str) -> str:  # type: ignore[no-untyped-def]
    """A figure, or a note saying why it is missing (a plot must never sink the report)."""
    try:
        return _img(make(), alt)
    except Exception as e:
        return f'<p class="note">{_e(alt)}: not drawn ({_e(type(e).__name__)}: {_e(e)})</p>'


def _headline(run: RunData, pred: Prediction) -> str:
    """The run's headline numbers. run_info.json's are used only when they are numbers of the
    right kind (a hand-edited or damaged field is passed over for what metrics.jsonl says)."""
    from scaletrain.measure.run_files import finite, whole

    info, last = run.info, (run.metrics[-1] if run.metrics else {})

    def count(key: str, fallback: Any) -> Any:
        n = whole(info.get(key))
        return n if n is not None and n >= 0 else fallback

    items: list[tuple[str, Any]] = [("steps", count("steps", whole(last.get("step"))))]
    final = finite(info.get("final_loss"))
    final = final if final is not None else finite(last.get("loss"))
    items.append(("final loss", f"{final:.4f}" if final is not None else None))
    if (val := finite(info.get("val_loss"))) is not None:
        items.append(("val loss", f"{val:.4f}"))
    evals = info.get("eval")
    for name, e in evals.items() if isinstance(evals, dict) else ():  # data.eval_sources
        if isinstance(e, dict) and None not in (
            loss := finite(e.get("val_loss")),
            ppl := finite(e.get("ppl")),
        ):
            items.append((f"{name} loss (ppl)", f"{loss:.4f} ({ppl:.2f})"))
    if run.best_loss is not None:
        items.append(("best achievable", f"{run.best_loss:.4f}"))
    tok, mfu = pred.tokens_per_s[1], pred.mfu[1]
    if tok is not None:
        items.append(("tokens/s", f"{tok:,.0f}"))
    if mfu is not None:
        items.append(("MFU", f"{mfu:.2%}"))
    items.append(("rollbacks", count("rollbacks", len(run.guard))))
    skipped = sum(bool(r.get("skipped")) for r in run.metrics)
    items.append(("skipped steps", count("skipped_steps", skipped)))
    cells = "".join(f"<div>{_e(k)}<b>{_e(v)}</b></div>" for k, v in items if v is not None)
    return f'<div class="headline">{cells}</div>'


def _plan_section(run: RunData, pred: Prediction) -> str:
    job = run.job
    if job is None:
        why = f"config.json {run.damaged.get('config.json', 'missing')}"
        return f'<p class="alert">The plan cannot be shown: {_e(why)}</p>'
    m, b = job.model, job.batch
    layout = pred.estimate.plan.layout if pred.estimate is not None else None
    layout_text = str(layout) if layout is not None else str(job.parallel)
    grad_accum = b.global_batch // max(1, b.micro_batch * (layout.dp if layout else 1))
    rows = [
        (
            "model",
            f"{m.name}: {m.num_params():,} parameters, {m.num_layers} layers, dim {m.dim}, "
            f"{m.num_heads} heads, vocab {m.vocab_size:,}"
            + (f", {m.num_experts} experts (top-{m.experts_per_token})" if m.num_experts else ""),
        ),
        ("layout", f"{layout_text} on {run.world_size} rank(s)"),
        (
            "batch",
            f"global {b.global_batch} sequences × {b.seq_len} tokens = "
            f"{b.global_batch * b.seq_len:,} tokens/step; micro-batch {b.micro_batch}, "
            f"gradient accumulation {grad_accum}",
        ),
        (
            "precision",
            f"{job.precision.dtype}; activation checkpointing {job.memory.ac}; "
            f"offload {job.memory.offload}",
        ),
        (
            "optimizer",
            f"{job.optim.name}, lr {job.optim.lr:g} ({job.optim.schedule}, warmup "
            f"{job.optim.warmup_steps} steps), weight decay {job.optim.weight_decay:g}, "
            f"grad clip {job.optim.grad_clip:g}",
        ),
        (
            "hardware",
            f"{run.info.get('hardware', job.hardware.gpu)} ({run.info.get('device', '?')} device)",
        ),
        (
            "data",
            f"{job.data.source}, tokenizer {job.data.tokenizer}, "
            f"{job.data.num_tokens:,} tokens (seed {job.data.seed})",
        ),
        (
            "schedule",
            f"{job.train.steps} steps, eval every {job.train.eval_every}, checkpoint "
            f"every {job.checkpoint.every or 'end only'}",
        ),
    ]
    return _table(("", "plan"), rows).replace("<table>", '<table class="kv">', 1)


def _compare_section(pred: Prediction) -> str:
    parts = []
    if pred.error:
        parts.append(f'<p class="alert">Planner unavailable for this plan: {_e(pred.error)}</p>')
    rows: list[list[Any]] = []
    p, m = pred.memory_predicted, pred.memory_measured
    if p or m:
        unit = byte_unit(max([*(p or {}).values(), *(m or {}).values()]))  # one for the rows
        for c in (*MEMORY_CATEGORIES, "total", "reserved"):
            pv = p.get(c) if p else None
            mv = m.get(c) if m else None
            if not pv and not mv:
                continue
            err = pred.memory_rel_error.get(c) if m else None
            rows.append(
                [f"memory: {c}", _bytes(pv, unit), _bytes(mv, unit) if m else "–", _rel(err)]
            )
    (tp, tm), (fp, fm) = pred.tokens_per_s, pred.mfu
    if tp is not None or tm is not None:
        rows.append(
            [
                "tokens/s (whole job)",
                f"{tp:,.0f}" if tp is not None else "–",
                f"{tm:,.0f}" if tm is not None else "–",
                _rel(_rel_of(tp, tm)),
            ]
        )
    if fp is not None or fm is not None:
        rows.append(
            [
                "MFU",
                f"{fp:.2%}" if fp is not None else "–",
                f"{fm:.2%}" if fm is not None else "–",
                _rel(_rel_of(fp, fm)),
            ]
        )
    sp, sm = pred.step_s
    if sp is not None or sm is not None:
        rows.append(
            [
                "step time (s)",
                f"{sp:.4g}" if sp is not None else "–",
                f"{sm:.4g}" if sm is not None else "–",
                _rel(_rel_of(sp, sm)),
            ]
        )
    if rows:
        parts.append(
            _table(
                ("quantity", "predicted", "measured", "relative error (pred − meas) / meas"), rows
            )
        )
    if m is None:
        parts.append(
            '<p class="note">No measurement.json: memory was not measured for this run.</p>'
        )
    parts += [f'<p class="note">note: {_e(n)}</p>' for n in pred.notes]
    return "\n".join(parts)


def _data_window(window: Any) -> str:
    """guard.jsonl's half-open [first, end) data-step window as an inclusive range."""
    if not isinstance(window, list) or len(window) != 2:
        return "–"
    first, end = window
    return f"{first}..{end - 1}" if end > first else "none"


def _guard_section(run: RunData) -> str:
    skipped = [int(r["step"]) for r in run.metrics if r.get("skipped")]
    parts = []
    if not run.guard:
        parts.append("<p>No loss spike: the guard never rolled back.</p>")
    else:
        rows = [
            [
                e.get("spike_step"),
                e.get("restored_step"),
                _data_window(e.get("skipped_data_steps")),
                e.get("reason", ""),
            ]
            for e in run.guard
        ]
        parts.append(
            f"<p>The loss-spike guard rolled back {len(run.guard)} time(s): each spiked "
            "step was never applied; training resumed from the last good checkpoint "
            "and skipped the data window around the spike.</p>"
        )
        parts.append(
            _table(
                ("spike at step", "restored step", "data steps skipped", "reason"), rows
            ).replace("<table>", '<table class="kv">', 1)
        )
    if skipped:
        parts.append(
            f"<p>{len(skipped)} step(s) skipped for non-finite gradients (fp16 loss "
            f"scaling): {_e(', '.join(map(str, skipped[:50])))}</p>"
        )
    return "\n".join(parts)


def _oom_section(run: RunData) -> str:
    if not run.oom:
        return ""
    rows = [
        [
            r.get("rank"),
            r.get("step"),
            r.get("overflowed_category", "–"),
            str(r.get("error", ""))[:300],
            r.get("advice", ""),
        ]
        for r in run.oom
    ]
    table = _table(("rank", "step", "overflowed", "error", "next"), rows)
    return (
        "<h2>Out of memory</h2>"
        + '<p class="alert">This run ran out of memory.</p>'
        + table.replace("<table>", '<table class="kv">', 1)
    )


def _printable(text: str) -> str:
    """Control characters (a barely trained byte-level model emits them) shown as U+FFFD."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", "\ufffd", text)


def _files_section(run: RunData) -> str:
    names = [
        "config.json",
        "run_info.json",
        "metrics.jsonl",
        "guard.jsonl",
        "measurement.json",
        "sample.txt",
        *(p.name for p in sorted(run.run_dir.glob("oom_report_rank*.json"))),
    ]
    links = [f'<li><a href="{_e(n)}">{_e(n)}</a></li>' for n in names if (run.run_dir / n).exists()]
    ckpts = [
        f'<li><a href="checkpoints/{_e(p.name)}/">checkpoints/{_e(p.name)}</a></li>'
        for p in run.checkpoints
    ]
    if not ckpts:
        ckpts = ["<li>no checkpoints</li>"]
    return (
        f"<p>Run directory: <code>{_e(run.run_dir.resolve())}</code></p>"
        f"<ul>{''.join(links)}</ul><p>Checkpoints:</p><ul>{''.join(ckpts)}</ul>"
    )


def _damage_section(run: RunData) -> str:
    """A banner naming each damaged file and what this page could not show without it."""
    if not run.damaged:
        return ""
    from .data import LOST

    items = "".join(
        f"<li><code>{_e(name)}</code>: {_e(why)}; this page has no "
        f"{_e(LOST.get(name.split('_rank')[0], 'contents'))} (restore the file and run "
        "<code>scaletrain report</code> again)</li>"
        for name, why in run.damaged.items()
    )
    return f'<div class="alert"><p>Incomplete report: damaged run files</p><ul>{items}</ul></div>'


def render_report(run: RunData, pred: Prediction | None = None) -> str:
    """The report's HTML text."""
    pred = pred if pred is not None else predict_run(run)
    title = f"scaletrain run report: {run.run_dir.resolve().name}"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">generated {now} from <code>{_e(run.run_dir.resolve())}</code></p>',
        _damage_section(run),
        _headline(run, pred),
        "<h2>Plan</h2>",
        _plan_section(run, pred),
        "<h2>Predicted vs measured</h2>",
        _compare_section(pred),
    ]
    body.append(_oom_section(run))
    if run.metrics:
        body += [
            "<h2>Curves</h2>",
            _figure(
                lambda: plots.loss_curve(
                    run.metrics, guard_events=run.guard, best_loss=run.best_loss
                ),
                "loss curve",
            ),
            _figure(
                lambda: plots.throughput_curve(
                    run.metrics,
                    predicted_tokens_per_s=pred.tokens_per_s[0],
                    predicted_mfu=pred.mfu[0],
                ),
                "throughput and MFU",
            ),
            _figure(lambda: plots.optimizer_curve(run.metrics), "gradient norm and lr"),
        ]
    body.append("<h2>Memory</h2>")
    if pred.memory_predicted or pred.memory_measured:
        body.append(
            _figure(
                lambda: plots.memory_bars(pred.memory_predicted, pred.memory_measured),
                "memory by category, planned vs measured",
            )
        )
    timeline = (run.measurement or {}).get("timeline") or []
    if timeline:
        body.append(_figure(lambda: plots.memory_timeline(timeline), "memory timeline"))
    else:
        body.append(
            '<p class="note">No memory timeline recorded (measurement.json has no timeline).</p>'
        )
    body += ["<h2>Loss-spike guard</h2>", _guard_section(run)]
    body += ["<h2>Stragglers and hangs</h2>", health_section(run)]
    if run.sample:
        body += [
            "<h2>Sample</h2>",
            '<p class="note">Text generated by the final model.</p>',
            f"<pre>{_e(_printable(run.sample))}</pre>",
        ]
    body += ["<h2>Files</h2>", _files_section(run)]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(b for b in body if b)
        + "\n</body></html>\n"
    )


def write_report(run_dir: str | Path | RunData, *, out: str | Path | None = None) -> Path:
    """Write RUN_DIR/report.html (or `out`) and return its path; ConfigError if not a run."""
    run = run_dir if isinstance(run_dir, RunData) else load_run(run_dir)
    path = Path(out) if out is not None else run.run_dir / "report.html"
    path.write_text(render_report(run), encoding="utf-8")
    return path
