"""Anchor layouts planned under every framework recipe, side by side with the published figure.

For each anchor (a run a framework's authors published), the planner is run with each recipe
(planner/recipes/registry.py): peak memory (reserved; and the allocator's reserved, i.e. without the
CUDA context, which is what torch.cuda.max_memory_reserved reports), fit, step time, and the
published figure with the error of the anchor's own recipe. A recipe that refuses the layout
shows its reason. Published figures (every one re-read this session):

- torchtitan docs/performance.md (pytorch/torchtitan, versions of 2024-12-26), Llama 3.1 on
  H100 (96 GB HBM2e, 500 W): Table 1 (8B, 8 GPUs, FSDP, local batch 2, selective AC): 82.4
  GiB, 5,762 TPS/GPU; Table 3 (8B, 128 GPUs, same): 67.0 GiB, 5,605 TPS/GPU; Table 4 (70B,
  256 GPUs, FSDP 32 x TP 8, local batch 16, full AC, compile + Float8): 71.9 GiB, 829 TPS/GPU.
  Memory is torch's max reserved; sequence length: the Llama 3 train configs' 8192.
- Narayanan et al. 2021 (SC'21, arXiv 2104.04473), A100-80GB, activation recomputation:
  Table 1: GPT-3 175B (TP 8, PP 8, 1024 GPUs, batch 1536) 140 TFLOP/s per GPU (section 5.1),
  530B (TP 8, PP 35, 2520 GPUs, batch 2520) 163 TFLOP/s; Table 2 (DeepSpeed ZeRO-3 without
  model parallelism): 175B on 384 GPUs, micro-batch 4, batch 1536: 144 TFLOP/s; 530B on 560
  GPUs with micro-batch 4 did not fit, on 640 GPUs (batch 2560) 138 TFLOP/s. Their FLOPs per
  iteration (eq. 3) F = 96 B s l h^2 (1 + s/6h + V/16lh); step time = F / (n x TFLOP/s).
- BLOOM 176B (bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: TP 4,
  PP 12, 384 A100-80GB, micro-batch 2, global 2048, seq 2048, checkpoint-activations, bf16
  with DeepSpeed's ZeRO-1-equivalent BF16 optimizer; BigScience's model page: "one copy of the
  model takes 48 GPUs (using 60 GB of memory on each GPU)", "about 150 TFLOPs").

A second table plans every row of the published-runs corpus (planner/data/published_runs.toml,
read through planner.recipes.published) twice: with the default recipe, and with its framework's
recipe (torchtitan -> torchtitan; DeepSpeed and GPT-NeoX -> deepspeed; Megatron-LM and NeMo ->
megatron; llm-foundry keeps the default), and gives median / max |error| of memory (reserved,
or allocated for rows that publish an allocated peak) and step time, and fit/OOM, side by side.

    python benchmarks/recipe_layouts.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from scaletrain.config import (  # noqa: E402
    Layout,
    ModelConfig,
    hardware_preset,
    model_preset,
)
from scaletrain.planner.estimate import estimate  # noqa: E402
from scaletrain.planner.recipes.memory import recipe_problems  # noqa: E402
from scaletrain.planner.recipes.published import (  # noqa: E402
    PublishedRun,
    load_runs,
    plan_input,
    published_peak_bytes,
    recipe_of,
    refusals,
)
from scaletrain.planner.recipes.registry import RECIPES  # noqa: E402
from scaletrain.planner.types import PlanInput  # noqa: E402

GiB = 2**30


def _gpt(name: str, h: int, layers: int, heads: int, vocab: int = 51200) -> ModelConfig:
    """GPT-3-style model of Narayanan et al. 2021 (LayerNorm, GELU f = 4h, learned positions,
    tied head, seq 2048, vocabulary 51200). attention='naive': the Megatron-LM of 2021-2022
    (also under Megatron-DeepSpeed for BLOOM) computed softmax(QK^T) with its fused
    scale-mask-softmax kernel and kept the s x s scores; flash attention came later."""
    return ModelConfig(
        name=name,
        vocab_size=vocab,
        dim=h,
        num_layers=layers,
        num_heads=heads,
        ffn_dim=4 * h,
        max_seq_len=2048,
        attention="naive",
    )


def _narayanan_step(m: ModelConfig, batch: int, seq: int, gpus: int, tflops: float) -> float:
    """Step seconds implied by a per-GPU TFLOP/s figure of Narayanan et al. 2021 (eq. 3)."""
    h, L, V = m.dim, m.num_layers, m.vocab_size
    F = 96 * batch * seq * L * h * h * (1 + seq / (6 * h) + V / (16 * L * h))
    return F / (gpus * tflops * 1e12)


# Grand Teton's 96 GB H100: its preset's memory (what CUDA reports), the SXM's peak as before
H100_96 = dataclasses.replace(
    hardware_preset("h100-sxm"), memory_bytes=hardware_preset("h100-hbm2e-500w").memory_bytes
)
A100 = hardware_preset("a100-80gb")

ANCHORS: list[dict[str, Any]] = [
    dict(
        name="torchtitan Llama 3.1 8B, 8 H100, FSDP, lb2, selective",
        recipe="torchtitan",
        model=model_preset("llama3-8b"),
        hw=H100_96,
        layout=Layout(dp=8, zero=3),
        seq=8192,
        gb=16,
        mb=2,
        ac="selective",
        precision="bf16",
        compile=False,
        mem_gib=82.4,
        step_s=2 * 8192 / 5762,
        src="torchtitan docs/performance.md Table 1",
    ),
    dict(
        name="torchtitan Llama 3.1 8B, 128 H100, FSDP, lb2, selective",
        recipe="torchtitan",
        model=model_preset("llama3-8b"),
        hw=H100_96,
        layout=Layout(dp=128, zero=3),
        seq=8192,
        gb=256,
        mb=2,
        ac="selective",
        precision="bf16",
        compile=False,
        mem_gib=67.0,
        step_s=2 * 8192 / 5605,
        src="torchtitan docs/performance.md Table 3",
    ),
    dict(
        name="torchtitan Llama 3.1 70B, 256 H100, FSDP32 TP8, lb16, full, fp8",
        recipe="torchtitan",
        model=model_preset("llama3-70b"),
        hw=H100_96,
        layout=Layout(dp=32, zero=3, tp=8, sp=True),
        seq=8192,
        gb=512,
        mb=16,
        ac="full",
        precision="fp8",
        compile=True,
        mem_gib=71.9,
        step_s=512 * 8192 / 256 / 829,
        src="torchtitan docs/performance.md Table 4",
    ),
    dict(
        name="Megatron GPT-3 175B, 1024 A100, TP8 PP8 DP16",
        recipe="megatron",
        model=_gpt("gpt3-175b", 12288, 96, 96),
        hw=A100,
        layout=Layout(dp=16, zero=1, tp=8, sp=True, pp=8),
        seq=2048,
        gb=1536,
        mb=1,
        ac="full",
        precision="bf16",
        compile=False,
        mem_gib=None,
        step_s=_narayanan_step(_gpt("g", 12288, 96, 96), 1536, 2048, 1024, 140),
        src="Narayanan et al. 2021 section 5.1: 140 TFLOP/s",
    ),
    dict(
        name="Megatron 530B, 2520 A100, TP8 PP35 DP9",
        recipe="megatron",
        model=_gpt("gpt-530b", 20480, 105, 128),
        hw=A100,
        layout=Layout(dp=9, zero=1, tp=8, sp=True, pp=35),
        seq=2048,
        gb=2520,
        mb=1,
        ac="full",
        precision="bf16",
        compile=False,
        mem_gib=None,
        step_s=_narayanan_step(_gpt("g", 20480, 105, 128), 2520, 2048, 2520, 163),
        src="Narayanan et al. 2021 Table 1: 163 TFLOP/s",
    ),
    dict(
        name="DeepSpeed ZeRO-3 GPT-3 175B, 384 A100, mb4",
        recipe="deepspeed",
        model=_gpt("gpt3-175b", 12288, 96, 96),
        hw=A100,
        layout=Layout(dp=384, zero=3),
        seq=2048,
        gb=1536,
        mb=4,
        ac="full",
        precision="bf16",
        compile=False,
        mem_gib=None,
        step_s=_narayanan_step(_gpt("g", 12288, 96, 96), 1536, 2048, 384, 144),
        src="Narayanan et al. 2021 Table 2: 144 TFLOP/s",
    ),
    dict(
        name="DeepSpeed ZeRO-3 530B, 560 A100, mb4 (published: OOM)",
        recipe="deepspeed",
        model=_gpt("gpt-530b", 20480, 105, 128),
        hw=A100,
        layout=Layout(dp=560, zero=3),
        seq=2048,
        gb=2240,
        mb=4,
        ac="full",
        precision="bf16",
        compile=False,
        mem_gib=None,
        step_s=None,
        oom=True,
        src="Narayanan et al. 2021 Table 2: did not fit",
    ),
    dict(
        name="DeepSpeed ZeRO-3 530B, 640 A100, mb4",
        recipe="deepspeed",
        model=_gpt("gpt-530b", 20480, 105, 128),
        hw=A100,
        layout=Layout(dp=640, zero=3),
        seq=2048,
        gb=2560,
        mb=4,
        ac="full",
        precision="bf16",
        compile=False,
        mem_gib=None,
        step_s=_narayanan_step(_gpt("g", 20480, 105, 128), 2560, 2048, 640, 138),
        src="Narayanan et al. 2021 Table 2: 138 TFLOP/s",
    ),
    dict(
        name="BLOOM 176B, Megatron-DeepSpeed, 384 A100, TP4 PP12 DP8",
        recipe="deepspeed",
        model=_gpt("bloom-176b", 14336, 70, 112, vocab=250880),
        hw=A100,
        layout=Layout(dp=8, zero=1, tp=4, pp=12),
        seq=2048,
        gb=2048,
        mb=2,
        ac="full",
        precision="bf16",
        compile=False,
        mem_gib=60e9 / GiB,
        step_s=_narayanan_step(_gpt("g", 14336, 70, 112, 250880), 2048, 2048, 384, 150),
        src="BigScience 176B model page: ~60 GB per GPU, ~150 TFLOPs",
    ),
]


def _row(a: dict[str, Any], recipe: str) -> dict[str, Any]:
    L = a["layout"]
    problems = recipe_problems(recipe, L, ac=a["ac"])
    if problems:
        return {"recipe": recipe, "refused": str(problems[0])}
    plan = PlanInput(
        a["model"],
        a["hw"],
        L.world_size,
        L,
        a["seq"],
        a["gb"],
        a["mb"],
        a["precision"],
        a["ac"],
        compile=a["compile"],
        recipe=recipe,
    )
    e = estimate(plan)
    mem = e.memory
    ctx = mem.buffer_terms.get("runtime_context", 0.0)
    return {
        "recipe": recipe,
        "reserved_gib": mem.reserved / GiB,
        "allocator_reserved_gib": (mem.reserved - ctx) / GiB,
        "fits": mem.fits,
        "step_s": e.time.step_s,
        "mfu": e.mfu,
    }


def _corpus_row(run: PublishedRun, recipe: str) -> dict[str, Any] | None:
    """(memory error, step error, fit right) of `run` planned under `recipe`; None when the
    recipe (or, for the default, scaletrain's trainer rules) refuses the layout."""
    if refusals(run, recipe):
        return None
    p = plan_input(run, recipe)
    e = estimate(p)
    m = run.measured
    mem = published_peak_bytes(e.memory, m.memory_kind)
    step = run.measured_step_s()
    return {
        "err_mem": mem / GiB / m.memory_gib - 1 if m.memory_gib else None,
        "err_step": e.time.step_s / step - 1 if step else None,
        "fit_right": None if m.oom is None else e.memory.fits == (not m.oom),
        "oom_caught": None if not m.oom else not e.memory.fits,
    }


def _stat(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    a = sorted(abs(x) for x in xs)
    mid = len(a) // 2
    med = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return f"{100 * med:.0f}% / {100 * a[-1]:.0f}% (n={len(a)})"


def corpus_table() -> tuple[list[str], dict[str, Any]]:
    runs = load_runs()
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        rec = recipe_of(run)
        for mode, r in (("default", "scaletrain"), ("framework recipe", rec)):
            row = _corpus_row(run, r)
            for g in ("overall", run.framework):
                groups.setdefault(g, {}).setdefault(mode, [])
                if row is not None:
                    groups[g][mode].append(row)
    lines = [
        "## The published-runs corpus under each framework's recipe",
        "",
        f"{len(runs)} rows of planner/data/published_runs.toml; median / max |error|.",
        "",
        "| framework | mode | memory | step time | fit/OOM right | OOM caught |",
        "|---|---|---|---|---|---|",
    ]
    data: dict[str, Any] = {}
    for g, modes in groups.items():
        for mode, rows in modes.items():
            fit = [r["fit_right"] for r in rows if r["fit_right"] is not None]
            oom = [r["oom_caught"] for r in rows if r["oom_caught"] is not None]
            mem = _stat([r["err_mem"] for r in rows if r["err_mem"] is not None])
            step = _stat([r["err_step"] for r in rows if r["err_step"] is not None])
            fits = f"{sum(fit)}/{len(fit)}" if fit else "n/a"
            caught = f"{sum(oom)}/{len(oom)}" if oom else "n/a"
            data.setdefault(g, {})[mode] = {
                "memory": mem,
                "step": step,
                "fit": fits,
                "oom_caught": caught,
            }
            lines.append(f"| {g} | {mode} | {mem} | {step} | {fits} | {caught} |")
    return lines, data


def main() -> None:
    rows: list[dict[str, Any]] = []
    lines = [
        "# Anchor layouts under each framework recipe",
        "",
        "Peak memory is the allocator's reserved bytes (torch max reserved: planned "
        "reserved minus the CUDA context) in GiB; `err` is the anchor's own recipe "
        "against the published figure. Published sources in benchmarks/recipe_layouts.py.",
        "",
    ]
    for a in ANCHORS:
        per = [_row(a, r) for r in RECIPES]
        own = next(p for p in per if p["recipe"] == a["recipe"])
        pub_mem, pub_step = a.get("mem_gib"), a.get("step_s")
        err_mem = err_step = None
        if "refused" not in own:
            if pub_mem:
                err_mem = own["allocator_reserved_gib"] / pub_mem - 1
            if pub_step:
                err_step = own["step_s"] / pub_step - 1
        rows.append(
            {
                "anchor": a["name"],
                "recipe": a["recipe"],
                "source": a["src"],
                "layout": a["layout"].label(),
                "published_mem_gib": pub_mem,
                "published_step_s": pub_step,
                "published_oom": a.get("oom", False),
                "err_mem": err_mem,
                "err_step": err_step,
                "per_recipe": per,
            }
        )
        pm = f"{pub_mem:.1f} GiB" if pub_mem else ("OOM" if a.get("oom") else "-")
        ps = f"{pub_step:.2f} s" if pub_step else "-"
        lines += [
            f"## {a['name']}",
            "",
            f"{a['layout'].label()}, seq {a['seq']}, micro-batch {a['mb']}, global "
            f"{a['gb']}, ac={a['ac']}, {a['precision']}, {a['hw'].name} "
            f"({a['hw'].capacity_text()}). Published ({a['src']}): memory "
            f"{pm}, step {ps}.",
            "",
            "| recipe | memory GiB | fits | step s | MFU |",
            "|---|---:|---|---:|---:|",
        ]
        for p in per:
            mark = " **(anchor)**" if p["recipe"] == a["recipe"] else ""
            if "refused" in p:
                lines.append(f"| {p['recipe']}{mark} | refused: {p['refused']} | | | |")
                continue
            lines.append(
                f"| {p['recipe']}{mark} | {p['allocator_reserved_gib']:.1f} | "
                f"{'yes' if p['fits'] else 'no'} | {p['step_s']:.2f} | "
                f"{100 * p['mfu']:.1f}% |"
            )
        errs = []
        if err_mem is not None:
            errs.append(f"memory {100 * err_mem:+.1f}%")
        if err_step is not None:
            errs.append(f"step time {100 * err_step:+.1f}%")
        if a.get("oom") and "refused" not in own:
            errs.append("OOM " + ("caught" if not own["fits"] else "MISSED"))
        lines += ["", f"{a['recipe']} recipe vs published: {', '.join(errs) or '-'}", ""]
    mems = [abs(r["err_mem"]) for r in rows if r["err_mem"] is not None]
    steps = [abs(r["err_step"]) for r in rows if r["err_step"] is not None]
    if mems:
        lines.append(
            f"Anchor recipes, |memory error|: max {100 * max(mems):.1f}% over "
            f"{len(mems)} anchors with a published figure."
        )
    if steps:
        s = sorted(steps)
        lines.append(
            f"Anchor recipes, |step-time error|: median {100 * s[len(s) // 2]:.1f}%, "
            f"max {100 * max(s):.1f}% over {len(s)} anchors."
        )
    corpus_lines, corpus = corpus_table()
    lines += ["", *corpus_lines]
    write_results("recipe_layouts", {"anchors": rows, "corpus": corpus}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
