"""The fixed sets of names a config field may take: each a `Literal` alias, defined here once.

A dataclass field annotated with one of these aliases is checked against it from the alias
itself (`typing.get_args`), never from a second list: `strict.coerce` refuses a TOML or
command-line value outside it (did-you-mean, one line naming the field), and `check_choices`
does the same for a section built in code. The tuples other modules import (`PRECISIONS`,
`AC_MODES`, `PP_SCHEDULES`, ...) are `names(alias)`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from ._errors import choice

__all__ = [
    "Precision",
    "ReduceDtype",
    "Fp8Scaling",
    "Fp8Amax",
    "Fp8Matmul",
    "Fp8Backend",
    "GradCompression",
    "ACMode",
    "MoeDispatcher",
    "DistOptimizer",
    "SyncDtype",
    "FsdpEnds",
    "OffloadMode",
    "LoraBaseDtype",
    "ZeroStage",
    "PPSchedule",
    "LayoutMode",
    "OptimizerName",
    "LRSchedule",
    "LRScaling",
    "TokenDtype",
    "DataFormat",
    "ChatTemplate",
    "Device",
    "Norm",
    "Activation",
    "Position",
    "Attention",
    "HFModelType",
    "RouterScoring",
    "MoEDropPolicy",
    "names",
    "literal_names",
    "check_choices",
]

# precision
Precision = Literal["fp32", "bf16", "fp16", "fp8"]
ReduceDtype = Literal["fp32", "bf16"]
Fp8Scaling = Literal["tensorwise", "tilewise"]
Fp8Amax = Literal["current", "delayed"]
Fp8Matmul = Literal["auto", "scaled_mm", "emulated"]
Fp8Backend = Literal["auto", "scaletrain", "torchao"]
GradCompression = Literal["none", "powersgd"]
# memory and layout
ACMode = Literal["none", "selective", "full"]

MoeDispatcher = Literal["unstated", "alltoall", "flex"]
"""A Megatron-Core run's MoE token dispatcher (--moe-token-dispatcher-type): 'alltoall'
(NCCL all-to-all with a global permute and, past one local expert, chunk sorts by local
expert), 'flex' (DeepEP / HybridEP: the permute fused into the communication kernel),
'unstated' (neither charged beyond what both run; planner/time/moe_traffic.py)."""
FsdpEnds = Literal["unstated", "root", "own_units"]
"""How an FSDP2 run wraps the model's ends (a published row's `layout.fsdp_ends`):
'root' (the root unit holds the embedding, final norm and head and stays unsharded from its
forward to the end of backward: torchtitan before 83e6941, 2025-07-28), 'own_units' (the
embedding is its own unit, resharded after forward; the final norm and head one unit not
resharded; the root holds none: torchtitan from 83e6941), 'unstated' (the recipe's rule,
'root'). planner/recipes/memory.py `_recipe_in_flight`."""
DistOptimizer = Literal["unstated", "mcore_distributed_optim", "apex_distributed_fused_adam"]
"""A NeMo 1.x (NeMo-Framework-Launcher, containers up to 24.x) run's optimizer, its YAML's
`optim.name` (a published row's `layout.dist_optimizer`): 'mcore_distributed_optim'
(Megatron-Core's DistributedOptimizer), 'apex_distributed_fused_adam' (`distributed_fused_adam`:
NeMo's MegatronDistributedFusedAdam over Apex's DistributedFusedAdam), 'unstated' (the
recipe's: Megatron-Core's). planner/recipes/dist_optim.py."""
SyncDtype = Literal["unstated", "fp32", "bf16"]
"""The dtype a NeMo run states for its gradient buffer and reduction (a NeMo 1.x YAML's
`optim.grad_sync_dtype`, NeMo 2.x / Megatron-Core's grad_reduce_in_fp32 False = 'bf16') or a
NeMo 1.x YAML's `optim.dtype` (Apex DistributedFusedAdam's optimizer state) ('unstated': the
framework's default, fp32). planner/recipes/dist_optim.py."""
OffloadMode = Literal[
    "none", "optimizer", "params", "activations", "optimizer+activations", "params+activations"
]
ZeroStage = Literal[0, 1, 2, 3]
PPSchedule = Literal["gpipe", "1f1b", "interleaved", "zero-bubble", "dualpipev"]
LayoutMode = Literal["manual", "auto"]
LoraBaseDtype = Literal["auto", "bf16", "nf4", "int8"]
# optimizer, data, run
OptimizerName = Literal["adamw", "adamw8bit", "adafactor", "sgd"]
LRScaling = Literal["none", "linear", "sqrt"]
LRSchedule = Literal["cosine", "linear", "constant"]
TokenDtype = Literal["uint16", "uint32"]
DataFormat = Literal["text", "sft"]
ChatTemplate = Literal["auto", "tokenizer", "builtin"]
Device = Literal["auto", "cpu", "cuda"]
# model architecture
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "gelu_exact", "swiglu", "geglu"]
Position = Literal["learned", "rope"]
Attention = Literal["sdpa", "naive"]
HFModelType = Literal[
    "auto",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "phi3",
    "deepseek_v2",
    "deepseek_v3",
    "qwen3_moe",
    "gemma2",
    "gemma3_text",
]
RouterScoring = Literal["topk_softmax", "softmax", "sigmoid"]
MoEDropPolicy = Literal["probs", "position"]


def names(alias: Any) -> tuple[Any, ...]:
    """The allowed values of a `Literal` alias, in the order it lists them."""
    return typing.get_args(alias)


def literal_names(typ: Any) -> tuple[Any, ...] | None:
    """`names(typ)` when `typ` (a resolved annotation) is a Literal, else None."""
    return typing.get_args(typ) if typing.get_origin(typ) is Literal else None


_FIELDS: dict[type, list[tuple[str, tuple[Any, ...]]]] = {}
"""Per dataclass: its Literal-typed fields and their names (the hints resolved once)."""


def _choice_fields(cls: type) -> list[tuple[str, tuple[Any, ...]]]:
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)  # resolves the postponed annotations
        _FIELDS[cls] = [
            (f.name, options)
            for f in dataclasses.fields(cls)
            if (options := literal_names(hints[f.name])) is not None
        ]
    return _FIELDS[cls]


def check_choices(obj: object, section: str) -> None:
    """Raise `ConfigError` for the first Literal-typed field of dataclass `obj` whose value is
    not one of its alias's names (the message lists them, with a did-you-mean)."""
    for name, options in _choice_fields(type(obj)):
        choice(f"{section}.{name}", getattr(obj, name), options)
