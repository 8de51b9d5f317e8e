"""Planner vs published runs: scaletrain's planner and the peer llm-analysis on the same rows.

For every run of the corpus (`scaletrain/planner/data/published_runs.toml`: what torchtitan,
llm-foundry, NeMo, DeepSpeed, GPT-NeoX and Megatron-LM users measured on V100 to H200), each tool
predicts the peak memory of one GPU, the step time and whether the run fits. Compared:

- memory: against the published peak, the planner's `reserved` for rows that publish the
  allocator's reservation (torchtitan's max_reserved) or do not say what they read (BigScience's
  GB per GPU), and `total` less the runtime context (which torch's allocator does not count) for
  rows that publish an allocated peak (`published_peak_bytes`); llm-analysis
  has one number (weights + gradients + optimizer + activations per GPU);
- step time: seconds per optimizer step, the row's own or global tokens / (tokens/s/GPU x GPUs);
- fit / OOM: predicted fits vs the row's `oom` (a run that published a throughput ran).

Relative error = (predicted - measured) / measured; tables give the median and the max of its
absolute value per framework and overall. A layout the planner refuses (config.layout's rules)
has no prediction: it is counted as refused, with the reason. llm-analysis 0.2.2 is run through
its Python API on the same model, card and layout (`predict_llm_analysis`), given the card
figures of scaletrain's hardware preset and the planner's default efficiency of the row's
precision peak so that both tools start from the same assumptions (it has no fp8 training
mode: fp8 rows run its 16-bit dtype at the fp8 rate); layouts it cannot express (context
parallelism, interleaved pipelines, tensor parallelism beyond one node) and LoRA / QLoRA rows (a
frozen base with adapters: it plans every parameter trained) are n/a. It is optional
(see pyproject's `bench` extra): without it the peer columns are n/a.

Every scaletrain prediction goes through `predict(run, recipe)`: once with the default recipe
(what scaletrain's own trainer allocates) and once with the row's framework recipe
(`planner.recipes.published.FRAMEWORK_RECIPE`: torchtitan, deepspeed for DeepSpeed and GPT-NeoX,
megatron for Megatron-LM and NeMo, nanotron, llm-foundry), the column a user planning
that framework's run gets with `plan --recipe`.

Run: python benchmarks/planner_vs_published.py [--no-peer] [--framework NAME] [--corpus PATH]
Writes results/planner_vs_published.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from collections.abc import Callable, Iterable
from typing import Any

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from scaletrain.config import GiB  # noqa: E402
from scaletrain.planner import default_efficiency, estimate, head_activation_bytes  # noqa: E402
from scaletrain.planner.memory.head import MicroBatchShape  # noqa: E402
from scaletrain.planner.memory.rank import pipeline_rank_memory  # noqa: E402
from scaletrain.planner.recipes.memory import recipe_rank_memory  # noqa: E402
from scaletrain.planner.recipes.published import (  # noqa: E402
    PublishedRun,
    load_runs,
    plan_input,
    published_peak_bytes,
    recipe_of,
    refusals,
)
from scaletrain.planner.recipes.registry import recipe_named  # noqa: E402

Prediction = tuple[float, float, bool]
"""(peak memory GiB, step seconds, fits)."""

TOOLS = ("scaletrain", "recipe", "llm-analysis")
"""scaletrain's default recipe, scaletrain with the row's framework recipe, the peer."""
WORST = 6
"""Rows listed per metric under 'biggest misses'."""


def predict(run: PublishedRun, recipe: str = "scaletrain") -> Prediction:
    """scaletrain's planner on `run` under `recipe`: (memory GiB of the kind the row publishes,
    step s, fits). The memory is the worst rank's, or the pipeline rank the source read when it
    says (`measured.pipeline_rank`); fits is the worst rank's. Call only for rows
    `refusals(run, recipe)` accepts."""
    p = plan_input(run, recipe)
    e = estimate(p)
    mem_b = e.memory
    k = run.measured.pipeline_rank
    if k is not None and p.layout.pp > 1:
        mem_b = (
            pipeline_rank_memory(p, k)
            if recipe == "scaletrain"
            else recipe_rank_memory(p, recipe_named(recipe), k)
        )
    mem = published_peak_bytes(mem_b, run.measured.memory_kind)
    return mem / GiB, e.time.step_s, e.memory.fits


def predict_rank_range(run: PublishedRun, recipe: str) -> tuple[float, float] | None:
    """(min, max) over pipeline ranks of a foreign `recipe`'s reserved GiB, for rows whose
    source does not say which GPU it read (memory_kind 'unknown') and whose ranks differ
    (pp > 1); None otherwise. Ranks inside a pipeline stage (dp, tp, cp) hold the same."""
    if (
        recipe == "scaletrain"
        or run.measured.memory_kind != "unknown"
        or run.layout.layout.pp == 1
        or run.measured.pipeline_rank is not None
    ):
        return None
    p = plan_input(run, recipe)
    r = recipe_named(recipe)
    res = [recipe_rank_memory(p, r, k).reserved / GiB for k in range(p.layout.pp)]
    return min(res), max(res)


def _range_err(rng: tuple[float, float], meas: float | None) -> float | None:
    """0 inside [lo, hi], else the relative distance to the nearer end."""
    if meas is None or meas == 0:
        return None
    lo, hi = rng
    return 0.0 if lo <= meas <= hi else ((lo if meas < lo else hi) - meas) / meas


def _peer_terms(run: PublishedRun) -> tuple[dict[str, Any] | None, str]:
    """llm-analysis's summary dict for `run`, or (None, why it is n/a)."""
    try:
        from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
        from llm_analysis.config import (
            GPUConfig,
            ModelConfig,
            ParallelismConfig,
            get_dtype_config_by_name,
        )
    except ImportError:
        return None, "llm-analysis not installed (pip install -e .[bench])"
    R, L, m = run.layout, run.layout.layout, run.model
    if L.cp > 1:
        return None, "no context parallelism"
    if L.pp_virtual > 1:
        return None, "no interleaved pipeline schedule"
    hw = run.hardware()
    if L.tp > hw.gpus_per_node:
        return None, "tensor parallelism beyond one node"
    if run.lora is not None:
        return None, "no LoRA (it trains every parameter)"
    from llm_analysis.logger import logger as peer_logger

    peer_logger.setLevel(logging.ERROR)  # its per-call warnings (efficiency, batch size)
    model = ModelConfig(
        name=run.name,
        num_layers=m.num_layers,
        n_head=m.num_heads,
        hidden_dim=m.dim,
        vocab_size=m.vocab_size,
        max_seq_len=run.seq_len,
        num_key_value_heads=m.num_kv_heads,
        ffn_embed_dim=m.ffn_dim,
        expansion_ratio=m.ffn_dim / m.dim,
    )
    bf16 = hw.flops("bf16") / 1e12
    # its 16-bit path stands for the row's compute precision: an fp8 row's peak is the fp8 one,
    # so the planner's fp8 GEMM rate passed below (above the bf16 peak on an H200) is accepted
    peak = hw.flops(R.precision) / 1e12
    gpu = GPUConfig(
        name=hw.name,
        # llm-analysis reads this 'GB' as GiB (memory_left = mem_per_GPU_in_GB * 1024**3)
        mem_per_GPU_in_GB=hw.memory_bytes / GiB,
        hbm_bandwidth_in_GB_per_sec=hw.memory_bw / 1e9,
        intra_node_bandwidth_in_GB_per_sec=hw.intra_node_bw / 1e9,
        intra_node_min_message_latency=hw.intra_node_latency_s,
        peak_fp16_TFLOPS=peak,
        peak_i8_TFLOPS=2 * bf16,
        peak_i4_TFLOPS=4 * bf16,
        inter_node_bandwidth_in_GB_per_sec=hw.inter_node_bw / 1e9,
    )
    # same rate assumption as the planner: its default efficiency of the row's precision peak
    eff = default_efficiency(R.precision, m.dim, hw)
    achieved = eff * hw.flops(R.precision) / 1e12
    par = ParallelismConfig(tp_size=L.tp, pp_size=L.pp, dp_size=L.dp, sp_size=L.tp if L.sp else 1)
    ac = {"none": 0, "selective": 1, "full": 2}[R.ac]
    try:
        a = LLMAnalysis(
            model, gpu, get_dtype_config_by_name("w16a16e16"), par, achieved_tflops=achieved
        )
        out = a.training(
            batch_size_per_gpu=R.micro_batch,
            gradient_accumulation_steps=R.global_batch // (R.micro_batch * L.dp),
            global_batch_size=R.global_batch,
            seq_len=run.seq_len,
            activation_recomputation=ActivationRecomputation(ac),
            ds_zero=DSZeRO(L.zero),
            mlp_gated_linear_units=m.activation == "swiglu",
        )
    except (AssertionError, ValueError, ZeroDivisionError) as e:
        return None, f"llm-analysis refused: {str(e).splitlines()[0][:120]}"
    return out, ""


