"""Predicted vs measured: the planner's estimate for a plan held against a `Measurement`.

Used by `scaletrain verify RUN_DIR` (a real run's `config.json` + `measurement.json`) and by
`scaletrain dryrun` (a fresh fake-tensor measurement). Relative error = (predicted - measured) /
measured, per memory category; a category measured as 0 gets no relative error. A run's
loader wait per step is held against the input rate the plan requires (`input_check.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError, JobConfig, Layout, byte_unit, fmt_bytes, load_config
from scaletrain.planner.types import MemoryBreakdown

from .input_check import format_input, input_check
from .run_files import read_records
from .schema import Measurement

__all__ = [
    "CATEGORIES",
    "Comparison",
    "predict",
    "compare",
    "verify_run",
    "job_from_dict",
    "format_table",
    "table_unit",
    "metrics_throughput",
]

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "total", "reserved")


@dataclass
class Comparison:
    """Per-category predicted and measured bytes with relative errors, plus throughput."""

    measured: dict[str, float]
    predicted: dict[str, float] | None
    rel_error: dict[str, float | None] = field(default_factory=dict)
    time: dict[str, float] = field(default_factory=dict)
    """'measured_tokens_per_s', 'predicted_tokens_per_s', ... when known."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "predicted": self.predicted,
            "rel_error": self.rel_error,
            "time": self.time,
            "notes": self.notes,
        }


def _estimate_fn() -> Any:
    """`scaletrain.planner.estimate` if the planner exposes it (None otherwise)."""
    try:
        from scaletrain.planner import estimate
    except ImportError:
        return None
    return estimate if callable(estimate) else None


def predict(job: JobConfig, layout: Layout) -> Any:
    """The planner's `Estimate` for `job` run with `layout`, or None without a planner."""
    fn = _estimate_fn()
    if fn is None:
        return None
    from scaletrain.planner.types import plan_input_from_job

    return fn(plan_input_from_job(job, layout))


def _categories(mem: MemoryBreakdown) -> dict[str, float]:
    return {c: float(getattr(mem, c)) for c in CATEGORIES}


def live_terms(mem: MemoryBreakdown) -> dict[str, float]:
    """The planner's per-category bytes in the terms a live run measures them (`measure.live`):
    the resident state, and activations for one micro-batch. The planner's categories are those
    of the peak moment: params and grads include the 16-bit copies in flight there (FSDP units
    gathered or reduced, autocast's weight casts: `params.in_flight` / `grads.in_flight`), and
    under pipelining the activations of every micro-batch in flight on the rank."""
    d = mem.detail
    return {
        "params": mem.params - d.get("params.in_flight", 0.0),
        "grads": mem.grads - d.get("grads.in_flight", 0.0),
        "optimizer": mem.optimizer,
        "activations": mem.activations / max(1.0, d.get("activations.in_flight", 1.0)),
    }


def compare(measurement: Measurement, estimate: Any) -> Comparison:
    """Relative errors of `estimate` (an `Estimate` or None) against `measurement`."""
    measured = _categories(measurement.memory)
    out = Comparison(measured=measured, predicted=None)
    if estimate is None:
        out.notes.append("no planner estimate available (scaletrain.planner.estimate missing)")
        return out
    predicted = _categories(estimate.memory)
    if measurement.source != "cuda":
        # the planner's total carries CUDA-only terms (runtime context); a dry-run or CPU run
        # measures allocations only, so compare against the total without them
        ctx = float(estimate.memory.buffer_terms.get("runtime_context", 0.0))
        if ctx:
            predicted["total"] -= ctx
            predicted["buffers"] -= ctx
            out.notes.append(
                "predicted total and buffers exclude the CUDA runtime context "
                f"({fmt_bytes(ctx, digits=2)}): not measurable off-GPU"
            )
    if measurement.source in ("cpu", "cuda"):  # a live run (a dry-run measures the peak)
        predicted.update(live_terms(estimate.memory))
        out.notes.append(
            "live run: params, grads and optimizer compared as resident state, "
            "activations as one micro-batch (the planner's in-flight copies and "
            "micro-batches excluded)"
        )
        if measurement.source == "cpu":  # no allocator peak: the total is the categories' sum
            predicted["total"] = sum(
                predicted[c] for c in ("params", "grads", "optimizer", "activations")
            )
    out.predicted = predicted
    for c in CATEGORIES:
        m = measured[c]
        out.rel_error[c] = (predicted[c] - m) / m if m > 0 else None
    out.time["predicted_tokens_per_s"] = float(estimate.tokens_per_s)
    out.time["predicted_step_s"] = float(estimate.time.step_s)
    out.notes += _attribution_notes(out)
    hardware = getattr(getattr(estimate, "plan", None), "hardware", None)  # tests pass stubs
    if hardware is not None and hardware.is_cpu:
        out.notes.append(
            "predicted tokens/s: on a CPU the planner's default rates are nominal (a datasheet "
            "peak at a fixed efficiency); `verify RUN --calibrate cal.toml` measures this "
            "host's, `plan --calibration cal.toml` plans with them"
        )
    return out


