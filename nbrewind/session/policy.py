"""Small, pure rules the session applies to every cell: what is user state and how cell
code is normalized before it is digested. (What a call may mutate is `purity`'s job.)"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping, Set as AbstractSet
from typing import Any

from nbrewind.analysis import parse_source
from nbrewind.store.digest import digest_bytes

IPYTHON_NAMES = frozenset(
    {"_", "__", "___", "_i", "_ii", "_iii", "_oh", "_ih", "_dh", "In", "Out", "exit", "quit", "get_ipython"}
)
MODULE_DUNDERS = frozenset(
    {"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__builtins__", "__builtin__", "__file__"}
)
_HISTORY_NAME = re.compile(r"^_(i)?\d+$")

# Reading IPython's output history ties a cell to the previous cells' displayed
# results, which are not keyed: such a cell always runs (after replayed cells' results
# are put in place, `results.OutputHistory`).
HISTORY_READS = frozenset({"_", "__", "___", "_i", "_ii", "_iii", "_oh", "_ih", "Out", "In"})
_OUTPUT_NAME = re.compile(r"^_\d+$")


def reads_history(reads: AbstractSet[str]) -> bool:
    """Whether a cell reading `reads` reads IPython's history (`HISTORY_READS`, `_3`)."""
    return bool(reads & HISTORY_READS) or any(_OUTPUT_NAME.match(n) for n in reads)


# How code that reaches the namespace dynamically (`get_ipython().user_ns["Out"]`,
# `eval("_2")`) can name the output history.
_HISTORY_TEXT = re.compile(r"\b(Out|_oh|user_ns|_{1,3}|_\d+)\b")


def may_read_history(plan: Any) -> bool:
    """Whether a cell about to run may read the output history: it names it, or it reaches
    the namespace dynamically and its text could name it (a magic such as `%time x` does
    not: filling the history loads what replayed cells showed, which may be large)."""
    if reads_history(plan.reads):
        return True
    effects = plan.effects
    if effects is not None and not effects.dynamic and "get_ipython" not in plan.reads:
        return False
    return _HISTORY_TEXT.search(plan.transformed or plan.code) is not None

# Magics a cell may use and still be replayed. `%matplotlib` sets up the plotting backend:
# the kernel state it leaves is not a value, so a replay runs the magic line again (it is
# idempotent and prints nothing for a backend already chosen). `%time` and `%timeit` run
# their code argument in the namespace, which is analysed as if it were written in the
# cell; their timing lines are replayed as recorded, like any output of a run.
ALLOWED_MAGICS = frozenset({"matplotlib"})
CODE_MAGICS = frozenset({"time", "timeit"})
RERUN_ON_REPLAY = frozenset({"matplotlib"})


def magic_lines_to_rerun(transformed: str) -> list[str]:
    """The top-level `get_ipython().run_line_magic(...)` statements of `RERUN_ON_REPLAY`
    magics in a cell's transformed source, as source to execute."""
    if "run_line_magic" not in transformed:
        return []
    try:
        tree = ast.parse(transformed)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "run_line_magic"
            and isinstance(call.func.value, ast.Call)
            and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "get_ipython"
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value in RERUN_ON_REPLAY
            and all(isinstance(a, ast.Constant) for a in call.args)
        ):
            out.append(ast.unparse(node))
    return out


def is_user_name(name: str, value: Any, hidden: Mapping[str, Any]) -> bool:
    """Whether `name` is the user's own state rather than IPython's or the module's bookkeeping."""
    if name in IPYTHON_NAMES or name in MODULE_DUNDERS or _HISTORY_NAME.match(name):
        return False
    if name in hidden and hidden[name] is value:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def code_digest(transformed: str) -> str:
    """Digest of the cell's code with comments, blank lines and layout removed (kept for
    the process's life: a pure function of the text, asked again whenever a cell is)."""
    try:
        normal = ast.dump(parse_source(transformed), annotate_fields=True, include_attributes=False)
    except (SyntaxError, ValueError):
        normal = "\0raw\0" + transformed
    return digest_bytes(normal.encode())
