"""Which globals the notebook's own functions and classes read, followed transitively.

A cell that calls `f()` depends on every global `f` reads, and on the globals of
every notebook function `f` calls, even though none of those names appear in
the cell. Reading them from the compiled code objects (rather than the source)
means the answer reflects the function as it is now defined in the namespace,
including one edited and re-run in a later cell.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from collections.abc import Callable, Iterable, Mapping

# Opcodes that look a name up in the module namespace. LOAD_NAME appears in
# class bodies; LOAD_FROM_DICT_OR_GLOBALS replaces it there from Python 3.12. A
# function that assigns or deletes a global (`global k; k = 3`) depends on its value
# before the call too: when the assignment does not run, or stores the value the
# global already had, that value is what the call leaves.
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS", "STORE_GLOBAL", "DELETE_GLOBAL"})


def is_notebook_object(obj: object) -> bool:
    """True for functions and classes defined in the notebook (module `__main__`)."""
    if not isinstance(obj, (types.FunctionType, type)):
        return False
    return getattr(obj, "__module__", None) == "__main__"


@functools.lru_cache(maxsize=8192)
def _code_global_names(code: types.CodeType) -> frozenset[str]:
    # Keyed by the code object, in memory only; equal code gives equal names.
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_LOADS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_global_names(const)
    return frozenset(str(n) for n in names)


def _code_objects(obj: object, depth: int = 0) -> list[types.CodeType]:
    if depth > 8:
        return []
    if isinstance(obj, types.CodeType):
        return [obj]
    if isinstance(obj, types.FunctionType):
        return [obj.__code__]
    if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
        return _code_objects(obj.__func__, depth + 1)
    if isinstance(obj, property):
        return [c for f in (obj.fget, obj.fset, obj.fdel) if f is not None for c in _code_objects(f, depth + 1)]
    if isinstance(obj, functools.partial):
        return _code_objects(obj.func, depth + 1)
    if isinstance(obj, type):
        return [c for member in vars(obj).values() for c in _code_objects(member, depth + 1)]
    return []


def global_names_of(func: object) -> frozenset[str]:
    """Names a function, lambda, method or class (through its methods) reads as globals
    (or assigns as globals: see `_GLOBAL_LOADS`).

    Nested functions, lambdas and comprehensions are included. Builtins such as
    `len` are reported too, since a notebook may shadow them. Anything without
    Python code (a builtin, a C extension) reads no globals: an empty set.
    """
    names: set[str] = set()
    for code in _code_objects(func):
        names |= _code_global_names(code)
    return frozenset(names)


def _linked_callables(obj: object, is_user: Callable[[object], bool]) -> list[object]:
    """Callables that running `obj` may run too: closures, defaults, wrapped functions, methods."""
    linked: list[object] = []
    if isinstance(obj, types.FunctionType):
        user = is_user(obj)
        for cell in obj.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell (a variable not yet assigned)
                continue
            if callable(content) and (user or is_user(content)):
                linked.append(content)
        if user:
            defaults = [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
            linked.extend(d for d in defaults if callable(d))
    elif isinstance(obj, (types.MethodType, staticmethod, classmethod)):
        linked.append(obj.__func__)
    elif isinstance(obj, property):
        linked.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
    elif isinstance(obj, functools.partial):
        linked.append(obj.func)
        linked.extend(a for a in (*obj.args, *obj.keywords.values()) if callable(a))
    elif isinstance(obj, type):
        if is_user(obj):
            linked.extend(vars(obj).values())
            linked.extend(base for base in obj.__mro__[1:] if is_user(base))
        return linked
    elif is_user(type(obj)):
        # An instance of a notebook class: calling its methods runs the class's code.
        linked.append(type(obj))
    wrapped = inspect.getattr_static(obj, "__wrapped__", None)
    if wrapped is not None and callable(wrapped):
        linked.append(wrapped)
    return linked


_MISSING = object()


def _generator_code(obj: object) -> types.CodeType | None:
    """The code of a suspended generator or coroutine that a notebook function made: it reads
    the notebook's globals each time it is resumed."""
    # The type first: any other object's attributes may be anything (a Delayed makes one up).
    if isinstance(obj, types.GeneratorType):
        frame = obj.gi_frame
    elif isinstance(obj, types.CoroutineType):
        frame = obj.cr_frame
    elif isinstance(obj, types.AsyncGeneratorType):
        frame = obj.ag_frame
    else:
        return None
    if frame is None:
        return None
    return frame.f_code if frame.f_globals.get("__name__") == "__main__" else None


def _walk_value(value: object, is_user_function: Callable[[object], bool], seen: set[int], keep: list[object]) -> set[str]:
    """Globals `value` makes a cell read, without following the names found (see `value_reads`)."""
    found: set[str] = set()
    objects = [value]
    while objects:
        obj = objects.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        keep.append(obj)
        if is_user_function(obj):
            found |= global_names_of(obj)
        else:
            code = _generator_code(obj)
            if code is not None:
                found |= _code_global_names(code)
        objects.extend(_linked_callables(obj, is_user_function))
    return found


def value_reads(value: object, is_user_function: Callable[[object], bool] = is_notebook_object) -> frozenset[str]:
    """The globals `value` itself makes a cell read: those of the notebook functions and
    classes it is or links to (closures, defaults, `__wrapped__`, methods, bases, the class
    of an instance), or of the notebook code a suspended generator resumes, without
    following the names found. A checkpoint records it beside a stored function or a value
    that cannot be stored, so a later `transitive_reads` need not load the value."""
    return frozenset(_walk_value(value, is_user_function, set(), []))


class RecordedReads(Mapping[str, object]):
    """A namespace view for `transitive_reads` that also knows, for names whose value is
    not loaded, what that value reads (`reads_of(name)`, or None to look the value up)."""

    def reads_of(self, name: str) -> frozenset[str] | None:
        return None


def transitive_reads(
    names: Iterable[str],
    namespace: Mapping[str, object],
    is_user_function: Callable[[object], bool] = is_notebook_object,
) -> frozenset[str]:
    """Close a set of read names over the notebook functions and classes they name.

    Every name whose value is a notebook function or class (per
    `is_user_function`), an instance of a notebook class, or a suspended generator
    a notebook function made, contributes the globals its code reads; so do notebook functions reachable from it through
    closures, default arguments, `__wrapped__`, methods and base classes.
    Cycles (two functions calling each other) are fine. Returned names include
    the starting ones and may include names the namespace does not hold
    (builtins, or names not defined yet): absence is also something a cell
    depends on. A `RecordedReads` namespace answers for values it has not loaded.
    """
    result = set(names)
    pending = list(result)
    recorded = namespace.reads_of if isinstance(namespace, RecordedReads) else None
    seen: set[int] = set()  # id() of objects already followed, in memory only
    keep: list[object] = []  # holds them so no id() is reused during the walk
    while pending:
        name = pending.pop()
        known = recorded(name) if recorded is not None else None
        if known is None:
            value = namespace.get(name, _MISSING)
            if value is _MISSING:
                continue
            known = frozenset(_walk_value(value, is_user_function, seen, keep))
        for read in known:
            if read not in result:
                result.add(read)
                pending.append(read)
    return frozenset(result)
