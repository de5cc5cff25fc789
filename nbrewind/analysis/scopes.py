"""Which globals a function body refers to, found from its syntax tree.

A function defined in a cell reads its globals when it is called, not when the
cell runs, so the cell analysis records them separately ("deferred"). Function
bodies need no control-flow precision: any name a body may look up in the
module namespace is reported. Resolution follows Python's scoping rules
(locals, enclosing functions and comprehensions, `global` and `nonlocal`
declarations; class bodies are invisible to the functions nested in them),
because a name that is really a local or a closure variable is not a read of
the notebook namespace.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

# Names whose use means the code can reach the namespace in ways no static
# analysis can follow. `vars` is only dynamic without arguments; callers that
# can see the call decide that themselves.
DYNAMIC_NAMES = frozenset(
    {"exec", "eval", "globals", "locals", "vars", "__import__", "__builtins__", "get_ipython"}
)

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class FunctionSummary:
    """The namespace effects of calling a function defined in a cell.

    `global_reads` are names the body (and everything nested in it) may look
    up as globals; `global_writes` are names it declares `global` and binds;
    `dynamic` is true when it uses exec/eval/globals() and the like.
    """

    global_reads: frozenset[str]
    global_writes: frozenset[str]
    dynamic: bool


def target_names(target: ast.expr) -> list[str]:
    """Plain names bound by an assignment target (`a, (b, *c) = ...` -> a, b, c)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for elt in target.elts for name in target_names(elt)]
    return []


def pattern_names(pattern: ast.pattern) -> list[str]:
    """Names a `match` pattern captures (`case Point(x=a) | [a, *rest] as p`)."""
    names: list[str] = []
    for node in ast.walk(pattern):
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.append(node.rest)
    return names


class _Binder(ast.NodeVisitor):
    """Collects the names one scope binds, without entering nested scopes' bodies."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.global_decl: set[str] = set()
        self.nonlocal_decl: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bound.add(node.id)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.bound.add(node.name)
        for expr in definition_time_exprs(node):
            self.visit(expr)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in definition_time_exprs(node):
            self.visit(expr)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.bound.add(node.name)
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> None:
        # Only walrus targets escape a comprehension into this scope.
        for sub in ast.walk(node):
            if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
                self.bound.add(sub.target.id)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bound.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.bound.add(alias.asname or alias.name)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_match_case(self, node: ast.match_case) -> None:
        self.bound.update(pattern_names(node.pattern))
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.global_decl.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.nonlocal_decl.update(node.names)


def definition_time_exprs(node: FunctionNode) -> list[ast.expr]:
    """Expressions evaluated where a function is defined: decorators, defaults, annotations."""
    args = node.args
    exprs: list[ast.expr] = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    if isinstance(node, ast.Lambda):
        return exprs
    exprs.extend(node.decorator_list)
    every_arg = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    exprs.extend(a.annotation for a in every_arg if a is not None and a.annotation is not None)
    if node.returns is not None:
        exprs.append(node.returns)
    return exprs


def _parameters(args: ast.arguments) -> set[str]:
    every_arg = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return {a.arg for a in every_arg if a is not None}


class _BodyWalker(ast.NodeVisitor):
    """Visits the nodes of one function-like scope and resolves every name it loads."""

    def __init__(self, visible: Sequence[frozenset[str]], global_decl: frozenset[str], out: _Accumulator) -> None:
        # visible: local-name sets of this scope and its enclosing function-like
        # scopes, innermost last; a name found in none of them is a global.
        self.visible = visible
        self.global_decl = global_decl
        self.out = out

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        name = node.id
        if name not in self.global_decl and any(name in scope for scope in self.visible):
            return
        self.out.reads.add(name)
        if name in DYNAMIC_NAMES:
            self.out.dynamic = True

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for expr in definition_time_exprs(node):
            self.visit(expr)
        _walk_function(node, self.visible, self.out)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in definition_time_exprs(node):
            self.visit(expr)
        _walk_function(node, self.visible, self.out)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        # A class body sees the enclosing functions but its own names are not
        # visible to the methods. Treating its loads as non-local over-approximates
        # (a class attribute used in the body is reported as a global read),
        # which is the safe direction.
        binder = _Binder()
        for stmt in node.body:
            binder.visit(stmt)
        self.out.writes.update(binder.bound & binder.global_decl)
        walker = _BodyWalker(self.visible, frozenset(binder.global_decl), self.out)
        for stmt in node.body:
            walker.visit(stmt)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> None:
        first, *rest = node.generators
        self.visit(first.iter)
        local = frozenset(n for gen in node.generators for n in target_names(gen.target))
        inner = _BodyWalker([*self.visible, local], self.global_decl, self.out)
        for gen in node.generators:
            inner.visit(gen.target)
            if gen is not first:
                inner.visit(gen.iter)
            for cond in gen.ifs:
                inner.visit(cond)
        if isinstance(node, ast.DictComp):
            inner.visit(node.key)
            inner.visit(node.value)
        else:
            inner.visit(node.elt)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


class _Accumulator:
    def __init__(self) -> None:
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.dynamic = False


def _walk_function(node: FunctionNode, enclosing: Sequence[frozenset[str]], out: _Accumulator) -> None:
    body: list[ast.stmt] | list[ast.expr] = [node.body] if isinstance(node, ast.Lambda) else node.body
    binder = _Binder()
    for part in body:
        binder.visit(part)
    global_decl = frozenset(binder.global_decl)
    local = frozenset((binder.bound | _parameters(node.args)) - global_decl - binder.nonlocal_decl)
    # Names declared global are read from the namespace even if also bound here.
    out.writes.update(binder.bound & global_decl)
    walker = _BodyWalker([*enclosing, local], global_decl, out)
    for part in body:
        walker.visit(part)


def summarize_function(node: FunctionNode, enclosing: Sequence[frozenset[str]] = ()) -> FunctionSummary:
    """Summarize what calling `node` does to the notebook namespace.

    `enclosing` holds the local-name sets of function-like scopes around the
    definition (comprehensions, for a lambda written inside one), so that names
    they bind are recognised as closure variables rather than globals.
    Decorators, defaults and annotations are not included: they run at
    definition time, and the caller analyses them as part of the cell.
    """
    out = _Accumulator()
    _walk_function(node, tuple(enclosing), out)
    return FunctionSummary(frozenset(out.reads), frozenset(out.writes), out.dynamic)

