"""Call sites of a cell and the names whose objects an expression may hand over.

The session decides from these whether a call may mutate its receiver or its
arguments (a known-pure builtin such as `len(x)` does not); this module only
says who is involved.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class CallSite:
    """One call the cell makes at module level, for the session's mutation policy.

    `func` is the dotted callee (`np.random.seed`) when the callee is a plain
    dotted name, else None. For a method call, `receiver` is the base name of the
    object (`a` in `a.b.append(x)`) and `method` the attribute called. `args` are
    the base names of every argument that may pass a reference to an existing
    object (base of `x.y[0]` is `x`). `inplace` is true for a literal `inplace=True`.
    """

    func: str | None
    receiver: str | None
    method: str | None
    args: frozenset[str]
    inplace: bool = False


def base_name(node: ast.expr) -> str | None:
    """The variable an access chain starts from: `a.b[0].c()` -> `a`.

    Calls are looked through because a method's result may be (part of) its
    receiver (`df.loc[0]`, `arr.reshape(-1)`).
    """
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return None


def dotted_name(node: ast.expr) -> str | None:
    """`np.random.seed` for a pure attribute chain on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def argument_bases(node: ast.expr) -> set[str]:
    """Names whose objects an argument expression may hand to the callee.

    Containers, conditionals and call results are looked into (`f([x])`,
    `f(x or y)`, `f(np.asarray(x))`); arithmetic is not, because it builds a new
    object.
    """
    found: set[str] = set()
    stack = [node]
    while stack:
        expr = stack.pop()
        if isinstance(expr, ast.Name):
            found.add(expr.id)
        elif isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred, ast.Await)):
            stack.append(expr.value)
        elif isinstance(expr, ast.Call):
            stack.append(expr.func)
            stack.extend(expr.args)
            stack.extend(k.value for k in expr.keywords)
        elif isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            stack.extend(expr.elts)
        elif isinstance(expr, ast.Dict):
            stack.extend(k for k in expr.keys if k is not None)
            stack.extend(expr.values)
        elif isinstance(expr, ast.BoolOp):
            stack.extend(expr.values)
        elif isinstance(expr, ast.IfExp):
            stack.extend((expr.body, expr.orelse))
        elif isinstance(expr, ast.NamedExpr):
            stack.extend((expr.target, expr.value))
        elif isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            # The elements of what is iterated may reach the callee.
            stack.extend(gen.iter for gen in expr.generators)
    return found
