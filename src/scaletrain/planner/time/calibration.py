"""Efficiency constants measured on one device by one of its own runs (`scaletrain verify RUN
--calibrate OUT.toml`, measure/calibrate.py), read back by `plan --calibration OUT.toml`.

The default time model rates every GEMM at one calibrated fraction of peak
(`step_time.default_efficiency`) and ignores the non-GEMM kernels; a calibration replaces, for
the device it was measured on, the constants its run measured:

- `matmul_by_shape`: the fraction of peak FLOP/s of each GEMM shape class the run executed, a
  class being the weight's two dimensions sorted ('128x512': the MLP's up and down projections
  alike, which run the same GEMM shapes transposed; q, k, v and the output projection of an
  MHA model share 'h x h'; the head 'h x V'); `matmul` is their FLOP-weighted rate, for shapes
  the run did not execute (another tp, another model). Another micro-batch is carried over by
  the roofline (Williams et al. 2009): a class's rate x f(M) / f(M_run), f the GEMM's
  intensity over the device's ridge point, capped at 1 (`efficiency.gemm_factor`).
- `attention`: the attention core's fraction of peak, against the planner's core FLOPs
  (causal-halved forward, backward 2x, a recompute under AC).
- `non_gemm_s`: seconds of the non-GEMM kernels (norms, activations, residual adds, softmax of
  the loss, dispatch) per token, per block, per hidden element, `forward_share` of it in the
  forward (what full AC repeats).
- `optimizer_bw`: bytes per second the optimizer step moved (`OPTIMIZER_TRAFFIC`).
- `collective`: measured / planned seconds per collective kind the run executed (all_reduce,
  all_gather, reduce_scatter, all_to_all, send), a factor on the alpha-beta time of every
  family of that kind.
- `step_overhead_s`: what the step spent outside all of the above (data wait, gradient clipping,
  bookkeeping), per step.
- `ranks_per_host`: the ranks the run put on its host. Every rate above is a per-rank rate with
  that many ranks sharing the host's cores, caches and memory bandwidth (on this project's
  2-vCPU test host two one-thread ranks ran at about 0.9 of a lone rank's rate each when the
  host was quiet, about half at load 8-15: benchmarks/results/calibration.md); a plan with
  another count per host keeps the rates and says so (`host_sharing_note`).
A constant at 0 (or absent) was not measured and keeps its default, which `describe` names.
Under a calibration the GPU kernel rules the defaults add (FlashAttention-2's Hopper rate,
eager elementwise bytes) are not applied: the run measured the kernels it ran.

Ignores: a GEMM shape's rate changing with M above the ridge (cache effects on CPUs, tile
quantization on GPUs), non-GEMM work that does not scale with tokens x blocks x width (the
head's softmax over the vocabulary is folded into the per-block constant), norms and residuals
replicated across TP ranks without SP (divided by tp like the rest).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaletrain.config import ConfigError, HardwareSpec, ModelConfig, compute_bytes

if TYPE_CHECKING:  # (types.py imports this module: the annotation only)
    from ..types import PlanInput

__all__ = [
    "Calibration",
    "COLLECTIVE_KINDS",
    "FAMILY_KIND",
    "gemm_classes",
    "head_class",
    "read_calibration",
    "calibration_toml",
    "describe_calibration",
    "host_sharing_note",
    "check_calibration",
    "class_rate",
    "calibrated_block",
]

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
FAMILY_KIND = {
    "dp_allreduce": "all_reduce",
    "hsdp_allreduce": "all_reduce",
    "tp": "all_reduce",
    "zero_all_gather": "all_gather",
    "fsdp_all_gather": "all_gather",
    "zero_reduce_scatter": "reduce_scatter",
    "fsdp_reduce_scatter": "reduce_scatter",
    "zero3_param_gather": "all_gather",
    "zero3_grad_reduce_scatter": "reduce_scatter",
    "ep_all_to_all": "all_to_all",
    "pp_p2p": "send",
    "cp_ring": "send",
    "pp_tied_allreduce": "all_reduce",
}
"""The collective kind each `comm.comm_terms` family runs (TP under SP runs all-gather /
reduce-scatter pairs of the all-reduce's bytes: priced as all-reduces, as comm.py does)."""


@dataclass(frozen=True)
class Calibration:
    """The constants of one calibration (module docstring); 0 / empty = not measured."""

    hardware: str
    """The device it was measured on (`HardwareSpec.name`)."""
    precision: str
    source: str
    """The run directory it came from."""
    clock: str
    """'cpu' (the step's process CPU seconds: a one-thread CPU rank on a shared host) or
    'wall'."""
    split: str
    """'profile' (the run's `scaletrain profile` split the step by op class) or 'step' (only
    the step's time: `matmul` then stands for everything, the other constants are 0)."""
    measured_step_s: float
    gemm_tokens: float
    """Rows (M) of the block GEMMs the run executed: tokens of one micro-batch per rank."""
    matmul: float
    matmul_by_shape: tuple[tuple[str, float], ...] = ()
    attention: float = 0.0
    non_gemm_s: float = 0.0
    forward_share: float = 0.0
    optimizer_bw: float = 0.0
    collective: tuple[tuple[str, float], ...] = ()
    step_overhead_s: float = 0.0
    ranks_per_host: int = 0
    """Ranks that shared the host in the run (0: not recorded, an older file)."""

    def shape_rate(self, key: str) -> float | None:
        return dict(self.matmul_by_shape).get(key)

    def collective_factor(self, family: str) -> float:
        return dict(self.collective).get(FAMILY_KIND.get(family, ""), 1.0)


def _key(a: float, b: float) -> str:
    x, y = sorted((a, b))
    return f"{x:g}x{y:g}"


def gemm_classes(model: ModelConfig, tp: int = 1) -> list[tuple[str, float]]:
    """(shape class, forward FLOPs per token) of one block's GEMMs as the trainer runs them on
    a tp rank (weights split over tp), summing to the block's matmul FLOPs
    (`flops.matmul_params`, / tp): q, k, v (one fused GEMM under `fused_qkv`), the output
    projection, the MLP matrices (MoE: the routed experts' and the router's)."""
    h, d, a, g, f = model.dim, model.head_dim, model.num_heads, model.num_kv_heads, model.ffn_dim
    out: list[tuple[str, float]] = []
    if model.fused_qkv:
        out.append((_key(h, (a + 2 * g) * d / tp), 2.0 * h * (a + 2 * g) * d / tp))
    else:
        out += [(_key(h, a * d / tp), 2.0 * h * a * d / tp)]
        out += [(_key(h, g * d / tp), 2.0 * h * g * d / tp)] * 2
    out.append((_key(a * d / tp, h), 2.0 * a * d * h / tp))
    n_mat = 3 if model.gated_mlp else 2
    experts = model.experts_per_token if model.is_moe else 1
    out += [(_key(h, f / tp), 2.0 * experts * h * f / tp)] * n_mat
    if model.is_moe:
        out.append((_key(h, model.num_experts), 2.0 * h * model.num_experts / tp))
    return out


def head_class(model: ModelConfig, tp: int = 1) -> str:
    """The output head's shape class (h x V/tp: the vocabulary-parallel head under tp)."""
    return _key(model.dim, model.vocab_size / tp)


def _roofline(M: float, key: str, e: float, ridge: float) -> float:
    from .efficiency import gemm_factor

    k, n = (float(x) for x in key.split("x"))
    return gemm_factor(max(1.0, M), k, n, e, ridge)


def class_rate(
    cal: Calibration, key: str, *, tokens: float, precision: str, hardware: HardwareSpec
) -> float:
    """The calibrated fraction of peak of GEMM class `key` at `tokens` rows: its own (or the
    FLOP-weighted) rate x the roofline's f(tokens) / f(the run's rows)."""
    e = 1.0 if precision == "fp8" else float(compute_bytes(precision))
    ridge = hardware.flops(precision) / hardware.memory_bw
    base = cal.shape_rate(key) or cal.matmul
    return base * _roofline(tokens, key, e, ridge) / _roofline(cal.gemm_tokens, key, e, ridge)


@dataclass(frozen=True)
class CalibratedBlock:
    """Seconds per token of one block (and of its attention core, and of the head on the last
    stage) under a calibration, before the split over tp x cp."""

    layer_s: float
    core_s: float
    head_s: float


def calibrated_block(
    plan: PlanInput,
    *,
    linear_hw: float,
    core_hw: float,
    head_fwd: float,
    skipped_fwd: float = 0.0,
) -> CalibratedBlock:
    """One block of `plan` at its calibration's rates: each GEMM class's hardware FLOPs (the
    block's `linear_hw` FLOPs per token shared out in `gemm_classes`' proportions, so recompute
    counts as the default model counts it) at `class_rate`, the core's `core_hw` at the
    attention rate (the FLOP-weighted matmul rate when not measured), the non-GEMM seconds x
    the width (+ its forward share again under full AC); the head's 3 forward GEMMs at its
    class's rate. Rows of a GEMM: one micro-batch's tokens per rank (s x b / cp).
    skipped_fwd: the down-projection FLOPs per token a recompute that stops early does not
    run (time/ac_early_stop.py `early_stop_skipped_forward_flops`, already in `linear_hw`),
    taken off at the dense MLP's class rate."""
    cal, model, hardware, precision = plan.calibration, plan.model, plan.hardware, plan.precision
    assert cal is not None
    tokens, tp = float(plan.seq_len) * plan.micro_batch / plan.layout.cp, plan.layout.tp
    peak = hardware.flops(precision)
    slow = hardware.flops("bf16") if precision == "fp8" else peak
    classes = gemm_classes(model, tp)
    fwd = sum(fl for _, fl in classes)
    layer_s = 0.0
    for key, fl in classes:
        rate = peak * class_rate(cal, key, tokens=tokens, precision=precision, hardware=hardware)
        layer_s += linear_hw * fl / fwd / rate
    if skipped_fwd:
        dense = model.dense_layer_view() if model.is_moe else model
        key = _key(dense.dim, dense.ffn_dim / tp)
        rate = peak * class_rate(cal, key, tokens=tokens, precision=precision, hardware=hardware)
        layer_s -= skipped_fwd / rate
    core_s = core_hw / (slow * (cal.attention or cal.matmul))
    recompute = cal.forward_share if plan.ac == "full" else 0.0
    non_gemm = cal.non_gemm_s * model.dim * (1.0 + recompute)
    head_rate = slow * class_rate(
        cal, head_class(model, tp), tokens=tokens, precision=precision, hardware=hardware
    )
    return CalibratedBlock(
        layer_s=layer_s + core_s + non_gemm, core_s=core_s, head_s=3.0 * head_fwd / head_rate
    )


def check_calibration(cal: Calibration, hardware: HardwareSpec, precision: str) -> None:
    """A calibration plans only the device and precision it was measured in (its rates are
    fractions of that peak): anything else is one ConfigError naming --calibration."""
    if cal.hardware != hardware.name:
        raise ConfigError(
            "--calibration",
            cal.source,
            f"measured on {cal.hardware!r}, this plan is for {hardware.name!r}: plan "
            f"with --gpu {cal.hardware} (or calibrate with a run on {hardware.name})",
        )
    if cal.precision != precision:
        raise ConfigError(
            "--calibration",
            cal.source,
            f"measured in {cal.precision}, this plan runs {precision}: plan with "
            f"--precision {cal.precision} (or calibrate with a {precision} run)",
        )


# ---- the file ---------------------------------------------------------------------------------

_SCALARS = {
    "hardware": str,
    "precision": str,
    "source": str,
    "clock": str,
    "split": str,
    "measured_step_s": float,
    "gemm_tokens": float,
    "matmul": float,
    "attention": float,
    "non_gemm_s": float,
    "forward_share": float,
    "optimizer_bw_gb_s": float,
    "step_overhead_s": float,
    "ranks_per_host": int,
}
_TABLES = ("matmul_by_shape", "collective")
_REQUIRED = ("hardware", "precision", "clock", "split", "measured_step_s", "gemm_tokens", "matmul")


def calibration_toml(cal: Calibration) -> str:
    """The TOML `read_calibration` reads, with a comment per constant."""

    def num(v: float) -> str:
        return repr(float(v))

    lines = [
        "# scaletrain calibration: efficiency constants this device measured in one run",
        "# (scaletrain verify RUN --calibrate); plan with: scaletrain plan --calibration FILE",
        "[calibration]",
        f'hardware = "{cal.hardware}"',
        f'precision = "{cal.precision}"',
        f"source = {_quote(cal.source)}",
        f'clock = "{cal.clock}"            # step time: process CPU seconds or wall clock',
        f'split = "{cal.split}"         # profile: split by op class; step: one rate for all',
        f"measured_step_s = {num(cal.measured_step_s)}",
        f"gemm_tokens = {num(cal.gemm_tokens)}   # GEMM rows (tokens per micro-batch per rank)",
        f"matmul = {num(cal.matmul)}   # fraction of peak, FLOP-weighted over the GEMM shapes",
        f"attention = {num(cal.attention)}   # attention core, fraction of peak (0: as matmul)",
        f"non_gemm_s = {num(cal.non_gemm_s)}   # s per token x block x hidden element",
        f"forward_share = {num(cal.forward_share)}   # of the non-GEMM time, in the forward",
        f"optimizer_bw_gb_s = {num(cal.optimizer_bw / 1e9)}   # optimizer step (0: memory_bw)",
        f"step_overhead_s = {num(cal.step_overhead_s)}   # per step, outside the above",
        f"ranks_per_host = {cal.ranks_per_host}   # ranks sharing the host in the run (0: unknown)",
        "",
        "[calibration.matmul_by_shape]   # fraction of peak by GEMM shape class (weight dims)",
        *(f'"{k}" = {num(v)}' for k, v in cal.matmul_by_shape),
        "",
        "[calibration.collective]   # measured / planned seconds by collective kind",
        *(f"{k} = {num(v)}" for k, v in cal.collective),
    ]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_calibration(path: str | Path) -> Calibration:
    """The calibration in `path`; every fault one ConfigError naming --calibration."""
    from scaletrain.config.strict import did_you_mean

    p = Path(path)
    flag = "--calibration"
    if not p.is_file():
        raise ConfigError(flag, str(p), "give a file written by scaletrain verify RUN --calibrate")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(flag, str(p), f"not a calibration TOML ({e})") from None
    table = raw.get("calibration")
    if not isinstance(table, dict):
        raise ConfigError(flag, str(p), "it has no [calibration] table: write it with --calibrate")
    values: dict[str, Any] = {}
    for k, v in table.items():
        if k in _TABLES:
            if not isinstance(v, dict):
                raise ConfigError(f"calibration.{k}", v, f"a table ({p})")
            continue
        if k not in _SCALARS:
            known = (*_SCALARS, *_TABLES)
            raise ConfigError(f"calibration.{k}", v, f"unknown key{did_you_mean(k, known)} ({p})")
        values[k] = _value(k, v, _SCALARS[k], p)
    for k in _REQUIRED:
        if k not in values:
            raise ConfigError(f"calibration.{k}", "not given", f"required ({p})")
    shapes = tuple(
        (str(k), _rate(f"calibration.matmul_by_shape.{k}", v, p))
        for k, v in table.get("matmul_by_shape", {}).items()
    )
    coll: list[tuple[str, float]] = []
    for k, v in table.get("collective", {}).items():
        if k not in COLLECTIVE_KINDS:
            raise ConfigError(
                "calibration.collective",
                k,
                f"unknown kind{did_you_mean(k, COLLECTIVE_KINDS)}: use "
                f"{', '.join(COLLECTIVE_KINDS)} ({p})",
            )
        coll.append((k, _rate(f"calibration.collective.{k}", v, p)))
    for k in ("matmul", "measured_step_s", "gemm_tokens"):
        if values[k] <= 0:
            raise ConfigError(f"calibration.{k}", values[k], f"must be positive ({p})")
    if values["split"] not in ("profile", "step") or values["clock"] not in ("cpu", "wall"):
        raise ConfigError(flag, str(p), "split is 'profile' or 'step', clock 'cpu' or 'wall'")
    bw = values.pop("optimizer_bw_gb_s", 0.0) * 1e9
    return Calibration(
        **{k: v for k, v in values.items() if k != "source"},
        source=str(values.get("source", p)),
        matmul_by_shape=shapes,
        collective=tuple(coll),
        optimizer_bw=bw,
    )


def _value(key: str, v: Any, typ: type, p: Path) -> Any:
    if typ is str:
        if not isinstance(v, str):
            raise ConfigError(f"calibration.{key}", v, f"a string ({p})")
        return v
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"calibration.{key}", v, f"a whole number >= 0 ({p})")
        return v
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"calibration.{key}", v, f"a finite number >= 0 ({p})")
    return float(v)


