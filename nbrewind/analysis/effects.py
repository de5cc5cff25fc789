"""Static effects of one notebook cell: what it reads, binds, deletes and may mutate.

The session uses these sets to build a cell's key (its reads) and to decide what
a checkpoint must capture (its writes, deletes and possibly mutated names).
Precision matters in one direction only: a read we miss lets a stale recording
be replayed, which silently breaks fidelity, while an extra read only costs a
re-run. So wherever the analysis is unsure it reports more, and a construct it
cannot follow at all (exec, globals(), star imports, ...) sets `dynamic`,
meaning "reads and writes everything".

The input is Python after IPython's transformation, so magics appear as
`get_ipython().run_line_magic(...)` calls.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Collection
from dataclasses import dataclass

from nbrewind.analysis.callsites import CallSite
from nbrewind.analysis.cellwalk import CellWalker

__all__ = ["CallSite", "CellEffects", "analyze_cell", "parse_source"]


@functools.lru_cache(maxsize=8)
def parse_source(source: str) -> ast.Module:
    """`ast.parse(source)`, shared: a cell is parsed once for its effects and once more for
    its code digest, back to back, and the second parse is this cache's. The tree is
    shared by every caller, so none may change it. Errors are raised, not cached."""
    return ast.parse(source)


@dataclass(frozen=True)
class CellEffects:
    """What running a cell may do to the notebook namespace.

    `reads` are names the cell looks up before binding them itself (builtins
    included: the session drops what the namespace does not hold). `writes`
    are names it binds; `deletes` names it unbinds (`del x`, and `except ... as e`,
    which Python unbinds when the handler ends). `mutated` are names whose object
    may change in place. `deferred_reads` / `deferred_writes` are globals that
    functions, lambdas and classes defined in the cell read / assign when called;
    `deferred_dynamic` says one of them uses exec, globals() and the like.
    """

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    deletes: frozenset[str] = frozenset()
    mutated: frozenset[str] = frozenset()
    calls: tuple[CallSite, ...] = ()
    imports: frozenset[str] = frozenset()
    deferred_reads: frozenset[str] = frozenset()
    deferred_writes: frozenset[str] = frozenset()
    dynamic: bool = False
    deferred_dynamic: bool = False
    syntax_error: bool = False


def analyze_cell(
    source: str,
    *,
    allowed_magics: Collection[str] = frozenset(),
    code_magics: Collection[str] = frozenset(),
) -> CellEffects:
    """Compute the namespace effects of a cell's (already IPython-transformed) source.

    `allowed_magics` are magic names whose `run_line_magic` / `run_cell_magic`
    calls do not touch the namespace; any other use of `get_ipython()` makes
    the cell dynamic. `code_magics` are magics that run their code argument in
    the namespace (`time`, `timeit`, `capture` ...): that code is analysed as if
    written in the cell, and if it does not parse the cell is dynamic.
    A cell that does not parse gets `syntax_error=True` and empty effects; it
    will raise when run and change nothing.

    The answer depends on nothing but the arguments, so it is kept for the process's
    life (the last `_ANALYSED` sources): a cell run again, or run after a frontend asked
    what it would do, is not analysed twice. `CellEffects` is immutable.
    """
    try:
        return _analyze(source, frozenset(allowed_magics), frozenset(code_magics))
    except _NotKept as answer:
        return answer.effects


_ANALYSED = 1024


class _NotKept(Exception):
    """An answer forced by the moment (memory, stack depth), not by the source: not cached."""

    def __init__(self, effects: CellEffects) -> None:
        super().__init__()
        self.effects = effects


@functools.lru_cache(maxsize=_ANALYSED)
def _analyze(source: str, allowed_magics: frozenset[str], code_magics: frozenset[str]) -> CellEffects:
    try:
        tree = parse_source(source)
    except (SyntaxError, ValueError):
        return CellEffects(syntax_error=True)
    except (MemoryError, RecursionError):
        raise _NotKept(CellEffects(syntax_error=True)) from None
    walker = CellWalker(allowed_magics, code_magics)
    try:
        walker.block(tree.body)
    except RecursionError:
        # Pathologically nested code: claim everything rather than fail.
        raise _NotKept(CellEffects(dynamic=True)) from None
    return CellEffects(
        reads=frozenset(walker.reads),
        writes=frozenset(walker.writes),
        deletes=frozenset(walker.deletes),
        mutated=frozenset(walker.mutated),
        calls=tuple(walker.calls),
        imports=frozenset(walker.imports),
        deferred_reads=frozenset(walker.deferred_reads),
        deferred_writes=frozenset(walker.deferred_writes),
        dynamic=walker.dynamic or _reaches_namespace_indirectly(tree),
        deferred_dynamic=walker.deferred_dynamic,
    )


# `sys.modules["__main__"].__dict__`, `sys._getframe().f_globals`: ways to the namespace
# that name no variable. Code using them may read or write anything.
_NAMESPACE_ATTRIBUTES = frozenset({"modules", "_getframe", "currentframe", "f_globals", "f_locals", "stack"})


def _reaches_namespace_indirectly(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "__main__":
            return True
        if isinstance(node, ast.Attribute) and node.attr in _NAMESPACE_ATTRIBUTES:
            return True
    return False
