"""Whether a value can reach Dask: the proof `clients.may_need_client` is built on.

A value is *plain* when nothing in it can hold a Dask collection, future or client or call
into Dask: numbers and strings, modules and values of the standard library and of numpy,
pandas, matplotlib and scipy, notebook functions (whose own global reads a cell's reads
already include), and builtin containers whose items are all plain (looked into up to a
budget of objects; past it, a container counts as not plain).
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["holds_only_plain", "plain_module", "plain_type", "plain_value"]

_NEVER_DASK = frozenset(sys.stdlib_module_names) | {"numpy", "pandas", "matplotlib", "scipy", "PIL", "IPython"}
"""Top-level packages whose code never calls into Dask, whose values hold no Dask objects."""

_PARTS_WITH_DASK = frozenset({"concurrent"})
"""Standard-library packages a Dask object can hide behind (a distributed Future is a concurrent one)."""


def plain_module(name: str) -> bool:
    top = name.partition(".")[0]
    return top in _NEVER_DASK and top not in _PARTS_WITH_DASK and top != "__main__"


_ATOMS = frozenset({"int", "float", "complex", "bool", "str", "bytes", "bytearray", "NoneType", "range", "slice", "function", "type"})
"""Builtin types that hold no other objects (a list or dict may hold a Dask collection)."""

_CONTAINER_MODULES = frozenset({"builtins", "collections", "types", "weakref", "queue", "array"})


def plain_type(qualified: str) -> bool:
    """`module.qualname` of a value's type: plain if its module never reaches Dask and it
    is not a container that could hold a Dask object."""
    module, _, name = qualified.rpartition(".")
    module = module or "builtins"
    if module in _CONTAINER_MODULES:
        return module == "builtins" and name in _ATOMS
    return plain_module(module)


def plain_value(value: Any) -> bool:
    if isinstance(value, types.ModuleType):
        return plain_module(value.__name__)
    if isinstance(value, types.FunctionType):
        # A notebook function's own global reads are already among the cell's reads
        # (transitive reads); one from a module is as plain as its module.
        module = getattr(value, "__module__", None) or "__main__"
        return module == "__main__" or plain_module(module)
    if isinstance(value, type):
        return plain_module(value.__module__)
    kind = type(value)
    if kind in _WALKED:
        return holds_only_plain(value)
    return plain_type(f"{kind.__module__}.{kind.__qualname__}")


_WALKED = (list, tuple, dict, set, frozenset)
_BUDGET = 2000


def holds_only_plain(value: Any, budget: int = _BUDGET) -> bool:
    """Whether a builtin container holds only plain items, looking at no more than `budget`
    objects (beyond that: False)."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if len(seen) > budget:
            return False
        kind = type(obj)
        if kind is dict:
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif kind in _WALKED:
            stack.extend(obj)
        elif not plain_value(obj):
            return False
    return True


