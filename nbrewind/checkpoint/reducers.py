"""Reductions that make a restore exact where pickle's defaults are not.

Several kinds of value come back from a plain (cloud)pickle as something subtly
different from what the notebook had, and each is fixed here by a reduction
that :mod:`nbrewind.checkpoint.serialize`'s pickler returns from
``reducer_override``:

* numpy views.  numpy pickles every array as its own bytes, so ``v = a[2:5]``
  comes back as a copy and ``v[0] = 5`` no longer changes ``a``.
  :class:`ArrayViews` finds, per pickle, the memory roots that several arrays
  of the pickle share and reduces each such array to (root, byte offset,
  shape, strides, dtype): the root is stored once and the views are rebuilt
  on it.
* classes pickled by value.  cloudpickle sorts a class's ``__dict__`` (for
  deterministic pickles), so ``list(vars(C))`` comes back sorted.
  :func:`ordered_class_reduce` keeps the definition order, which is just as
  deterministic.
* weak references.  pickle refuses ``weakref.ref``, and ``weakref.proxy``
  pickles "fine" as a strong copy of its referent, a silent lie.
  :func:`reduce_weakref` rebuilds a reference to the referent restored in the
  same pickle, weak containers are rebuilt from their live items, and
  proxies are refused (:class:`Unrestorable`).
* views into a container.  cloudpickle rebuilds ``ks = d.keys()`` (and
  ``types.MappingProxyType(d)``) over a copy, and pickle turns an iterator over a
  dict or set into a list iterator over a copy of what is left, so a later change
  to ``d`` no longer shows through them.  :data:`SHARING_REDUCERS` rebuild each
  over the container restored in the same pickle.
* instances of notebook classes with their own pickling hooks (``__getstate__``
  dropping a cache, ``__reduce__``) are stored whole by
  :mod:`nbrewind.checkpoint.own_state`.

numpy is never imported here: only values the notebook already made can be
numpy arrays, so the module is looked up in ``sys.modules`` when needed.
"""

from __future__ import annotations

import collections
import gc
import itertools
import operator
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = [
    "ArrayViews",
    "SHARING_REDUCERS",
    "Unrestorable",
    "WEAK_REDUCERS",
    "ordered_class_reduce",
    "reduce_weakref",
    "type_made_keys",
]


class Unrestorable(Exception):
    """Raised while pickling a value whose bytes would restore as something else.

    The serializer turns it into an ``Unserializable`` record with ``reason``.
    """

    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(reason)
        self.type_name = type_name
        self.reason = reason


# -- numpy views -----------------------------------------------------------------------


def array_root(array: Any, ndarray: type) -> Any:
    """The last ndarray on ``array``'s ``.base`` chain: the array whose memory it views.

    numpy already collapses most chains (a view of a view has the owner as its
    base), but not all (across subclasses, or arrays made over a foreign buffer),
    so the chain is followed to its end.
    """
    root: Any = array
    base: Any = array.base
    while True:
        if isinstance(base, ndarray):
            root = base
        elif not isinstance(getattr(base, "base", None), ndarray):
            return root
        # An interface object between two arrays (`as_strided`'s, under
        # `sliding_window_view`) is stepped through to the array it exposes.
        base = getattr(base, "base", None)


def _covers(array: Any, root: Any) -> bool:
    """Whether ``array`` spans all of ``root``'s bytes (is it, or a full reshape/view of it)."""
    if array is root:
        return True
    flags = array.flags
    return bool(array.nbytes == root.nbytes and (flags.c_contiguous or flags.f_contiguous))


