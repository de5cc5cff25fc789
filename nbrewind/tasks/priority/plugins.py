"""The scheduler and worker halves of a priority bump, as distributed plugins.

Their classes subclass distributed's plugin bases, so they are built on first use
(see :func:`__getattr__`) to keep importing this module free of any dask import.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import Any

from nbrewind.tasks.plugin_classes import lazy_plugin_classes

PLUGIN_NAME = "nbrewind-priority"
#: RPC operation the scheduler plugin adds to ``Scheduler.handlers``.
SCHEDULER_OP = "nbrewind_prioritize"
#: Stream operation the worker plugin adds to ``Worker.stream_handlers``.
WORKER_OP = "nbrewind-prioritize"
#: Scheduler states in which a task still has work ahead of it.
BUMPABLE_STATES = frozenset({"released", "waiting", "queued", "no-worker", "processing"})
#: Scheduler states of tasks that will run without anything else being asked for.
ACTIVE_STATES = ("waiting", "queued", "no-worker", "processing")
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
        self._auto_heads: set[Priority] = set()
        #: Keys of the graph update_graph is handling: released now, about to run.
        self._arriving: set[Hashable] = set()
        #: Automatic bump requests received, and bumps of theirs that changed nothing
        #: because nothing else was going to run (a wait for a whole computation).
        self.auto_requests = 0
        self.auto_noops = 0
        #: Seconds the scheduler spent deciding and applying automatic bumps.
        self.auto_seconds = 0.0

    async def start(self, scheduler: Any) -> None:
        """Install the RPC handler when the plugin is added to a scheduler."""
        self.scheduler = scheduler
        scheduler.handlers[SCHEDULER_OP] = self.handle_prioritize

    async def close(self) -> None:
        """Remove the RPC handler when the scheduler closes."""
        if self.scheduler is not None:
            self.scheduler.handlers.pop(SCHEDULER_OP, None)

    async def handle_prioritize(self, keys: list[Hashable], auto: bool = False) -> dict[str, int]:
        """Bump ``keys`` and what they wait on; reply with how many tasks changed.

        ``deferred`` counts keys still unknown after :data:`ARRIVAL_WAIT`; they
        stay marked and are bumped if their graph arrives within :data:`PENDING_TTL`.
        An ``auto`` bump (sent by a client that does not wait for the reply) does
        not wait for unknown keys, and changes nothing when it would raise every
        task that is going to run anyway (see :meth:`bump`).
        """
        self._sequence += 1
        self.auto_requests += auto
        head = bump_head(self._sequence)
        now = time.monotonic()
        self._pending = {k: v for k, v in self._pending.items() if v[1] > now}
        self._auto_heads.intersection_update(v[0] for v in self._pending.values())
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
        bumped = self.bump(roots, head, only_if_useful=auto)
        if unknown and auto:
            self._auto_heads.add(head)
            return {"bumped": bumped, "deferred": len(unknown)}
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
        self._arriving = set(kwargs.get("tasks") or ())
        groups: defaultdict[Priority, list[Any]] = defaultdict(list)
        for key in list(self._pending):
            ts = scheduler.tasks.get(key)
            if ts is not None and ts.priority is not None:
                groups[self._pending.pop(key)[0]].append(ts)
        # Oldest bump first, so that a later bump overrides it where they overlap.
        for head in sorted(groups, reverse=True):
            count = self.bump(groups[head], head, only_if_useful=head in self._auto_heads)
            if head in self._late_counts:
                self._late_counts[head] += count
        self._arriving = set()
        if groups and self._arrived is not None:
            self._arrived.set()
            self._arrived = None

    def bump(self, roots: Iterable[Any], head: Priority, *, only_if_useful: bool = False) -> int:
        """Give ``roots`` and their unfinished dependencies the priority prefix ``head``.

        Returns the number of tasks changed. Queued tasks are re-sorted; workers
        processing any of them are told through their stream. With
        ``only_if_useful``, nothing changes (and 0 is returned) when no task
        outside the bumped ones is waiting, queued or processing: then the bump
        could overtake nothing, which is the case of waiting for a whole
        computation, and re-sorting queues for it would be wasted work.
        """
        started = time.perf_counter() if only_if_useful else 0.0
        try:
            return self._bump(roots, head, only_if_useful)
        finally:
            if only_if_useful:
                self.auto_seconds += time.perf_counter() - started

    def _bump(self, roots: Iterable[Any], head: Priority, only_if_useful: bool) -> int:
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
        if only_if_useful and chosen and not self._others_active(chosen):
            self.auto_noops += 1
            return 0
        queued = []
        by_worker: defaultdict[str, list[Hashable]] = defaultdict(list)
        for ts in chosen:
            ts.priority = head + strip_bump(ts.priority)
            if ts.state == "queued":
                queued.append(ts)
            elif ts.state == "processing" and ts.processing_on is not None:
                by_worker[ts.processing_on.address].append(ts.key)
        if queued:
            reheap(self.scheduler.queued)
        if self._arriving:  # inside update_graph: the new tasks are queued once it is done
            asyncio.get_running_loop().call_soon(self.send_ahead, chosen)
        elif queued:
            self.send_ahead(queued)
        if by_worker:
            self.scheduler.send_all(
                {},
                {
                    address: [{"op": WORKER_OP, "keys": keys, "head": list(head)}]
                    for address, keys in by_worker.items()
                },
            )
        return len(chosen)

    def send_ahead(self, tasks: list[Any]) -> None:
        """Hand queued bumped tasks to workers now: per bump, at most one per thread
        beyond what the workers already hold.

        With queuing on, each worker already holds its saturation's worth of tasks
        (two on one thread at distributed's default 1.1), and runs those before any
        task sent to it later. Sent now, a bumped task sorts first in the worker's
        ready queue (a later bump before an earlier one) and runs as soon as a thread
        frees. The scheduler's own queued -> processing transition places them, on
        the least busy workers, under a saturation raised for the duration of the call.
        """
        scheduler = self.scheduler
        saturation = scheduler.WORKER_SATURATION
        workers = list(scheduler.running)
        if math.isinf(saturation) or not workers:
            return
        limit = sum(ws.nthreads for ws in workers)
        ahead = sorted((ts for ts in tasks if ts.state == "queued"), key=lambda ts: ts.priority)[:limit]
        if not ahead:
            return
        stimulus_id = f"nbrewind-priority-{time.time()}"
        scheduler.WORKER_SATURATION = max(saturation, *(len(ws.processing) / max(ws.nthreads, 1) for ws in workers)) + 1.0
        try:
            for ws in workers:
                scheduler.check_idle_saturated(ws)
            for ts in ahead:
                if ts.state == "queued":
                    scheduler.transitions({ts.key: "processing"}, stimulus_id)
        finally:
            scheduler.WORKER_SATURATION = saturation
            for ws in workers:
                scheduler.check_idle_saturated(ws)

    def _others_active(self, chosen: list[Any]) -> bool:
        """Whether some task not in ``chosen`` is going to run: waiting, queued, without
        a worker, processing, or arriving in the graph being added right now."""
        arriving = self._arriving
        mine = sum(1 for ts in chosen if ts.state != "released" or ts.key in arriving)
        total = sum(tg.states[state] for tg in self.scheduler.task_groups.values() for state in ACTIVE_STATES)
        if arriving:
            tasks = self.scheduler.tasks
            total += sum(1 for key in arriving if (ts := tasks.get(key)) is not None and ts.state == "released")
        return bool(total > mine)


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


# Module attributes PrioritySchedulerPlugin and PriorityWorkerPlugin, built on first access.
__getattr__ = lazy_plugin_classes(__name__, ("PrioritySchedulerPlugin", _SchedulerSide), ("PriorityWorkerPlugin", _WorkerSide))


def plugin_class(name: str) -> type:
    """The plugin class ``name`` (``PrioritySchedulerPlugin`` or ``PriorityWorkerPlugin``)."""
    return __getattr__(name)
