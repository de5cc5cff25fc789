"""Tasks whose function does something besides returning a value, so a cached result would
leave it undone.

A cache hit returns the stored result without running the task. For a task that prints,
logs, warns, draws from a global random generator or changes a global (``log.append(x)``,
``K.n += 1``, ``global total``), a fresh run does that and the repeat would not: the cell's
output, a later cell's value, the RNG state would all differ. Such tasks (and what depends
on them) run uncached, as ``@nbrewind.tasks.impure`` ones do.

Only the notebook's own functions and those of its local modules are read: a library's
functions are taken to return values only (their file reads are `nbrewind.tasks.reads`').
The reading is of bytecode (no source needed: a restored function has none on disk), by
what the code names and where it stores, and errs towards "has effects". Not seen: effects
of a library function the code calls on the notebook's objects (``np.copyto(G, x)``), and
a library function's changes to the task's arguments. A change to an argument counts only
where the argument is an object the graph holds, not another task's result
(`mutated_parameters`): a partition the task edits in place is the graph's, not the notebook's.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from typing import Any

from nbrewind.identity.code import closure_values, code_info
from nbrewind.identity.modules import is_local_module

__all__ = ["mutated_parameters", "side_effect"]

# Global names whose call is an effect: output, and the interpreter's input.
_OUTPUT_NAMES = frozenset({"print", "display", "input", "breakpoint"})
# Modules whose functions act on process-wide state (output, logging, warnings, global RNGs).
_EFFECT_MODULES = frozenset({"logging", "warnings", "random", "numpy.random", "sys", "builtins", "IPython.display"})
# Names in the random modules that make or describe a generator rather than draw from the global one.
_NOT_DRAWS = frozenset({
    "Random", "SystemRandom", "default_rng", "Generator", "RandomState", "SeedSequence", "BitGenerator",
    "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64",
})
# Method names that change their receiver in place.
_MUTATORS = frozenset({
    "append", "extend", "insert", "update", "setdefault", "pop", "popitem", "add", "discard", "remove", "clear",
    "sort", "reverse", "appendleft", "extendleft", "popleft", "rotate", "write", "writelines", "put", "put_nowait",
    "fill", "resize", "itemset", "setflags", "__setitem__", "__delitem__", "__iadd__",
})
_STORES = frozenset({"STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR"})
_ROOTS = frozenset({"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_NAME", "LOAD_FAST"})


def side_effect(fn: object) -> str | None:
    """Why a task calling ``fn`` cannot be cached (what it does besides returning), or None.

    ``fn`` may be a partial or bound method of the notebook's code; anything else is a
    library's and None."""
    for _ in range(8):
        inner = getattr(fn, "func", None) if isinstance(fn, functools.partial) else getattr(fn, "__func__", None)
        if inner is None:
            break
        fn = inner
    if not isinstance(fn, types.FunctionType) or not _own(fn):
        return None
    return _function_effect(fn, 0)


def _own(fn: types.FunctionType) -> bool:
    if fn.__module__ == "__main__":
        return True
    module = sys.modules.get(fn.__module__ or "")
    return module is not None and is_local_module(module)


def _function_effect(fn: types.FunctionType, depth: int) -> str | None:
    code = fn.__code__
    found = _code_effect(code)
    if found is not None:
        return f"{fn.__qualname__} {found}"
    names = fn.__globals__
    free = closure_values(fn)
    chains = code_info(code).chains
    # Warning filters set inside `with warnings.catch_warnings():` are put back when it ends.
    scoped = any(attrs[:1] == ("catch_warnings",) for _, _, attrs in chains)
    for kind, root, attrs in chains:
        value = names.get(root, _MISSING) if kind == "g" else free.get(root, _MISSING) if kind == "d" else sys.modules.get(root, _MISSING)
        reason = _reference_effect(root, value, attrs, scoped)
        if reason is not None:
            return f"{fn.__qualname__} {reason}"
        if isinstance(value, types.ModuleType) and attrs and is_local_module(value):
            value = getattr(value, attrs[0], None)  # mylib.report(x): a local module's function
        if depth < 3 and isinstance(value, types.FunctionType) and value is not fn and _own(value):
            inner = _function_effect(value, depth + 1)  # a helper of the notebook's it calls
            if inner is not None:
                return inner
    for name in _loaded_roots(code) - set(code.co_varnames):
        value = names.get(name, free.get(name, _MISSING))
        if name in _OUTPUT_NAMES and (value is _MISSING or getattr(value, "__module__", None) == "builtins"):
            return f"{fn.__qualname__} calls {name}()"
    local = set(code.co_varnames)
    for name in _mutated_roots(code) - local:
        value = free.get(name, names.get(name, _MISSING))
        if value is not _MISSING and not isinstance(value, (types.ModuleType, types.FunctionType)):
            return f"{fn.__qualname__} changes {name}, which the notebook holds"
    return None


