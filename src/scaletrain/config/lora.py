"""`[lora]`: low-rank adapters (Hu et al. 2021, "LoRA") on a frozen base model.

Each targeted projection W (out x in) gains A (rank x in) and B (out x rank): y = W x +
(alpha / rank) B A dropout(x). B starts at zero (the model starts as the base), A as PEFT's
(Kaiming-uniform, a = sqrt(5)); only A and B are trained, so only they have gradients and
optimizer states. The adapters are written in PEFT's format at the end of the run.

`base_dtype` stores every frozen projection of the blocks (all seven, adapted or not, as
torchtune's QLoRA does) in bf16, NF4 or int8 (`models.quantized`; QLoRA, Dettmers et al.
2023); the embedding, norms and head keep the trainable parameters' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import ConfigError, require
from .choices import LoraBaseDtype, check_choices
from .layout_facts import split_backward, stage_ids, stage_layer_ranges

if TYPE_CHECKING:
    from .layout import Layout
    from .model import ModelConfig

__all__ = [
    "LORA_TARGETS",
    "LoraConfig",
    "lora_problems",
    "projection_shapes",
    "ROW_PARALLEL",
    "tp_shapes",
    "NF4_BLOCK",
    "NF4_SCALER_BLOCK",
    "nf4_scaler_block",
]

NF4_BLOCK = 64
"""Values per NF4 absmax block (QLoRA, Dettmers et al. 2023, sec. 3: block size 64)."""
NF4_SCALER_BLOCK = 256
"""Block absmaxes per int8 second-level block (QLoRA sec. 3, Double Quantization: 256)."""


def nf4_scaler_block(numel: int) -> int:
    """The second-level block of a weight of `numel` values: QLoRA's 256 where the weight has
    a multiple of 256 blocks of 64 (every projection of the 1B+ presets), else the largest
    power-of-two divisor of 256 that divides its block count (small test models)."""
    return math.gcd(NF4_SCALER_BLOCK, numel // NF4_BLOCK)


LORA_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
"""The projections an adapter can target: attention q/k/v/out, MLP w1 (gate or up), w2
(down), w3 (SwiGLU's up); PEFT / HF Llama names q_proj, k_proj, v_proj, o_proj, gate_proj,
down_proj, up_proj."""


@dataclass
class LoraConfig:
    rank: int = 0
    """Adapter rank r; 0 (default) = no LoRA: the whole model trains."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input (training only)."""
    targets: str = "wq,wk,wv,wo"
    """Comma-separated projections that get adapters: wq, wk, wv, wo, w1, w2, w3."""
    base_dtype: LoraBaseDtype = "auto"
    """How the frozen projections of the blocks (all seven, adapted or not) are stored:
    'auto' as the trainable parameters; 'bf16'; 'nf4' (QLoRA's 4-bit NormalFloat with double
    quantization, torchao's NF4Tensor: 0.52 B per value); 'int8' (per-row int8 codes and
    scales: 1 B per value). Dequantized per projection in forward and again in backward."""

    def __post_init__(self) -> None:
        check_choices(self, "lora")  # base_dtype
        require(
            isinstance(self.rank, int) and self.rank >= 0,
            "lora.rank",
            self.rank,
            "use 0 (no LoRA) or a positive rank such as 8",
        )
        require(self.alpha > 0, "lora.alpha", self.alpha, "use a positive float such as 16")
        require(0 <= self.dropout < 1, "lora.dropout", self.dropout, "use 0 <= dropout < 1")
        names = self.target_names
        bad = [t for t in names if t not in LORA_TARGETS]
        require(
            bool(names) and not bad,
            "lora.targets",
            self.targets,
            f"give comma-separated names among {', '.join(LORA_TARGETS)}",
        )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())

    @property
    def quantized(self) -> bool:
        """Whether the frozen projections are stored in another form than the parameters'."""
        return self.enabled and self.base_dtype != "auto"

    @property
    def scale(self) -> float:
        """alpha / rank: the adapters' output scale."""
        return self.alpha / self.rank


