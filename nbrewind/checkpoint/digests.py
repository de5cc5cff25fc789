"""Cheap content digests of namespace values, for change detection and store names.

A value is digested where it lies: arrays and bytes-like values in place, anything else
through the checkpoint pickler (`nbrewind.checkpoint.serialize`) with every buffer hashed
out of band, so a digest costs no copy and stores nothing.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import xxhash

from nbrewind.checkpoint.reducers import ArrayViews
from nbrewind.checkpoint.serialize import PICKLE_PROTOCOL, Pickled, Unserializable, _module_record, _Pickler, _refusal
from nbrewind.identity.values import array_digest, buffer_digest, pickle_digest

__all__ = ["digest_buffer", "digest_pickled", "digest_value"]


# Digests.  Every hashed item is framed (tag, length) so no two different
# values can feed the hasher the same byte stream.


def _frame(hasher: Any, data: bytes | memoryview) -> None:
    size = len(data) if isinstance(data, bytes) else data.nbytes
    hasher.update(size.to_bytes(8, "little"))
    hasher.update(data)


def digest_buffer(buf: bytes | bytearray | memoryview) -> str:
    """xxh3-128 hex of a buffer's raw bytes: the name it gets as a store object."""
    return xxhash.xxh3_128_hexdigest(buf)


def digest_pickled(pickled: Pickled) -> str:
    """Digest of a Pickled's payload and buffers; equal Pickled, equal digest."""
    hasher = xxhash.xxh3_128(b"nbrewind.pickled.v1")
    _hash_pickled(hasher, pickled)
    return hasher.hexdigest()


def _hash_pickled(hasher: Any, pickled: Pickled) -> None:
    _frame(hasher, pickled.payload)
    hasher.update(len(pickled.buffers).to_bytes(8, "little"))
    for view in pickled.buffers:
        _frame(hasher, view)


def digest_value(obj: object) -> str | Unserializable:
    """A content digest of ``obj`` for change detection, without storing anything.

    Arrays and bytes-like values are digested in place, anything else through
    this module's pickler (notebook functions by code, arrays sharing memory as
    views, live resources refused), every buffer out of band and hashed where it
    lies: see :mod:`nbrewind.identity.values`, which task fingerprints share.

    Different content, dtype, shape or sharing (``[l, l]`` against ``[l,
    list(l)]``) gives a different digest.  Equal content normally gives an equal
    digest; when pickling is order- or sharing-sensitive in ways that do not
    matter (a set of str under another PYTHONHASHSEED, a string shared where an
    equal one was) it may not, which only makes a value look changed.  Compare
    digests from this function only with digests from this function.
    """
    refused = _module_record(obj)
    if refused is not None:
        return refused
    try:
        fast = _digest_in_place(obj)
    except (ValueError, BufferError, TypeError):
        fast = None  # a released view or an exotic buffer: let pickling decide
    if fast is not None:
        return fast.hex()
    try:
        return _digest_pickling(obj).hex()
    except Exception as exc:  # any failure of a user __reduce__ is data, not our crash
        return _refusal(obj, exc)


def _digest_in_place(obj: object) -> bytes | None:
    kind = type(obj)
    if kind is bytes or kind is bytearray or kind is memoryview:
        return buffer_digest(obj)  # type: ignore[arg-type]
    numpy = sys.modules.get("numpy")
    if numpy is not None and kind is numpy.ndarray:
        digest = array_digest(obj)
        if digest is not None and not obj.flags.writeable:  # type: ignore[attr-defined]
            # `a.setflags(write=False)` changes what a later cell can do with `a`.
            return xxhash.xxh3_128(digest + b"|read-only").digest()
        return digest
    return None


def _digest_pickling(obj: object) -> bytes:
    views = ArrayViews()

    def make(stream: io.BytesIO, collect: Any) -> pickle.Pickler:
        def every_buffer_out_of_band(buffer: pickle.PickleBuffer) -> bool:
            collect(buffer)
            return False

        return _Pickler(
            stream, protocol=PICKLE_PROTOCOL, buffer_callback=every_buffer_out_of_band, for_digest=True, views=views
        )

    # With the memo: sharing between mutable parts is content for a cell key.
    digest = pickle_digest(obj, make, b"nbrewind.value.pickle.v2", memo_less=False)
    if views.ndarray is not None and views.finish():
        digest = pickle_digest(obj, make, b"nbrewind.value.pickle.v2", memo_less=False)
    return digest
