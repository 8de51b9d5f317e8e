"""The sequence length and global batch a named real model is planned at when the user gives
neither: its own context length (capped at a common pretraining length) and a realistic
global batch in tokens, each with its source. Pure Python.

`plan`, `explain` and `dryrun` take these for a model of at least `REAL_MODEL_PARAMS`
parameters instead of the embedded toy job's 128 tokens x 16 sequences (`cli/_job.py`
derives them and prints each as a `derived` note); a value the user gives always wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import ModelConfig

__all__ = [
    "REAL_MODEL_PARAMS",
    "PRETRAIN_SEQ_LEN",
    "GPT3_BATCH_TOKENS",
    "RunDefaults",
    "run_defaults",
]

REAL_MODEL_PARAMS = 1e8
"""Below this parameter count a model is a toy (the tiny presets and the embedded job, whose
own 128 x 16 batch stays the default); GPT-3's smallest model (125M) is above it."""

PRETRAIN_SEQ_LEN = 8192
"""The longest sequence a model is planned at by default: Llama 3's main pretraining stage runs
8,192-token sequences and extends the context only in a later long-context stage (Dubey et al.
2024, "The Llama 3 Herd of Models", sec. 3.4.1-3.4.2). A model whose context is shorter
(GPT-2 1,024, GPT-3 2,048, Llama 2 4,096) is planned at its own context length."""

GPT3_BATCH_TOKENS: tuple[tuple[float, float], ...] = (
    (125e6, 0.5e6),
    (350e6, 0.5e6),
    (760e6, 0.5e6),
    (1.3e9, 1e6),
    (2.7e9, 1e6),
    (6.7e9, 2e6),
    (13e9, 2e6),
    (175e9, 3.2e6),
)
"""(parameters, global batch in tokens) of the eight GPT-3 models (Brown et al. 2020, "Language
Models are Few-Shot Learners", Table 2.1): the one published ladder of batch size against model
size. A model takes the batch of the GPT-3 size nearest to its own on a log scale (Llama 2 used
4M tokens at 7B-70B, Touvron et al. 2023 sec. 2.2; the ladder is the more conservative)."""


@dataclass(frozen=True)
class RunDefaults:
    """The sequence length and global batch (sequences) a real model is planned at, and why."""

    seq_len: int
    global_batch: int
    seq_why: str
    batch_why: str


def _nearest_gpt3(params: float) -> tuple[float, float]:
    return min(GPT3_BATCH_TOKENS, key=lambda row: abs(math.log(row[0] / params)))


def run_defaults(model: ModelConfig) -> RunDefaults | None:
    """The planning defaults of `model`, or None for a toy model (< REAL_MODEL_PARAMS).

    seq_len = min(the model's context, PRETRAIN_SEQ_LEN). global batch = the tokens of the
    nearest GPT-3 size / seq_len, rounded to the nearest power of two sequences, so that the
    power-of-two data-parallel degrees a search tries divide it."""
    params = model.param_counts().total
    if params < REAL_MODEL_PARAMS:
        return None
    seq = min(model.max_seq_len, PRETRAIN_SEQ_LEN)
    if model.max_seq_len > PRETRAIN_SEQ_LEN:
        seq_why = (
            f"{model.name}'s context {model.max_seq_len:,} capped at the common pretraining "
            f"length {PRETRAIN_SEQ_LEN:,} (Llama 3, Dubey et al. 2024 sec. 3.4.1); give "
            "--seq-len to plan another"
        )
    else:
        seq_why = f"{model.name}'s context length; give --seq-len to plan another"
    ref_params, tokens = _nearest_gpt3(params)
    seqs = 2 ** max(0, round(math.log2(tokens / seq)))
    batch_why = (
        f"{seqs * seq / 1e6:.2f}M tokens: GPT-3's {tokens / 1e6:g}M-token batch at its "
        f"{ref_params / 1e9:g}B size, the nearest to {params / 1e9:.2f}B (Brown et al. 2020 "
        f"Table 2.1), / {seq:,} tokens, rounded to a power of two sequences; give "
        "--global-batch to plan another"
    )
    return RunDefaults(seq_len=seq, global_batch=seqs, seq_why=seq_why, batch_why=batch_why)
