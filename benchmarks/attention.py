"""Naive vs SDPA attention: forward+backward time and memory against sequence length.

One causal attention core (`scaletrain.models.attention.NaiveAttentionCore` /
`SDPAAttentionCore`), batch 1, 8 heads x 64, fp32 on CPU (bf16 on CUDA), q/k/v leaf tensors
requiring grad, so the numbers are the core's alone (the projections add the same linear term
to both backends).

Memory, two numbers per point (CPU has no allocator statistics, so both are counted from the
tensors themselves; on CUDA `torch.cuda.max_memory_allocated` is reported too):
- saved: bytes autograd keeps for backward, counted with `torch.autograd.graph.saved_tensors_hooks`
  over distinct storages (q/k/v themselves excluded). This is the activation memory a layer adds
  per micro-batch in training.
- peak: the transient high-water mark of live tensor bytes created during forward+backward
  (a `TorchDispatchMode` adds each new output storage and a weakref finalizer subtracts it when
  freed); it includes temporaries such as the fp32 scores and the gradients. It ignores scratch
  buffers a kernel allocates internally without returning them (SDPA's per-thread tiles on CPU,
  a few hundred KiB) and allocator rounding.

The log-log slope of memory against sequence length is fitted by least squares over all points:
about 2 for naive (the (T, T) scores and probabilities), about 1 for SDPA (q, k, v, out and the
log-sum-exp).

Before any point runs, the largest point's planned memory (`planned_bytes`: the planner's
S x S terms of `planner/memory/naive_attention.py` plus the core's (T, hd) tensors) is held
against the memory `scaletrain train` checks (`orchestrate.available_memory`: the host's
MemAvailable, or the GPU's free memory): points that would not fit are dropped in one line
(naive first: its memory is quadratic), or the run is refused when not even the smallest
fits; `--force` runs every point anyway.

    python benchmarks/attention.py [--max-seq 8192] [--repeats 3] [--force]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write_results  # noqa: E402
from scaletrain.models.attention import NaiveAttentionCore, SDPAAttentionCore  # noqa: E402

BACKENDS = {"naive": NaiveAttentionCore, "sdpa": SDPAAttentionCore}
CPU_SEQS = (512, 1024, 2048, 4096, 8192)
GPU_SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
HEADS, HEAD_DIM, BATCH = 8, 64, 1


class LiveBytes(TorchDispatchMode):
    """High-water mark of bytes held by tensors created under the mode (see module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.current = self.peak = 0
        self._live: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key = id(st)
                if key in self._live:  # a view of a storage already counted
                    continue
                self._live.add(key)
                self.current += st.nbytes()
                self.peak = max(self.peak, self.current)
                weakref.finalize(st, self._free, key, st.nbytes())
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self._live.discard(key)
        self.current -= nbytes


def _inputs(seq: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(0)
    return [
        torch.randn(BATCH, HEADS, seq, HEAD_DIM, generator=g).to(device, dtype).requires_grad_()
        for _ in range(3)
    ]  # (B, nh, T, hd)


def _fwd_bwd(core: torch.nn.Module, q, k, v) -> None:
    out = core(q, k, v)
    out.backward(torch.ones_like(out))


def saved_bytes(core: torch.nn.Module, q, k, v) -> int:
    """Bytes of the distinct storages autograd saves in one forward, inputs excluded."""
    inputs = {id(t.untyped_storage()) for t in (q, k, v)}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if id(st) not in inputs:
            seen[id(st)] = st.nbytes()
        # a detached alias: `t` itself would tie a saved output (softmax's probs) into a
        # reference cycle with its own grad_fn, alive until the garbage collector runs, i.e.
        # during the timed forward+backward that follows (naive at T=4096: host memory grew
        # by 16.7 x P bytes instead of 12.4 x P, P = heads x T^2)
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = core(q, k, v)
    total = sum(seen.values())
    del out
    return total


def measure(
    backend: str, seq: int, *, repeats: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    core = BACKENDS[backend]()
    q, k, v = _inputs(seq, device, dtype)
    saved = saved_bytes(core, q, k, v)
    with LiveBytes() as live:
        _fwd_bwd(core, q, k, v)
    for t in (q, k, v):
        t.grad = None
    cuda = device.type == "cuda"
    times: list[float] = []
    # the tracked run above warmed kernels up; long points stop after 20 s of timed runs
    for i in range(repeats):
        if i and sum(times) > 20.0:
            break
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        _fwd_bwd(core, q, k, v)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        for t in (q, k, v):
            t.grad = None
    row = {
        "backend": backend,
        "seq": seq,
        "fwd_bwd_s": statistics.median(times),
        "timed_runs": len(times),
        "saved_bytes": saved,
        "peak_bytes": live.peak,
    }
    if cuda:
        row["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return row


def planned_bytes(backend: str, seq: int, *, elem_bytes: int) -> float:
    """Peak bytes one point's forward+backward is planned to hold: q, k, v, the output and
    the gradients of all four, (B, nh, T, hd) each; SDPA adds its fp32 log-sum-exp per row;
    naive adds the S x S tensors the planner counts for its core (saved for backward, then
    what its backward holds at once beyond them: `naive_saved_bytes` + `naive_backward_bytes`,
    12.1 x P bytes in fp32 with one query head per KV head, P = B x heads x T^2). Ignores
    kernel scratch (SDPA's CPU tiles, a few hundred KiB) and the process's own memory (torch
    imported, ~0.2 GiB). Against it: naive T=4096 fp32 (`measure`, this host), the process's
    resident memory grew by 13.1 x P bytes, the plan says 12.6 x P (4% under)."""
    from scaletrain.config import ModelConfig
    from scaletrain.planner.memory.naive_attention import naive_backward_bytes, naive_saved_bytes

    linear = 8 * BATCH * HEADS * seq * HEAD_DIM * elem_bytes
    if backend == "sdpa":
        return linear + BATCH * HEADS * seq * 4
    model = ModelConfig(dim=HEADS * HEAD_DIM, num_heads=HEADS, num_kv_heads=HEADS)
    dims = {"seq_len": seq, "micro_batch": BATCH, "tp": 1, "cp": 1, "e": elem_bytes}
    return linear + naive_saved_bytes(model, **dims) + naive_backward_bytes(model, **dims)


def fit_points(
    seqs: list[int], naive_max: int, available: tuple[float, str], *, elem_bytes: int
) -> tuple[list[int], int, str]:
    """(the sequence lengths to run, naive's largest, the line that says so): the points whose
    `planned_bytes` exceed `available` (bytes, where) are dropped, naive's first. Raises
    SystemExit(2) with one line when not even the smallest SDPA point fits."""
    from scaletrain.config import fmt_bytes

    avail, where = available

    def fits(b: str, s: int) -> bool:
        return planned_bytes(b, s, elem_bytes=elem_bytes) <= avail

    ok_seqs = [s for s in seqs if fits("sdpa", s)]
    ok_naive = max((s for s in seqs if s <= naive_max and fits("naive", s)), default=0)
    if not ok_seqs:
        need = fmt_bytes(planned_bytes("sdpa", min(seqs), elem_bytes=elem_bytes))
        print(
            f"attention: error: even sdpa at seq {min(seqs)} is planned at {need}, more than "
            f"the {where} {fmt_bytes(avail)}: lower --min-seq, free memory, or give --force",
            file=sys.stderr,
        )
        raise SystemExit(2)
    candidates = [("sdpa", max(ok_seqs))] + ([("naive", ok_naive)] if ok_naive else [])
    largest = max(candidates, key=lambda p: planned_bytes(*p, elem_bytes=elem_bytes))
    planned = planned_bytes(*largest, elem_bytes=elem_bytes)
    said = (
        f"the largest point ({largest[0]}, seq {largest[1]}) is planned at {fmt_bytes(planned)} "
        f"and the {where} is {fmt_bytes(avail)}"
    )
    asked_naive = max((s for s in seqs if s <= naive_max), default=0)
    dropped = []
    if ok_naive < asked_naive:
        dropped.append(f"naive above seq {ok_naive}" if ok_naive else "every naive point")
    if len(ok_seqs) < len(seqs):
        dropped.append(f"every point above seq {max(ok_seqs)}")
    if not dropped:
        return seqs, naive_max, f"memory check: {said}: margin {fmt_bytes(avail - planned)}"
    return (
        ok_seqs,
        ok_naive,
        f"memory check: {said}; dropped {' and '.join(dropped)} (they would not fit; "
        "--force runs them anyway)",
    )


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"slopes": {}, "ratio_at_max_seq": {}}
    for b in BACKENDS:
        rs = [r for r in rows if r["backend"] == b]
        if len(rs) >= 2:
            seqs = [r["seq"] for r in rs]
            out["slopes"][b] = {
                key: loglog_slope(seqs, [r[key] for r in rs])
                for key in ("saved_bytes", "peak_bytes", "fwd_bwd_s")
            }
    seqs = {r["seq"] for r in rows if r["backend"] == "naive"} & {
        r["seq"] for r in rows if r["backend"] == "sdpa"
    }
    if seqs:
        s = max(seqs)
        n = next(r for r in rows if r["backend"] == "naive" and r["seq"] == s)
        f = next(r for r in rows if r["backend"] == "sdpa" and r["seq"] == s)
        out["ratio_at_max_seq"] = {
            "seq": s,
            **{k: n[k] / f[k] for k in ("saved_bytes", "peak_bytes", "fwd_bwd_s")},
        }
    return out


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    from _plots import plt, save

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for b, color in zip(BACKENDS, ("#C44E52", "#4C72B0"), strict=True):
        rs = [r for r in rows if r["backend"] == b]
        seqs = [r["seq"] for r in rs]
        ax_t.plot(seqs, [1e3 * r["fwd_bwd_s"] for r in rs], "o-", color=color, label=b)
        ax_m.plot(
            seqs,
            [r["peak_bytes"] / 2**20 for r in rs],
            "o-",
            color=color,
            label=f"{b}: transient peak",
        )
        ax_m.plot(
            seqs,
            [r["saved_bytes"] / 2**20 for r in rs],
            "s--",
            color=color,
            label=f"{b}: saved for backward",
        )
    for ax, yl in ((ax_t, "forward+backward ms"), (ax_m, "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_title("time")
    ax_m.set_title("memory")
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def markdown(rows: list[dict[str, Any]], summ: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# Attention: naive vs SDPA, forward+backward",
        "",
        f"One causal attention core, batch {BATCH}, {HEADS} heads x {HEAD_DIM}, "
        f"{meta['dtype']} on {meta['device']} ({meta['threads']} threads), median of up to "
        f"{meta['repeats']} timed runs after one warm-up (fewer once 20 s are spent); "
        f"host load average at start {meta['loadavg']} (other jobs shared the 2 cores, "
        "so times are indicative; the memory columns do not depend on load).",
        "",
        "| seq | backend | fwd+bwd ms | saved for backward MiB | transient peak MiB |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["seq"], r["backend"])):
        lines.append(
            f"| {r['seq']} | {r['backend']} | {1e3 * r['fwd_bwd_s']:.1f} | "
            f"{r['saved_bytes'] / 2**20:.1f} | {r['peak_bytes'] / 2**20:.1f} |"
        )
    lines += [
        "",
        "Log-log slope of each quantity against sequence length (least squares over "
        "all points; 1 = linear, 2 = quadratic):",
        "",
        "| backend | saved | peak | time |",
        "|---|---|---|---|",
    ]
    for b, s in summ["slopes"].items():
        lines.append(
            f"| {b} | {s['saved_bytes']:.2f} | {s['peak_bytes']:.2f} | {s['fwd_bwd_s']:.2f} |"
        )
    rat = summ.get("ratio_at_max_seq")
    if rat:
        lines += [
            "",
            f"At {rat['seq']} tokens naive / SDPA: saved memory "
            f"x{rat['saved_bytes']:.0f}, transient peak x{rat['peak_bytes']:.0f}, "
            f"time x{rat['fwd_bwd_s']:.2f}.",
        ]
    lines += [
        "",
        "**Method.** *saved*: bytes of the distinct storages autograd packs for "
        "backward (`torch.autograd.graph.saved_tensors_hooks`; q/k/v excluded) — the "
        "activation memory the layer holds between forward and backward. *transient "
        "peak*: high-water mark of live bytes of every tensor created during forward + "
        "backward, tracked by a `TorchDispatchMode` that adds each new output storage and "
        "subtracts it when a weakref finalizer sees it freed (temporaries and gradients "
        "included; kernel-internal scratch and allocator rounding are not). CPU has no "
        "allocator statistics; on CUDA `max_memory_allocated` is in the JSON too.",
        "",
        "Naive keeps the (T, T) fp32 probabilities (and a bool mask) for backward, "
        "so its memory grows as T²; SDPA's CPU flash kernel keeps q, k, v, the output and "
        "an fp32 log-sum-exp per row, linear in T.",
        "",
        "![attention](attention.png)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, available: tuple[float, str] | None = None) -> int:
    """`available`: (bytes, where) to check the points against; default the memory `scaletrain
    train` checks (`orchestrate.available_memory`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    ap.add_argument("--max-seq", type=int, default=max(GPU_SEQS if cuda else CPU_SEQS))
    ap.add_argument("--min-seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--naive-max-seq",
        type=int,
        default=None,
        help="skip naive above this length (its T² memory); default: --max-seq",
    )
    ap.add_argument("--no-write", action="store_true", help="print only (smoke tests)")
    ap.add_argument(
        "--force",
        action="store_true",
        help="run every point even where its planned memory exceeds what is available",
    )
    args = ap.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    seqs = [s for s in (GPU_SEQS if cuda else CPU_SEQS) if args.min_seq <= s <= args.max_seq]
    if args.max_seq not in seqs and args.max_seq >= args.min_seq:
        seqs.append(args.max_seq)
    naive_max = args.naive_max_seq or args.max_seq
    if seqs and not args.force:
        from scaletrain.orchestrate import available_memory

        seqs, naive_max, line = fit_points(
            seqs,
            naive_max,
            available or available_memory(device.type),
            elem_bytes=torch.finfo(dtype).bits // 8,
        )
        print(line, flush=True)
    rows = []
    for seq in seqs:
        for b in BACKENDS:
            if b == "naive" and seq > naive_max:
                continue
            t0 = time.perf_counter()
            r = measure(b, seq, repeats=args.repeats, device=device, dtype=dtype)
            rows.append(r)
            print(
                f"seq {seq:6d} {b:5s} {1e3 * r['fwd_bwd_s']:9.1f} ms  saved "
                f"{r['saved_bytes'] / 2**20:9.1f} MiB  peak {r['peak_bytes'] / 2**20:9.1f} MiB"
                f"  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    summ = summarize(rows)
    if summ["slopes"]:
        print("log-log slope against seq (1 = linear, 2 = quadratic):")
        print(f"  {'backend':<8} {'saved':>6} {'peak':>6} {'time':>6}")
        for b, sl in summ["slopes"].items():
            print(
                f"  {b:<8} {sl['saved_bytes']:6.2f} {sl['peak_bytes']:6.2f} {sl['fwd_bwd_s']:6.2f}"
            )
    if args.no_write:
        return 0
    meta = {
        "device": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "loadavg": tuple(round(x, 2) for x in os.getloadavg()),
        "batch": BATCH,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(
        rows,
        RESULTS / "attention.png",
        f"causal attention core, B={BATCH}, {HEADS}x{HEAD_DIM}, {meta['dtype']}, {device.type}",
    )
    write_results("attention", {"meta": meta, "rows": rows, **summ}, markdown(rows, summ, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
