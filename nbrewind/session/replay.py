"""Replaying a matched cell run: bind what it wrote, then re-send what it showed.

Two steps, because only the first may fail: `bind` checks that every object the run
would bind is readable and binds its writes (lazily on repeat); if it raises, nothing
was shown and the cell simply runs instead. `send` re-sends the recorded outputs with
the new execution count and returns the reply and the "replayed" record.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import randomness
from nbrewind.checkpoint.outputs import OutputMessage, decode_recorded, for_replay
from nbrewind.session import policy
from nbrewind.session.plan import CellPlan, Emit, LastCell, RngLedger
from nbrewind.session.pseudo import ABSENT
from nbrewind.session.history import Deferred
from nbrewind.session.state import HIDDEN, UNSERIALIZABLE, Entry

if TYPE_CHECKING:
    from nbrewind.session.recorder import Recorder
    from nbrewind.session.restore import Restorer
    from nbrewind.store.catalog import Catalog, CellRun
    from nbrewind.store.objects import ObjectStore

__all__ = ["Bound", "Replayed", "Replayer"]


@dataclass
class Bound:
    """A run whose writes are bound, for `Replayer.send`: its recorded outputs, what it kept of
    its output-history value (`results`), and when replaying started."""

    outputs: list[OutputMessage]
    result: dict[str, Any] | None
    started: float


@dataclass
class Replayed:
    """A replay that was sent: the reply for the frontend and the record to commit."""

    reply: dict[str, Any]
    run: CellRun
    last: LastCell


class Replayer:
    """Replays a plan's matched run; see the module's docstring."""

    def __init__(
        self,
        shell: Any,
        *,
        emit: Emit,
        catalog: Catalog,
        objects: ObjectStore,
        restorer: Restorer,
        recorder: Recorder,
        rng: RngLedger,
    ) -> None:
        self._shell = shell
        self._emit = emit
        self._catalog = catalog
        self._objects = objects
        self._restorer = restorer
        self._recorder = recorder
        self._rng = rng

    def bind(self, plan: CellPlan) -> Bound:
        """Bind the matched run's writes; what `send` needs to finish the replay."""
        run = plan.match
        assert run is not None and run.checkpoint_id is not None
        written = self._catalog.checkpoint_entries(run.checkpoint_id, run.writes or ())
        entries = {k: Entry.from_meta(d, m) for k, (d, m) in written.items()}
        outputs: list[OutputMessage] = []
        result = None
        objects = self._objects
        if run.outputs:
            children, payload = objects.get_tree(run.outputs)
            # A stored result is the last child, after the buffers: read when a cell reads it.
            outputs, result = decode_recorded(payload, lambda i: bytes(objects.get_blob(children[i])))
        started = time.perf_counter()
        gone = sorted(n for n in run.writes or () if n in entries and entries[n].digest != ABSENT and not objects.has(entries[n].digest))
        if gone:
            raise LookupError(f"the recorded state of {', '.join(gone)} is no longer in the store")
        for name in run.writes or ():
            entry = entries.get(name)
            if entry is not None and entry.kind == HIDDEN and entry.extra.get("what") != "file" and entry.digest != ABSENT:
                # Settings and RNG states are applied when the next cell runs, too late to run
                # this one instead: read them now (a few kB each), so damage shows here.
                children, _ = objects.get_tree(entry.digest)
                for child in children:
                    objects.verify(child)
        self._restorer.check_files(entries, run.writes or ())
        # State first, outputs second: if binding fails, nothing was shown and the cell
        # simply runs (recomputing the names it writes).
        self._restorer.apply(entries, run.writes or [], run.deletes or [])
        makes = any(entries[n].kind == UNSERIALIZABLE for n in run.writes or () if n in entries)
        if plan.resources or makes:
            # Its effect on what cannot be stored happens when a cell that runs needs it.
            self._restorer.defer(Deferred(plan.transformed or plan.code, run.checkpoint_id, run.status == "error"))
        for line in policy.magic_lines_to_rerun(plan.transformed):
            # Kernel state a magic set up (a plotting backend) is not a value to restore.
            exec(compile(line, "<nbrewind replayed magic>", "exec", dont_inherit=True), self._shell.user_ns)
        return Bound(outputs, result, started)

    def send(self, plan: CellPlan, bound: Bound) -> Replayed:
        """Re-send the bound run's outputs; the reply, and the record of the replay."""
        run = plan.match
        assert run is not None
        count = int(self._shell.execution_count)
        for message in bound.outputs:
            m = for_replay(message, count)
            self._emit(m.msg_type, m.content, m.metadata, m.buffers)
        self._restorer.advance_history(plan.code, count, plan.transformed)
        self._restorer.output_history.note(count, bound.result)
        duration = time.perf_counter() - bound.started
        last = LastCell(count, "replayed", plan.reason, duration, 0, 0.0)
        rng = self._rng
        rng.left.update({w: e.key for w, e in rng.pending.items()})
        loaded = (randomness.RANDOM, randomness.NUMPY_RANDOM) if randomness.NUMPY_RANDOM in sys.modules else (randomness.RANDOM,)
        if any(which not in rng.left for which in loaded):
            # Only until every loaded generator has a key: digesting states costs ~0.1 ms a replay.
            rng.left = {**randomness.rng_states(), **rng.left}
        record = self._recorder.run_record(
            plan, count, "replayed", plan.reason, duration,
            status=run.status or "ok",
            reply=run.reply,
            outputs=run.outputs,
            inputs=run.inputs,
            reads=run.reads,
            writes=run.writes,
            deletes=run.deletes,
            bytes_written=0,
        )
        reply = dict(run.reply or {"status": "ok"})
        reply["execution_count"] = count
        reply.setdefault("user_expressions", {})
        reply.setdefault("payload", [])
        return Replayed(reply, record, last)
