"""`scaletrain verify RUN --calibrate OUT.toml`: a finished run's measured step turned into the
planner's efficiency constants for its device (`planner.time.calibration`).

What the run directory measured decides what is calibrated:
- the step (metrics.jsonl, the first step excluded as `measure.throughput` does): always. On a
  CPU rank of one thread (run_info.json's `threads`) the step's process CPU seconds
  (`step_cpu_s`) are its device time and are used ('cpu' clock): on a host other jobs share,
  the wall clock also counts the time the OS gave them. Otherwise the wall clock.
- RUN/profile/profile.json (`scaletrain profile` of the same job, which writes there by
  default) splits the step by op class (pp = 1 runs): its shares, scaled to the run's step,
  give each GEMM shape class's rate (the matmul ops matched to `gemm_classes` by their
  shapes), the attention core's, the non-GEMM seconds (the compute phases' time outside
  matmul and attention ops; its forward share taken as the forward phase's share of the
  compute phases), the optimizer's bandwidth (the optimizer phase), and a factor per
  collective kind the profile saw (its communication ops' time over the planner's).
  What remains of the step (data wait, clipping, bookkeeping) is the step overhead.
- no profile: one rate for everything (`split = 'step'`): the matmul efficiency at which the
  planner's step equals the measured one (bisection: the step falls as the rate rises).
Either way the calibrated planner reproduces the run's step (`CalibrationResult.planned_s`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError, HardwareSpec, JobConfig, Layout
from scaletrain.planner.time.calibration import (
    Calibration,
    calibration_toml,
    gemm_classes,
    head_class,
)

__all__ = ["CalibrationResult", "calibrate_run", "match_gemm", "write_calibration"]

_COMPUTE_PHASES = ("forward", "loss", "backward", "recompute")
_KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("broadcast", "all_gather"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("send", "send"),
    ("recv", "send"),
)
"""Collective op name fragments -> the planner's kind (time/calibration.FAMILY_KIND); ZeRO-1's
broadcast of the updated partitions is the planner's zero_all_gather."""


@dataclass
class CalibrationResult:
    calibration: Calibration
    planned_s: float
    """The calibrated planner's step for the run's own layout (reproduces the measured)."""
    default_s: float
    """The default planner's step for it."""
    notes: list[str]


def _step(run: Path, info: dict[str, Any], world: int) -> tuple[float, str]:
    """(the measured step, its clock): see the module docstring."""
    from .run_files import read_records
    from .throughput import step_throughput

    t = step_throughput(read_records(run / "metrics.jsonl"))
    if t is None:
        raise ConfigError(
            "run_dir",
            str(run / "metrics.jsonl"),
            "fewer than two timed steps logged: calibrate with a run of a few steps or more",
        )
    if info.get("device") == "cpu" and info.get("threads") == 1 and t.cpu_step_s:
        return t.cpu_step_s, "cpu"
    return t.step_s, "wall"


def match_gemm(
    name: str, dims: list[list[int]], keys: set[str], rows: float, *, batched: bool = False
) -> str | None:
    """The shape class of a profiled matmul op from its name and input shapes: the class whose
    two dimensions are two of the GEMM's (M, K, N), the third being its rows (preferring
    rows == `rows`). The operands: aten::addmm / baddbmm (bias, A, B, ...), aten::linear
    (input (.., K), weight (N, K)), else (A, B, ...) (mm, bmm, matmul). A batched GEMM (both
    operands 3-D) multiplies activations by activations (the attention core's scores) unless
    `batched` (MoE experts stacked per expert): no class then."""
    op = name.split("::")[-1]
    mats = [d if isinstance(d, list) else [] for d in dims]
    if op in ("addmm", "baddbmm"):
        mats = mats[1:]
    if len(mats) < 2 or len(mats[0]) < 2 or len(mats[1]) < 2:
        return None
    if len(mats[0]) >= 3 and len(mats[1]) >= 3 and not batched:
        return None
    a, b = mats[0], mats[1]
    if op == "linear":
        m = 1
        for v in a[:-1]:
            m *= v
        three = [m, a[-1], b[0]]
    else:
        three = [a[-2], a[-1], b[-1]]
    found: list[tuple[bool, str]] = []
    for i, m in enumerate(three):
        rest = sorted(v for j, v in enumerate(three) if j != i)
        key = f"{rest[0]:g}x{rest[1]:g}"
        if key in keys:
            found.append((m != rows, key))
    return min(found)[1] if found else None


