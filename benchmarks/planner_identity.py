"""Planner identity: `plan --json` and `explain` byte-identical between two source trees.

A refactor of `planner/` that must not change a number proves it here: every layout of the table
below is planned (`scaletrain plan ... --json`) and explained (`scaletrain explain ...`) by each
tree in its own process (the tree's `src/` on PYTHONPATH), and the two trees' stdout, stderr and
exit status are compared byte for byte. The table covers every recipe (default, megatron,
deepspeed, torchtitan, nanotron, nemo), every parallelism (dp, ZeRO 0-3, HSDP, TP with and
without SP, PP under each schedule, CP, EP), MoE models, fp8, offload, activation checkpointing
and a few searches (no degree given); HSDP, which no `plan` flag reaches, is evaluated through the
planner's API with every field of its breakdowns printed (`API_CASES`).

It also times the search for llama3-405b on 16,384 H100 (seq 8192, global batch 2048) in each
tree, alternating processes, and reports the median after/before ratio (target: <= 1.10).

    python benchmarks/planner_identity.py                      # 109a6fb vs this checkout
    python benchmarks/planner_identity.py --before REV --after REV
    python benchmarks/planner_identity.py --write-outputs DIR  # only this checkout's outputs

A revision is exported with `git archive` into a temporary folder (the working tree is untouched);
`--after` defaults to this checkout's files as they are, uncommitted edits included.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import write_results

REPO = Path(__file__).resolve().parent.parent
BASELINE = "109a6fb"
"""main's HEAD when issue 34 (the planner's spine) was started: the numbers to keep."""

H100 = ["--gpu", "h100-sxm"]

# name -> arguments shared by `plan --json` and `explain`. Each row pins the layout unless it is
# named search-*. Models: gpt2 (LayerNorm, GELU), llama (RMSNorm, SwiGLU, GQA), mixtral / tiny-moe
# (experts). Degrees multiply to --gpus.
LAYOUTS: dict[str, list[str]] = {
    # data parallel, ZeRO and HSDP
    "dp8-z0-llama3-8b": ["--model", "llama3-8b", "--gpus", "8", *H100, "--dp", "8"],
    "dp8-z1-llama3-8b": ["--model", "llama3-8b", "--gpus", "8", *H100, "--dp", "8", "--zero", "1"],
    "dp8-z2-llama3-8b": ["--model", "llama3-8b", "--gpus", "8", *H100, "--dp", "8", "--zero", "2"],
    "dp8-z3-llama3-8b-s8192": [
        *["--model", "llama3-8b", "--gpus", "8", *H100, "--dp", "8", "--zero", "3"],
        *["--seq-len", "8192", "--global-batch", "16", "--micro-batch", "2", "--ac", "selective"],
    ],
    "hsdp-z3-llama3-8b-64": [
        *["--model", "llama3-8b", "--gpus", "64", *H100, "--dp", "64", "--zero", "3"],
        *["--gpus-per-node", "8", "--seq-len", "4096", "--global-batch", "128"],
    ],
    "dp2-z3-gpt2-124m-fp32": [
        *["--model", "gpt2-124m", "--gpus", "2", "--gpu", "a100-40gb", "--dp", "2", "--zero", "3"],
        *["--precision", "fp32", "--seq-len", "1024", "--global-batch", "32"],
    ],
    "dp4-z1-gpt2-350m-fp16": [
        *["--model", "gpt2-350m", "--gpus", "4", "--gpu", "v100-32gb", "--dp", "4", "--zero", "1"],
        *["--precision", "fp16", "--seq-len", "1024", "--global-batch", "64"],
    ],
    "cpu-gpt-mini-default": ["--model", "gpt-mini"],
    "cpu-tiny-dp2": ["--model", "tiny", "--gpus", "2", "--dp", "2"],
    # tensor and sequence parallel
    "tp8-llama3-70b": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--dp", "8", "--tp", "8", "--zero", "1"],
        *["--seq-len", "4096", "--global-batch", "256"],
    ],
    "tp8-sp-llama3-70b": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--dp", "8", "--tp", "8", "--sp"],
        *["--zero", "1", "--seq-len", "4096", "--global-batch", "256", "--ac", "selective"],
    ],
    "tp2-sp-gpt2-774m-z2": [
        *["--model", "gpt2-774m", "--gpus", "8", *H100, "--dp", "4", "--tp", "2", "--sp"],
        *["--zero", "2", "--seq-len", "1024", "--global-batch", "64"],
    ],
    # pipeline schedules
    "pp4-1f1b-llama2-13b": [
        *["--model", "llama2-13b", "--gpus", "16", *H100, "--dp", "2", "--tp", "2", "--pp", "4"],
        *["--pp-schedule", "1f1b", "--seq-len", "4096", "--global-batch", "64"],
    ],
    "pp4-gpipe-llama2-13b": [
        *["--model", "llama2-13b", "--gpus", "16", *H100, "--dp", "2", "--tp", "2", "--pp", "4"],
        *["--pp-schedule", "gpipe", "--seq-len", "4096", "--global-batch", "64"],
    ],
    "pp4-interleaved-v2-llama2-13b": [
        *["--model", "llama2-13b", "--gpus", "16", *H100, "--dp", "2", "--tp", "2", "--pp", "4"],
        *["--pp-schedule", "interleaved", "--pp-virtual", "2", "--seq-len", "4096"],
        *["--global-batch", "64"],
    ],
    "pp4-zero-bubble-llama2-13b": [
        *["--model", "llama2-13b", "--gpus", "16", *H100, "--dp", "2", "--tp", "2", "--pp", "4"],
        *["--pp-schedule", "zero-bubble", "--seq-len", "4096", "--global-batch", "64"],
    ],
    "pp8-tp8-sp-gpt3-175b": [
        *["--model", "gpt3-175b", "--gpus", "1024", "--gpu", "a100-80gb", "--dp", "16"],
        *["--tp", "8", "--sp", "--pp", "8", "--zero", "1", "--seq-len", "2048"],
        *["--global-batch", "1536", "--micro-batch", "1", "--ac", "selective"],
    ],
    "pp2-1f1b-tiny-llama-cpu": [
        *["--model", "tiny-llama", "--gpus", "2", "--pp", "2", "--dp", "1"],
        *["--global-batch", "8", "--micro-batch", "2"],
    ],
    # context parallel
    "cp4-llama3-8b-s8192": [
        *["--model", "llama3-8b", "--gpus", "32", *H100, "--dp", "8", "--cp", "4", "--zero", "3"],
        *["--seq-len", "8192", "--global-batch", "16", "--ac", "full"],
    ],
    "cp2-tp4-sp-llama3-70b": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--dp", "8", "--cp", "2", "--tp", "4"],
        *["--sp", "--zero", "3", "--seq-len", "8192", "--global-batch", "64"],
    ],
    # MoE and expert parallel
    "ep8-mixtral": [
        *["--model", "mixtral-8x7b", "--gpus", "8", *H100, "--dp", "8", "--ep", "8"],
        *["--zero", "3", "--seq-len", "4096", "--global-batch", "32", "--ac", "selective"],
    ],
    "ep8-tp2-sp-mixtral": [
        *["--model", "mixtral-8x7b", "--gpus", "16", *H100, "--dp", "8", "--ep", "8", "--tp"],
        *["2", "--sp", "--zero", "1", "--seq-len", "4096", "--global-batch", "64"],
    ],
    "ep4-pp2-mixtral-fp8": [
        *["--model", "mixtral-8x7b", "--gpus", "16", *H100, "--dp", "8", "--ep", "4", "--pp"],
        *["2", "--zero", "1", "--precision", "fp8", "--seq-len", "4096", "--global-batch", "64"],
    ],
    "ep2-tiny-moe-cpu": [
        *["--model", "tiny-moe", "--gpus", "2", "--dp", "2", "--ep", "2"],
        *["--global-batch", "8"],
    ],
    # fp8, offload, activation checkpointing
    "fp8-z3-llama3-70b": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--dp", "64", "--zero", "3"],
        *["--precision", "fp8", "--seq-len", "8192", "--global-batch", "128", "--ac", "full"],
    ],
    "fp8-tp4-sp-llama3-8b": [
        *["--model", "llama3-8b", "--gpus", "8", *H100, "--dp", "2", "--tp", "4", "--sp"],
        *["--precision", "fp8", "--seq-len", "8192", "--global-batch", "32"],
    ],
    "offload-optimizer-llama2-7b": [
        *["--model", "llama2-7b", "--gpus", "8", *H100, "--dp", "8", "--zero", "2"],
        *["--offload", "optimizer", "--seq-len", "4096", "--global-batch", "64"],
    ],
    "offload-params-llama2-70b": [
        *["--model", "llama2-70b", "--gpus", "16", *H100, "--dp", "16", "--zero", "3"],
        *["--offload", "params", "--seq-len", "4096", "--global-batch", "64", "--ac", "full"],
    ],
    "ac-full-gpt2-774m": [
        *["--model", "gpt2-774m", "--gpus", "4", "--gpu", "rtx4090", "--dp", "4", "--zero", "2"],
        *["--ac", "full", "--seq-len", "1024", "--global-batch", "64"],
    ],
    "ac-selective-compile-llama3-8b": [
        *["--model", "llama3-8b", "--gpus", "8", "--gpu", "h200", "--dp", "8", "--zero", "3"],
        *["--ac", "selective", "--compile", "--seq-len", "8192", "--global-batch", "32"],
    ],
    "mi300x-llama3-70b-z3": [
        *["--model", "llama3-70b", "--gpus", "16", "--gpu", "mi300x", "--dp", "16", "--zero"],
        *["3", "--seq-len", "4096", "--global-batch", "64"],
    ],
    # framework recipes
    "recipe-megatron-gpt3-175b": [
        *["--model", "gpt3-175b", "--gpus", "1024", "--gpu", "a100-80gb", "--dp", "16"],
        *["--tp", "8", "--sp", "--pp", "8", "--zero", "1", "--seq-len", "2048"],
        *["--global-batch", "1536", "--micro-batch", "1", "--ac", "selective"],
        *["--recipe", "megatron"],
    ],
    "recipe-megatron-interleaved-llama2-70b": [
        *["--model", "llama2-70b", "--gpus", "64", *H100, "--dp", "2", "--tp", "8", "--sp"],
        *["--pp", "4", "--pp-schedule", "interleaved", "--pp-virtual", "2", "--zero", "1"],
        *["--seq-len", "4096", "--global-batch", "128", "--micro-batch", "1"],
        *["--recipe", "megatron"],
    ],
    "recipe-nemo-llama3-70b-fp8": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--dp", "4", "--tp", "4", "--sp"],
        *["--pp", "4", "--zero", "1", "--precision", "fp8", "--seq-len", "8192"],
        *["--global-batch", "128", "--micro-batch", "1", "--recipe", "nemo"],
    ],
    "recipe-deepspeed-z3-llama2-13b": [
        *["--model", "llama2-13b", "--gpus", "16", *H100, "--dp", "16", "--zero", "3"],
        *["--seq-len", "4096", "--global-batch", "64", "--recipe", "deepspeed"],
    ],
    "recipe-deepspeed-z1-offload-gpt2-1.5b": [
        *["--model", "gpt2-1.5b", "--gpus", "4", "--gpu", "v100-32gb", "--dp", "4", "--zero"],
        *["2", "--offload", "optimizer", "--precision", "fp16", "--seq-len", "1024"],
        *["--global-batch", "32", "--recipe", "deepspeed"],
    ],
    "recipe-torchtitan-llama3-8b": [
        *["--model", "llama3-8b", "--gpus", "8", *H100, "--dp", "8", "--zero", "3"],
        *["--seq-len", "8192", "--global-batch", "16", "--micro-batch", "2", "--ac"],
        *["selective", "--recipe", "torchtitan"],
    ],
    "recipe-torchtitan-llama3-70b-fp8-tp": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--dp", "8", "--tp", "8", "--sp"],
        *["--zero", "3", "--precision", "fp8", "--seq-len", "8192", "--global-batch", "64"],
        *["--ac", "full", "--recipe", "torchtitan"],
    ],
    "recipe-nanotron-llama3-8b-tp": [
        *["--model", "llama3-8b", "--gpus", "16", *H100, "--dp", "4", "--tp", "4", "--sp"],
        *["--zero", "1", "--seq-len", "4096", "--global-batch", "64", "--recipe", "nanotron"],
    ],
    "recipe-nanotron-pp-llama2-7b": [
        *["--model", "llama2-7b", "--gpus", "16", *H100, "--dp", "4", "--tp", "2", "--pp"],
        *["2", "--zero", "1", "--seq-len", "4096", "--global-batch", "64"],
        *["--recipe", "nanotron"],
    ],
    "recipe-scaletrain-mixtral-ep": [
        *["--model", "mixtral-8x7b", "--gpus", "8", *H100, "--dp", "8", "--ep", "8", "--zero"],
        *["3", "--seq-len", "4096", "--global-batch", "32", "--recipe", "scaletrain"],
    ],
    # searches: the best layouts (a list in --json)
    "search-llama3-70b-64": [
        *["--model", "llama3-70b", "--gpus", "64", *H100, "--seq-len", "8192"],
        *["--global-batch", "512"],
    ],
    "search-mixtral-16": [
        *["--model", "mixtral-8x7b", "--gpus", "16", *H100, "--seq-len", "4096"],
        *["--global-batch", "64"],
    ],
    "search-gpt2-124m-8-megatron": [
        *["--model", "gpt2-124m", "--gpus", "8", "--gpu", "a100-40gb", "--seq-len", "1024"],
        *["--global-batch", "64", "--recipe", "megatron"],
    ],
    "search-llama2-7b-8-deepspeed-top3": [
        *["--model", "llama2-7b", "--gpus", "8", *H100, "--seq-len", "4096"],
        *["--global-batch", "64", "--recipe", "deepspeed", "--top", "3"],
    ],
}

API_CASES = """
from scaletrain.config import Layout, hardware_preset, resolve_model
from scaletrain.planner import PlanInput, estimate
H100 = hardware_preset("h100-sxm")
CASES = {  # HSDP has no `plan` flag (parallel.dp_replicate): planned through the API
    "hsdp-r8-z3-llama3-8b": ("llama3-8b", 64, Layout(dp=64, zero=3, dp_replicate=8), 4096, 128, 1),
    "hsdp-r4-z2-tp2-llama3-70b": (
        "llama3-70b", 64, Layout(dp=32, zero=2, dp_replicate=4, tp=2, sp=True), 4096, 64, 1
    ),
    "hsdp-r2-z3-ep4-mixtral": (
        "mixtral-8x7b", 16, Layout(dp=16, zero=3, dp_replicate=2, ep=4), 4096, 32, 1
    ),
}
for name, (model, gpus, layout, seq, gb, mb) in CASES.items():
    for recipe in ("scaletrain", "torchtitan"):
        plan = PlanInput(model=resolve_model(model), hardware=H100, num_gpus=gpus, layout=layout,
                         seq_len=seq, global_batch=gb, micro_batch=mb, recipe=recipe)
        e = estimate(plan)
        print(f"== {name} {recipe}", e.memory, e.time, e.flops_per_token, e.tokens_per_s, e.mfu,
              e.notes, sep="\\n")
