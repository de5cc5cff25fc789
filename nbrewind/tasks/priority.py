"""Raise the priority of the Dask work a user is waiting for.

A notebook user who asks for one piece of a large pending computation
(``fut.result()``, ``x[150].compute()`` on a persisted array) would otherwise
wait for everything submitted before it. :func:`prioritize` moves the requested
keys, and every unfinished task they transitively wait on, ahead of all other
work: on the scheduler (released, waiting, queued, no-worker and processing
tasks, re-sorting the queue) and on the workers that already hold some of them
(re-sorting their ready, constrained and fetch heaps).
:func:`enable_auto_priority` does the same whenever a client blocks on pending
futures.

How a bump orders: distributed compares ``TaskState.priority`` tuples, lower
first. A bumped task gets ``(-inf, -n, *original)`` where ``n`` counts bumps on
that scheduler, so it sorts before every unbumped task, a later bump sorts
before an earlier one, and tasks within one bump keep their original relative
order (dependencies before dependents, as ``dask.order`` decided).

The scheduler and worker sides are distributed plugins, registered through
``Client.register_plugin``; they add one scheduler RPC handler and one worker
stream handler. Their classes subclass distributed's plugin bases, so they are
built on first use (see :func:`__getattr__`) to keep importing this module free
of any dask import.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["enable_auto_priority", "prioritize"]

logger = logging.getLogger(__name__)

PLUGIN_NAME = "nbrewind-priority"
#: RPC operation the scheduler plugin adds to ``Scheduler.handlers``.
SCHEDULER_OP = "nbrewind_prioritize"
#: Stream operation the worker plugin adds to ``Worker.stream_handlers``.
WORKER_OP = "nbrewind-prioritize"
#: Scheduler states in which a task still has work ahead of it.
BUMPABLE_STATES = frozenset({"released", "waiting", "queued", "no-worker", "processing"})
#: Seconds a key the scheduler does not know yet stays marked for a bump.
PENDING_TTL = 60.0
#: Seconds a request waits for unknown keys to arrive before replying.
ARRIVAL_WAIT = 2.0

_MARK = float("-inf")

Priority = tuple[float, ...]


def bump_head(sequence: int) -> Priority:
    """Return the prefix that bump number ``sequence`` puts before a priority.

    Any prefixed priority sorts before every unbumped one, and a larger
    ``sequence`` sorts before a smaller one.
    """
    return (_MARK, -float(sequence))


def strip_bump(priority: Priority) -> Priority:
    """Return ``priority`` without the prefix an earlier bump gave it."""
    if priority and priority[0] == _MARK:
        return tuple(priority[2:])
    return tuple(priority)


def reheap(heap: Any) -> None:
    """Rebuild a distributed ``HeapSet`` after its members' priorities changed.

    A HeapSet computes each member's sort key when the member is added and
    never again, so changed priorities take effect only after re-adding every
    member. Members are re-added in their old order so that ties stay as they were.
    """
    if not heap:
        return
    members = list(heap.sorted())
    heap.clear()
    for member in members:
        heap.add(member)


class _SchedulerSide:
    """Scheduler half: the ``nbrewind_prioritize`` handler and deferred bumps.

    A key the client holds a future for may not have reached the scheduler yet
    (graphs travel on the client's batched stream, this request on an RPC
    connection, and the scheduler ingests graphs asynchronously). Such keys are
    remembered for :data:`PENDING_TTL` seconds and bumped by :meth:`update_graph`
    as their graph arrives, before any of it is scheduled; the request waits up
    to :data:`ARRIVAL_WAIT` seconds for that so its reply counts them.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self._sequence = 0
        self._pending: dict[Hashable, tuple[Priority, float]] = {}
        self._late_counts: dict[Priority, int] = {}
        self._arrived: asyncio.Event | None = None

    async def start(self, scheduler: Any) -> None:
        """Install the RPC handler when the plugin is added to a scheduler."""
        self.scheduler = scheduler
        scheduler.handlers[SCHEDULER_OP] = self.handle_prioritize

    async def close(self) -> None:
        """Remove the RPC handler when the scheduler closes."""
        if self.scheduler is not None:
            self.scheduler.handlers.pop(SCHEDULER_OP, None)

    async def handle_prioritize(self, keys: list[Hashable]) -> dict[str, int]:
        """Bump ``keys`` and what they wait on; reply with how many tasks changed.

        ``deferred`` counts keys still unknown after :data:`ARRIVAL_WAIT`; they
        stay marked and are bumped if their graph arrives within :data:`PENDING_TTL`.
        """
        self._sequence += 1
        head = bump_head(self._sequence)
        now = time.monotonic()
        self._pending = {k: v for k, v in self._pending.items() if v[1] > now}
        tasks = self.scheduler.tasks
        roots = []
        unknown = []
        for key in keys:
            ts = tasks.get(key)
            if ts is None or ts.priority is None:
                self._pending[key] = (head, now + PENDING_TTL)
                unknown.append(key)
            else:
                roots.append(ts)
        bumped = self.bump(roots, head)
        if unknown:
            self._late_counts[head] = 0
            deadline = now + ARRIVAL_WAIT
            while (remaining := deadline - time.monotonic()) > 0:
                unknown = [k for k in unknown if self._pending.get(k, (None,))[0] == head]
                if not unknown:
                    break
                if self._arrived is None:
                    self._arrived = asyncio.Event()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), remaining)
            bumped += self._late_counts.pop(head)
        return {"bumped": bumped, "deferred": len(unknown)}

    def update_graph(self, scheduler: Any, **kwargs: Any) -> None:
        """Apply remembered bumps to keys that just arrived (before they are scheduled)."""
        if not self._pending:
            return
        groups: defaultdict[Priority, list[Any]] = defaultdict(list)
        for key in list(self._pending):
            ts = scheduler.tasks.get(key)
            if ts is not None and ts.priority is not None:
                groups[self._pending.pop(key)[0]].append(ts)
        # Oldest bump first, so that a later bump overrides it where they overlap.
        for head in sorted(groups, reverse=True):
            count = self.bump(groups[head], head)
            if head in self._late_counts:
                self._late_counts[head] += count
        if groups and self._arrived is not None:
            self._arrived.set()
            self._arrived = None

    def bump(self, roots: Iterable[Any], head: Priority) -> int:
        """Give ``roots`` and their unfinished dependencies the priority prefix ``head``.

        Returns the number of tasks changed. Queued tasks are re-sorted; workers
        processing any of them are told through their stream.
        """
        chosen = []
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            ts = stack.pop()
            if id(ts) in seen:
                continue
            seen.add(id(ts))
            if ts.state not in BUMPABLE_STATES or ts.priority is None:
                continue
            chosen.append(ts)
            stack.extend(ts.dependencies)
        requeue = False
        by_worker: defaultdict[str, list[Hashable]] = defaultdict(list)
        for ts in chosen:
            ts.priority = head + strip_bump(ts.priority)
            if ts.state == "queued":
                requeue = True
            elif ts.state == "processing" and ts.processing_on is not None:
                by_worker[ts.processing_on.address].append(ts.key)
        if requeue:
            reheap(self.scheduler.queued)
        if by_worker:
            self.scheduler.send_all(
                {},
                {
                    address: [{"op": WORKER_OP, "keys": keys, "head": list(head)}]
                    for address, keys in by_worker.items()
                },
            )
        return len(chosen)