def projection_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection of a block (nn.Linear's weight shape): what
    `lora.base_dtype` stores quantized, and what the planner counts per block."""
    shapes = {
        "wq": (model.q_dim, model.dim),
        "wk": (model.kv_dim, model.dim),
        "wv": (model.kv_dim, model.dim),
        "wo": (model.dim, model.q_dim),
        "w1": (model.ffn_dim, model.dim),
        "w2": (model.dim, model.ffn_dim),
    }
    if model.gated_mlp:
        shapes["w3"] = (model.ffn_dim, model.dim)
    return shapes


ROW_PARALLEL = ("wo", "w2")
"""The projections tensor parallelism splits by columns (in, Shard(1)); the others by rows
(out, Shard(0)): Megatron's split (Shoeybi et al. 2019) as the trainer's block plan places
them (`parallel.tensor_parallel._block_plan`, w3 beside w1 in `apply_tp`)."""


@dataclass(frozen=True, slots=True)
class TpShapes:
    """One projection's pieces on a tensor-parallel rank (`tp_shapes`)."""

    weight: tuple[int, int]
    """The frozen W's local (out, in): rows / tp or, row-parallel, columns / tp."""
    lora_a: tuple[int, int]
    """A's local (rank, in): whole beside a column-parallel W, columns / tp beside a
    row-parallel one."""
    lora_b: tuple[int, int]
    """B's local (out, rank): rows / tp beside a column-parallel W, whole beside a row-parallel
    one."""


def tp_shapes(model: ModelConfig, rank: int, tp: int) -> dict[str, TpShapes]:
    """Each projection's local W, A and B shapes on one of `tp` ranks, as the trainer places
    them (`parallel.tensor_parallel_lora`: LoraColwiseParallel puts B on W's rows and
    replicates A; LoraRowwiseParallel puts A on W's columns and replicates B). tp = 1: the
    whole shapes."""
    out = {}
    for name, (rows, cols) in projection_shapes(model).items():
        if name in ROW_PARALLEL:
            out[name] = TpShapes(
                weight=(rows, cols // tp), lora_a=(rank, cols // tp), lora_b=(rows, rank)
            )
        else:
            out[name] = TpShapes(
                weight=(rows // tp, cols), lora_a=(rank, cols), lora_b=(rows // tp, rank)
            )
    return out


def lora_problems(
    lora: LoraConfig, model: ModelConfig, layout: Layout, precision: str
) -> list[ConfigError]:
    """What LoRA does not support yet, each a ConfigError naming the field and the fix: a
    Llama-family dense model with separate q/k/v (PEFT's Llama names; MoE experts are fused
    (E, f, h) parameters, not Linears, so no adapters on them and no expert parallelism),
    fp32/bf16/fp16 compute; every layout of a dense model (DDP, ZeRO-1/2/3, cp, tp with or
    without sp, pp with any schedule) as long as each pipeline rank holds a layer
    (`_pipeline_problems`); a quantized base (`base_dtype`) only with adapters, not split by
    tp, and NF4 only where each weight (and each FSDP2 shard of it) holds whole blocks
    (`_nf4_problems`)."""
    if not lora.enabled:
        if lora.base_dtype != "auto":
            return [
                ConfigError(
                    "lora.base_dtype",
                    lora.base_dtype,
                    "a frozen base exists only with adapters: set lora.rank > 0 "
                    "(e.g. 8) or lora.base_dtype = auto",
                )
            ]
        return []
    out = []
    if model.family != "llama" or model.is_moe or model.fused_qkv or model.is_mla:
        out.append(
            ConfigError(
                "lora.rank",
                lora.rank,
                "LoRA needs a dense Llama-family model with separate q/k/v projections "
                f"(model {model.name!r} is not): choose one or set lora.rank = 0",
            )
        )
        return out
    if not model.gated_mlp and "w3" in lora.target_names:
        out.append(ConfigError("lora.targets", lora.targets, "this MLP has no w3: drop it"))
    if layout.tp > 1 and lora.quantized:
        out.append(
            ConfigError(
                "lora.base_dtype",
                lora.base_dtype,
                f"a quantized base is not split by tensor parallelism (parallel.tp = {layout.tp}"
                "): use lora.base_dtype = auto, or shard it with parallel.zero = 3 and tp = 1",
            )
        )
    out += _pipeline_problems(model, layout)
    if precision == "fp8":
        out.append(ConfigError("precision.dtype", precision, "LoRA: use fp32, bf16 or fp16"))
    if lora.base_dtype == "nf4":
        out += _nf4_problems(model, layout)
    return out


def _pipeline_problems(model: ModelConfig, layout: Layout) -> list[ConfigError]:
    """Where a pipeline stage without a transformer layer (more stages than the layers allow
    such a stage: `stage_layer_ranges` gives the embedding and the head a unit each) breaks
    LoRA: a rank whose stages hold no layer has no adapter to train (an optimizer of nothing);
    and under a split backward (`split_backward`), a first stage that is the embedding alone
    sends an activation that needs no gradient, so torch's input-gradient pass of the next
    stage reaches none of its adapters and its weight-gradient pass then skips them (no
    gradient at all). Interleaved 1F1B's single backward runs such a stage correctly."""
    stages = layout.pp * layout.pp_virtual
    if layout.pp == 1 or stages > model.num_layers + 2:  # (too many stages: layout_problems)
        return []
    ranges = stage_layer_ranges(model.num_layers, stages)
    fix = "use fewer stages (parallel.pp x parallel.pp_virtual) or lora.rank = 0"
    for rank in range(layout.pp):
        ids = stage_ids(rank, layout.pp, layout.pp_virtual, schedule=layout.pp_schedule)
        if not any(len(ranges[s]) for s in ids):
            return [
                ConfigError(
                    "parallel.pp",
                    layout.pp,
                    f"with LoRA every pipeline rank needs a transformer layer, and rank {rank} "
                    f"holds none of the {model.num_layers} layers over {stages} stages: {fix}",
                )
            ]
    if split_backward(layout) and not len(ranges[0]):
        return [
            ConfigError(
                "parallel.pp_schedule",
                layout.pp_schedule,
                f"with LoRA the {layout.pp_schedule} schedule's split backward needs a "
                f"transformer layer in the first stage, and {stages} stages of "
                f"{model.num_layers} layers leave it the embedding alone: {fix}, or "
                "pp_schedule = interleaved",
            )
        ]
    return []


def _nf4_problems(model: ModelConfig, layout: Layout) -> list[ConfigError]:
    """NF4 needs whole blocks of 64 values in every projection and, under FSDP2 (ZeRO-2/3),
    shards of whole second-level blocks: torchao's NF4Tensor splits its codes, block scales
    and second-level factors evenly along rows, and its all-gather reads a 1-D mesh (no HSDP)."""
    if layout.zero >= 2 and layout.dp_replicate > 1:
        return [
            ConfigError(
                "parallel.dp_replicate",
                layout.dp_replicate,
                "lora.base_dtype = nf4 shards over one mesh dimension (torchao's NF4 "
                "all-gather): use parallel.dp_replicate = 1 or lora.base_dtype = int8",
            )
        ]
    shards = layout.zero_shards if layout.zero >= 2 else 1
    for name, (rows, cols) in projection_shapes(model).items():
        numel = rows * cols
        groups = numel // NF4_BLOCK // max(1, nf4_scaler_block(numel))
        if numel % NF4_BLOCK or rows % shards or groups % shards:
            where = f" over {shards} ZeRO shards" if shards > 1 else ""
            return [
                ConfigError(
                    "lora.base_dtype",
                    "nf4",
                    f"the {rows} x {cols} projection {name} does not split into whole NF4 "
                    f"blocks (64 values, then {nf4_scaler_block(numel)} block scales){where}: "
                    "use lora.base_dtype = int8 or bf16"
                    + (", or fewer ZeRO-2/3 ranks" if shards > 1 else ""),
                )
            ]
    return []
