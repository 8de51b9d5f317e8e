"""One flag set and one set of defaults for `plan`, `explain`, `dryrun` (and what `train` derives).

The defaults are the job config's own (`scaletrain.config.JobConfig`): the same flags describe the
same job in every verb. Values the user left unset that depend on others are derived here, once,
and reported: the world size (from the degrees), the precision (bf16 on an accelerator with bf16
tensor cores, else fp32), a real model's sequence length and global batch under plan / explain /
dryrun (`config.run_defaults`: its context length, a batch in tokens from GPT-3's ladder), the
global batch (a multiple of dp), the micro-batch (global batch / dp, the largest the layout
allows) and the vocabulary (a BPE tokenizer's size). No torch.
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
    load_config,
    parse_overrides,
    precision_problem,
)
from scaletrain.config.choices import LoraBaseDtype, names
from scaletrain.config.loading import read_hardware_file, read_toml
from scaletrain.config.run_defaults import PRETRAIN_SEQ_LEN, run_defaults

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
    "unplanned",
    "PLANNED_BY_CLI",
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
    "storage_gb_per_s": ("hardware", "storage_gb_per_s"),
    "host_memory_gib": ("hardware", "host_memory_gib"),
    "lora_rank": ("lora", "rank"),
    "lora_targets": ("lora", "targets"),
    "lora_base_dtype": ("lora", "base_dtype"),
}
"""flag dest -> (section, key) of the job config it sets."""

_DEGREES = ("dp", "zero", "tp", "sp", "pp", "pp_schedule", "pp_virtual", "cp", "ep")
_DEFAULT_MICRO_BATCH = JobConfig().batch.micro_batch


OVERRIDES_HELP = """\
Any job config field can also be given as --section.key=value, parsed and
checked as `scaletrain train` does (its --help lists the sections and fields),
e.g. --model.moe_capacity_factor=1.25 --precision.tf32=false; an unknown field
or a bad value is one error line naming the field. Precedence, lowest first:
the job TOML (--config), the --hardware file, then the command line. A flag and
an override set the same level, so one field given both ways (--tp 4 with
--parallel.tp=2) is refused: give one. An override no plan reads (optim.lr,
train.steps, ...) is taken and named in one note (dryrun: not in its planner
column, though the dry-run runs it)."""


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by plan, explain and dryrun; unset ones take the job config's defaults.
    Their `--section.key=value` overrides are described in the epilog (`OVERRIDES_HELP`)."""
    d = JobConfig()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = OVERRIDES_HELP
    a = parser.add_argument
    a("--config", metavar="F.toml", help="job TOML (flags override its values)")
    a(
        "--model",
        metavar="NAME|config.json|org/name",
        help="model preset, Hugging Face config.json (or its directory), or a hub id found "
        f"in the local Hugging Face cache, never downloaded (default {d.model.name})",
    )
    a(
        "--gpus",
        type=int,
        metavar="N",
        help="number of GPUs (default: the config's, else dp*tp*pp*cp when --dp is given, else 1)",
    )
    a("--gpu", metavar="TYPE", help=f"hardware preset (default {d.hardware.gpu})")
    a(
        "--hardware",
        metavar="F.toml",
        help="a [hardware] table: a device described in TOML (peak_tflops, memory_gib, "
        "memory_bw_gb_s, intra/inter_node_bw_gb_s, latencies, power_w, arch) or a preset's "
        "figures changed; over --config's, under the flags",
    )
    a("--gpus-per-node", type=int, metavar="N", help="override the preset's GPUs per node")
    a(
        "--seq-len",
        type=int,
        metavar="N",
        help="tokens per sequence (default: a real model's context length, at most "
        f"{PRETRAIN_SEQ_LEN}; the toy models' {d.batch.seq_len})",
    )
    a(
        "--global-batch",
        type=int,
        metavar="N",
        help="sequences per optimizer step (default: a real model's GPT-3-ladder batch in "
        f"tokens / seq-len; the toy models' {d.batch.global_batch}; raised to a multiple of dp)",
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
        "--host-memory-gib",
        type=float,
        metavar="GiB",
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
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The command line's `--section.key=value` overrides alone (plan, explain, dryrun), as
    text by section."""

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
        hw = job.hardware.spec()
        # the rule `train` refuses by (config.hardware_rules), not the datasheet's rate table
        if not hw.is_cpu and precision_problem("bf16", hw.arch, hw.name) is None:
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


def _derive_run_size(d: _Derivation, job: JobConfig) -> int:
    """A named real model's sequence length and global batch (`config.run_defaults`: its
    context length, a realistic batch in tokens), each unless given; returns the global batch
    the rest of the derivation starts from."""
    gb = job.batch.global_batch
    defaults = run_defaults(job.model)
    if defaults is None:
        return gb
    if not d.res.is_given("batch", "seq_len"):
        d.put("batch", "seq_len", defaults.seq_len, defaults.seq_why, job.batch.seq_len)
    if not d.res.is_given("batch", "global_batch"):
        gb = defaults.global_batch
        d.put("batch", "global_batch", gb, defaults.batch_why, job.batch.global_batch)
    return gb


def _derive_batch(
    d: _Derivation,
    job: JobConfig,
    world: int,
    *,
    micro_batch_given: bool,
    search: bool,
    global_batch: int,
    real_model: bool = False,
) -> None:
    """A global batch dp divides, and the micro-batch, unless given. `global_batch` is the
    batch so far (the job's, or a real model's default). The micro-batch is the largest the
    layout allows (no accumulation), or for a real model planned at its own defaults
    (`real_model`) the smallest: one sequence of thousands of tokens per micro-batch, with
    gradient accumulation, as published runs of such models do (torchtitan's Llama 3 local
    batch 1-2, Megatron-LM's and NeMo's MBS 1)."""
    dp = _dp(job, world)
    gb = seed = global_batch
    if not d.res.is_given("batch", "global_batch") and dp and gb % dp:
        gb = dp * -(-seed // dp)
        d.put(
            "batch",
            "global_batch",
            gb,
            f"the smallest multiple of dp={dp} >= {seed}",
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
        mb = _micro_batch(job, world, gb, dp, smallest=real_model) if dp and not search else None
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
                + ("" if mb * dp == gb else f" / {gb // (mb * dp)} micro-batches")
                + (" (a real model: the smallest micro-batch, accumulating)" if real_model else ""),
                _DEFAULT_MICRO_BATCH,
            )


def resolve_job(
    config_path: str | Path | None,
    overrides: dict[str, dict[str, Any]] | list[str] | None = None,
    *,
    world_size: int | None = None,
    search: bool = False,
    real_model_defaults: bool = False,
) -> ResolvedJob:
    """The job `config_path` + `overrides` describe, with unset dependent values derived.

    `world_size`: the run's real world size (train); None derives it from the config. `search`:
    the planner will choose the layout and micro-batch, so neither is derived here.
    `real_model_defaults` (plan, explain, dryrun): a real model (`config.run_defaults`) left
    without a sequence length or global batch is planned at its own defaults, not the
    embedded toy job's.
    """
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    overrides = overrides or {}
    given = _given(config_path, overrides)
    mb_given = "micro_batch" in given.get("batch", {})
    if not mb_given:  # provisional: the default micro-batch may not divide the global batch
        overrides = {**overrides, "batch": {**overrides.get("batch", {}), "micro_batch": 1}}
    rope_notes: list[tuple[str, int, str]] | None = [] if real_model_defaults else None
    job = load_config(config_path, overrides, extend_rope=rope_notes)
    world, note = _world(job, world_size)
    derived = [note] if note else []
    derived += [Derived(*n) for n in rope_notes or []]
    res = ResolvedJob(job, world, derived, given)
    d = _Derivation(res)
    _derive_dtype(d, job)
    _derive_vocab(d, job)
    real = real_model_defaults and run_defaults(job.model) is not None
    gb = _derive_run_size(d, job) if real else job.batch.global_batch
    # the smallest micro-batch only where the global batch is the real model's default too
    small = real and not res.is_given("batch", "global_batch")
    _derive_batch(
        d, job, world, micro_batch_given=mb_given, search=search, global_batch=gb, real_model=small
    )
    extra = d.extra
    if extra:
        merged = {s: {**overrides.get(s, {}), **extra.get(s, {})} for s in {*overrides, *extra}}
        res.job = load_config(
            config_path, merged, extend_rope=[] if rope_notes is not None else None
        )
    return res


def flag_for(field: str) -> str | None:
    """The flag that sets job-config `field` ("batch.global_batch" -> "--global-batch")."""
    section, _, key = field.partition(".")
    for dest, where in FLAGS.items():
        if where == (section, key):
            return "--" + dest.replace("_", "-")
    return None


def resolve_from_flags(
    args: argparse.Namespace, overrides: list[str] | None = None, *, search: bool = False
) -> ResolvedJob:
    """`resolve_job` for plan/explain/dryrun: an error in a value given as a flag names the
    flag, not the config field.

    `overrides`: the `--section.key=value` arguments, parsed and checked exactly as `train`
    parses them (`config.parse_overrides`, then `load_config`: an unknown field or a bad value
    is one ConfigError naming the field). Precedence, lowest first: the job TOML (`--config`),
    the `--hardware` file, then the command line, where a flag and an override are two
    spellings of one level: a field given both ways (`--tp 4 --parallel.tp=2`) is refused in
    one line (`_given_once`), whatever the values. The overrides are kept on
    `ResolvedJob.overrides` (`unplanned` names those the planner does not read)."""
    given = flag_overrides(args)
    typed: dict[str, dict[str, Any]] = parse_overrides(overrides or [])
    _given_once(given, typed)
    path = getattr(args, "hardware", None)
    from_file = read_hardware_file(path) if path is not None else {}
    merged = {s: {**typed.get(s, {}), **given.get(s, {})} for s in {*typed, *given}}
    if from_file:
        merged["hardware"] = {**from_file, **merged.get("hardware", {})}
    try:
        res = resolve_job(
            getattr(args, "config", None), merged, search=search, real_model_defaults=True
        )
    except ConfigError as e:
        section, _, key = e.field.partition(".")
        flag = flag_for(e.field)
        if flag and key in given.get(section, {}) and key not in from_file:
            raise ConfigError(flag, e.value, e.fix) from None
        overridden = key in typed.get(section, {})
        if section == "hardware" and key in from_file and not overridden:
            raise ConfigError(e.field, e.value, f"{e.fix} (--hardware {path})") from None
        raise
    res.overrides = typed
    return res


def _given_once(flags: dict[str, dict[str, Any]], typed: dict[str, dict[str, Any]]) -> None:
    """Refuse a field set both by a flag and by a `--section.key=value` override: which one
    was meant is a guess, so neither wins."""
    for section, values in typed.items():
        for key, value in values.items():
            if key in flags.get(section, {}):
                flag = flag_for(f"{section}.{key}")
                raise ConfigError(
                    f"{section}.{key}",
                    value,
                    f"given twice, as {flag} {flags[section][key]} and as "
                    f"--{section}.{key}={value}: give one",
                )


PLANNED_BY_CLI: dict[str, frozenset[str]] = {
    "data": frozenset({"tokenizer", "bpe_vocab_size"}),
    "checkpoint": frozenset({"init_from"}),
}
"""Job fields that change a plan through `resolve_job` rather than the planner's input: the
vocabulary derived from the BPE tokenizer (`_derive_vocab`) and a Hugging Face directory that
names the model (`load_config`)."""


def unplanned(overrides: dict[str, dict[str, Any]]) -> list[str]:
    """The `section.key` of each override that no plan reads: neither the planner's input
    (`planner.types.PLANNED_FIELDS`) nor the job resolution above (`PLANNED_BY_CLI`)."""
    from scaletrain.planner.types import PLANNED_FIELDS

    out = []
    for section, values in overrides.items():
        for key in values:
            read = PLANNED_FIELDS.get(section, frozenset()) | PLANNED_BY_CLI.get(
                section, frozenset()
            )
            if "*" not in read and key not in read:
                out.append(f"{section}.{key}")
    return out


def _dp(job: JobConfig, world: int) -> int | None:
    """The data-parallel degree the layout will have (None: not known yet)."""
    p = job.parallel
    if p.dp != -1:
        return p.dp
    rest = p.tp * p.pp * p.cp
    return world // rest if world % rest == 0 else None


def _micro_batch(
    job: JobConfig, world: int, global_batch: int, dp: int, *, smallest: bool = False
) -> int | None:
    """The largest micro-batch the layout's batch rules allow (no accumulation when possible),
    or with `smallest` the smallest they allow."""
    if global_batch % dp:
        return None
    try:
        layout = job.parallel.resolve(world)
    except ConfigError:
        return None
    per_rank = global_batch // dp
    order = range(1, per_rank + 1) if smallest else range(per_rank, 0, -1)
    for mb in order:
        if per_rank % mb == 0 and not batch_problems(layout, global_batch, mb):
            return mb
    return None
