"""One flag set and one set of defaults for `plan`, `explain`, `dryrun` (and what `train` derives).

The defaults are the job config's own (`scaletrain.config.JobConfig`): the same flags describe the
same job in every verb. Values the user left unset that depend on others are derived here, once,
and reported: the world size (from the degrees), the precision (bf16 on an accelerator with bf16
tensor cores, else fp32), the global batch (a multiple of dp), the micro-batch (global batch /
dp, the largest the layout allows) and the vocabulary (a BPE tokenizer's size). No torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.config import (
    AC_MODES,
    OFFLOAD_MODES,
    PP_SCHEDULES,
    PRECISIONS,
    ConfigError,
    JobConfig,
    batch_problems,
    hardware_preset,
    load_config,
    parse_overrides,
    precision_problem,
)
from scaletrain.config.choices import LoraBaseDtype, names
from scaletrain.config.loading import read_toml

LORA_BASE_DTYPES = names(LoraBaseDtype)

__all__ = [
    "FLAGS",
    "add_job_flags",
    "Derived",
    "ResolvedJob",
    "resolve_job",
    "resolve_from_flags",
    "flag_for",
    "flag_overrides",
]

FLAGS: dict[str, tuple[str, str]] = {
    "model": ("model", "name"),
    "gpu": ("hardware", "gpu"),
    "gpus": ("hardware", "gpus"),
    "gpus_per_node": ("hardware", "gpus_per_node"),
    "seq_len": ("batch", "seq_len"),
    "global_batch": ("batch", "global_batch"),
    "micro_batch": ("batch", "micro_batch"),
    "dp": ("parallel", "dp"),
    "zero": ("parallel", "zero"),
    "tp": ("parallel", "tp"),
    "sp": ("parallel", "sp"),
    "pp": ("parallel", "pp"),
    "pp_schedule": ("parallel", "pp_schedule"),
    "pp_virtual": ("parallel", "pp_virtual"),
    "cp": ("parallel", "cp"),
    "ep": ("parallel", "ep"),
    "ac": ("memory", "ac"),
    "precision": ("precision", "dtype"),
    "offload": ("memory", "offload"),
    "compile": ("train", "compile"),
    "usd_per_gpu_hour": ("hardware", "usd_per_gpu_hour"),
    "efficiency": ("hardware", "efficiency"),
    "pue": ("hardware", "pue"),
    "grid_co2": ("hardware", "grid_kg_co2_per_kwh"),
    "host_watts": ("hardware", "host_watts_per_node"),
    "host_memory_gb": ("hardware", "host_memory_gb"),
    "lora_rank": ("lora", "rank"),
    "lora_targets": ("lora", "targets"),
    "lora_base_dtype": ("lora", "base_dtype"),
}
"""flag dest -> (section, key) of the job config it sets."""

_DEGREES = ("dp", "zero", "tp", "sp", "pp", "pp_schedule", "pp_virtual", "cp", "ep")
_SEED_GLOBAL_BATCH = JobConfig().batch.global_batch
_DEFAULT_MICRO_BATCH = JobConfig().batch.micro_batch


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by plan, explain and dryrun; unset ones take the job config's defaults."""
    d = JobConfig()
    a = parser.add_argument
    a("--config", metavar="F.toml", help="job TOML (flags override its values)")
    a(
        "--model",
        metavar="NAME|config.json",
        help=f"model preset or Hugging Face config.json (default {d.model.name})",
    )
    a(
        "--gpus",
        type=int,
        metavar="N",
        help="number of GPUs (default: the config's, else dp*tp*pp*cp when --dp is given, else 1)",
    )
    a("--gpu", metavar="TYPE", help=f"hardware preset (default {d.hardware.gpu})")
    a("--gpus-per-node", type=int, metavar="N", help="override the preset's GPUs per node")
    a("--seq-len", type=int, metavar="N", help=f"tokens per sequence (default {d.batch.seq_len})")
    a(
        "--global-batch",
        type=int,
        metavar="N",
        help="sequences per optimizer step (default "
        f"{d.batch.global_batch}, raised to a multiple of dp)",
    )
    a(
        "--micro-batch",
        type=int,
        metavar="N",
        help="sequences per micro-batch per dp rank "
        "(default: global batch / dp, no accumulation; a search chooses it)",
    )
    a("--dp", type=int, metavar="N")
    a("--zero", type=int, choices=(0, 1, 2, 3))
    a("--tp", type=int, metavar="N")
    a("--sp", action="store_true", default=None, help="sequence parallel (with --tp)")
    a("--pp", type=int, metavar="N")
    a("--pp-schedule", choices=PP_SCHEDULES)
    a("--pp-virtual", type=int, metavar="V", help="model chunks per rank (interleaved)")
    a("--cp", type=int, metavar="N")
    a("--ep", type=int, metavar="N")
    a("--ac", choices=AC_MODES, help=f"activation checkpointing (default {d.memory.ac})")
    a(
        "--precision",
        choices=PRECISIONS,
        help="compute precision (default: bf16 on a GPU with bf16 tensor cores, else fp32)",
    )
    a("--compile", action="store_true", default=None)
    a("--offload", choices=OFFLOAD_MODES, help=f"CPU offload (default {d.memory.offload})")
    a(
        "--host-memory-gb",
        type=float,
        metavar="GB",
        help="host RAM per node that offload may fill (default: the preset's; 0 = unknown)",
    )
    a("--lora-rank", type=int, metavar="R", help="LoRA adapters of rank R (default 0: none)")
    a(
        "--lora-targets",
        metavar="LIST",
        help=f"projections with adapters (default {d.lora.targets})",
    )
    a(
        "--lora-base-dtype",
        choices=LORA_BASE_DTYPES,
        help="how the frozen projections are stored: auto (fp32), bf16, int8, nf4 (QLoRA)",
    )


def flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """{section: {key: value}} for the flags the user gave."""
    out: dict[str, dict[str, Any]] = {}
    for flag, (section, key) in FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            out.setdefault(section, {})[key] = value
    return out


@dataclass(frozen=True)
class Derived:
    """A value the user left unset, filled in from the others."""

    field: str
    value: Any
    why: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value} (derived: {self.why})"


@dataclass
class ResolvedJob:
    job: JobConfig
    world_size: int
    derived: list[Derived] = field(default_factory=list)
    given: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What the TOML file and the flags/overrides set, by section."""

    def is_given(self, section: str, key: str) -> bool:
        return key in self.given.get(section, {})

    def notes(self) -> list[str]:
        return [str(d) for d in self.derived]

    @property
    def pinned_degrees(self) -> bool:
        """True when the user named any degree (flags, or a TOML layout)."""
        return any(self.is_given("parallel", k) for k in _DEGREES)


def _given(
    config_path: str | Path | None, overrides: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    raw: dict[str, dict[str, Any]] = {}
    if config_path is not None:
        # (the file's every fault is one ConfigError naming it, as load_config reports it)
        raw = {k: dict(v) for k, v in read_toml(Path(config_path)).items() if isinstance(v, dict)}
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    return raw


def _world(job: JobConfig, world_size: int | None) -> tuple[int, Derived | None]:
    if world_size is not None:
        return world_size, None
    if job.hardware.gpus:
        return job.hardware.gpus, None
    p = job.parallel
    if p.dp != -1:
        n = p.dp * p.tp * p.pp * p.cp
        return n, Derived("hardware.gpus", n, "dp*tp*pp*cp of the layout")
    return 1, None


@dataclass
class _Derivation:
    """The values `resolve_job` derives: overrides to reload the config with, each one that
    differs from the default recorded in `res.derived` with its reason."""

    res: ResolvedJob
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)

    def put(self, section: str, key: str, value: Any, why: str, default: Any) -> None:
        self.extra.setdefault(section, {})[key] = value
        if value != default:
            self.res.derived.append(Derived(f"{section}.{key}", value, why))


def _derive_dtype(d: _Derivation, job: JobConfig) -> None:
    """bf16 on a GPU with bf16 tensor cores, unless the precision is given."""
    if not d.res.is_given("precision", "dtype"):
        hw = hardware_preset(job.hardware.gpu)
        # the rule `train` refuses by (config.hardware_rules), not the datasheet's rate table
        if job.hardware.gpu != "cpu" and precision_problem("bf16", hw.arch, hw.name) is None:
            d.put(
                "precision",
                "dtype",
                "bf16",
                f"{hw.name} has bf16 tensor cores",
                job.precision.dtype,
            )


def _derive_vocab(d: _Derivation, job: JobConfig) -> None:
    """The BPE tokenizer's vocabulary size, unless the model's is given."""
    if (
        not d.res.is_given("model", "vocab_size")
        and job.data.tokenizer == "bpe"
        and job.model.vocab_size != job.data.bpe_vocab_size
    ):
        d.put(
            "model",
            "vocab_size",
            job.data.bpe_vocab_size,
            "the BPE tokenizer's size (data.bpe_vocab_size)",
            job.model.vocab_size,
        )


def _derive_batch(
    d: _Derivation, job: JobConfig, world: int, *, micro_batch_given: bool, search: bool
) -> None:
    """A global batch dp divides, and the micro-batch, unless given."""
    dp = _dp(job, world)
    gb = job.batch.global_batch
    if not d.res.is_given("batch", "global_batch") and dp and gb % dp:
        gb = dp * -(-_SEED_GLOBAL_BATCH // dp)
        d.put(
            "batch",
            "global_batch",
            gb,
            f"the smallest multiple of dp={dp} >= {_SEED_GLOBAL_BATCH}",
            job.batch.global_batch,
        )
    if not micro_batch_given:
        if dp and gb % dp and not search:  # gb given: say so before a micro-batch is derived
            lo, hi = dp * (gb // dp), dp * -(-gb // dp)
            raise ConfigError(
                "batch.global_batch",
                gb,
                f"must be a multiple of dp={dp} (global batch = dp x micro-batch x "
                f"accumulation steps): use {' or '.join(str(v) for v in (lo, hi) if v)}",
            )
        mb = _micro_batch(job, world, gb, dp) if dp and not search else None
        if mb is None:  # nothing to derive from: the layout's own errors name the fix
            fallback = _DEFAULT_MICRO_BATCH if gb % _DEFAULT_MICRO_BATCH == 0 else 1
            d.extra.setdefault("batch", {})["micro_batch"] = fallback
            if search:
                d.extra["batch"]["micro_batch"] = 1  # the planner's search chooses it
        elif dp:
            d.put(
                "batch",
                "micro_batch",
                mb,
                f"global batch {gb} / dp {dp}"
                + ("" if mb * dp == gb else f" / {gb // (mb * dp)} micro-batches"),
                _DEFAULT_MICRO_BATCH,
            )


def resolve_job(
    config_path: str | Path | None,
    overrides: dict[str, dict[str, Any]] | list[str] | None = None,
    *,
    world_size: int | None = None,
    search: bool = False,
) -> ResolvedJob:
    """The job `config_path` + `overrides` describe, with unset dependent values derived.

    `world_size`: the run's real world size (train); None derives it from the config. `search`:
    the planner will choose the layout and micro-batch, so neither is derived here.
    """
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    overrides = overrides or {}
    given = _given(config_path, overrides)
    mb_given = "micro_batch" in given.get("batch", {})
    if not mb_given:  # provisional: the default micro-batch may not divide the global batch
        overrides = {**overrides, "batch": {**overrides.get("batch", {}), "micro_batch": 1}}
    job = load_config(config_path, overrides)
    world, note = _world(job, world_size)
    derived = [note] if note else []
    res = ResolvedJob(job, world, derived, given)
    d = _Derivation(res)
    _derive_dtype(d, job)
    _derive_vocab(d, job)
    _derive_batch(d, job, world, micro_batch_given=mb_given, search=search)
    extra = d.extra
    if extra:
        merged = {s: {**overrides.get(s, {}), **extra.get(s, {})} for s in {*overrides, *extra}}
        res.job = load_config(config_path, merged)
    return res


def flag_for(field: str) -> str | None:
    """The flag that sets job-config `field` ("batch.global_batch" -> "--global-batch")."""
    section, _, key = field.partition(".")
    for dest, where in FLAGS.items():
        if where == (section, key):
            return "--" + dest.replace("_", "-")
    return None


def resolve_from_flags(args: argparse.Namespace, *, search: bool = False) -> ResolvedJob:
    """`resolve_job` for plan/explain/dryrun: an error in a value given as a flag names the
    flag, not the config field."""
    given = flag_overrides(args)
    try:
        return resolve_job(getattr(args, "config", None), given, search=search)
    except ConfigError as e:
        section, _, key = e.field.partition(".")
        flag = flag_for(e.field)
        if flag and key in given.get(section, {}):
            raise ConfigError(flag, e.value, e.fix) from None
        raise


def _dp(job: JobConfig, world: int) -> int | None:
    """The data-parallel degree the layout will have (None: not known yet)."""
    p = job.parallel
    if p.dp != -1:
        return p.dp
    rest = p.tp * p.pp * p.cp
    return world // rest if world % rest == 0 else None


def _micro_batch(job: JobConfig, world: int, global_batch: int, dp: int) -> int | None:
    """The largest micro-batch the layout's batch rules allow (no accumulation when possible)."""
    if global_batch % dp:
        return None
    try:
        layout = job.parallel.resolve(world)
    except ConfigError:
        return None
    per_rank = global_batch // dp
    for mb in range(per_rank, 0, -1):
        if per_rank % mb == 0 and not batch_problems(layout, global_batch, mb):
            return mb
    return None
