"""Which variables share objects (co-variables), found by walking what each value reaches.

After `b = a` or `d = {"x": lst}` two names lead to one object, and a restore
must bring them back as one object, so the checkpoint stores them together.
Deciding that means indexing, per name, the id() of every object its value
reaches. What is *not* indexed matters as much: modules, classes and functions
from libraries, dtypes, singletons, small numbers and strings are shared by
everything, and indexing them would glue unrelated variables into one huge
group (the notebook's `np` merged with a 230 MB array, rewritten on every
cell). Large buffers (numpy arrays, pandas objects) are leaves: their own
identity counts, their insides are never walked, which keeps the index cheap.

ids are in-memory keys only, valid while the namespace holds the objects;
nothing here is ever persisted.
"""

from __future__ import annotations

import collections
import datetime
import enum
import functools
import gc
import itertools
import pathlib
import re
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any, Protocol
from enum import Enum

# Top-level packages whose objects are leaves: indexed by their own identity,
# never walked (their internals are large, or are caches shared by everything).
LEAF_PACKAGES = frozenset({"numpy", "pandas", "pyarrow", "polars", "dask", "distributed", "xarray", "torch", "scipy"})

# Immutable strings and bytes shorter than this are not indexed: identity of an
# immutable value is only observable through `is`, and short ones are shared by
# coincidence (interning, constants of one code object). Longer ones are, so
# that a restore does not duplicate a large buffer two names shared.
MIN_INDEXED_TEXT = 1024

# Elements of a numpy object array never walked: immutable, so sharing one with another
# name changes nothing a cell can see but `is` (strings too, long or not).
_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes})

# Exact types a walk drops before pushing them (their subclasses go through `_classify`).
_NEVER_INDEXED = _ATOMS - {str, bytes}

_NOT_INDEXED_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    type(Ellipsis),
    type(NotImplemented),
    types.ModuleType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.CodeType,
    # Immutable values and singletons: identity carries no meaning, and sharing
    # them (`re.I`, an enum member, a cached compiled pattern) must not glue.
    enum.Enum,
    re.Pattern,
    range,
    slice,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    datetime.tzinfo,
    pathlib.PurePath,
)


class _Kind(Enum):
    SKIP = 0  # neither indexed nor walked
    LEAF = 1  # indexed, not walked
    TEXT = 2  # str / bytes: indexed when large
    SEQUENCE = 3  # list, tuple, set, frozenset, deque: walk the items
    MAPPING = 4  # dict: walk keys and values
    ARRAY = 5  # numpy array: indexed with the root of its .base chain
    FUNCTION = 6
    CLASS = 7
    METHOD = 8  # bound methods, builtin or not: walk __self__
    PARTIAL = 9
    MEMORYVIEW = 10
    OBJECT = 11  # anything else: walk __dict__ and __slots__
    BUILTIN = 12  # builtin function (skipped) or builtin bound method (walk __self__)
    WEAKREF = 13  # weakref.ref (and subclasses): walk the live referent
    HOLDER = 14  # a C object of the standard library that sees into a container: walk what it refers to
    SHARER = 15  # a library leaf whose data other names can share (a DataFrame's blocks): indexed with it
    WRAPPER = 16  # a pandas object around a frame (a groupby, `df.loc`): walk its attributes and its `obj`
    FINALIZER = 17  # weakref.finalize: walk the object its callback waits on


def _is_notebook(obj: object) -> bool:
    return getattr(obj, "__module__", None) == "__main__"


