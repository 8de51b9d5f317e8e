"""Plain single-device transformer modules (GPT-2 and Llama families, Mixtral-style MoE).

Nothing here imports torch.distributed: parallelism is applied from `scaletrain.parallel`.
Build on meta, parallelize, then `materialize`.
"""

from .attention import Attention, NaiveAttentionCore, RotaryEmbedding, SDPAAttentionCore
from .init import clean_fqn, init_weights, materialize
from .moe import GroupedExperts, MoE, moe_aux_loss
from .transformer import (
    FeedForward,
    RMSNorm,
    Transformer,
    TransformerBlock,
    build_model,
    causal_lm_loss,
)

__all__ = [
    "Transformer",
    "TransformerBlock",
    "Attention",
    "FeedForward",
    "RMSNorm",
    "MoE",
    "GroupedExperts",
    "RotaryEmbedding",
    "NaiveAttentionCore",
    "SDPAAttentionCore",
    "build_model",
    "materialize",
    "init_weights",
    "clean_fqn",
    "causal_lm_loss",
    "moe_aux_loss",
]
