"""Planner search speed: layouts evaluated per second, search wall time, CPU seconds.

The 405B search's CPU seconds can be timed side by side with a baseline revision (below).

Cases: llama3-70b on 64 H100 (seq 8192, global batch 512: the CLI acceptance case) and
llama3-405b on 16,384 H100 (seq 8192, global batch 2048). "Evaluated" counts every legal
layout whose worst-rank memory was computed (memory probes included; the time model runs only
for those that fit); candidates skipped by pruning are not counted. Also times the CLI end to
end (Python start-up included). Targets: >= 20,000 layouts/s, 405b search < 2 s.

CPU seconds (issue 34: the 405B search not more than 10% slower than 109a6fb's), with
--baseline REV: each tree (this checkout's src/, and REV's exported with `git archive`; a
minute or two more) runs in fresh processes,
alternated, each timing with time.process_time a cold search (the first in the process: its
caches empty) and then the best of 3 warm ones; the best of the rounds is kept per tree. CPU
seconds hold up under a shared host's load where wall seconds do not (2 cores shared by several
sessions), though a loaded host still inflates them somewhat: compare the two trees of one run.

The machine is shared: each wall figure is the best of `--repeats` runs (default 3), and the
1-minute load average is recorded before and after each case (on 2 cores a load of 10 leaves a
process a fraction of a core, so the same code can measure 2-3x slower).

    python benchmarks/planner_search.py                       # this tree only
    python benchmarks/planner_search.py --baseline 109a6fb    # + CPU seconds beside it
    python benchmarks/planner_search.py --baseline REV --rounds N
    python benchmarks/planner_search.py --cachegrind 109a6fb  # + instructions beside it

Instructions (--cachegrind REV; needs valgrind): the 405B search's instructions executed, counted
by cachegrind (Ir), which no load on the host moves. Each tree runs three processes under
cachegrind (PYTHONHASHSEED=0), doing 0, 1 and 2 searches: cold = Ir(1) - Ir(0) (the first
search, its caches empty, with the imports it triggers), warm = Ir(2) - Ir(1) (a second search
in the same process). Each process takes minutes under valgrind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_results
from planner_identity import BASELINE, REPO, export_tree
from scaletrain.config import hardware_preset, resolve_model
from scaletrain.planner.search.layouts import search
from scaletrain.planner.types import layout_label

CASES = [("llama3-70b", 64, 8192, 512), ("llama3-405b", 16384, 8192, 2048)]
CLI = [
    "plan",
    "--model",
    "llama3-70b",
    "--gpus",
    "64",
    "--gpu",
    "h100-sxm",
    "--seq-len",
    "8192",
    "--global-batch",
    "512",
]


_CPU_SEARCH = """
import sys, time
from scaletrain.config import hardware_preset, resolve_model
try:  # planner/search/layouts.py since issue 34's topic packages; planner/search.py before
    from scaletrain.planner.search.layouts import search
except ModuleNotFoundError:
    from scaletrain.planner.search import search
model, hw = resolve_model("llama3-405b"), hardware_preset("h100-sxm")
def timed():
    t0 = time.process_time()
    res = search(model, hw, 16384, seq_len=8192, global_batch=2048)
    return time.process_time() - t0, res.evaluated
cold, evaluated = timed()
warm = min(timed()[0] for _ in range(3))
print(cold, warm, evaluated)
"""
"""One fresh process: the cold 405B search's CPU seconds, then the best of 3 warm ones."""


def cpu_seconds(src: Path) -> tuple[float, float, int]:
    """(cold, best warm CPU seconds, layouts evaluated) of the 405B search, `src` on the path."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CPU_SEARCH], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def side_by_side(baseline: str, rounds: int) -> dict:
    """The 405B search's CPU seconds of `baseline` and of this checkout, alternated."""
    with tempfile.TemporaryDirectory(prefix="planner-search-") as tmp:
        trees = {baseline: export_tree(baseline, Path(tmp) / "baseline") / "src"}
        trees["this tree"] = REPO / "src"
        runs: dict[str, list[tuple[float, float, int]]] = {k: [] for k in trees}
        load = [os.getloadavg()[0]]
        for _ in range(rounds):
            for name, src in trees.items():
                runs[name].append(cpu_seconds(src))
        load.append(os.getloadavg()[0])
    best = {
        k: {"cold": min(r[0] for r in v), "warm": min(r[1] for r in v), "evaluated": v[0][2]}
        for k, v in runs.items()
    }
    ratio = {kind: best["this tree"][kind] / best[baseline][kind] for kind in ("cold", "warm")}
    print(f"CPU seconds: {best} ratio {ratio} load {load}")
    return {"baseline": baseline, "runs": runs, "best": best, "ratio": ratio, "load_avg_1m": load}


