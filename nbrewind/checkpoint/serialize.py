"""Namespace values to bytes and back (digests of values: `nbrewind.checkpoint.digests`).

A value becomes a :class:`Pickled`: a small pickle stream plus the large raw
buffers (numpy arrays, pandas blocks, bytearrays) that pickle protocol 5 hands
out of band.  The buffers stay views of the live objects, so nothing is copied
here; the caller hashes and stores each buffer by content, which is what lets
an unchanged array or column cost nothing in the next checkpoint.

cloudpickle's pickler is used so functions, lambdas and classes defined in the
notebook (module ``__main__``) are pickled by value: the repeat kernel has no
such definitions until it restores them.

A value that cannot be turned into bytes that restore faithfully is data, not
an error: :func:`pickle_value` returns an :class:`Unserializable` record and the
session rebuilds the value by re-running the cells that made it.  That includes
values pickle accepts but could only restore as a lie: live resources such as
Dask clients, futures, event loops or open handles hidden inside containers.
"""

from __future__ import annotations

import io
import pickle
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from nbrewind.checkpoint.functions import (
    _EmptyCell,  # noqa: F401 - named by checkpoints written when it lived here
    _function_skeleton,  # noqa: F401 - idem
    _set_function_state,  # noqa: F401 - idem
    digest_class,
    reduce_notebook_function,
    restoring_into,
)
from nbrewind.checkpoint.live import LiveResource, live_instance_name, live_resource_name, qualified_name
from nbrewind.checkpoint.loading import OwningUnpickler, is_fresh_bytes_array, is_writable
from nbrewind.checkpoint.own_state import own_state_base, own_state_reduce, user_class
from nbrewind.checkpoint.pandas_refs import linking, manager_reducers
from nbrewind.checkpoint.reducers import (
    SHARING_REDUCERS,
    WEAK_REDUCERS,
    ArrayViews,
    Unrestorable,
    ordered_class_reduce,
)
from nbrewind.identity.values import is_notebook_code
from nbrewind.identity.finalizers import finalized_referents

__all__ = [
    "OOB_THRESHOLD",
    "PICKLE_PROTOCOL",
    "Pickled",
    "Unserializable",
    "pickle_group",
    "pickle_value",
    "restoring_into",
    "split_unserializable",
    "unpickle_group",
    "unpickle_value",
]

OOB_THRESHOLD = 64 * 1024
"""Buffers at least this large leave the pickle stream; smaller ones stay in band,
where a separate store object would cost more than it could ever save."""

PICKLE_PROTOCOL = 5


