"""Validate mixed precision before scaling: one tiny Llama, one data stream, several precisions.

fp32 · bf16 (autocast) · fp16 with dynamic loss scaling · fp16 without · fp8 tensorwise · fp8
tilewise (bf16 autocast around float8 linears), each from the same init on the same batches of
the embedded grammar corpus; plus three controls on plain bf16 Linears (those fp8 converts):
unbiased multiplicative gradient noise as large as fp8's own gradient error, fp8 tile-wise
rounding of the forward operands only (x and W in E4M3, straight-through gradients), and of the
output gradients only (E5M2) — they tell where a gap between fp8 and bf16 comes from.
Reported per run: train-loss curve and the paired gap to bf16 over training (PNG), final
validation loss, median step time, memory measured and planned (parameter, gradient and
optimizer-state bytes, and the bytes autograd saves for backward in one step), the gradient's
error against fp32 at step 0, and for fp16 the gradient underflow / overflow counts.

Length and seeds. Precisions are compared once the runs have settled: 1000 steps (~0.5M tokens)
bring bf16 to ~0.81 nats, within ~15% of the corpus entropy (0.705). At 200 steps (loss ~1.5)
the runs were still crossing the grammar corpus' plateaus at seed-dependent steps, and any
perturbation — bf16 vs fp32 rounding, or the rounding-only controls — moved a run's final loss
by a few percent either way, so a 2% band could not be resolved there. The fp32, bf16, fp8 and
control runs repeat over `--seeds` seeds (init and data order) and are compared per seed
(paired: the same init and batches), reported as mean ± standard deviation. fp16 ± loss
scaling, whose contrast is large, runs on seed 0 only (fp16 matmuls are ~10x slower than bf16
on this CPU). The memory table (measured and planned) is one step, measured in the parent.

Why fp16 without loss scaling fails here, honestly: every micro-batch loss is multiplied by
1/GRAD_ACCUM = 1/512, the normalization a trainer applies when a 1M-token global batch is
accumulated from 2048-token micro-batches. AdamW is invariant to that constant (up to eps), and
fp32/bf16 keep fp32's exponent range, so they train as without it; but the logit gradients,
(softmax - onehot) / (tokens · 512) ≈ 1e-9..1e-6, sit below fp16's smallest subnormal (6e-8) or
in its few-bit subnormals, so backward through the fp16 matmuls flushes most of them to zero.
Loss scaling (x65536) lifts them back into fp16's normal range (Micikevicius et al. 2018).

    python benchmarks/precision.py [--steps 1000] [--seeds 5] [--jobs 2] [--extend] [--render]

~45 minutes on 2 cores (the two fp16 runs take ~10 minutes each).

`--jobs` runs that many training runs at once, each in its own single-threaded process (the
tiny matmuls gain nothing from intra-op threads; two processes use two cores).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write_results  # noqa: E402
from scaletrain.config import DataConfig, PrecisionConfig, resolve_model  # noqa: E402
from scaletrain.data import build_data  # noqa: E402
from scaletrain.models import build_model, causal_lm_loss  # noqa: E402
from scaletrain.precision import (  # noqa: E402
    E4M3,
    E5M2,
    apply_fp8,
    dequantize,
    fp8_eligible,
    quantize,
)
from scaletrain.trainer.precision import LossScaler  # noqa: E402

GRAD_ACCUM = 512  # loss multiplier 1/512 (module docstring)
RUNS: dict[str, dict[str, Any]] = {
    "fp32": {"autocast": None},
    "bf16": {"autocast": torch.bfloat16},
    "fp16 + loss scaling": {"autocast": torch.float16, "loss_scaling": True},
    "fp16 no loss scaling": {"autocast": torch.float16},
    "fp8 tensorwise": {"autocast": torch.bfloat16, "fp8": "tensorwise"},
    "fp8 tilewise": {"autocast": torch.bfloat16, "fp8": "tilewise"},
    # controls: fp8's gradient error as unbiased noise (GRAD_NOISE ~ its measured relative
    # error); and tile-wise fp8 rounding of one side only, on plain bf16 Linears (no float8
    # kernel, no fp32 wgrad): forward operands (x, W in E4M3, straight-through gradients) or
    # the output gradient (E5M2), to locate fp8's effect on the loss.
    "bf16 + grad noise": {"autocast": torch.bfloat16, "grad_noise": True},
    "bf16 + fp8-rounded forward": {"autocast": torch.bfloat16, "fake_fp8": "forward"},
    "bf16 + fp8-rounded grads": {"autocast": torch.bfloat16, "fake_fp8": "backward"},
}
SEEDED = (
    "fp32",
    "bf16",
    "fp8 tensorwise",
    "fp8 tilewise",
    "bf16 + grad noise",
    "bf16 + fp8-rounded forward",
    "bf16 + fp8-rounded grads",
)
GRAD_NOISE = 0.06  # relative std of the noise; fp8's step-0 gradient error is 5.8% (measured)


def model_config():
    # tiny-llama widened so that the fp8 linears carry most of the FLOPs: dim 128, 4 layers,
    # every Linear dim a multiple of 16 (all fp8-eligible except the head, kept in bf16).
    return dataclasses.replace(
        resolve_model("tiny-llama"),
        name="precision-study",
        dim=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        ffn_dim=352,
    )


def lr_at(step: int, steps: int, lr: float) -> float:
    """20-step linear warmup, then cosine decay to lr/10: a decayed end makes the final losses
    of different precisions comparable (at a constant lr they still move ~3% between steps)."""
    if step < 20:
        return lr * (step + 1) / 20
    frac = (step - 20) / max(1, steps - 20)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def fp8_weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Weights of the Linears `apply_fp8` converts (its default skip: the output head)."""
    return [
        m.weight
        for n, m in model.named_modules()
        if fp8_eligible(m) and n.split(".")[-1] != "output"
    ]