class ArrayViews:
    """Which arrays of one pickle to store as views of a root stored beside them.

    Used in two passes.  While ``shared`` is None it only records the root of
    every array pickled (:meth:`reduce` returns ``NotImplemented``: pickle as
    usual).  :meth:`finish` then picks the roots that at least two arrays of
    the pickle share and that the pickle holds in full (the root itself, or
    an array covering all its bytes, like ``a`` in ``a = np.arange(24).reshape(4, 6)``).
    In the second pass every array on such a root is reduced to a view of it.

    A view whose root is not held in full, say ``v = big[:10]`` without
    ``big``, is pickled as a copy, as before: storing all of ``big`` to keep
    the sharing exact could cost far more than the view, so sharing between
    two such partial views is lost on restore.  Object arrays, subclasses with
    a pickling of their own (masked arrays, memmaps) and views that cannot be
    expressed over the root's buffer are copies too.
    """

    def __init__(self) -> None:
        numpy = sys.modules.get("numpy")  # never imported here: only if the notebook did
        self.ndarray: type | None = getattr(numpy, "ndarray", None)
        self._memmap: type | None = getattr(numpy, "memmap", None)
        self._kinds: dict[type, bool] = {}
        # id(root) -> [root, number of arrays on it, covered?, the arrays (kept alive
        # so that no id is reused by a temporary while the pass runs)]
        self._seen: dict[int, list[Any]] = {}
        self.shared: dict[int, Any] | None = None

    def handles(self, kind: type) -> bool:
        """Whether arrays of type ``kind`` are stored as views when they share a root: the
        exact ndarray, and subclasses that pickle as numpy pickles an ndarray
        (``np.matrix``, ``np.recarray``; not ``np.memmap``, whose file is its memory)."""
        known = self._kinds.get(kind)
        if known is None:
            ndarray = self.ndarray
            known = self._kinds[kind] = kind is ndarray or (
                ndarray is not None
                and issubclass(kind, ndarray)
                and not (self._memmap is not None and issubclass(kind, self._memmap))
                and all(getattr(kind, name) is getattr(ndarray, name) for name in ("__reduce__", "__reduce_ex__"))
            )
        return known

    def reduce(self, array: Any) -> Any:
        """A reduction for ``array`` (of a type it :meth:`handles`), or ``NotImplemented``."""
        assert self.ndarray is not None
        root = array_root(array, self.ndarray)
        if self.shared is None:
            entry = self._seen.get(id(root))
            if entry is None:
                entry = self._seen[id(root)] = [root, 0, False, []]
            entry[1] += 1
            entry[2] = entry[2] or _covers(array, root)
            entry[3].append(array)
            return NotImplemented
        if id(root) not in self.shared:
            return NotImplemented
        if array is root:
            return NotImplemented  # pickled as numpy does; the load makes it own its memory
        reduced = reduce_view(array, root)
        return NotImplemented if reduced is None else reduced

    def finish(self) -> bool:
        """End the recording pass; True if a second pass must store some arrays as views."""
        seen, self._seen = self._seen, {}
        self.shared = {
            key: entry[0]
            for key, entry in seen.items()
            if entry[1] >= 2 and entry[2] and self.handles(type(entry[0]))
        }
        return bool(self.shared)


def reduce_view(array: Any, root: Any) -> tuple[Any, ...] | None:
    """``array`` as a view of ``root``: (rebuild, (root, offset, shape, strides, dtype, writeable)).

    None when the view cannot be rebuilt over the root's buffer (object dtype,
    a subclass, bytes outside the root), so the caller pickles a copy.
    Negative and zero strides (``a[::-1]``, ``broadcast_to``) are fine.
    """
    if array.dtype.hasobject or root.dtype.hasobject:
        return None
    if not (root.flags.c_contiguous or root.flags.f_contiguous):
        return None
    offset = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    low = high = offset
    for size, stride in zip(array.shape, array.strides):
        if size == 0:
            low = high = offset = 0  # an empty view holds no bytes: any offset will do
            break
        span = (size - 1) * stride
        low, high = (low + span, high) if span < 0 else (low, high + span)
    if low < 0 or high + (array.itemsize if array.size else 0) > root.nbytes:
        return None
    view: tuple[Any, ...] = (root, offset, array.shape, array.strides, array.dtype, bool(array.flags.writeable))
    if type(array) is not sys.modules["numpy"].ndarray:  # a subclass: rebuilt as one
        return _rebuild_subclass_view, (type(array), *view)
    return _rebuild_view, view


def _owning_copy(array: Any) -> Any:
    # Named by checkpoints written before loads made every array own its memory.
    return array


def _rebuild_view(root: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, writeable: bool) -> Any:
    import numpy

    return _rebuild_subclass_view(numpy.ndarray, root, offset, shape, strides, dtype, writeable)


def _rebuild_subclass_view(
    kind: type, root: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, writeable: bool
) -> Any:
    import numpy

    buffer = root if root.flags.c_contiguous else numpy.ndarray.ravel(root, order="K")  # F order: same bytes, 1-D
    view: Any = numpy.ndarray.__new__(kind, shape, dtype=dtype, buffer=buffer, offset=offset, strides=strides)
    if not writeable and view.flags.writeable:
        view.flags.writeable = False
    return view


# -- weak references -------------------------------------------------------------------


class _Gone:
    """A weakly referenceable object that dies at once: the referent of a dead weakref."""


def _dead_weakref() -> weakref.ref[Any]:
    ref = weakref.ref(_Gone())  # CPython frees the instance here, so the reference is dead
    return ref