_CG_SEARCH = """
import sys
from scaletrain.config import hardware_preset, resolve_model
try:  # planner/search/layouts.py since issue 34's topic packages; planner/search.py before
    from scaletrain.planner.search.layouts import search
except ModuleNotFoundError:
    from scaletrain.planner.search import search
model, hw = resolve_model("llama3-405b"), hardware_preset("h100-sxm")
for _ in range(int(sys.argv[1])):
    search(model, hw, 16384, seq_len=8192, global_batch=2048)
"""
"""A process running argv[1] 405B searches (`instructions`)."""


def instructions(src: Path, searches: int) -> int:
    """Instructions executed (cachegrind's Ir) by a fresh process with `src` on the path that
    runs `searches` 405B searches (`_CG_SEARCH`)."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="planner-cg-") as tmp:
        out = Path(tmp) / "cachegrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={out}",
                sys.executable,
                "-c",
                _CG_SEARCH,
                str(searches),
            ],
            env=env,
            capture_output=True,
            check=True,
        )
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no cachegrind summary in {out}")


def cachegrind_side_by_side(baseline: str) -> dict:
    """The 405B search's instructions, cold and warm (`instructions`), of `baseline` and of
    this checkout; the three processes of a tree run two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory(prefix="planner-search-") as tmp:
        trees = {baseline: export_tree(baseline, Path(tmp) / "baseline") / "src"}
        trees["this tree"] = REPO / "src"
        jobs = [(name, n) for name in trees for n in (0, 1, 2)]
        with ThreadPoolExecutor(2) as pool:
            counts = list(pool.map(lambda job: instructions(trees[job[0]], job[1]), jobs))
    ir = {name: [c for (k, _), c in zip(jobs, counts, strict=True) if k == name] for name in trees}
    out = {
        name: {"start": c[0], "cold": c[1] - c[0], "warm": c[2] - c[1]} for name, c in ir.items()
    }
    ratio = {kind: out["this tree"][kind] / out[baseline][kind] for kind in ("cold", "warm")}
    print(f"Instructions: {out} ratio {ratio}")
    return {"baseline": baseline, "instructions": out, "ratio": ratio}


def _cachegrind_table(cg: dict) -> list[str]:
    """The markdown of `cachegrind_side_by_side`'s figures."""
    base = cg["baseline"]
    md = [
        f"## llama3-405b / 16,384 H100: instructions beside {base}",
        "",
        "cachegrind's Ir (instructions executed, not moved by the host's load), PYTHONHASHSEED=0: "
        "cold = a process with one search minus one with none, warm = two searches minus one. "
        "Issue 34's target: no more than 10% over the baseline.",
        "",
        "| tree | start-up G | cold search G | warm search G |",
        "|---|---|---|---|",
    ]
    for name, c in cg["instructions"].items():
        md.append(
            f"| {name} | {c['start'] / 1e9:.2f} | {c['cold'] / 1e9:.2f} | {c['warm'] / 1e9:.2f} |"
        )
    return md + [
        "",
        f"This tree / {base}: cold **{cg['ratio']['cold']:.3f}**, warm "
        f"**{cg['ratio']['warm']:.3f}**.",
        "",
    ]


