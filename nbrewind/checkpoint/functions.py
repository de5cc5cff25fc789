"""How the notebook's own functions and classes are pickled: by code, defaults,
closure and attributes, never their globals (a restored function must see the
kernel's namespace, not a snapshot of it); and their digest-only stand-ins, which
name code the way `nbrewind.identity.code` does.

Checkpoints written before this module existed name `_function_skeleton`,
`_set_function_state` and `_EmptyCell` under `nbrewind.checkpoint.serialize`,
which re-exports them.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from nbrewind.checkpoint.reducers import type_made_keys
from nbrewind.identity.code import code_digest, line_digest


class _EmptyCell:
    """Marks a closure cell that had no value when the function was pickled."""


_target_globals: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nbrewind_target_globals", default=None
)


@contextlib.contextmanager
def restoring_into(namespace: dict[str, Any]) -> Iterator[None]:
    """Notebook functions unpickled inside this block use ``namespace`` as their globals."""
    token = _target_globals.set(namespace)
    try:
        yield
    finally:
        _target_globals.reset(token)


def reduce_notebook_function(func: types.FunctionType, for_digest: bool) -> Any:
    cells = func.__closure__ or ()
    state = {
        "name": func.__name__,
        "qualname": func.__qualname__,
        "defaults": func.__defaults__,
        "kwdefaults": func.__kwdefaults__,
        "doc": func.__doc__,
        "annotations": func.__annotations__ or None,
        "dict": func.__dict__ or None,
        "closure": tuple(_cell_value(cell) for cell in cells),
    }
    if for_digest:
        # The code as nbrewind.identity.code defines it, plus its line layout (a replayed
        # traceback shows lines); names copied so the memo links them to nothing.
        state["name"], state["qualname"] = _fresh(func.__name__), _fresh(func.__qualname__)
        code = func.__code__
        return (_no_restore, (code_digest(code), line_digest(code), len(cells)), state, None, None, None)
    # The code's file goes apart: cloudpickle writes every code object's as "<dynamic-code>".
    args = (func.__code__, func.__name__, len(cells), func.__code__.co_filename)
    return (_function_skeleton, args, state, None, None, _set_function_state)


def _fresh(name: str) -> str:
    """A new string object for ``name``, for digest-only reductions.

    The pickle memo links equal-by-identity strings, and whether a function's
    name is the very object of a class-dict key or a code object's name depends
    on interning (a restored class differs from a freshly defined one).  A
    fresh object is linked to nothing, so the digest does not depend on that.
    """
    return "@" + name


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EmptyCell


_CELL_FILES: dict[str, str] = {}
"""A cell's name-independent key (`_cell_key`) -> the file name this kernel gave that cell."""
_unnamed: list[weakref.WeakMethod[Callable[[], None]]] = []
"""Methods naming cells that were replayed but not yet named (`name_cells_later`), held
weakly: a closed session's are dropped."""


def name_cells_later(name_them: Callable[[], None]) -> None:
    """Call the bound method `name_them` (which calls `note_cell_file`) before the next
    restored function needs a cell's name: naming a cell hashes its source (0.3 ms for
    1.5 KB in ipykernel), which a replay that restores no function need not pay."""
    if not any(ref() == name_them for ref in _unnamed):
        _unnamed.append(weakref.WeakMethod(name_them))


def _name_cells() -> None:
    for ref in _unnamed[:]:
        name_them = ref()
        if name_them is None:
            _unnamed.remove(ref)
        else:
            name_them()


def note_cell_file(filename: str) -> None:
    """This kernel knows a cell under `filename` (it ran or replayed it; its source is in
    linecache): notebook functions restored from that cell get it as their code's file,
    so a traceback through them shows "Cell In[n]" and the source lines, as a fresh run's."""
    _CELL_FILES[_cell_key(filename)] = filename


def _cell_key(filename: str) -> str:
    # ipykernel names a cell /tmp/ipykernel_<pid>/<hash of the source>.py; a plain IPython
    # shell <ipython-input-<count>-<hash>>. The hash names the cell in any process.
    base = filename.rsplit("/", 1)[-1]
    if base.startswith("<ipython-input-") and base.endswith(">"):
        return base[:-1].rsplit("-", 1)[-1]
    return base


def _relocated(code: types.CodeType, filename: str) -> types.CodeType:
    if code.co_filename == filename:
        return code
    consts = tuple(_relocated(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _function_skeleton(code: types.CodeType, name: str, ncells: int, filename: str | None = None) -> types.FunctionType:
    if filename:
        key = _cell_key(filename)
        if key not in _CELL_FILES and _unnamed:
            _name_cells()
        code = _relocated(code, _CELL_FILES.get(key, filename))
    target = _target_globals.get()
    if target is None:
        import builtins

        target = {"__name__": "__main__", "__builtins__": builtins}
    closure = tuple(types.CellType() for _ in range(ncells)) if ncells else None
    return types.FunctionType(code, target, name, None, closure)


def _set_function_state(func: types.FunctionType, state: dict[str, Any]) -> types.FunctionType:
    func.__qualname__ = state["qualname"]
    func.__defaults__ = state["defaults"]
    func.__kwdefaults__ = state["kwdefaults"]
    func.__doc__ = state["doc"]
    func.__module__ = "__main__"
    if state["annotations"]:
        func.__annotations__ = state["annotations"]
    if state["dict"]:
        func.__dict__.update(state["dict"])
    for cell, value in zip(func.__closure__ or (), state["closure"]):
        if value is not _EmptyCell:
            cell.cell_contents = value
    return func


# Class entries left out of a class's digest, besides the descriptors the type
# makes (``__slots__`` describes those): caches that pickling or isinstance
# checks add (copyreg's __slotnames__).
_CLASS_DIGEST_SKIP = frozenset(
    {"__dict__", "__weakref__", "__module__", "__slotnames__", "_abc_impl", "_abc_cache", "_abc_negative_cache"}
)


def digest_class(cls: type) -> Any:
    """A deterministic stand-in for a notebook class, used only for digests.

    Members are listed in definition order, which a restore reproduces, so a
    class whose attributes were reordered looks changed.  Names are copied
    out of the interned originals, as cloudpickle does, so the pickle memo
    links them to nothing else and the stream does not depend on interning.
    """
    made = type_made_keys(cls)  # a slot descriptor would pickle as a lookup on cls: a loop
    members = [(_fresh(k), v) for k, v in vars(cls).items() if k not in _CLASS_DIGEST_SKIP and k not in made]
    return (_no_restore, (_fresh(cls.__qualname__), cls.__bases__, members))


def _no_restore(*args: Any) -> None:
    raise TypeError("a digest-only reduction cannot be unpickled")
