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
