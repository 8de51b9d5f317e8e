"""`[data]`: what the run trains on (sources, tokenizer, format) and how it is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import require
from .choices import ChatTemplate, DataFormat, TokenDtype, check_choices
from .hub import local_path
from .sources import parse_eval_sources, parse_sources

__all__ = ["DataConfig"]


@dataclass
class DataConfig:
    source: str = "grammar"
    """'grammar' (the embedded generated corpus), or files, folders, globs of .txt, .jsonl
    (.gz), .parquet, .arrow, pre-tokenized .bin, Megatron indexed datasets (.bin + .idx, or
    their prefix) and datatrove .ds files, as a weighted mixture 'a.jsonl@0.7, b/@0.3' or
    'web=a.jsonl@0.7, books=b/@0.3' (see scaletrain.config.sources). Megatron and datatrove
    files alone are read in place, memory-mapped (scaletrain.data.direct); a mixture's
    components are also scored one by one (val_loss/<name>)."""
    tokenizer: str = "byte"
    """'byte' (256 ids), 'char' (characters seen in the corpus), 'bpe' (trained locally), or
    a pretrained tokenizer.json path (or its directory; BOS/EOS from tokenizer_config.json),
    or the hub id (org/name) of a model in the local Hugging Face cache holding one."""
    eval_sources: str = ""
    """Held-out sets evaluated every `train.eval_every` steps, each on its own: 'name=path,
    name2=path2' (files, folders or globs of the data.source formats, tokenized with the
    training tokenizer); logged as val_loss/<name> and ppl/<name>. '' = none."""
    text_field: str = "text"
    """The JSONL key / parquet column holding a document's text."""
    token_dtype: TokenDtype = "uint16"
    """Element type of pre-tokenized .bin sources: 'uint16' (nanoGPT) or 'uint32'."""
    format: DataFormat = "text"
    """'text' (documents, every token trained) or 'sft' (chat/instruction JSONL: `messages` or
    prompt/response records; loss only on the responses; see scaletrain.data.sft)."""
    chat_template: ChatTemplate = "auto"
    """data.format=sft: 'auto' (the tokenizer's own chat template when its
    tokenizer_config.json or a chat_template.jinja has one, else the built-in), 'tokenizer'
    (require it) or 'builtin' ('System: / User: / Assistant:' lines, see scaletrain.data.sft)."""
    document_masking: bool = False
    """Attention stays inside each packed document (block-causal mask, positions restart
    after every end-of-document id); needs a tokenizer with one (bpe or pretrained)."""
    bpe_vocab_size: int = 1024
    num_tokens: int = 2_000_000
    """Size of the generated grammar corpus, in bytes/tokens."""
    val_fraction: float = 0.05
    seed: int = 1234
    cache_dir: str = ".cache/scaletrain"
    """Where token shards (numpy memmaps) are written, keyed on the source's bytes (each
    file's sha256, read again at every start), the tokenizer and the split: an edit rebuilds,
    a touch does not."""
    workers: int = 0
    """Processes tokenizing a streamed corpus, each on one core (0 = the cores this process
    may use, os.sched_getaffinity); the shards are the same for any number."""
    prefetch: int = 2
    """Batches prepared ahead by the background loader thread (0 = synchronous)."""
    delay_s: float = 0.0
    """Artificial delay per batch (for profiling tests of data-bound runs)."""

    def __post_init__(self) -> None:
        require(
            0 <= self.seed < 2**63,
            "data.seed",
            self.seed,
            "use a non-negative integer (numpy's generators take no negative seed)",
        )
        if self.tokenizer not in ("byte", "char", "bpe"):
            require(
                local_path(self.tokenizer, "data.tokenizer").exists(),
                "data.tokenizer",
                self.tokenizer,
                "use byte, char, bpe, the path of a tokenizer.json (or its directory) or a "
                "hub id (org/name) in the local Hugging Face cache",
            )
        require(
            self.bpe_vocab_size >= 260,
            "data.bpe_vocab_size",
            self.bpe_vocab_size,
            "use at least 260 (256 bytes + specials)",
        )
        # the embedded corpus is generated in Python at start-up: 1e10 was reported as a hang
        # (the bound is a round number, not measured); real corpora come through data.source
        require(
            10_000 <= self.num_tokens <= 500_000_000,
            "data.num_tokens",
            self.num_tokens,
            "use 10000..500000000 (for more text, point data.source at a file or folder)",
        )
        require(
            0 < self.val_fraction < 0.5,
            "data.val_fraction",
            self.val_fraction,
            "use a fraction in (0, 0.5)",
        )
        require(self.workers >= 0, "data.workers", self.workers, "use >= 1, or 0 for every core")
        require(self.prefetch >= 0, "data.prefetch", self.prefetch, "use >= 0")
        require(self.delay_s >= 0, "data.delay_s", self.delay_s, "use >= 0")
        require(
            bool(self.cache_dir.strip()),
            "data.cache_dir",
            self.cache_dir,
            "give a directory such as .cache/scaletrain (empty would write the shards into the "
            "current one)",
        )
        entries = parse_sources(self.source) if self.source != "grammar" else []
        # (every entry names existing, supported files)
        held = parse_eval_sources(self.eval_sources)  # names unique, files existing, non-empty
        if len(entries) > 1:  # a mixture's components are scored as val_loss/<name> too
            for e in held:
                require(
                    all(c.name != e.name for c in entries),
                    "data.eval_sources",
                    f"{e.name}={e.pattern}",
                    f"{e.name!r} is also a data.source component's name (both would log "
                    f"val_loss/{e.name}): rename one (a component is named as 'name=path@w')",
                )
        check_choices(self, "data")  # token_dtype, format, chat_template
        require(
            not (self.eval_sources and self.format == "sft"),
            "data.eval_sources",
            self.eval_sources,
            "held-out sets are plain text (every token scored): with "
            "data.format=sft the validation split is the masked held-out set; set "
            "data.eval_sources=''",
        )
        require(
            not self.document_masking or self.tokenizer not in ("byte", "char"),
            "data.document_masking",
            self.document_masking,
            f"the {self.tokenizer} tokenizer has no end-of-document token: use bpe or a "
            "pretrained tokenizer.json",
        )
