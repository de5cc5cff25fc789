"""How a cell uses each global name: the syntactic place of every load.

After a cell runs, every value it could have reached must be re-digested,
unless it can be proven unchanged. The proof needs two facts: the value's exact
type (known only at run time, to the session) and *how* the cell used the name,
which is syntax and lives here. A use is one of:

- ``method``: ``n.m(...)`` (`detail` is the method name; `flags` tell whether an
  ``out=``/``inplace=`` keyword or ``**kwargs`` was passed);
- ``attr``: ``n.a`` read and not chained further; `nargs` is 1 when its value is
  passed on (``f(n.a)``, ``n.a[0]``), which is pure only for attributes whose value
  cannot alias the object; other chains (``n.a.b``) are `other`;
- ``item``: ``n[k]`` read (chains of reads ``n[i][j]`` included); ``item_arg`` when
  passed straight to a call (``float(n[0])``), ``item_method`` when a method of the
  item is called (``df['c'].value_counts()``);
- ``arg``: a direct argument ``f(n)`` / ``f(x=n)``, with the callee's dotted name
  and the number of positional arguments (a ufunc's extra positional argument is
  its output);
- ``operand``: an operand of an operator, comparison, condition, f-string, or a
  bare expression statement (displayed);
- ``iter``: iterated by ``for`` or a comprehension;
- ``other``: anything else (bound to another name, put in a container,
  returned, used inside a function or lambda body, ...). Nothing is proven for it.

Only loads at cell level are classified; a name used inside a function, lambda
or class body defined in the cell is `other`, since that code may run at any time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["Use", "attribute_names", "name_uses"]

OUT_KEYWORDS = frozenset({"out", "inplace"})


@dataclass(frozen=True)
class Use:
    """One load of a global name by cell-level code."""

    kind: str
    detail: str = ""
    nargs: int = 0
    unsafe_keywords: bool = False


def name_uses(source: str) -> dict[str, list[Use]] | None:
    """Every cell-level load of a name in `source`, classified; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    parents: dict[int, ast.AST] = {}
    uses: dict[str, list[Use]] = {}
    nested: set[int] = set()
    try:
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) or id(node) in nested:
                    nested.add(id(child))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                use = Use("other") if id(node) in nested else _classify(node, parents)
                uses.setdefault(node.id, []).append(use)
    except RecursionError:
        return None
    return uses


def _unsafe(call: ast.Call) -> bool:
    return any(k.arg is None or k.arg in OUT_KEYWORDS for k in call.keywords)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _classify(node: ast.Name, parents: dict[int, ast.AST]) -> Use:
    parent = parents.get(id(node))
    if isinstance(parent, ast.Attribute) and parent.value is node:
        grand = parents.get(id(parent))
        if isinstance(grand, ast.Call) and grand.func is parent:
            return Use("method", parent.attr, len(grand.args), _unsafe(grand))
        if (isinstance(grand, ast.Call) and parent in grand.args) or (
            isinstance(grand, ast.Subscript) and grand.value is parent and isinstance(grand.ctx, ast.Load)
        ):
            return Use("attr", parent.attr, nargs=1)  # its value is passed on: `f(a.shape)`, `a.shape[0]`
        if isinstance(grand, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
            return Use("other")
        return Use("attr", parent.attr)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        top: ast.AST = parent
        while isinstance(parents.get(id(top)), ast.Subscript) and parents[id(top)].value is top:  # type: ignore[attr-defined]
            top = parents[id(top)]
        above = parents.get(id(top))
        if not isinstance(getattr(top, "ctx", None), ast.Load):
            return Use("other")
        if isinstance(above, ast.Call) and top in above.args:
            # `float(a[0])`: pure when the callee is.
            return Use("item_arg", _dotted(above.func) or "", len(above.args), _unsafe(above))
        if isinstance(above, ast.Attribute) and above.value is top:
            call = parents.get(id(above))
            if isinstance(call, ast.Call) and call.func is above:
                # `df['cat'].value_counts()`: a method of the item, pure for some types.
                return Use("item_method", above.attr, len(call.args), _unsafe(call))
            return Use("other")
        if isinstance(above, (ast.Attribute, ast.Call, ast.Starred)):
            return Use("other")
        return Use("item")
    if isinstance(parent, ast.Call) and node in parent.args:
        return Use("arg", _dotted(parent.func) or "", len(parent.args), _unsafe(parent))
    if isinstance(parent, ast.keyword) and parent.arg is not None and parent.arg not in OUT_KEYWORDS:
        call = parents.get(id(parent))
        if isinstance(call, ast.Call):
            return Use("arg", _dotted(call.func) or "", len(call.args), _unsafe(call))
    if isinstance(parent, (ast.BinOp, ast.Compare, ast.UnaryOp, ast.BoolOp, ast.FormattedValue, ast.Expr, ast.Assert)):
        return Use("operand")
    if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and getattr(parent, "test", None) is node:
        return Use("operand")
    if isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension)) and parent.iter is node:
        return Use("iter")
    return Use("other")


def attribute_names(source: str) -> set[str]:
    """Every attribute name `source` mentions (``np.random.seed`` gives random and seed)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return set()
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
