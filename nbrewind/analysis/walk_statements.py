"""Statements of a cell in execution order: what each binds, deletes, reads and defines."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from nbrewind.analysis.scopes import (
    FunctionNode,
    definition_time_exprs,
    pattern_names,
    summarize_function,
)
from nbrewind.analysis.walk_state import Frame, FrameKind, WalkerState


class StatementWalk(WalkerState):
    """The statement half of `CellWalker`: one `stmt_<Kind>` method per statement type."""

    def block(self, stmts: Iterable[ast.stmt]) -> None:
        for stmt in stmts:
            self.stmt(stmt)

    def _branch(self, stmts: Iterable[ast.stmt], start: set[str]) -> set[str]:
        """Analyse a block from a given bound-set; return the bound-set at its end."""
        self.top.bound = set(start)
        self.block(stmts)
        return self.top.bound

    def stmt(self, node: ast.stmt) -> None:
        handler = getattr(self, "stmt_" + type(node).__name__, None)
        if handler is not None:
            handler(node)
        else:
            # Unknown statement kinds (from a newer Python): read every name in it.
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name):
                    self.load(sub.id)

    def stmt_Expr(self, node: ast.Expr) -> None:
        self.expr(node.value)

    def stmt_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for expr in definition_time_exprs(node):
            self.expr(expr)
        summary = self._define(node)
        self.bind(node.name, defines=summary)
        if node.decorator_list:
            # A decorator receives the function and may call it right away.
            self._reads_now(summary)

    stmt_AsyncFunctionDef = stmt_FunctionDef

    def _define(self, node: FunctionNode) -> frozenset[str]:
        enclosing = [f.bound for f in self.frames if f.kind is FrameKind.COMPREHENSION]
        summary = summarize_function(node, [frozenset(s) for s in enclosing])
        self.deferred_reads |= summary.global_reads
        self.deferred_writes |= summary.global_writes
        self.deferred_dynamic |= summary.dynamic
        for frame in self.frames:
            if frame.kind is FrameKind.CLASS:
                frame.method_reads |= summary.global_reads
        return summary.global_reads

    def stmt_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.expr(expr)
        frame = Frame(FrameKind.CLASS)
        self.frames.append(frame)
        try:
            self.block(node.body)
        finally:
            self.frames.pop()
        for outer in self.frames:
            if outer.kind is FrameKind.CLASS:
                outer.method_reads |= frame.method_reads
        defines = frozenset(frame.method_reads)
        self.bind(node.name, defines=defines)
        if node.decorator_list or node.keywords:
            self._reads_now(defines)

    def stmt_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.expr(node.value)

    def stmt_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._delete(target)

    def _delete(self, target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.load(target.id)  # `del x` fails unless x exists: the cell depends on it
            self.unbind(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._delete(elt)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            self._load_target_parts(target)
            self.mutate(target)

    def _load_target_parts(self, target: ast.Attribute | ast.Subscript) -> None:
        self.expr(target.value)
        if isinstance(target, ast.Subscript):
            self.expr(target.slice)

    def assign_target(self, target: ast.expr, *, definitely: bool = True) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, definitely=definitely)
        elif isinstance(target, ast.Starred):
            self.assign_target(target.value, definitely=definitely)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.assign_target(elt, definitely=definitely)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            self._load_target_parts(target)
            self.mutate(target)

    def stmt_Assign(self, node: ast.Assign) -> None:
        self.expr(node.value)
        for target in node.targets:
            self.assign_target(target)

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        target = node.target
        if isinstance(target, ast.Name):
            self.load(target.id)
            self.expr(node.value)
            # `+=` on a list or array changes the object other names share.
            if self._scope_of(target.id) is self.module:
                self.mutated.add(target.id)
            self.bind(target.id)
        else:
            self.assign_target(target)
            self.expr(node.value)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.expr(node.annotation)
        if node.value is not None:
            self.expr(node.value)
            self.assign_target(node.target)
        elif isinstance(node.target, (ast.Attribute, ast.Subscript)):
            self._load_target_parts(node.target)

    def stmt_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.expr(node.iter)
        start = set(self.top.bound)
        self.assign_target(node.target)
        self.block(node.body)
        self.block(node.orelse)
        # Zero iterations or a break: nothing bound inside is definite.
        self.top.bound = start

    stmt_AsyncFor = stmt_For

    def stmt_While(self, node: ast.While) -> None:
        self.expr(node.test)
        start = set(self.top.bound)
        self.block(node.body)
        self.block(node.orelse)
        self.top.bound = start

    def stmt_If(self, node: ast.If) -> None:
        self.expr(node.test)
        start = set(self.top.bound)
        then = self._branch(node.body, start)
        other = self._branch(node.orelse, start)
        self.top.bound = then & other

    def stmt_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.expr(item.context_expr)
            if item.optional_vars is not None:
                self.assign_target(item.optional_vars)
        start = set(self.top.bound)
        self.block(node.body)
        # A context manager may swallow an exception raised half-way through the body.
        self.top.bound = start

    stmt_AsyncWith = stmt_With

    def stmt_Raise(self, node: ast.Raise) -> None:
        for expr in (node.exc, node.cause):
            if expr is not None:
                self.expr(expr)

    def stmt_Assert(self, node: ast.Assert) -> None:
        self.expr(node.test)
        if node.msg is not None:
            self.expr(node.msg)

    def stmt_Try(self, node: ast.Try | ast.TryStar) -> None:
        start = set(self.top.bound)
        after_body = self._branch(node.body, start)
        ends = [self._branch(node.orelse, after_body)]
        for handler in node.handlers:
            # An exception may come from any point of the body.
            self.top.bound = set(start)
            if handler.type is not None:
                self.expr(handler.type)
            if handler.name:
                self.bind(handler.name)
            self.block(handler.body)
            if handler.name:
                self.unbind(handler.name)
            ends.append(self.top.bound)
        normal = set.intersection(*ends)
        # `finally` also runs on paths where only `start` holds.
        after_finally = self._branch(node.finalbody, start)
        self.top.bound = (normal | (after_finally - start)) - (start - after_finally)

    stmt_TryStar = stmt_Try

    def stmt_Match(self, node: ast.Match) -> None:
        self.expr(node.subject)
        start = set(self.top.bound)
        ends = [start]  # no case matched
        for case in node.cases:
            self.top.bound = set(start)
            self._pattern(case.pattern)
            if case.guard is not None:
                self.expr(case.guard)
            self.block(case.body)
            ends.append(self.top.bound)
        self.top.bound = set.intersection(*ends)

    def _pattern(self, pattern: ast.pattern) -> None:
        for sub in ast.walk(pattern):
            if isinstance(sub, ast.MatchValue):
                self.expr(sub.value)
            elif isinstance(sub, ast.MatchClass):
                self.expr(sub.cls)
            elif isinstance(sub, ast.MatchMapping):
                for key in sub.keys:
                    self.expr(key)
        for name in pattern_names(pattern):
            self.bind(name)

    def stmt_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.add(alias.name)
            if alias.name == "__main__":
                self.dynamic = True  # the namespace itself, as a module
            self.bind(alias.asname or alias.name.split(".")[0])

    def stmt_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        self.imports.add(module)
        if module == "__main__":
            self.dynamic = True
        for alias in node.names:
            if alias.name == "*":
                self.dynamic = True
            else:
                self.bind(alias.asname or alias.name)

    def stmt_Global(self, node: ast.Global) -> None:
        self.top.global_decl.update(node.names)

    def stmt_Nonlocal(self, node: ast.Nonlocal) -> None:
        pass

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_Break(self, node: ast.Break) -> None:
        pass

    def stmt_Continue(self, node: ast.Continue) -> None:
        pass

    def stmt_TypeAlias(self, node: ast.stmt) -> None:
        # Python >= 3.12: `type X = ...`; the value is evaluated lazily, on use.
        name = getattr(node, "name", None)
        value = getattr(node, "value", None)
        if isinstance(value, ast.expr):
            lazy = {sub.id for sub in ast.walk(value) if isinstance(sub, ast.Name)}
            self.deferred_reads |= lazy
        if isinstance(name, ast.Name):
            self.bind(name.id)
