"""GPT-3 175B on 1,024 A100-80GB: the planner's chosen layout and MFU next to Megatron-LM's.

Published reference (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC'21, Table 1): GPT-3 175B (96 layers, hidden 12288, 96
heads, seq 2048, vocabulary 51200), TP 8 x PP 8 x DP 16 on 1,024 A100s, batch 1536: 140
teraFLOP/s per GPU, 45% of the 312 teraFLOP/s bf16 peak. Their FLOPs (eq. 3) count the
recomputation of full activation checkpointing, 96·B·s·l·h²·(1 + s/6h + V/16lh); model FLOPs
(MFU, the planner's convention) are 72·B·s·l·h²·(1 + s/6h + V/12lh), so their MFU is 140 x
the ratio of the two / 312.

Runs: (1) `plan --model gpt3-175b --gpus 1024 --gpu a100-80gb --seq-len 2048 --global-batch
1536` (the search: chosen layout, MFU, each family's best); (2) seed 003's recipe pinned (TP 8
x PP 8 x DP 16, ZeRO-1, 1F1B, micro-batch 1) with full recompute as Megatron ran it; (3) that
recipe's dry-run at rank 0 (fake tensors, wall time measured). The dry-run uses global batch
128 (8 micro-batches per pipeline) instead of 1536 (96): 1F1B keeps min(m, pp - k) micro-
batches in flight on stage k, 8 in both cases on rank 0, so the peak is the same while the
fake step runs 12x fewer micro-batches.

    python benchmarks/gpt3_175b.py [--no-dryrun]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

GB = 1e9
MEGATRON = {
    "tflops_per_gpu": 140.0,
    "peak_tflops": 312.0,
    "hfu_published": 0.45,
    "layers": 96,
    "hidden": 12288,
    "seq_len": 2048,
    "vocab": 51200,
    "source": "Narayanan et al. 2021, Megatron-LM, SC'21, Table 1 (175B row)",
}
SEED_003 = dict(dp=16, tp=8, pp=8, zero=1, pp_schedule="1f1b", micro_batch=1, ac="full")
INTERLEAVED_64 = dict(dp=1, tp=8, pp=8, zero=0, pp_schedule="interleaved", pp_virtual=3)
"""Issue #37's layout: 175B on 64 A100-80GB, TP 8 x PP 8 interleaved (3 chunks per rank), full
recompute, as Megatron-LM runs 175B (Korthikanti et al. 2022 use TP 8 x PP 8 with interleaving
and full recompute); planned at 8 and 64 micro-batches per step."""


def megatron_mfu() -> float:
    """Megatron's model-FLOPs utilization from its published hardware-FLOPs rate."""
    m = MEGATRON
    s, h, l, v = m["seq_len"], m["hidden"], m["layers"], m["vocab"]
    hardware = 96 * (1 + s / (6 * h) + v / (16 * l * h))
    model = 72 * (1 + s / (6 * h) + v / (12 * l * h))
    return m["tflops_per_gpu"] * model / hardware / m["peak_tflops"]


def _row(e: Any) -> dict[str, Any]:
    from scaletrain.planner.types import layout_label

    return {
        "layout": layout_label(e),
        "plan": e.plan.layout.to_dict(),
        "ac": e.plan.ac,
        "micro_batch": e.plan.micro_batch,
        "mfu": e.mfu,
        "step_s": e.time.step_s,
        "reserved_gb": e.memory.reserved / GB,
        "fits": e.memory.fits,
    }