def _profile(run: Path, job: JobConfig, layout: Layout, grad_accum: int) -> dict[str, Any] | None:
    """RUN/profile/profile.json if it profiled this job's plan (else None or one error)."""
    path = run / "profile" / "profile.json"
    if not path.is_file():
        return None
    from .run_files import read_object

    prof = read_object(path, required=True)
    assert prof is not None
    b = job.batch
    want = f"mb{b.micro_batch}x{grad_accum} seq{b.seq_len} {job.precision.dtype}"
    if (
        prof.get("model") != job.model.name
        or prof.get("world_size") != layout.world_size
        or want not in str(prof.get("layout", ""))
        or not str(prof.get("layout", "")).startswith(layout.label())
    ):
        raise ConfigError(
            "run_dir",
            str(path),
            f"it profiled {prof.get('model')} '{prof.get('layout')}' on "
            f"{prof.get('world_size')} ranks, not this run's {job.model.name} "
            f"'{layout.label()} | {want}': profile the run's job again or remove it",
        )
    return prof


def _shape_times(
    prof: dict[str, Any], keys: set[str], rows: float, naive: bool, moe: bool
) -> tuple[dict[str, float], float]:
    """({class: matmul seconds}, seconds added to the attention core) of one profiled step:
    listed matmul ops matched to classes, the rest of the matmul time (unlisted ops, unmatched
    shapes) shared out in proportion, or to the attention core when it runs as matmuls
    (naive attention's score GEMMs match no weight)."""
    total = float(prof.get("compute_op_classes_s", {}).get("matmul", 0.0))
    got: dict[str, float] = {}
    unmatched = 0.0
    for op in prof.get("ops", []):
        if op.get("class") != "matmul" or not op.get("compute_phase"):
            continue
        try:
            dims = json.loads(op.get("shapes", "[]"))
        except (TypeError, ValueError):
            dims = []
        name = str(op.get("name", ""))
        key = match_gemm(name, dims, keys, rows, batched=moe) if isinstance(dims, list) else None
        t = float(op.get("time_s", 0.0))
        if key is None:
            unmatched += t
        else:
            got[key] = got.get(key, 0.0) + t
    matched = sum(got.values())
    rest = max(0.0, total - matched)
    to_core = 0.0
    if naive:
        to_core, rest = unmatched, max(0.0, rest - unmatched)
    if matched > 0:
        got = {k: v * (1 + rest / matched) for k, v in got.items()}
    return got, to_core


def _hardware(info: dict[str, Any], job: JobConfig) -> HardwareSpec:
    """The device the run measured: run_info's (the GPU it found), else the job's."""
    from scaletrain.config import HARDWARE_PRESETS, hardware_preset

    name = info.get("hardware")
    spec = job.hardware_spec()
    if isinstance(name, str) and name in HARDWARE_PRESETS and name != spec.name:
        return dataclasses.replace(hardware_preset(name), tf32=job.precision.tf32)
    return spec


