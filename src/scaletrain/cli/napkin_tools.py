"""The reports of `scaletrain napkin TOOL` (cli/napkin.py parses and checks the flags): each
tool's formula with the numbers filled in, its source and what it ignores (the formulas
themselves live in planner/napkin/)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scaletrain.config import GB, ConfigError, compute_bytes, hardware_preset

__all__ = ["REPORTS"]


def _gb(x: float) -> str:
    v = x / GB
    return f"{v:,.1f} GB" if abs(v) >= 10 else f"{v:.2f} GB"


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _model(name: str | None, flag: str = "--model") -> Any:
    from scaletrain.config import resolve_model

    if name is None:
        return None
    try:
        return resolve_model(name)
    except ConfigError as e:
        raise ConfigError(flag, name, e.fix) from None


def _memory(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.textbook import (
        capacity_gb_text,
        convention,
        korthikanti_layer_bytes,
        state_bytes,
    )

    model = _model(args.model)
    if args.params is None and model is None:
        raise ConfigError("--params", None, "give --params (e.g. 7e9) or --model")
    if args.params is not None and args.params <= 0:
        raise ConfigError("--params", args.params, "use a positive count such as 7e9")
    params = args.params if args.params is not None else float(model.num_params())
    conv = convention(args.convention, args.precision)
    zs = state_bytes(params / args.tp, conv, zero=args.zero, shards=args.dp)
    n = args.dp
    out = [
        f"model + optimizer state: {conv.bytes_per_param} B/param = {conv.terms}",
        f"   source: {conv.source}",
        f"   P = {params:.4g} parameters"
        + ("" if args.params is not None else f" ({model.name}, exact count)"),
    ]
    shard = {"weights": 3, "grads": 2, "optimizer": 1}
    per = {"weights": conv.weights, "grads": conv.grads, "optimizer": conv.optimizer}
    for k, v in zs.items():
        div = f" / {n} (ZeRO-{args.zero})" if args.zero >= shard[k] and n > 1 else ""
        tp = f"/{args.tp}" if args.tp > 1 else ""
        out.append(f"   {k:<9} = P{tp} x {per[k]:g} B{div} = {_gb(v)}")
    states = sum(zs.values())
    out.append(
        f"   states    = {_gb(states)} per GPU (ZeRO-{args.zero} over dp={n}: seed 002 "
        "sec. III.A; ignores buffers, allocator, CUDA context)"
    )
    total = states
    if model is not None:
        act_bytes = float(compute_bytes(args.precision))
        per_layer = korthikanti_layer_bytes(
            args.seq_len,
            args.micro_batch,
            model.dim,
            model.num_heads,
            tp=args.tp,
            sp=args.sp,
            ac=args.ac,
            act_bytes=act_bytes,
        )
        s, b, h, a = args.seq_len, args.micro_batch, model.dim, model.num_heads
        form = {
            "none": f"s*b*h*(34 + 5*a*s/h) = {s}*{b}*{h}*(34 + 5*{a}*{s}/{h})",
            "selective": f"34*s*b*h = 34*{s}*{b}*{h}",
            "full": f"2*s*b*h = 2*{s}*{b}*{h}",
        }[args.ac]
        tp = "" if args.tp == 1 else f" (tp={args.tp}{', sp' if args.sp else ''}: Eq. 2)"
        scale = "" if act_bytes == 2 else " x 2 (fp32 activations)"
        out.append(
            f"activations (Korthikanti et al. 2022, ac={args.ac}){tp}: per layer "
            f"{form}{scale} = {_gb(per_layer)}"
        )
        acts = per_layer * model.num_layers
        out.append(f"   x {model.num_layers} layers = {_gb(acts)}")
        if args.ckpt_every > 1:
            acts /= args.ckpt_every
            out.append(
                f"   keep 1 in {args.ckpt_every} layers (seed 004 Example 1.3: "
                f"checkpointing every k layers divides activations by k) = {_gb(acts)}"
            )
        out.append(
            "   ignores: GQA, SwiGLU's third matrix, embeddings and logits, flash "
            "attention's missing s x s scores (use --ac selective for it)"
        )
        total += acts
        out.append(f"total = states + activations = {_gb(states)} + {_gb(acts)} = {_gb(total)}")
    if args.gpu:
        hw = hardware_preset(args.gpu)
        verdict = "fits" if total <= hw.memory_bytes else "DOES NOT FIT"
        out.append(f"   vs {args.gpu} {capacity_gb_text(hw)}: {verdict}")
    return out


def _ckpt(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.textbook import checkpoint_memory, sqrt_checkpoints

    model = _model(args.model)
    layers = args.layers or (model.num_layers if model is not None else None)
    if layers is None:
        raise ConfigError("--layers", None, "give --layers N or --model")
    a_gb = args.layer_gb
    unit = f" = {a_gb:g} GB" if a_gb else ""
    if a_gb is None and model is not None:
        from scaletrain.planner.napkin.textbook import korthikanti_layer_bytes

        a_gb = (
            korthikanti_layer_bytes(args.seq_len, args.micro_batch, model.dim, model.num_heads) / GB
        )
        unit = (
            f" = s*b*h*(34 + 5as/h) at s={args.seq_len}, b={args.micro_batch} = "
            f"{a_gb:.2f} GB (Korthikanti et al. 2022)"
        )

    def gb(units: float) -> str:
        return f" = {units * a_gb:.1f} GB" if a_gb else ""

    k0 = sqrt_checkpoints(layers)
    out = [
        f"checkpoint placement over N = {layers} layers, A = one layer's activations{unit} "
        "(Chen et al. 2016; seed 004 Table 15)",
        f"   none:               memory N x A = {layers} A{gb(layers)}; recompute 0",
    ]
    ks = [k0] + ([args.k] if args.k and args.k != k0 else [])
    for k in ks:
        mem, fwd, over = checkpoint_memory(layers, k)
        label = f"sqrt(N) ~ {k}" if k == k0 else f"k = {k}"
        out.append(
            f"   {label + ':':<19} memory k + N/k = {k} + {layers}/{k} = {mem:.1f} A"
            f"{gb(mem)} ({100 * (1 - mem / layers):.0f}% saved); recompute N - k = "
            f"{fwd} layer forwards = {100 * over:.1f}% of a step (fwd:bwd = 1:2)"
        )
    out.append(
        "   upper bound: one extra forward = 33% of a forward+backward step (seed 004: "
        "'roughly one-third', Chen et al. 2016)"
    )
    if args.k:
        out.append(
            f"   every {args.k} layers, keep 1 in {args.k} (seed 004 Example 1.3): memory "
            f"N/k = {layers / args.k:.1f} A{gb(layers / args.k)} "
            f"({100 * (1 - 1 / args.k):.0f}% saved), the segment being recomputed "
            "not counted"
        )
    out.append(
        "   ignores: checkpoints smaller than A (a layer input is 2sbh of 34sbh), uneven "
        "segments, the recomputed segment's own peak"
    )
    return out


def _waves(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.textbook import quantization

    units, util = quantization(args.size, args.quantum)
    full, _ = quantization(units * args.quantum, args.quantum)
    return [
        f"quantization of {args.size} in units of {args.quantum}: units = ceil({args.size}/"
        f"{args.quantum}) = {units}; utilization = {args.size}/({units} x {args.quantum}) "
        f"= {100 * util:.1f}%",
        f"   time ~ {units} units: the same as a size of {units * args.quantum} "
        f"(seed 004 Systems Perspective 1.6, Table 6)",
        "   ignores: latency hiding across warps, kernels that pick a smaller tile for the tail",
    ]


def _gemm(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.textbook import SM_COUNTS, alignment, gemm_waves

    model = _model(args.model)
    if model is None:
        raise ConfigError("--model", None, "give --model NAME (its hidden, ffn, vocab, heads)")
    if args.gpu not in SM_COUNTS:
        raise ConfigError("--gpu", args.gpu, f"use one of {', '.join(SM_COUNTS)}")
    try:
        tm, tn = (int(x) for x in args.tile.lower().split("x"))
    except ValueError:
        raise ConfigError("--tile", args.tile, "write it as MxN, e.g. 128x128") from None
    if tm < 1 or tn < 1:
        raise ConfigError("--tile", args.tile, "both tile sides must be positive, e.g. 128x128")
    sms = SM_COUNTS[args.gpu]
    t = args.tp
    rows = args.seq_len * args.micro_batch
    h, hd, a, kv = model.dim, model.head_dim, model.num_heads, model.num_kv_heads
    ffn = model.ffn_dim
    gated = model.gated_mlp
    gemms = [
        ("qkv", h, (a + 2 * kv) * hd // t),
        ("attn out", a * hd // t, h),
        ("mlp up" + (" (x2: gate, up)" if gated else ""), h, ffn // t),
        ("mlp down", ffn // t, h),
        ("lm head", h, model.vocab_size // t),
    ]
    out = [
        f"GEMMs of {model.name} per micro-batch per tp rank: rows M = seq x micro-batch = "
        f"{rows}; {args.gpu}: {sms} SMs, {tm}x{tn} output tiles",
        f"   hidden {h}: {alignment(h)}; heads {a} (per tp rank {a}/{t} = {a / t:g}), "
        f"head_dim {hd}: {alignment(hd)}; ffn {ffn}: {alignment(ffn)}; vocab "
        f"{model.vocab_size}: {alignment(model.vocab_size)}",
    ]
    for name, k, n in gemms:
        tiles, waves, eff = gemm_waves(rows, n, sms, tm, tn)
        out.append(
            f"   {name:<22} [M={rows}, K={k}] x [K, N={n}]: N {alignment(n)}, "
            f"K {alignment(k)}; tiles ceil(M/{tm}) x ceil(N/{tn}) = {tiles:,}; waves "
            f"{tiles:,}/{sms} = {waves:.2f} -> {100 * eff:.1f}% of the last-wave-"
            "padded time busy"
        )
    out += [
        "   source: NVIDIA Deep Learning Performance Guide, 'Matrix Multiplication "
        "Background' (tile and wave quantization; 16-bit dims multiples of 8, best of "
        "64/128); seed 004 Systems Perspective 1.6",
        "   ignores: cuBLAS's own tile choice, split-K/stream-K, attention's batched "
        "GEMMs, the backward's transposed shapes",
    ]
    return out


def _allreduce(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.textbook import ring_allreduce

    if args.bytes is None and args.params is None:
        raise ConfigError("--bytes", None, "give the gradient --bytes, or --params")
    m = args.bytes if args.bytes is not None else args.params * args.grad_bytes
    what = (
        f"M = {m / GB:g} GB"
        if args.bytes is not None
        else f"M = P x {args.grad_bytes:g} B = {args.params:.3g} x {args.grad_bytes:g} = "
        f"{m / GB:g} GB"
    )
    n = args.gpus
    sent, steps, secs = ring_allreduce(m, n, args.gbps * GB)
    out = [
        f"ring all-reduce of the gradients, {what}, over {n} GPUs",
        f"   each GPU sends 2(N-1)/N x M = {2 * (n - 1) / n:.3g} x {m / GB:g} GB = "
        f"{sent / GB:.3g} GB in 2(N-1) = {steps} steps",
        f"   time = {sent / GB:.3g} GB / {args.gbps:g} GB/s = {secs:.3g} s",
    ]
    if args.compute_s:
        wall = "the network is the wall" if secs > args.compute_s else "compute dominates"
        out.append(
            f"   vs forward+backward {args.compute_s:g} s: {wall} "
            f"(T_comm / T_compute = {secs / args.compute_s:.2f})"
        )
    out.append(
        "   source: seed 003 sec. 19.3, seed 004 Napkin Math 1.10 (Patarasuk and Yuan "
        "2009); ignores per-step latency, overlap with the backward, NCCL trees"
    )
    return out


def _flops_tool(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.textbook import layer_gemm_flops

    model = _model(args.model)
    if model is None:
        raise ConfigError("--model", None, "give --model NAME (its hidden, heads, ffn, layers)")
    b, s = args.micro_batch, args.seq_len
    gated = model.gated_mlp
    f = layer_gemm_flops(b, s, model.dim, model.num_heads, model.num_kv_heads, model.ffn_dim, gated)
    h, a, g, d = model.dim, model.num_heads, model.num_kv_heads, model.head_dim
    forms = {
        "qkv": f"2*B*S*h*(a+2g)*d = 2*{b}*{s}*{h}*({a}+2*{g})*{d}",
        "attention": f"2 x 2*B*a*S^2*d = 2 x 2*{b}*{a}*{s}^2*{d}",
        "out proj": f"2*B*S*h^2 = 2*{b}*{s}*{h}^2",
        "mlp": f"{3 if gated else 2} x 2*B*S*h*f = {3 if gated else 2} x 2*{b}*{s}*{h}*"
        f"{model.ffn_dim}",
    }
    out = [f"forward matmul FLOPs of one {model.name} layer, B = {b}, S = {s}:"]
    for k, v in f.items():
        out.append(f"   {k:<9} {forms[k]} = {v / 1e9:,.1f} GFLOP")
    layer = sum(f.values())
    L = model.num_layers
    step = 3 * layer * L
    out += [
        f"   per layer = {layer / 1e9:,.2f} GFLOP; x {L} layers = "
        f"{layer * L / 1e12:,.1f} TFLOP forward",
        f"   training step = 3 x forward (backward = 2 x forward) = {step / 1e12:,.1f} TFLOP",
    ]
    if args.steps:
        out.append(f"   x {args.steps:,} steps = {step * args.steps / 1e15:,.1f} PFLOP")
    if args.gpu:
        peak = hardware_preset(args.gpu).flops(args.precision)
        out.append(
            f"   one step at {args.gpu} {args.precision} peak {peak / 1e12:g} TFLOP/s = "
            f"{step / peak:.2f} s (100% utilization)"
        )
    out.append(
        "   source: seed 004 Napkin Math 1.1; ignores the LM head and embedding, norms, "
        "softmax, causal masking (the full S^2 is counted)"
    )
    return out


REPORTS: dict[str, Callable[[argparse.Namespace], list[str]]] = {
    "memory": _memory,
    "ckpt": _ckpt,
    "waves": _waves,
    "gemm": _gemm,
    "allreduce": _allreduce,
    "flops": _flops_tool,
}
"""Tool name -> the lines it prints."""