def add_grad_noise(model: torch.nn.Module, seed: int) -> None:
    """g -> g * (1 + GRAD_NOISE * N(0, 1)) elementwise on the fp8-eligible weights: unbiased,
    the size of fp8's gradient error, none of its other effects (forward rounding, saturation)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    for w in fp8_weights(model):
        w.register_hook(
            lambda g, gen=gen: (
                g * (1 + GRAD_NOISE * torch.randn(g.shape, generator=gen, dtype=g.dtype))
            )
        )


def _fake_quant(t: torch.Tensor, dtype: torch.dtype, tile: tuple[int, int]) -> torch.Tensor:
    """t rounded through fp8 tiles and back, in t's dtype and shape (a 2-D view of t)."""
    t2 = t.reshape(-1, t.shape[-1])
    d = dequantize(*quantize(t2, dtype, tile), tile)[: t2.shape[0], : t2.shape[1]]
    return d.view(t.shape).to(t.dtype)


class _RoundForward(torch.autograd.Function):
    """Forward: the operand rounded to E4M3 tiles; backward: the gradient untouched (STE)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
        return _fake_quant(t, E4M3, tile)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


class _RoundGrad(torch.autograd.Function):
    """Forward: identity; backward: the gradient rounded to E5M2 1x128 tiles."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _fake_quant(g, E5M2, (1, 128))


class _FakeFp8Linear(torch.nn.Linear):
    """A bf16 Linear with fp8 tile-wise rounding on one side only (`side`)."""

    side = "forward"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            xb, wb = x.to(torch.bfloat16), self.weight.to(torch.bfloat16)
            if self.side == "forward":  # 1x128 activation tiles, 128x128 weight blocks
                return F.linear(
                    _RoundForward.apply(xb, (1, 128)), _RoundForward.apply(wb, (128, 128))
                )
            return _RoundGrad.apply(F.linear(xb, wb))  # dy rounded before dgrad and wgrad


def add_fake_fp8(model: torch.nn.Module, side: str) -> None:
    """Swap the Linears apply_fp8 would convert for `_FakeFp8Linear`s sharing their weights."""
    for fqn, mod in list(model.named_modules()):
        if fp8_eligible(mod) and fqn.split(".")[-1] != "output":
            parent_name, _, leaf = fqn.rpartition(".")
            new = _FakeFp8Linear(mod.in_features, mod.out_features, bias=False, device="meta")
            new.weight, new.side = mod.weight, side
            setattr(model.get_submodule(parent_name) if parent_name else model, leaf, new)


def _prepare(model: torch.nn.Module, spec: dict[str, Any], seed: int) -> list[str]:
    converted = apply_fp8(model, scaling=spec["fp8"], backend="scaletrain") if "fp8" in spec else []
    if spec.get("grad_noise"):
        add_grad_noise(model, seed)
    if spec.get("fake_fp8"):
        add_fake_fp8(model, spec["fake_fp8"])
    return converted


