"""Planner search speed: layouts evaluated per second and full-search wall time.

Cases: llama3-70b on 64 H100 (seq 8192, global batch 512: the CLI acceptance case) and
llama3-405b on 16,384 H100 (seq 8192, global batch 2048). "Evaluated" counts every legal
layout whose worst-rank memory was computed (memory probes included; the time model runs only
for those that fit); candidates skipped by pruning are not counted. Also times the CLI end to
end (Python start-up included). Targets: >= 20,000 layouts/s, 405b search < 2 s.

The machine is shared: each figure is the best of 3 runs, and the 1-minute load average is
recorded before and after each case (on 2 cores a load of 10 leaves a process a fraction of a
core, so the same code can measure 2-3x slower).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from _common import write_results
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


def main() -> None:
    hw = hardware_preset("h100-sxm")
    rows = []
    for name, gpus, seq, gb in CASES:
        load_before = os.getloadavg()[0]
        best_t = float("inf")
        for _ in range(3):  # best of 3: the machine is shared
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
    for _ in range(3):
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
        f"CLI `scaletrain {' '.join(CLI)}` end to end (best of 3, Python start-up "
        f"included): {cli:.2f} s",
        "",
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
    write_results("planner_search", {"cases": rows, "cli_seconds": cli}, "\n".join(md))


if __name__ == "__main__":
    main()
