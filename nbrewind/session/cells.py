"""One request's life in a session: decide, start recording, record or replay, and say so.

`Cells.begin` asks the keys whether a request replays or runs and, for one that runs,
brings back what replays left pending and starts recording; `finish` records a cell
that ran and queues its record; `replay` binds and re-sends a matched run.  What was
decided for each request is kept for its reply's ``metadata.nbrewind`` (`outcome`).
The Session owns the parts this uses and hands every execute request here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nbrewind.checkpoint.outputs import OutputCapture
from nbrewind.session import outcome, policy
from nbrewind.session.clients import may_need_client
from nbrewind.session.commit import Committer
from nbrewind.session.notices import Notices
from nbrewind.session.parts import StoreHandle
from nbrewind.session.plan import CellPlan, LastCell
from nbrewind.session.writer import BackgroundWriter
from nbrewind.store import CellRun, TaskLogEntry

__all__ = ["Cells"]


class Cells:
    """The decisions on each execute request of one kernel, and what came of them."""

    def __init__(
        self,
        handle: StoreHandle,
        *,
        ready: Callable[[], bool],
        namespace: Callable[[], dict[str, Any]],
        capture: OutputCapture,
        channel: Notices,
        committer: Committer,
        writer: BackgroundWriter,
        unrecordable: list[str],
    ) -> None:
        self._handle = handle
        self._ready = ready
        self._namespace = namespace
        self._capture = capture
        self._channel = channel
        self._committer = committer
        self._writer = writer
        self.unrecordable = unrecordable
        self.last: LastCell | None = None
        self._outcome: tuple[str | None, dict[str, Any]] | None = None

    # -- before a cell ------------------------------------------------------------

    def begin(
        self, code: str, *, silent: bool = False, store_history: bool = True, cell_id: str | None = None, msg_id: str | None = None
    ) -> CellPlan:
        """Analyse the request and decide: replay it, or run and record it."""
        opened = self._handle.opened()
        if opened is not None:
            opened.restorer.take_brought_back()  # what this request brings back is its own
        if not silent:
            self._channel.new_request()
            self.unrecordable.clear()  # cleared, not replaced: the Restorer appends to this list
            self._outcome = (msg_id, outcome.not_recorded("the cell ran as on a plain kernel"))
        if silent:
            return CellPlan(record=False)  # a frontend's own request: replays' pending state waits for the next cell
        if not store_history:
            self._outcome = (msg_id, outcome.not_recorded("store_history is off for this request"))
            return self._unrecorded()
        if not self._ready():
            self._outcome = (msg_id, outcome.not_recorded("recording is off for this kernel (the kernel log says why)"))
            return self._unrecorded()
        state = self._handle.parts().state
        for name in self._committer.take_lost():
            state.entries.pop(name, None)
            state.forget(name)
        self._channel.report_write_failures(self._writer)
        try:
            plan = self._handle.parts().keys.plan(code, cell_id, msg_id)
        except Exception as exc:
            self._channel.warn("could not analyse the cell; it is not recorded", exc)
            self._outcome = (msg_id, outcome.not_recorded(f"NBRewind could not analyse the cell ({type(exc).__name__})"))
            return CellPlan(record=False)
        effects = plan.effects
        plan_binds = None if effects is None or effects.dynamic else effects.writes | effects.deferred_writes | effects.deletes
        self._handle.parts().restorer.output_history.binds(plan_binds)
        if effects is not None:
            self._handle.parts().outside.imports.note(plan.transformed or plan.code, effects.writes)
        if plan.replay:
            return plan
        try:
            self._start_run(plan)
        except Exception as exc:
            self._channel.warn("could not start recording the cell", exc)
            self._outcome = (msg_id, outcome.not_recorded(f"NBRewind could not start recording ({type(exc).__name__})"))
            return CellPlan(record=False)
        return plan

    def _unrecorded(self) -> CellPlan:
        """A cell that runs unrecorded (without history, or with recording off) still runs
        after the RNG states, settings and temp files replayed cells left: put them in place.
        (A silent request is a frontend's own, not the notebook's: it runs as it is, and
        `jupyter nbrewind run`'s last one does not import numpy to apply a setting.)"""
        parts = self._handle.opened()
        if parts is not None:
            try:
                parts.restorer.apply_pending()
                parts.outside.apply_pending()
                parts.restorer.output_history.fill()
            except Exception as exc:
                self._channel.warn("could not put back the state replayed cells left", exc)
        return CellPlan(record=False)

    def _start_run(self, plan: CellPlan) -> None:
        """Bring back what the cell needs that replays left pending, then start recording it."""
        began = time.perf_counter()
        parts = self._handle.parts()
        parts.restorer.apply_pending()
        parts.outside.apply_pending()
        if policy.may_read_history(plan):
            try:
                parts.restorer.output_history.fill()
            except Exception as exc:
                self._channel.warn("could not put replayed cells' results into the output history (_, Out)", exc)
        try:
            if parts.outside.code_names:
                parts.restorer.bring_back(parts.outside.code_names)
            if plan.effects is not None:  # first: brought back by `rebuild_pending`, they would be held
                parts.restorer.load_before_dropping(plan.effects)
            parts.restorer.rebuild_pending(plan.reads, clients=may_need_client(plan, parts.state.entries, self._namespace()))
        except Exception as exc:
            self._channel.warn("could not bring back a value that cannot be stored (a Dask client, a lock...)", exc)
        parts.recorder.start(plan)
        plan.prepared = plan.started - began

    # -- after a cell ran -----------------------------------------------------------

    def finish(self, plan: CellPlan, reply: Mapping[str, Any]) -> None:
        """Record the cell run and its checkpoint."""
        if not plan.record or plan.replay:
            return
        outputs = self._capture.stop(plan.msg_id) if plan.msg_id else []
        if plan.msg_id and not self._capture.complete(plan.msg_id):
            self.unrecordable.append("an output message")
            self._channel.notice("NBRewind warning: an output of this cell could not be recorded; this cell is not recorded")
        recorder = self._handle.parts().recorder
        duration = recorder.stop(plan) + plan.prepared  # the whole request, as its reply says
        if self.unrecordable:
            # A record would replay a failure that was NBRewind's, not the notebook's, or
            # miss an output the cell showed (the notice said which).
            what = ", ".join(self.unrecordable)
            self._outcome = (plan.msg_id, outcome.not_recorded(f"NBRewind could not bring back or record: {what}", duration))
            return
        try:
            recorded = recorder.record(plan, reply, outputs, duration, self._handle.task_cache)
            self._handle.parts().state.mark_used(plan.reads, plan.code_digest, recorded.run.inputs or {})
            self.last = recorded.last
            self._submit(recorded.run, recorded.staged, recorded.nbytes, recorded.tasks)
            run = recorded.run
            self._outcome = (plan.msg_id, outcome.ran(recorded.last.reason, duration, run.task_hits or 0, run.task_misses or 0))
            if recorded.unserializable:
                names = ", ".join(sorted(recorded.unserializable))
                self._channel.info(f"NBRewind: {names} cannot be stored; a repeat rebuilds it by running this cell.")
        except KeyboardInterrupt:
            self._channel.warn("checkpointing was interrupted; this cell is not recorded")
        except Exception as exc:
            self._channel.warn("could not checkpoint the cell; it is not recorded", exc)

    def _submit(self, run: CellRun, staged: list[Any], nbytes: int, tasks: Sequence[TaskLogEntry] | None = None) -> None:
        """Queue the cell run's record with the checkpoint as it is now (the full name -> entry map)."""
        entries = {k: (v.digest, v.meta_text()) for k, v in self._handle.parts().state.entries.items()}
        self._committer.submit(self._handle.store, self._handle.task_cache, run, entries, staged, nbytes, list(tasks or ()))

    # -- replay ------------------------------------------------------------------------

    def replay(self, plan: CellPlan) -> dict[str, Any] | None:
        """Send the matched run's outputs, bind its writes, and return its reply.

        Returns None when the replay cannot be prepared; the cell then runs.
        """
        run = plan.match
        assert run is not None and run.checkpoint_id is not None
        replayer = self._handle.parts().replayer
        try:
            bound = replayer.bind(plan)
        except Exception as exc:
            self._channel.warn(f"could not replay cell run #{run.id}; running the cell instead", exc)
            plan.reason = f"its record cannot be replayed ({type(exc).__name__}: {exc})"
            plan.replay = False
            self._start_run(plan)
            return None
        replayed = replayer.send(plan, bound)
        self._handle.parts().state.mark_used(run.reads or (), plan.code_digest, run.inputs or {})
        self.last = replayed.last
        self._submit(replayed.run, [], 0)
        self._outcome = (plan.msg_id, outcome.replayed(plan.reason, replayed.last.seconds, run))
        return replayed.reply

    def reply_metadata(self, msg_id: str | None) -> dict[str, Any] | None:
        """``metadata.nbrewind`` for the reply to request `msg_id` (see `outcome`); None for
        a request this session made no decision on (a silent one)."""
        if self._outcome is None or self._outcome[0] != msg_id:
            return None
        info = dict(self._outcome[1])
        opened = self._handle.opened()
        if opened is not None:
            info["brought_back"] = outcome.brought_back(opened.restorer.take_brought_back())
        return info