class _WorkerSide:
    """Worker half: the ``nbrewind-prioritize`` stream handler.

    It arrives on the scheduler's batched stream, after the ``compute-task``
    messages of the keys it names, so the worker already knows those keys.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.worker: Any = None

    def setup(self, worker: Any) -> None:
        """Install the stream handler on a worker."""
        self.worker = worker
        worker.stream_handlers[WORKER_OP] = self.handle_prioritize

    def teardown(self, worker: Any) -> None:
        """Remove the stream handler."""
        worker.stream_handlers.pop(WORKER_OP, None)

    def handle_prioritize(self, keys: list[Hashable], head: list[float], **kwargs: Any) -> None:
        """Re-prioritize ``keys`` (and dependencies still to fetch) and re-sort the heaps."""
        state = self.worker.state
        prefix = tuple(head)
        for key in keys:
            ts = state.tasks.get(key)
            if ts is None or ts.priority is None:
                continue
            # The worker appends its own tie-breaker to the scheduler's priority; keep it.
            ts.priority = prefix + strip_bump(ts.priority)
            for dts in ts.dependencies:
                if dts.state == "fetch" and dts.priority is not None and dts.priority > ts.priority:
                    dts.priority = prefix + strip_bump(dts.priority)
        reheap(state.ready)
        reheap(state.constrained)
        for fetch_heap in state.data_needed.values():
            reheap(fetch_heap)


_PLUGIN_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """Build ``PrioritySchedulerPlugin`` / ``PriorityWorkerPlugin`` on first access.

    They live at module level under these names so that pickle (which ships the
    plugins to the scheduler and to worker processes) finds them by reference.
    """
    if name not in ("PrioritySchedulerPlugin", "PriorityWorkerPlugin"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = _PLUGIN_CLASSES.get(name)
    if cls is None:
        from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

        logic, base = (
            (_SchedulerSide, SchedulerPlugin)
            if name == "PrioritySchedulerPlugin"
            else (_WorkerSide, WorkerPlugin)
        )
        namespace = {"__module__": __name__, "__qualname__": name, "__doc__": logic.__doc__}
        cls = _PLUGIN_CLASSES[name] = type(name, (logic, base), namespace)
    return cls


_installed: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def install(client: Client) -> None:
    """Register the scheduler and worker plugins on ``client``'s cluster, once.

    Registration is idempotent on the scheduler, so several clients share one
    plugin (and one bump counter); new workers receive the worker plugin too.
    """
    address = str(_scheduler_rpc(client).address)
    if _installed.get(client) == address:
        return
    client.register_plugin(__getattr__("PrioritySchedulerPlugin")())
    client.register_plugin(__getattr__("PriorityWorkerPlugin")())
    _installed[client] = address


def prioritize(obj: Any, client: Client | None = None) -> int:
    """Run ``obj`` and everything it waits on before all other pending work.

    ``obj`` is a Future, a Dask collection (persisted, or built on persisted
    pieces, e.g. a slice), or a list, tuple, set or dict of those. For a
    collection the bump targets the futures its graph reaches from its output
    keys, so a slice of a persisted array bumps only the chunks it needs.
    A later call wins over an earlier one. Returns once the bump is in effect,
    with the number of tasks whose priority was raised. Keys still on their
    way to the scheduler are waited for up to :data:`ARRIVAL_WAIT` seconds;
    any that have not arrived by then count once each and are raised when
    their graph arrives.
    """
    client = _resolve_client(obj, client)
    keys = _target_keys(obj, client)
    if not keys:
        return 0
    install(client)
    reply = client.sync(_scheduler_rpc(client).nbrewind_prioritize, keys=list(keys))
    return int(reply["bumped"]) + int(reply["deferred"])


def _scheduler_rpc(client: Client) -> Any:
    if client.asynchronous:
        raise TypeError("nbrewind priority bumps need a synchronous Client")
    if client.scheduler is None:
        raise ValueError("the client is not connected to a scheduler")
    return client.scheduler


def _resolve_client(obj: Any, client: Client | None) -> Client:
    if client is not None:
        return client
    from distributed import Future
    from distributed.client import default_client

    for item in _walk(obj):
        if isinstance(item, Future):
            return item.client
    return default_client()


def _walk(obj: Any) -> Iterator[Any]:
    """Yield the leaves of nested lists, tuples, sets and dict values."""
    if isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            yield from _walk(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _walk(item)
    else:
        yield obj


def _target_keys(obj: Any, client: Client) -> set[Hashable]:
    """The keys of ``obj`` that are (or sit behind) futures of ``client``."""
    import dask
    from distributed import Future

    keys: set[Hashable] = set()
    for item in _walk(obj):
        if isinstance(item, Future):
            keys.add(item.key)
        elif dask.is_dask_collection(item):
            keys |= _collection_future_keys(item, client)
        else:
            raise TypeError(f"cannot prioritize {type(item).__name__}: expected futures or Dask collections")
    return keys


def _collection_future_keys(collection: Any, client: Client) -> set[Hashable]:
    """Walk a collection's graph from its outputs down to the first futures on each path."""
    from dask.core import flatten, get_dependencies
    from dask.utils import ensure_dict
    from distributed import Future

    graph = ensure_dict(collection.__dask_graph__())
    found: set[Hashable] = set()
    seen: set[Hashable] = set()
    stack = list(flatten(collection.__dask_keys__()))
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        value = graph.get(key)
        if isinstance(value, Future):
            found.add(value.key)
        elif key in client.futures:
            found.add(key)
        elif value is not None:
            stack.extend(get_dependencies(graph, key))
    return found