def step0_grad_error(batch, seed: int = 0) -> dict[str, dict[str, float]]:
    """Each precision's first gradient vs fp32's, same init and batch: relative Frobenius error
    and cosine over all parameters (a quantization error ~ its format's, and an unbiased one:
    norm ratio ~ 1, cosine ~ 1 - err^2/2)."""
    x, y = batch
    grads = {}
    for name in ("fp32", *(n for n in RUNS if n not in ("fp32", "fp16 no loss scaling"))):
        spec = RUNS[name]
        model = build_model(model_config(), device="cpu", seed=seed)
        _prepare(model, spec, seed)
        amp = (
            torch.autocast("cpu", dtype=spec["autocast"])
            if spec["autocast"] is not None
            else contextlib.nullcontext()
        )
        with amp:
            logits = model(x)
        scale = 65536.0 if spec.get("loss_scaling") else 1.0
        (causal_lm_loss(logits, y) * (scale / GRAD_ACCUM)).backward()
        grads[name] = torch.cat([p.grad.flatten().double() / scale for p in model.parameters()])
    ref = grads["fp32"]
    return {
        n: {
            "rel_error": ((g - ref).norm() / ref.norm()).item(),
            "norm_ratio": (g.norm() / ref.norm()).item(),
            "cosine": torch.nn.functional.cosine_similarity(g, ref, dim=0).item(),
        }
        for n, g in grads.items()
        if n != "fp32"
    }


# the planner's precision for each run; the controls have no recipe of their own
PLANNED = {
    "fp32": "fp32",
    "bf16": "bf16",
    "fp16 + loss scaling": "fp16",
    "fp16 no loss scaling": "fp16",
    "fp8 tensorwise": "fp8",
    "fp8 tilewise": "fp8",
}