def _attribution_notes(c: Comparison) -> list[str]:
    """When the total agrees but params/grads/buffers do not, say so and compare their sum:
    the dry-run's tracker files gathered (unsharded) copies and communication buffers under
    the tensor's role at allocation, the planner under its own terms, so the split differs
    while the bytes agree."""
    trio = ("params", "grads", "buffers")
    assert c.predicted is not None
    total = c.rel_error.get("total")
    big = [k for k in trio if (e := c.rel_error.get(k)) is not None and abs(e) > 0.25]
    if total is None or abs(total) > 0.05 or not big:
        return []
    m = sum(c.measured[k] for k in trio)
    p = sum(c.predicted[k] for k in trio)
    u = byte_unit(max(m, p))
    return [
        f"params+grads+buffers {fmt_bytes(m, digits=2, unit=u)} measured vs "
        f"{fmt_bytes(p, digits=2, unit=u)} predicted "
        f"({(p - m) / m:+.1%}): the tracker and the planner file gathered copies and "
        f"comm buffers under different categories ({', '.join(big)} differ alone), so "
        "compare these three as one"
    ]


def metrics_throughput(path: Path) -> dict[str, float]:
    """Measured tokens/s and mean step time of a run's metrics.jsonl, as measure/throughput.py
    defines them (the same figures `scaletrain report` shows)."""
    from scaletrain.measure.throughput import step_throughput

    t = step_throughput(read_records(path))
    return (
        {} if t is None else {"measured_tokens_per_s": t.tokens_per_s, "measured_step_s": t.step_s}
    )


def job_from_dict(d: dict[str, Any]) -> JobConfig:
    """Rebuild a JobConfig from `JobConfig.to_dict()` (a run's config.json)."""
    for section in JobConfig().to_dict():  # not a table: it would become the defaults silently
        if section in d and not isinstance(d[section], dict):
            raise ConfigError(section, d[section], "a config.json section must be a table")
    raw = {k: dict(v) for k, v in d.items() if isinstance(v, dict)}
    # where the run resumed from may be gone since; it says nothing about the job's plan
    raw.get("checkpoint", {}).pop("resume", None)
    model = raw.get("model", {})
    # ModelConfig fields that are derived or unknown to load_config are dropped
    from scaletrain.config.model import MODEL_FIELDS

    raw["model"] = {
        "name": model.get("name", "gpt-mini"),
        **{k: v for k, v in model.items() if k in MODEL_FIELDS and v is not None},
    }
    return load_config(None, raw)


