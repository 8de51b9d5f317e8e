"""Read a run directory into one `RunData`, and hold what it measured against the planner.

Everything except `config.json` or `metrics.jsonl` is optional: a run that died of OOM has no
metrics worth plotting but an `oom_report_rank*.json`; a run from before `measurement.json`
existed still has its curves. Lines that do not parse (a run killed mid-write) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError, JobConfig

__all__ = ["RunData", "Prediction", "load_run", "predict_run", "plan_input", "MEMORY_CATEGORIES"]

MEMORY_CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")
LOST = {
    "config.json": "plan, planner predictions or configuration",
    "run_info.json": "headline numbers from run_info (steps, best loss, rollbacks)",
    "measurement.json": "measured memory or memory timeline",
    "oom_report": "OOM report for that rank",
    "metrics.jsonl": "loss, throughput or optimizer curves",
}
"""What the report cannot show without each file."""


@dataclass
class RunData:
    run_dir: Path
    config: dict[str, Any]
    """config.json as written (`JobConfig.to_dict()`); {} when missing."""
    job: JobConfig | None
    """The config rebuilt; None when config.json is missing or no longer loads."""
    job_error: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    """run_info.json: the trainer's headline numbers (steps, tokens_per_s, best_loss, ...)."""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """metrics.jsonl in file order (a rollback re-logs the steps it redoes)."""
    guard: list[dict[str, Any]] = field(default_factory=list)
    measurement: dict[str, Any] | None = None
    oom: list[dict[str, Any]] = field(default_factory=list)
    sample: str | None = None
    checkpoints: list[Path] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)
    """File name -> what is wrong with it, for each file that is there but could not be read
    (or, for config.json, no longer loading): the report is written without what it holds, says
    so at the top of the page, and `scaletrain report` warns and exits 1. An absent file is no
    damage (config.json too: a metrics-only directory gives a curves-only page, exit 0)."""

    def damage_line(self) -> str:
        """One line: each damaged file, why, and what the report could not show."""
        return "; ".join(
            f"{name} ({why}): no {LOST.get(name.split('_rank')[0], 'contents')}"
            for name, why in self.damaged.items()
        )

    @property
    def world_size(self) -> int:
        from scaletrain.measure.run_files import whole

        # (a damaged or hand-edited file's non-number is passed over)
        for src in (self.info, self.measurement or {}):
            if (n := whole(src.get("world_size"))) is not None and n >= 1:
                return n
        hw = self.config.get("hardware")
        n = whole(hw.get("gpus")) if isinstance(hw, dict) else None
        return n if n is not None and n >= 1 else 1

    @property
    def best_loss(self) -> float | None:
        from scaletrain.measure.run_files import finite

        return finite(self.info.get("best_loss"))


@dataclass
class Prediction:
    """The planner's numbers for the run's plan, next to what the run measured."""

    estimate: Any | None
    """`scaletrain.planner.Estimate`, or None when the planner cannot evaluate this plan."""
    error: str = ""
    memory_predicted: dict[str, float] | None = None
    memory_measured: dict[str, float] | None = None
    memory_rel_error: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tokens_per_s: tuple[float | None, float | None] = (None, None)
    """(predicted, measured) whole-job tokens per second."""
    mfu: tuple[float | None, float | None] = (None, None)
    step_s: tuple[float | None, float | None] = (None, None)
    """(predicted, measured) seconds per optimizer step; measured: the mean of the timed steps
    of metrics.jsonl (measure/throughput.py, the figure `scaletrain verify` reads)."""


def _read_json(path: Path) -> Any:
    """The JSON object in `path`, or None (missing or damaged: the report shows what it has)."""
    from scaletrain.measure.run_files import read_object

    return read_object(path)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from scaletrain.measure.run_files import read_records

    return read_records(path)