def memory_rows(batch, seq_len: int) -> dict[str, dict[str, float]]:
    """Per run, measured and planned bytes of one training step on this batch (seed 0's init).

    Measured as the trainer's ledger measures (`scaletrain.measure.live`): parameters,
    gradients and AdamW states by their storage after one step, and the bytes autograd saves
    in one forward and loss (distinct storages, parameters excluded — autocast's 16-bit weight casts
    are saved tensors and count). Planned: `scaletrain.planner.estimate` for the same model,
    micro-batch and precision on one GPU: the resident state (params + grads + optimizer), and
    the saved bytes = its activations + the weight casts it holds from forward to backward
    (`params.in_flight`). One fp8 plan serves both scalings (tile-wise adds 4 bytes of scale
    per 128 saved fp8 values: ~3% of those, ignored by the planner).
    """
    from scaletrain.config import Layout, hardware_preset
    from scaletrain.measure.live import SavedActivations, state_bytes
    from scaletrain.planner import estimate
    from scaletrain.planner.types import PlanInput

    x, y = batch
    out: dict[str, dict[str, float]] = {}
    for name, spec in RUNS.items():
        model = build_model(model_config(), device="cpu", seed=0)
        _prepare(model, spec, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        probe = SavedActivations(model)
        amp = (
            torch.autocast("cpu", dtype=spec["autocast"])
            if spec["autocast"] is not None
            else contextlib.nullcontext()
        )
        # forward and loss, as the trainer's ledger tracks them: the fused head + loss
        with probe.track(), amp:
            loss = model(x, targets=y)
        (loss / GRAD_ACCUM).backward()
        opt.step()
        row: dict[str, float] = {
            "measured_state": float(sum(state_bytes(model, opt).values())),
            "measured_saved": float(probe.bytes),
        }
        if name in PLANNED:
            mem = estimate(
                PlanInput(
                    model=model_config(),
                    hardware=hardware_preset("h100-sxm"),
                    num_gpus=1,
                    layout=Layout(),
                    seq_len=seq_len,
                    global_batch=x.shape[0],
                    micro_batch=x.shape[0],
                    precision=PLANNED[name],
                )
            ).memory
            casts = mem.detail["params.in_flight"]
            row["planned_state"] = mem.params - casts + mem.grads + mem.optimizer
            row["planned_saved"] = mem.activations + casts
        out[name] = row
    return out


def train_run(
    name: str, spec: dict[str, Any], *, steps: int, batches, val_batches, lr: float, seed: int = 0
) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = build_model(model_config(), device="cpu", seed=seed)
    converted = _prepare(model, spec, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    scaler = LossScaler(PrecisionConfig(dtype="fp16" if spec.get("loss_scaling") else "fp32"))
    dtype = spec["autocast"]

    def amp():
        return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def forward_backward(x, y) -> torch.Tensor:
        with amp():
            logits = model(x)
        loss = causal_lm_loss(logits, y)
        scaler.scale_loss(loss / GRAD_ACCUM).backward()
        return loss

    losses, times, zero_frac, nonfinite_steps = [], [], [], 0
    for step in range(steps):
        x, y = batches[step % len(batches)]
        lr_now = lr_at(step, steps, lr)
        for g in opt.param_groups:
            g["lr"] = lr_now
        t0 = time.perf_counter()
        loss = forward_backward(x, y)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        finite = scaler.unscale_and_check(model.parameters())
        if finite:
            nz = sum(int((g == 0).sum()) for g in grads)
            zero_frac.append(nz / sum(g.numel() for g in grads))
            opt.step()
        else:
            nonfinite_steps += 1
        scaler.update(finite)
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())

    model.eval()
    with torch.no_grad(), amp():
        val = statistics.fmean(causal_lm_loss(model(vx), vy).item() for vx, vy in val_batches)
    return {
        "name": name,
        "converted_linears": len(converted),
        "train_loss": losses,
        "final_train_loss": statistics.fmean(losses[-10:]),
        "val_loss": val,
        "step_time_s": statistics.median(times[2:]),
        "grad_zero_fraction": statistics.fmean(zero_frac) if zero_frac else None,
        "nonfinite_steps": nonfinite_steps,
        "final_loss_scale": scaler.scale,
    }


def _by_name(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        by.setdefault(r["name"], []).append(r)
    return by


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per run: val loss over seeds, and its gap to bf16 and to fp32 paired by seed."""
    by = _by_name(results)
    val = {n: {r["seed"]: r["val_loss"] for r in rs} for n, rs in by.items()}
    out = {}
    for name, rs in by.items():
        vals = [r["val_loss"] for r in rs]
        mean, std = _mean_std(vals)
        row: dict[str, Any] = {
            "seeds": [r["seed"] for r in rs],
            "val_loss": vals,
            "val_mean": mean,
            "val_std": std,
            "train_mean": statistics.fmean(r["final_train_loss"] for r in rs),
            "train_minus_val": statistics.fmean(r["final_train_loss"] - r["val_loss"] for r in rs),
        }
        for ref in ("bf16", "fp32"):
            gaps = [val[name][sd] / val[ref][sd] - 1 for sd in val[name] if sd in val.get(ref, {})]
            if gaps and name != ref:
                row[f"gap_vs_{ref}"] = gaps
                row[f"gap_vs_{ref}_mean"], row[f"gap_vs_{ref}_std"] = _mean_std(gaps)
        out[name] = row
    return out


def _smooth(xs: list[float], w: int) -> list[float]:
    """Trailing moving average over w steps."""
    return [statistics.fmean(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Left: train loss per run (mean over seeds). Right: each run's train loss relative to
    bf16's on the same seed (paired), 50-step means, mean over seeds, with the ±2% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = _by_name(results)
    fig, (ax, gx) = plt.subplots(1, 2, figsize=(13, 5))
    colors = dict(zip(by, plt.get_cmap("tab10").colors))  # one colour per run in both panels
    for name, rs in by.items():
        curves = [r["train_loss"] for r in rs]
        mean = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
        vm = statistics.fmean(r["val_loss"] for r in rs)
        style = "--" if name in CONTROLS else "-"
        ax.plot(
            _smooth(mean, 10),
            style,
            color=colors[name],
            label=f"{name} (val {vm:.3f}, {len(rs)} seed{'s' * (len(rs) > 1)})",
        )
        ref = {r["seed"]: _smooth(r["train_loss"], 50) for r in by.get("bf16", [])}
        paired = [
            (_smooth(r["train_loss"], 50), ref[r["seed"]])
            for r in rs
            if r["seed"] in ref and name not in ("bf16", "fp16 no loss scaling")
        ]
        if paired:
            gap = [
                100 * statistics.fmean(a[i] / b[i] - 1 for a, b in paired)
                for i in range(len(paired[0][0]))
            ]
            gx.plot(gap, style, color=colors[name], label=name)
    best = results[0].get("best_loss_nats")
    if best:
        ax.axhline(best, color="grey", linewidth=0.8, linestyle=":")
        ax.text(0, best, " corpus entropy", va="bottom", fontsize=8, color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/token, 10-step mean, mean over seeds)")
    ax.set_title("Same model, data and init in each precision")
    ax.legend(fontsize=8)
    gx.axhspan(-2, 2, color="green", alpha=0.08)
    gx.axhline(0, color="black", linewidth=0.8)
    gx.set_ylim(-8, 8)
    gx.set_xlabel("step")
    gx.set_ylabel("train loss vs bf16, same seed (%, 50-step means)")
    gx.set_title("Paired gap to bf16 (green: ±2%)")
    gx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


CONTROLS = ("bf16 + fp8-rounded forward", "bf16 + fp8-rounded grads", "bf16 + grad noise")


def _se(row: dict[str, Any]) -> float:
    """Standard error of a run's mean paired gap to bf16 (std / sqrt(seeds))."""
    return row["gap_vs_bf16_std"] / math.sqrt(len(row["gap_vs_bf16"]))


def _verdict(summary: dict[str, dict[str, Any]]) -> str:
    """Each fp8 scaling's and control's mean paired gap with its standard error, and whether
    it stands out from zero by more than 2 standard errors (data-driven)."""
    names = [n for n in ("fp8 tensorwise", "fp8 tilewise", *CONTROLS) if n in summary]
    parts = [
        f"{n} {100 * summary[n]['gap_vs_bf16_mean']:+.2f}% ± {100 * _se(summary[n]):.2f}"
        for n in names
    ]
    real = [n for n in names if abs(summary[n]["gap_vs_bf16_mean"]) > 2 * _se(summary[n])]
    return (
        "Mean paired gap ± its standard error (std/√seeds): "
        + "; ".join(parts)
        + ". "
        + (
            "More than 2 standard errors from zero: " + ", ".join(real) + " — a small, "
            "likely real price at this width (dim 128), within the band; the others are "
            "not distinguishable from zero at this many seeds."
            if real
            else "None is more than 2 standard errors from zero: at this many "
            "seeds no precision's price is distinguishable from the noise."
        )
    )


def _late_gaps(results: list[dict[str, Any]], frac: float = 0.2) -> dict[str, float]:
    """Per run, the mean paired train-loss gap to bf16 over the last `frac` of the steps."""
    by = _by_name(results)
    ref = {r["seed"]: r["train_loss"] for r in by.get("bf16", [])}
    out = {}
    for name, rs in by.items():
        pairs = [
            (r["train_loss"], ref[r["seed"]])
            for r in rs
            if r["seed"] in ref and name not in ("bf16", "fp16 no loss scaling")
        ]
        if pairs:
            n = len(pairs[0][0])
            lo = int(n * (1 - frac))
            out[name] = statistics.fmean(
                statistics.fmean(a[lo:]) / statistics.fmean(b[lo:]) - 1 for a, b in pairs
            )
    return out


def _ctl_rows(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [summary[c] for c in CONTROLS if c in summary]


def _worst(summary: dict[str, dict[str, Any]]) -> str:
    gaps = [g for row in _ctl_rows(summary) for g in row["gap_vs_bf16"]]
    return f"{100 * max(map(abs, gaps)):.1f}%" if gaps else "-"


def _ctl_std(summary: dict[str, dict[str, Any]]) -> str:
    stds = [row["gap_vs_bf16_std"] for row in _ctl_rows(summary)]
    return f"{100 * min(stds):.1f}-{100 * max(stds):.1f}%" if stds else "-"


def _gap(row: dict[str, Any]) -> str:
    return _pct(row["gap_vs_bf16_mean"], row["gap_vs_bf16_std"])


def _pct(mean: float, std: float) -> str:
    return f"{100 * mean:+.2f}% ± {100 * std:.2f}"


def markdown(
    results: list[dict[str, Any]],
    summary: dict[str, dict[str, Any]],
    grad_err: dict[str, dict[str, float]],
    meta: dict[str, Any],
    memory: dict[str, dict[str, float]],
) -> str:
    seed0 = {r["name"]: r for r in results if r["seed"] == 0}
    lines = [
        "# Precision study: same tiny Llama, data and init in each precision",
        "",
        f"{meta['steps']} steps, batch {meta['micro_batch']}x{meta['seq_len']} tokens, AdamW "
        f"lr {meta['lr']} (warmup 20, cosine to 10%), {meta['val_tokens']:,} validation "
        f"tokens, loss x 1/{GRAD_ACCUM} (a 512-micro-batch accumulation), "
        f"runs in parallel processes ({meta['jobs']} at a time), 1 thread each. Model "
        f"{meta['params']:,} parameters. "
        f"Seeds (init + data order): {meta['seeds']} for the fp32/bf16/fp8 runs and the "
        "controls, seed 0 for fp16. Gaps are paired: run / bf16 (or fp32) of the same seed - 1, "
        "then mean ± std over seeds." + (f" Note: {meta['note']}." if meta.get("note") else ""),
        "",
        "| run | seeds | final val loss (mean ± std) | gap vs bf16 | gap vs fp32 | "
        "train - val | grad error at step 0 (vs fp32) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        ge = grad_err.get(name)
        ges = "-" if ge is None else f"{100 * ge['rel_error']:.2f}% (cos {ge['cosine']:.4f})"
        gb = _pct(row["gap_vs_bf16_mean"], row["gap_vs_bf16_std"]) if "gap_vs_bf16" in row else "-"
        gf = _pct(row["gap_vs_fp32_mean"], row["gap_vs_fp32_std"]) if "gap_vs_fp32" in row else "-"
        lines.append(
            f"| {name} | {len(row['seeds'])} | {row['val_mean']:.4f} ± "
            f"{row['val_std']:.4f} | {gb} | {gf} | {row['train_minus_val']:+.4f} | "
            f"{ges} |"
        )
    lines += [
        "",
        "Per seed: "
        + "; ".join(
            f"{n} " + ", ".join(f"{v:.4f}" for v in row["val_loss"])
            for n, row in summary.items()
            if len(row["seeds"]) > 1
        )
        + ".",
        "",
        "Seed 0 details:",
        "",
        "| run | final val loss | final train loss | step ms | grads == 0 | "
        "non-finite steps | loss scale |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in seed0.items():
        zf = "-" if r["grad_zero_fraction"] is None else f"{100 * r['grad_zero_fraction']:.1f}%"
        lines.append(
            f"| {name} | {r['val_loss']:.4f} | {r['final_train_loss']:.4f} | "
            f"{1e3 * r['step_time_s']:.0f} | {zf} | "
            f"{r['nonfinite_steps']} | {r['final_loss_scale']:g} |"
        )
    lines += [
        "",
        "Memory of one step (MiB), measured in this process and planned by "
        "`scaletrain.planner` for the same model, micro-batch and precision (one GPU): "
        "the training state (fp32 parameters, gradients, AdamW states) and the bytes "
        "autograd saves in forward + loss (activations and autocast's 16-bit weight "
        "casts; the planner's activations + `params.in_flight`):",
        "",
        "| run | state measured | state planned | error | saved measured | saved planned | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in memory.items():

        def cell(kind: str, m: dict[str, float] = m) -> str:
            meas, plan = m[f"measured_{kind}"], m.get(f"planned_{kind}")
            if plan is None:
                return f"{meas / 2**20:.2f} | - | -"
            return f"{meas / 2**20:.2f} | {plan / 2**20:.2f} | {100 * (plan / meas - 1):+.1f}%"

        lines.append(f"| {name} | {cell('state')} | {cell('saved')} |")
    acc = meta["acceptance"]
    bf16_val = summary["bf16"]["val_mean"]
    floor = meta["best_loss_nats"]
    worst = {
        s: max(summary[f"fp8 {s}"]["gap_vs_bf16"], key=abs) for s in ("tensorwise", "tilewise")
    }
    lines += [
        "",
        "## Findings",
        "",
        f"- **Acceptance (fp8 vs bf16 final validation loss within 2%)**: tensorwise "
        f"{_pct(*acc['tensorwise'])}, tilewise {_pct(*acc['tilewise'])} "
        f"(mean ± std of the {len(meta['seeds'])} paired gaps) — "
        f"{'both within' if meta['acceptance_ok'] else 'NOT both within'} 2%. "
        f"Largest single-seed gap: tensorwise {100 * worst['tensorwise']:+.2f}%, "
        f"tilewise {100 * worst['tilewise']:+.2f}%.",
        f"- Convergence: after {meta['steps']} steps bf16 is at {bf16_val:.3f} nats, "
        f"{100 * (bf16_val / floor - 1):.0f}% above the corpus entropy {floor:.3f} "
        "(the generator's own loss, the best any model can do). Comparing precisions "
        "needs runs this far along: at 200 steps (val ~1.5, the committed study before "
        "this one) the runs were crossing the corpus' plateaus at seed-dependent steps "
        "and any perturbation of fp8's size moved the final loss by up to ±10% (fp8 "
        "tile-wise then ended 2.9% *below* bf16, rounding-only controls on bf16 "
        "reproduced that). The plot's right panel shows the paired gaps over training "
        "swing most around step 200 and settle later; mean paired train-loss gap to "
        f"bf16 over the last {int(0.2 * meta['steps'])} steps: "
        + ", ".join(f"{n} {100 * g:+.2f}%" for n, g in _late_gaps(results).items())
        + ".",
        f"- Noise floor: bf16 vs fp32 differ by {_pct(*acc['bf16_vs_fp32'])} although "
        "both compute the same thing to 3 significant digits (step-0 gradient error "
        f"{100 * grad_err['bf16']['rel_error']:.2f}%); the controls below — "
        "perturbations of the size of fp8's, on the same seeds — move the final loss by "
        f"up to {_worst(summary)} (std of their paired gaps {_ctl_std(summary)}). Across "
        "seeds the same run's val loss spreads more than the precisions differ (std in "
        "the table): hence paired gaps.",
        "- What fp8 computes besides quantization: nothing found. Step-0 gradients are "
        "unbiased (norm ratio "
        f"{grad_err['fp8 tensorwise']['norm_ratio']:.3f} / "
        f"{grad_err['fp8 tilewise']['norm_ratio']:.3f}, cosine ≥ "
        f"{min(grad_err['fp8 tensorwise']['cosine'], grad_err['fp8 tilewise']['cosine']):.4f}"
        ") with the error of E4M3/E5M2 rounding (~6%); every run shares the model, "
        "optimizer, lr schedule and fp32 master weights; under fp8 the converted Linears "
        "emit bf16 like autocast's, the head and everything else run in bf16 autocast "
        "exactly as in the bf16 run (tests/unit/test_fp8_numerics.py checks the dtypes "
        "module by module).",
        "- Overfitting? No: train and val loss agree within "
        f"{max(abs(r['train_minus_val']) for r in summary.values()):.3f} nats in every "
        "run (the corpus is generated, the batches never repeat within a run).",
        "- Rounding controls (plain bf16 Linears, same seeds): "
        + "; ".join(f"{c} {_gap(summary[c])}" for c in CONTROLS if c in summary)
        + f" vs bf16 (mean ± std over seeds). {_verdict(summary)}",
        "",
        "fp16 without loss scaling: the gradients flush to zero (column 'grads == 0', the "
        "mean fraction of gradient elements that are exactly 0 after backward), so the "
        "loss barely moves; with dynamic loss scaling the same run tracks bf16. Step "
        "times are CPU times, measured with other runs sharing the host: float8 "
        "`_scaled_mm` on CPU is a reference kernel, no speed-up is expected here.",
        "",
        "![loss curves](precision.png)",
    ]
    return "\n".join(lines)


def _first_batch(seq_len: int, micro_batch: int):
    """(data, seed 0's first training batch): the batch of the step-0 and memory measurements."""
    data = build_data(DataConfig(prefetch=0), seq_len=seq_len, micro_batch=micro_batch, seed=1234)
    it = data.train_batches()
    batch = next(it)
    it.close()
    return data, batch


def _one_run(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build this seed's data and train one run (the same batches whatever the run)."""
    data = build_data(
        DataConfig(prefetch=0), seq_len=args.seq_len, micro_batch=args.micro_batch, seed=1234 + seed
    )
    it = data.train_batches()
    batches = [next(it) for _ in range(args.steps)]
    it.close()
    val_batches = data.val_batches(32)  # 16k tokens: a low-noise estimate
    t0 = time.perf_counter()
    r = train_run(
        name,
        RUNS[name],
        steps=args.steps,
        batches=batches,
        val_batches=val_batches,
        lr=args.lr,
        seed=seed,
    )
    r.update(
        seed=seed,
        wall_s=time.perf_counter() - t0,
        val_tokens=sum(v.numel() for v, _ in val_batches),
        best_loss_nats=data.best_loss_nats,
    )
    return r


def _spawn(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run in a fresh single-threaded process (results through a temporary JSON file)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            name,
            str(seed),
            str(out),
            "--steps",
            str(args.steps),
            "--micro-batch",
            str(args.micro_batch),
            "--seq-len",
            str(args.seq_len),
            "--lr",
            str(args.lr),
        ]
        subprocess.run(cmd, check=True)
        r = json.loads(out.read_text())
    print(
        f"{name:20s} seed {seed}  val {r['val_loss']:.4f}  train "
        f"{r['final_train_loss']:.4f}  {1e3 * r['step_time_s']:.0f} ms/step  zeros "
        f"{r['grad_zero_fraction']}  nonfinite {r['nonfinite_steps']}  ({r['wall_s']:.0f} s)",
        flush=True,
    )
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the fp32/bf16/fp8 runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (processes)")
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of runs")
    ap.add_argument(
        "--render",
        action="store_true",
        help="re-write the Markdown and PNG from results/precision.json, no runs",
    )
    ap.add_argument(
        "--extend",
        action="store_true",
        help="reuse the runs in results/precision.json (same settings), run the rest",
    )
    ap.add_argument("--worker", nargs=3, metavar=("RUN", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny matmuls: intra-op threads only add spin-waits
    if args.worker:
        name, seed, out = args.worker
        Path(out).write_text(json.dumps(_one_run(name, int(seed), args)))
        return 0

    if args.render:  # the runs as saved; the one-step memory table is re-measured (seconds)
        saved = json.loads((RESULTS / "precision.json").read_text())
        meta = saved["meta"]
        _, batch = _first_batch(meta["seq_len"], meta["micro_batch"])
        saved["memory"] = memory_rows(batch, meta["seq_len"])
        plot(saved["runs"], RESULTS / "precision.png")
        write_results(
            "precision",
            {k: saved[k] for k in ("meta", "summary", "step0_grad_error", "memory", "runs")},
            markdown(
                saved["runs"], saved["summary"], saved["step0_grad_error"], meta, saved["memory"]
            ),
        )
        return 0
    names = args.runs.split(",")
    jobs = [(n, sd) for sd in range(args.seeds) for n in names if n in SEEDED or sd == 0]
    previous: list[dict[str, Any]] = []
    if args.extend:  # keep the committed runs made with the same settings, run the rest
        saved = json.loads((RESULTS / "precision.json").read_text())
        same = all(
            saved["meta"][k] == getattr(args, k) for k in ("steps", "micro_batch", "seq_len", "lr")
        )
        previous = [r for r in saved["runs"] if same and (r["name"], r["seed"]) in jobs]
        done = {(r["name"], r["seed"]) for r in previous}
        jobs = [j for j in jobs if j not in done]
    jobs.sort(key=lambda j: "fp16" not in j[0])  # the slowest first: better packing
    t_all = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = previous + list(pool.map(lambda j: _spawn(j[0], j[1], args), jobs))
    data, batch = _first_batch(args.seq_len, args.micro_batch)
    grad_err = step0_grad_error(batch)
    memory = memory_rows(batch, args.seq_len)
    params = sum(p.numel() for p in build_model(model_config()).parameters())
    summary = summarize(results)
    meta = {
        "steps": args.steps,
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "jobs": args.jobs,
        "seeds": list(range(args.seeds)),
        "params": params,
        "grad_accum_multiplier": 1 / GRAD_ACCUM,
        "grad_noise": GRAD_NOISE,
        "val_tokens": results[0]["val_tokens"],
        "wall_s": time.perf_counter() - t_all,
        "best_loss_nats": data.best_loss_nats,
        "extended": bool(previous),
        "sum_run_wall_s": sum(r["wall_s"] for r in results),
    }
    complete = set(names) == set(RUNS)
    if complete:
        acc = {
            s: (summary[f"fp8 {s}"]["gap_vs_bf16_mean"], summary[f"fp8 {s}"]["gap_vs_bf16_std"])
            for s in ("tensorwise", "tilewise")
        }
        acc["bf16_vs_fp32"] = (
            summary["bf16"]["gap_vs_fp32_mean"],
            summary["bf16"]["gap_vs_fp32_std"],
        )
        meta["acceptance"] = acc
        meta["acceptance_ok"] = all(abs(acc[s][0]) < 0.02 for s in ("tensorwise", "tilewise"))
        RESULTS.mkdir(parents=True, exist_ok=True)
        plot(results, RESULTS / "precision.png")
        write_results(
            "precision",
            {
                "meta": meta,
                "summary": summary,
                "step0_grad_error": grad_err,
                "memory": memory,
                "runs": results,
            },
            markdown(results, summary, grad_err, meta, memory),
        )
    for name, row in summary.items():
        gap = row.get("gap_vs_bf16_mean")
        print(
            f"{name:20s} val {row['val_mean']:.4f} ± {row['val_std']:.4f}"
            + ("" if gap is None else f"  vs bf16 {_pct(gap, row['gap_vs_bf16_std'])}")
        )
    return 0 if all(math.isfinite(r["val_loss"]) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