def calibrate_run(run_dir: str | Path) -> CalibrationResult:
    """The calibration of a finished run directory (module docstring)."""
    from scaletrain.planner import estimate
    from scaletrain.planner.types import plan_input_from_job

    from .run_files import read_object
    from .verify import verify_run

    run = Path(run_dir)
    measurement, _, job = verify_run(run)
    info = read_object(run / "run_info.json") or {}
    layout = job.layout(measurement.world_size)
    hw = _hardware(info, job)
    plan = plan_input_from_job(job, layout, hardware=hw)
    if plan.efficiency > 0:
        plan = dataclasses.replace(plan, efficiency=0.0)
    step_s, clock = _step(run, info, layout.world_size)
    notes: list[str] = []
    prof = _profile(run, job, layout, plan.grad_accum) if layout.pp == 1 else None
    if layout.pp > 1 and (run / "profile" / "profile.json").is_file():
        notes.append("pp > 1: the profile's rank-0 split is not used (one rate for the step)")
    base = Calibration(
        hardware=hw.name,
        precision=plan.precision,
        source=str(run),
        clock=clock,
        split="step",
        measured_step_s=step_s,
        gemm_tokens=float(plan.seq_len) * plan.micro_batch / layout.cp,
        matmul=1.0,
        ranks_per_host=_ranks_per_host(info),
    )
    if prof is None:
        cal = _fit_rate(plan, base)
        notes.append(
            "no RUN/profile/profile.json: one rate stands for the whole step (run `scaletrain "
            "profile` with the run's job to split it by GEMM shape, attention, non-GEMM, "
            "optimizer and collectives)"
        )
    else:
        cal = _from_profile(plan, base, prof, notes)
    planned = estimate(dataclasses.replace(plan, calibration=cal)).time.step_s
    default = estimate(plan).time.step_s
    if cal.matmul > 1 or any(v > 1 for _, v in cal.matmul_by_shape):
        notes.append(
            f"a rate above 1 of {hw.name}'s peak: the run went faster than the hardware's "
            "peak FLOP/s allows (check hardware.peak_tflops)"
        )
    return CalibrationResult(cal, planned, default, notes)


def _ranks_per_host(info: dict[str, Any]) -> int:
    """The ranks the run put on its host (run_info's `local_world_size`; 0 when a run written
    before it was recorded)."""
    v = info.get("local_world_size")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _fit_rate(plan: Any, base: Calibration) -> Calibration:
    """`base` with the matmul rate at which the planner's step is the measured one."""
    from scaletrain.planner import estimate

    def step(rate: float) -> float:
        cal = dataclasses.replace(base, matmul=rate)
        return estimate(dataclasses.replace(plan, calibration=cal)).time.step_s

    lo, hi = 1e-9, 1.0
    while step(hi) > base.measured_step_s and hi < 1e6:
        hi *= 2
    if step(hi) > base.measured_step_s:  # (the non-compute terms alone exceed the step)
        return dataclasses.replace(base, matmul=hi)
    for _ in range(100):
        mid = (lo * hi) ** 0.5
        if step(mid) > base.measured_step_s:
            lo = mid
        else:
            hi = mid
    return dataclasses.replace(base, matmul=hi)