def reduce_weakref(ref: weakref.ref[Any]) -> tuple[Any, ...]:
    """A ``weakref.ref`` as a reduce to ``weakref.ref(referent)``.

    Pickled with its group, the referent is restored (once, by the memo) with
    the other co-variables, so ``r() is obj`` holds after the load as long as
    the group also holds ``obj``; a referent that only the weak reference
    reaches dies right after the load, as it would have in the notebook had
    nothing else held it.  A dead reference restores dead.  Callbacks are not
    kept: they are usually bound methods of library internals that mean
    nothing in another session, and a restored reference has none.
    """
    referent = ref()
    if referent is None:
        return (_dead_weakref, ())
    return (weakref.ref, (referent,))


def _rebuild_weak_mapping(kind: type, items: list[tuple[Any, Any]]) -> Any:
    mapping = kind()
    for key, value in items:
        mapping[key] = value
    return mapping


def _reduce_weak_mapping(mapping: Any) -> tuple[Any, ...]:
    """A WeakValueDictionary or WeakKeyDictionary as its live items, re-inserted on load."""
    return (_rebuild_weak_mapping, (type(mapping), list(mapping.items())))


def _refuse_proxy(proxy: Any) -> Any:
    raise Unrestorable(
        f"weakref.{type(proxy).__name__}",
        "a weakref.proxy cannot be pickled faithfully (pickle would store a strong copy of its referent)",
    )


def _refuse_finalizer(finalizer: Any) -> Any:
    raise Unrestorable(
        "weakref.finalize",
        "a finalizer is a registration with this interpreter (pickle would restore a dead one)",
    )


WEAK_REDUCERS: dict[type, Callable[[Any], Any]] = {
    weakref.ReferenceType: reduce_weakref,
    weakref.WeakValueDictionary: _reduce_weak_mapping,
    weakref.WeakKeyDictionary: _reduce_weak_mapping,
    weakref.ProxyType: _refuse_proxy,
    weakref.CallableProxyType: _refuse_proxy,
    weakref.finalize: _refuse_finalizer,
}
"""Reducers by exact type (subclasses such as ``WeakMethod`` and ``KeyedRef``
keep pickle's refusal, which makes them Unserializable); ``WeakSet`` is
already reduced to its items by cloudpickle."""


# -- views and iterators over a container ------------------------------------------------


def _view(mapping: Any, method: str) -> Any:
    return getattr(mapping, method)()


def _mapping_proxy(mapping: Any) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(mapping)


def _advanced(iterator: Any, consumed: int) -> Any:
    for _ in itertools.islice(iterator, consumed):
        pass
    return iterator


def _iterate(container: Any, how: str, consumed: int) -> Any:
    if how == "set":
        made = iter(container)
    elif how.startswith("reversed-"):
        made = reversed(getattr(container, how.removeprefix("reversed-"))())
    else:
        made = iter(getattr(container, how)())
    return _advanced(made, consumed)


def _container_of(obj: object) -> Any:
    """The one object a view or iterator over a container refers to (None once an
    iterator is exhausted, when it lets go of its container)."""
    held = [r for r in gc.get_referents(obj) if type(r) is not tuple]  # an items iterator's reused result
    return held[0] if len(held) == 1 else None


def _reduce_view(view: Any) -> tuple[Any, ...]:
    """A dict view (``d.keys()``, ``od.items()``...) as a reduce to the same call on its
    dict: pickled with its group, the dict is restored once (by the memo) and the view
    is a view of it again, where cloudpickle would rebuild it over a copy of the keys."""
    return (_view, (_container_of(view), _VIEW_METHODS[type(view)]))


def _reduce_mapping_proxy(proxy: Any) -> tuple[Any, ...]:
    """A ``types.MappingProxyType`` over the mapping restored with its group (cloudpickle
    would wrap a copy)."""
    return (_mapping_proxy, (_container_of(proxy),))


def _reduce_iterator(iterator: Any) -> Any:
    """An iterator over a dict or set as a new iterator over the restored container,
    advanced as far as this one was (pickle would make it a list iterator over a copy
    of what is left)."""
    how = _ITERATORS[type(iterator)]
    container = _container_of(iterator)
    if container is None:  # exhausted: an exhausted iterator of the same type
        return (_iterate, (set() if how == "set" else {}, how, 0))
    consumed = len(container) - operator.length_hint(iterator)
    return (_iterate, (container, how, consumed))


def _reduce_list_reversed(iterator: Any) -> Any:
    """An exhausted ``reversed(lst)`` as one (pickle would make it a list iterator); a live
    one already pickles as a reduce over its list."""
    return (reversed, ([],)) if _container_of(iterator) is None else NotImplemented