def _rate(field: str, v: Any, p: Path) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(field, v, f"a positive number ({p})")
    return float(v)


def describe_calibration(cal: Calibration) -> list[str]:
    """What `plan --calibration` says: each constant, calibrated or default (and what a
    constant the run did not measure falls back to)."""
    cal_: list[str] = []
    dflt: list[str] = []
    shapes = ", ".join(f"{k} {v:.3f}" for k, v in cal.matmul_by_shape)
    head = f"matmul {cal.matmul:.3f} of peak" + (f" (by shape: {shapes})" if shapes else "")
    if cal.split == "step":
        head += " (one rate for the whole step: no profile split it)"
    cal_.append(head)
    folded = "folded into matmul" if cal.split == "step" else "none measured"
    for v, text, default in (
        (
            cal.attention,
            f"attention core {cal.attention:.3f} of peak",
            "attention at the matmul rate",
        ),
        (
            cal.non_gemm_s,
            f"non-GEMM {cal.non_gemm_s * 1e9:.4g} ns per token x block x h",
            f"non-GEMM ({folded})",
        ),
        (
            cal.optimizer_bw,
            f"optimizer {cal.optimizer_bw / 1e9:.3g} GB/s",
            "optimizer at memory_bw",
        ),
        (
            cal.step_overhead_s,
            f"step overhead {cal.step_overhead_s * 1e3:.3g} ms",
            f"step overhead ({folded})",
        ),
    ):
        (cal_ if v > 0 else dflt).append(text if v > 0 else default)
    measured = dict(cal.collective)
    for k in COLLECTIVE_KINDS:
        if k in measured:
            cal_.append(f"{k} x{measured[k]:.3g} of its alpha-beta time")
        else:
            dflt.append(k)
    per_host = f", {cal.ranks_per_host} rank(s) per host" if cal.ranks_per_host else ""
    return [
        f"calibration {cal.source} ({cal.hardware}, {cal.precision}, {cal.clock} clock, "
        f"step {cal.measured_step_s * 1e3:.4g} ms{per_host}):",
        "  calibrated: " + "; ".join(cal_),
        "  default: " + (", ".join(dflt) if dflt else "none"),
    ]


def host_sharing_note(cal: Calibration, ranks_per_host: int) -> str | None:
    """What a plan putting `ranks_per_host` ranks on each host should know of a calibration
    measured with another count (None when they agree or the file did not record it): its
    rates are per-rank rates under the run's sharing of the host, which nothing here can
    carry to another count (it depends on the host and on what else runs there: see the
    module docstring), so they are used as measured."""
    if cal.ranks_per_host <= 0 or cal.ranks_per_host == ranks_per_host:
        return None
    return (
        f"calibrated with {cal.ranks_per_host} rank(s) per host, this plan puts "
        f"{ranks_per_host} on each: the rates are used as measured, so what the ranks share "
        "on a host (cores, caches, memory bandwidth) is not re-measured; calibrate from a run "
        f"with {ranks_per_host} rank(s) per host for this layout"
    )
