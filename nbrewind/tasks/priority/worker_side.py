"""The worker half of a priority bump: re-sorting, and holding a thread for a chain.

The ``nbrewind-prioritize`` stream handler re-prioritizes the keys the scheduler
bumped and re-sorts the worker's heaps; while a *link* of a bumped chain runs
(and a short while after it finishes) the worker keeps a thread back for the
next link, which the scheduler sends a round trip later. The class docstring says
how and when a hold ends; ``scheduler_side`` says which tasks are links.

Its one class is the logic of ``plugins.PriorityWorkerPlugin``, which ``plugins``
builds on first use on distributed's ``WorkerPlugin``: the plugin is pickled by
reference to that name, so this class is never shipped on its own. Nothing here
imports dask at import time (one event class, when a kick runs).
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any

from nbrewind.tasks.priority.protocol import (
    HOLD_TIMEOUT,
    PLUGIN_NAME,
    WORKER_OP,
    follow_transitions,
    is_bumped,
    reheap,
    strip_bump,
)

__all__ = ["WorkerSide"]


class WorkerSide:
    """Worker half: the ``nbrewind-prioritize`` stream handler, and holding a thread
    for the next link of a bumped chain.

    The handler's messages arrive on the scheduler's batched stream, after the
    ``compute-task`` messages of the keys they name (so the worker knows them), and
    before the ``compute-task`` of a key they mark as a link (so it is known when the
    key starts).

    A *link* is a bumped task that bumped tasks depend on (a chunk that a slice of it
    waits for, the slice that dask's ``finalize`` waits for). When a link finishes,
    its dependent is still on the scheduler: it is sent once the scheduler has heard
    of the link's result, a round trip later. Meanwhile distributed's state machine
    would start the next ready task on the freed thread (with queuing on, the worker
    holds one beyond what it runs), and the dependent would wait for that task.
    So while a link runs, and while no bumped task is ready to take its thread, its
    thread is reserved: the worker's ``WorkerState.nthreads`` is lowered by one (the
    one value the state machine compares running tasks against, read nowhere else
    while the worker runs). The reservation ends, and ``nthreads`` is put back, when
    a bumped task arrives to take the thread, :data:`HOLD_TIMEOUT` seconds after the
    link finished, when the link fails, is cancelled or secedes, when a bumped task
    becomes ready meanwhile, and when the plugin is torn down (worker close). A task
    whose thread was kept back by a reservation it did not need (one on another
    thread finishing while a link runs) is started on the next turn of the loop.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.worker: Any = None
        #: Keys the scheduler marked as links that have not run here yet.
        self._links: set[Hashable] = set()
        #: Links running now, each with a thread reserved for what follows it.
        self._armed: set[Hashable] = set()
        #: Links that finished, each holding its thread for a bumped dependent until the timer.
        self._held: dict[Hashable, asyncio.TimerHandle] = {}
        #: The worker's own thread count (``nthreads`` without reservations).
        self._threads = 0
        #: True while a kick lets the running links' threads count as free for one pass.
        self._lifting = False
        self._kick_scheduled = False
        #: Holds that ended with a bumped task arriving, and those that timed out.
        self.holds_met = 0
        self.holds_timed_out = 0
        #: Seconds each of the last holds lasted (finish of the link to its release).
        self.hold_seconds: deque[float] = deque(maxlen=1000)
        self._held_since: dict[Hashable, float] = {}
        #: :data:`HOLD_TIMEOUT` for this worker; 0 switches holding off.
        self.hold_timeout = HOLD_TIMEOUT

    def setup(self, worker: Any) -> None:
        """Install the stream handler on a worker, and start importing what its first
        task of a rewritten graph will need (:func:`warm_task_modules`)."""
        self.worker = worker
        self._threads = worker.state.nthreads
        worker.stream_handlers[WORKER_OP] = self.handle_prioritize
        warm_task_modules()

    def teardown(self, worker: Any) -> None:
        """Remove the stream handler; end every reservation (``nthreads`` as it was)."""
        worker.stream_handlers.pop(WORKER_OP, None)
        for timer in self._held.values():
            timer.cancel()
        self._held.clear()
        self._held_since.clear()
        self._armed.clear()
        self._links.clear()
        self._lifting = False
        self._apply()

    def handle_prioritize(
        self,
        keys: list[Hashable],
        head: list[float],
        links: Iterable[Hashable] = (),
        release: Iterable[Hashable] = (),
        **kwargs: Any,
    ) -> None:
        """Re-prioritize ``keys`` (and dependencies still to fetch) and re-sort the heaps;
        mark ``links`` (keys with bumped dependents still to come); stop holding a thread
        for ``release`` (their dependent was cancelled, or went to another worker)."""
        state = self.worker.state
        for key in release:
            self._links.discard(key)
            self._unhold(key)
        if keys:
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
            if (self._armed or self._held) and self._bumped_ready():
                self._release_all()
        for key in links:
            ts = state.tasks.get(key)
            if self.hold_timeout <= 0:
                break
            if ts is not None and ts.state == "executing":
                self._arm(key)  # already running: the bump came late
            elif ts is None or ts.state not in ("memory", "error"):
                self._links.add(key)
        if len(self._links) > 2 * len(state.tasks) + 1000:  # marks for keys that never came
            self._links.intersection_update(state.tasks)
        self._watch()

    # -- reservations ------------------------------------------------------------

    def _watch(self) -> None:
        """Follow transitions while this worker has links, and only then (as the
        scheduler side does, see ``SchedulerSide._watch``)."""
        follow_transitions(self, "_follow", bool(self._links or self._armed or self._held))

    def _follow(self, key: Hashable, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Follow links through the worker's state machine (a transition hook, see :meth:`_watch`)."""
        try:
            self._step(key, start, finish)
        finally:
            self._watch()

    def _step(self, key: Hashable, start: str, finish: str) -> None:
        if finish == "executing":
            if key in self._links:
                self._links.discard(key)
                self._arm(key)
            return
        if start == "executing" or start == "long-running":
            if key in self._armed:
                self._armed.discard(key)
                if finish == "memory" and not self._bumped_ready():
                    self._hold(key)  # the thread stays reserved, now for the dependent
                else:
                    self._apply()
                    self._kick()
            elif self._armed:
                # A task on another thread finished while a link runs: the state machine
                # counted the link's reservation too and left this thread idle.
                self._kick()
        if finish == "waiting":
            if self._held:
                ts = self.worker.state.tasks.get(key)
                if ts is not None and is_bumped(ts.priority):
                    self._release_all(met=True)
        elif finish in ("ready", "constrained"):
            if self._armed:
                ts = self.worker.state.tasks.get(key)
                if ts is not None and is_bumped(ts.priority):
                    self._armed.clear()  # it takes the link's thread when the link ends
                    self._apply()
                # With several threads one may be idle: the state machine counted the
                # running links' reservations too when it did not start this task.
                self._kick()
        elif finish in ("memory", "error", "released", "forgotten"):
            self._links.discard(key)

    def _bumped_ready(self) -> bool:
        """Whether the task the worker would start next is a bumped one."""
        state = self.worker.state
        return any(heap and is_bumped(heap.peek().priority) for heap in (state.ready, state.constrained))

    def _arm(self, key: Hashable) -> None:
        if self.hold_timeout <= 0 or self._bumped_ready():
            return  # that task takes the thread when the link ends
        self._armed.add(key)
        self._apply()

    def _hold(self, key: Hashable) -> None:
        loop = asyncio.get_running_loop()
        self._held[key] = loop.call_later(self.hold_timeout, self._timed_out, key)
        self._held_since[key] = time.monotonic()
        self._apply()

    def _timed_out(self, key: Hashable) -> None:
        if self._held.pop(key, None) is not None:
            self.holds_timed_out += 1
            self.hold_seconds.append(time.monotonic() - self._held_since.pop(key))
            self._apply()
            self._kick()

    def _unhold(self, key: Hashable) -> None:
        timer = self._held.pop(key, None)
        if timer is not None:
            timer.cancel()
            self.hold_seconds.append(time.monotonic() - self._held_since.pop(key))
        elif key in self._armed:
            self._armed.discard(key)
        else:
            return
        self._apply()
        self._kick()

    def _release_all(self, met: bool = False) -> None:
        now = time.monotonic()
        for key, timer in self._held.items():
            timer.cancel()
            self.hold_seconds.append(now - self._held_since.pop(key))
            self.holds_met += met
        self._held.clear()
        self._armed.clear()
        self._apply()
        self._kick()

    def _apply(self) -> None:
        """Set the state machine's thread count to the worker's threads less the reservations."""
        if self.worker is None:
            return
        reserved = len(self._held) + (0 if self._lifting else len(self._armed))
        self.worker.state.nthreads = max(self._threads - reserved, 0)
        self._watch()

    def _kick(self) -> None:
        """On the next turn of the loop, start what the free threads can take."""
        if not self._kick_scheduled:
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._run_kick)

    def _run_kick(self) -> None:
        self._kick_scheduled = False
        worker = self.worker
        if worker is None or worker.status.name != "running" or not worker.state.running:
            return  # paused or closing: unpausing runs the same pass
        from distributed.worker_state_machine import UnpauseEvent

        # Running links hold their thread by counting twice (running, and reserved):
        # for this pass only the reservation of finished links counts.
        self._lifting = True
        self._apply()
        try:
            # The state machine's one event that only starts what it can (its flag
            # "running" is already true, or this would not run).
            worker.handle_stimulus(UnpauseEvent(stimulus_id=f"nbrewind-priority-hold-{time.time()}"))
        finally:
            self._lifting = False
            self._apply()


#: What a task of a rewritten graph imports on a worker: the task cache's runner and store
#: (through ``resume``) and jupyter_core's paths (the signing secret's folder).
TASK_MODULES = ("nbrewind.tasks.resume", "jupyter_core.paths")


def warm_task_modules() -> None:
    """Import :data:`TASK_MODULES` in a daemon thread, while the worker waits for work.

    The first task of a rewritten graph would otherwise import them itself (about 70 ms
    per worker process, on every worker at once). A task that starts before the thread is
    done waits only for the rest (the import lock of each module)."""
    threading.Thread(target=_import_task_modules, name="nbrewind-warm-imports", daemon=True).start()


def _import_task_modules() -> None:
    for name in TASK_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # the task that needs it will meet the same error and report it
            return
