"""Saved-tensor ledger: every tensor one transformer block keeps for backward, under each `ac`.

One block of a Llama-shaped model (RMSNorm, RoPE, GQA, SwiGLU) and one of a GPT-2-shaped model
(LayerNorm, learned positions, GELU, biases), built by `scaletrain.models.build_model` at CPU
widths (h=256, 4 heads, seq 128, batch 2; the op structure of the full-size models), wrapped
by the trainer's own `scaletrain.parallel.ac.apply_ac` for ac = none / selective / full, and run
as the trainer runs a bf16 job on CPU: fp32 parameters under `torch.autocast(bfloat16)`
(`trainer/precision.py`), so the residual stream entering the block is fp32; and again with
bf16 parameters and a bf16 residual stream (FSDP2's MixedPrecisionPolicy path, emulated by
casting the model; the planner's residual_fp32=False).

What counts as kept (storages de-duplicated: views of one storage count once):
- every tensor autograd packs at the block's level (`torch.autograd.graph.saved_tensors_hooks`;
  this also sees the checkpoint's saved block input under selective/full), and
- every storage created during the block's forward that is still alive once the forward has
  returned and only the block output is held: the checkpoint's recompute caches
  (selective's saved matmul outputs live in the policy's cache, not in saved_tensors_hooks).
Each storage is named by the aten op that created it (a `TorchDispatchMode`) and the module
whose forward was running (forward pre/post hooks). Parameters and their autocast bf16 casts,
and the RoPE cos/sin (computed once per model, shared by all blocks), are listed apart and not
in the activation total — the planner counts weights in model state and ignores RoPE tables.

The analytic minimum is the planner's own per-block formula,
`scaletrain.planner.memory.activations.layer_activation_bytes(..., ac=..., precision="bf16",
residual_fp32=...)` (selective: its `selective_layer_bytes`), for the same shapes. Every
fp32 tensor kept is listed with whether backward needs it; the findings are computed from the
ac=none ledgers.

    python benchmarks/activation_ledger.py
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from scaletrain.config import ModelConfig, model_preset  # noqa: E402
from scaletrain.models import build_model  # noqa: E402
from scaletrain.parallel.ac import apply_ac  # noqa: E402
from scaletrain.planner.memory.activations import layer_activation_bytes  # noqa: E402

AC_MODES = ("none", "selective", "full")


def block_configs(dim: int = 256, heads: int = 4, seq: int = 128) -> dict[str, ModelConfig]:
    """One-layer Llama- and GPT-2-shaped configs from the presets, shrunk to CPU widths."""
    llama = replace(
        model_preset("llama3-8b"),
        name="llama-block",
        dim=dim,
        num_heads=heads,
        num_kv_heads=max(1, heads // 2),
        ffn_dim=int(dim * 3.5),
        num_layers=1,
        vocab_size=256,
        max_seq_len=seq,
    )
    gpt2 = replace(
        model_preset("gpt2-124m"),
        name="gpt2-block",
        dim=dim,
        num_heads=heads,
        num_kv_heads=heads,
        num_layers=1,
        vocab_size=256,
        max_seq_len=seq,
    )
    return {"llama": llama, "gpt2": gpt2}


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return s if s.nbytes() > 0 else None


class _Producers(TorchDispatchMode):
    """Tags each new output storage with (aten op, module path running it)."""

    def __init__(self, path: list[str]) -> None:
        super().__init__()
        self.path = path
        self.tags: dict[int, tuple[str, str]] = {}
        self.refs: dict[int, tuple[StorageWeakRef, list[int], torch.dtype, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = {
            s.data_ptr()
            for a in tree_flatten((args, kwargs))[0]
            if isinstance(a, torch.Tensor) and (s := _storage(a)) is not None
        }
        for o in tree_flatten(out)[0]:
            # only new storages: not a view or an in-place result of an input
            if (
                isinstance(o, torch.Tensor)
                and (s := _storage(o)) is not None
                and s.data_ptr() not in ins
            ):
                name = str(func.overloadpacket.__name__)
                self.tags[s.data_ptr()] = (name, self.path[-1] if self.path else "")
                # weakly tracked: the ledger must not keep anything alive itself
                self.refs[s.data_ptr()] = (StorageWeakRef(s), list(o.shape), o.dtype, s.nbytes())
        return out


PARAMS = ("fp32", "bf16")
"""fp32: the trainer's path without FSDP (fp32 parameters, autocast casts per op; the residual
stream is fp32). bf16: FSDP2's MixedPrecisionPolicy path (parameters gathered in bf16, autocast
then a no-op; the residual stream is bf16), emulated on one process by casting the model."""


def ledger(
    cfg: ModelConfig, ac: str, *, batch: int, seq: int, params_dtype: str = "fp32", seed: int = 0
) -> dict[str, Any]:
    """Rows (producer, module, shape, dtype, bytes) of what the block keeps, and the planner's
    figure for the same shapes."""
    torch.manual_seed(seed)
    model = build_model(cfg, device="cpu")
    if params_dtype == "bf16":
        model.to(torch.bfloat16)
    apply_ac(model, ac)  # the trainer's wrapper, on the whole model as the trainer applies it
    block = model.layers["0"]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    x = torch.randn(
        batch, seq, cfg.dim, dtype=next(model.parameters()).dtype, requires_grad=True
    )  # the residual stream, in the parameters' dtype
    positions = torch.arange(seq)
    cos, sin = model.rope(positions) if model.rope is not None else (None, None)
    shared = {s.data_ptr() for t in (cos, sin) if t is not None and (s := _storage(t))}

    path: list[str] = []
    # module paths inside the block, without the checkpoint wrapper's prefix
    names = {
        m: n.replace("_checkpoint_wrapped_module", "").lstrip(".") or "block"
        for n, m in block.named_modules()
    }

    def enter(m: torch.nn.Module, _args: object) -> None:
        path.append(names[m])

    def leave(m: torch.nn.Module, _args: object, _out: object) -> None:
        path.pop()

    hooks = [
        h
        for m in names
        for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))
    ]
    packed: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = _storage(t)
        if s is not None:
            packed.setdefault(s.data_ptr(), t)
        return t

    mode = _Producers(path)
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        mode,
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        out = block(x, cos, sin)
    for h in hooks:
        h.remove()
    out_ptr = out.untyped_storage().data_ptr()
    x_ptr = x.untyped_storage().data_ptr()
    # (shape, dtype, bytes) per kept storage: packed by autograd at the block's level, or
    # created in the forward and still alive (kept by autograd or a checkpoint's cache)
    kept: dict[int, tuple[list[int], torch.dtype, int]] = {
        p: (shape, dt, n) for p, (ref, shape, dt, n) in mode.refs.items() if not ref.expired()
    }
    for p, t in packed.items():
        kept.setdefault(p, (list(t.shape), t.dtype, t.untyped_storage().nbytes()))
    kept.pop(out_ptr, None)
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    rows: list[dict[str, Any]] = []
    apart: list[dict[str, Any]] = []
    for ptr, (shape, dtype, nbytes) in kept.items():
        op, mod = mode.tags.get(ptr, ("(block input)" if ptr == x_ptr else "(created outside)", ""))
        row: dict[str, Any] = {
            "producer": op,
            "module": mod,
            "shape": shape,
            "dtype": str(dtype).removeprefix("torch."),
            "bytes": nbytes,
        }
        if ptr in params:
            apart.append({**row, "kind": "parameter"})
        elif op == "_to_copy" and tuple(shape) in weight_shapes and dtype == torch.bfloat16:
            apart.append({**row, "kind": "bf16 weight cast (autocast)"})
        elif ptr in shared:
            apart.append({**row, "kind": "RoPE table (one per model)"})
        else:
            rows.append(row)
    rows.sort(key=lambda r: (-r["bytes"], r["module"], r["producer"]))
    total = sum(r["bytes"] for r in rows)
    analytic = layer_activation_bytes(
        cfg,
        seq_len=seq,
        micro_batch=batch,
        ac=ac,
        precision="bf16",
        residual_fp32=params_dtype == "fp32",
    )
    out.float().sum().backward()  # the graph is whole: backward runs on what was kept
    return {
        "block": cfg.name,
        "ac": ac,
        "params": params_dtype,
        "rows": rows,
        "apart": apart,
        "total": total,
        "analytic": analytic,
        "ratio": total / analytic,
    }


FP32_NOTES = {
    "(block input)": "the fp32 residual stream entering the block: needed (the first norm's "
    "backward reads it; under selective/full it is the recompute's input)",
    "add": "the mid-block residual x + attention(x), fp32: the second norm's input, needed by "
    "its backward",
    "rsqrt": "RMSNorm's fp32 1/rms per token: needed by rms_norm's backward",
    "mul": "RMSNorm's fp32 normalized output x * rstd, saved by `weight * normed` for the "
    "weight's gradient: needed by that gradient, but recomputable from x and rstd, "
    "which are saved anyway (finding F1)",
    "_to_copy": "an fp32 upcast of a bf16 norm input (`x.float()`) saved for backward: not "
    "needed, the bf16 input holds the values exactly (finding F2)",
    "native_layer_norm": "LayerNorm's fp32 mean or rstd per token: needed by layer_norm's backward",
    "_scaled_dot_product_flash_attention_for_cpu": "SDPA's fp32 log-sum-exp: needed (softmax "
    "statistics)",
}


def fp32_note(row: dict[str, Any]) -> str:
    return FP32_NOTES.get(row["producer"], "not explained: look at this tensor")


def _fmt_bytes(n: float) -> str:
    return f"{n:,.0f}"


def findings(results: list[dict[str, Any]]) -> list[str]:
    """Findings computed from the ac=none ledgers (bytes per block at these shapes)."""
    out = []
    for r in results:
        if r["ac"] != "none":
            continue
        rows, tot = r["rows"], r["total"]
        tag = f"{r['block']}, {r['params']} params"
        norm_mul = sum(
            x["bytes"]
            for x in rows
            if x["producer"] == "mul" and x["module"].endswith("_norm") and x["dtype"] == "float32"
        )
        if norm_mul:
            out.append(
                f"- **F1** ({tag}): RMSNorm's fp32 normalized output, saved by "
                f"`weight * normed` for the weight gradient, {norm_mul:,} B "
                f"({norm_mul / tot:.1%} of the block). Needed by that gradient as "
                "written; it equals x * rstd, both already saved, so a hand-written "
                "backward could recompute it. Not changed (a recompute trade, not a "
                "redundant copy)."
            )
        upcast = sum(
            x["bytes"]
            for x in rows
            if x["producer"] == "_to_copy"
            and x["module"].endswith("_norm")
            and x["dtype"] == "float32"
        )
        if upcast:
            out.append(
                f"- **F2** ({tag}): RMSNorm saves the fp32 upcast of its 16-bit input, "
                f"{upcast:,} B ({upcast / tot:.1%}): models/norms.py's `_RMSNorm16` (x and "
                "rstd only) did not run. Regression: look at RMSNorm.forward."
            )
        elif r["params"] == "bf16" and r["block"].startswith("llama"):
            # the norms' inputs (block input, mid-block residual) and their rstd
            kept = [
                x
                for x in rows
                if x["producer"] in ("(block input)", "add")
                or (x["producer"] == "rsqrt" and x["module"].endswith("_norm"))
            ]
            out.append(
                f"- **F2** ({tag}), resolved: RMSNorm over the bf16 stream "
                "(models/norms.py `_RMSNorm16`) saves its bf16 input and an fp32 rstd per "
                "token and recomputes x * rstd in fp32 in backward; no fp32 copy of width h: "
                + ", ".join(f"{x['producer']} {x['dtype']} {x['bytes']:,} B" for x in kept)
                + f". Block total {tot:,} B, was 3,282,944 B with `F.rms_norm(x.float())` "
                "(its fp32 upcast and the bf16 cast-back saved per norm; git b347ab8)."
            )
        casts = [
            x
            for x in rows
            if x["producer"] == "_to_copy"
            and x["dtype"] == "bfloat16"
            and x["module"].split(".")[-1] in {"wq", "wk", "wv", "w1", "w3"}
        ]
        if len(casts) > 2:
            extra = sum(x["bytes"] for x in casts) - 2 * casts[0]["bytes"]
            out.append(
                f"- **F3** ({tag}, bf16 not fp32): autocast casts the fp32 normed input "
                f"once per linear and each linear saves its own copy: {len(casts)} "
                f"copies where one per norm (2) would do, {extra:,} B extra "
                f"({extra / tot:.1%}); the planner counts them."
            )
        stats = [
            x
            for x in rows
            if x["producer"] == "native_layer_norm"
            and x["shape"][-1] == 1
            and x["dtype"] != "float32"
        ]
        if stats:
            out.append(
                f"- **F4** ({tag}): on CPU autocast LayerNorm over bf16 parameters runs "
                f"in bf16, so its mean/rstd are bf16 ({sum(x['bytes'] for x in stats):,}"
                " B); the planner assumes fp32 statistics (CUDA autocast's fp32 "
                f"layer_norm): ledger/analytic {r['ratio']:.4f}."
            )
    return out


def markdown(results: list[dict[str, Any]], batch: int, seq: int) -> str:
    lines = [
        "# Saved-tensor ledger: one block, per activation-checkpointing mode",
        "",
        f"batch {batch}, seq {seq}, bf16 autocast over fp32 parameters (the trainer's CPU "
        "bf16 path), the trainer's `apply_ac`. *ledger*: distinct storages the block "
        "keeps for backward (saved_tensors_hooks + storages created in forward still "
        "alive after it; block output excluded); *analytic*: "
        "`planner.memory.activations.layer_activation_bytes(ac=..., residual_fp32=True)`.",
        "",
        "| block | params | ac | ledger bytes | analytic bytes | ledger / analytic |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['block']} | {r['params']} | {r['ac']} | {_fmt_bytes(r['total'])} | "
            f"{_fmt_bytes(r['analytic'])} | {r['ratio']:.4f} |"
        )
    lines += [
        "",
        "## fp32 tensors kept (bf16 compute)",
        "",
        "| block | params | ac | producer | module | shape | bytes | needed by backward? |",
        "|---|---|---|---|---|---|---:|---|",
    ]
    for r in results:
        for row in r["rows"]:
            if row["dtype"] == "float32":
                lines.append(
                    f"| {r['block']} | {r['params']} | {r['ac']} | {row['producer']} | "
                    f"{row['module']} | {row['shape']} | {_fmt_bytes(row['bytes'])} | "
                    f"{fp32_note(row)} |"
                )
    lines += ["", "## Findings", "", *findings(results)]
    for r in results:
        lines += [
            "",
            f"## {r['block']}, {r['params']} params, ac={r['ac']}",
            "",
            "| producer op | module | shape | dtype | bytes |",
            "|---|---|---|---|---:|",
        ]
        for row in r["rows"]:
            lines.append(
                f"| {row['producer']} | {row['module']} | {row['shape']} | "
                f"{row['dtype']} | {_fmt_bytes(row['bytes'])} |"
            )
        lines.append(f"| **total** | | | | **{_fmt_bytes(r['total'])}** |")
        lines.append(f"| analytic (planner) | | | | {_fmt_bytes(r['analytic'])} |")
        if r["apart"]:
            lines += [
                "",
                "Not counted (not activations): "
                + "; ".join(
                    f"{a['kind']} {a['module']} {a['shape']} {a['dtype']} "
                    f"{_fmt_bytes(a['bytes'])} B"
                    for a in r["apart"]
                ),
            ]
    return "\n".join(lines)


def run(*, dim: int = 256, heads: int = 4, batch: int = 2, seq: int = 128) -> list[dict[str, Any]]:
    cfgs = block_configs(dim, heads, seq)
    return [
        ledger(cfg, ac, batch=batch, seq=seq, params_dtype=pd)
        for pd in PARAMS
        for cfg in cfgs.values()
        for ac in AC_MODES
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args(argv)
    results = run(dim=a.dim, heads=a.heads, batch=a.batch, seq=a.seq)
    md = markdown(results, a.batch, a.seq)
    jpath, mpath = write_results(
        "activation_ledger", {"batch": a.batch, "seq": a.seq, "dim": a.dim, "results": results}, md
    )
    for r in results:
        print(
            f"{r['block']:>11} {r['params']} params ac={r['ac']:<9} ledger "
            f"{r['total']:>10,} B  analytic {r['analytic']:>12,.0f} B  ratio {r['ratio']:.4f}"
        )
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