def planned() -> dict[str, Any]:
    from scaletrain.config import Layout, hardware_preset, resolve_model
    from scaletrain.planner import PlanInput, estimate
    from scaletrain.planner.search.layouts import search

    model, hw = resolve_model("gpt3-175b"), hardware_preset("a100-80gb")
    kw = dict(seq_len=2048, global_batch=1536)
    t0 = time.perf_counter()
    res = search(model, hw, 1024, **kw)
    search_s = time.perf_counter() - t0
    assert res.best is not None
    families = {
        f: {"why": o.reason(res.best), **({"best": _row(o.best)} if o.best else {})}
        for f, o in res.families.items()
    }
    seed = search(model, hw, 1024, **kw, **SEED_003).best
    assert seed is not None, "seed 003's recipe must fit"
    interleaved = {}
    for m in (8, 64):  # dp 1, micro-batch 1: m micro-batches per step
        plan = PlanInput(
            model, hw, 64, Layout(**INTERLEAVED_64), 2048, m, 1, precision="bf16", ac="full"
        )
        est = estimate(plan)
        interleaved[m] = {**_row(est), "pp_p2p_gb": est.memory.buffer_terms["pp_p2p"] / GB}
    return {
        "chosen": _row(res.best),
        "families": families,
        "search_s": search_s,
        "seed_003": _row(seed),
        "interleaved_64": interleaved,
    }


def dry_run() -> dict[str, Any]:
    from scaletrain.config import load_config
    from scaletrain.dryrun import dryrun

    args = [
        "--model.name=gpt3-175b",
        "--hardware.gpu=a100-80gb",
        "--batch.seq_len=2048",
        "--batch.global_batch=128",
        "--batch.micro_batch=1",
        "--parallel.dp=16",
        "--parallel.tp=8",
        "--parallel.pp=8",
        "--parallel.zero=1",
        "--parallel.pp_schedule=1f1b",
        "--memory.ac=full",
    ]
    t0 = time.perf_counter()
    meas = dryrun(load_config(None, args), world_size=1024, rank=0)
    out = meas.to_json()
    return {
        "wall_s": time.perf_counter() - t0,
        "memory": out.get("memory"),
        "notes": out.get("notes"),
    }


def _previous_dryrun() -> dict[str, Any] | None:
    """The dry-run of the last results/gpt3_175b.json with the commit and date it ran at."""
    import json

    path = Path(__file__).resolve().parent / "results" / "gpt3_175b.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    d = old.get("dryrun")
    if not d:
        return None
    return {
        **d,
        "git_revision": d.get("git_revision", old.get("git_revision")),
        "date": d.get("date", old.get("date")),
    }


