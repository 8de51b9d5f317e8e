"""The planner's shape, read from its AST (issue 34): values pass between stages as named
records, not long tuples or long parameter lists; caches are objects, not `id()` keys; private
names stay in their module.

- no function returns a tuple literal of more than 3 elements (return a dataclass);
- no function takes more than 8 parameters, positional and keyword-only together, `self`/`cls`
  and `*args`/`**kwargs` not counted (pass a record). The functions that still do are listed
  in `WIDE_TODAY` with their count: the list may only shrink (a new wide function, or a listed
  one that grew, fails; a listed one that got narrow must be struck off);
- no `id(...)` call anywhere in planner/ (the one use was a cache key: cache in an object built
  per search instead);
- no `from .module import _private` (nor `from scaletrain.planner.x import _private`) between
  planner modules: a name another module needs is public.
"""

from __future__ import annotations

import ast
from pathlib import Path

import scaletrain.planner

PLANNER = Path(scaletrain.planner.__file__).resolve().parent
MAX_RETURNED_TUPLE = 3
MAX_PARAMS = 8
WIDE_TODAY = {  # "file:function": parameters, when issue 34's first slices landed
    "memory/activations.py:layer_activation_bytes": 14,
    "search/layouts.py:search": 11,
}


def _modules() -> list[tuple[str, ast.Module]]:
    files = sorted(PLANNER.rglob("*.py"))
    assert files, PLANNER
    return [(str(f.relative_to(PLANNER)), ast.parse(f.read_text(), str(f))) for f in files]


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _own_returns(fn: ast.AST) -> list[ast.Return]:
    """The return statements of `fn` itself, not of functions or lambdas nested in it."""
    found: list[ast.Return] = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Return):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_function_returns_a_long_tuple() -> None:
    bad = [
        f"{path}:{r.lineno} {fn.name} returns {len(r.value.elts)} values"
        for path, tree in _modules()
        for fn in _functions(tree)
        for r in _own_returns(fn)
        if isinstance(r.value, ast.Tuple) and len(r.value.elts) > MAX_RETURNED_TUPLE
    ]
    assert not bad, "return a dataclass, built by keyword:\n" + "\n".join(bad)


def test_no_function_takes_more_than_eight_parameters() -> None:
    wide = {
        f"{path}:{fn.name}": _param_count(fn)
        for path, tree in _modules()
        for fn in _functions(tree)
        if _param_count(fn) > MAX_PARAMS
    }
    bad = [f"{k} takes {n}" for k, n in wide.items() if n > WIDE_TODAY.get(k, MAX_PARAMS)]
    assert not bad, "pass a record instead:\n" + "\n".join(bad)
    narrowed = sorted(set(WIDE_TODAY) - set(wide))
    assert not narrowed, f"strike these off WIDE_TODAY, they take <= {MAX_PARAMS}: {narrowed}"


def test_no_id_calls() -> None:
    bad = [
        f"{path}:{n.lineno}"
        for path, tree in _modules()
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "id"
    ]
    assert not bad, "no id()-keyed caches: keep the cache in the per-search object\n" + "\n".join(
        bad
    )


def _is_planner_import(node: ast.ImportFrom) -> bool:
    return node.level > 0 or (node.module or "").startswith("scaletrain.planner")


def test_no_private_names_imported_across_modules() -> None:
    bad = [
        f"{path}:{n.lineno} imports {alias.name} from {'.' * n.level}{n.module or ''}"
        for path, tree in _modules()
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and _is_planner_import(n)
        for alias in n.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert not bad, "make the name public (or move it where it is used):\n" + "\n".join(bad)


def test_the_walk_sees_the_planner() -> None:
    """Guard against a vacuous pass: the walk finds the planner's functions."""
    names = {fn.name for _, tree in _modules() for fn in _functions(tree)}
    assert {"estimate", "search", "comm_terms"} <= names


# The flat planner modules issue 34 regrouped into packages (109a6fb): text still naming one of
# them points at a file that no longer exists.
FLAT_MODULES_BEFORE_34 = {
    "activation_memory",
    "head_memory",
    "naive_memory",
    "napkin_budget",
    "rank_memory",
    "recipe_activations",
    "recipe_megatron",
    "recipe_memory",
    "recipe_schema",
    "search_result",
    "state_memory",
    "plot",
    "published",
}


def _module_paths() -> list[str]:
    """Dotted paths of every scaletrain module, relative to scaletrain."""
    src = PLANNER.parent
    return [
        ".".join(f.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for f in sorted(src.rglob("*.py"))
    ]


def _defined_names() -> set[str]:
    """Top-level functions, classes and UPPER_CASE constants of every scaletrain module."""
    out: set[str] = set()
    for f in sorted(PLANNER.parent.rglob("*.py")):
        for node in ast.parse(f.read_text(), str(f)).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                out.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            out.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper())
    return out


def test_text_names_functions_where_they_live():
    """A `module.function` named in a planner docstring, comment or string (the sources the
    formulas cite, and what `explain` prints) resolves: a module whose dotted path ends in
    `module` has `function` (defined or imported there). Catches text left behind when a
    function moved package (`memory.buffer_terms` after it moved to memory/buffers.py) and
    names of the flat modules issue 34 regrouped. Only names of our functions, classes and
    constants are checked: `memory.offload` is a config field, `plan.layout` an attribute."""
    import importlib
    import io
    import re
    import tokenize

    paths = _module_paths()
    defined = _defined_names()
    dotted = re.compile(r"\b([a-z_]+(?:\.[a-z_]+)*)\.([A-Za-z_]+)\b")
    stale = []
    for f in sorted(PLANNER.rglob("*.py")):
        for tok in tokenize.generate_tokens(io.StringIO(f.read_text()).readline):
            if tok.type not in (tokenize.STRING, tokenize.COMMENT):
                continue
            text = tok.string
            if tok.type == tokenize.STRING and "f" in text[: text.find(text[-1])].lower():
                text = re.sub(r"\{[^{}]*\}", "", text)  # an f-string's fields are code
            for m in dotted.finditer(text):
                prefix, name = m.groups()
                where = f"{f.relative_to(PLANNER)}:{tok.start[0]} {prefix}.{name}"
                homes = [p for p in paths if p == prefix or p.endswith("." + prefix)]
                if prefix.split(".")[-1] in FLAT_MODULES_BEFORE_34 and not homes:
                    stale.append(f"{where}: a module regrouped by issue 34")
                    continue
                if name not in defined or not homes:
                    continue  # a config field, file name or object attribute: not code
                mods = [importlib.import_module(f"scaletrain.{h}") for h in homes]
                if not any(hasattr(mod, name) for mod in mods):
                    stale.append(f"{where}: not in {homes}")
    assert not stale, "\n".join(stale)