"""
"""Layouts no `plan` flag reaches, evaluated through `scaletrain.planner.estimate`: every field of
the memory and time breakdowns (named buffer terms and communication terms included) printed."""

SEARCH_CASE = ("llama3-405b", 16384, 8192, 2048)
"""The search timed: model, H100 GPUs, sequence length, global batch (benchmarks/planner_search)."""

_TIME_SEARCH = """
import sys, time
from scaletrain.config import hardware_preset, resolve_model
try:  # planner/search/layouts.py since issue 34's topic packages; planner/search.py before
    from scaletrain.planner.search.layouts import search
except ModuleNotFoundError:
    from scaletrain.planner.search import search
name, gpus, seq, gb, repeats = sys.argv[1], *map(int, sys.argv[2:])
model, hw, best = resolve_model(name), hardware_preset("h100-sxm"), float("inf")
for _ in range(repeats):
    t0 = time.perf_counter()
    search(model, hw, gpus, seq_len=seq, global_batch=gb)
    best = min(best, time.perf_counter() - t0)
print(best)
"""


def export_tree(rev: str, into: Path) -> Path:
    """The files of `rev` under `into` (git archive: the working tree is not touched)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "tree.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), rev, "src"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree / "src"), "COLUMNS": "100"}


def _run_one(tree: Path, argv: list[str]) -> bytes:
    """stdout, then stderr and the exit status, of `scaletrain ARGV` run from `tree`."""
    p = subprocess.run(
        [sys.executable, "-m", "scaletrain", *argv], env=_env(tree), capture_output=True
    )
    return p.stdout + b"\n--- stderr ---\n" + p.stderr + f"\n--- exit {p.returncode}\n".encode()


