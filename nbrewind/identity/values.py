"""What a value is, for change detection: the content digests that cell keys and task
fingerprints share.

Two callers walk values differently, because they ask different questions: a cell
key pickles the value (in C, with the checkpoint's reducers) to see any change at
all; a task fingerprint walks the task's arguments type by type, to find the task
references, file paths and global-RNG uses inside them. Where either meets the
same kind of leaf, it is digested here and only here:

- a numpy array or bytes-like buffer, hashed in place (dtype, shape and memory
  order included, so values that behave differently digest differently);
- anything else, through a pickler the caller configures, whose stream and
  out-of-band buffers are hashed without copying. Task fingerprints pickle
  *without the memo* where possible: the memo writes a back-reference for an
  object seen twice, so two equal values (a string shared by two attributes
  before a round trip, two equal strings after it) would pickle to different
  bytes. Cell keys keep the memo, because for them sharing is content: after
  ``x = [l, l]`` a write through ``x[0]`` shows in ``x[1]``, after
  ``x = [l, list(l)]`` it does not;
- whether a function or class is the notebook's own code (module ``__main__``),
  which both callers digest by code rather than by reference.

A digest never depends on ``id()`` or ``hash()``.
"""

from __future__ import annotations

import io
import pickle
import types
from collections.abc import Callable
from typing import Any

import xxhash

__all__ = ["MemoNeeded", "array_digest", "buffer_digest", "is_notebook_code", "pickle_digest"]

_FAST_STREAM_LIMIT = 64 << 20
"""Stream bytes after which a memo-less pickle gives up and pickles with the memo:
without it a value reaching one object along many paths is written once per path."""


def array_digest(array: Any) -> bytes | None:
    """xxh3-128 (16 bytes) of a numpy array's dtype, shape, memory order and bytes; None
    for arrays holding object pointers, whose bytes say nothing about their content.

    A C- or F-contiguous array is hashed in place; a strided view is hashed through a
    C-ordered copy, so it digests like that copy.
    """
    import numpy

    dtype = array.dtype
    if dtype.hasobject:
        return None
    flags = array.flags
    if flags.c_contiguous:
        order, data = "C", array
    elif flags.f_contiguous:
        order, data = "F", array.T  # the transpose of an F-array is C-contiguous: no copy
    else:
        order, data = "C", numpy.ascontiguousarray(array)
    descr = repr(dtype.descr) if dtype.names is not None else ""
    hasher = xxhash.xxh3_128(b"nbrewind.value.ndarray.v2")
    hasher.update(f"{dtype.str}|{descr}|{array.shape}|{order}|{array.nbytes}".encode())
    if data.size:
        hasher.update(data.reshape(-1).view(numpy.uint8))
    return hasher.digest()


def buffer_digest(obj: bytes | bytearray | memoryview) -> bytes:
    """xxh3-128 (16 bytes) of a bytes-like value: its type, layout and bytes, hashed in place."""
    hasher = xxhash.xxh3_128(b"nbrewind.value.buffer.v1")
    if type(obj) is memoryview:
        hasher.update(f"memoryview|{obj.format}|{obj.itemsize}|{obj.shape}".encode())
        data = obj.cast("B") if obj.c_contiguous else memoryview(obj.tobytes())
    else:
        hasher.update(type(obj).__name__.encode())
        data = memoryview(obj)
    hasher.update(data.nbytes.to_bytes(8, "little"))
    hasher.update(data)
    return hasher.digest()


class MemoNeeded(Exception):
    """Raised inside a memo-less pickle that met an object a second time, a repeated
    buffer, or grew past its bound: `pickle_digest` then pickles with the memo.

    A pickler's reducers should raise it when, with ``pickler.fast`` set, they meet
    an object they already reduced in this dump: reductions that build fresh tuples
    and dicts hide a cycle from the pickler's own check, which would only end in a
    RecursionError thousands of frames deep."""


class _Stream(io.BytesIO):
    def write(self, data: Any) -> int:
        if self.tell() > _FAST_STREAM_LIMIT:
            raise MemoNeeded
        return super().write(data)


def pickle_digest(
    obj: object,
    make_pickler: Callable[[io.BytesIO, Callable[[pickle.PickleBuffer], None]], pickle.Pickler],
    tag: bytes,
    *,
    memo_less: bool = True,
) -> bytes:
    """xxh3-128 (16 bytes) of ``obj`` pickled by ``make_pickler(file, buffer_callback)``
    (protocol 5, buffers out of band), salted with ``tag``.

    With ``memo_less`` it is pickled without the memo first, so shared and merely
    equal sub-objects give the same bytes; a value with a cycle (which the memo-less
    pickler refuses), one holding the same buffer twice, one whose stream outgrows a
    bound, and one that fails memo-less for any other reason are pickled again with
    the memo; what that pickle raises propagates. Without it the memo is used from
    the start: sharing is then part of the digest (``[l, l]`` differs from
    ``[l, list(l)]``), which a caller needs when a later mutation through one alias
    must count as a change of the other.
    """
    if memo_less:
        try:
            return _dump_digest(obj, make_pickler, tag, fast=True)
        except Exception:
            # A cycle shows as ValueError, or as RecursionError through a reducer (which
            # cloudpickle re-raises as PicklingError); a value that cannot be pickled at
            # all fails again below, with the memo, and that error is the caller's.
            pass
    return _dump_digest(obj, make_pickler, tag, fast=False)


def _dump_digest(obj: object, make_pickler: Callable[..., pickle.Pickler], tag: bytes, *, fast: bool) -> bytes:
    stream = _Stream() if fast else io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    owners: set[int] = set()
    keep: list[object] = []

    def collect(buffer: pickle.PickleBuffer) -> None:
        if fast:
            owner = memoryview(buffer).obj
            if id(owner) in owners:
                raise MemoNeeded  # once per path is what the memo is for
            owners.add(id(owner))
            keep.append(owner)  # no id is reused while the pickle runs
        buffers.append(buffer)

    pickler = make_pickler(stream, collect)
    pickler.fast = fast  # the C pickler's memo-less mode: it refuses cycles with ValueError
    pickler.dump(obj)
    hasher = xxhash.xxh3_128(tag)
    payload = stream.getbuffer()
    hasher.update(payload.nbytes.to_bytes(8, "little"))
    hasher.update(payload)
    payload.release()
    hasher.update(len(buffers).to_bytes(8, "little"))
    for buffer in buffers:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: hash a contiguous copy
            raw = memoryview(memoryview(buffer).tobytes())
        hasher.update(raw.nbytes.to_bytes(8, "little"))
        hasher.update(raw)
    return hasher.digest()


def is_notebook_code(obj: object) -> bool:
    """True for a function or class the notebook defined (module ``__main__``); a function
    also needs ``__main__``'s globals, so code merely claiming the module name is not."""
    if isinstance(obj, types.FunctionType):
        return obj.__module__ == "__main__" and dict.get(obj.__globals__, "__name__") == "__main__"
    if isinstance(obj, type):
        return getattr(obj, "__module__", None) == "__main__"
    return False
