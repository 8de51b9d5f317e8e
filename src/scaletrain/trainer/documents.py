"""`data.document_masking`: tell the built model which id ends a document."""

from __future__ import annotations

from scaletrain.config import ConfigError
from scaletrain.models import Transformer

from .build import Run, require_data

__all__ = ["enable_document_masking"]


def enable_document_masking(run: Run) -> None:
    """Set every Transformer module's `document_sep_id` to the tokenizer's end-of-document id
    (a no-op unless `data.document_masking`). Under context parallelism the trainer computes
    the document ids on the whole sequence before sharding (`step.cp_model_inputs`) and ring
    attention masks with them; pipeline stages after the first see hidden states, not ids, so
    the pipeline runtime hands every stage the document ids and positions
    (`PipelineRuntime.document_sep_id`). Each layout has a parity test
    (tests/distributed/test_document_masking_layouts.py)."""
    if not run.job.data.document_masking:
        return
    layout = run.dims.layout
    if layout.tp > 1 and run.job.model.position == "learned":
        # per-row positions (B, T) do not fit the sequence-sharded position-table plan
        raise ConfigError(
            "data.document_masking",
            True,
            "not available with tensor "
            "parallelism and learned positions (GPT-2): use parallel.tp=1",
        )
    tokenizer = require_data(run, "data.document_masking").tokenizer
    sep = getattr(tokenizer, "eos_id", None)
    if sep is None:
        raise ConfigError(
            "data.document_masking",
            True,
            f"the {tokenizer.name} tokenizer has no end-of-document "
            "token: use bpe or a pretrained tokenizer.json",
        )
    for m in run.model.modules():
        if isinstance(m, Transformer):
            m.document_sep_id = int(sep)
    if run.pipeline is not None:
        run.pipeline.document_sep_id = int(sep)
