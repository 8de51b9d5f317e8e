"""Issue 36 item 4's check: 8-bit AdamW and Adafactor against AdamW on the default job.

Each optimizer trains the embedded default `scaletrain train` job (gpt-mini on the grammar
corpus, `_common.default_job_args`: same init, same batches) for --steps steps as its own
process. Reported per optimizer: the final loss, taken as the mean training loss of the last 20
steps (one step's loss moves by a few percent from batch to batch; every run sees the same
batches), its ratio to AdamW's, the optimizer-state bytes per parameter the trainer measured
(`measurement.json`: the local storage of every state tensor, torchao's uint8 codes and fp32
block scales included, over the parameters) against the planner's `optimizer_bytes`, and the
run's wall time (indicative only: the host is shared).

The bound: an optimizer passes when its final loss is within BOUND (2%) of AdamW's, the
acceptance's "within a stated bound of AdamW". Adafactor (trainer/adafactor.py) runs with and
without its first moment (optim.beta1 0.9 / 0), with the absolute step (optim.relative_step
false, the default: lr is the step size, AdamW's 2e-3 and a factor 2 either side) and with the
paper's relative step (true: lr caps a step relative to each parameter's RMS, 1e-2..1e-1).
Every setting tried is a row: none is left out.

    python benchmarks/optimizers.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_default_job, write_results  # noqa: E402
from scaletrain.config import load_config  # noqa: E402
from scaletrain.planner import optimizer_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BOUND = 0.02
"""Largest relative final-loss gap to AdamW that passes."""
TAIL = 20
"""Steps averaged for the final loss."""
_RELATIVE = "--optim.relative_step=true"
RUNS = {  # label -> (optim.name, extra overrides)
    "adamw": ("adamw", []),
    "adamw8bit": ("adamw8bit", []),
    "adafactor (defaults: beta1 0.9, absolute step, lr 2e-3)": ("adafactor", []),
    "adafactor (beta1 0.9, absolute, lr 1e-3)": ("adafactor", ["--optim.lr=1e-3"]),
    "adafactor (beta1 0.9, absolute, lr 4e-3)": ("adafactor", ["--optim.lr=4e-3"]),
    "adafactor (beta1 0, absolute, lr 2e-3)": ("adafactor", ["--optim.beta1=0"]),
    "adafactor (beta1 0.9, relative, lr 1e-2)": ("adafactor", [_RELATIVE, "--optim.lr=1e-2"]),
    "adafactor (beta1 0.9, relative, lr 3e-2)": ("adafactor", [_RELATIVE, "--optim.lr=3e-2"]),
    "adafactor (beta1 0.9, relative, lr 1e-1)": ("adafactor", [_RELATIVE, "--optim.lr=1e-1"]),
    # torch.optim.Adafactor's algorithm (no first moment, relative step) at its best lr of
    # the earlier sweep (1.078x at 1e-1; 1.084x at 3e-2, 1.135x at 1e-2, 1.108x at 0.3)
    "adafactor (beta1 0, relative, lr 1e-1: torch's)": (
        "adafactor",
        [_RELATIVE, "--optim.lr=1e-1", "--optim.beta1=0"],
    ),
}


def one(label: str, steps: int, tmp: Path) -> dict[str, object]:
    name, extra = RUNS[label]
    run_dir = tmp / label.replace(" ", "_").replace(",", "").replace("'", "")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    job = run_default_job(ROOT, steps, run_dir, extra=[f"--optim.name={name}", *extra])
    losses = [float(r["loss"]) for r in job.records if "loss" in r]
    meas = json.loads((run_dir / "measurement.json").read_text())
    beta1 = load_config(None, [f"--optim.name={name}", *extra]).optim.beta1
    params = meas["plan"]["params"]
    return {
        "optimizer": name,
        "overrides": extra,
        "steps": len(losses),
        "final_loss": statistics.fmean(losses[-TAIL:]),
        "last_loss": losses[-1],
        "state_bytes": meas["memory"]["optimizer"],
        "params": params,
        "measured_bytes_per_param": meas["memory"]["optimizer"] / params,
        "planned_bytes_per_param": optimizer_bytes(name, beta1),
        "wall_s": job.wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="optimizers-") as tmp_s:
        for label in RUNS:
            runs[label] = one(label, args.steps, Path(tmp_s))
            print(label, runs[label], flush=True)
    ref = runs["adamw"]["final_loss"]
    assert isinstance(ref, float)
    rows = []
    for label, r in runs.items():
        loss = r["final_loss"]
        assert isinstance(loss, float)
        r["ratio_to_adamw"] = loss / ref
        r["within_bound"] = abs(loss / ref - 1) <= BOUND
        rows.append(
            f"| {label} | {loss:.4f} | {loss / ref:.4f} | {'yes' if r['within_bound'] else 'NO'} "
            f"| {r['measured_bytes_per_param']:.3f} | {r['planned_bytes_per_param']:.3f} "
            f"| {r['wall_s']:.0f} |"
        )
    md = (
        f"The default `scaletrain train` job (gpt-mini, fp32, CPU), {args.steps} steps per "
        f"optimizer from the same init on the same batches. Final loss = mean training loss of "
        f"the last {TAIL} steps. Bound: within {BOUND:.0%} of AdamW's final loss, both ways (a "
        "loss more than 2% under AdamW's is outside it too). Adafactor is "
        "scaletrain's (trainer/adafactor.py): beta1 = its first moment (0 = none), absolute "
        "step = optim.relative_step false (lr is the step size), relative = the paper's "
        "(lr caps a step relative to each parameter's RMS); every setting tried is a row. "
        "State bytes measured = the trainer's count of optimizer state storage (torchao's "
        "uint8 codes and fp32 block scales; Adafactor's row/column moments and first moment) "
        "/ parameters; planned = the planner's `optimizer_bytes`. Wall times are indicative "
        "only (a shared, loaded host; adamw8bit steps eagerly on CPU).\n\n"
        "| optimizer | final loss | / AdamW | within 2% | state B/param measured | planned "
        "| wall s |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "Why measured and planned differ on gpt-mini (dim 128): torchao keeps fp32 moments for "
        "tensors under 4,096 values (gpt-mini's norms and biases) and a 1 KiB code map per "
        "quantized moment, which the planner ignores; Adafactor keeps a full fp32 second moment "
        "for vectors, and its 4(m+n)/(mn) is 0.04 B at 128 x 512 against the table's "
        "1024 x 1024 figure. Both gaps shrink with the model's width; the first moment's 4 B "
        "is exact."
    )
    write_results("optimizers", {"steps": args.steps, "bound": BOUND, "runs": runs}, md)
    print(md)


if __name__ == "__main__":
    main()
