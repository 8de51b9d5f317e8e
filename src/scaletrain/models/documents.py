"""Document masking for packed sequences: block-causal masks and per-document positions.

A training window packs several documents separated by an end-of-document id. With document
masking a token attends only to earlier tokens of its own document, and position ids restart
at 0 after every separator, so a packed sequence computes exactly what its documents would
compute run one by one. The separator belongs to the document it ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DocumentLayout", "document_ids", "document_layout", "document_mask"]


@dataclass(frozen=True)
class DocumentLayout:
    positions: torch.Tensor
    """(B, T) position ids, 0 at each document's first token."""
    mask: torch.Tensor
    """(B, 1, T, T) bool, True where query t may attend key s (same document, s <= t)."""


def document_ids(tokens: torch.Tensor, sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(document index, position in its document), both (B, T), of (B, T) token ids split
    after every `sep_id`. Context parallelism computes them on the whole sequence before
    sharding (a shard alone cannot tell where its first document began)."""
    is_sep = (tokens == sep_id).long()
    doc = torch.cumsum(is_sep, dim=1) - is_sep  # (B, T) document index; sep in its own doc
    t = tokens.shape[1]
    idx = torch.arange(t, device=tokens.device).expand_as(tokens)  # (B, T)
    # each token's document start = the largest index <= t that begins a document
    starts = torch.where(
        torch.cat(
            [torch.ones_like(doc[:, :1], dtype=torch.bool), doc[:, 1:] != doc[:, :-1]], dim=1
        ),
        idx,
        0,
    )
    return doc, idx - torch.cummax(starts, dim=1).values


def document_mask(doc: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool block-causal mask of (B, T) document indices: True where query t may
    attend key s (same document, s <= t)."""
    t = doc.shape[1]
    same = doc[:, :, None] == doc[:, None, :]  # (B, T, T)
    causal = torch.ones(t, t, dtype=torch.bool, device=doc.device).tril()
    return (same & causal).unsqueeze(1)


def document_layout(tokens: torch.Tensor, sep_id: int) -> DocumentLayout:
    """Documents of (B, T) token ids split after every `sep_id`."""
    doc, positions = document_ids(tokens, sep_id)
    return DocumentLayout(positions=positions, mask=document_mask(doc))
