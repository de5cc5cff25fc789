"""Unpickling that gives numpy arrays back owning their memory, as they did live."""

from __future__ import annotations

import functools
import io
import pickle
import sys
from typing import Any


_NUMPY_FROMBUFFER = {("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}


class OwningUnpickler(pickle.Unpickler):
    """Rebuilds out-of-band numpy arrays owning their memory, as they did live.

    numpy's own rebuild makes an array a view of the load buffer, so ``a.base``
    is that buffer, ``a.resize`` refuses, and a view sliced after the restore
    has the buffer as its base instead of ``a``.
    """

    def __init__(self, file: io.BytesIO, adoptable: set[int], **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._adoptable = adoptable

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_FROMBUFFER:
            return functools.partial(_owning_frombuffer, self._adoptable)
        return super().find_class(module, name)


def is_fresh_bytes_array(buf: object) -> bool:
    numpy = sys.modules.get("numpy")
    return (
        numpy is not None
        and type(buf) is numpy.ndarray
        and buf.dtype == numpy.uint8  # type: ignore[attr-defined]
        and buf.ndim == 1  # type: ignore[attr-defined]
        and buf.flags.owndata  # type: ignore[attr-defined]
    )


def _owning_frombuffer(
    adoptable: set[int], buf: Any, dtype: Any, shape: Any, order: str, axis_order: Any = None
) -> Any:
    import numpy

    if id(buf) in adoptable and (order == "C" or len(shape) <= 1):
        adoptable.discard(id(buf))  # a buffer becomes one array only
        try:
            buf.dtype = dtype  # in place: the array keeps owning the memory it was read into
            buf.shape = shape
            return buf
        except (TypeError, ValueError):  # a dtype numpy will not set in place (zero itemsize)
            buf = buf.view(numpy.uint8).reshape(-1)
    flat: Any = numpy.frombuffer(buf, dtype=dtype)
    if order == "K" and axis_order is not None:
        view = flat.reshape(shape, order="C").transpose(axis_order)
    else:
        view = flat.reshape(shape, order=order)
    owned = view.copy(order="K")
    if not view.flags.writeable:
        owned.flags.writeable = False
    return owned


def is_writable(buf: object) -> bool:
    if isinstance(buf, bytearray):
        return True
    if isinstance(buf, bytes):
        return False
    try:
        return not memoryview(buf).readonly  # type: ignore[arg-type]
    except TypeError:
        return False
