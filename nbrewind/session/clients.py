"""Whether a cell that runs may need the Dask client replayed cells left pending.

A client that replayed cells made is brought back (its cluster started) before a cell
that may use it runs: with it, `.compute()` goes to the cluster as in a fresh run, and
`get_client()` finds it. Starting a cluster costs seconds, so a cell that provably
cannot reach Dask (it reads only plain values, notebook functions and modules of the
standard library or of libraries that never call Dask) runs without it. The proof is
conservative: anything it cannot see through (exec, a notebook class's instance, a
module of another library, a local module) counts as a possible use.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.session.plan import CellPlan
from nbrewind.session.state import MODULE, UNSERIALIZABLE, VALUE, Entry

__all__ = ["may_need_client"]

_NEVER_DASK = frozenset(sys.stdlib_module_names) | {"numpy", "pandas", "matplotlib", "scipy", "PIL", "IPython"}
"""Top-level packages whose code never calls into Dask, whose values hold no Dask objects."""

_PARTS_WITH_DASK = frozenset({"concurrent"})
"""Standard-library packages a Dask object can hide behind (a distributed Future is a concurrent one)."""


def _plain_module(name: str) -> bool:
    top = name.partition(".")[0]
    return top in _NEVER_DASK and top not in _PARTS_WITH_DASK and top != "__main__"


_ATOMS = frozenset({"int", "float", "complex", "bool", "str", "bytes", "bytearray", "NoneType", "range", "slice", "function", "type"})
"""Builtin types that hold no other objects (a list or dict may hold a Dask collection)."""

_CONTAINER_MODULES = frozenset({"builtins", "collections", "types", "weakref", "queue", "array"})


def _plain_type(qualified: str) -> bool:
    """`module.qualname` of a value's type: plain if its module never reaches Dask and it
    is not a container that could hold a Dask object."""
    module, _, name = qualified.rpartition(".")
    module = module or "builtins"
    if module in _CONTAINER_MODULES:
        return module == "builtins" and name in _ATOMS
    return _plain_module(module)


def _plain_value(value: Any) -> bool:
    if isinstance(value, types.ModuleType):
        return _plain_module(value.__name__)
    if isinstance(value, types.FunctionType):
        # A notebook function's own global reads are already among the cell's reads
        # (transitive reads); one from a module is as plain as its module.
        module = getattr(value, "__module__", None) or "__main__"
        return module == "__main__" or _plain_module(module)
    if isinstance(value, type):
        return _plain_module(value.__module__)
    kind = type(value)
    return _plain_type(f"{kind.__module__}.{kind.__qualname__}")


def _plain_entry(entry: Entry) -> bool:
    if entry.kind == MODULE:
        return not entry.extra.get("local") and _plain_module(str(entry.extra.get("module", "")))
    if entry.kind in (VALUE, UNSERIALIZABLE):
        kind = str(entry.extra.get("type", ""))
        return bool(kind) and _plain_type(kind)
    return True


def may_need_client(plan: CellPlan, entries: Mapping[str, Entry], namespace: dict[str, Any]) -> bool:
    """False only when the cell provably cannot reach Dask (see the module docstring)."""
    effects = plan.effects
    if effects is None or effects.dynamic or effects.syntax_error:
        return True
    if any(not _plain_module(module) for module in effects.imports):
        return True
    for name in plan.reads:
        if dict.__contains__(namespace, name):
            if not _plain_value(dict.__getitem__(namespace, name)):
                return True
        elif isinstance(namespace, LazyNamespace) and namespace.is_pending(name):
            entry = entries.get(name)
            if entry is None or not _plain_entry(entry):
                return True
    return False
