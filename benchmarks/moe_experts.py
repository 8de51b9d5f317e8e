"""MoE experts: the per-expert loop against the grouped kernels of `models.moe` (issue #37).

One MoE layer (h=256, f=512, top-2, SwiGLU) on 4096 tokens, forward and forward+backward,
for 8, 32 and 64 experts: median wall time over alternated repetitions (loop, grouped, loop,
...; the host may be shared, so ratios are measured side by side) and aten ops per
forward+backward (`TorchDispatchMode`), for each kernel of `models.moe.grouped_expert_mlp`:
the loop, `torch._grouped_mm` and the padded `torch.bmm`.

    python benchmarks/moe_experts.py [--reps 5] [--tokens 4096] [--threads 1]

One intra-op thread by default: on a shared host, multi-threaded small GEMMs measure the
neighbours' load more than the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402
from scaletrain.models import MoE  # noqa: E402
from scaletrain.models.moe import expert_kernel  # noqa: E402

EXPERTS = (8, 32, 64)
KERNELS = ("loop", "grouped_mm", "padded_bmm")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.n[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _layer(num_experts: int, dtype: torch.dtype, kernel: str) -> MoE:
    torch.manual_seed(0)
    moe = MoE(256, 512, num_experts, 2, activation="swiglu", bias=False, aux_loss_coef=0.01)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.05)
    moe = moe.to(dtype)
    moe.experts.kernel = kernel  # type: ignore[assignment]
    return moe


def _time(moe: MoE, x: torch.Tensor, backward: bool) -> float:
    t0 = time.perf_counter()
    if backward:
        moe(x).float().square().mean().backward()
    else:
        with torch.no_grad():
            moe(x)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for dname, dtype in DTYPES.items():
        for e in EXPERTS:
            x = torch.randn(1, args.tokens, 256, dtype=dtype, requires_grad=True)
            layers = {k: _layer(e, dtype, k) for k in KERNELS}
            ops = {}
            for k, moe in layers.items():
                with _Ops() as counter:
                    moe(x).float().square().mean().backward()
                ops[k] = sum(counter.n.values())
            times: dict[tuple[str, bool], list[float]] = {}
            for _ in range(args.reps):
                for bwd in (False, True):
                    for k, moe in layers.items():  # alternated: drift hits each alike
                        times.setdefault((k, bwd), []).append(_time(moe, x, bwd))
            med = {key: statistics.median(v) for key, v in times.items()}
            auto = expert_kernel(x[0], layers["loop"].experts.weights(), F.linear)
            row: dict = {"dtype": dname, "experts": e, "auto": auto}
            for k in KERNELS:
                row[f"ops_{k}"] = ops[k]
                row[f"fwd_ms_{k}"] = 1e3 * med[(k, False)]
                row[f"fwdbwd_ms_{k}"] = 1e3 * med[(k, True)]
            rows.append(row)
            print(row, flush=True)
    md = [
        "# MoE experts: per-expert loop vs grouped GEMMs\n",
        f"MoE layer h=256 f=512 top-2 SwiGLU, {args.tokens} tokens, {args.threads} thread(s); "
        f"median of {args.reps} alternated reps; ops = aten ops per forward+backward; "
        "columns loop / grouped_mm / padded_bmm\n",
        "| dtype | experts | 'auto' picks | ops | fwd ms | fwd+bwd ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            " / ".join(f"{r[f'{what}_{k}']:{fmt}}" for k in KERNELS)
            for what, fmt in (("ops", "d"), ("fwd_ms", ".1f"), ("fwdbwd_ms", ".1f"))
        ]
        md.append(f"| {r['dtype']} | {r['experts']} | {r['auto']} | " + " | ".join(cells) + " |")
    md.append(
        "\n'auto' (moe.expert_kernel) takes `_grouped_mm` wherever torch runs it (bf16; fp32 on "
        "real CPU tensors), the padded `bmm` elsewhere (fp32 on CUDA or under fake tensors, "
        "float64); the loop is fp8's path and the reference."
    )
    if not args.no_write:
        data = {"rows": rows, "reps": args.reps, "threads": args.threads, "tokens": args.tokens}
        write_results("moe_experts", data, "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