def _no_records(path: Path) -> str | None:
    """Why a metrics file that is there gave no records (None: absent, or empty so far)."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        text = path.read_bytes()
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    return "no JSON-object line in it" if text.strip() else None


def load_run(run_dir: str | Path) -> RunData:
    """Everything the report shows, read from RUN_DIR; ConfigError if it is not a run."""
    d = Path(run_dir)
    fix = (
        "give the train.run_dir of a `scaletrain train` run (it holds config.json and "
        "metrics.jsonl)"
    )
    if not d.is_dir():
        raise ConfigError("run_dir", str(d), f"no such directory: {fix}")
    if not (d / "config.json").is_file() and not (d / "metrics.jsonl").is_file():
        raise ConfigError(
            "run_dir", str(d), f"neither config.json nor metrics.jsonl is there: {fix}"
        )
    from scaletrain.measure.run_files import damage

    damaged = {
        p.name: why
        for p in (d / "config.json", d / "run_info.json", d / "measurement.json")
        if (why := damage(p))
    }
    damaged.update(
        {p.name: why for p in sorted(d.glob("oom_report_rank*.json")) if (why := damage(p))}
    )
    measurement = _read_json(d / "measurement.json")
    if measurement is not None:
        from scaletrain.measure.schema import Measurement

        try:
            if not isinstance(measurement.get("memory"), dict):  # what verify refuses too
                raise ValueError("no 'memory' object (what the run measured)")
            Measurement.from_json(measurement)
        except (TypeError, ValueError, AttributeError, KeyError) as e:
            damaged["measurement.json"] = f"a field is missing or has the wrong type: {e}"
    metrics = _read_jsonl(d / "metrics.jsonl")
    if not metrics and (why := _no_records(d / "metrics.jsonl")):
        damaged["metrics.jsonl"] = why
    config = _read_json(d / "config.json") or {}
    job, job_error = None, ""
    if config:
        from scaletrain.measure.verify import job_from_dict

        try:
            job = job_from_dict(config)
        except (ConfigError, TypeError, ValueError) as e:  # a config from an older version
            job_error = f"{type(e).__name__}: {e}"
            damaged["config.json"] = f"no longer loads: {job_error}"
    sample = None
    if (d / "sample.txt").is_file():
        sample = (d / "sample.txt").read_text(errors="replace")
    ckpt_root = d / "checkpoints"
    checkpoints = (
        sorted(p for p in ckpt_root.glob("step_*") if p.is_dir()) if ckpt_root.is_dir() else []
    )
    oom = [r for p in sorted(d.glob("oom_report_rank*.json")) if (r := _read_json(p))]
    return RunData(
        run_dir=d,
        config=config,
        job=job,
        job_error=job_error,
        info=_read_json(d / "run_info.json") or {},
        metrics=metrics,
        guard=_read_jsonl(d / "guard.jsonl"),
        measurement=measurement,
        oom=oom,
        sample=sample,
        checkpoints=checkpoints,
        damaged=damaged,
    )


def _hardware(run: RunData):
    """The hardware the run computed its MFU against (run_info names it), else the config's."""
    from scaletrain.config import HARDWARE_PRESETS, hardware_preset

    name = run.info.get("hardware")
    if name in HARDWARE_PRESETS and run.job is not None and name != run.job.hardware.gpu:
        return hardware_preset(name)
    return run.job.hardware_spec() if run.job is not None else None


def plan_input(job: JobConfig, world_size: int, hardware=None):
    """The planner's view of `job` on `world_size` ranks, built from the config alone so a
    finished run can be re-planned without building it."""
    from scaletrain.planner.types import plan_input_from_job

    return plan_input_from_job(job, job.layout(world_size), hardware=hardware)


def _measured_throughput(run: RunData) -> tuple[float | None, float | None, float | None]:
    """(tokens/s, MFU, step seconds) of the run as measure/throughput.py defines them (the
    figures `scaletrain verify` shows), else run_info's tokens/s and MFU (the trainer's same
    ratio, when metrics.jsonl is missing; it holds no step time)."""
    from scaletrain.measure.throughput import step_throughput

    t = step_throughput(run.metrics)
    if t is not None:
        return t.tokens_per_s, t.mfu, t.step_s
    from scaletrain.measure.run_files import finite

    if tok := finite(run.info.get("tokens_per_s")):
        return tok, finite(run.info.get("mfu")), None
    return None, None, None


def predict_run(run: RunData) -> Prediction:
    """The planner's estimate for the run's plan and the relative errors of every category.

    Relative error = (predicted - measured) / measured, as `scaletrain verify` computes it
    (`scaletrain.measure.verify.compare`, which also drops CUDA-only terms off-GPU).
    """
    tok_meas, mfu_meas, step_meas = _measured_throughput(run)
    out = Prediction(estimate=None)
    if run.job is None:
        out.error = f"config.json {run.damaged.get('config.json', 'missing')}"
    else:
        try:
            from scaletrain.planner import estimate

            out.estimate = estimate(plan_input(run.job, run.world_size, _hardware(run)))
        except Exception as e:  # the report must render whatever the planner thinks
            out.error = f"{type(e).__name__}: {e}"
    est = out.estimate
    out.tokens_per_s = (float(est.tokens_per_s) if est is not None else None, tok_meas)
    out.mfu = (
        float(est.mfu) if est is not None else None,
        float(mfu_meas) if mfu_meas is not None else None,
    )
    out.step_s = (float(est.time.step_s) if est is not None else None, step_meas)
    if run.measurement is not None:
        from scaletrain.measure.schema import Measurement
        from scaletrain.measure.verify import compare

        try:
            cmp = compare(Measurement.from_json(run.measurement), est)
        except (TypeError, ValueError, AttributeError) as e:
            out.notes.append(f"measurement.json unreadable: {e}")
        else:
            out.memory_measured, out.memory_predicted = cmp.measured, cmp.predicted
            out.memory_rel_error, out.notes = dict(cmp.rel_error), [*out.notes, *cmp.notes]
    elif est is not None:
        out.memory_predicted = {
            c: float(getattr(est.memory, c)) for c in (*MEMORY_CATEGORIES, "total", "reserved")
        }
    return out
