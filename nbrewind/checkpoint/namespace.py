"""A user namespace whose replayed values load on first use.

IPython uses the user namespace dict as both the cell's locals and the globals
of every function the notebook defines. CPython then looks names up through the
dict's `__getitem__`, which calls `__missing__` on a dict subclass when a key is
absent: that is where a pending (replayed but not yet loaded) value is loaded.

`__missing__` is only defined on the class while some value is pending. A lookup
that misses (every builtin used inside a notebook function) pays for an
exception raised from Python while it is defined; without it the miss is raised
in C. Listing methods (`keys`, iteration, `in`, `len`) include pending names so
`dir()`, `%who`, `globals()` and completion see them; they are not on the hot
path of name lookup.

A pending name the notebook drops (`del`, or a rebinding) leaves its object unmade. When
a co-variable loads later, the group comes back with that object in it, unbound: freed at
once if nothing else holds it, as a plain kernel would have freed it at the drop. An object
in a reference cycle only goes when the cyclic collector runs; a plain kernel's copy went at
the first full collection after the drop (`gc.collect()`), so the namespace watches full
collections while a dropped name's group is pending, and collects the loaded copy if one ran.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

Loader = Callable[[str, Any], dict[str, Any]]
"""Called as loader(name, token); returns the values to bind (the name and its co-variables)."""

_MISSING = object()


class LazyNamespace(dict[str, Any]):
    """A dict that can hold names whose values are still in the store."""

    __slots__ = ("_pending", "_loader", "_loading", "_peeking", "_dropped", "_before_drop", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, Any] = {}
        self._loader: Loader | None = None
        self._loading: set[str] = set()
        self._peeking = False
        # Pending names dropped with `del` -> whether a full collection has run since.
        self._dropped: dict[str, bool] = {}
        self._before_drop: Callable[[str, Any], None] | None = None
        key = id(self)
        _live[key] = weakref.ref(self, functools.partial(_forget_instance, key))

    # -- the session's side -------------------------------------------------

    def set_loader(self, loader: Loader | None) -> None:
        """Install the function that turns a pending token into values."""
        self._loader = loader

    def set_before_drop(self, hook: Callable[[str, Any], None] | None) -> None:
        """Install what runs as `hook(name, token)` when `del` drops a pending name, before it
        goes: the session loads a value whose death the notebook can see (a finalizer)."""
        self._before_drop = hook

    def set_pending(self, name: str, token: Any) -> None:
        """Make `name` pending: drop its current value; it loads from `token` on first use."""
        dict.pop(self, name, None)
        self._pending[name] = token
        self._dropped.pop(name, None)
        _arm()

    def pending(self) -> dict[str, Any]:
        """Pending names and their tokens (a copy)."""
        return {k: v for k, v in self._pending.items() if not dict.__contains__(self, k)}

    def is_pending(self, name: str) -> bool:
        return name in self._pending and not dict.__contains__(self, name)

    @contextlib.contextmanager
    def peeking(self) -> Iterator[None]:
        """While inside, `get` answers `default` for a pending name instead of loading it.

        For IPython's input transformation of a one-line cell: its macro and autocall
        checkers `get` the line's first name only to see whether it is a Macro or an
        IPyAutocall, and loading it there would load (or rebuild, for a Dask client) every
        value a replayed one-line cell starts with."""
        before, self._peeking = self._peeking, True
        try:
            yield
        finally:
            self._peeking = before

    def discard_pending(self, name: str) -> None:
        self._pending.pop(name, None)
        if not self._pending:
            _disarm()

    def save(self) -> tuple[dict[str, Any], dict[str, Any], Loader | None, set[str]]:
        """Everything the namespace holds now (values, pending tokens, loader, the names being
        loaded), for `put_back`. Until then no name counts as being loaded: what runs in the
        meantime is another world, where a name the outer load is making may be loaded too."""
        saved = dict(dict.items(self)), dict(self._pending), self._loader, self._loading
        self._loading = set()
        return saved

    def put_back(self, saved: tuple[dict[str, Any], dict[str, Any], Loader | None, set[str]]) -> None:
        """Make the namespace exactly what `save` returned (the same objects, not copies)."""
        values, pending, loader, loading = saved
        dict.clear(self)
        dict.update(self, values)
        self._pending = dict(pending)
        self._loader = loader
        self._loading = loading
        if self._pending:
            _arm()
        else:
            _disarm()

    def materialize(self, name: str) -> Any:
        """Load `name` (and the co-variables that come with it) now and return its value."""
        __tracebackhide__ = True  # noqa: F841 (IPython leaves this frame out of tracebacks)
        token = self._pending.get(name, _MISSING)
        if token is _MISSING:
            raise KeyError(name)
        if self._loader is None or name in self._loading:
            # Asked for again while its loader runs (which may run code that looks names up,
            # as IPython's prefilter does): not defined yet, and never loaded twice at once.
            raise KeyError(name)
        self._loading.add(name)
        full_collections = _full_collections()
        try:
            values = self._loader(name, token)
        except KeyError:
            self.discard_pending(name)  # the loader gave up on it: from now on it is not defined
            raise
        finally:
            self._loading.discard(name)
        collected_since_drop = False
        for member, value in values.items():
            if member != name and (self._pending.get(member, _MISSING) is _MISSING or dict.__contains__(self, member)):
                # Dropped since the replay made it pending: left unbound (a rebound one's token goes).
                self._pending.pop(member, None)
                collected_since_drop = self._dropped.pop(member, False) or collected_since_drop
                continue
            dict.__setitem__(self, member, value)
            self._pending.pop(member, None)
        self._pending.pop(name, None)
        if not self._pending:
            _disarm()
        if collected_since_drop:
            # A plain kernel's objects went at the full collection after the drop: so do the
            # copies (young unless a full collection ran during the load). Without one, they
            # live on as garbage, as the plain kernel's did.
            del values, value  # the loop ran: both are bound
            gc.collect(2 if _full_collections() != full_collections else 1)
        return dict.__getitem__(self, name)

    def materialize_all(self) -> None:
        for name in list(self._pending):
            if name in self._pending and not dict.__contains__(self, name):
                with contextlib.suppress(KeyError):  # one that cannot be loaded is not defined
                    self.materialize(name)
        self._pending.clear()
        _disarm()

    # -- listing and mutation methods that must know about pending names ----

    def _pending_absent(self) -> list[str]:
        return [k for k in self._pending if not dict.__contains__(self, k)]

    def keys(self) -> Any:
        if not self._pending:
            return dict.keys(self)
        return list(dict.keys(self)) + self._pending_absent()

    def __iter__(self) -> Iterator[str]:
        if not self._pending:
            return dict.__iter__(self)
        return iter(self.keys())

    def __len__(self) -> int:
        return dict.__len__(self) + (len(self._pending_absent()) if self._pending else 0)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (key in self._pending if self._pending else False)

    def get(self, key: str, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if self._pending and key in self._pending and not self._peeking:
            try:
                return self.materialize(key)
            except KeyError:
                return default
        return default

    def items(self) -> Any:
        if self._pending:
            self.materialize_all()
        return dict.items(self)

    def values(self) -> Any:
        if self._pending:
            self.materialize_all()
        return dict.values(self)

    def copy(self) -> dict[str, Any]:
        """A shallow copy that is lazy too: IPython copies the namespace for every line
        magic (to expand `$name`), which must not load every replayed value."""
        duplicate = LazyNamespace(dict.items(self))
        duplicate._loader = self._loader
        for name, token in self.pending().items():
            duplicate.set_pending(name, token)
        return duplicate

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Like dict.update; from another LazyNamespace, pending names stay pending
        (IPython merges the cell's frame locals, which is this namespace, for magics)."""
        if isinstance(other, LazyNamespace):
            dict.update(self, dict.items(other))
            for name, token in other.pending().items():
                if not dict.__contains__(self, name):
                    self.set_pending(name, token)
            if self._loader is None:
                self._loader = other._loader
            other = ()
        dict.update(self, other, **kwargs)

    def __delitem__(self, key: str) -> None:
        hook = self._before_drop
        if hook is not None and self.is_pending(key):
            with contextlib.suppress(KeyError):  # one that cannot be loaded is not defined
                hook(key, self._pending[key])
        self.drop(key)

    def drop(self, key: str) -> None:
        """`del self[key]` without the before-drop hook (a replayed cell's `del`: what its
        drop printed or wrote is in its record)."""
        was_pending = self._pending.pop(key, _MISSING) is not _MISSING
        if was_pending:
            self._dropped.setdefault(key, False)
        if not self._pending:
            _disarm()
        if dict.__contains__(self, key):
            dict.__delitem__(self, key)
        elif not was_pending:
            raise KeyError(key)

    def pop(self, key: str, *default: Any) -> Any:
        if not dict.__contains__(self, key) and self._pending and key in self._pending:
            with contextlib.suppress(KeyError):
                if self._before_drop is not None:
                    self._before_drop(key, self._pending[key])
                if self.is_pending(key):
                    self.materialize(key)
        self._pending.pop(key, None)
        return dict.pop(self, key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if not dict.__contains__(self, key) and self._pending and key in self._pending:
            with contextlib.suppress(KeyError):
                return self.materialize(key)
        return dict.setdefault(self, key, default)

    def clear(self) -> None:
        self._pending.clear()
        self._dropped.clear()
        _disarm()
        dict.clear(self)

    def __repr__(self) -> str:
        return f"<LazyNamespace with {dict.__len__(self)} names and {len(self._pending_absent())} pending>"


def _forget_instance(key: int, _ref: object) -> None:
    _live.pop(key, None)
    _disarm()  # a namespace dropped with names still pending no longer needs the hook


def _missing(self: LazyNamespace, key: str) -> Any:
    __tracebackhide__ = True  # noqa: F841
    if key in self._pending:
        return self.materialize(key)
    raise KeyError(key)


_live: dict[int, weakref.ref[LazyNamespace]] = {}


def _full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def _note_collection(phase: str, info: dict[str, int]) -> None:
    """A gc callback, installed while something is pending: a full collection frees the
    dropped pending names' objects in a plain kernel (see the module docstring)."""
    if phase != "stop" or info["generation"] != 2:
        return
    for ref in list(_live.values()):
        ns = ref()
        if ns is None or not ns._pending:
            continue
        for name in ns._dropped:
            ns._dropped[name] = True
        for name in ns._pending:
            if dict.__contains__(ns, name):  # rebound while pending
                ns._dropped[name] = True


def _arm() -> None:
    # Defined on the class only while something is pending; see the module docstring.
    if "__missing__" not in LazyNamespace.__dict__:
        LazyNamespace.__missing__ = _missing  # type: ignore[attr-defined]
        gc.callbacks.append(_note_collection)


def _disarm() -> None:
    if "__missing__" in LazyNamespace.__dict__ and not any(ns._pending for ns in (r() for r in list(_live.values())) if ns is not None):
        del LazyNamespace.__missing__  # type: ignore[attr-defined]
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(_note_collection)
