"""The task side of an update: :func:`update_task`, key references, handles and :func:`fetch`.

Nothing here imports dask or distributed at module level.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nbrewind.tasks.update.plugins import (
    PLUGIN_NAME,
    STATES_OP,
    StaleUpdate,
    UpdateError,
    plugin_class,
    scan_handles,
)

if TYPE_CHECKING:
    from distributed import Client

Key = Any  # a Dask key: str, bytes, int, float, or a tuple of keys

_handles_seen = False


def _make_handle(key: Key) -> KeyHandle:
    global _handles_seen
    _handles_seen = True
    return KeyHandle(key)


def handles_seen() -> bool:
    """Whether any :class:`KeyHandle` was ever unpickled in this process (so graphs may hold some)."""
    return _handles_seen


class KeyHandle:
    """A key passed to a task *by name*: the task fetches its value when it wants it.

    Unlike a future or :func:`ref`, a handle is not a dependency: the worker does not
    gather the value before the task starts, and the task can drop it once used. The
    scheduler keeps the key for the task (in memory, or recomputed if lost) until the
    task releases it with ``update_task(release=[...])`` or finishes.
    """

    __slots__ = ("key",)

    def __init__(self, key: Key) -> None:
        self.key = key

    def fetch(self, timeout: float | None = 300.0) -> Any:
        """The key's value (see :func:`fetch`)."""
        return fetch(self, timeout=timeout)

    def __repr__(self) -> str:
        return f"handle({self.key!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyHandle) and other.key == self.key

    def __hash__(self) -> int:
        return hash(("nbrewind-handle", self.key))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_handle, (self.key,))

    def __dask_tokenize__(self) -> Any:
        return ("nbrewind-handle", self.key)


def key_of(obj: Any) -> Key:
    """The Dask key named by a future, a :class:`KeyHandle`, a :func:`ref` or a key itself."""
    key = getattr(obj, "key", obj)
    if not isinstance(key, (str, bytes, int, float, tuple)):
        raise TypeError(f"{obj!r} is not a Dask key, a future or a handle")
    return key


def handle(obj: Any) -> KeyHandle:
    """A :class:`KeyHandle` for a future or a key, to pass to a task by name."""
    return KeyHandle(key_of(obj))


def handles(objs: Iterable[Any]) -> list[KeyHandle]:
    """:func:`handle` of each of ``objs``."""
    return [handle(o) for o in objs]


def ref(obj: Any) -> Any:
    """A reference to a key inside a replacement: the replacement receives the key's value.

    The key becomes a dependency of the task, gathered before the replacement starts,
    so it must be in memory when the update is sent (a published piece, typically).
    """
    from dask._task_spec import TaskRef

    return TaskRef(key_of(obj))


def load_piece(root: str, entry: str) -> Any:
    """Task of a published piece: its value, read back from the store (verified)."""
    from nbrewind.tasks.cache import load_entry, object_store

    return load_entry(object_store(root), entry)


# -- the task side --------------------------------------------------------------------------------------


def _worker_and_key() -> tuple[Any, Key]:
    try:
        from distributed import get_worker

        worker = get_worker()
        key = worker.get_current_task()
    except (ImportError, ValueError, KeyError):
        raise UpdateError("update_task must be called inside a Dask task running on a distributed worker "
                          "(not on the client, nor with a local scheduler, nor in a thread the task started)") from None
    return worker, key


def _plugin(worker: Any) -> Any:
    plugin = worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        raise UpdateError("the NBRewind update plugins are not installed on this cluster: call "
                          "nbrewind.tasks.update.install(client) once before submitting the task")
    return plugin


def _store_root(plugin: Any) -> str:
    from nbrewind.tasks.resume import current_task

    ctx = current_task()
    if ctx is not None:
        return ctx.spec.root
    if plugin.store is None:
        raise UpdateError("publish needs a store every worker can read, so that a published piece survives the "
                          "loss of its worker: run the task under the NBRewind task cache, or call "
                          "nbrewind.tasks.update.install(client, store='/shared/dir')")
    return str(plugin.store)


def _build_replacement(key: Key, replacement: Any) -> tuple[Any, list[Key], list[Key]]:
    """The replacement as a dask Task with ``key``, its key references and its handles."""
    from dask._task_spec import Task, parse_input

    if isinstance(replacement, tuple) and replacement and callable(replacement[0]):
        func, args = replacement[0], replacement[1:]
    elif callable(replacement):
        func, args = replacement, ()
    else:
        raise TypeError(f"replacement must be a function or a tuple (function, *args), not {type(replacement).__name__}")
    task = Task(key, func, *(parse_input(a) for a in args))
    return task, sorted(task.dependencies, key=repr), sorted(scan_handles(args), key=repr)


def _dumps(what: str, obj: Any) -> bytes:
    import cloudpickle

    try:
        data: bytes = cloudpickle.dumps(obj)
        return data
    except Exception as exc:
        raise TypeError(f"{what} cannot be pickled ({type(exc).__name__}: {exc}); the scheduler keeps it to run "
                        "later on any worker: use functions and arguments that pickle (module-level functions, "
                        "plain data, refs and handles)") from exc


