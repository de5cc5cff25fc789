"""The state of the walk over a cell: frames (module, class bodies, comprehensions), the names
bound at each point, and the effects found so far (see `cellwalk`)."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable
from enum import Enum

from nbrewind.analysis.callsites import CallSite, base_name
from nbrewind.analysis.scopes import (
    DYNAMIC_NAMES,
    FunctionNode,
)


class FrameKind(Enum):
    MODULE = "module"
    CLASS = "class"
    COMPREHENSION = "comprehension"


class Frame:
    """A scope whose code runs while the cell runs: the module, a class body, a comprehension."""

    def __init__(self, kind: FrameKind, bound: set[str] | None = None) -> None:
        self.kind = kind
        # MODULE / CLASS: names definitely bound at this point of the flow.
        # COMPREHENSION: the iteration variables.
        self.bound: set[str] = bound if bound is not None else set()
        self.global_decl: set[str] = set()
        self.method_reads: set[str] = set()
        # COMPREHENSION: iteration variable -> names of what it iterates over, since
        # `[row.append(0) for row in grid]` mutates grid's elements.
        self.origins: dict[str, set[str]] = {}


MAGIC_RUNNERS = {"run_line_magic": 1, "run_cell_magic": 2}  # -> index of the code argument


class WalkerState:
    """What the walk knows at each point: the frames, what is bound, and the effects so far.

    The statement, expression and magic halves (`walk_*` modules) are mixed in by
    `CellWalker`; each calls the others through `self`.
    """

    def __init__(self, allowed_magics: Collection[str], code_magics: Collection[str]) -> None:
        self.allowed_magics = allowed_magics
        self.code_magics = code_magics
        self.module = Frame(FrameKind.MODULE)
        self.frames: list[Frame] = [self.module]
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
    def top(self) -> Frame:
        return self.frames[-1]

    def _scope_of(self, name: str) -> Frame:
        """The frame a load of `name` resolves to (module when it is a global)."""
        for depth, frame in enumerate(reversed(self.frames)):
            if frame.kind is FrameKind.COMPREHENSION and name in frame.bound:
                return frame
            # A class body's names are visible only to the body itself.
            if frame.kind is FrameKind.CLASS and depth == 0 and name in frame.bound:
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
        if frame.kind is FrameKind.COMPREHENSION:
            return  # an iteration variable, local to the comprehension
        if frame.kind is FrameKind.CLASS and name not in frame.global_decl:
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
        if frame.kind is FrameKind.CLASS and name not in frame.global_decl:
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
            elif frame.kind is FrameKind.COMPREHENSION:
                found |= frame.origins.get(name, set())
        return found

    # -- implemented by the mixins ---------------------------------------------

    def block(self, stmts: Iterable[ast.stmt]) -> None:
        raise NotImplementedError

    def stmt(self, node: ast.stmt) -> None:
        raise NotImplementedError

    def expr(self, node: ast.expr) -> None:
        raise NotImplementedError

    def assign_target(self, target: ast.expr, *, definitely: bool = True) -> None:
        raise NotImplementedError

    def _define(self, node: FunctionNode) -> frozenset[str]:
        raise NotImplementedError

    def _magic(self, node: ast.Call) -> bool:
        raise NotImplementedError
