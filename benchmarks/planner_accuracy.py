"""Planner vs dry-run accuracy: the analytic memory estimate held against a fake-tensor dry-run.

For every layout in CASES, `scaletrain.planner.estimate` (analytic, torch-free) predicts one
rank's memory and `scaletrain.measure.dryrun.dryrun` measures it by running the trainer's real
build and two optimizer steps under FakeTensorMode on a fake process group. Compared:
- total (the peak; the planner's CUDA runtime-context term is subtracted: a dry-run cannot see
  it), and the per-category numbers (the tracker's attribution AT the peak);
- the at-rest model states (`detail['state.params'|'state.grads'|'state.optimizer']`) against
  the planner's states without their in-flight copies.
Relative error = (predicted - measured) / measured. Models keep their real widths but few
layers so that each dry-run takes seconds on a CPU (the dry-run's cost grows with op count).

Run: python benchmarks/planner_accuracy.py [--quick] [--limit N]
Writes results/planner_accuracy.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from scaletrain.config import (  # noqa: E402
    BatchConfig,
    HardwareConfig,
    JobConfig,
    MemoryConfig,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    resolve_model,
)


def model(name: str, layers: int | None = None, **over: Any) -> ModelConfig:
    """Preset `name` with `layers` blocks (real widths, fewer layers: a fast dry-run)."""
    m = resolve_model(name)
    if layers is not None:
        over["num_layers"] = layers
        over["name"] = f"{name}-L{layers}"
    return dataclasses.replace(m, **over) if over else m


def _models() -> dict[str, ModelConfig]:
    llama_s = dict(vocab_size=32000, dim=1024, num_heads=16, num_kv_heads=4, ffn_dim=2816,
                   max_seq_len=4096, name="llama-1024-L4")
    return {
        "tiny": model("tiny"),
        "tiny-llama": model("tiny-llama"),
        "gpt-mini": model("gpt-mini"),
        "gpt2-124m-L2": model("gpt2-124m", 2),
        "gpt2-124m-L4": model("gpt2-124m", 4),
        "gpt2-350m-L2": model("gpt2-350m", 2),
        "llama-1024-L4": model("tiny-llama", 4, **{k: v for k, v in llama_s.items()
                                                    if k != "name"}),
        "llama2-7b-L1": model("llama2-7b", 1),
    }


# (model, world, dp, zero, dp_replicate, tp, sp, cp, ac, dtype, micro_batch, seq, grad_accum)
Case = tuple[str, int, int, int, int, int, bool, int, str, str, int, int, int]

CASES: list[Case] = [
    # tiny models: small-term dominated (bias, norms, DDP buckets)
    ("tiny", 2, 2, 0, 1, 1, False, 1, "none", "fp32", 2, 128, 1),
    ("tiny", 2, 2, 3, 1, 1, False, 1, "none", "bf16", 2, 128, 1),
    ("tiny-llama", 2, 2, 1, 1, 1, False, 1, "none", "bf16", 4, 128, 1),
    ("tiny-llama", 4, 4, 2, 1, 1, False, 1, "selective", "bf16", 2, 128, 2),
    ("tiny-llama", 4, 2, 3, 1, 2, True, 1, "none", "bf16", 2, 128, 1),
    ("gpt-mini", 4, 1, 0, 1, 4, False, 1, "none", "fp32", 2, 128, 1),
    ("gpt-mini", 4, 2, 3, 1, 1, False, 2, "full", "bf16", 2, 128, 1),
    ("gpt-mini", 8, 8, 3, 2, 1, False, 1, "none", "bf16", 1, 128, 1),
    # gpt2-124m widths
    ("gpt2-124m-L2", 2, 2, 0, 1, 1, False, 1, "none", "fp32", 2, 256, 1),
    ("gpt2-124m-L2", 2, 2, 0, 1, 1, False, 1, "none", "bf16", 2, 512, 1),
    ("gpt2-124m-L2", 8, 8, 1, 1, 1, False, 1, "none", "bf16", 4, 256, 1),
    ("gpt2-124m-L2", 8, 8, 2, 1, 1, False, 1, "selective", "bf16", 2, 512, 2),
    ("gpt2-124m-L2", 8, 8, 3, 1, 1, False, 1, "none", "bf16", 2, 512, 1),
    ("gpt2-124m-L2", 8, 8, 3, 1, 1, False, 1, "none", "fp32", 1, 1024, 1),
    ("gpt2-124m-L2", 16, 16, 3, 4, 1, False, 1, "none", "bf16", 2, 256, 1),
    ("gpt2-124m-L2", 4, 4, 3, 1, 1, False, 1, "full", "bf16", 8, 256, 1),
    ("gpt2-124m-L2", 4, 4, 3, 1, 1, False, 1, "selective", "bf16", 4, 1024, 1),
    ("gpt2-124m-L2", 4, 2, 2, 1, 2, False, 1, "none", "bf16", 2, 512, 1),
    ("gpt2-124m-L2", 4, 2, 2, 1, 2, True, 1, "none", "bf16", 2, 512, 1),
    ("gpt2-124m-L2", 8, 2, 3, 1, 4, True, 1, "none", "bf16", 2, 512, 1),
    ("gpt2-124m-L2", 8, 4, 3, 1, 2, False, 1, "selective", "bf16", 2, 512, 1),
    ("gpt2-124m-L2", 8, 4, 3, 1, 1, False, 2, "none", "bf16", 2, 1024, 1),
    ("gpt2-124m-L2", 8, 2, 3, 1, 1, False, 4, "none", "bf16", 1, 2048, 1),
    ("gpt2-124m-L4", 4, 4, 3, 1, 1, False, 1, "none", "bf16", 2, 512, 2),
    ("gpt2-124m-L4", 4, 4, 0, 1, 1, False, 1, "full", "fp32", 2, 256, 1),
    ("gpt2-124m-L4", 64, 64, 3, 1, 1, False, 1, "none", "bf16", 1, 512, 1),
    ("gpt2-124m-L4", 32, 8, 3, 1, 4, True, 1, "none", "bf16", 2, 256, 1),
    # gpt2-350m widths
    ("gpt2-350m-L2", 2, 2, 0, 1, 1, False, 1, "none", "bf16", 2, 512, 1),
    ("gpt2-350m-L2", 8, 8, 3, 1, 1, False, 1, "none", "bf16", 4, 512, 1),
    ("gpt2-350m-L2", 8, 8, 3, 2, 1, False, 1, "selective", "bf16", 2, 1024, 1),
    ("gpt2-350m-L2", 8, 4, 3, 1, 2, True, 1, "full", "bf16", 2, 1024, 1),
    ("gpt2-350m-L2", 16, 4, 3, 1, 4, False, 1, "none", "fp32", 1, 512, 1),
    # llama-style small (RMSNorm, SwiGLU, GQA, RoPE)
    ("llama-1024-L4", 2, 2, 0, 1, 1, False, 1, "none", "bf16", 1, 1024, 1),
    ("llama-1024-L4", 8, 8, 3, 1, 1, False, 1, "none", "bf16", 2, 1024, 1),
    ("llama-1024-L4", 8, 8, 3, 1, 1, False, 1, "selective", "bf16", 4, 512, 1),
    ("llama-1024-L4", 8, 4, 3, 1, 2, True, 1, "none", "bf16", 2, 1024, 1),
    ("llama-1024-L4", 16, 4, 3, 1, 4, True, 1, "full", "bf16", 2, 2048, 1),
    ("llama-1024-L4", 8, 4, 3, 1, 1, False, 2, "none", "bf16", 1, 4096, 1),
    ("llama-1024-L4", 4, 4, 2, 1, 1, False, 1, "none", "fp32", 2, 512, 1),
    ("llama-1024-L4", 4, 2, 2, 1, 2, False, 1, "none", "bf16", 2, 1024, 1),
    # llama2-7b widths, one block, short sequences
    ("llama2-7b-L1", 8, 8, 3, 1, 1, False, 1, "none", "bf16", 1, 512, 1),
    ("llama2-7b-L1", 16, 2, 3, 1, 8, True, 1, "none", "bf16", 2, 1024, 1),
    ("llama2-7b-L1", 8, 4, 3, 1, 2, True, 1, "selective", "bf16", 1, 2048, 1),
]

QUICK = [c for c in CASES if c[0] == "gpt2-124m-L2" and c[12] == 1 and c[11] <= 1024
         and c[7] == 1 and (c[9], c[3]) != ("fp32", 0)] + [CASES[0], CASES[5]]
"""The fast subset (tests/planner/test_accuracy.py): real gpt2-124m widths with 2 blocks across
DDP, ZeRO-1/2/3, HSDP, TP(+SP), fp32/bf16, plus two tiny-model layouts; each dry-run ~1 s."""


def job_for(case: Case) -> tuple[JobConfig, int]:
    name, world, dp, zero, rep, tp, sp, cp, ac, dtype, mb, seq, accum = case
    m = _models()[name]
    if seq > m.max_seq_len:
        m = dataclasses.replace(m, max_seq_len=seq)
    job = JobConfig(model=m, parallel=ParallelConfig(dp=dp, zero=zero, dp_replicate=rep, tp=tp,
                                                     sp=sp, cp=cp, layout="manual"),
                    precision=PrecisionConfig(dtype=dtype), memory=MemoryConfig(ac=ac),
                    batch=BatchConfig(global_batch=mb * dp * accum, micro_batch=mb,
                                      seq_len=seq),
                    hardware=HardwareConfig(gpu="h100-sxm", gpus=world))
    return job, world


def label(case: Case) -> str:
    name, world, dp, zero, rep, tp, sp, cp, ac, dtype, mb, seq, accum = case
    par = f"dp{dp}" + (f"(r{rep})" if rep > 1 else "") + f" z{zero}"
    if tp > 1:
        par += f" tp{tp}" + ("+sp" if sp else "")
    if cp > 1:
        par += f" cp{cp}"
    return f"{name} w{world} {par} ac={ac} {dtype} b{mb}x{accum} s{seq}"


def _rel(pred: float, meas: float) -> float | None:
    return None if meas == 0 else (pred - meas) / meas


def measure_case(case: Case) -> dict[str, Any]:
    """Dry-run `case` and compare with the planner; relative errors by category and state."""
    from scaletrain.measure.dryrun import dryrun
    from scaletrain.planner import estimate
    from scaletrain.planner.types import plan_input_from_job

    job, world = job_for(case)
    layout = job.layout(world)
    t0 = time.perf_counter()
    meas = dryrun(job, world_size=world, count_flops=False).memory
    wall = time.perf_counter() - t0
    est = estimate(plan_input_from_job(job, layout)).memory
    ctx = float(est.buffer_terms.get("runtime_context", 0.0))
    pred = {"params": est.params, "grads": est.grads, "optimizer": est.optimizer,
            "activations": est.activations, "buffers": est.buffers - ctx,
            "total": est.total - ctx,
            "state.params": est.params - est.detail.get("params.in_flight", 0.0),
            "state.grads": est.grads - est.detail.get("grads.in_flight", 0.0),
            "state.optimizer": est.optimizer}
    got = {"params": meas.params, "grads": meas.grads, "optimizer": meas.optimizer,
           "activations": meas.activations, "buffers": meas.buffers, "total": meas.total,
           **{k: meas.detail.get(k, 0.0) for k in ("state.params", "state.grads",
                                                    "state.optimizer")}}
    return {"case": label(case), "layout": list(case), "wall_s": round(wall, 2),
            "predicted": pred, "measured": got,
            "rel_error": {k: _rel(pred[k], got[k]) for k in pred},
            "measured_buffer_terms": dict(meas.buffer_terms),
            "predicted_buffer_terms": dict(est.buffer_terms),
            "predicted_detail": dict(est.detail)}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("total", "state.params", "state.grads", "state.optimizer", "params", "grads",
            "optimizer", "activations", "buffers")
    out: dict[str, Any] = {}
    for k in keys:
        errs = [abs(r["rel_error"][k]) for r in rows if r["rel_error"][k] is not None]
        if errs:
            errs.sort()
            out[k] = {"max_abs": errs[-1], "median_abs": errs[len(errs) // 2], "n": len(errs)}
    out["total_within_3pct"] = sum(1 for r in rows if abs(r["rel_error"]["total"]) <= 0.03)
    out["total_within_10pct"] = sum(1 for r in rows if abs(r["rel_error"]["total"]) <= 0.10)
    out["cases"] = len(rows)
    return out


def load_baseline(path: str) -> dict[str, Any]:
    """A previous run's per-case total errors and summary (the 'before' of a calibration)."""
    import json
    from pathlib import Path

    d = json.loads(Path(path).read_text())
    return {"git_revision": d.get("git_revision"), "summary": d.get("summary"),
            "total": {r["case"]: r["rel_error"]["total"] for r in d.get("cases", [])}}


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any],
             baseline: dict[str, Any] | None = None) -> str:
    lines = ["# Planner vs dry-run memory accuracy", "",
             "Relative error (predicted - measured) / measured, one rank, worst total first. "
             "Totals exclude the planner's CUDA runtime-context term; `peak:` columns are the "
             "tracker's attribution at the peak, `rest:` the at-rest model states.", "",
             f"Cases: {summary['cases']}; |total| <= 3%: {summary['total_within_3pct']}; "
             f"<= 10%: {summary['total_within_10pct']}.", "",
             "| metric | max abs | median abs |", "|---|---|---|"]
    for k, v in summary.items():
        if isinstance(v, dict):
            lines.append(f"| {k} | {100 * v['max_abs']:.1f}% | {100 * v['median_abs']:.1f}% |")
    before = (baseline or {}).get("total", {})
    if baseline:
        b = baseline["summary"]
        lines += ["", f"Before calibration (git {baseline['git_revision']}): cases "
                  f"{b['cases']}; |total| <= 3%: {b['total_within_3pct']}; <= 10%: "
                  f"{b['total_within_10pct']}; median |total| "
                  f"{100 * b['total']['median_abs']:.1f}%, max {100 * b['total']['max_abs']:.1f}%."]
    lines += ["", "| case | meas GB | total | before | rest:params | rest:grads | rest:optim | "
              "peak:acts | peak:buffers | dry-run s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -abs(r["rel_error"]["total"])):
        e = r["rel_error"]
        lines.append(f"| {r['case']} | {r['measured']['total'] / 1e9:.3f} | {_pct(e['total'])} "
                     f"| {_pct(before.get(r['case']))} "
                     f"| {_pct(e['state.params'])} | {_pct(e['state.grads'])} "
                     f"| {_pct(e['state.optimizer'])} | {_pct(e['activations'])} "
                     f"| {_pct(e['buffers'])} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the tiny-model subset")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N cases")
    ap.add_argument("--name", default="planner_accuracy", help="results file stem")
    ap.add_argument("--baseline", help="a previous results JSON to show as 'before'")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if args.limit:
        cases = cases[:args.limit]
    rows = []
    for c in cases:
        try:
            r = measure_case(c)
        except Exception as e:  # noqa: BLE001 - record and go on: one layout must not stop all
            print(f"{label(c)}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(r)
        print(f"{r['case']:<60} total {_pct(r['rel_error']['total']):>8}  "
              f"({r['wall_s']:.1f}s)", flush=True)
    summary = summarize(rows)
    baseline = load_baseline(args.baseline) if args.baseline else None
    md = markdown(rows, summary, baseline)
    write_results(args.name, {"cases": rows, "summary": summary, "baseline": baseline}, md)
    print(md.split("\n\n| case")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
