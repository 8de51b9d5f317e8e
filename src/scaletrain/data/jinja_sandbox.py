"""A Jinja2 sandbox with bounded time and size, for chat templates read from disk.

Jinja2's `ImmutableSandboxedEnvironment` stops a template from reaching Python internals
(`__class__`, `__globals__`, imports) but not from exhausting the machine: `10 ** 10 ** 10`
(folded at compile time: a hang before rendering starts), `'x' * 10**9`, `'x' | center(10**9)`,
`'{:>999999999}'.format(1)`, a string doubled in a loop, or nested loops over `range(100000)`
all pass it, and a gigabyte of rendered text then aborts the Rust tokenizer (seen: "memory
allocation of 4294967296 bytes failed", the process killed, no message). Here:

- every operation that grows a string or list is bounded before it runs: `*` and `**`
  (intercepted binary operators), `%` with a huge width, `~` (concatenation, through the code
  generator), every filter and every method call (the product of the two largest sizes among
  the value and its arguments, and every numeric argument, at most `MAX_CHARS`), and
  `str.format` widths;
- a render stops after `RENDER_SECONDS` of wall time (a trace function on the template's own
  frames: each template line checks the clock) and after `MAX_CHARS` characters of output;
- any other failure of the template's arithmetic (division by zero, overflow, recursion) is
  the caller's one-line error, never a traceback.

What it ignores: CPU time spent inside one bounded operation (at most `MAX_CHARS` work) and
memory held by many bounded values at once (a template builds them one line at a time, each
line checking the clock).
"""

from __future__ import annotations

import functools
import re
import sys
import time
from typing import Any

__all__ = ["bounded_environment", "render_bounded", "TemplateLimit", "MAX_CHARS", "RENDER_SECONDS"]

MAX_CHARS = 1 << 24
"""16 Mi characters (or list items): a bound on any one value a template builds and on one
rendered conversation. A real chat template's output is the conversation's text plus a few
markers per turn."""

RENDER_SECONDS = 5.0
"""Wall-clock limit of one render; a real template renders a conversation in milliseconds."""

_HUGE_WIDTH = re.compile(r"\d{8,}")
"""A format width (or any number) of 8+ digits in a format string: >= 10**7 characters."""


class TemplateLimit(Exception):
    """A template went past a bound (size or time); the message says which."""


def _size(x: Any) -> int:
    try:
        return len(x) if isinstance(x, (str, bytes, list, tuple, dict, range)) else 0
    except OverflowError:  # a range longer than sys.maxsize
        return MAX_CHARS + 1


def _check(what: str, sized: tuple[Any, ...], numbers: tuple[Any, ...] = ()) -> None:
    """Refuse an operation whose output could exceed MAX_CHARS: a numeric argument above it
    (a width, a count), or sizes whose product is above it (a join, a replace, a repetition)."""
    for v in numbers:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > MAX_CHARS:
            raise TemplateLimit(f"{what} with the number {v:.3g} (more than {MAX_CHARS:,})")
    sizes = sorted((_size(v) for v in sized), reverse=True)
    if sizes and sizes[0] > MAX_CHARS:
        raise TemplateLimit(f"{what} of a value of size {sizes[0]:,} (more than {MAX_CHARS:,})")
    if len(sizes) >= 2 and sizes[1] > 0 and sizes[0] * sizes[1] > MAX_CHARS:
        raise TemplateLimit(
            f"{what} of sizes {sizes[0]:,} x {sizes[1]:,} (more than {MAX_CHARS:,} characters)"
        )


def _check_width(what: str, fmt: Any) -> None:
    """A format string ('%' or str.format) asking for a width of 10**7+ characters."""
    if isinstance(fmt, str) and _HUGE_WIDTH.search(fmt):
        raise TemplateLimit(f"{what} with a format width of 10,000,000+ characters")


def _bounded_filter(name: str, f: Any) -> Any:
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # context/env first

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        value, rest = args[skip : skip + 1], (*args[skip + 1 :], *kwargs.values())
        if name == "format" and value:
            _check_width("the filter 'format'", value[0])
        _check(f"the filter {name!r}", (*value, *rest), rest)
        return f(*args, **kwargs)

    return wrapper


def bounded_environment() -> Any:
    """An `ImmutableSandboxedEnvironment` whose operations are bounded (see the module
    docstring); `trim_blocks` and `lstrip_blocks` as transformers renders chat templates."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, Frame
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generator(CodeGenerator):
        def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # `a ~ b`
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class _Bounded(ImmutableSandboxedEnvironment):
        code_generator_class = _Generator
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**":
                if (
                    not isinstance(right, (int, float))
                    or abs(right) > 64
                    or (isinstance(left, int) and left.bit_length() > 4096)
                ):
                    raise TemplateLimit(
                        f"'**' with the exponent {right!r} (at most 64, on "
                        "numbers of at most 4096 bits)"
                    )
            elif operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _size(seq) and isinstance(n, int) and _size(seq) * n > MAX_CHARS:
                        raise TemplateLimit(
                            f"'*' repeating {_size(seq):,} items {n:,} times "
                            f"(more than {MAX_CHARS:,})"
                        )
            elif operator == "%":
                _check_width("'%'", left)
            return super().call_binop(context, operator, left, right)

        def call(
            __self,
            __context: Any,
            __obj: Any,
            *args: Any,  # noqa: N805
            **kwargs: Any,
        ) -> Any:
            owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            name = getattr(__obj, "__name__", "a function")
            if name in ("format", "format_map"):
                _check_width(f"the call {name!r}", owner)
            rest = (*args, *kwargs.values())
            _check(f"the call {name!r}", (owner, *rest), rest)
            return super().call(__context, __obj, *args, **kwargs)

        def bounded_concat(self, parts: tuple[Any, ...]) -> str:
            out = "".join(str(p) for p in parts)
            if len(out) > MAX_CHARS:
                raise TemplateLimit(
                    f"'~' building {len(out):,} characters (more than {MAX_CHARS:,})"
                )
            return out

    env = _Bounded(trim_blocks=True, lstrip_blocks=True)
    env.filters = {k: _bounded_filter(k, f) for k, f in env.filters.items()}
    return env


def render_bounded(template: Any, variables: dict[str, Any], seconds: float | None = None) -> str:
    """`template.render(**variables)` within `seconds` (default RENDER_SECONDS) of wall time
    and MAX_CHARS of output; raises TemplateLimit past either."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateLimit(f"rendering took more than {seconds:g} s")
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        # only the template's own code (loops, macros) is traced: a filter runs untraced
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        out: list[str] = []
        n = 0
        for piece in template.generate(**variables):
            n += len(piece)
            if n > MAX_CHARS:
                raise TemplateLimit(f"the rendered text passed {MAX_CHARS:,} characters")
            out.append(piece)
        return "".join(out)
    finally:
        sys.settrace(previous)
