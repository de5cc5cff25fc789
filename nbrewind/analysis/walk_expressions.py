"""Expressions of a cell: loads, walrus bindings, comprehensions and calls (what they may mutate)."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from nbrewind.analysis.callsites import CallSite, argument_bases, base_name, dotted_name
from nbrewind.analysis.scopes import (
    definition_time_exprs,
    target_names,
)
from nbrewind.analysis.walk_state import Frame, FrameKind, WalkerState


class ExpressionWalk(WalkerState):
    """The expression half of `CellWalker`."""

    def expr(self, node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.load(node.id)
        elif isinstance(node, ast.NamedExpr):
            self.expr(node.value)
            self._walrus(node.target)
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, ast.Lambda):
            for expr in definition_time_exprs(node):
                self.expr(expr)
            # A lambda written in a cell is usually called by the cell (map, sort keys...).
            self._reads_now(self._define(node))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            self._comprehension(node)
        elif isinstance(node, ast.BoolOp):
            self.expr(node.values[0])
            self._maybe(node.values[1:])
        elif isinstance(node, ast.IfExp):
            self.expr(node.test)
            self._maybe([node.body, node.orelse])
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)
                elif isinstance(child, ast.keyword):
                    self.expr(child.value)

    def _maybe(self, exprs: Iterable[ast.expr]) -> None:
        self.maybe += 1
        try:
            for expr in exprs:
                self.expr(expr)
        finally:
            self.maybe -= 1

    def _walrus(self, target: ast.expr) -> None:
        if not isinstance(target, ast.Name):
            return
        in_comprehension = self.top.kind is FrameKind.COMPREHENSION
        # A walrus in a comprehension binds in the enclosing (here: module) scope.
        saved = self.frames
        self.frames = [f for f in self.frames if f.kind is not FrameKind.COMPREHENSION]
        try:
            self.bind(target.id, definitely=not in_comprehension)
        finally:
            self.frames = saved

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> None:
        first = node.generators[0]
        self.expr(first.iter)
        frame = Frame(FrameKind.COMPREHENSION, set())
        origins = self.module_names(argument_bases(first.iter))
        self.frames.append(frame)
        self.maybe += 1
        try:
            for gen in node.generators:
                if gen is not first:
                    origins = self.module_names(argument_bases(gen.iter))
                for name in target_names(gen.target):
                    frame.bound.add(name)
                    frame.origins[name] = origins
                self.assign_target(gen.target)
                if gen is not first:
                    self.expr(gen.iter)
                for cond in gen.ifs:
                    self.expr(cond)
            if isinstance(node, ast.DictComp):
                self.expr(node.key)
                self.expr(node.value)
            else:
                self.expr(node.elt)
        finally:
            self.maybe -= 1
            self.frames.pop()

    def _call(self, node: ast.Call) -> None:
        if self._magic(node):
            return
        func = node.func
        if isinstance(func, ast.Name) and func.id == "vars" and (node.args or node.keywords):
            self.reads.add("vars")  # vars(obj) inspects obj, not the namespace
        elif isinstance(func, ast.Name) and func.id == "dir" and not (node.args or node.keywords) and self.top is self.module:
            # dir() at the top of a cell lists the notebook's names, as globals() does.
            self.expr(func)
            self.load("globals")
        else:
            self.expr(func)
        method = func.attr if isinstance(func, ast.Attribute) else None
        receiver = base_name(func.value) if isinstance(func, ast.Attribute) else None
        args: set[str] = set()
        dotted = dotted_name(func)
        if receiver is not None and self._scope_of(receiver) is not self.module:
            # A comprehension variable: report what it iterates over instead.
            owners = self.module_names({receiver})
            receiver = next(iter(owners)) if len(owners) == 1 else None
            args |= owners
            dotted = None
        for arg in node.args:
            args |= argument_bases(arg)
            self.expr(arg)
        inplace = False
        for kw in node.keywords:
            args |= argument_bases(kw.value)
            self.expr(kw.value)
            if kw.arg == "inplace" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                inplace = True
        self.calls.append(CallSite(dotted, receiver, method, frozenset(self.module_names(args)), inplace))
