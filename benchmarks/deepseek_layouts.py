"""DeepSeek-V3's published layout and the planner's top layouts for its run, dry-run at small
widths (issue #35: "the published training layout plans and its top layouts dry-run at small
widths").

DeepSeek-V3 was trained on 2,048 H800 with 16-way pipeline, 64-way expert parallelism and ZeRO-1
data parallelism, no tensor parallelism, 4,096-token sequences and 15,360 sequences per step
(DeepSeek-AI 2024, arXiv:2412.19437, sec. 3.1-3.2 and 4.2). This script:
1. searches every layout of deepseek-v3 on 2,048 H800 at that sequence length and batch
   (`planner.search`) and keeps its top layouts, next to the published one;
2. dry-runs each of them as the trainer would run it, on the rank the planner calls the worst,
   with the model at an eighth of its widths (dim 896, 16 heads, expert and dense MLPs, latent
   ranks and head dims / 8) but its real structure: 61 blocks, 3 dense first blocks, 256
   routed experts of which 8 per token in 4 of 8 groups, a shared expert, MLA; the vocabulary
   is kept. The step has 2 x pp micro-batches (the pipeline's steady state: what a rank holds
   does not grow past it, and the planner predicts the same peak for the published 15,360);
3. compares the planner's peak with the dry-run's (`planner_accuracy.measure_case`).

    python benchmarks/deepseek_layouts.py [--top 3]

Writes results/deepseek_layouts.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from planner_accuracy import measure_case  # noqa: E402
from scaletrain.config import (  # noqa: E402
    BatchConfig,
    HardwareConfig,
    JobConfig,
    Layout,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    hardware_preset,
    resolve_model,
)

GPUS, SEQ, GLOBAL_BATCH = 2048, 4096, 15360
PUBLISHED = Layout(dp=128, zero=1, pp=16, ep=64, pp_schedule="1f1b")
"""DeepSeek-V3 sec. 3.2: PP16, EP64 spanning 8 nodes, ZeRO-1 DP (the DualPipe schedule is
planned as 1F1B here: DualPipe's bidirectional scheduling needs two copies of each stage),
with full recomputation: DeepSeek recomputed its norms and up-projections and kept the rest,
which no `memory.ac` level reproduces; without any recomputation the layout needs 270 GiB a GPU
(docs/deepseek.md)."""
NARROW = 8
"""The widths are divided by this for the dry-run."""


def small_width(m: ModelConfig) -> ModelConfig:
    """`m` with its widths / NARROW and its structure kept."""
    return dataclasses.replace(
        m,
        name=f"{m.name}-w{m.dim // NARROW}",
        dim=m.dim // NARROW,
        num_heads=m.num_heads // NARROW,
        num_kv_heads=m.num_kv_heads // NARROW,
        ffn_dim=m.ffn_dim // NARROW,
        dense_ffn_dim=m.dense_ffn_dim // NARROW,
        kv_lora_rank=m.kv_lora_rank // NARROW,
        q_lora_rank=m.q_lora_rank // NARROW,
        qk_nope_head_dim=m.qk_nope_head_dim // NARROW,
        qk_rope_head_dim=m.qk_rope_head_dim // NARROW,
        v_head_dim=m.v_head_dim // NARROW,
    )


def job_for(
    m: ModelConfig, layout: Layout, micro_batch: int, ac: str, microbatches: int
) -> JobConfig:
    from scaletrain.config import MemoryConfig

    return JobConfig(
        model=m,
        parallel=ParallelConfig.from_layout(layout),
        precision=PrecisionConfig(dtype="bf16"),
        memory=MemoryConfig(ac=ac),
        batch=BatchConfig(
            global_batch=micro_batch * layout.dp * microbatches,
            micro_batch=micro_batch,
            seq_len=SEQ,
        ),
        hardware=HardwareConfig(gpu="h800", gpus=GPUS),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=3, help="the search's top layouts to dry-run")
    args = ap.parse_args()
    from scaletrain.planner.search.layouts import search

    full = resolve_model("deepseek-v3")
    t0 = time.perf_counter()
    res = search(full, hardware_preset("h800"), GPUS, seq_len=SEQ, global_batch=GLOBAL_BATCH)
    search_s = time.perf_counter() - t0
    picks: list[tuple[str, Any]] = [("published", (PUBLISHED, 1, "full"))]
    for i, est in enumerate(res.top[: args.top]):
        p = est.plan
        picks.append((f"search #{i + 1}", (p.layout, p.micro_batch, p.ac)))
    narrow = small_width(full)
    rows = []
    from scaletrain.planner import estimate
    from scaletrain.planner.types import plan_input_from_job

    for who, (layout, mb, ac) in picks:
        at_full = estimate(
            plan_input_from_job(
                job_for(full, layout, mb, ac, GLOBAL_BATCH // (mb * layout.dp)), layout
            )
        )
        m = 2 * layout.pp if layout.pp > 1 else 2
        job = job_for(narrow, layout, mb, ac, m)
        print(f"{who}: {layout.label()} mb{mb} ac={ac}, {m} micro-batches ...", flush=True)
        r = measure_case(
            (), job=(job, GPUS), name=f"{who}: {layout.label()}", worst=True, flops=False
        )
        r["who"], r["layout_label"], r["microbatches"] = who, layout.label(), m
        r["micro_batch"], r["ac"] = mb, ac
        r["worst_pipeline_rank"] = int(r["predicted_detail"].get("pipeline_rank", 0))
        r["full_width"] = {
            "reserved": at_full.memory.reserved,
            "fits": at_full.memory.fits,
            "step_s": at_full.time.step_s,
            "mfu": at_full.mfu,
        }
        print(
            f"   predicted {r['predicted']['total'] / 2**30:.2f} GiB, dry-run "
            f"{r['measured']['total'] / 2**30:.2f} GiB ({r['rel_error']['total']:+.1%}) "
            f"in {r['wall_s']:.0f} s",
            flush=True,
        )
        rows.append(r)
    lines = [
        f"# DeepSeek-V3 on {GPUS:,} H800: the published layout and the planner's top layouts",
        "",
        f"Search: `plan --model deepseek-v3 --gpu h800 --gpus {GPUS} --seq-len {SEQ} "
        f"--global-batch {GLOBAL_BATCH}` ({res.evaluated:,} layouts evaluated, {search_s:.0f} s "
        "on this CPU). Full width: the planner's worst rank at the real widths and batch. "
        f"Dry-run: the model at 1/{NARROW} of its widths with its 61 blocks (`{narrow.name}`), "
        "2 x pp micro-batches, the rank the planner calls the worst; total = allocated peak "
        "(the planner's CUDA context left out: a dry-run cannot see it).",
        "",
        "| layout | from | full width: reserved GiB / fits | step s | MFU | small width: "
        "worst pp rank | planned GiB | dry-run GiB | error | dry-run s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fw = r["full_width"]
        lines.append(
            f"| {r['layout_label']} mb{r['micro_batch']} ac={r['ac']} | {r['who']} "
            f"| {fw['reserved'] / 2**30:.1f} / {'yes' if fw['fits'] else 'no'} "
            f"| {fw['step_s']:.2f} | {fw['mfu']:.1%} | {r['worst_pipeline_rank']} "
            f"| {r['predicted']['total'] / 2**30:.3f} | {r['measured']['total'] / 2**30:.3f} "
            f"| {r['rel_error']['total']:+.1%} | {r['wall_s']:.0f} |"
        )
    md = "\n".join(lines) + "\n"
    write_results(
        "deepseek_layouts",
        {"search_s": search_s, "evaluated": res.evaluated, "rows": rows},
        md,
    )
    print(md)


if __name__ == "__main__":
    main()
