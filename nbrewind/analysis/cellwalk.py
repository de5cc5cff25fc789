"""The flow-sensitive walk over a cell's module-level code behind `analyze_cell`.

Statements are visited in execution order while tracking which names are
definitely bound at each point (branches intersect, loops and `with` bodies
may not run to the end), so that a name is a read only if the cell may look it
up before binding it itself. Class bodies and comprehensions run during the
cell too and are walked here as nested frames; function bodies run later and
are summarized by `scopes`.
"""


from __future__ import annotations

from nbrewind.analysis.walk_expressions import ExpressionWalk
from nbrewind.analysis.walk_magics import MagicWalk
from nbrewind.analysis.walk_state import WalkerState
from nbrewind.analysis.walk_statements import StatementWalk

__all__ = ["CellWalker"]


class CellWalker(StatementWalk, ExpressionWalk, MagicWalk, WalkerState):
    """Walks a cell's module-level code in execution order, tracking what is bound.

    After `block(tree.body)` its set attributes hold the cell's effects.
    """
