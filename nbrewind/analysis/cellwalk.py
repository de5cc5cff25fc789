"""The flow-sensitive walk over a cell's module-level code behind `analyze_cell`.

Statements are visited in execution order while tracking which names are
definitely bound at each point (branches intersect, loops and `with` bodies
may not run to the end), so that a name is a read only if the cell may look it
up before binding it itself. Class bodies and comprehensions run during the
cell too and are walked here as nested frames; function bodies run later and
are summarized by `scopes`.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable
from enum import Enum

from nbrewind.analysis.callsites import CallSite, argument_bases, base_name, dotted_name
from nbrewind.analysis.scopes import (
    DYNAMIC_NAMES,
    FunctionNode,
    definition_time_exprs,
    pattern_names,
    summarize_function,
    target_names,
)


class _Kind(Enum):
    MODULE = "module"
    CLASS = "class"
    COMPREHENSION = "comprehension"


class _Frame:
    """A scope whose code runs while the cell runs: the module, a class body, a comprehension."""

    def __init__(self, kind: _Kind, bound: set[str] | None = None) -> None:
        self.kind = kind
        # MODULE / CLASS: names definitely bound at this point of the flow.
        # COMPREHENSION: the iteration variables.
        self.bound: set[str] = bound if bound is not None else set()
        self.global_decl: set[str] = set()
        self.method_reads: set[str] = set()
        # COMPREHENSION: iteration variable -> names of what it iterates over, since
        # `[row.append(0) for row in grid]` mutates grid's elements.
        self.origins: dict[str, set[str]] = {}


_MAGIC_RUNNERS = {"run_line_magic": 1, "run_cell_magic": 2}  # -> index of the code argument


class CellWalker:
    """Walks a cell's module-level code in execution order, tracking what is bound.

    After `block(tree.body)` its set attributes hold the cell's effects.
    """

    def __init__(self, allowed_magics: Collection[str], code_magics: Collection[str]) -> None:
        self.allowed_magics = allowed_magics
        self.code_magics = code_magics
        self.module = _Frame(_Kind.MODULE)
        self.frames: list[_Frame] = [self.module]
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.deletes: set[str] = set()
        self.mutated: set[str] = set()
        self.imports: set[str] = set()
        self.calls: list[CallSite] = []
        self.deferred_reads: set[str] = set()
        self.deferred_writes: set[str] = set()
        self.dynamic = False
        self.deferred_dynamic = False
        # Functions and classes this cell defined at module level -> globals they read.
        self.cell_defs: dict[str, frozenset[str]] = {}
        # > 0 while evaluating code that may not run (short-circuit, conditional
        # expression, comprehension body): a walrus there binds, but not definitely.
        self.maybe = 0

    # -- names ---------------------------------------------------------------

    @property
    def top(self) -> _Frame:
        return self.frames[-1]

    def _scope_of(self, name: str) -> _Frame:
        """The frame a load of `name` resolves to (module when it is a global)."""
        for depth, frame in enumerate(reversed(self.frames)):
            if frame.kind is _Kind.COMPREHENSION and name in frame.bound:
                return frame
            # A class body's names are visible only to the body itself.
            if frame.kind is _Kind.CLASS and depth == 0 and name in frame.bound:
                return frame
        return self.module

    def load(self, name: str) -> None:
        if name in DYNAMIC_NAMES:
            self.dynamic = True
        if self._scope_of(name) is not self.module:
            return
        if name not in self.module.bound:
            self.reads.add(name)
        if name in self.cell_defs:
            # Using a function defined earlier in the cell may call it now.
            self._reads_now(self.cell_defs[name])

    def _reads_now(self, names: Iterable[str]) -> None:
        """Count globals of code that may run at this point, following cell-defined functions."""
        pending = list(names)
        seen: set[str] = set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name not in self.module.bound:
                self.reads.add(name)
            if name in DYNAMIC_NAMES:
                self.dynamic = True  # a cell function using exec/globals() may run now
            pending.extend(self.cell_defs.get(name, ()))

    def bind(self, name: str, *, definitely: bool = True, defines: frozenset[str] | None = None) -> None:
        frame = self.top
        if frame.kind is _Kind.COMPREHENSION:
            return  # an iteration variable, local to the comprehension
        if frame.kind is _Kind.CLASS and name not in frame.global_decl:
            frame.bound.add(name)
            return
        self.writes.add(name)
        if definitely and self.maybe == 0:
            self.module.bound.add(name)
        if defines is not None:
            self.cell_defs[name] = defines
        else:
            self.cell_defs.pop(name, None)

    def unbind(self, name: str) -> None:
        frame = self.top
        if frame.kind is _Kind.CLASS and name not in frame.global_decl:
            frame.bound.discard(name)
            return
        self.deletes.add(name)
        self.module.bound.discard(name)
        self.cell_defs.pop(name, None)

    def mutate(self, node: ast.expr) -> None:
        name = base_name(node)
        if name is not None:
            self.mutated |= self.module_names({name})

    def module_names(self, names: Iterable[str]) -> set[str]:
        """Map names to the module variables whose objects they may be.

        Comprehension variables become what they iterate over; class-body names
        are dropped (they are not module variables).
        """
        found: set[str] = set()
        for name in names:
            frame = self._scope_of(name)
            if frame is self.module:
                found.add(name)
            elif frame.kind is _Kind.COMPREHENSION:
                found |= frame.origins.get(name, set())
        return found

    # -- statements ----------------------------------------------------------

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
        enclosing = [f.bound for f in self.frames if f.kind is _Kind.COMPREHENSION]
        summary = summarize_function(node, [frozenset(s) for s in enclosing])
        self.deferred_reads |= summary.global_reads
        self.deferred_writes |= summary.global_writes
        self.deferred_dynamic |= summary.dynamic
        for frame in self.frames:
            if frame.kind is _Kind.CLASS:
                frame.method_reads |= summary.global_reads
        return summary.global_reads

    def stmt_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.expr(expr)
        frame = _Frame(_Kind.CLASS)
        self.frames.append(frame)
        try:
            self.block(node.body)
        finally:
            self.frames.pop()
        for outer in self.frames:
            if outer.kind is _Kind.CLASS:
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

    # -- expressions ---------------------------------------------------------

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
        in_comprehension = self.top.kind is _Kind.COMPREHENSION
        # A walrus in a comprehension binds in the enclosing (here: module) scope.
        saved = self.frames
        self.frames = [f for f in self.frames if f.kind is not _Kind.COMPREHENSION]
        try:
            self.bind(target.id, definitely=not in_comprehension)
        finally:
            self.frames = saved

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> None:
        first = node.generators[0]
        self.expr(first.iter)
        frame = _Frame(_Kind.COMPREHENSION, set())
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

    def _magic(self, node: ast.Call) -> bool:
        """Handle `get_ipython().run_*_magic('name', ...)` for the magics the caller trusts."""
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr in _MAGIC_RUNNERS
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "get_ipython"
            and not func.value.args
            and not func.value.keywords
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return False
        magic = node.args[0].value
        if magic in self.code_magics:
            code_at = _MAGIC_RUNNERS[func.attr]
            code = node.args[code_at] if len(node.args) > code_at else None
            for i, arg in enumerate(node.args[1:], start=1):
                if i != code_at:
                    self.expr(arg)
            if not (isinstance(code, ast.Constant) and isinstance(code.value, str)):
                self.dynamic = True
                return True
            try:
                inner = ast.parse(code.value)
            except (SyntaxError, ValueError):
                self.dynamic = True  # e.g. IPython syntax inside: the magic transforms it itself
                return True
            if self.top is not self.module:
                self.dynamic = True
                return True
            self.block(inner.body)
            return True
        if magic in self.allowed_magics:
            for arg in node.args[1:]:
                self.expr(arg)
            for kw in node.keywords:
                self.expr(kw.value)
            return True
        return False
