"""Per-rank memory and step time of each parallel strategy for Llama-2 7B on 8 and 64 H100s.

For every strategy (DDP, ZeRO-1, ZeRO-2, ZeRO-3, TP, TP+SP, PP, 3D) at 8 and 64 GPUs
(h100-sxm preset): the planner's worst-rank memory breakdown and predicted step time
(`scaletrain.planner.estimate`), and the dry-run's measured rank-0 memory
(`scaletrain.dryrun.dryrun`: the trainer's own step under fake tensors and a fake
process group). This is seed 003's "7B model, 8 GPUs" ZeRO table, measured instead of argued.

Batch: sequence 4096, micro-batch 1, global batch 256 sequences (1M tokens), bf16 mixed
precision with fp32 master weights, AdamW, no activation checkpointing. The dry-run runs 2
micro-batches per step (`DRYRUN_MICROBATCHES`), enough to reach the accumulated-gradient state.

Not measured, said so in the table: pipeline layouts (PP, 3D) — the dry-run does not drive
pipeline schedules yet (it raises ConfigError; planner only). At 64 GPUs, DDP, TP and TP+SP run
the very same per-rank program as at 8 GPUs (only the data-parallel group is larger, and DDP's
buckets do not depend on it), so their 8-GPU measurement is reused, and labelled so.

Each full-depth 7B dry-run takes ~1-3 min on this 2-core host, so they run two at a time and
stop at a time budget (`--budget-s`, default 540 s); anything unfinished is reported as
"not measured (time budget)".

    python benchmarks/strategies.py [--seq-len 4096] [--budget-s 540] [--workers 2]
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write_results  # noqa: E402

GB = 1e9
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")
MODEL, GPU = "llama2-7b", "h100-sxm"

STRATEGIES: dict[str, dict[int, dict[str, Any]]] = {
    # name -> gpus -> parallel overrides
    "DDP": {8: {"dp": 8}, 64: {"dp": 64}},
    "ZeRO-1": {8: {"dp": 8, "zero": 1}, 64: {"dp": 64, "zero": 1}},
    "ZeRO-2": {8: {"dp": 8, "zero": 2}, 64: {"dp": 64, "zero": 2}},
    "ZeRO-3": {8: {"dp": 8, "zero": 3}, 64: {"dp": 64, "zero": 3}},
    "TP": {8: {"dp": 1, "tp": 8}, 64: {"dp": 8, "tp": 8}},
    "TP+SP": {8: {"dp": 1, "tp": 8, "sp": True}, 64: {"dp": 8, "tp": 8, "sp": True}},
    "PP": {8: {"dp": 1, "pp": 8}, 64: {"dp": 8, "pp": 8}},
    "3D": {
        8: {"dp": 2, "zero": 1, "tp": 2, "sp": True, "pp": 2},
        64: {"dp": 2, "zero": 1, "tp": 8, "sp": True, "pp": 4},
    },
}
SAME_AS_8 = {"DDP", "TP", "TP+SP"}
"""At 64 GPUs these run the 8-GPU per-rank program (module docstring): measured once."""


def job_for(parallel: dict[str, Any], *, seq_len: int, global_batch: int):
    from scaletrain.config import load_config

    over = {
        "model": {"name": MODEL},
        "hardware": {"gpu": GPU},
        "precision": {"dtype": "bf16"},
        "batch": {"seq_len": seq_len, "micro_batch": 1, "global_batch": global_batch},
        "parallel": {"layout": "manual", **parallel},
    }
    return load_config(None, over)


def layout_label(p: dict[str, Any]) -> str:
    parts = [f"dp{p.get('dp', 1)}"]
    if p.get("zero"):
        parts.append(f"z{p['zero']}")
    for k in ("tp", "pp"):
        if p.get(k, 1) > 1:
            parts.append(f"{k}{p[k]}")
    if p.get("sp"):
        parts.append("sp")
    return "·".join(parts)


def measure_one(
    parallel: dict[str, Any], gpus: int, seq_len: int, global_batch: int
) -> dict[str, Any]:
    """Dry-run rank 0 (in a worker process); returns the memory breakdown in bytes."""
    import torch

    from scaletrain.dryrun import dryrun

    torch.set_num_threads(1)
    job = job_for(parallel, seq_len=seq_len, global_batch=global_batch)
    m = dryrun(job, world_size=gpus, rank=0, count_flops=False)
    mem = m.memory
    return {
        **{c: float(getattr(mem, c)) for c in CATEGORIES},
        "total": float(mem.total),
        "buffer_terms": dict(mem.buffer_terms),
        "wall_s": m.wall_s,
    }


def predict(parallel: dict[str, Any], gpus: int, seq_len: int, global_batch: int) -> dict[str, Any]:
    from scaletrain.measure.verify import predict as planner_predict

    job = job_for(parallel, seq_len=seq_len, global_batch=global_batch)
    est = planner_predict(job, job.layout(gpus))
    mem = est.memory
    return {
        **{c: float(getattr(mem, c)) for c in CATEGORIES},
        "total": float(mem.total),
        "reserved": float(mem.reserved),
        "capacity": float(mem.capacity),
        "fits": bool(mem.fits),
        "rank": int(mem.rank),
        "step_s": est.time.step_s,
        "compute_s": est.time.compute_s,
        "comm_exposed_s": est.time.comm_exposed_s,
        "bubble_s": est.time.bubble_s,
        "tokens_per_s": est.tokens_per_s,
        "mfu": est.mfu,
    }


def run_dryruns(
    todo: list[tuple[str, int]], *, seq_len: int, global_batch: int, budget_s: float, workers: int
) -> dict[tuple[str, int], dict[str, Any]]:
    fn = importlib.import_module(Path(__file__).stem).measure_one  # picklable by module name
    out: dict[tuple[str, int], dict[str, Any]] = {}
    t0 = time.perf_counter()
    pool = mp.get_context("spawn").Pool(workers, maxtasksperchild=1)
    try:
        pending = {
            key: pool.apply_async(fn, (STRATEGIES[key[0]][key[1]], key[1], seq_len, global_batch))
            for key in todo
        }
        for key, res in pending.items():
            left = budget_s - (time.perf_counter() - t0)
            try:
                out[key] = res.get(timeout=max(left, 0.01))
                print(
                    f"dry-run {key[0]:7s} {key[1]:3d} GPUs: total "
                    f"{out[key]['total'] / GB:6.1f} GB ({out[key]['wall_s']:.0f} s)",
                    flush=True,
                )
            except mp.TimeoutError:
                out[key] = {"error": "not measured (time budget)"}
            except Exception as e:  # noqa: BLE001 - a strategy the dry-run rejects is reported
                out[key] = {
                    "error": f"not measured ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
                }
    finally:
        pool.terminate()
        pool.join()
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from _plots import plt, save, stacked_bars

    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, gpus in zip(axes, (8, 64), strict=True):
        rs = [r for r in rows if r["gpus"] == gpus]
        labels, parts = [], {c: [] for c in CATEGORIES}
        for r in rs:
            for src, tag in (("planned", "plan"), ("measured", "dry-run")):
                d = r.get(src) or {}
                labels.append(f"{r['strategy']} {tag}")
                for c in CATEGORIES:
                    parts[c].append(d.get(c, 0.0) / GB)
        stacked_bars(
            ax,
            labels,
            parts,
            ylabel="GB per GPU (rank 0 / worst rank)",
            capacity=rs[0]["planned"]["capacity"] / GB,
        )
        ax.set_title(f"{MODEL} on {gpus} x {GPU}: planner vs dry-run", fontsize=10)
        ax.tick_params(axis="x", labelsize=7)
        for lbl in ax.get_xticklabels():
            lbl.set_horizontalalignment("right")
    save(fig, path)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# Parallel strategies: {MODEL} on 8 and 64 x {GPU}",
        "",
        f"seq {meta['seq_len']}, micro-batch 1, global batch {meta['global_batch']} "
        "sequences, bf16 + fp32 master weights, AdamW, no activation checkpointing. "
        "Memory in GB (1e9 B) per GPU: *plan* = the planner's worst rank, *dry-run* = "
        "rank 0 measured under fake tensors (2 micro-batches of the trainer's real step).",
        "",
        "| strategy | GPUs | layout | plan params | grads | optim | activ. | buffers | "
        "plan total | dry-run total | plan/dry-run | step s (plan) | tokens/s (plan) | "
        "MFU (plan) | fits 80 GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, d = r["planned"], r.get("measured") or {}
        meas = (
            f"{d['total'] / GB:.1f}" + (" (= 8 GPUs)" if r.get("reused") else "")
            if "total" in d
            else d.get("error", "-")
        )
        ratio = f"{p['total'] / d['total']:.2f}" if "total" in d else "-"
        lines.append(
            f"| {r['strategy']} | {r['gpus']} | {r['layout']} | {p['params'] / GB:.1f} | "
            f"{p['grads'] / GB:.1f} | {p['optimizer'] / GB:.1f} | {p['activations'] / GB:.1f} | "
            f"{p['buffers'] / GB:.1f} | {p['total'] / GB:.1f} | {meas} | {ratio} | "
            f"{p['step_s']:.2f} | {p['tokens_per_s']:,.0f} | {100 * p['mfu']:.1f}% | "
            f"{'yes' if p['fits'] else 'no'} |"
        )
    lines += [
        "",
        "Seed 003's table (7B, 8 GPUs, fp16) counts weights 14 GB / gradients 14 GB / "
        "optimizer 84 GB for DDP and 1.75 GB shards for ZeRO; it ignores activations and "
        "buffers and uses 12 B/param of optimizer state. scaletrain's trainer keeps fp32 "
        "master parameters and fp32 gradients (16 B/param of states before sharding), "
        "which is what both columns above count.",
        "",
        "Dry-run breakdown per category (GB) where measured:",
        "",
        "| strategy | GPUs | params | grads | optim | activ. | buffers | dry-run s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r.get("measured") or {}
        if "total" in d:
            lines.append(
                f"| {r['strategy']} | {r['gpus']} | "
                + " | ".join(f"{d[c] / GB:.1f}" for c in CATEGORIES)
                + f" | {d['wall_s']:.0f} |"
            )
    lines += [
        "",
        f"This file: `python benchmarks/strategies.py --budget-s {meta['budget_s']:g}`, "
        f"{meta['workers']} dry-runs at a time, {meta['wall_s']:.0f} s wall in all, host "
        f"load average at start {meta['loadavg']}.",
        "",
    ]
    lines += [
        "Not measured: PP and 3D (the dry-run does not drive pipeline schedules yet); "
        "DDP, TP and TP+SP at 64 GPUs reuse the 8-GPU measurement (same per-rank "
        "program). Step time, tokens/s and MFU are planner predictions only (no H100 "
        "here); `benchmarks/gpu.py` measures a single GPU.",
        "",
        "![memory per strategy](strategies.png)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--budget-s", type=float, default=540.0, help="dry-run time budget")
    ap.add_argument("--workers", type=int, default=2, help="dry-runs in parallel")
    ap.add_argument("--gpus", default="8,64")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--no-dryrun", action="store_true", help="planner only")
    ap.add_argument("--no-write", action="store_true", help="print only (smoke tests)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    loadavg = tuple(round(x, 2) for x in os.getloadavg())
    gpus_list = [int(g) for g in args.gpus.split(",")]
    names = args.strategies.split(",")
    keys = [(s, g) for g in gpus_list for s in names]
    rows = []
    for s, g in keys:
        par = STRATEGIES[s][g]
        rows.append(
            {
                "strategy": s,
                "gpus": g,
                "layout": layout_label(par),
                "parallel": par,
                "planned": predict(par, g, args.seq_len, args.global_batch),
            }
        )
        p = rows[-1]["planned"]
        print(
            f"plan    {s:7s} {g:3d} GPUs {rows[-1]['layout']:18s} total "
            f"{p['total'] / GB:6.1f} GB  step {p['step_s']:.2f} s  MFU {100 * p['mfu']:.1f}%"
        )
    todo = [
        (s, g)
        for s, g in keys
        if "pp" not in STRATEGIES[s][g] and not (g != 8 and s in SAME_AS_8 and 8 in gpus_list)
    ]
    # the seed-003 comparison first: 8-GPU data-parallel strategies, then TP, then 64 GPUs
    todo.sort(key=lambda k: (k[1], k[0] not in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")))
    measured = (
        {}
        if args.no_dryrun
        else run_dryruns(
            todo,
            seq_len=args.seq_len,
            global_batch=args.global_batch,
            budget_s=args.budget_s,
            workers=args.workers,
        )
    )
    for r in rows:
        key = (r["strategy"], r["gpus"])
        if "pp" in r["parallel"]:
            r["measured"] = {"error": "not measured (dry-run has no PP yet)"}
        elif key in measured:
            r["measured"] = measured[key]
        elif (r["strategy"], 8) in measured:
            r["measured"], r["reused"] = measured[(r["strategy"], 8)], True
    if args.no_write:
        return 0
    meta = {
        "model": MODEL,
        "gpu": GPU,
        "seq_len": args.seq_len,
        "global_batch": args.global_batch,
        "budget_s": args.budget_s,
        "workers": args.workers,
        "loadavg": loadavg,
        "wall_s": time.perf_counter() - t_start,
    }
    plot(rows, RESULTS / "strategies.png")
    write_results("strategies", {"meta": meta, "rows": rows}, markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
