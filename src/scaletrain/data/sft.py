"""Supervised fine-tuning data: chat / instruction JSONL -> ids + a loss mask.

Records (one JSON object per line of `.jsonl` / `.jsonl.gz` files):
  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
  {"prompt": "...", "response": "..."}          (= one user turn and one assistant turn)

Built-in chat template (plain text, so any tokenizer encodes it):

    [BOS]System: {system}\n
    User: {user}\n
    Assistant: {assistant}[EOS]\n      <- only `{assistant}[EOS]` is trained

A tokenizer's own chat template (`chat_template` in its tokenizer_config.json, or a
chat_template.jinja beside it; `data.chat_template`) is rendered instead in a sandboxed Jinja2
environment (no attribute access to Python internals, no imports: a template from disk cannot
run code). Its response spans are found by rendering each conversation prefix: the text a reply
adds after the prompt that `add_generation_prompt=True` ends with is the trained span (the
reply and the template's own end-of-turn text); a template whose prefixes are not prefixes of
the whole conversation is refused with the built-in named as the way out.

Every piece is tokenized on its own, so the boundary between prompt and response falls exactly
between tokens. The mask is 1 on the tokens the model must predict (each assistant reply and
the EOS that ends it) and 0 elsewhere; the loader turns masked targets into -100, which the
loss ignores, so prompt positions get exactly zero gradient. Examples are packed one after
another like documents (combine with `data.document_masking` to keep attention inside each).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from scaletrain.config import ConfigError, DataConfig
from scaletrain.config.sources import parse_sources

from .corpus import TokenFile, _Appender, _copy
from .documents import jsonl_records
from .tokenizer import Tokenizer

__all__ = ["build_sft", "render_example", "ROLE_NAMES", "ChatTemplate", "chat_template_for"]

ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}


def _messages(rec: object, where: str) -> list[tuple[str, str]]:
    if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
        out = []
        for m in rec["messages"]:
            if not (
                isinstance(m, dict)
                and m.get("role") in ROLE_NAMES
                and isinstance(m.get("content"), str)
            ):
                raise ConfigError(
                    "data.source",
                    where,
                    "each message needs a role (system, user or assistant) and a string content",
                )
            out.append((m["role"], m["content"]))
        return out
    if (
        isinstance(rec, dict)
        and isinstance(rec.get("prompt"), str)
        and isinstance(rec.get("response"), str)
    ):
        return [("user", rec["prompt"]), ("assistant", rec["response"])]
    raise ConfigError(
        "data.source",
        where,
        "an SFT record needs 'messages' or 'prompt' and 'response' string fields",
    )


def render_example(
    messages: list[tuple[str, str]], tok: Tokenizer, template: ChatTemplate | None = None
) -> tuple[list[int], list[int]]:
    """(ids, mask) of one conversation in `template`, or the built-in one (see the module
    docstring)."""
    if template is not None:
        return _render_with_template(messages, tok, template)
    eos = getattr(tok, "eos_id", None)
    if eos is None:
        raise ConfigError(
            "data.tokenizer",
            tok.name,
            "SFT needs an end-of-turn token: use bpe or a pretrained tokenizer.json",
        )
    ids: list[int] = []
    mask: list[int] = []

    def add(piece: list[int], trained: int) -> None:
        ids.extend(piece)
        mask.extend([trained] * len(piece))

    if getattr(tok, "add_bos", False):
        add([tok.bos_id], 0)  # type: ignore[attr-defined]
    for role, content in messages:
        if role == "assistant":
            add(tok.encode("Assistant: "), 0)
            add(tok.encode(content) + [eos], 1)
            add(tok.encode("\n"), 0)
        else:
            add(tok.encode(f"{ROLE_NAMES[role]}: {content}\n"), 0)
    return ids, mask


class ChatTemplate:
    """A Hugging Face chat template (Jinja2) rendered in a sandbox, with the variables
    transformers passes (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
    `raise_exception`)."""

    def __init__(self, source: str, where: str, tok: Tokenizer) -> None:
        import jinja2

        from .jinja_sandbox import bounded_environment

        def raise_exception(message: str) -> None:
            raise ConfigError("data.chat_template", where, f"the template refused: {message}")

        env = bounded_environment()
        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ConfigError("data.chat_template", where, f"fix the Jinja2 template ({e})") from e
        except Exception as e:  # noqa: BLE001 - compile-time folding of the template's own code
            raise ConfigError(
                "data.chat_template",
                where,
                f"fix the Jinja2 template "
                f"({type(e).__name__}: {e}) or use data.chat_template=builtin",
            ) from e
        self.where = where
        hf = tok.hf_tokenizer()
        self._specials = {
            f"{k}_token": hf.id_to_token(i) if i is not None else ""
            for k in ("bos", "eos")
            for i in [getattr(tok, f"{k}_id", None)]
        }

    def render(self, messages: list[tuple[str, str]], *, add_generation_prompt: bool) -> str:
        from .jinja_sandbox import TemplateLimit, render_bounded

        try:
            text = render_bounded(
                self._template,
                {
                    "messages": [{"role": r, "content": c} for r, c in messages],
                    "add_generation_prompt": add_generation_prompt,
                    **self._specials,
                },
            )
        except ConfigError:
            raise
        except TemplateLimit as e:  # bounded size or time (data/jinja_sandbox.py)
            raise ConfigError(
                "data.chat_template",
                self.where,
                f"the template went past a limit ({e}); fix it or use data.chat_template=builtin",
            ) from None
        except Exception as e:  # noqa: BLE001 - whatever the template's own code raises
            # the sandbox's SecurityError is a TemplateError: a template that reaches for
            # Python internals stops here; so do its ZeroDivisionError, OverflowError,
            # RecursionError (a macro calling itself), MemoryError
            raise ConfigError(
                "data.chat_template",
                self.where,
                f"the template failed to render ({type(e).__name__}: "
                f"{str(e)[:200]}); use data.chat_template=builtin",
            ) from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate ('\ud800') no tokenizer encodes
            raise ConfigError(
                "data.chat_template",
                self.where,
                f"the template renders a "
                f"character that is not text ({e.reason}): fix it or use "
                "data.chat_template=builtin",
            ) from None
        return text


def chat_template_for(cfg: DataConfig, tok: Tokenizer) -> ChatTemplate | None:
    """The template `data.chat_template` selects: None for the built-in one."""
    if cfg.chat_template == "builtin":
        return None
    found = getattr(tok, "chat_template", None)
    if found is None:
        if cfg.chat_template == "tokenizer":
            raise ConfigError(
                "data.chat_template",
                cfg.chat_template,
                f"the tokenizer {cfg.tokenizer} has no chat template (none in "
                "its tokenizer_config.json nor a chat_template.jinja): use "
                "builtin",
            )
        return None
    source, where = found
    return ChatTemplate(source, where, tok)


def _render_with_template(
    messages: list[tuple[str, str]], tok: Tokenizer, template: ChatTemplate
) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # the text already tokenized

    def add(text: str, trained: int) -> None:
        piece = tok.encode(text) if text else []
        ids.extend(piece)
        mask.extend([trained] * len(piece))

    def extend_to(text: str, trained: int) -> None:
        nonlocal done
        if not text.startswith(done):
            raise ConfigError(
                "data.chat_template",
                template.where,
                "the template renders a conversation's prefix differently from "
                "the whole conversation, so the replies cannot be located: use "
                "data.chat_template=builtin",
            )
        add(text[len(done) :], trained)
        done = text

    for i, (role, content) in enumerate(messages):
        if role == "assistant":
            extend_to(template.render(messages[:i], add_generation_prompt=True), 0)
            before = done
            extend_to(template.render(messages[: i + 1], add_generation_prompt=False), 1)
            if content.strip() and content.strip() not in done[len(before) :]:
                # nothing would be trained on this reply (an empty or reply-dropping template)
                raise ConfigError(
                    "data.chat_template",
                    template.where,
                    "the template does not render the assistant's reply, so "
                    "nothing of it would be trained: fix it or use "
                    "data.chat_template=builtin",
                )
    extend_to(template.render(messages, add_generation_prompt=False), 0)
    return ids, mask


def build_sft(cfg: DataConfig, tmp: Path, tok: Tokenizer) -> dict:
    """Write train/val ids (`*.bin`) and masks (`*.mask`, uint8) into `tmp`; the last
    `val_fraction` of the tokens (whole examples packed in order) is validation."""
    dtype = np.dtype(np.uint16 if tok.vocab_size < 65536 else np.uint32)
    ids_out, mask_out = (
        _Appender(tmp / "all.tmp", dtype),
        _Appender(tmp / "mask.tmp", np.dtype(np.uint8)),
    )
    template = chat_template_for(cfg, tok)
    try:
        for entry in parse_sources(cfg.source):
            for path in entry.files:
                if not path.name.endswith((".jsonl", ".jsonl.gz")):
                    raise ConfigError(
                        "data.source",
                        str(path),
                        "data.format=sft reads .jsonl (or .jsonl.gz) files only",
                    )
                for lineno, rec in jsonl_records(path):
                    ids, mask = render_example(_messages(rec, f"{path}:{lineno}"), tok, template)
                    ids_out.add(np.asarray(ids, dtype=np.int64))
                    mask_out.add(np.asarray(mask, dtype=np.uint8))
    finally:
        ids_out.close()
        mask_out.close()
    n = ids_out.count
    n_val = int(n * cfg.val_fraction)
    meta: dict = {
        "dtype": dtype.name,
        "num_train": n - n_val,
        "num_val": n_val,
        "masks": True,
        "sha256": {},
        "eos_id": getattr(tok, "eos_id", None),
    }
    for src_path, out_dtype, suffix in (
        (ids_out.path, dtype, "bin"),
        (mask_out.path, np.dtype(np.uint8), "mask"),
    ):
        src = TokenFile(src_path, out_dtype, n)
        for split, start, count in (("train", 0, n - n_val), ("val", n - n_val, n_val)):
            out, digest = _Appender(tmp / f"{split}.{suffix}", out_dtype), hashlib.sha256()
            try:
                _copy(src, start, count, out, digest)
            finally:
                out.close()
            if suffix == "bin":
                meta["sha256"][f"{split}.bin"] = digest.hexdigest()
        del src
        src_path.unlink()
    return meta
