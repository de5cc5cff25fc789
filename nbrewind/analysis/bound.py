"""The names a cell binds for certain when it runs to the end.

A checkpoint records the names whose value changed, so a cell that binds a name to the
value it already had (`from pathlib import Path` after an earlier cell imported it) would
record no write of it; replayed after that earlier cell changed, it would leave the name
unbound, or bound to what the earlier cell now made. The names every top-level statement
binds whenever it runs are writes of the cell all the same. Names bound only in a branch,
a loop or a handler are not certain: a replay must not bind them from the record when the
run did not.
"""

from __future__ import annotations

import ast

__all__ = ["bound_for_sure"]


def bound_for_sure(source: str) -> frozenset[str]:
    """Names the top-level statements of `source` bind whenever they all run (none raise),
    less those a later top-level `del` removes; empty for code that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    out: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                _names(target, out)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and getattr(stmt, "value", None) is not None:
            _names(stmt.target, out)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out.update(alias.asname or alias.name.split(".")[0] for alias in stmt.names if alias.name != "*")
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    _names(item.optional_vars, out)
        elif isinstance(stmt, ast.Delete):
            out.difference_update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return frozenset(out)


def _names(target: ast.expr, out: set[str]) -> None:
    """Add the plain names an assignment target binds (not attributes or subscripts)."""
    if isinstance(target, ast.Name):
        out.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            _names(element.value if isinstance(element, ast.Starred) else element, out)
