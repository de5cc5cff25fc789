"""Checkpoints inside long-running Dask tasks, and durable partial results.

A task that misses the cache runs under :func:`run_resumable` (the graph rewrite
puts it there). While the task's function runs, a context variable holds the
task's :class:`~nbrewind.tasks.cache.TaskSpec`: its fingerprint and the store.
Code inside the task then calls

- :func:`checkpoint` to persist partial state under ``refs/task-checkpoints/<fingerprint>``:
  the state is pickled into the store as a result entry (objects first, each
  written atomically) and only then is the ref replaced (atomic rename), so a
  process killed at any point leaves the previous checkpoint or the new one,
  never a torn one;
- :func:`resume` to read the last checkpoint back, in a retry after a worker
  was lost or in a later run of the same task (same fingerprint) after an
  interruption or a failure;
- :func:`publish` to store a partial result durably under
  ``refs/task-published/<fingerprint>.<name>`` and, on a distributed worker,
  register it on the scheduler as a key (a task that loads it from the store)
  kept alive by a named dataset, so losing any worker loses nothing.

When the task returns, its result is cached as usual and its checkpoint ref is
deleted (the objects it pointed at are left to ``gc``). A task that fails keeps
its checkpoint for the next attempt.

Outside such a task (plain Dask, no NBRewind kernel, or code that is not in a
task) :func:`checkpoint` does nothing and returns False, :func:`resume` returns
its default and :func:`publish` returns a handle holding the value in memory.

The context variable is not inherited by threads the task starts itself.
Nothing here imports dask or distributed at module level.
"""

from __future__ import annotations

import contextvars
import logging
import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbrewind.errors import NbrewindError
from nbrewind.store import ObjectStore
from nbrewind.tasks.cache import TaskSpec, compute_and_store, load_entry, object_store, store_result
from nbrewind.tasks.remote import NotTaken, StoreLink, drop_ref, request_ref, sees_store, stash_result
from nbrewind.tasks.results import TaskCacheError

__all__ = [
    "CHECKPOINT_NAMESPACE",
    "PUBLISHED_NAMESPACE",
    "Published",
    "TaskContext",
    "checkpoint",
    "current_task",
    "publish",
    "published",
    "resume",
    "run_resumable",
]

CHECKPOINT_NAMESPACE = "task-checkpoints"
PUBLISHED_NAMESPACE = "task-published"
RELAY_WAIT = 30.0
"""Seconds a checkpoint or resume on a worker without the store waits for the kernel."""
#: Names given to :func:`publish`: they become part of a ref name and of a Dask key.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")

logger = logging.getLogger(__name__)


@dataclass
class TaskContext:
    """The running task, as code inside it sees it (one per attempt)."""

    spec: TaskSpec
    writes: int = 0
    """Checkpoints this attempt wrote."""
    last_write: float = 0.0
    """``time.monotonic()`` of the last checkpoint written."""
    resumed: bool = False
    """Whether :func:`resume` found a checkpoint in this attempt."""
    warned: bool = field(default=False, repr=False)
    unreachable: bool = field(default=False, repr=False)
    """A checkpoint through the kernel timed out: later ones are not tried (each would wait)."""

    @property
    def objects(self) -> ObjectStore:
        """The store's object area (opened once per process)."""
        return object_store(self.spec.root)

    @property
    def relay(self) -> StoreLink | None:
        """How to reach the store through the kernel, where this worker cannot see it; else None."""
        link = self.spec.link
        return link if link is not None and not sees_store(self.spec.root, link) else None


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("nbrewind_task", default=None)


def current_task() -> TaskContext | None:
    """The NBRewind task running in this thread, if any."""
    return _current.get()


