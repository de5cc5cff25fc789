"""The scheduler half of a priority bump: the ``nbrewind_prioritize`` handler.

It raises the requested keys and every unfinished task they wait on (``bump``),
re-sorts the scheduler's queue and hands the first bumped queued tasks to workers
at once (``send_ahead``), tells the workers already running some of them to
re-sort theirs, remembers keys whose graph has not arrived yet (``update_graph``
bumps them when it does), and follows the links of bumped chains so that a
worker holds a thread for the next link (the worker's part is ``worker_side``).

Its one class is the logic of ``plugins.PrioritySchedulerPlugin``, which
``plugins`` builds on first use on distributed's ``SchedulerPlugin``: the
plugin is pickled by reference to that name, so this class is never shipped on
its own. Nothing here imports dask.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import Any

from nbrewind.tasks.priority.protocol import (
    ACTIVE_STATES,
    ARRIVAL_WAIT,
    BUMPABLE_STATES,
    PENDING_TTL,
    PLUGIN_NAME,
    SCHEDULER_OP,
    WORKER_OP,
    Priority,
    bump_head,
    follow_transitions,
    reheap,
    strip_bump,
)

__all__ = ["SchedulerSide"]

#: Scheduler states a follower goes to that end a hold for it (it is on its way to a
#: worker, or will never be).
_LEFT = frozenset({"processing", "memory", "erred", "released", "forgotten"})


class SchedulerSide:
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
        #: Bumped tasks, not done yet, that bumped tasks depend on (links of a chain).
        self._links: set[Hashable] = set()
        #: Bumped tasks, not sent to a worker yet, that depend on links.
        self._followers: set[Hashable] = set()

    async def start(self, scheduler: Any) -> None:
        """Install the RPC handler when the plugin is added to a scheduler."""
        self.scheduler = scheduler
        scheduler.handlers[SCHEDULER_OP] = self.handle_prioritize

    async def close(self) -> None:
        """Remove the RPC handler when the scheduler closes."""
        if self.scheduler is not None:
            self.scheduler.handlers.pop(SCHEDULER_OP, None)
        self._links.clear()
        self._followers.clear()
        self._watch()

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
        chosen_ids = {id(ts) for ts in chosen}
        for ts in chosen:
            ts.priority = head + strip_bump(ts.priority)
            # Links: tasks of this bump depend on them (see worker_side); followers: they
            # depend on tasks of this bump.
            if any(id(dts) in chosen_ids for dts in ts.dependents):
                self._links.add(ts.key)
            if any(id(dts) in chosen_ids for dts in ts.dependencies):
                self._followers.add(ts.key)
            if ts.state == "queued":
                queued.append(ts)
            elif ts.state == "processing" and ts.processing_on is not None:
                by_worker[ts.processing_on.address].append(ts.key)
        links_by_worker: defaultdict[str, list[Hashable]] = defaultdict(list)
        for address, keys in by_worker.items():
            links_by_worker[address] = [key for key in keys if key in self._links and self._leads_on(self.scheduler.tasks[key])]
        self._watch()
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
                    address: [{"op": WORKER_OP, "keys": keys, "head": list(head), "links": links_by_worker.get(address, [])}]
                    for address, keys in by_worker.items()
                },
            )
        return len(chosen)

    def _watch(self) -> None:
        """Follow transitions while there are links or followers, and only then.

        distributed calls every plugin's ``transition`` on every transition; while no
        bumped chain is outstanding this plugin has none of its own (the instance
        attribute is removed, so the base class's empty one is called), so it costs
        exactly what any plugin costs.
        """
        follow_transitions(self, "_follow", bool(self._links or self._followers))

    def _follow(self, key: Hashable, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Follow the links of bumped chains (a scheduler transition hook, see :meth:`_watch`).

        A link going to a worker: tell that worker it is one. The message goes onto the
        worker's batched stream from inside the transition, so it is ahead of the link's
        own ``compute-task``, which the scheduler sends once its transitions are done.
        A follower (a task that links lead to) going to a worker other than the one
        holding its link's result, or dropped (cancelled, failed): tell the workers
        holding a thread for it to stop. Links and followers are forgotten once they
        are done with.
        """
        if key in self._followers and finish in _LEFT:
            self._followers.discard(key)
            self._follower_left(key, finish)
        if key in self._links:
            if finish == "processing":
                ts = self.scheduler.tasks.get(key)
                if ts is not None and ts.processing_on is not None and self._leads_on(ts):
                    self._send(ts.processing_on.address, {"links": [key]})
            elif finish in ("memory", "erred", "forgotten", "released"):
                self._links.discard(key)
                if finish == "memory":
                    self._now_last(key)
        self._watch()

    def _leads_on(self, ts: Any) -> bool:
        """Whether, once link ``ts`` is done, a follower of it can run at once where it
        runs: all the follower waits on besides ``ts`` runs on the same worker (a chain,
        or a reduction whose inputs are all there). A follower also waiting on another
        worker is not worth holding a thread for; :meth:`_now_last` catches the moment it
        comes to wait on ``ts`` alone."""
        ws = ts.processing_on
        followers = self._followers
        return any(
            dts.key in followers and all(w is ts or w.processing_on is ws for w in dts.waiting_on or ())
            for dts in ts.dependents
        )

    def _now_last(self, key: Hashable) -> None:
        """Link ``key`` is done: tell the worker of the link its followers now wait on alone."""
        ts = self.scheduler.tasks.get(key)
        if ts is None:
            return
        for dts in ts.dependents:
            if dts.key in self._followers and dts.waiting_on is not None and len(dts.waiting_on) == 1:
                (last,) = dts.waiting_on
                if last.key in self._links and last.state == "processing" and last.processing_on is not None:
                    self._send(last.processing_on.address, {"links": [last.key]})

    def _follower_left(self, key: Hashable, finish: str) -> None:
        """Release holds for ``key``, unless it went to processing where they are."""
        ts = self.scheduler.tasks.get(key)
        if ts is None:
            return
        going_to = ts.processing_on.address if finish == "processing" and ts.processing_on is not None else None
        release: defaultdict[str, list[Hashable]] = defaultdict(list)
        for dts in ts.dependencies:
            if finish != "processing":
                self._links.discard(dts.key)
            where = {ws.address for ws in dts.who_has or ()}
            if dts.processing_on is not None:
                where.add(dts.processing_on.address)
            for address in where - {going_to}:
                release[address].append(dts.key)
        for address, keys in release.items():
            self._send(address, {"release": keys})

    def _send(self, address: str, fields: dict[str, Any]) -> None:
        stream = self.scheduler.stream_comms.get(address)
        if stream is not None:
            stream.send({"op": WORKER_OP, "keys": [], "head": [], **fields})

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
