"""`[lora]`: low-rank adapters (Hu et al. 2021, "LoRA") on a frozen base model.

Each targeted projection W (out x in) gains A (rank x in) and B (out x rank): y = W x +
(alpha / rank) B A dropout(x). B starts at zero (the model starts as the base), A as PEFT's
(Kaiming-uniform, a = sqrt(5)); only A and B are trained, so only they have gradients and
optimizer states. The adapters are written in PEFT's format at the end of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import ConfigError, require

if TYPE_CHECKING:
    from .layout import Layout
    from .model import ModelConfig

__all__ = ["LORA_TARGETS", "LoraConfig", "lora_problems"]

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

    def __post_init__(self) -> None:
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
    def scale(self) -> float:
        """alpha / rank: the adapters' output scale."""
        return self.alpha / self.rank


def lora_problems(
    lora: LoraConfig, model: ModelConfig, layout: Layout, precision: str
) -> list[ConfigError]:
    """What LoRA does not support yet, each a ConfigError naming the field and the fix: a
    Llama-family dense model with separate q/k/v (PEFT's Llama names), one process or pure
    data parallelism (DDP, ZeRO-1/2/3, cp), fp32/bf16/fp16 compute."""
    if not lora.enabled:
        return []
    out = []
    if model.family != "llama" or model.is_moe or model.fused_qkv:
        out.append(
            ConfigError(
                "lora.rank",
                lora.rank,
                "LoRA needs a dense Llama-family model with separate q/k/v projections "
                f"(model {model.name!r} is not): choose one or set lora.rank = 0",
            )
        )
    if not model.gated_mlp and "w3" in lora.target_names:
        out.append(ConfigError("lora.targets", lora.targets, "this MLP has no w3: drop it"))
    for axis in ("tp", "pp", "ep"):
        if getattr(layout, axis) > 1:
            out.append(
                ConfigError(
                    f"parallel.{axis}",
                    getattr(layout, axis),
                    "LoRA runs on one process or data parallelism (DDP, ZeRO-1/2/3, cp) "
                    f"for now: use parallel.{axis} = 1 or lora.rank = 0",
                )
            )
    if precision == "fp8":
        out.append(ConfigError("precision.dtype", precision, "LoRA: use fp32, bf16 or fp16"))
    return out