# -- automatic bumps -------------------------------------------------------------

_auto_lock = threading.Lock()
_auto_clients: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_auto_patches: contextlib.ExitStack | None = None


def _bump_waited(client: Any, futures: Iterable[Any]) -> None:
    """Bump the pending ones of ``futures`` if auto-priority is on for ``client``.

    Called on every ``Future.result`` / ``Client.gather`` while patched, so it
    costs nothing unless something is pending, and a failure only logs: the
    caller still gets its result, just without the bump.
    """
    if client not in _auto_clients or getattr(client, "asynchronous", False):
        return
    pending = [f for f in futures if f.client is client and not f.done()]
    if not pending:
        return
    try:
        prioritize(pending, client)
    except Exception:  # noqa: BLE001 - a failed bump must not fail the user's request
        logger.warning("nbrewind: could not raise the priority of %d futures", len(pending), exc_info=True)


def _patch(stack: contextlib.ExitStack, owner: type, name: str, replacement: Any) -> None:
    """Set ``owner.name`` to ``replacement``; the stack restores the original exactly."""
    if name in vars(owner):
        stack.callback(setattr, owner, name, vars(owner)[name])
    else:
        stack.callback(delattr, owner, name)
    setattr(owner, name, replacement)


def _install_patches() -> contextlib.ExitStack:
    from distributed import Client, Future

    original_result = Future.result
    original_gather = Client.gather

    def result(self: Future, *args: Any, **kwargs: Any) -> Any:
        _bump_waited(self.client, [self])
        return original_result(self, *args, **kwargs)

    def gather(self: Client, futures: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("asynchronous"):
            _bump_waited(self, [f for f in _walk(futures) if isinstance(f, Future)])
        return original_gather(self, futures, *args, **kwargs)

    result.__doc__ = original_result.__doc__
    gather.__doc__ = original_gather.__doc__
    stack = contextlib.ExitStack()
    _patch(stack, Future, "result", result)
    _patch(stack, Client, "gather", gather)
    return stack


@contextlib.contextmanager
def enable_auto_priority(client: Client) -> Iterator[Client]:
    """Bump whatever ``client`` blocks on, for the duration of the ``with`` block.

    Inside it, ``Future.result()`` on a pending future of ``client`` and
    ``Client.gather`` of pending futures (which is how ``collection.compute()``
    waits, so computing a slice of a persisted collection bumps the persisted
    chunks it needs) call :func:`prioritize` first. The patches are on
    distributed's ``Future.result`` and ``Client.gather``; they are shared by all
    enabled clients, act only for those, and are removed when the last one exits.
    """
    install(client)
    global _auto_patches
    with _auto_lock:
        if _auto_patches is None:
            _auto_patches = _install_patches()
        _auto_clients[client] = _auto_clients.get(client, 0) + 1
    try:
        yield client
    finally:
        with _auto_lock:
            remaining = _auto_clients.get(client, 1) - 1
            if remaining:
                _auto_clients[client] = remaining
            else:
                _auto_clients.pop(client, None)
            if not _auto_clients and _auto_patches is not None:
                _auto_patches.close()
                _auto_patches = None
