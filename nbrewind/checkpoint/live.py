"""Which values are live resources: handles on something outside the Python heap
(an OS resource, a thread, a running cluster) that bytes cannot restore.

Most refuse pickling anyway; naming them gives a clear reason, and catches the
ones that pickle "fine" but would restore as a lie (a distributed Future pickles
as a key that means nothing in another session).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

__all__ = ["LiveResource", "live_instance_name", "live_resource_name", "qualified_name"]


# Types whose instances are handles on something outside the Python heap
# (an OS resource, a thread, a running cluster).  Most refuse pickling anyway;
# listing them gives a clear reason, and catches the ones that pickle "fine"
# (a distributed Future pickles as a key that means nothing in another
# session).  Matched by "module.qualname" anywhere in the MRO, so nothing has
# to be imported to check, and subclasses count.
_LIVE_RESOURCE_TYPES = frozenset(
    {
        "_thread.lock",
        "_thread.RLock",
        "threading.Thread",
        "threading.Condition",
        "threading.Semaphore",
        "threading.Event",
        "threading.Barrier",
        "_io._IOBase",
        "socket.socket",
        "select.epoll",
        "selectors.BaseSelector",
        "mmap.mmap",
        "sqlite3.Connection",
        "sqlite3.Cursor",
        "sqlite3.Blob",
        "subprocess.Popen",
        "tempfile._TemporaryFileWrapper",
        "logging.Handler",
        "asyncio.events.AbstractEventLoop",
        "concurrent.futures._base.Executor",
        "concurrent.futures._base.Future",
        "multiprocessing.pool.Pool",
        "multiprocessing.process.BaseProcess",
        "multiprocessing.connection.Connection",
        "weakref.finalize",
        "builtins.generator",
        "builtins.coroutine",
        "builtins.async_generator",
        "builtins.frame",
        "builtins.traceback",
        "builtins.memoryview",
        "_ctypes._Pointer",
        "_ctypes.CFuncPtr",
        "zmq.sugar.socket.Socket",
        "zmq.sugar.context.Context",
        "distributed.client.Client",
        "distributed.client.Future",
        "distributed.deploy.cluster.Cluster",
        "distributed.core.Server",
    }
)

# In-memory streams derive from the I/O base classes but hold their content.
_FAITHFUL_TYPES = frozenset({"_io.BytesIO", "_io.StringIO"})

_live_cache: weakref.WeakKeyDictionary[type, str | None] = weakref.WeakKeyDictionary()
_live_cache_lock = threading.Lock()


def qualified_name(cls: type) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls.__name__)}"


def live_resource_name(cls: type) -> str | None:
    """The deny-listed base of ``cls``, or None; cached per class."""
    try:
        return _live_cache[cls]
    except KeyError:
        pass
    except TypeError:  # a class that cannot be weakly referenced
        return _scan_mro(cls)
    found = _scan_mro(cls)
    with _live_cache_lock:
        _live_cache[cls] = found
    return found


def _scan_mro(cls: type) -> str | None:
    names = [qualified_name(base) for base in cls.__mro__]
    if any(name in _FAITHFUL_TYPES for name in names):
        return None
    for name in names:
        if name in _LIVE_RESOURCE_TYPES:
            return qualified_name(cls)
    return None


def live_instance_name(obj: object, is_notebook_code: Callable[[object], bool]) -> str | None:
    """The name of a live resource that only some instances of a type are, or None.

    A notebook function under ``functools.lru_cache`` / ``functools.cache``: its
    cache (C state no pickle reaches) is what later calls return, so after a global
    it read changed, a restored empty cache would compute what a fresh run returns
    from the cache; and the wrapper pickles by reference to ``__main__``, which a new
    kernel cannot load. Rebuilt by re-running its life (the definition and the calls
    that filled the cache), it is exact. A library's cached function pickles by
    reference to its module, as any library function does.

    A ``numpy.memmap`` backed by a file: writes through it reach the file, which a
    copy of its data restored as an array would not do.
    """
    cls = type(obj)
    name = _INSTANCE_LIVE.get((str(getattr(cls, "__module__", "")), str(getattr(cls, "__qualname__", ""))))
    if name == "functools._lru_cache_wrapper":
        return name if is_notebook_code(getattr(obj, "__wrapped__", None)) else None
    if name == "numpy.memmap":
        return name if getattr(obj, "_mmap", None) is not None else None
    return None


_INSTANCE_LIVE = {
    ("functools", "_lru_cache_wrapper"): "functools._lru_cache_wrapper",
    ("numpy", "memmap"): "numpy.memmap",
}


class LiveResource(Exception):
    def __init__(self, type_name: str) -> None:
        super().__init__(type_name)
        self.type_name = type_name