def verify_run(run_dir: str | Path) -> tuple[Measurement, Comparison, JobConfig]:
    """Read RUN_DIR/config.json and RUN_DIR/measurement.json; compare with the planner."""
    from .run_files import read_object

    run = Path(run_dir)
    for name in ("config.json", "measurement.json"):
        if not (run / name).exists():
            raise ConfigError(
                "run_dir",
                str(run),
                f"{name} is missing: give the directory of "
                "a finished `scaletrain train` run (its train.run_dir)",
            )
    config = read_object(run / "config.json", required=True)
    raw_measurement = read_object(run / "measurement.json", required=True)
    assert config is not None and raw_measurement is not None  # (required: raised otherwise)
    # a section that is not a table would silently become the defaults (another job's plan)
    for section in JobConfig().to_dict():
        if section in config and not isinstance(config[section], dict):
            raise ConfigError(
                "run_dir",
                str(run / "config.json"),
                f"its {section!r} is "
                f"{type(config[section]).__name__}, not a table: restore the "
                "run's config.json",
            )
    if not isinstance(raw_measurement.get("memory"), dict):
        raise ConfigError(
            "run_dir",
            str(run / "measurement.json"),
            "it has no 'memory' object (what the run measured): restore the run's measurement.json",
        )
    try:
        job = job_from_dict(config)
    except ConfigError as e:
        raise ConfigError(
            "run_dir",
            str(run / "config.json"),
            f"its {e.field} = {e.value!r} is invalid ({e.fix}): restore the run's config.json",
        ) from None
    try:
        measurement = Measurement.from_json(raw_measurement)
    except (TypeError, ValueError, AttributeError) as e:
        raise ConfigError(
            "run_dir",
            str(run / "measurement.json"),
            f"a field has the wrong type ({e}): restore the run's measurement.json",
        ) from None
    layout = job.layout(measurement.world_size)
    est = predict(job, layout)
    if est is not None and layout.pp > 1 and measurement.source in ("cpu", "cuda"):
        # a live run measured one rank: compare with that rank's stage, not the worst one
        import dataclasses

        from scaletrain.planner import pipeline_rank_memory
        from scaletrain.planner.types import plan_input_from_job

        est = dataclasses.replace(
            est,
            memory=pipeline_rank_memory(
                plan_input_from_job(job, layout), layout.pp_rank_of(measurement.rank)
            ),
        )
    comparison = compare(measurement, est)
    comparison.time.update(metrics_throughput(run / "metrics.jsonl"))
    figures, notes = input_check(job, est, read_records(run / "metrics.jsonl"), dp=layout.dp)
    comparison.time.update(figures)
    comparison.notes += notes
    if measurement.tokens_per_s and "measured_tokens_per_s" not in comparison.time:
        comparison.time["measured_tokens_per_s"] = measurement.tokens_per_s
    return measurement, comparison, job


def table_unit(comparison: Comparison) -> tuple[str, float]:
    """The one binary unit of the memory table (`config.units`): its largest figure's."""
    figures = [*comparison.measured.values(), *(comparison.predicted or {}).values()]
    return byte_unit(max(figures, default=0.0))


def format_table(comparison: Comparison, *, title: str = "") -> str:
    """Per-category memory in one binary unit (named in the header), predicted next to
    measured, with relative errors."""
    name, size = table_unit(comparison)
    lines = [title] if title else []
    lines.append(
        f"{'category':<12} {'measured ' + name:>12} {'predicted ' + name:>13} {'rel err':>8}"
    )
    for c in CATEGORIES:
        m = comparison.measured[c]
        p = comparison.predicted[c] if comparison.predicted else None
        err = comparison.rel_error.get(c)
        lines.append(
            f"{c:<12} {m / size:>12.3f} "
            f"{(f'{p / size:.3f}' if p is not None else '-'):>13} "
            f"{(f'{err:+.1%}' if err is not None else '-'):>8}"
        )
    t = comparison.time
    if "measured_tokens_per_s" in t or "predicted_tokens_per_s" in t:
        meas = t.get("measured_tokens_per_s")
        pred = t.get("predicted_tokens_per_s")
        lines.append(
            f"{'tokens/s':<12} {(f'{meas:.1f}' if meas else '-'):>12} "
            f"{(f'{pred:.1f}' if pred else '-'):>13}"
        )
    if (line := format_input(t)) is not None:
        lines.append(line)
    lines += [f"note: {n}" for n in comparison.notes]
    return "\n".join(lines)