class _Walker:
    """Walks object graphs, reporting the id() of every indexed object to a callback."""

    def __init__(self, max_objects: int, max_depth: int, watch: DeathWatcher | None = None) -> None:
        self.max_objects = max_objects
        self.max_depth = max_depth
        self.truncated = False
        self.finalizes = False
        """Whether `watch` said an instance the walk met finalizes visibly (see `reach`)."""
        self._watch = watch
        self._finalizing: dict[type, bool | None] = {}
        self._kinds: dict[type, _Kind] = {}
        numpy = sys.modules.get("numpy")  # never imported here: only if the notebook did
        self._ndarray: type | None = getattr(numpy, "ndarray", None)
        self._numpy_skip: tuple[type, ...] = tuple(
            t for t in (getattr(numpy, "dtype", None), getattr(numpy, "ufunc", None)) if isinstance(t, type)
        )
        # numpy's and pandas' objects whose data another name can share: a random Generator and
        # its bit generator, `a.flat` and `a`, a frame and `df["x"].to_numpy()` (a view of its block).
        # Submodules are looked up in sys.modules, never as attributes: numpy imports
        # `numpy.random` on first attribute access, which would seed and load its global RNG.
        pandas = sys.modules.get("pandas")
        self._sharers: tuple[type, ...] = tuple(
            t
            for t in (
                getattr(sys.modules.get("numpy.random"), "Generator", None),
                getattr(numpy, "flatiter", None),
                getattr(sys.modules.get("pandas.core.generic"), "NDFrame", None),
            )
            if isinstance(t, type)
        )
        # pandas' data (frames, indexes, arrays, dtypes) are leaves; its other objects (a groupby,
        # a rolling window, `df.loc`, `s.str`) hold a frame and are walked like any object.
        api = sys.modules.get("pandas.api.extensions")
        self._pandas_data: tuple[type, ...] = tuple(
            t
            for t in (getattr(pandas, "Index", None), getattr(api, "ExtensionArray", None), getattr(api, "ExtensionDtype", None))
            if isinstance(t, type)
        )

    def _kind_of_type(self, tp: type) -> _Kind:
        kind = self._kinds.get(tp)
        if kind is None:
            kind = self._classify(tp)
            self._kinds[tp] = kind
        return kind

    def _classify(self, tp: type) -> _Kind:
        if issubclass(tp, _NOT_INDEXED_TYPES) or issubclass(tp, self._numpy_skip):
            return _Kind.SKIP
        if issubclass(tp, type):
            return _Kind.CLASS
        if self._ndarray is not None and issubclass(tp, self._ndarray):
            return _Kind.ARRAY
        if issubclass(tp, (str, bytes)):
            return _Kind.TEXT
        if issubclass(tp, (bytearray, memoryview)):
            return _Kind.MEMORYVIEW if tp is memoryview else _Kind.LEAF
        if self._sharers and issubclass(tp, self._sharers):
            return _Kind.SHARER
        top = str(getattr(tp, "__module__", "")).partition(".")[0]
        if top == "pandas" and not issubclass(tp, self._pandas_data):
            return _Kind.WRAPPER
        if top in LEAF_PACKAGES:
            return _Kind.LEAF
        if issubclass(tp, dict):
            return _Kind.MAPPING
        if issubclass(tp, (list, tuple, set, frozenset, collections.deque)):
            return _Kind.SEQUENCE
        if issubclass(tp, types.FunctionType):
            return _Kind.FUNCTION
        if issubclass(tp, types.MethodType):
            return _Kind.METHOD
        if issubclass(tp, functools.partial):
            return _Kind.PARTIAL
        if issubclass(tp, types.BuiltinFunctionType):
            return _Kind.BUILTIN
        if issubclass(tp, weakref.ReferenceType):
            return _Kind.WEAKREF
        if issubclass(tp, weakref.finalize):
            return _Kind.FINALIZER
        if _is_holder(tp):
            return _Kind.HOLDER
        return _Kind.OBJECT

    def walk(self, root: object, visit: Callable[[int], bool]) -> None:
        """Report every indexed object reachable from `root`.

        `visit(id)` returns whether to walk into the object: False for one
        already seen (in this walk or, for grouping, from another name).
        """
        stack: list[tuple[object, int]] = [(root, 0)]
        count = 0
        while stack:
            obj, depth = stack.pop()
            tp = type(obj)
            kind = self._kind_of_type(tp)
            if kind is _Kind.SKIP:
                continue
            if kind is _Kind.BUILTIN:
                if _builtin_self(obj) is None:  # `len`, `np.sqrt`'s C functions...
                    continue
            elif kind is _Kind.TEXT:
                if len(obj) < MIN_INDEXED_TEXT:  # type: ignore[arg-type]
                    continue
            elif kind in (_Kind.FUNCTION, _Kind.CLASS) and not _is_notebook(obj):
                continue
            elif kind is _Kind.SEQUENCE and type(obj) in (tuple, frozenset) and not obj:
                continue  # () and frozenset() are shared singletons
            count += 1
            if count > self.max_objects:
                self.truncated = True
                return
            if not visit(id(obj)):
                continue
            if kind is _Kind.OBJECT and not self.finalizes and self._watch is not None:
                try:
                    by_type = self._finalizing[tp]
                except KeyError:
                    by_type = self._finalizing[tp] = self._watch.type_finalizes(tp)
                self.finalizes = self._watch.object_finalizes(obj) if by_type is None else by_type
            if kind is _Kind.SHARER:
                for part in self._shared_parts(obj):
                    if type(part) is dict:
                        stack.append((part, depth + 1))
                    else:
                        visit(id(part))
                continue
            if kind is _Kind.ARRAY:
                # A view shares memory with its base: index the chain's root too.
                base = self._root(obj)
                if base is not None:
                    visit(id(base))
                if getattr(getattr(obj, "dtype", None), "kind", "") == "O" and depth < self.max_depth:
                    # An object array holds references: a list in it can be another name's value.
                    stack.extend(self._held(obj, depth + 1, self.max_objects - count))
                continue
            if depth >= self.max_depth:
                self.truncated = True
                continue
            children = _children(obj, kind)
            if kind is not _Kind.CLASS and _is_notebook(tp):
                # An instance pickles its notebook class: both must come back as one
                # group, or the restored instance has a copy of the class and misses
                # what later cells do to the class itself (`C.f = ...`).
                children.append(tp)
            below = depth + 1
            # Atoms and short strings are never indexed: left out here, not popped one by one.
            stack.extend([(c, below) for c in children if type(c) not in _NEVER_INDEXED and not (type(c) is str and len(c) < MIN_INDEXED_TEXT)])


    def _root(self, array: Any) -> Any:
        """The root of an array's `.base` chain (None for an array that owns its memory)."""
        ndarray = self._ndarray
        base = getattr(array, "base", None)
        while ndarray is not None:
            parent = getattr(base, "base", None)
            if isinstance(base, ndarray) and parent is not None:
                base = parent
            elif not isinstance(base, ndarray) and isinstance(parent, ndarray):
                base = parent  # an interface object (`as_strided`'s) between two arrays
            else:
                break
        return base

    def _shared_parts(self, obj: Any) -> list[object]:
        """What a numpy or pandas leaf shares with values another name may hold: its bit
        generator, the array `a.flat` walks, a frame's block arrays and their roots, its
        index and columns, and its `attrs` dict (walked: its values can be shared too)."""
        try:
            if hasattr(obj, "bit_generator"):
                return [obj.bit_generator]
            if self._ndarray is not None and isinstance(getattr(obj, "base", None), self._ndarray):  # a flatiter
                arrays, axes, attrs = [obj.base], [], None
            else:  # a frame or series (private internals, so guarded)
                arrays = [a for a in obj._mgr.arrays if self._ndarray is not None and isinstance(a, self._ndarray)]
                axes = [obj.index, *([obj.columns] if hasattr(obj, "columns") else [])]
                attrs = obj.__dict__.get("_attrs")
            roots = [self._root(a) for a in arrays]
            return [*arrays, *(r for r in roots if r is not None), *axes, *([attrs] if isinstance(attrs, dict) else [])]
        except Exception:  # noqa: BLE001  (a library's internals changed: the leaf alone)
            return []

    @staticmethod
    def _held(array: Any, depth: int, budget: int) -> list[tuple[object, int]]:
        """The elements of an object array that can be shared with another name (at most
        `budget` + 1 of them): immutable atoms are left out, in C where the array holds only those."""
        items = array.ravel().tolist()
        if set(map(type, items)) <= _ATOMS:
            return []
        return [(item, depth) for item in itertools.islice((i for i in items if type(i) not in _ATOMS), budget + 1)]


