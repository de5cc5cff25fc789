"""Values whose death a notebook can see: finalizers that print, write or remove files.

A plain kernel runs an object's finalizer when the notebook drops the last reference
to it: ``del fh`` flushes what a file handle buffered, dropping a
``tempfile.TemporaryDirectory`` removes its folder, a class's ``__del__`` prints, a
``weakref.finalize`` callback runs. A repeat kernel that leaves a replayed value in the
store until something reads it must bring such a value back before the notebook drops
it, or the drop does nothing. These helpers say which values those are, for the alias
walk (`nbrewind.analysis.aliases.reach`, given a `DeathWatch`) and the pickler
(`nbrewind.checkpoint.serialize`).

Finalizers of the packages in `QUIET_PACKAGES` only release what the process holds
(sockets, threads, a cluster's keys): no cell output or file shows them, and bringing a
Dask client back to drop it would start a cluster nobody needs.
"""

from __future__ import annotations

import io
import types
import weakref

__all__ = ["QUIET_PACKAGES", "DeathWatch", "finalized_referents", "finalizes_object", "finalizes_type"]

QUIET_PACKAGES = frozenset(
    {"distributed", "dask", "tornado", "zmq", "asyncio", "concurrent", "threading", "multiprocessing",
     "ipykernel", "IPython", "jupyter_client", "traitlets", "nbrewind"}
)

# In-memory streams close nothing outside themselves.
_SILENT_IO = (io.StringIO, io.BytesIO)


def _quiet(tp: type) -> bool:
    return str(getattr(tp, "__module__", "")).partition(".")[0] in QUIET_PACKAGES


def finalizes_type(tp: type) -> bool:
    """Whether dropping an instance of `tp` can run a finalizer a notebook sees: a file
    object's close (a buffered write reaches the file) or a ``__del__`` written in Python."""
    if _quiet(tp):
        return False
    if issubclass(tp, io.IOBase):
        return not issubclass(tp, _SILENT_IO)
    return isinstance(getattr(tp, "__del__", None), types.FunctionType)


def _open_file(obj: object) -> bool:
    try:
        return not obj.closed  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001  (a broken wrapper: assume it still holds something)
        return True


def finalizes_object(obj: object) -> bool:
    """`finalizes_type` for a file still open, and a notebook generator suspended inside a
    ``try`` or ``with`` (closing it runs the ``finally`` and the ``with`` exit)."""
    if isinstance(obj, types.GeneratorType):
        frame = obj.gi_frame
        return (
            frame is not None
            and bool(getattr(obj, "gi_suspended", False))
            and bool(obj.gi_code.co_exceptiontable)
            and frame.f_globals.get("__name__") == "__main__"
        )
    if isinstance(obj, io.IOBase):  # closing a closed file does nothing (`with open(...) as f:` leaves one)
        return finalizes_type(type(obj)) and _open_file(obj)
    return finalizes_type(type(obj))


def finalized_referents() -> set[int]:
    """id() of every live object a ``weakref.finalize`` callback waits on, but those of
    `QUIET_PACKAGES`. Read from the class's registry (a CPython detail since 3.4, guarded)."""
    registry = getattr(weakref.finalize, "_registry", None)
    if not registry:
        return set()
    found: set[int] = set()
    try:
        infos = list(registry.values())
    except RuntimeError:  # changed by another thread while copied
        return found
    for info in infos:
        ref = getattr(info, "weakref", None)
        obj = ref() if callable(ref) else None
        if obj is not None and not _quiet(type(obj)):
            found.add(id(obj))
    return found


class DeathWatch:
    """What `nbrewind.analysis.aliases.reach` asks, for one walk: the callbacks' registry is
    read once, when first needed."""

    def __init__(self) -> None:
        self._referents: set[int] | None = None

    def type_finalizes(self, tp: type) -> bool | None:
        if tp is types.GeneratorType or (issubclass(tp, io.IOBase) and finalizes_type(tp)):
            return None  # it depends on the object: `finalizes_object`
        return finalizes_type(tp)

    def object_finalizes(self, obj: object) -> bool:
        return finalizes_object(obj)

    def referents(self) -> set[int]:
        if self._referents is None:
            self._referents = finalized_referents()
        return self._referents