_MISSING = object()


def _reference_effect(root: str, value: Any, attrs: tuple[str, ...], scoped: bool) -> str | None:
    if not attrs:
        return None
    module = value.__name__ if isinstance(value, types.ModuleType) else None
    if module == "numpy" and attrs[0] == "random":
        module, attrs = "numpy.random", attrs[1:]
    if module in _EFFECT_MODULES and attrs:
        if module in ("random", "numpy.random") and attrs[0] in _NOT_DRAWS:
            return None
        if module == "logging" and attrs[0] in ("getLogger", "Logger", "Formatter", "Handler", "LoggerAdapter"):
            return None
        if module == "warnings" and (attrs[0] == "catch_warnings" or scoped and attrs[0] in ("simplefilter", "filterwarnings")):
            return None
        if module == "sys" and attrs[0] not in ("stdout", "stderr", "exit", "setrecursionlimit", "path", "modules"):
            return None
        return f"uses {module}.{attrs[0]}"
    logging = sys.modules.get("logging")
    if logging is not None and isinstance(value, (logging.Logger, logging.LoggerAdapter)):
        return f"logs through {root}"
    if value is not _MISSING and attrs[-1] in _MUTATORS and not isinstance(value, (types.ModuleType, type(None))):
        return f"calls {root}.{'.'.join(attrs)}, changing what the notebook holds"
    return None


@functools.lru_cache(maxsize=4096)
def _code_effect(code: types.CodeType) -> str | None:
    """Effects the code shows on its own: ``global`` or ``nonlocal`` stores (nested code included)."""
    for sub in _codes(code):
        for ins in dis.get_instructions(sub):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                return f"sets the global {ins.argval}"
            if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in sub.co_freevars:
                return f"sets {ins.argval} of an enclosing function"
    return None


@functools.lru_cache(maxsize=4096)
def _loaded_roots(code: types.CodeType) -> frozenset[str]:
    return frozenset(ins.argval for sub in _codes(code) for ins in dis.get_instructions(sub) if ins.opname in _ROOTS)


def mutated_parameters(fn: object) -> frozenset[str]:
    """Parameters of the notebook's function ``fn`` whose object it changes in place
    (``d[k] = v``, ``acc.append(x)``); empty for anything else."""
    if not isinstance(fn, types.FunctionType) or not _own(fn):
        return frozenset()
    code = fn.__code__
    params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return frozenset(p for p in params if p in _mutated_roots(code))


@functools.lru_cache(maxsize=4096)
def _mutated_roots(code: types.CodeType) -> frozenset[str]:
    """Globals and free variables the code stores an attribute or item on (``K.n += 1``,
    ``d[k] = v``, ``G.x.y = v``, ``del G[k]``): the object a store acts on, traced back
    through attribute loads to the name it starts from."""
    out: set[str] = set()
    for sub in _codes(code):
        ins = [i for i in dis.get_instructions(sub) if i.opname != "CACHE"]
        for at, store in enumerate(ins):
            if store.opname in ("LOAD_METHOD", "LOAD_ATTR") and store.argval in _MUTATORS and at and ins[at - 1].opname in _ROOTS:
                out.add(ins[at - 1].argval)  # acc.append(x)
                continue
            if store.opname not in _STORES:
                continue
            item = store.opname.endswith("SUBSCR")
            j = at - 1
            if ins[j].opname == "SWAP":  # an augmented store: the target (and key) were copied before
                while j > 0 and ins[j].opname != "COPY":
                    j -= 1
                while j > 0 and ins[j - 1].opname == "COPY":
                    j -= 1
                j -= 1
            if item:
                if not ins[j].opname.startswith("LOAD_"):
                    continue  # a computed key: not traced
                j -= 1
            while j > 0 and ins[j].opname in ("LOAD_ATTR", "LOAD_METHOD", "BINARY_SUBSCR"):
                j -= 2 if ins[j].opname == "BINARY_SUBSCR" and ins[j - 1].opname.startswith("LOAD_") else 1
            if j >= 0 and ins[j].opname in _ROOTS:
                out.add(ins[j].argval)
    return frozenset(out)


def _codes(code: types.CodeType) -> list[types.CodeType]:
    out, stack = [], [code]
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out