def _cpu_table(cpu: dict, rounds: int) -> list[str]:
    """The markdown of `side_by_side`'s figures."""
    base = cpu["baseline"]
    md = [
        f"## llama3-405b / 16,384 H100: CPU seconds beside {base}",
        "",
        f"Fresh processes, {rounds} alternated rounds per tree; each the cold search (the "
        "first in its process) then the best of 3 warm ones; best round kept. Load (1 min) "
        f"{cpu['load_avg_1m'][0]:.1f} -> {cpu['load_avg_1m'][1]:.1f}. Issue 34's target: no "
        "more than 10% over the baseline.",
        "",
        "| tree | layouts evaluated | cold CPU s | warm CPU s | rounds (cold / warm) |",
        "|---|---|---|---|---|",
    ]
    for name, b in cpu["best"].items():
        each = ", ".join(f"{c:.2f} / {w:.2f}" for c, w, _ in cpu["runs"][name])
        md.append(f"| {name} | {b['evaluated']:,} | {b['cold']:.2f} | {b['warm']:.2f} | {each} |")
    layouts = cpu["best"]["this tree"]["evaluated"] / cpu["best"][base]["evaluated"]
    return md + [
        "",
        f"This tree / {base}: cold **{cpu['ratio']['cold']:.2f}**, warm "
        f"**{cpu['ratio']['warm']:.2f}** (the search evaluates {layouts:.2f}x the layouts).",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help=f"revision timed beside this checkout (e.g. {BASELINE})")
    ap.add_argument("--rounds", type=int, default=3, help="alternated fresh processes per tree")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per wall figure, the best kept (default 3: the machine is shared)",
    )
    ap.add_argument(
        "--cachegrind",
        metavar="REV",
        help=f"count the 405B search's instructions beside REV's (valgrind; e.g. {BASELINE})",
    )
    args = ap.parse_args(argv)
    repeats = args.repeats
    cpu = side_by_side(args.baseline, args.rounds) if args.baseline else None
    cg = cachegrind_side_by_side(args.cachegrind) if args.cachegrind else None
    hw = hardware_preset("h100-sxm")
    rows = []
    for name, gpus, seq, gb in CASES:
        load_before = os.getloadavg()[0]
        best_t = float("inf")
        for _ in range(repeats):  # best of N: the machine is shared
            t0 = time.perf_counter()
            res = search(resolve_model(name), hw, gpus, seq_len=seq, global_batch=gb)
            best_t = min(best_t, time.perf_counter() - t0)
        rows.append(
            {
                "model": name,
                "gpus": gpus,
                "seq_len": seq,
                "global_batch": gb,
                "seconds": best_t,
                "evaluated": res.evaluated,
                "legal": res.legal,
                "fitting": res.fitting,
                "layouts_per_s": res.evaluated / best_t,
                "best": layout_label(res.top[0]) if res.top else None,
                "best_step_s": res.top[0].time.step_s if res.top else None,
                "best_mfu": res.top[0].mfu if res.top else None,
                "load_avg_1m": [load_before, os.getloadavg()[0]],
            }
        )
        print(rows[-1])
    cli = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "scaletrain", *CLI], check=True, capture_output=True)
        cli = min(cli, time.perf_counter() - t0)
    print(f"CLI acceptance command: {cli:.2f} s")
    md = [
        "# Planner search speed",
        "",
        "| model | GPUs | seq | global batch | search s | evaluated | legal | fit | "
        "layouts/s | best layout | step s | MFU | load (1 min) |",
        "|" + "---|" * 13,
    ]
    for r in rows:
        md.append(
            f"| {r['model']} | {r['gpus']} | {r['seq_len']} | {r['global_batch']} | "
            f"{r['seconds']:.2f} | {r['evaluated']:,} | {r['legal']:,} | "
            f"{r['fitting']:,} | {r['layouts_per_s']:,.0f} | {r['best']} | "
            f"{r['best_step_s']:.3f} | {100 * r['best_mfu']:.1f}% | "
            f"{r['load_avg_1m'][0]:.1f} -> {r['load_avg_1m'][1]:.1f} |"
        )
    md += [
        "",
        f"CLI `scaletrain {' '.join(CLI)}` end to end (best of {repeats}, Python start-up "
        f"included): {cli:.2f} s",
        "",
    ]
    if cpu is not None:
        md += _cpu_table(cpu, args.rounds)
    if cg is not None:
        md += _cachegrind_table(cg)
    md += [
        "Targets: >= 20,000 layouts/s; 405b/16,384 search < 2 s; CLI < 2 s.",
        "",
        "Legality: each layout's rules are checked once and only the batch rules "
        "(`config.batch_problems`) per micro-batch size (before b68f07a every size re-ran "
        "all of `layout_problems`: 70b 0.16 s, 405b 0.40 s at load 0.5, 80% of the time "
        "in legality checks of candidates that were never evaluated). 405b's rate stays "
        "below 20k/s because 7,780 proposed layouts are checked for 1,528 evaluated: the "
        "rate counts evaluations, not the rejections.",
        "",
        "Earlier (git HEAD 5f710ce: full `estimate` per candidate, pipeline "
        "ranks 0 and pp-1 only), best of 3 on the same machine: 70b 1.05 s, 11,963/s and "
        "405b 3.82 s, 9,647/s (load unknown); 5.17 s at load ~12; 0.59 s, 21,366/s and "
        "2.14 s, 17,206/s at load ~5.4, run back to back with this revision's 0.31 s, "
        "39,070/s and 1.25 s, 29,119/s. The old best layouts (pp32/pp64 zero-bubble at "
        "~60% MFU) came from a zero bubble the trainer does not run and from middle "
        "pipeline ranks whose compute and memory were not counted.",
    ]
    write_results(
        "planner_search",
        {
            "cases": rows,
            "cli_seconds": cli,
            "cpu_seconds": cpu,
            "instructions": cg,
            "repeats": repeats,
        },
        "\n".join(md),
    )


if __name__ == "__main__":
    main()
