"""The scheduler and worker halves of a task update, as distributed plugins.

The scheduler half keeps, for every task that sent an update (or whose arguments
name keys through :class:`~nbrewind.tasks.update.task.KeyHandle`), a *hold*: a
pseudo-client of the scheduler, ``nbrewind-update-<key>``, that wants the keys
the task still needs but does not receive as arguments. A held key is kept in
memory, or recomputed if it is lost, exactly as if a client held a future for it;
releasing it from the hold lets the scheduler release it only when nobody else
(another task waiting on it, a client, another hold) still needs it.

An update is applied by one synchronous handler, so it is either applied whole
or not at all, and only while the sending attempt is still the one the scheduler
runs. The replacement becomes the task's ``run_spec`` at once and its key
references become dependencies of the task at once, so whatever sends the task
back to ``released`` (a lost worker, a lost input, a reschedule) runs the
replacement next, waiting for its dependencies as for any task.

The plugin classes subclass distributed's plugin bases, so they are built on first
use (see :func:`__getattr__`) to keep importing this module free of any dask import.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nbrewind.errors import NbrewindError
from nbrewind.tasks.plugin_classes import lazy_plugin_classes

PLUGIN_NAME = "nbrewind-update"
#: RPC operation the scheduler plugin adds to ``Scheduler.handlers``.
SCHEDULER_OP = "nbrewind_update_task"
#: RPC operation answering which of some keys the scheduler knows, and their states.
STATES_OP = "nbrewind_update_states"
HOLD_PREFIX = "nbrewind-update-"

logger = logging.getLogger(__name__)

Key = Any  # a Dask key: str, bytes, int, float, or a tuple of keys


class UpdateError(NbrewindError, ValueError):
    """An invalid update, or one made where no update can be; the message names the problem and what to do."""


class StaleUpdate(UpdateError):
    """This attempt of the task is no longer the one the scheduler runs; nothing was applied."""


def hold_name(key: Key) -> str:
    """The scheduler pseudo-client holding the keys task ``key`` still needs."""
    return f"{HOLD_PREFIX}{key!r}"


def scan_handles(obj: Any, depth: int = 3) -> set[Key]:
    """Keys named by :class:`KeyHandle` objects in ``obj`` (containers up to ``depth`` deep)."""
    from nbrewind.tasks.update.task import KeyHandle

    found: set[Key] = set()
    stack = [(obj, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, KeyHandle):
            found.add(item.key)
        elif level and isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((x, level - 1) for x in item)
        elif level and isinstance(item, dict):
            stack.extend((x, level - 1) for x in item.values())
        elif level and hasattr(item, "args") and hasattr(item, "kwargs") and hasattr(item, "func"):
            # a dask Task, or a container node wrapping the arguments
            stack.extend((x, level - 1) for x in item.args)
            stack.extend((x, level - 1) for x in item.kwargs.values())
    return found


@dataclass
class _Record:
    """What the scheduler half knows about one updated task."""

    held: set[Key] = field(default_factory=set)
    handles: frozenset[Key] = frozenset()
    """Keys the current run_spec names through handles (fetched, not received)."""
    updates: int = 0


class _SchedulerSide:
    """Scheduler half: the update handler, holds, and their lifetime."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.records: dict[Key, _Record] = {}

    async def start(self, scheduler: Any) -> None:
        """Install the RPC handlers when the plugin is added to a scheduler."""
        self.scheduler = scheduler
        scheduler.handlers[SCHEDULER_OP] = self.handle_update
        scheduler.handlers[STATES_OP] = self.handle_states

    async def close(self) -> None:
        """Remove the RPC handlers when the scheduler closes."""
        if self.scheduler is not None:
            self.scheduler.handlers.pop(SCHEDULER_OP, None)
            self.scheduler.handlers.pop(STATES_OP, None)

    # -- holds ------------------------------------------------------------------------------------

    def _hold(self, key: Key, rec: _Record, keys: Iterable[Key], stimulus_id: str) -> None:
        """Make the hold of ``key`` want ``keys``; start computing any that sit released."""
        new = [k for k in keys if k not in rec.held and k in self.scheduler.tasks]
        if not new:
            return
        self.scheduler.client_desires_keys(keys=new, client=hold_name(key))
        rec.held.update(new)
        recs = {k: "waiting" for k in new if self.scheduler.tasks[k].state == "released"
                and self.scheduler.tasks[k].run_spec is not None}
        if recs:
            self.scheduler.transitions(recs, stimulus_id)

    def _unhold(self, key: Key, rec: _Record, keys: Iterable[Key], stimulus_id: str) -> None:
        gone = [k for k in keys if k in rec.held]
        if not gone:
            return
        rec.held.difference_update(gone)
        name = hold_name(key)
        if name in self.scheduler.clients:
            self.scheduler.client_releases_keys(keys=gone, client=name, stimulus_id=stimulus_id)

    def _drop(self, key: Key, keep: frozenset[Key] = frozenset()) -> None:
        """Release everything the hold of ``key`` wants except ``keep`` (after a transition)."""
        rec = self.records.get(key)
        if rec is None:
            return
        stimulus_id = f"nbrewind-update-drop-{time.time()}"
        self._unhold(key, rec, set(rec.held) - keep, stimulus_id)
        if not rec.held:
            del self.records[key]
            cs = self.scheduler.clients.get(hold_name(key))
            if cs is not None and not cs.wants_what:
                del self.scheduler.clients[hold_name(key)]

    # -- scheduler hooks --------------------------------------------------------------------------

    def update_graph(self, scheduler: Any, *, tasks: Iterable[Key] = (), stimulus_id: str = "",
                     **kwargs: Any) -> None:
        """Hold the keys that new tasks name through handles, before anything is scheduled.

        Called before the graph's transitions, so a client may drop its futures for
        those keys right after submitting: the hold already wants them.
        """
        from nbrewind.tasks.update import task as task_module

        if not task_module.handles_seen():
            return
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.run_spec is None:
                continue
            keys = scan_handles(ts.run_spec)
            if keys:
                rec = self.records.setdefault(key, _Record())
                rec.handles = frozenset(keys)
                self._hold(key, rec, keys, stimulus_id or f"nbrewind-update-graph-{time.time()}")

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Shrink or drop a task's hold once it finished, failed or was forgotten.

        Deferred to the event loop: releasing keys starts transitions of its own,
        which must not run inside the scheduler's current transition loop.
        """
        rec = self.records.get(key)
        if rec is None:
            return
        if finish == "memory":
            # What a rerun of the current run_spec would fetch stays held; its
            # references are dependencies of the task, recomputable on their own.
            asyncio.get_running_loop().call_soon(self._drop, key, rec.handles)
        elif finish in ("erred", "forgotten"):
            asyncio.get_running_loop().call_soon(self._drop, key)

    def restart(self, scheduler: Any) -> None:
        """Forget every hold: a restart forgets every task (it released the holds' keys already)."""
        for key in self.records:
            cs = scheduler.clients.get(hold_name(key))
            if cs is not None and not cs.wants_what:
                del scheduler.clients[hold_name(key)]
        self.records.clear()

    # -- RPC handlers -----------------------------------------------------------------------------

    def handle_states(self, keys: list[Key], client: str | None = None) -> dict[str, Any]:
        """The scheduler state of each of ``keys`` (None when unknown); ``client`` then wants the known ones.

        A task fetching a key makes a future for it on its worker's client; the
        client learns that the key is in memory once the scheduler knows it wants it.
        """
        tasks = self.scheduler.tasks
        known = [k for k in keys if k in tasks]
        if client is not None and known and client in self.scheduler.clients:
            self.scheduler.client_desires_keys(keys=known, client=client)
        return {"states": [tasks[k].state if k in tasks else None for k in keys]}

    def handle_update(self, *, key: Key, worker: str, run_id: int | None, publish: dict[Key, dict[str, Any]],
                      depends_on: list[Key], release: list[Key], replacement: bytes | None,
                      refs: list[Key], handles: list[Key]) -> dict[str, Any]:
        """Apply one update from the running task ``key`` on ``worker``, whole or not at all.

        Replies ``{"status": "OK"}``, ``{"status": "stale", "message": ...}`` when the
        sender is no longer the attempt the scheduler runs (nothing is applied), or
        ``{"status": "error", "message": ...}`` for an invalid update (nothing applied).
        """
        s = self.scheduler
        ts = s.tasks.get(key)
        if (ts is None or ts.state != "processing" or ts.processing_on is None
                or ts.processing_on.address != worker or worker not in s.workers
                or (run_id is not None and ts.run_id != run_id)):
            state = None if ts is None else ts.state
            return {"status": "stale", "message": f"task {key!r} is not running on {worker} any more "
                    f"(scheduler state: {state}); this attempt's update was ignored"}
        try:
            replacement_task, piece_specs = self._validate(ts, publish, depends_on, release, replacement, refs,
                                                           handles)
        except UpdateError as exc:
            return {"status": "error", "message": str(exc)}
        stimulus_id = f"nbrewind-update-{time.time()}"
        rec = self.records.setdefault(key, _Record())
        rec.updates += 1
        ws = s.workers[worker]
        for piece, info in publish.items():
            pts = s.new_task(piece, piece_specs[piece], "memory")
            pts.set_nbytes(info["nbytes"])
            pts.priority = ts.priority
            s.add_replica(pts, ws)
        spans = s.extensions.get("spans")
        if spans is not None and publish:
            # A piece recomputed after a loss reports metrics under its group's span.
            spans.observe_tasks([s.tasks[k] for k in publish], code=(), span_metadata={})
        self._hold(key, rec, [*depends_on, *publish, *handles], stimulus_id)
        if replacement_task is not None:
            ts.run_spec = replacement_task
            rec.handles = frozenset(handles)
            for ref in refs:
                dts = s.tasks[ref]
                if dts not in ts.dependencies:
                    ts.add_dependency(dts)
                    if dts.waiters is None:
                        dts.waiters = set()
                    dts.waiters.add(ts)
        recs: dict[Key, str] = {}
        for k in release:
            dts = s.tasks[k]
            if dts in ts.dependencies:
                ts.dependencies.discard(dts)
                dts.dependents.discard(ts)
                if dts.waiters:
                    dts.waiters.discard(ts)
                if not dts.who_wants and not dts.waiters and k not in rec.held:
                    recs[k] = "forgotten" if not dts.dependents else "released"
        if recs:
            s.transitions(recs, stimulus_id)
        self._unhold(key, rec, release, stimulus_id)
        return {"status": "OK"}

    def _validate(self, ts: Any, publish: dict[Key, dict[str, Any]], depends_on: list[Key], release: list[Key],
                  replacement: bytes | None, refs: list[Key], handles: list[Key]) -> tuple[Any, dict[Key, Any]]:
        """Check an update against the scheduler's state; return the unpickled replacement and pieces."""
        tasks = self.scheduler.tasks
        rec = self.records.get(ts.key) or _Record()
        deps = {d.key for d in ts.dependencies}
        for k in publish:
            if k in tasks:
                raise UpdateError(f"cannot publish {k!r}: the scheduler already has a key of that name; "
                                  "publish each piece under a new key (e.g. add a counter)")
        for k in (*depends_on, *release):
            if k not in tasks:
                raise UpdateError(f"unknown key {k!r}: the scheduler has no such key (submitted yet? "
                                  "released by everyone already?)")
        for k in release:
            if k not in deps and k not in rec.held and k not in depends_on:
                raise UpdateError(f"cannot release {k!r}: it is neither a dependency of task {ts.key!r} nor a "
                                  "key it holds (depends_on, publish or a handle in its arguments)")
        available = (deps | rec.held | set(depends_on) | set(publish)) - set(release)
        task = None
        if replacement is not None:
            try:
                task = pickle.loads(replacement)
            except Exception as exc:
                raise UpdateError(f"the scheduler cannot unpickle the replacement ({type(exc).__name__}: {exc}); "
                                  "its function must be importable on the scheduler, or defined in __main__ "
                                  "or a notebook so that it travels by value") from exc
            for k in refs:
                if k not in available:
                    raise UpdateError(f"the replacement references {k!r}, which task {ts.key!r} neither "
                                      "depends on nor holds: add it to depends_on (or publish it)")
                if k not in publish and not tasks[k].who_has:
                    raise UpdateError(f"the replacement references {k!r}, which is not in memory yet: pass "
                                      f"handle({k!r}) instead and fetch it inside the replacement")
            for k in handles:
                if k not in available and k not in tasks:
                    raise UpdateError(f"the replacement names handle({k!r}), an unknown key")
        else:
            needed = set(ts.run_spec.dependencies) | rec.handles if ts.run_spec is not None else rec.handles
            clash = needed & set(release)
            if clash:
                raise UpdateError(f"cannot release {sorted(map(repr, clash))}: task {ts.key!r} would need them "
                                  "if it ran again; pass a replacement that does not use them")
        try:
            piece_specs = {k: pickle.loads(info["run_spec"]) for k, info in publish.items()}
        except Exception as exc:
            raise UpdateError(f"the scheduler cannot unpickle a published piece's task ({exc})") from exc
        return task, piece_specs


class _WorkerSide:
    """Worker half: sends a running task's update and keeps its published pieces consistent.

    Pieces enter the worker's memory first (without telling the scheduler, like
    scattered data), then the update goes to the scheduler; if the scheduler
    refuses it, the pieces are freed again, so the worker never keeps data the
    scheduler does not know about.
    """

    name = PLUGIN_NAME
    # Registering again (another store) replaces the plugin on every worker.
    idempotent = False

    def __init__(self, store: str | None = None) -> None:
        self.store = store
        self.worker: Any = None

    def setup(self, worker: Any) -> None:
        """Remember the worker (tasks find this plugin through ``worker.plugins``)."""
        self.worker = worker

    def teardown(self, worker: Any) -> None:
        """Nothing to undo: the plugin installs no handlers on the worker."""
        self.worker = None

    async def send(self, key: Key, pieces: dict[Key, tuple[Any, Any]], message: dict[str, Any]) -> dict[str, Any]:
        """Put ``pieces`` (key -> (value, run_spec)) in memory here and send the update."""
        from distributed.worker_state_machine import FreeKeysEvent

        worker = self.worker
        for piece in pieces:
            if piece in worker.state.tasks:
                return {"status": "error", "message": f"cannot publish {piece!r}: the scheduler already has a key "
                        "of that name; publish each piece under a new key (e.g. add a counter)"}
        wts = worker.state.tasks.get(key)
        run_id = getattr(wts, "run_id", None)
        nbytes: dict[Key, int] = {}
        if pieces:
            reply = worker.update_data(data={k: v for k, (v, _) in pieces.items()},
                                       stimulus_id=f"nbrewind-update-{time.time()}")
            nbytes = reply["nbytes"]
        publish = {k: {"nbytes": nbytes[k], "run_spec": spec} for k, (_, spec) in pieces.items()}
        try:
            response: dict[str, Any] = await worker.scheduler.nbrewind_update_task(
                key=key, worker=worker.address, run_id=run_id, publish=publish, **message)
        except BaseException:
            if pieces:
                worker.handle_stimulus(FreeKeysEvent(keys=list(pieces), stimulus_id=f"nbrewind-update-{time.time()}"))
            raise
        if response.get("status") != "OK" and pieces:
            worker.handle_stimulus(FreeKeysEvent(keys=list(pieces), stimulus_id=f"nbrewind-update-{time.time()}"))
        return response


# Module attributes UpdateSchedulerPlugin and UpdateWorkerPlugin, built on first access.
__getattr__ = lazy_plugin_classes(__name__, ("UpdateSchedulerPlugin", _SchedulerSide), ("UpdateWorkerPlugin", _WorkerSide))


def plugin_class(name: str) -> type:
    """The plugin class ``name`` (``UpdateSchedulerPlugin`` or ``UpdateWorkerPlugin``)."""
    return __getattr__(name)
