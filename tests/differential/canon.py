"""A canonical, comparable picture of a notebook namespace.

`canonical_namespace(ns)` turns the user's names into nested tuples of plain
values, so two namespaces from different shells or processes compare with `==`:

- atoms (None, bool, int, float, complex, str, bytes) by type and repr;
- numpy arrays by dtype, shape, bytes and writeability; numpy scalars by dtype and repr;
- numpy Generators and `random.Random` instances by their full state;
- functions by code (bytecode, constants, names), defaults, closure contents,
  and whether their globals are the notebook namespace itself;
- pandas frames, series and indexes by index, columns, dtypes, values and attrs;
- modules by name; other objects by type and `__dict__` (or repr);
- containers recursively. Every non-atomic object gets a number the first time
  it is met (walking names in sorted order); meeting it again yields
  `("ref", n)`. So every aliasing relation, between names (`b is a`) and inside
  containers (a list held by a dict and by a name), is part of the picture.

The module is also imported by the probe cell the real-kernel tier appends to
N', so it must import nothing outside the standard library at module level.
"""

from __future__ import annotations

import json
import random
import re
import sys
import types
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["canonical_namespace", "dump", "user_names"]

IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def user_names(names: Iterable[str]) -> list[str]:
    """The user's names among `names`: no underscore names, no IPython bookkeeping."""
    return sorted(n for n in names if not n.startswith("_") and n not in IPYTHON_NAMES)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")

class _Walker:
    """Walks values, numbering non-atomic objects on first sight."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.namespace = namespace
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps walked objects alive so ids stay unique

    def canon(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, _ATOMS):
            return ("atom", type(value).__name__, repr(value))
        if depth > 40:
            return ("deep", type(value).__qualname__)
        key = id(value)
        if key in self.seen:
            return ("ref", self.seen[key])
        self.seen[key] = len(self.seen)
        self.keep.append(value)
        return (self.seen[key], self._body(value, depth + 1))

    def _body(self, value: Any, depth: int) -> Any:
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if isinstance(value, numpy.ndarray):
                if value.dtype.kind == "O":  # the bytes are pointers: what they point at, through the identity map
                    items = tuple(self.canon(v, depth) for v in value.flat)
                    return ("ndarray", value.dtype.str, value.shape, items, bool(value.flags.writeable))
                return ("ndarray", value.dtype.str, value.shape, value.tobytes().hex(), bool(value.flags.writeable))
            if isinstance(value, numpy.generic):
                return ("npscalar", value.dtype.str, repr(value))
            if isinstance(value, numpy.random.Generator):
                return ("np.Generator", self.canon(value.bit_generator.state, depth))
        pandas = sys.modules.get("pandas")
        if pandas is not None and isinstance(value, (pandas.DataFrame, pandas.Series, pandas.Index)):
            # By what it holds: the order of a frame's internal attributes differs after a pickle
            # round trip (`_typ` appears), which no cell can see through the pandas API.
            return self._pandas(value, depth)
        if isinstance(value, random.Random):
            return ("random.Random", type(value).__qualname__, self.canon(value.getstate(), depth))
        if isinstance(value, list):
            return ("list", tuple(self.canon(v, depth) for v in value))
        if isinstance(value, tuple):
            return ("tuple", type(value).__qualname__, tuple(self.canon(v, depth) for v in value))
        if isinstance(value, dict):
            return ("dict", type(value).__qualname__, tuple((self.canon(k, depth), self.canon(v, depth)) for k, v in value.items()))
        if isinstance(value, (set, frozenset)):
            items = sorted((self.canon(v, depth) for v in value), key=repr)
            return (type(value).__name__, tuple(items))
        if isinstance(value, weakref.ref):
            # What it points at, through the identity map: `r() is obj` shows as a shared reference.
            target = value()
            return (type(value).__qualname__, None if target is None else self.canon(target, depth))
        if isinstance(value, bytearray):
            return ("bytearray", bytes(value).hex())
        if isinstance(value, types.ModuleType):
            return ("module", value.__name__)
        if isinstance(value, types.FunctionType):
            return self._function(value, depth)
        if isinstance(value, type):
            return ("type", value.__module__, value.__qualname__)
        if hasattr(value, "__dict__") and not callable(value):
            return ("object", type(value).__qualname__, self.canon(dict(vars(value)), depth))
        return ("other", type(value).__qualname__, _ADDRESS.sub("0x?", repr(value)))

    def _pandas(self, value: Any, depth: int) -> Any:
        pandas = sys.modules["pandas"]
        kind = type(value).__qualname__
        if isinstance(value, pandas.Index):
            return ("pandas", kind, str(value.dtype), repr(value.tolist()), repr(value.name))
        index = self._pandas(value.index, depth)
        attrs = self.canon(dict(value.attrs), depth)
        data = repr(value.to_numpy().tolist())
        if isinstance(value, pandas.DataFrame):
            return ("pandas", kind, index, repr(value.columns.tolist()), tuple(str(t) for t in value.dtypes), data, attrs)
        return ("pandas", kind, index, str(value.dtype), data, repr(value.name), attrs)

    def _function(self, fn: types.FunctionType, depth: int) -> Any:
        closure = tuple(self._cell(cell, depth) for cell in (fn.__closure__ or ()))
        return (
            "function",
            fn.__qualname__,
            _code(fn.__code__),
            self.canon(fn.__defaults__, depth),
            self.canon(fn.__kwdefaults__, depth),
            closure,
            # A restored function must read and write the notebook's globals, not a copy.
            "globals=namespace" if fn.__globals__ is self.namespace else "globals=other",
        )


    def _cell(self, cell: types.CellType, depth: int) -> Any:
        try:
            return self.canon(cell.cell_contents, depth)
        except ValueError:  # an empty cell
            return ("empty-cell",)


def _code(code: types.CodeType) -> Any:
    consts = tuple(_code(c) if isinstance(c, types.CodeType) else ("const", type(c).__name__, repr(c)) for c in code.co_consts)
    return ("code", code.co_name, code.co_code.hex(), consts, code.co_names, code.co_varnames, code.co_freevars)


def canonical_namespace(namespace: Mapping[str, Any], names: Iterable[str] | None = None) -> tuple[Any, ...]:
    """The canonical picture of `namespace` restricted to the user's names.

    Values are fetched with `namespace[name]` so a lazy namespace loads them.
    """
    walker = _Walker(namespace)
    chosen = user_names(namespace.keys() if names is None else names)
    return tuple((name, walker.canon(namespace[name])) for name in chosen)


def dump(namespace: Mapping[str, Any]) -> str:
    """`canonical_namespace` as one JSON line (what the kernel probe cell prints)."""
    return json.dumps(canonical_namespace(namespace))
