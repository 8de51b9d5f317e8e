"""Published training runs (`data/published_runs.toml`): typed rows, checked on load, and the
planner's view of each one.

The corpus holds what other frameworks' users measured on real clusters (torchtitan, llm-foundry,
NeMo, DeepSpeed, GPT-NeoX, Megatron-LM; V100 to H200), one row per run with its citation. A
row that breaks the schema stops the load with one line naming the row and the field
(`ConfigError`), before anything is predicted. `plan_input` maps a row onto `PlanInput`;
`refusals` lists the layout rules (config.layout) the planner holds against it, empty when the
planner accepts the row. Torch-free, like the rest of the planner.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from scaletrain.config import (
    GB,
    HARDWARE_PRESETS,
    ConfigError,
    HardwareSpec,
    Layout,
    LoraConfig,
    ModelConfig,
    grad_accum_steps,
    hardware_preset,
    layout_problems,
    model_preset,
    option_problems,
)
from scaletrain.config.choices import (
    ACMode,
    DistOptimizer,
    FsdpEnds,
    MoeDispatcher,
    Precision,
    SyncDtype,
    literal_names,
)
from scaletrain.config.hardware_toml import describe_hardware
from scaletrain.config.lora import lora_problems
from scaletrain.config.strict import coerce, did_you_mean, scalar_type

from ..memory.lora import LORA_QUANTIZERS
from ..time.pipeline import schedule_microbatches
from ..types import MemoryBreakdown, PlanInput
from .defaults import Assumed, apply_defaults
from .registry import RECIPES

__all__ = [
    "PublishedRun",
    "RunLayout",
    "Measured",
    "MEMORY_KINDS",
    "CORPUS",
    "load_runs",
    "parse_runs",
    "plan_input",
    "run_layout",
    "refusals",
    "FRAMEWORK_RECIPE",
    "recipe_of",
    "published_peak_bytes",
]

CORPUS = "data/published_runs.toml"
"""The corpus, package data of scaletrain.planner."""

MEMORY_KINDS = ("allocated", "reserved", "unknown")
"""What a published peak counts: torch's allocated peak, the caching allocator's reservation
(what nvidia-smi and OOMs see), or not stated."""

_MODEL_KEYS = {
    "layers": "num_layers",
    "hidden": "dim",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "ffn": "ffn_dim",
    "vocab": "vocab_size",
    "norm": "norm",
    "activation": "activation",
    "position": "position",
    "tie": "tie_embeddings",
    "bias": "bias",
    "attention": "attention",
}
_EXPLICIT_NEEDS = ("layers", "hidden", "heads", "vocab")
_RUN_KEYS = {
    "name",
    "framework",
    "source",
    "gpu",
    "gpu_memory_gb",
    "cuda_context_mib",
    "hardware",
    "num_gpus",
    "seq_len",
    "model",
    "layout",
    "measured",
    "assumed",
    "added_after",
    "tuned_after",
    "step_not_comparable",
    "recipe",
    "lora",
}
_LORA_KEYS = ("rank", "targets", "base_dtype", "quantizer", "dropout", "fused_qkv")


@dataclass(frozen=True)
class RunLayout:
    """The parallel layout and batch of one run, as the source states it. The row's `layout`
    table is flat: `Layout`'s fields (zero 1 = Megatron's distributed optimizer or DeepSpeed
    ZeRO-1, 3 = FSDP FULL_SHARD / ZeRO-3) next to the ones below."""

    layout: Layout
    micro_batch: int
    global_batch: int
    ac: ACMode = "none"
    precision: Precision = "bf16"
    compile: bool = False
    compile_loss: bool | None = None
    """The framework compiled its loss with the model (None: the recipe's rule)."""
    chunked_loss: bool | None = None
    """False: the run used its framework's unchunked loss where the recipe's is chunked;
    True: the run turned on its framework's optional chunked loss (torchtitan's
    ChunkedLossWrapper) (`PlanInput.chunked_loss`; None: the recipe's)."""
    fused_norm: bool = False
    """The run's RMSNorm was a fused kernel saving its 16-bit input and rstd (torchtitan's
    norm_type 'fused_rmsnorm')."""
    comm_overlap: tuple[str, ...] = ()
    """Communication the run states it overlaps beyond its framework's defaults
    (`PlanInput.comm_overlap`, names from `time.efficiency.STATED_OVERLAPS`); the framework
    recipe charges it so, the default recipe (scaletrain's trainer) does not."""
    pp_scatter_gather: bool = False
    """The run's tree sends pipeline tensors as Megatron-LM's 2021-2023 blocking scatter/gather
    (`PlanInput.pp_scatter_gather`); the framework recipe charges it so, the default recipe
    does not."""
    head_wgrad_deferred: int = 0
    """Micro-batches whose head weight-gradient GEMM the run defers to the pipeline flush
    (`PlanInput.head_wgrad_deferred`); the framework recipe only."""
    moe_dispatcher: MoeDispatcher = "unstated"
    """A Megatron-Core run's MoE token dispatcher (`PlanInput.moe_dispatcher`); the framework
    recipe only."""
    sdpa_saved: bool | None = None
    """torchtitan's op-level SAC saves the run's SDPA kernel output (`PlanInput.sdpa_saved`;
    None: the recipe's rule, saved); the framework recipe only."""
    ac_early_stop: bool | None = None
    """Whether the run's full-AC checkpoint stops its recompute early (`PlanInput.ac_early_stop`;
    None: the recipe's `Recipe.ac_early_stop`); the framework recipe only."""
    pp_schedule_microbatches: int = 0
    """Micro-batches per pipeline schedule call, the step running several calls
    (`PlanInput.pp_schedule_microbatches`; 0 = one call over all of them); the framework
    recipe only."""
    fsdp_ends: FsdpEnds = "unstated"
    """How the FSDP2 run wraps the embedding, final norm and head (`PlanInput.fsdp_ends`,
    `config.choices.FsdpEnds`); the framework recipe only."""
    dist_optimizer: DistOptimizer = "unstated"
    """A NeMo 1.x run's optimizer as its YAML names it (`PlanInput.dist_optimizer`,
    `recipes.dist_optim`); the framework recipe only."""
    grad_sync_dtype: SyncDtype = "unstated"
    """A NeMo 1.x run's `optim.grad_sync_dtype` (`PlanInput.grad_sync_dtype`); the framework
    recipe only."""
    optimizer_dtype: SyncDtype = "unstated"
    """A NeMo 1.x run's `optim.dtype`, Apex DistributedFusedAdam's state dtype
    (`PlanInput.optimizer_dtype`); the framework recipe only."""
    fp8_params: bool | None = None
    """A NeMo 1.x run's `fp8_params` (`PlanInput.fp8_params`; None: on under fp8 precision);
    the framework recipe only."""
    given: frozenset[str] = frozenset()
    """The keys the row's `layout` table states; a framework recipe fills the others it knows
    with its framework's defaults (`recipes.defaults`)."""


@dataclass(frozen=True)
class Measured:
    """What the source measured; None = not stated."""

    memory_gib: float | None = None
    memory_kind: str = "unknown"
    tokens_per_s_per_gpu: float | None = None
    step_s: float | None = None
    mfu: float | None = None
    """Model FLOPs utilization as the source computes it (its own FLOP count)."""
    oom: bool | None = None
    pipeline_rank: int | None = None
    """The pipeline rank whose memory the source reports, when it says (nanotron's benchmark
    CSV is written by global rank 0: the first stage); None: not stated."""


@dataclass(frozen=True)
class PublishedRun:
    name: str
    framework: str
    source: str
    """URL plus table / section the numbers come from."""
    gpu: str
    """A scaletrain hardware preset (config.hardware)."""
    num_gpus: int
    seq_len: int
    model: ModelConfig
    layout: RunLayout
    measured: Measured
    gpu_memory_gb: float | None = None
    """Card capacity (decimal GB) when it differs from the preset's."""
    assumed: str = ""
    """Fields the source does not state, and where their values come from."""
    cuda_context_mib: float | None = None
    """The CUDA context (+ kernels) of the run's runtime on its cards, when the source measured
    it (MiB, as nvidia-smi shows); None: the recipe's constant."""
    added_after: str = ""
    """The planner revision (commit) before which the row was added: its figures are reported
    apart from the rows the planner was tuned on (benchmarks/planner_vs_published.py); empty
    for the rows the planner's model was built against."""
    tuned_after: str = ""
    """The planner revision (commit) of a change made while reading this row's miss: from
    then on the row is one the model was tuned on, reported with those rows even when it
    was added after the model (`held_out`)."""
    step_not_comparable: str = ""
    """Why the row's measured step time cannot be held against the planner's, when the source
    itself says the run's cards ran outside anything a preset or `hardware` figure describes
    (e.g. a power cap below the preset's board power, whose clocks no published measurement
    gives); empty: comparable. Non-empty: `measured_step_s` is None (no step error is reported
    for the row), while its memory and fit are still compared."""
    recipe: str = ""
    """The recipe of the framework version the run used when it is not its framework's
    current one (`FRAMEWORK_RECIPE`), e.g. 'deepspeed-0.4'; empty: the framework's."""
    node: tuple[tuple[str, float], ...] = ()
    """The row's `hardware` table: `[hardware]` figures (config.hardware_toml.FIGURES, in their
    TOML units) of the system the run used where the source states it differs from the
    preset's (gpus_per_node of the cluster's nodes, their NVLink wiring), applied to the
    preset by `config.hardware_toml.describe_hardware`; empty: the preset as it is."""
    lora: LoraConfig | None = None
    """The row's `lora` table: the run trained adapters of this rank on these projections over
    a frozen base stored as `base_dtype` (`PlanInput.lora_rank` / `lora_targets` /
    `lora_base`, as `plan --lora-rank` sets them); None: every parameter trained."""
    lora_quantizer: str = "native"
    """The row's `lora.quantizer`: whose quantized linear ran its 'nf4' base
    (`memory.lora.LORA_QUANTIZERS`, `PlanInput.lora_quantizer`); 'native' without it."""
    lora_dropout: float = 0.0
    """The row's `lora.dropout`: the adapters' dropout probability (`PlanInput.lora_dropout`);
    0 without it."""
    lora_fused_qkv: bool = False
    """The row's `lora.fused_qkv`: one dropout for the q/k/v adapters (`PlanInput
    .lora_fused_qkv`, LitGPT's LoRAQKVLinear); False without it."""

    def hardware(self) -> HardwareSpec:
        hw = (
            describe_hardware(self.gpu, dict(self.node)) if self.node else hardware_preset(self.gpu)
        )
        if self.gpu_memory_gb is not None:
            hw = dataclasses.replace(hw, memory_bytes=self.gpu_memory_gb * GB)
        return hw

    @property
    def held_out(self) -> bool:
        """Added after the model and not tuned on since: the rows whose figures say how the
        planner does on runs it has not seen."""
        return bool(self.added_after) and not self.tuned_after

    def measured_step_s(self) -> float | None:
        """Seconds per optimizer step: stated, or global tokens / (tokens/s/GPU x GPUs); None
        when not stated or not comparable (`step_not_comparable`)."""
        if self.step_not_comparable:
            return None
        m = self.measured
        if m.step_s is not None:
            return m.step_s
        if m.tokens_per_s_per_gpu:
            tokens = float(self.layout.global_batch) * self.seq_len
            return tokens / (m.tokens_per_s_per_gpu * self.num_gpus)
        return None


def _fail(where: str, field: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"{where}.{field}", value, fix)


def _table(where: str, raw: dict[str, Any], key: str) -> dict[str, Any]:
    v = raw.get(key, {})
    if not isinstance(v, dict):
        raise _fail(where, key, v, "write an inline table, e.g. { dp = 8 }")
    return v


def _int(where: str, field: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _fail(where, field, v, "use an integer >= 1")
    return v


def _num(where: str, field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise _fail(where, field, v, "use a positive number")
    return float(v)


def _choice(where: str, field: str, v: Any, options: tuple[str, ...]) -> str:
    if v not in options:
        raise _fail(where, field, v, f"choose one of {', '.join(options)}")
    return str(v)


def _bool(where: str, field: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _fail(where, field, v, "use true or false")
    return v


def _unknown(where: str, raw: dict[str, Any], known: set[str] | tuple[str, ...]) -> None:
    for k in raw:
        if k not in known:
            raise _fail(where, k, raw[k], f"unknown key: use one of {', '.join(sorted(known))}")


def _model(where: str, raw: dict[str, Any], seq_len: int, name: str) -> ModelConfig:
    w = where + ".model"
    _unknown(w, raw, {"preset", *_MODEL_KEYS})
    over: dict[str, Any] = {
        _MODEL_KEYS[k]: _bool(w, k, v) if k in ("tie", "bias") else v
        for k, v in raw.items()
        if k != "preset"
    }
    try:
        if "preset" in raw:
            try:
                base = model_preset(str(raw["preset"]))
            except ConfigError as e:
                raise _fail(w, "preset", e.value, e.fix) from None
            over["max_seq_len"] = max(base.max_seq_len, seq_len)
            return dataclasses.replace(base, **over)
        for k in _EXPLICIT_NEEDS:
            if k not in raw:
                raise _fail(w, k, None, f"give a preset or all of {', '.join(_EXPLICIT_NEEDS)}")
        return ModelConfig(name=name, max_seq_len=seq_len, **over)
    except ConfigError as e:
        if e.field.startswith(where):
            raise
        raise _fail(w, e.field.removeprefix("model."), e.value, e.fix) from None


_LAYOUT_FIELDS = tuple(f.name for f in dataclasses.fields(Layout))
_BATCH_FIELDS = tuple(f.name for f in dataclasses.fields(RunLayout) if f.name != "layout")
_HINTS = {**typing.get_type_hints(Layout), **typing.get_type_hints(RunLayout)}
"""The declared type of each key of a row's flat `layout` table."""


def _overlaps(field: str, v: Any) -> tuple[str, ...]:
    """A row's `comm_overlap`: a list of STATED_OVERLAPS names, each once."""
    from ..time.efficiency import STATED_OVERLAPS

    names = ", ".join(STATED_OVERLAPS)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(field, v, f"give a list of family names: {names}")
    for x in v:
        if x not in STATED_OVERLAPS:
            raise ConfigError(
                field, x, f"unknown family{did_you_mean(x, STATED_OVERLAPS)}: {names}"
            )
    if len(set(v)) != len(v):
        raise ConfigError(field, v, "name each family once")
    return tuple(v)


def _layout(where: str, raw: dict[str, Any]) -> RunLayout:
    """The flat `layout` table: Layout's fields and RunLayout's others, each value parsed as
    its declared type (`strict.coerce`: a Literal field only takes its alias's names); every
    count (degree, batch) is >= 1."""
    w = where + ".layout"
    _unknown(w, raw, (*_LAYOUT_FIELDS, *_BATCH_FIELDS))
    kw: dict[str, Any] = {}
    for k, v in raw.items():
        if k == "comm_overlap":
            kw[k] = _overlaps(f"{w}.{k}", v)
            continue
        kw[k] = coerce(f"{w}.{k}", v, _HINTS[k])
        if scalar_type(_HINTS[k]) is int and literal_names(_HINTS[k]) is None and kw[k] < 1:
            raise _fail(w, k, v, "use an integer >= 1")
    for k in ("micro_batch", "global_batch"):
        if k not in raw:
            raise _fail(w, k, None, "state the batch (sequences per micro-batch / per step)")
    layout = Layout(**{k: kw.pop(k) for k in _LAYOUT_FIELDS if k in kw})
    if "pp_schedule_microbatches" in kw:
        m = grad_accum_steps(kw["global_batch"], kw["micro_batch"], layout.dp)
        try:
            schedule_microbatches(m, kw["pp_schedule_microbatches"], layout.pp)
        except ConfigError as e:
            raise _fail(w, e.field, e.value, e.fix) from None
    return RunLayout(layout=layout, given=frozenset(raw), **kw)


def _measured(where: str, raw: dict[str, Any]) -> Measured:
    w = where + ".measured"
    _unknown(w, raw, tuple(f.name for f in dataclasses.fields(Measured)))
    kw: dict[str, Any] = {}
    for k, v in raw.items():
        if k == "memory_kind":
            kw[k] = _choice(w, k, v, MEMORY_KINDS)
        elif k == "oom":
            kw[k] = _bool(w, k, v)
        elif k == "pipeline_rank":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _fail(w, k, v, "use the pipeline rank, an integer >= 0")
            kw[k] = v
        elif k == "mfu":
            kw[k] = _num(w, k, v)
            if kw[k] > 1:
                raise _fail(w, k, v, "write MFU as a fraction (0.42, not 42)")
        else:
            kw[k] = _num(w, k, v)
    if not any(k in kw for k in ("memory_gib", "tokens_per_s_per_gpu", "step_s", "mfu", "oom")):
        raise ConfigError(
            w, raw, "state at least one of memory_gib, tokens_per_s_per_gpu, step_s, mfu, oom"
        )
    if "memory_gib" in kw and "memory_kind" not in kw:
        raise _fail(w, "memory_kind", None, f"say what the peak counts: {', '.join(MEMORY_KINDS)}")
    return Measured(**kw)


def _lora(where: str, raw: dict[str, Any], model: ModelConfig, run: RunLayout) -> LoraConfig:
    """The row's `lora` table: rank, targets (a list of `config.lora.LORA_TARGETS` names) and
    optionally base_dtype (`LoraConfig`'s default 'auto' without it), checked as the trainer's
    `[lora]` section is (`LoraConfig`, then `lora_problems` for the row's model and layout)."""
    w = where + ".lora"
    _unknown(w, raw, _LORA_KEYS)
    for k in ("rank", "targets"):
        if k not in raw:
            raise _fail(w, k, None, "state the adapters' rank and the projections they target")
    rank = _int(w, "rank", raw["rank"])
    targets = raw["targets"]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise _fail(w, "targets", targets, 'give a list of projections, e.g. ["wq", "wv"]')
    try:
        cfg = LoraConfig(
            rank=rank, targets=",".join(targets), base_dtype=raw.get("base_dtype", "auto")
        )
        problems = lora_problems(cfg, model, run.layout, run.precision)
    except ConfigError as e:
        raise _fail(w, e.field.removeprefix("lora."), e.value, e.fix) from None
    if problems:
        first = problems[0]
        raise _fail(w, first.field.removeprefix("lora."), first.value, first.fix)
    return cfg


def _lora_quantizer(where: str, raw: Any) -> str:
    """The row's `lora.quantizer` ('native' without it), one of `LORA_QUANTIZERS`, and only
    over an 'nf4' base (the only base bitsandbytes' 4-bit layers store)."""
    if not isinstance(raw, dict) or "quantizer" not in raw:
        return "native"
    q = raw["quantizer"]
    _choice(where + ".lora", "quantizer", q, LORA_QUANTIZERS)
    if q != "native" and raw.get("base_dtype") != "nf4":
        raise _fail(where + ".lora", "quantizer", q, 'set base_dtype = "nf4" or drop the quantizer')
    return str(q)


def _lora_dropout(where: str, raw: Any) -> tuple[float, bool]:
    """The row's `lora.dropout` (a probability in [0, 1), 0 without it) and `lora.fused_qkv`
    (a bool, False without it)."""
    if not isinstance(raw, dict):
        return 0.0, False
    w = where + ".lora"
    p = raw.get("dropout", 0.0)
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p < 1.0:
        raise _fail(w, "dropout", p, "use a probability in [0, 1), e.g. 0.05; 0 for none")
    fused = raw.get("fused_qkv", False)
    if not isinstance(fused, bool):
        raise _fail(w, "fused_qkv", fused, "use true or false")
    return float(p), fused


def _run(i: int, raw: Any, origin: str, seen: set[str]) -> PublishedRun:
    name = raw.get("name") if isinstance(raw, dict) else None
    where = f"{origin} runs[{i}]" + (f" ({name})" if isinstance(name, str) else "")
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, "each run is a [[runs]] table")
    _unknown(where, raw, _RUN_KEYS)
    for k in (
        "name",
        "framework",
        "source",
        "gpu",
        "num_gpus",
        "seq_len",
        "model",
        "layout",
        "measured",
    ):
        if k not in raw:
            raise _fail(where, k, None, "required: see the field list at the top of the corpus")
    for k in ("name", "framework", "source", "gpu"):
        if not isinstance(raw[k], str) or not raw[k].strip():
            raise _fail(where, k, raw[k], "use a non-empty string")
    if raw["name"] in seen:
        raise _fail(where, "name", raw["name"], "names must be unique")
    seen.add(raw["name"])
    if not raw["source"].startswith("https://"):
        raise _fail(
            where,
            "source",
            raw["source"],
            "cite a URL (https://...) and the table or section the numbers come from",
        )
    _choice(where, "gpu", raw["gpu"], tuple(HARDWARE_PRESETS))
    num_gpus = _int(where, "num_gpus", raw["num_gpus"])
    seq_len = _int(where, "seq_len", raw["seq_len"])
    gpu_mem = raw.get("gpu_memory_gb")
    if gpu_mem is not None:
        gpu_mem = _num(where, "gpu_memory_gb", gpu_mem)
    ctx_mib = raw.get("cuda_context_mib")
    if ctx_mib is not None:
        ctx_mib = _num(where, "cuda_context_mib", ctx_mib)
    node = _table(where, raw, "hardware")
    try:
        describe_hardware(raw["gpu"], node)
    except ConfigError as e:
        raise _fail(where, "hardware", node, str(e)) from None
    model = _model(where, _table(where, raw, "model"), seq_len, raw["name"])
    layout = _layout(where, _table(where, raw, "layout"))
    world = layout.layout.world_size
    if world != num_gpus:
        raise _fail(
            where,
            "layout",
            f"dp*tp*pp*cp={world}",
            f"the degrees must multiply to num_gpus={num_gpus}",
        )
    measured = _measured(where, _table(where, raw, "measured"))
    lora = _lora(where, _table(where, raw, "lora"), model, layout) if "lora" in raw else None
    quantizer = _lora_quantizer(where, raw.get("lora"))
    dropout, fused_qkv = _lora_dropout(where, raw.get("lora"))
    assumed = raw.get("assumed", "")
    if not isinstance(assumed, str):
        raise _fail(where, "assumed", assumed, "use a string")
    added_after = raw.get("added_after", "")
    if not isinstance(added_after, str) or (added_after == "" and "added_after" in raw):
        raise _fail(where, "added_after", added_after, "give the planner commit, e.g. c1f5b3a")
    tuned_after = raw.get("tuned_after", "")
    if not isinstance(tuned_after, str) or (tuned_after == "" and "tuned_after" in raw):
        raise _fail(where, "tuned_after", tuned_after, "give the planner commit, e.g. bb07f57")
    not_comparable = raw.get("step_not_comparable", "")
    if not isinstance(not_comparable, str) or (
        not_comparable.strip() == "" and "step_not_comparable" in raw
    ):
        raise _fail(
            where,
            "step_not_comparable",
            not_comparable,
            "say why the step time cannot be compared, or leave the field out",
        )
    recipe = raw.get("recipe", "")
    if recipe:
        _choice(where, "recipe", recipe, tuple(RECIPES))
    return PublishedRun(
        name=raw["name"],
        framework=raw["framework"],
        source=raw["source"],
        gpu=raw["gpu"],
        num_gpus=num_gpus,
        seq_len=seq_len,
        model=model,
        layout=layout,
        measured=measured,
        gpu_memory_gb=gpu_mem,
        assumed=assumed,
        cuda_context_mib=ctx_mib,
        added_after=added_after,
        tuned_after=tuned_after,
        step_not_comparable=not_comparable,
        recipe=recipe,
        node=tuple(sorted(node.items())),
        lora=lora,
        lora_quantizer=quantizer,
        lora_dropout=dropout,
        lora_fused_qkv=fused_qkv,
    )


def parse_runs(data: dict[str, Any], origin: str = CORPUS) -> list[PublishedRun]:
    """Rows of a parsed corpus; the first bad one raises ConfigError naming row and field."""
    _unknown(origin, data, ("runs",))
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"{origin}.runs", runs, "add at least one [[runs]] table")
    seen: set[str] = set()
    return [_run(i, r, origin, seen) for i, r in enumerate(runs)]


def load_runs(path: str | Path | None = None) -> list[PublishedRun]:
    """The corpus at `path` (default: the packaged `data/published_runs.toml`)."""
    if path is None:
        text = resources.files("scaletrain.planner").joinpath(CORPUS).read_text()
        origin = CORPUS
    else:
        text, origin = Path(path).read_text(), str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(origin, "TOML", f"fix the syntax: {e}") from None
    return parse_runs(data, origin)


FRAMEWORK_RECIPE = {
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
    "gpt-neox": "deepspeed",
    "megatron-lm": "megatron",
    "nemo": "nemo",
    "nanotron": "nanotron",
    "llm-foundry": "llm-foundry",
    "torchtune": "torchtune",
    "automodel": "automodel",
    "fms-fsdp": "fms-fsdp",
}
"""The planner recipe (planner/recipes/registry.py) of the framework a row ran: GPT-NeoX runs on
DeepSpeed, NeMo on Megatron-Core (recipe 'nemo': megatron's memory, NeMo's overlapped
communication); llm-foundry runs its own recipe (Composer's FSDP1 and the MPT block's eager
elementwise kernels, registry.py); fms-fsdp its own (torch FSDP1 under IBM's fms-fsdp, the eager
Llama block's elementwise kernels)."""


def published_peak_bytes(memory: MemoryBreakdown, kind: str) -> float:
    """The planned bytes of the kind a row publishes. 'allocated': torch's
    max_memory_allocated(), which the caching allocator counts, so the runtime context
    (CUDA context, cuBLAS workspaces, NCCL buffers: `buffer_terms['runtime_context']`, kept
    in `total` so that `fits` is honest) is taken out, as memory.buffers.RUNTIME_CONTEXT_BYTES
    prescribes. 'reserved' and 'unknown': the planner's `reserved`, context included (what
    nvidia-smi and an OOM see). Ignores: that torch's max_memory_reserved() (torchtitan's logged
    figure) also leaves the context out; those rows are compared with it in."""
    if kind == "allocated":
        return memory.total - memory.buffer_terms.get("runtime_context", 0.0)
    return memory.reserved


def recipe_of(run: PublishedRun) -> str:
    """The row's own recipe (the framework version it ran) or its framework's."""
    return run.recipe or FRAMEWORK_RECIPE.get(run.framework, "scaletrain")


def run_layout(run: PublishedRun, recipe: str = "scaletrain") -> Assumed:
    """`run`'s layout and AC mode under `recipe`: what the row states, and for a framework
    recipe its framework's defaults in the fields the row leaves out (`recipes.defaults`; the
    default recipe takes the row's parsed values, Layout's and RunLayout's defaults)."""
    L = run.layout
    if recipe == "scaletrain":
        return Assumed(layout=L.layout, ac=L.ac, lines=())
    return apply_defaults(recipe, L.layout, L.ac if "ac" in L.given else None, L.given)


def plan_input(run: PublishedRun, recipe: str = "scaletrain") -> PlanInput:
    """The planner's input for `run` under `recipe`: its model, card, layout (with the
    recipe's defaults for what the row does not state, `run_layout`), batch, AC and precision
    (AdamW, no offload, the planner's default efficiency), its LoRA adapters if it trained
    some, and the CUDA context the source measured, if it did."""
    L = run.layout
    lay = run_layout(run, recipe)
    ctx = None if run.cuda_context_mib is None else run.cuda_context_mib * 2**20
    # a row's stated attention kernel (model.attention 'naive': the framework's materialized
    # core) is the framework's; scaletrain's own recipe plans its default kernel (SDPA)
    model = (
        run.model if recipe != "scaletrain" else dataclasses.replace(run.model, attention="sdpa")
    )
    return PlanInput(
        model=model,
        hardware=run.hardware(),
        num_gpus=run.num_gpus,
        layout=lay.layout,
        seq_len=run.seq_len,
        global_batch=L.global_batch,
        micro_batch=L.micro_batch,
        precision=L.precision,
        ac=lay.ac,
        compile=L.compile,
        compile_loss=L.compile_loss,
        chunked_loss=L.chunked_loss,
        fused_norm=L.fused_norm,
        recipe=recipe,
        runtime_context_bytes=ctx,
        assumed=lay.lines,
        comm_overlap=L.comm_overlap if recipe != "scaletrain" else (),
        pp_scatter_gather=L.pp_scatter_gather and recipe != "scaletrain",
        head_wgrad_deferred=L.head_wgrad_deferred if recipe != "scaletrain" else 0,
        moe_dispatcher=L.moe_dispatcher if recipe != "scaletrain" else "unstated",
        fsdp_ends=L.fsdp_ends if recipe != "scaletrain" else "unstated",
        pp_schedule_microbatches=L.pp_schedule_microbatches if recipe != "scaletrain" else 0,
        sdpa_saved=L.sdpa_saved if recipe != "scaletrain" else None,
        ac_early_stop=L.ac_early_stop if recipe != "scaletrain" else None,
        dist_optimizer=L.dist_optimizer if recipe != "scaletrain" else "unstated",
        grad_sync_dtype=L.grad_sync_dtype if recipe != "scaletrain" else "unstated",
        optimizer_dtype=L.optimizer_dtype if recipe != "scaletrain" else "unstated",
        fp8_params=L.fp8_params if recipe != "scaletrain" else None,
        lora_rank=0 if run.lora is None else run.lora.rank,
        lora_targets=() if run.lora is None else run.lora.target_names,
        lora_base="auto" if run.lora is None else run.lora.base_dtype,
        lora_quantizer=run.lora_quantizer,
        lora_dropout=run.lora_dropout,
        lora_fused_qkv=run.lora_fused_qkv,
    )


def refusals(run: PublishedRun, recipe: str = "scaletrain") -> list[str]:
    """Why the planner refuses `run` under `recipe` (config.layout's rules, scaletrain's
    trainer limits only for its own recipe, then the recipe's); [] = accepted."""
    from .memory import recipe_problems

    L = run.layout
    lay = run_layout(run, recipe)
    own = recipe == "scaletrain"
    problems = layout_problems(
        lay.layout,
        run.model,
        world_size=run.num_gpus,
        global_batch=L.global_batch,
        micro_batch=L.micro_batch,
        seq_len=run.seq_len,
        trainer_rules=own,
    )
    if own:
        problems += option_problems(lay.layout, offload="none", precision=L.precision)
    problems += recipe_problems(
        recipe, lay.layout, ac=lay.ac, lora=0 if run.lora is None else run.lora.rank
    )
    return [str(p) for p in problems]