def tree_outputs(tree: Path, workers: int = 2) -> dict[str, bytes]:
    """`plan --json` and `explain` of every layout, from `tree`: {"NAME.plan.json": bytes, ...},
    and the API_CASES' breakdowns ("api-hsdp.txt")."""
    jobs = {}
    for name, args in LAYOUTS.items():
        jobs[f"{name}.plan.json"] = ["plan", *args, "--json"]
        jobs[f"{name}.explain.txt"] = ["explain", *args]
    with ThreadPoolExecutor(workers) as pool:
        outs = pool.map(lambda argv: _run_one(tree, argv), jobs.values())
        found = dict(zip(jobs, outs))
    p = subprocess.run([sys.executable, "-c", API_CASES], env=_env(tree), capture_output=True)
    found["api-hsdp.txt"] = p.stdout + p.stderr + f"\n--- exit {p.returncode}\n".encode()
    return found


def search_seconds(tree: Path, repeats: int) -> float:
    """Best of `repeats` searches of SEARCH_CASE, in a fresh process running `tree`."""
    case = [str(x) for x in SEARCH_CASE]
    p = subprocess.run(
        [sys.executable, "-c", _TIME_SEARCH, *case, str(repeats)],
        env=_env(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(p.stdout.strip())


def _tree(rev: str | None, tmp: Path, label: str) -> Path:
    return REPO if rev is None else export_tree(rev, tmp / label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=BASELINE, help="revision to compare against")
    ap.add_argument("--after", default=None, help="revision (default: this checkout as it is)")
    ap.add_argument("--pairs", type=int, default=5, help="alternated search timings per tree")
    ap.add_argument("--repeats", type=int, default=3, help="searches per timing (best kept)")
    ap.add_argument("--write-outputs", metavar="DIR", help="write this tree's outputs and stop")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="planner-identity-") as tmp_name:
        tmp = Path(tmp_name)
        after = _tree(args.after, tmp, "after")
        if args.write_outputs:
            out = Path(args.write_outputs)
            out.mkdir(parents=True, exist_ok=True)
            for name, data in tree_outputs(after).items():
                (out / name).write_bytes(data)
            print(f"{len(LAYOUTS)} layouts, {2 * len(LAYOUTS)} outputs -> {out}")
            return
        before = export_tree(args.before, tmp / "before")
        old, new = tree_outputs(before), tree_outputs(after)
        differ = sorted(k for k in old if old[k] != new[k])
        failed = sorted(k for k in new if not new[k].endswith(b"--- exit 0\n"))
        for k in differ:
            print(f"DIFFERS: {k}")
        times: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(args.pairs):  # alternate, and swap who goes first: the host is shared
            order = [("before", before), ("after", after)]
            for label, tree in order if i % 2 == 0 else order[::-1]:
                times[label].append(search_seconds(tree, args.repeats))
    ratio = statistics.median(times["after"]) / statistics.median(times["before"])
    print(f"{len(old) - len(differ)}/{len(old)} outputs identical; search after/before {ratio:.3f}")
    data = {
        "before": args.before,
        "after": args.after or "working tree",
        "layouts": LAYOUTS,
        "outputs": len(old),
        "identical": len(old) - len(differ),
        "differ": differ,
        "nonzero_exit": failed,
        "search_case": dict(zip(["model", "gpus", "seq_len", "global_batch"], SEARCH_CASE)),
        "search_s": times,
        "search_ratio_median": ratio,
        "load_avg_1m_end": os.getloadavg()[0],
    }
    verdict = "**byte-identical**" if not differ else f"**{len(differ)} differ**: {differ}"
    md = [
        "# Planner identity",
        "",
        f"`plan --json` and `explain` over {len(LAYOUTS)} layouts ({len(old)} outputs: stdout,"
        f" stderr and exit status), {args.before} vs {args.after or 'the working tree'}: "
        f"{verdict}. Exiting non-zero in both trees (refused layouts, compared all the same): "
        f"{', '.join(failed) or 'none'}.",
        "",
        f"Search time, {SEARCH_CASE[0]} on {SEARCH_CASE[1]:,} H100 (seq {SEARCH_CASE[2]}, global "
        f"batch {SEARCH_CASE[3]}), best of {args.repeats} per process, {args.pairs} alternated "
        f"pairs: median after/before **{ratio:.3f}** (target <= 1.10).",
        "",
        "| tree | search s (each process) | median |",
        "|---|---|---|",
    ]
    for label, ts in times.items():
        md.append(
            f"| {label} | {', '.join(f'{t:.2f}' for t in ts)} | {statistics.median(ts):.2f} |"
        )
    md += ["", "| layout | arguments |", "|---|---|"]
    md += [f"| {name} | `{' '.join(a)}` |" for name, a in LAYOUTS.items()]
    write_results("planner_identity", data, "\n".join(md))
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
