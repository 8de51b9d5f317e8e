"""Single-GPU truth: MFU, tokens/s and CUDA peak memory vs the planner and the dry-run.

Two models, GPT-2 124M and a ~1B Llama (Llama-2 shape cut to 16 layers x 2048 wide, 16 heads,
SwiGLU 5632: 0.95B parameters), each run two ways on one CUDA GPU:
- scaletrain: `scaletrain.trainer.train` (what `scaletrain train` runs) with bf16 autocast, SDPA
  attention and `torch.compile`, on the embedded corpus;
- plain PyTorch: the same `nn.Module` built by `scaletrain.models.build_model`, eager, bf16
  autocast, fused AdamW, random tokens; a loop anyone can read in 20 lines.
Reported: tokens/s and MFU (model FLOPs per token from `scaletrain.planner.time.flops`, causal
attention halved, against the detected GPU preset's dense bf16 peak), CUDA peak memory
(`max_memory_allocated` and `max_memory_reserved`), the planner's predicted allocated / reserved
peak and tokens/s, and the dry-run's measured allocated peak (fake tensors on the CPU).

Without CUDA the script measures nothing: it writes results saying "not measured (no CUDA
device)" and prints the command that measures them. `--device cpu` runs the same code on the
CPU with small settings, for testing the script itself (nothing is written).

    python benchmarks/gpu.py [--steps 30] [--models gpt2-124m,llama-1b]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

COMMAND = "python benchmarks/gpu.py   # or: scaletrain bench gpu  (on a machine with a CUDA GPU)"
NOT_MEASURED = "not measured (no CUDA device)"
GB = 1e9

MODELS: dict[str, dict[str, Any]] = {
    # name -> preset, model overrides, batch (micro-batch sequences, sequence length)
    "gpt2-124m": {"preset": "gpt2-124m", "model": {}, "micro_batch": 16, "seq_len": 1024},
    "llama-1b": {
        "preset": "llama2-7b",
        "model": {
            "num_layers": 16,
            "dim": 2048,
            "num_heads": 16,
            "num_kv_heads": 16,
            "ffn_dim": 5632,
        },
        "micro_batch": 8,
        "seq_len": 2048,
    },
    # CPU self-test only (--device cpu)
    "tiny-llama": {"preset": "tiny-llama", "model": {}, "micro_batch": 4, "seq_len": 64},
}


def overrides(
    spec: dict[str, Any], *, steps: int, compile_: bool, run_dir: str, device: str
) -> dict[str, dict[str, Any]]:
    mb = spec["micro_batch"]
    return {
        "model": {"name": spec["preset"], "attention": "sdpa", **spec["model"]},
        "precision": {"dtype": "bf16"},
        "batch": {"micro_batch": mb, "global_batch": mb, "seq_len": spec["seq_len"]},
        "parallel": {"layout": "manual", "dp": 1},
        "train": {
            "steps": steps,
            "compile": compile_,
            "device": device,
            "eval_every": 10 * steps,
            "eval_batches": 1,
            "sample_tokens": 0,
            "progress": False,
            "tensorboard": False,
            "run_dir": run_dir,
        },
        "checkpoint": {"every": 0, "resume": "never"},
    }


def scaletrain_run(over: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from scaletrain.config import load_config
    from scaletrain.trainer import train

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    r = train(load_config(None, over))
    m = r.measured
    return {
        "tokens_per_s": r.tokens_per_s,
        "mfu": r.mfu,
        "final_loss": r.final_loss,
        "peak_allocated": m.get("peak_allocated"),
        "peak_reserved": m.get("peak_reserved"),
    }


def plain_run(
    over: dict[str, dict[str, Any]], *, steps: int, device: torch.device, peak_flops: float
) -> dict[str, Any]:
    """The plain PyTorch loop: eager, bf16 autocast, fused AdamW (CUDA), random tokens."""
    from scaletrain.config import load_config
    from scaletrain.models import build_model, causal_lm_loss, materialize
    from scaletrain.planner.time.flops import flops_per_token

    job = load_config(None, over)
    cfg, b = job.model, job.batch
    model = build_model(cfg, device="meta")
    materialize(model, device=device, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (b.micro_batch, b.seq_len + 1), generator=g).to(device)
    inputs, targets = x[:, :-1], x[:, 1:]
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(inputs)
        loss = causal_lm_loss(logits, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[1:] or times)  # the first step pays one-time costs
    tok_s = b.micro_batch * b.seq_len / step_s
    out = {
        "tokens_per_s": tok_s,
        "mfu": tok_s * flops_per_token(cfg, b.seq_len) / peak_flops,
        "final_loss": float(loss.detach()),
    }
    if device.type == "cuda":
        out.update(
            peak_allocated=torch.cuda.max_memory_allocated(),
            peak_reserved=torch.cuda.max_memory_reserved(),
        )
    del model, opt
    return out


def predictions(over: dict[str, dict[str, Any]], gpu: str, *, dryrun: bool) -> dict[str, Any]:
    """Planner estimate (and the dry-run's allocated peak) for the job on preset `gpu`."""
    from scaletrain.config import load_config
    from scaletrain.measure.verify import predict

    over = {**over, "hardware": {"gpu": gpu}}
    job = load_config(None, over)
    est = predict(job, job.layout(1))
    out: dict[str, Any] = {"params": job.model.num_params()}
    if est is not None:
        out["planner"] = {
            "allocated": est.memory.total,
            "reserved": est.memory.reserved,
            "tokens_per_s": est.tokens_per_s,
            "mfu": est.mfu,
        }
    if dryrun:
        from scaletrain.dryrun import dryrun as run_dryrun

        try:
            out["dryrun_allocated"] = run_dryrun(job, world_size=1, count_flops=False).memory.total
        except Exception as e:  # noqa: BLE001 - reported, the GPU numbers still stand
            out["dryrun_allocated"] = f"failed: {type(e).__name__}: {e}"
    return out


def _gb(x: Any) -> str:
    return f"{x / GB:.1f}" if isinstance(x, int | float) else "-"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    if not rows:
        return "\n".join(
            [
                "# Single-GPU truth: MFU, tokens/s, CUDA peak memory",
                "",
                f"**{NOT_MEASURED}.** This result file was written on a machine without CUDA; "
                "nothing here is a measurement. To measure, run on a CUDA machine:",
                "",
                f"    {COMMAND}",
                "",
                "It runs GPT-2 124M and a ~1B Llama with scaletrain's trainer (bf16 + SDPA + "
                "torch.compile) and a plain eager PyTorch loop, and reports tokens/s, MFU, CUDA "
                "peak allocated / reserved memory beside the planner's prediction and the dry-run.",
            ]
        )
    lines = [
        "# Single-GPU truth: MFU, tokens/s, CUDA peak memory",
        "",
        f"{meta['gpu_name']} (preset `{meta['preset']}`, bf16 dense peak "
        f"{meta['peak_tflops']:.0f} TFLOP/s), {meta['steps']} steps per run, first step "
        "excluded. MFU = model FLOPs (planner formula, causal attention halved) x tokens/s"
        " / peak.",
        "",
        "| model | params | batch | run | tokens/s | MFU | peak allocated GB | "
        "peak reserved GB | planner allocated / reserved GB | planner tokens/s | "
        "dry-run allocated GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["predicted"].get("planner", {})
        for run in ("scaletrain", "plain"):
            m = r[run]
            lines.append(
                f"| {r['model']} | {r['predicted']['params'] / 1e6:,.0f}M | {r['batch']} | "
                f"{r['labels'][run]} | {m['tokens_per_s']:,.0f} | {100 * m['mfu']:.1f}% | "
                f"{_gb(m.get('peak_allocated'))} | {_gb(m.get('peak_reserved'))} | "
                f"{_gb(p.get('allocated'))} / {_gb(p.get('reserved'))} | "
                f"{p.get('tokens_per_s', 0):,.0f} | "
                f"{_gb(r['predicted'].get('dryrun_allocated'))} |"
            )
    lines += [
        "",
        "The plain loop uses random tokens and no gradient clipping, loss scaler or "
        "logging; the scaletrain run is the full trainer step (clipping, metrics, data "
        "loader). The planner and dry-run predict the scaletrain run.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-124m,llama-1b")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="'cpu' exercises the script on a tiny model (self-test, no results)",
    )
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-dryrun", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{NOT_MEASURED}. To measure, on a CUDA machine run:\n  {COMMAND}")
        if not args.no_write:
            write_results(
                "gpu",
                {"status": NOT_MEASURED, "command": COMMAND, "rows": []},
                markdown([], {}),
                missing="no CUDA device",
            )
        return 0
    device = torch.device(args.device)
    if device.type == "cuda":
        from scaletrain.config import load_config
        from scaletrain.trainer.build import detect_hardware
        from scaletrain.trainer.precision import set_tf32

        job = load_config(None, {})
        hw = detect_hardware(job, device)
        gpu_name = torch.cuda.get_device_name(device)
        set_tf32(job.precision, device)  # the trainer's rule (torch's per-backend API)
    else:
        from scaletrain.config import hardware_preset

        hw, gpu_name = hardware_preset("cpu"), "cpu (self-test)"
    peak = hw.flops("bf16")
    rows = []
    for name in args.models.split(","):
        spec = MODELS[name]
        row: dict[str, Any] = {
            "model": name,
            "batch": f"{spec['micro_batch']}x{spec['seq_len']}",
            "labels": {
                "scaletrain": "scaletrain (bf16, sdpa, compile)"
                if not args.no_compile
                else "scaletrain (bf16, sdpa)",
                "plain": "plain PyTorch (bf16 eager)",
            },
        }
        with tempfile.TemporaryDirectory() as tmp:
            over = overrides(
                spec,
                steps=args.steps,
                compile_=not args.no_compile,
                run_dir=f"{tmp}/{name}",
                device=args.device,
            )
            t0 = time.perf_counter()
            row["scaletrain"] = scaletrain_run(over)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            row["plain"] = plain_run(over, steps=args.steps, device=device, peak_flops=peak)
            row["predicted"] = predictions(over, hw.name, dryrun=not args.no_dryrun)
            row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        for run in ("scaletrain", "plain"):
            m = row[run]
            print(
                f"{name:10s} {row['labels'][run]:34s} {m['tokens_per_s']:10,.0f} tok/s  "
                f"MFU {100 * m['mfu']:5.1f}%  peak alloc {_gb(m.get('peak_allocated'))} GB",
                flush=True,
            )
    if args.no_write or device.type != "cuda":
        return 0
    meta = {
        "gpu_name": gpu_name,
        "preset": hw.name,
        "peak_tflops": peak / 1e12,
        "steps": args.steps,
        "cuda": torch.version.cuda,
        "pid": os.getpid(),
    }
    write_results("gpu", {"status": "measured", "meta": meta, "rows": rows}, markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