@dataclass(eq=False)
class Pickled:
    """A value as one pickle stream plus its out-of-band buffers.

    ``buffers`` are raw one-dimensional byte views of the original objects'
    memory (no copies): they are valid only while those objects are unchanged,
    so store them before the next cell runs.  ``segments[i]`` says into how many
    equal parts buffer ``i`` splits along its first axis (see
    :meth:`buffer_segments`); it is 1 for an ordinary buffer.
    """

    payload: bytes
    buffers: list[memoryview]
    segments: list[int] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Total size of the payload and all buffers."""
        return len(self.payload) + sum(view.nbytes for view in self.buffers)

    def buffer_segments(self, index: int) -> list[memoryview]:
        """Split buffer ``index`` into its equal rows, as zero-copy views.

        pandas keeps same-dtype columns in one 2-D block whose rows are the
        columns, and the block is regrouped whenever a column is assigned.  So
        a store that keeps each segment by content stores an unchanged column
        once, however the blocks around it were regrouped.  A multi-row buffer
        is only segmented when each row is at least ``OOB_THRESHOLD`` bytes.
        """
        view = self.buffers[index]
        count = self.segments[index] if index < len(self.segments) else 1
        if count <= 1:
            return [view]
        size = view.nbytes // count
        return [view[i * size : (i + 1) * size] for i in range(count)]


@dataclass(frozen=True)
class Unserializable:
    """Why a value could not be stored; it must be rebuilt by re-running its cells.

    ``members`` names the failing variables when a group of co-variables was
    pickled together.
    """

    type_name: str
    reason: str
    members: tuple[str, ...] = ()


_BY_TYPE = {**WEAK_REDUCERS, **SHARING_REDUCERS}
"""Reducers looked up by an object's exact type (one dict: every pickled object asks)."""


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no annotations
    """cloudpickle's pickler that refuses live resources anywhere in the value.

    Functions defined in the notebook are reduced to their code, defaults,
    closure and attributes, never their globals: cloudpickle would copy the
    globals they reference (a function reading a 200 MB array would carry it),
    and a restored function must see the kernel's namespace, not a snapshot.
    With ``for_digest`` the reduction is made independent of where the code
    was compiled (file name, first line) and of cloudpickle's per-process class
    ids, so equal code digests equal in every kernel process.

    Restores are made exact by :mod:`nbrewind.checkpoint.reducers`: arrays
    sharing memory in one pickle stay views of one buffer (``views`` says
    which, see :class:`ArrayViews`), classes keep their attribute order, weak
    references point at their restored referent.
    """

    def __init__(self, *args: Any, for_digest: bool = False, views: ArrayViews, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._for_digest = for_digest
        self._views = views
        self._own_state: dict[type, type | None] = {}
        # Stored values link pandas' copy-on-write references again when loaded; digests
        # keep pandas' own reduction (`pandas_refs`).
        self._by_type = dict(_BY_TYPE) if for_digest else {**_BY_TYPE, **manager_reducers()}
        # Objects a `weakref.finalize` callback waits on: a stored copy would die silently.
        self._finalized = finalized_referents()

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        name = live_resource_name(kind)
        if name is not None:
            raise LiveResource(name)
        if self._finalized and id(obj) in self._finalized:
            raise LiveResource(f"{qualified_name(kind)} with a weakref.finalize callback")
        if kind is self._views.ndarray:
            return self._views.reduce(obj)
        name = live_instance_name(obj, is_notebook_code)
        if name is not None:
            raise LiveResource(name)
        if kind is types.FunctionType and is_notebook_code(obj):
            return reduce_notebook_function(obj, self._for_digest)
        try:
            base = self._own_state[kind]
        except KeyError:
            base = self._own_state[kind] = own_state_base(kind, user_class)
            if base is None and self._views.ndarray is not None and self._views.handles(kind):
                self._by_type[kind] = self._views.reduce  # an ndarray subclass (first seen here)
        if base is not None:
            return own_state_reduce(obj, base)
        special = self._by_type.get(kind)
        if special is not None:
            return special(obj)
        if isinstance(obj, type):
            if self._for_digest and getattr(obj, "__module__", None) == "__main__":
                return digest_class(obj)
            return ordered_class_reduce(obj, super().reducer_override(obj))
        return super().reducer_override(obj)


class _BufferCollector:
    """buffer_callback that keeps buffers of at least ``threshold`` bytes out of band."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.buffers: list[memoryview] = []
        self.segments: list[int] = []

    def __call__(self, buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < self.threshold:
            raw.release()
            return True  # a true result tells pickle to write it in band
        self.buffers.append(raw)
        self.segments.append(_row_count(buffer))
        return False


def _row_count(buffer: pickle.PickleBuffer) -> int:
    with memoryview(buffer) as shaped:
        shape = shaped.shape or ()
        if len(shape) < 2 or not shaped.c_contiguous or shape[0] < 2:
            return 1
        rows = shape[0]
        return rows if shaped.nbytes // rows >= OOB_THRESHOLD else 1


def _dump(obj: object, threshold: int) -> Pickled:
    """Pickle ``obj``; a second time when arrays in it share memory, to keep them views.

    The first pass records the memory root of every array it pickles; only
    when two arrays share a root the pickle holds in full does a second pass
    rewrite them as views of it (see :class:`ArrayViews`), so values without
    shared arrays pay nothing.
    """
    views = ArrayViews()
    pickled = _dump_once(obj, threshold, views)
    if views.ndarray is not None and views.finish():
        pickled = _dump_once(obj, threshold, views)
    return pickled


def _dump_once(obj: object, threshold: int, views: ArrayViews) -> Pickled:
    stream = io.BytesIO()
    collector = _BufferCollector(threshold)
    pickler = _Pickler(stream, protocol=PICKLE_PROTOCOL, buffer_callback=collector, views=views)
    pickler.dump(obj)
    return Pickled(stream.getvalue(), collector.buffers, collector.segments)


def _type_name(obj: object) -> str:
    return qualified_name(type(obj))


def _module_record(obj: object) -> Unserializable | None:
    if issubclass(type(obj), types.ModuleType):  # not isinstance: see pickle_group
        # Faithful by reference, but a module is not data: the session records
        # imports by name and re-imports them rather than storing a blob.
        return Unserializable(_type_name(obj), f"module {getattr(obj, '__name__', '?')!r} is re-imported, not stored")
    return None


def _try_dump(obj: object, threshold: int) -> Pickled | Unserializable:
    refused = _module_record(obj)
    if refused is not None:
        return refused
    try:
        return _dump(obj, threshold)
    except Exception as exc:  # any failure of a user __reduce__ is data, not our crash
        return _refusal(obj, exc)


def _refusal(obj: object, exc: Exception) -> Unserializable:
    """Why pickling ``obj`` raised ``exc``, as the record that says it cannot be stored."""
    if isinstance(exc, LiveResource):
        return Unserializable(
            _type_name(obj), f"holds a live resource ({exc.type_name}) that bytes cannot restore"
        )
    if isinstance(exc, Unrestorable):
        return Unserializable(_type_name(obj), f"holds a {exc.type_name}: {exc.reason}")
    if isinstance(exc, RecursionError):
        return Unserializable(_type_name(obj), "nested too deeply to pickle")
    return Unserializable(_type_name(obj), f"{type(exc).__name__}: {exc}")


def pickle_value(obj: object) -> Pickled | Unserializable:
    """Pickle ``obj`` with large buffers out of band, or say why it cannot be stored.

    Never raises for a bad value (KeyboardInterrupt and other BaseExceptions do
    propagate).  The returned buffers are views of ``obj``'s memory.
    """
    return _try_dump(obj, OOB_THRESHOLD)


def unpickle_value(
    payload: bytes, buffers: Sequence[bytes | bytearray | memoryview], *, adopt: bool = False
) -> object:
    """Rebuild a value from :func:`pickle_value`'s payload and buffers.

    A numpy array restored over a read-only buffer would itself be read-only,
    unlike the original, so read-only buffers (``bytes``) are copied first.
    numpy arrays come back owning their memory, as they did live: with
    ``adopt``, a buffer that is a fresh one-dimensional uint8 numpy array the
    caller made for this load becomes the restored array itself (no copy);
    any other buffer is copied into the array.  pandas blocks that share memory
    share their copy-on-write references again (`pandas_refs`).  Only unpickle
    bytes whose digest was verified and whose origin is trusted.
    """
    writable = [buf if is_writable(buf) else bytearray(buf) for buf in buffers]
    adoptable = {id(buf) for buf in writable if adopt and is_fresh_bytes_array(buf)}
    with linking():
        return OwningUnpickler(io.BytesIO(payload), adoptable, buffers=writable).load()


def pickle_group(mapping: Mapping[str, object]) -> Pickled | Unserializable:
    """Pickle several co-variables as one stream so shared objects stay shared.

    After :func:`unpickle_group`, ``b is a`` holds again if it held before.
    If the group fails, the result names the failing members in ``members``
    and ``reason``; :func:`split_unserializable` separates them.
    """
    group = dict(mapping)
    # type(), not isinstance(): isinstance asks a dead weakref.proxy for its class and raises
    modules = tuple(name for name, value in group.items() if issubclass(type(value), types.ModuleType))
    result = _try_dump(group, OOB_THRESHOLD) if not modules else None
    if isinstance(result, Pickled):
        return result
    _, failed = split_unserializable(group)
    names = tuple(failed) or tuple(group)
    details = "; ".join(f"{name}: {failed[name].reason}" for name in failed)
    if not failed and result is not None:
        details = f"the group as a whole: {result.reason}"
    return Unserializable("group", f"cannot pickle {', '.join(names)} ({details})", names)


def unpickle_group(
    payload: bytes, buffers: Sequence[bytes | bytearray | memoryview], *, adopt: bool = False
) -> dict[str, object]:
    """Rebuild the name -> value mapping written by :func:`pickle_group` (``adopt``: as in
    :func:`unpickle_value`)."""
    group = unpickle_value(payload, buffers, adopt=adopt)
    if not isinstance(group, dict):
        raise TypeError(f"expected a pickled group (dict), got {_type_name(group)}")
    return group


def split_unserializable(
    mapping: Mapping[str, object],
) -> tuple[dict[str, object], dict[str, Unserializable]]:
    """Separate the members that pickle from those that cannot be stored.

    Pickles each member on its own (the bytes are discarded), so call it only
    after a group failed, not on every checkpoint.
    """
    good: dict[str, object] = {}
    bad: dict[str, Unserializable] = {}
    for name, value in mapping.items():
        result = _try_dump(value, OOB_THRESHOLD)
        if isinstance(result, Unserializable):
            bad[name] = result
        else:
            good[name] = value
    return good, bad