def predict_llm_analysis(run: PublishedRun) -> tuple[Prediction | None, str]:
    """llm-analysis on `run`: ((memory GiB, step s, fits), '') or (None, why n/a)."""
    out, why = _peer_terms(run)
    if out is None:
        return None, why
    mem = float(out["(weight+op_state+grad+act)_memory_per_gpu"]) / GiB
    return (mem, float(out["latency_per_iter"]), float(out["memory_left_per_gpu"]) >= 0), ""


def _rel(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas == 0:
        return None
    return (pred - meas) / meas


def _errors(p: Prediction, run: PublishedRun) -> dict[str, Any]:
    mem, step, fits = p
    oom = run.measured.oom
    return {
        "memory_gib": mem,
        "step_s": step,
        "fits": fits,
        "err_memory": _rel(mem, run.measured.memory_gib),
        "err_step": _rel(step, run.measured_step_s()),
        "fit_correct": None if oom is None else fits == (not oom),
    }


def _breakdown(run: PublishedRun) -> dict[str, float]:
    """The planner's terms for `run`, and two diagnostics of its misses: `logits` = the GiB
    an unfused loss keeps beyond the planner's fused one (16-bit logits and fp32 log-softmax of
    one micro-batch, memory.head_activation_bytes), and the MFU the measured step implies with
    the planner's own FLOP count and peak (`mfu_measured`) next to the planner's `mfu`."""
    p = plan_input(run)
    e = estimate(p)
    mb, t, L = e.memory, e.time, p.layout
    logits = sum(
        sign
        * head_activation_bytes(
            p.model,
            MicroBatchShape(
                seq_len=p.seq_len,
                micro_batch=p.micro_batch,
                tp=L.tp,
                sp=L.sp,
                cp=L.cp,
                precision=p.precision,
            ),
            fused=fused,
        )
        for sign, fused in ((1.0, False), (-1.0, True))
    )
    meas = run.measured_step_s()
    tokens = float(p.global_batch) * p.seq_len
    peak = p.hardware.flops(p.precision) * p.num_gpus
    return {
        "logits": logits / GiB,
        "mfu": e.mfu,
        "mfu_measured": e.flops_per_token * tokens / meas / peak if meas else 0.0,
        "params": mb.params / GiB,
        "grads": mb.grads / GiB,
        "optimizer": mb.optimizer / GiB,
        "activations": mb.activations / GiB,
        "buffers": mb.buffers / GiB,
        "total": mb.total / GiB,
        "reserved": mb.reserved / GiB,
        "compute_s": t.compute_s,
        "bubble_s": t.bubble_s,
        "comm_exposed_s": t.comm_exposed_s,
        "optimizer_s": t.optimizer_s,
        "step_s": t.step_s,
        "buffer_terms": {k: v / GiB for k, v in mb.buffer_terms.items()},
    }


def cause(r: dict[str, Any], key: str) -> str:
    """Which planner term explains most of a miss, from the row's own numbers: under-predicted
    memory that a materialized-logits loss would cover; over-predicted memory dominated by one
    buffer term or by activations; an over-predicted step dominated by exposed communication or
    the pipeline bubble; an under-predicted step whose measured MFU is far below the planner's
    (its efficiency constant)."""
    s = r["scaletrain"]
    t, err = s["terms"], s[key]
    if key == "err_memory":
        gap = s["memory_gib"] - r["measured"]["memory_gib"]
        if gap < 0 and t["logits"] >= -gap / 4:
            return (
                f"loss: an unfused loss keeps {t['logits']:.1f} GiB of logits the planner's "
                f"fused loss does not ({-t['logits'] / gap:.0%} of the {-gap:.1f} GiB gap)"
            )
        big = max(t["buffer_terms"].items(), key=lambda kv: kv[1], default=("", 0.0))
        if gap > 0 and big[1] >= gap / 2:
            return f"buffer term {big[0]} ({big[1]:.1f} GiB) over-predicted"
        if gap > 0 and t["activations"] >= gap / 2:
            return f"activations ({t['activations']:.1f} GiB) over-predicted"
        return (
            "states/activations under-predicted (allocator, framework buffers)"
            if gap < 0
            else "model states over-predicted"
        )
    if err > 0 and t["comm_exposed_s"] >= t["step_s"] / 3:
        return f"exposed communication {t['comm_exposed_s']:.1f} s over-predicted"
    if err > 0 and t["bubble_s"] >= t["step_s"] / 3:
        return f"pipeline bubble {t['bubble_s']:.1f} s over-predicted"
    if err < 0 and t["mfu_measured"] < 0.7 * t["mfu"]:
        return (
            f"efficiency: measured MFU {_pct(t['mfu_measured'])} vs the planner's "
            f"{_pct(t['mfu'])} (compute {t['compute_s']:.1f} s under-predicted)"
        )
    return "compute efficiency constant (default_efficiency)"


def evaluate(
    runs: Iterable[PublishedRun],
    *,
    peer: bool = True,
    scaletrain: Callable[[PublishedRun], Prediction] = predict,
) -> list[dict[str, Any]]:
    """One result row per run: the measurement, each tool's prediction and its errors. The
    errors come from `scaletrain` (default `predict`); the `terms` shown beside the misses are
    the default planner's breakdown (`_breakdown`)."""
    rows = []
    for run in runs:
        m = run.measured
        row: dict[str, Any] = {
            "name": run.name,
            "framework": run.framework,
            "gpu": run.gpu,
            "num_gpus": run.num_gpus,
            "layout": run.layout.layout.label(),
            "source": run.source,
            "added_after": run.added_after,
            "tuned_after": run.tuned_after,
            "held_out": run.held_out,
            "measured": {
                "memory_gib": m.memory_gib,
                "memory_kind": m.memory_kind,
                "step_s": run.measured_step_s(),
                "oom": m.oom,
            },
        }
        why = refusals(run)
        if why:
            row["scaletrain"] = {"refused": why}
        else:
            row["scaletrain"] = _errors(scaletrain(run), run)
            row["scaletrain"]["terms"] = _breakdown(run)
        rec = recipe_of(run)
        why = refusals(run, rec)
        row["recipe"] = {"refused": why} if why else _errors(predict(run, rec), run)
        row["recipe"]["name"] = rec
        rng = None if why else predict_rank_range(run, rec)
        if rng is not None:
            row["recipe"]["memory_range_gib"] = list(rng)
            row["recipe"]["err_memory_range"] = _range_err(rng, m.memory_gib)
        if peer:
            p, reason = predict_llm_analysis(run)
            row["llm-analysis"] = _errors(p, run) if p is not None else {"na": reason}
        else:
            row["llm-analysis"] = {"na": "not run (--no-peer)"}
        rows.append(row)
    return rows


def _stats(errs: list[float]) -> dict[str, Any]:
    a = [abs(e) for e in errs]
    return {
        "n": len(a),
        "median": statistics.median(a) if a else None,
        "max": max(a) if a else None,
        "over": sum(e > 0 for e in errs),
        "under": sum(e < 0 for e in errs),
    }


def _tool_summary(rows: list[dict[str, Any]], tool: str) -> dict[str, Any]:
    preds = [r[tool] for r in rows if "err_memory" in r[tool]]
    fit = [p["fit_correct"] for p in preds if p["fit_correct"] is not None]
    ooms = [(r, r[tool]) for r in rows if r["measured"]["oom"] is True and "fits" in r[tool]]
    return {
        "rows": len(rows),
        "predicted": len(preds),
        "refused": sum("refused" in r[tool] for r in rows),
        "na": sum("na" in r[tool] for r in rows),
        "memory": _stats([p["err_memory"] for p in preds if p["err_memory"] is not None]),
        "memory_range": _stats(
            [
                p.get("err_memory_range", p["err_memory"])
                for p in preds
                if p["err_memory"] is not None
            ]
        ),
        "step": _stats([p["err_step"] for p in preds if p["err_step"] is not None]),
        "fit": {
            "n": len(fit),
            "correct": sum(fit),
            "accuracy": sum(fit) / len(fit) if fit else None,
            "oom_rows": len(ooms),
            "oom_caught": sum(not p["fits"] for _, p in ooms),
        },
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{tool: {'all' | 'common' | framework: counts, memory/step error stats, fit accuracy}};
    'common' = the rows both tools predict (neither refused nor n/a)."""
    frameworks = sorted({r["framework"] for r in rows})
    common = [r for r in rows if all("err_memory" in r[t] for t in TOOLS)]
    tuned = [r for r in rows if not r.get("held_out")]
    added = [r for r in rows if r.get("held_out")]
    return {
        tool: {
            "all": _tool_summary(rows, tool),
            "common": _tool_summary(common, tool),
            "tuned": _tool_summary(tuned, tool),
            "added": _tool_summary(added, tool),
            **{
                f: _tool_summary([r for r in rows if r["framework"] == f], tool) for f in frameworks
            },
        }
        for tool in TOOLS
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _medmax(s: dict[str, Any]) -> str:
    return "n/a" if not s["n"] else f"{_pct(s['median'])} / {_pct(s['max'])} (n={s['n']})"


def _fit(s: dict[str, Any]) -> str:
    f = s["fit"]
    if not f["n"]:
        return "n/a"
    out = f"{_pct(f['accuracy'])} ({f['correct']}/{f['n']})"
    return out + (f", OOM caught {f['oom_caught']}/{f['oom_rows']}" if f["oom_rows"] else "")


def summary_table(summary: dict[str, Any]) -> str:
    """Markdown table: per framework and overall, the three predictors side by side
    (scaletrain's default recipe / the row's framework recipe / llm-analysis)."""
    split = ("tuned", "added") if summary["scaletrain"]["added"]["rows"] else ()
    keys = [
        "all",
        "common",
        *split,
        *sorted(k for k in summary["scaletrain"] if k not in ("all", "common", "tuned", "added")),
    ]
    head = (
        "| framework | runs | memory err median / max: default / framework recipe / "
        "llm-analysis | step err median / max: default / recipe / llm-analysis "
        "| fit/OOM right: default / recipe / llm-analysis | refused (default / recipe) "
        "/ n/a |\n|" + "---|" * 6
    )
    lines = [head]
    for k in keys:
        s, r, p = (summary[t][k] for t in TOOLS)
        label = {
            "all": "**overall**",
            "common": "*rows all predict*",
            "tuned": "*rows the model was tuned on (with tuned_after rows)*",
            "added": "*rows held out (added_after, no tuned_after)*",
        }.get(k, k)
        lines.append(
            f"| {label} | {s['rows']} "
            f"| {' / '.join(_medmax(x['memory']) for x in (s, r, p))} "
            f"| {' / '.join(_medmax(x['step']) for x in (s, r, p))} "
            f"| {' / '.join(_fit(x) for x in (s, r, p))} "
            f"| {s['refused']} / {r['refused']} / {p['na']} |"
        )
    return "\n".join(lines)


def split_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: the framework recipe per framework, rows the model was tuned on and rows
    held out (added after it, `added_after`, and not read by a change since, no
    `tuned_after`) apart, so that a fit to the corpus shows as a gap."""
    lines = [
        "| framework | rows tuned on: runs, memory median / max, step median / max, fit "
        "| rows held out: runs, memory, step, fit |",
        "|---|---|---|",
    ]
    for fw in sorted({r["framework"] for r in rows}):
        cells = []
        for added in (False, True):
            part = [r for r in rows if r["framework"] == fw and bool(r.get("held_out")) == added]
            if not part:
                cells.append("-")
                continue
            t = _tool_summary(part, "recipe")
            cells.append(f"{t['rows']}: {_medmax(t['memory'])}; {_medmax(t['step'])}; {_fit(t)}")
        lines.append(f"| {fw} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def range_line(summary: dict[str, Any]) -> str:
    """The framework recipes' memory error with unstated-rank rows held against the per-rank
    range, overall and per framework, beside the worst-rank figure."""
    rec = summary["recipe"]
    keys = ["all", *sorted(k for k in rec if k not in ("all", "common", "tuned", "added"))]
    parts = [
        f"{'overall' if k == 'all' else k} {_medmax(rec[k]['memory_range'])} "
        f"(worst rank: {_medmax(rec[k]['memory'])})"
        for k in keys
        if rec[k]["memory_range"]["n"]
    ]
    return (
        "Framework recipes, memory median / max with the rows of unstated rank against "
        "the per-rank range: " + "; ".join(parts) + "."
    )


_MEM_HEAD = (
    "| run | layout | measured | predicted | error | planner terms "
    "| unfused-loss logits | cause |\n|" + "---|" * 8
)
_STEP_HEAD = (
    "| run | layout | measured | predicted | error | planner terms "
    "| MFU measured / planner | cause |\n|" + "---|" * 8
)


def _miss_line(r: dict[str, Any], key: str) -> str:
    s, t = r["scaletrain"], r["scaletrain"]["terms"]
    meas = r["measured"]
    if key == "err_memory":
        terms = ", ".join(
            f"{k} {t[k]:.1f}" for k in ("params", "grads", "optimizer", "activations", "buffers")
        )
        return (
            f"| {r['name']} | {r['layout']} | {meas['memory_gib']:.1f} "
            f"({meas['memory_kind']}) | {s['memory_gib']:.1f} | {_pct(s[key])} "
            f"| {terms} | {t['logits']:.1f} | {cause(r, key)} |"
        )
    terms = ", ".join(
        f"{k.removesuffix('_s')} {t[k]:.2f}"
        for k in ("compute_s", "bubble_s", "comm_exposed_s", "optimizer_s")
    )
    return (
        f"| {r['name']} | {r['layout']} | {meas['step_s']:.2f} | {s['step_s']:.2f} "
        f"| {_pct(s[key])} | {terms} | {_pct(t['mfu_measured'])} / {_pct(t['mfu'])} "
        f"| {cause(r, key)} |"
    )


def _states(r: dict[str, Any]) -> str:
    t = r["scaletrain"]["terms"]
    big = max(t["buffer_terms"].items(), key=lambda kv: kv[1], default=("-", 0.0))
    return (
        f"reserved {t['reserved']:.0f} GiB on {r['gpu']}: params {t['params']:.0f}, grads "
        f"{t['grads']:.0f}, optimizer {t['optimizer']:.0f}, activations "
        f"{t['activations']:.0f}, buffers {t['buffers']:.0f} (largest {big[0]} "
        f"{big[1]:.0f})"
    )


def worst(rows: list[dict[str, Any]], key: str, n: int = WORST) -> list[dict[str, Any]]:
    have = [r for r in rows if r["scaletrain"].get(key) is not None]
    return sorted(have, key=lambda r: -abs(r["scaletrain"][key]))[:n]


def _recipe_memory_section(rows: list[dict[str, Any]]) -> list[str]:
    """Each row's memory error under its framework recipe, largest first, and every fit/OOM
    call the recipe gets wrong (with its reserved prediction against the card)."""
    have = sorted(
        (r for r in rows if r["recipe"].get("err_memory") is not None),
        key=lambda r: -abs(r["recipe"]["err_memory"]),
    )
    out = [
        "",
        "## Framework recipes: memory per run and wrong fit/OOM calls",
        "",
        "| run | recipe | layout | measured GiB (kind) | predicted GiB (worst rank) | error "
        "| range over pipeline ranks (rank read unstated) | error vs range |",
        "|" + "---|" * 8,
    ]
    for r in have:
        m, p = r["measured"], r["recipe"]
        rng = p.get("memory_range_gib")
        rs = "-" if rng is None else f"{rng[0]:.1f} .. {rng[1]:.1f}"
        re_ = "-" if rng is None else _pct(p["err_memory_range"])
        out.append(
            f"| {r['name']} | {p['name']} | {r['layout']} | {m['memory_gib']:.1f} "
            f"({m['memory_kind']}) | {p['memory_gib']:.1f} | {_pct(p['err_memory'])} "
            f"| {rs} | {re_} |"
        )
    wrong = [r for r in rows if r["recipe"].get("fit_correct") is False]
    out += ["", f"Fit/OOM called wrong by the framework recipes ({len(wrong)}):", ""]
    out += [
        f"- {r['name']} ({r['recipe']['name']}, {r['gpu']}): predicted "
        f"{r['recipe']['memory_gib']:.1f} GiB, {'fits' if r['recipe']['fits'] else 'OOM'}; "
        f"published {'OOM' if r['measured']['oom'] else 'ran'}"
        for r in wrong
    ] or ["- none"]
    return out


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    out = [
        "# Planner vs published runs",
        "",
        "Relative error = (predicted - measured) / measured; median and max of its absolute "
        "value. Memory: the planner's reserved bytes against a published reservation "
        "(torchtitan) or a peak of unstated kind (BigScience), its allocated peak against an "
        "allocated one; step time: seconds per "
        "optimizer step. Fit/OOM: the row ran (it published a throughput) or stated an OOM. "
        "Refused: layouts the planner rejects; n/a: layouts llm-analysis cannot express. "
        "The framework-recipe column compares the worst pipeline rank; a source that does "
        "not say which GPU it read (BigScience's pipeline rows) is also compared against "
        "the recipe's range over pipeline ranks (error 0 inside it), reported below the "
        "table, never in place of the worst-rank figure.",
        "",
        summary_table(summary),
        "",
        range_line(summary),
        "",
        "Framework recipes per framework, rows tuned on and rows held out (added after the "
        "model, no tuned_after):",
        "",
        split_table(rows),
        "",
    ]
    s = summary["scaletrain"]["all"]
    out += [
        f"Over-predictions / under-predictions (scaletrain): memory {s['memory']['over']} / "
        f"{s['memory']['under']}, step {s['step']['over']} / {s['step']['under']}.",
        "",
    ]
    out += [
        "## Biggest misses (scaletrain)",
        "",
        "Memory (GiB; the planner's terms at the peak; 'unfused-loss logits' = what a "
        "framework that materializes the logits keeps beyond the planner's fused loss):",
        "",
        _MEM_HEAD,
    ]
    out += [_miss_line(r, "err_memory") for r in worst(rows, "err_memory")]
    out += [
        "",
        "Step time (s; the planner's terms; MFU from the planner's FLOP count and the "
        "preset's peak):",
        "",
        _STEP_HEAD,
    ]
    out += [_miss_line(r, "err_step") for r in worst(rows, "err_step")]
    wrong = [r for r in rows if r["scaletrain"].get("fit_correct") is False]
    out += ["", f"Fit/OOM called wrong by scaletrain ({len(wrong)}):", ""]
    out += [f"- {r['name']}: {_states(r)}" for r in wrong] or ["- none"]
    refused = [r for r in rows if "refused" in r["scaletrain"]]
    if refused:
        out += [
            "",
            "Refused by scaletrain: "
            + "; ".join(f"{r['name']} ({r['scaletrain']['refused'][0]})" for r in refused),
        ]
    out += _recipe_memory_section(rows)
    out += [
        "",
        "## All runs",
        "",
        "| run | framework | gpu | layout | mem meas | mem sc | mem peer | step meas "
        "| step sc | step peer | oom | fits sc | fits peer |",
        "|" + "---|" * 13,
    ]

    def g(d: dict[str, Any], k: str, fmt: str) -> str:
        v = d.get(k)
        return "-" if v is None else format(v, fmt)

    for r in rows:
        m, sc, pe = r["measured"], r["scaletrain"], r["llm-analysis"]
        out.append(
            f"| {r['name']} | {r['framework']} | {r['gpu']} | {r['layout']} "
            f"| {g(m, 'memory_gib', '.1f')} | {g(sc, 'memory_gib', '.1f')} "
            f"| {g(pe, 'memory_gib', '.1f')} | {g(m, 'step_s', '.2f')} "
            f"| {g(sc, 'step_s', '.2f')} | {g(pe, 'step_s', '.2f')} | {g(m, 'oom', '')} "
            f"| {'refused' if 'refused' in sc else g(sc, 'fits', '')} "
            f"| {'n/a' if 'na' in pe else g(pe, 'fits', '')} |"
        )
    return "\n".join(out)


def _peer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_analysis") is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-peer", action="store_true", help="skip llm-analysis")
    ap.add_argument("--framework", help="only this framework's rows")
    ap.add_argument("--corpus", help="another corpus file (default: the packaged one)")
    args = ap.parse_args(argv)
    runs = load_runs(args.corpus)
    if args.framework:
        runs = [r for r in runs if r.framework == args.framework]
    rows = evaluate(runs, peer=not args.no_peer)
    summary = summarize(rows)
    md = markdown(rows, summary)
    print(summary_table(summary))
    missing = (
        "llm-analysis skipped (--no-peer)"
        if args.no_peer
        else ("" if _peer_installed() else "llm-analysis is not installed")
    )
    if args.framework or args.corpus:
        missing = missing or "a subset or another corpus"
    write_results("planner_vs_published", {"summary": summary, "rows": rows}, md, missing=missing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