def run_resumable(spec: TaskSpec, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Graph task for a cache miss: :func:`~nbrewind.tasks.cache.compute_and_store` with the
    task visible to :func:`checkpoint`, :func:`resume` and :func:`publish`; on success, the
    task's checkpoint is dropped (its result is cached instead)."""
    ctx = TaskContext(spec)
    token = _current.set(ctx)
    try:
        value = compute_and_store(spec, func, *args, **kwargs)
    finally:
        _current.reset(token)
    if ctx.writes or ctx.resumed:
        # Only tasks that used checkpoints pay for the delete: the same fingerprint
        # means the same code, which calls resume() or checkpoint() in every attempt.
        _drop_checkpoint(ctx)
    return value


def _drop_checkpoint(ctx: TaskContext) -> None:
    try:
        link = ctx.relay
        if link is not None:
            drop_ref(link, CHECKPOINT_NAMESPACE, ctx.spec.fingerprint)
            return
        ctx.objects.ref_delete(CHECKPOINT_NAMESPACE, ctx.spec.fingerprint)
    except (NbrewindError, OSError) as exc:  # read-only store: the stale ref is harmless
        logger.debug("NBRewind: could not drop the checkpoint of %s: %s", ctx.spec.fingerprint, exc)


def _warn_once(ctx: TaskContext, what: str, exc: BaseException) -> None:
    if not ctx.warned:
        ctx.warned = True
        logger.warning("NBRewind: %s in task %r (%s): %s: %s", what, ctx.spec.key_prefix,
                       ctx.spec.fingerprint, type(exc).__name__, exc)


def checkpoint(state: Any, *, min_interval: float = 0.0) -> bool:
    """Persist ``state`` as this task's checkpoint, replacing the previous one.

    Returns True when the checkpoint was written. Returns False, writing nothing,
    outside a task run under NBRewind's cache, when the previous checkpoint of this
    attempt is less than ``min_interval`` seconds old (so a tight loop can call it
    every iteration), and when the state cannot be pickled or stored (logged once
    per task; the task goes on, it just cannot resume from this point).

    ``state`` is pickled with cloudpickle; buffers of 64 KiB or more (NumPy arrays)
    are stored as deduplicated 2 MiB chunks, so a checkpoint of a large array
    mostly unchanged since the last one writes only the changed chunks.
    """
    ctx = _current.get()
    if ctx is None:
        return False
    now = time.monotonic()
    if min_interval > 0 and ctx.writes and now - ctx.last_write < min_interval:
        return False
    spec = ctx.spec
    record = {"checkpoint": ctx.writes + 1, "written_at": time.time(), "host": socket.gethostname(),
              "key_prefix": spec.key_prefix}
    try:
        link = ctx.relay
        if link is not None:
            if ctx.unreachable:
                return False
            if not stash_result(link, spec.fingerprint, state, record, ref=CHECKPOINT_NAMESPACE, wait=RELAY_WAIT):
                raise TaskCacheError("the worker already holds as much for the kernel as it may (NBREWIND_STASH_BYTES)")
        else:
            objects = ctx.objects
            entry, _ = store_result(objects, state, record)
            objects.ref_set(CHECKPOINT_NAMESPACE, spec.fingerprint, entry)
    except Exception as exc:  # unpicklable state, full disk: the task itself must go on
        ctx.unreachable = ctx.unreachable or isinstance(exc, NotTaken)
        _warn_once(ctx, "could not write a checkpoint", exc)
        return False
    ctx.writes += 1
    ctx.last_write = now
    return True


def resume(default: Any = None) -> Any:
    """The state last passed to :func:`checkpoint` by this task (same fingerprint), else ``default``.

    ``default`` is also returned outside a task run under NBRewind's cache, and
    when the checkpoint cannot be read back (damaged or deleted objects; logged).
    Each call loads a fresh copy.
    """
    ctx = _current.get()
    if ctx is None:
        return default
    missing = object()
    try:
        link = ctx.relay
        if link is not None:
            state = request_ref(link, CHECKPOINT_NAMESPACE, ctx.spec.fingerprint, missing, timeout=RELAY_WAIT)
            if state is missing:
                return default
        else:
            objects = ctx.objects
            entry = objects.ref_get(CHECKPOINT_NAMESPACE, ctx.spec.fingerprint)
            if entry is None:
                return default
            state = load_entry(objects, entry)
    except Exception as exc:  # a damaged checkpoint means starting over, not failing
        _warn_once(ctx, "could not read the checkpoint, starting from the beginning", exc)
        return default
    ctx.resumed = True
    return state


# -- durable partial results ------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """A handle on a partial result stored by :func:`publish`; small and picklable.

    Pass it to tasks and load it there with :func:`published` (or ``.load()``).
    ``entry`` is the store object holding the value, or None when the value was
    published outside an NBRewind task and travels inside the handle instead.
    """

    name: str
    fingerprint: str | None = None
    root: str | None = None
    entry: str | None = None
    value: Any = field(default=None, repr=False, compare=False)

    @property
    def durable(self) -> bool:
        """Whether the value is in the store (not only in this handle)."""
        return self.entry is not None

    @property
    def key(self) -> str:
        """The Dask key the value is registered under on a distributed scheduler."""
        # The entry digest, not the fingerprint: publishing the name again (a retry)
        # makes a new key, so a key never loads anything but the value it was made for.
        return f"nbrewind-published-{self.name}-{self.entry or 'inline'}"

    def load(self) -> Any:
        """The published value, read from the store (every object verified)."""
        if self.entry is None or self.root is None:
            return self.value
        return load_entry(object_store(self.root), self.entry)

    def __reduce__(self) -> tuple[Any, ...]:
        # A durable handle never carries its value: that is the point of storing it.
        value = None if self.durable else self.value
        return (Published, (self.name, self.fingerprint, self.root, self.entry, value))


def published(handle: Published) -> Any:
    """The value behind ``handle``; a Dask task function (``client.submit(published, handle)``)."""
    return handle.load()


def publish(name: str, value: Any, *, register: bool = True) -> Published:
    """Store ``value`` durably as this task's partial result ``name`` and return its handle.

    Inside a task run under NBRewind's cache the value goes to the store under
    ``refs/task-published/<fingerprint>.<name>`` (publishing the same name again
    replaces it). When the task runs on a distributed worker and ``register`` is
    true, the value also becomes a key on the scheduler, ``handle.key``, whose task
    loads it from the store, kept alive by a dataset called ``name``: other tasks
    depend on it through ``client.get_dataset(name)``, and if the worker holding it
    in memory is lost, the scheduler reloads it from the store instead of rerunning
    this task. ``name`` is the dataset's name, so it should be unique on the cluster.

    Outside such a task, nothing is stored: the handle holds ``value`` itself.
    Errors writing to the store are raised (the caller asked for durability).
    """
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"published name {name!r} must be 1-100 characters of letters, digits, '_', '.', '-'")
    ctx = _current.get()
    if ctx is None:
        return Published(name, value=value)
    spec = ctx.spec
    objects = ctx.objects
    record = {"published": name, "written_at": time.time(), "key_prefix": spec.key_prefix}
    entry, _ = store_result(objects, value, record)
    objects.ref_set(PUBLISHED_NAMESPACE, f"{spec.fingerprint}.{name}", entry)
    handle = Published(name, spec.fingerprint, spec.root, entry)
    if register:
        _register(handle)
    return handle


def _register(handle: Published) -> None:
    """Make ``handle.key`` a scheduler key, held by the dataset ``handle.name`` (distributed only)."""
    if "distributed" not in sys.modules:
        return
    from distributed import get_client, get_worker

    try:
        get_worker()
    except ValueError:
        return  # a local scheduler: the handle is all there is
    client = get_client()
    future = client.submit(published, handle, key=handle.key, pure=False)
    client.publish_dataset(future, name=handle.name, override=True)