def update_task(
    *,
    publish: Mapping[Key, Any] | None = None,
    depends_on: Iterable[Any] = (),
    release: Iterable[Any] = (),
    replacement: Callable[..., Any] | tuple[Any, ...] | None = None,
    timeout: float = 60.0,
) -> None:
    """Tell the scheduler, from inside a running task, how this task's place in the graph changed.

    - ``publish``: new keys, now in memory on this worker, with their values. Each is
      also stored durably (in the NBRewind store when the task runs under the task
      cache, else in the store given to :func:`install`), and the scheduler knows how
      to read it back, so a piece survives the loss of this worker.
    - ``depends_on``: keys (or futures, handles) this task now needs; the scheduler
      keeps them in memory for it, recomputing them if they are lost, until released.
    - ``release``: keys this task no longer needs. The scheduler releases each one
      unless another task, a client or another hold still needs it.
    - ``replacement``: ``(function, *args)`` that takes this task's place if it has to
      run again (its worker is lost, ...). Arguments are literals, :func:`ref` (the
      replacement receives the value; the key must be in memory, a published piece
      typically) or :func:`handle` (the replacement calls :func:`fetch`).

    The update is applied whole or not at all. Releasing a key that the task would
    need if it ran again (it is in its current arguments) requires a replacement
    that does not use it. Raises :class:`UpdateError` for an invalid update,
    :class:`StaleUpdate` when this attempt is no longer the one the scheduler runs
    (e.g. its worker was declared lost), and ``TypeError`` for a replacement or piece
    that cannot be pickled.
    """
    worker, key = _worker_and_key()
    plugin = _plugin(worker)
    pieces: dict[Key, tuple[Any, Any]] = {}
    if publish:
        from dask._task_spec import Task

        from nbrewind.tasks.cache import object_store, store_result

        root = _store_root(plugin)
        for piece_key, value in publish.items():
            piece_key = key_of(piece_key)
            if piece_key == key:
                raise UpdateError(f"cannot publish under the task's own key {key!r}")
            record = {"published": repr(piece_key), "written_at": time.time(), "by": repr(key)}
            try:
                entry, _ = store_result(object_store(root), value, record)
            except (TypeError, AttributeError, ValueError) as exc:
                raise TypeError(f"published piece {piece_key!r} cannot be pickled ({type(exc).__name__}: {exc})") from exc
            pieces[piece_key] = (value, _dumps(f"piece {piece_key!r}", Task(piece_key, load_piece, root, entry)))
    message: dict[str, Any] = {
        "depends_on": [key_of(k) for k in depends_on],
        "release": [key_of(k) for k in release],
        "replacement": None,
        "refs": [],
        "handles": [],
    }
    if replacement is not None:
        task, refs, handle_keys = _build_replacement(key, replacement)
        message.update(replacement=_dumps("the replacement", task), refs=refs, handles=handle_keys)
    from distributed.utils import sync

    response = sync(worker.loop, plugin.send, key, pieces, message, callback_timeout=timeout)
    status = response.get("status")
    if status == "stale":
        raise StaleUpdate(response["message"])
    if status != "OK":
        raise UpdateError(response.get("message", f"the scheduler refused the update: {response!r}"))


def fetch(obj: Any, timeout: float | None = 300.0) -> Any:
    """The value of a key (a :class:`KeyHandle`, future or key), from inside a task.

    A key in this worker's memory is returned as is (no copy); otherwise it is
    gathered from the cluster, waiting while it is recomputed. The task keeps no
    future for it, so once the task drops the value and releases the key, the
    memory can be freed.
    """
    key = key_of(obj)
    try:
        from distributed import Future, get_client, get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        raise UpdateError("fetch must be called inside a Dask task running on a distributed worker") from None
    wts = worker.state.tasks.get(key)
    if wts is not None and wts.state == "memory":
        try:
            return worker.data[key]
        except KeyError:
            pass  # freed meanwhile: gather it like any other key
    from distributed.utils import sync

    client = get_client()
    future: Any = Future(key, client)
    try:
        reply = sync(worker.loop, getattr(worker.scheduler, STATES_OP), keys=[key], client=client.id)
        if reply["states"][0] is None:
            raise UpdateError(f"cannot fetch {key!r}: the scheduler has no such key (released by everyone, or "
                              "never submitted); hold it with depends_on or pass it as a handle")
        return future.result(timeout=timeout)
    finally:
        future.release()


# -- the client side ------------------------------------------------------------------------------------

_installed: weakref.WeakKeyDictionary[Any, tuple[str, str | None]] = weakref.WeakKeyDictionary()


def install(client: Client, store: str | None = None) -> None:
    """Register the update plugins on ``client``'s cluster (once per store).

    ``store`` is a directory every worker can read and write (a shared filesystem on a
    real cluster), where published pieces go when the task does not run under the
    NBRewind task cache. Workers that join later receive the worker plugin too.
    """
    import os

    address = str(client.scheduler.address) if client.scheduler is not None else ""
    root = os.path.abspath(store) if store is not None else None
    if _installed.get(client) == (address, root):
        return
    client.register_plugin(plugin_class("UpdateSchedulerPlugin")())
    client.register_plugin(plugin_class("UpdateWorkerPlugin")(root))
    _installed[client] = (address, root)
