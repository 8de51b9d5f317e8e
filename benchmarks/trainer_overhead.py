"""tokens/s of scaletrain's trainer vs a bare PyTorch loop: same model, batch, precision, machine.

Both loops run in this process, alternating rounds (A B A B ...) so drift in machine load hits
both; the figure is the ratio of medians. The bare loop is the minimum a training step needs:
forward, cross-entropy, backward, AdamW step, zero_grad, on pre-made batches. scaletrain adds
its data loader, metrics, clipping, loss scaler checks and logging. Target: ratio >= 0.97.

    python benchmarks/trainer_overhead.py [--rounds 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402
from scaletrain.config import load_config  # noqa: E402
from scaletrain.models import build_model, causal_lm_loss, materialize  # noqa: E402
from scaletrain.trainer import train  # noqa: E402


def bare_loop(job, steps: int) -> float:
    torch.manual_seed(0)
    model = build_model(job.model, device="meta")
    materialize(model, device="cpu", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # the trainer's CPU kernel
    b, t = job.batch.micro_batch, job.batch.seq_len
    batches = [torch.randint(0, 256, (b, t + 1)) for _ in range(8)]
    tokens, timed = 0, 0.0
    for i in range(steps + 1):
        x = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = causal_lm_loss(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # skip the first step (allocation, lazy init), as the trainer does
            timed += time.perf_counter() - t0
            tokens += b * t
    return tokens / timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    job_args = [
        "--model.name=gpt-mini",
        "--batch.seq_len=128",
        "--batch.global_batch=16",
        "--batch.micro_batch=16",
        f"--train.steps={args.steps + 1}",
        "--train.eval_every=100000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--checkpoint.resume=never",
        "--train.log_every=100000",
    ]
    ours, bare = [], []
    for r in range(args.rounds):
        job = load_config(None, [*job_args, f"--train.run_dir=runs/bench_overhead_{r}"])
        bare.append(bare_loop(job, args.steps))
        ours.append(train(job).tokens_per_s)
        print(f"round {r}: bare {bare[-1]:,.0f} tok/s | scaletrain {ours[-1]:,.0f} tok/s")
    ratio = statistics.median(ours) / statistics.median(bare)
    data = {
        "model": "gpt-mini",
        "batch": "16x128",
        "precision": "fp32",
        "rounds": args.rounds,
        "steps": args.steps,
        "bare_tokens_per_s": bare,
        "scaletrain_tokens_per_s": ours,
        "ratio_of_medians": ratio,
        "target": 0.97,
    }
    md = (
        "| loop | median tokens/s |\n|---|---|\n"
        f"| bare PyTorch | {statistics.median(bare):,.0f} |\n"
        f"| scaletrain | {statistics.median(ours):,.0f} |\n\n"
        f"**ratio {ratio:.3f}** (target >= 0.97; gpt-mini, batch 16x128, fp32, "
        f"{args.rounds} alternating rounds of {args.steps} steps)"
    )
    write_results("trainer_overhead", data, md)
    print(md)


if __name__ == "__main__":
    main()