# Modules whose C types can hold references to the notebook's containers without an
# instance __dict__: dict views, mappingproxy, iterators, enumerate, zip, map, filter,
# reversed, itertools' and operator's callables, deque iterators, csv readers and writers.
_HOLDER_MODULES = frozenset({"builtins", "itertools", "operator", "collections", "_collections", "functools", "_csv"})
# ...except those whose references are frames and code (generators and coroutines are
# stored or not as themselves), and tracebacks.
_NOT_HOLDERS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, types.FrameType, types.TracebackType)


def _is_holder(tp: type) -> bool:
    """Whether instances of `tp` refer to other objects only from C (no ``__dict__``, no
    slots) and are a standard-library kind that sees into a container: ``d.keys()`` or
    ``iter(lst)`` must be restored with ``d`` or ``lst``, and a change to them shows through."""
    return (
        getattr(tp, "__module__", None) in _HOLDER_MODULES
        and tp.__dictoffset__ == 0
        and not issubclass(tp, _NOT_HOLDERS)
        and not any("__slots__" in vars(k) for k in tp.__mro__)
    )


def _builtin_self(obj: object) -> object:
    """The object a bound builtin method (`lst.append`) belongs to, else None."""
    if isinstance(obj, types.BuiltinMethodType):
        owner = obj.__self__
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            return owner
    return None