def _from_profile(
    plan: Any, base: Calibration, prof: dict[str, Any], notes: list[str]
) -> Calibration:
    """The constants of a profiled run (module docstring): each profiled share x the run's
    step over the planner's FLOPs (or bytes) of the same work on this rank."""
    from scaletrain.planner import estimate
    from scaletrain.planner.memory.rank_terms import model_terms
    from scaletrain.planner.time.step_time import model_flops

    L, model, hw = plan.layout, plan.model, plan.hardware
    phases = {k: float(v) for k, v in prof.get("phases_s", {}).items()}
    scale = base.measured_step_s / max(1e-12, sum(phases.values()))
    m = max(1, plan.grad_accum)
    tok = m * float(plan.seq_len) * plan.micro_batch / (L.tp * L.cp)  # token-rows per step
    fl = model_flops(model_terms(plan, None), plan.seq_len, True, plan.ac)
    core_hw = fl.attention_core * (4 if plan.ac != "none" else 3)
    linear_hw = fl.block_hardware - core_hw
    classes = gemm_classes(model, L.tp)
    fwd = sum(f for _, f in classes)
    flops: dict[str, float] = {}
    for key, f in classes:
        flops[key] = flops.get(key, 0.0) + tok * model.num_layers * linear_hw * f / fwd
    head = head_class(model, L.tp)
    flops[head] = flops.get(head, 0.0) + tok * 3 * fl.head_forward
    naive = model.attention == "naive"
    times, to_core = _shape_times(prof, set(flops), base.gemm_tokens, naive, model.is_moe)
    peak = hw.flops(plan.precision)
    slow = hw.flops("bf16") if plan.precision == "fp8" else peak
    by_shape = {k: flops[k] / (peak * t * scale) for k, t in times.items() if t > 0}
    measured_flops = sum(flops[k] for k in by_shape)
    matmul_s = sum(times.values()) * scale
    overall = measured_flops / (peak * matmul_s) if matmul_s > 0 else base.matmul
    cc = prof.get("compute_op_classes_s", {})
    att_s = (float(cc.get("attention", 0.0)) + to_core) * scale
    attention = tok * model.num_layers * core_hw / (slow * att_s) if att_s > 0 else 0.0
    compute_s = sum(phases.get(p, 0.0) for p in _COMPUTE_PHASES) * scale
    non_gemm = max(0.0, compute_s - matmul_s - att_s)
    per_element = non_gemm / (tok * model.num_layers * model.dim)
    fwd_share = phases.get("forward", 0.0) * scale / compute_s if compute_s else 0.0
    opt_s = phases.get("optimizer", 0.0) * scale
    default = estimate(plan)
    # the bytes step_time._optimizer_time counts (OPTIMIZER_TRAFFIC x local parameters)
    traffic = default.time.optimizer_s * hw.memory_bw
    cal = dataclasses.replace(
        base,
        split="profile",
        matmul=overall,
        matmul_by_shape=tuple(sorted(by_shape.items())),
        attention=attention,
        non_gemm_s=per_element,
        forward_share=fwd_share,
        optimizer_bw=traffic / opt_s if opt_s > 0 and plan.offload == "none" else 0.0,
        collective=_collectives(prof, default.time.comm_terms, scale),
    )
    rest = base.measured_step_s - estimate(dataclasses.replace(plan, calibration=cal)).time.step_s
    if rest < 0:
        notes.append(f"the profiled parts exceed the step by {-rest * 1e3:.3g} ms: step overhead 0")
    return dataclasses.replace(cal, step_overhead_s=max(0.0, rest))


def _collectives(
    prof: dict[str, Any], planned: dict[str, float], scale: float
) -> tuple[tuple[str, float], ...]:
    """Measured / planned seconds per collective kind the profile saw (`comm_ops_s`: each
    root collective op's span per step, by name; the planner's seconds of that kind's
    families, all of them, overlapped or not)."""
    from scaletrain.planner.time.calibration import FAMILY_KIND

    seen: dict[str, float] = {}
    ops = prof.get("comm_ops_s", {})
    for name, t in ops.items() if isinstance(ops, dict) else ():
        kind = next((k for frag, k in _KINDS if frag in str(name).lower()), None)
        if kind is not None and isinstance(t, int | float):
            seen[kind] = seen.get(kind, 0.0) + float(t) * scale
    out = []
    for kind, t in sorted(seen.items()):
        plan_t = sum(s for fam, s in planned.items() if FAMILY_KIND.get(fam) == kind)
        if t > 0 and plan_t > 0:
            out.append((kind, t / plan_t))
    return tuple(out)


def write_calibration(result: CalibrationResult, path: str | Path) -> Path:
    """Write the calibration TOML (its directory must exist)."""
    p = Path(path)
    if not p.resolve().parent.is_dir():
        raise ConfigError(
            "--calibrate", str(p), f"its directory {p.parent} does not exist: create it first"
        )
    if p.is_dir():
        raise ConfigError("--calibrate", str(p), "it is a directory: name a file such as cal.toml")
    p.write_text(calibration_toml(result.calibration), encoding="utf-8")
    return p