_EMPTY_MAPPINGS: tuple[dict[Any, Any], ...] = ({}, collections.OrderedDict())
_VIEW_METHODS: dict[type, str] = {
    type(getattr(mapping, method)()): method for mapping in _EMPTY_MAPPINGS for method in ("keys", "values", "items")
}
_ITERATORS: dict[type, str] = {
    type(iter({}.keys())): "keys",
    type(iter({}.values())): "values",
    type(iter({}.items())): "items",
    type(reversed({}.keys())): "reversed-keys",
    type(reversed({}.values())): "reversed-values",
    type(reversed({}.items())): "reversed-items",
    type(iter(set())): "set",
}

SHARING_REDUCERS: dict[type, Callable[[Any], Any]] = {
    **dict.fromkeys(_VIEW_METHODS, _reduce_view),
    types.MappingProxyType: _reduce_mapping_proxy,
    **dict.fromkeys(_ITERATORS, _reduce_iterator),
    type(reversed([])): _reduce_list_reversed,
}
"""Reducers by exact type for objects that see into a container another name may hold.
Iterators over lists, tuples and deques, ``enumerate``, ``zip``, ``map`` and the like
already pickle as a reduce over their container or iterator, which the memo shares."""


# -- classes pickled by value ----------------------------------------------------------

# Entries cloudpickle leaves out of a class's state on purpose: descriptors and
# caches the type machinery makes by itself.
_NOT_STATE = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__annotate_func__",
        "_abc_impl",
        "_abc_cache",
        "_abc_negative_cache",
        "_abc_negative_cache_version",
        "_abc_registry",
    }
)


def ordered_class_reduce(cls: type, reduced: Any) -> Any:
    """cloudpickle's by-value reduction of ``cls``, rewritten to keep ``vars(cls)``'s order.

    cloudpickle builds an empty skeleton class, then sets the attributes of a
    *sorted* copy of the class dict.  Definition order is observable
    (``list(vars(C))``, ``dataclasses.fields`` built on it, enum-like
    registries), so here the state keeps the class's own order, and the
    skeleton is created with the class body's keys already in place (``None``
    placeholders, overwritten by the state; ``__slots__`` with its real
    value, which also restores slot descriptors cloudpickle would drop).  The
    type machinery then appends ``__dict__``, ``__weakref__``, slot
    descriptors, a default ``__doc__`` and ``__hash__`` exactly where it did
    for the original class, and attributes set after the class statement
    follow in their order.  Both orders are fixed by the code, so equal
    classes still pickle equal.

    The class body's keys are those before the first descriptor the type
    made; with none (a subclass of a class that already has ``__dict__``),
    all keys.  Attributes cloudpickle drops because they are the very object
    a base class has (``f = Base.f``) are kept, so ``vars`` is complete.

    A reduction that is not cloudpickle's class skeleton (an enum, a class
    pickled by reference) is returned unchanged.  Placeholders are visible to a
    base class's ``__init_subclass__`` during the load (as ``None`` where
    cloudpickle's skeleton would show the inherited value).
    """
    if not (isinstance(reduced, tuple) and len(reduced) == 6):
        return reduced
    make, newargs, state, listitems, dictitems, setstate = reduced
    if make is not cloudpickle.cloudpickle._make_skeleton_class:
        return reduced
    clsdict, slotstate = state
    own = cls.__dict__
    made = type_made_keys(cls)
    for key in own:
        if key not in clsdict and key not in made and key not in _NOT_STATE:
            clsdict["".join(key)] = own[key]  # a non-interned copy, as cloudpickle does
    position = {key: index for index, key in enumerate(own)}
    ordered = dict(sorted(clsdict.items(), key=lambda item: position.get(item[0], len(position))))
    keys = list(own)
    first_made = next((index for index, key in enumerate(keys) if key in made), len(keys))
    type_constructor, name, bases, type_kwargs, tracker_id, extra = newargs
    body: dict[str, Any] = {}
    for key in keys[:first_made]:
        if key in type_kwargs:
            body[key] = type_kwargs[key]
        elif key == "__slots__":
            body[key] = own[key]
        elif key in ordered:
            body[key] = None
    body.update((key, value) for key, value in type_kwargs.items() if key not in body)
    return (
        make,
        (type_constructor, name, bases, body, tracker_id, extra),
        (ordered, slotstate),
        listitems,
        dictitems,
        setstate,
    )


def type_made_keys(cls: type) -> set[str]:
    """Keys of ``cls.__dict__`` holding descriptors the type made (``__dict__``, ``__weakref__``, slots)."""
    made = set()
    for key, value in cls.__dict__.items():
        kind = type(value)
        if kind.__name__ in ("getset_descriptor", "member_descriptor") and getattr(value, "__objclass__", None) is cls:
            made.add(key)
    return made