def _children(obj: object, kind: _Kind) -> list[object]:
    try:
        if kind is _Kind.SEQUENCE:
            return list(obj)  # type: ignore[call-overload,no-any-return]
        if kind is _Kind.MAPPING:
            # dict's own items(): a subclass's may do work (a lazy namespace would load everything).
            items = list(dict.items(obj) if isinstance(obj, dict) else obj.items())  # type: ignore[attr-defined]
            return [x for pair in items for x in pair] + _attributes(obj)
        if kind is _Kind.FUNCTION:
            assert isinstance(obj, types.FunctionType)
            found: list[object] = [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
            for cell in obj.__closure__ or ():
                try:
                    found.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            return found + list(obj.__dict__.values())
        if kind is _Kind.CLASS:
            assert isinstance(obj, type)
            return [v for k, v in vars(obj).items() if not (k.startswith("__") and k.endswith("__"))]
        if kind is _Kind.METHOD:
            assert isinstance(obj, types.MethodType)
            return [obj.__self__, obj.__func__]
        if kind is _Kind.PARTIAL:
            assert isinstance(obj, functools.partial)
            return [obj.func, *obj.args, *obj.keywords.values()]
        if kind is _Kind.BUILTIN:
            return [_builtin_self(obj)]
        if kind is _Kind.MEMORYVIEW:
            assert isinstance(obj, memoryview)
            return [obj.obj]
        if kind is _Kind.WEAKREF:
            # A weak reference and its referent are restored together only if
            # they are co-variables; a dead one reaches nothing.
            assert isinstance(obj, weakref.ReferenceType)
            referent = obj()
            return [] if referent is None else [referent]
        if kind is _Kind.HOLDER:
            return [r for r in gc.get_referents(obj) if not isinstance(r, type)]
        if kind is _Kind.FINALIZER:
            # Restored only with the object it waits on (a callback that no longer fires
            # when that object dies is not the notebook's).
            assert isinstance(obj, weakref.finalize)
            waits_on = obj.peek()
            return [] if waits_on is None else [waits_on[0]]
        if kind is _Kind.OBJECT:
            return _attributes(obj)
        if kind is _Kind.WRAPPER:
            # `df.loc` keeps its frame in a Cython attribute, not in __dict__.
            held = getattr(obj, "obj", None) if isinstance(getattr(type(obj), "obj", None), types.GetSetDescriptorType) else None
            return _attributes(obj) + ([] if held is None else [held])
    except RuntimeError:  # a container changed size while we copied it (another thread)
        return []
    return []


def _attributes(obj: object) -> list[object]:
    """Values of an instance's __dict__ and __slots__, read without running user __getattr__."""
    found: list[object] = []
    try:
        instance_dict = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        instance_dict = None
    if isinstance(instance_dict, dict):
        found.extend(instance_dict.values())
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):
                slot = f"_{klass.__name__.lstrip('_')}{slot}"  # name mangling
            try:
                found.append(object.__getattribute__(obj, slot))
            except AttributeError:  # slot never assigned
                pass
    return found


def reachable_ids(obj: object, *, max_objects: int = 100_000, max_depth: int = 64) -> set[int]:
    """id() of every indexed object reachable from `obj`, within the bounds.

    Containers, instance attributes, closures, bound methods and weak
    references (to their live referent, so `r = weakref.ref(obj)` groups `r`
    with `obj`) are followed, and so are the standard library's C objects that see
    into a container (`ks = d.keys()`, `iter(lst)`, `enumerate(lst)`, `zip`,
    `types.MappingProxyType(d)`, `operator.methodcaller('f', lst)`: through
    `gc.get_referents`, since they have no attributes); arrays and pandas objects are leaves (an array
    view also yields the id of the root of its `.base` chain, so `v = a[2:5]`
    groups `v` with `a`). Library modules, classes and functions, singletons and small immutable
    values are left out so they never glue variables together.
    """
    return reach(obj, max_objects=max_objects, max_depth=max_depth)[0]


class DeathWatcher(Protocol):
    """Says which objects' death a notebook can see (`nbrewind.identity.finalizers.DeathWatch`)."""

    def type_finalizes(self, tp: type) -> bool | None:
        """For every instance of `tp`; None: ask `object_finalizes` for each."""

    def object_finalizes(self, obj: object) -> bool: ...

    def referents(self) -> set[int]:
        """id() of the objects that finalize visibly whatever their type."""


def reach(
    obj: object, *, max_objects: int = 100_000, max_depth: int = 64, watch: DeathWatcher | None = None
) -> tuple[set[int], bool, bool]:
    """`reachable_ids` of `obj`, whether no bound cut the walk short, and whether `watch`
    says an object in it finalizes visibly (False without one). A complete reach holds the
    reach of every object in it (the same rules walk it from there)."""
    found: set[int] = set()

    def visit(key: int) -> bool:
        if key in found:
            return False
        found.add(key)
        return True

    walker = _Walker(max_objects, max_depth, watch)
    walker.walk(obj, visit)
    finalizes = walker.finalizes or (watch is not None and not watch.referents().isdisjoint(found))
    return found, not walker.truncated, finalizes