def markdown(r: dict[str, Any]) -> str:
    c, s, meg = r["chosen"], r["seed_003"], r["megatron_mfu"]
    lines = [
        "# GPT-3 175B on 1,024 A100-80GB (seq 2048, global batch 1536)",
        "",
        f"Megatron-LM published (Narayanan et al. 2021, Table 1): TP 8 x PP 8 x DP 16, full "
        f"recompute, 140 TFLOP/s per GPU = 45% of peak in hardware FLOPs, i.e. **MFU "
        f"{meg:.1%}** in model FLOPs (no recompute counted; the planner's convention).",
        "",
        "| run | layout | AC | MFU | step s | reserved GB/GPU |",
        "|---|---|---|---|---|---|",
        f"| planner search (chosen) | {c['layout']} | {c['ac']} | {c['mfu']:.1%} | "
        f"{c['step_s']:.2f} | {c['reserved_gb']:.1f} |",
        f"| planner, seed 003 / Megatron layout | {s['layout']} | {s['ac']} | {s['mfu']:.1%} "
        f"| {s['step_s']:.2f} | {s['reserved_gb']:.1f} |",
        f"| Megatron-LM measured | tp8 pp8 dp16 | full | {meg:.1%} | — | — |",
        "",
        "## 175B on 64 A100-80GB, TP 8 x PP 8 interleaved (v = 3), full recompute",
        "",
        "Issue #37's layout, planned under scaletrain's own recipe: the pipeline's "
        "communication buffers (`pp_p2p`) follow the micro-batches in flight since the "
        "trainer's stages allocate a receive when they post it and let it go once consumed "
        "(38.65 GB of them at 64 micro-batches before, 111.5 GB reserved: no fit).",
        "",
        "| micro-batches | layout | pp_p2p GB | reserved GB/GPU | fits |",
        "|---|---|---|---|---|",
        *(
            f"| {m} | {x['layout']} | {x['pp_p2p_gb']:.2f} | {x['reserved_gb']:.1f} | "
            f"{'yes' if x['fits'] else 'no'} |"
            for m, x in r.get("interleaved_64", {}).items()
        ),
        "",
        "## Gaps",
        "",
        f"- Same layout, same recompute: planner {s['mfu']:.1%} vs Megatron {meg:.1%} "
        f"({(s['mfu'] - meg) * 100:+.1f} points).",
        f"- The search's choice, {c['mfu']:.1%}, is {(c['mfu'] - meg) * 100:+.1f} points above "
        "Megatron's 2021 run. It is not the same training: it avoids full recompute (one "
        "extra forward, 25% of the hardware FLOPs at 96 vs 72) with sequence parallelism, "
        "pipeline interleaving / context parallelism and a sharded optimizer that lower "
        'activation and state memory instead. Korthikanti et al. 2022 ("Reducing Activation '
        'Recomputation in Large Transformer Models") report the same direction for 175B on '
        "A100s once SP + selective recompute replace full recompute, and Zhang et al. 2022 "
        "(OPT-175B, arXiv 2205.01068) trained with FSDP + TP 8 on 992 A100s at up to 147 "
        "TFLOP/s per GPU (47% of peak in hardware FLOPs), so a sharded data-parallel layout at "
        "this scale is not an outlier; the planner's figure for it is a prediction, not a "
        "measurement.",
        "",
        "## Why the other families lost",
        "",
    ]
    lines += [f"- **{f}**: {v['why']}" for f, v in r["families"].items()]
    d = r.get("dryrun")
    if d:
        mem = d["memory"] or {}
        lines += [
            "",
            "## Seed 003's recipe dry-run at rank 0",
            "",
            f"Fake-tensor step of TP 8 x PP 8 x DP 16, ZeRO-1, full AC, micro-batch 1, "
            f"8 micro-batches (see the module docstring): **{d['wall_s']:.0f} s** wall "
            "on this machine (2 shared CPU cores). Memory (GB): "
            + ", ".join(
                f"{k} {v / GB:.1f}"
                for k, v in mem.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1e6
            )
            + " (allocated; not the planner's rank: its "
            f"{s['reserved_gb']:.1f} GB reserved is the worst rank's, a later "
            "pipeline stage, and the plan's batch is 96 micro-batches).",
        ]
        if d.get("git_revision"):
            lines += [
                "",
                f"(Dry-run measured at git {d['git_revision']}, {d['date']}; later "
                "runs with --no-dryrun keep it: the time model does not change it.)",
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-dryrun", action="store_true", help="skip the 175B dry-run")
    args = ap.parse_args(argv)
    res = {**planned(), "megatron": MEGATRON, "megatron_mfu": megatron_mfu()}
    print(
        f"chosen {res['chosen']['layout']} MFU {res['chosen']['mfu']:.3f}; seed 003 "
        f"{res['seed_003']['mfu']:.3f}; Megatron {res['megatron_mfu']:.3f}",
        flush=True,
    )
    # written now and again after the dry-run: on a loaded machine the fake 175B step can take
    # many minutes, and the plan is worth keeping on its own
    if args.no_dryrun:
        # the dry-run measures memory at rank 0, which the planner's time model does not
        # touch: keep the last measured one, stamped with the commit and date it ran at
        old = _previous_dryrun()
        if old is not None:
            res["dryrun"] = old
    write_results("gpt3_175b", res, markdown(res))
    if not args.no_dryrun:
        res["dryrun"] = dry_run()
        print(f"dry-run {res['dryrun']['wall_s']:.0f} s", flush=True)
    write_results("gpt3_175b", res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
