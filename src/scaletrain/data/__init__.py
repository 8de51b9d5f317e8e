"""Data: the embedded grammar corpus, tokenizers, cached token shards and a deterministic,
resumable, rank-aware loader (see `loader.py` for the sampling rule)."""

from .bundle import DataBundle, build_data
from .grammar import Grammar, default_grammar, generate_text
from .tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    save_hf_tokenizer,
)

__all__ = [
    "DataBundle",
    "build_data",
    "Tokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "BPETokenizer",
    "load_tokenizer",
    "save_hf_tokenizer",
    "Grammar",
    "default_grammar",
    "generate_text",
]
