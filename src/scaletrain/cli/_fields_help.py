"""`train --help`'s list of config sections and fields, generated from the config dataclasses.

Each field's one-line doc is the first sentence of the string literal that follows it in the
class body (the attribute-docstring convention the config modules use), read with `ast` from the
source: nothing is executed. Defaults are those of the embedded default job.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

from scaletrain.config import JobConfig
from scaletrain.config.job import SECTIONS

__all__ = ["field_docs", "fields_help"]

_WIDTH = 78


def field_docs(cls: type) -> dict[str, str]:
    """{field: first line of its attribute docstring} for a dataclass (missing: no entry)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[node.target.id] = _first_sentence(nxt.value.value)
    return out


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v) if v is not None else "(unset)"


def _section(name: str, obj: Any, cls: type) -> list[str]:
    head = (cls.__doc__ or "").strip().split("\n")[0] if cls.__doc__ else ""
    title = f"[{name}]" + (f"  {head}" if head and not head.startswith(cls.__name__) else "")
    lines = textwrap.wrap(title, _WIDTH, subsequent_indent="  ")
    docs = field_docs(cls)
    for f in dataclasses.fields(obj):
        left = f"  {f.name} = {_value(getattr(obj, f.name))}"
        doc = docs.get(f.name, "")
        if not doc:
            lines.append(left)
            continue
        pad = max(len(left) + 2, 28)
        wrapped = textwrap.wrap(doc, _WIDTH - pad) or [""]
        lines.append(f"{left:<{pad}}{wrapped[0]}")
        lines += [" " * pad + w for w in wrapped[1:]]
    return lines


def fields_help() -> str:
    """Every section and field of the job config with its default and one-line doc."""
    job = JobConfig()
    lines = [
        "config sections and fields (set in a TOML [section] or as --section.key=value;",
        "shown with the default job's values):",
        "",
    ]
    lines += _section("model", job.model, type(job.model))
    for name, cls in SECTIONS.items():
        lines += ["", *_section(name, getattr(job, name), cls)]
    return "\n".join(lines)
