"""Recording a cell that runs: the hidden state before it, and its record after it.

Before the cell, `Recorder.start` snapshots what a cell may change without assigning a
name (RNG states, settings, environment, working directory) and starts watching files,
directory listings, seeds and draws. After it, `Recorder.record` re-digests every name
the cell could have changed, stages what changed (hashed and copied now, so the next
cell may change it), adds the hidden state the cell read and wrote to its inputs and
writes, and returns the cell-run record with what the committer must write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbrewind.analysis.bound import bound_for_sure
from nbrewind.analysis.uses import attribute_names, name_uses
from nbrewind.checkpoint import hidden, randomness
from nbrewind.checkpoint.draws import DrawWatch
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.outputs import encode_outputs
from nbrewind.checkpoint.serialize import Unserializable
from nbrewind.checkpoint.values import stage_group, stage_json
from nbrewind.session import libcalls, outside, patches, pseudo, purity, results
from nbrewind.session.filerecord import Draft, WrittenFiles
from nbrewind.session.keys import user_names
from nbrewind.session.plan import CellPlan, LastCell, Paths, RngLedger, env_key, reply_record, run_status
from nbrewind.session.pseudo import ABSENT, Pseudo
from nbrewind.session.state import HIDDEN, UNSERIALIZABLE, VALUE, Entry
from nbrewind.store.digest import is_digest
from nbrewind.store import CellRun

if TYPE_CHECKING:
    from nbrewind.checkpoint.outputs import OutputCapture
    from nbrewind.checkpoint.world import WorldTracker
    from nbrewind.session.state import CheckpointResult, LiveState
    from nbrewind.store.objects import ObjectStore
    from nbrewind.tasks.cache import TaskCache, TaskLogRow

__all__ = ["Recorded", "Recorder"]

@dataclass
class Recorded:
    """One executed cell's record, and what the committer writes with it."""

    run: CellRun
    staged: list[Any]
    nbytes: int
    tasks: list[TaskLogRow]
    last: LastCell
    unserializable: set[str]


class Recorder:
    """Snapshots the hidden state before a cell runs and builds its record after it."""

    def __init__(
        self,
        shell: Any,
        *,
        mode: str,
        session_id: str,
        state: LiveState,
        objects: ObjectStore,
        files: hidden.FileTracker,
        world: WorldTracker,
        outside: outside.Outside,
        rng: RngLedger,
        paths: Paths,
        capture: OutputCapture,
    ) -> None:
        self._shell = shell
        self._mode = mode
        self._session_id = session_id
        self._state = state
        self._objects = objects
        self._files = files
        self._world = world
        self._outside = outside
        self._written = WrittenFiles(objects, files, world, outside, paths)
        self._rng = rng
        self._paths = paths
        self._capture = capture

    # -- before the cell -----------------------------------------------------------

    def start(self, plan: CellPlan) -> None:
        """Snapshot the hidden state and start watching what the cell does."""
        ns = self._shell.user_ns
        plan.outside_before = self._outside.before()
        if plan.effects is not None and plan.effects.mutated:
            plan.module_bindings = outside.bindings(outside.installed_modules(plan.effects.mutated, ns))
        plan.patch_watch = patches.watch(plan.transformed, ns, plan.reads)
        plan.inputs.update(plan.outside_before)
        plan.uses = name_uses(plan.transformed)  # only a cell that runs needs them
        plan.started = time.perf_counter()
        plan.rng_before = randomness.rng_states()
        # Between cells only the kernel's own threads run (distributed's, a thread a cell left
        # behind), whenever they get to it: a cell is keyed on the state the last cell left.
        plan.rng_key_before = {which: self._rng.left.get(which, digest) for which, digest in plan.rng_before.items()}
        plan.env_before = hidden.env_snapshot()
        plan.cwd_before = os.getcwd()
        plan.kept_before = self._written.signatures()
        if plan.msg_id:
            self._capture.start(plan.msg_id)
        stack = contextlib.ExitStack()
        self._files.clear()
        stack.enter_context(self._files.tracking())
        self._world.clear()
        stack.enter_context(self._world.tracking())
        plan.seeded = stack.enter_context(randomness.watching_seeds())
        plan.draws = stack.enter_context(DrawWatch().watching())
        plan.tracking = stack

    def stop(self, plan: CellPlan) -> float:
        """Stop watching the cell; how long it ran, in seconds."""
        if plan.tracking is not None:
            if plan.draws is not None:
                plan.background_draws_only = plan.draws.explained()
            plan.tracking.close()
        return time.perf_counter() - plan.started

    # -- after the cell --------------------------------------------------------------

    def record(
        self, plan: CellPlan, reply: Mapping[str, Any], outputs: list[Any], duration: float, task_cache: TaskCache | None
    ) -> Recorded:
        """The record of the cell that ran, with its checkpoint staged; `task_cache` logged
        the Dask tasks it computed (the session owns it, with the interception)."""
        assert plan.effects is not None
        stored_before = {n: e.key for n, e in self._state.entries.items() if e.kind == VALUE}
        result, context_docs = self._checkpoint_names(plan)
        draft = Draft(
            inputs=dict(plan.inputs),
            changed=dict(result.changed),
            staged=[*context_docs, *result.staged],
            written=result.bytes_written,
            unserializable=set(result.unserializable),
        )
        # Hidden state: RNGs, files, environment, working directory.
        self._add_rngs(plan, draft)
        self._written.add(plan, draft)
        outside.note_impure(draft.inputs, patches.patched(plan.patch_watch, self._shell.user_ns))
        if plan.patch_watch is not None and plan.patch_watch.sites:
            self._outside.note_patched(plan.patch_watch.sites)
        self._pin_unrestorable_updates(plan, draft)
        self._add_env_and_cwd(plan, draft)
        self._state.entries.update({k: v for k, v in draft.changed.items() if pseudo.is_pseudo(k)})
        tasks = self._add_tasks(plan, draft, task_cache)
        count = self._count(reply)
        self._note_library_calls(plan, draft, results.shown(self._shell, count))
        outputs_digest = self._stage_outputs(outputs, draft.staged, self._result(count, draft.staged))
        rebound = self._rebound_unchanged(plan, reply)
        for name, key in plan.prior.items():
            # May have bound it, left it as it was: what it was is what the cell left.
            if name not in draft.changed and name not in rebound:
                draft.inputs.setdefault(name, key)
        self._add_carried(plan, reply, result.changed, stored_before, draft.inputs)
        reason = "audit records every cell" if self._mode == "audit" else plan.reason
        run = self.run_record(
            plan, count, "executed", reason, duration,
            status=run_status(reply),
            reply=reply_record(reply),
            outputs=outputs_digest,
            inputs=draft.inputs,
            reads=sorted(plan.reads),
            writes=sorted(set(draft.changed) | rebound),
            deletes=sorted(result.deleted),
            bytes_written=draft.written,
        )
        if tasks and task_cache is not None:
            hits, misses = task_cache.stats(tasks)
            run = dataclasses.replace(run, task_hits=hits, task_misses=misses)
        last = LastCell(count, "executed", reason, duration, draft.written, result.seconds)
        return Recorded(run, draft.staged, draft.written, tasks, last, draft.unserializable)

    @staticmethod
    def _add_carried(
        plan: CellPlan, reply: Mapping[str, Any], changed: Mapping[str, Entry], before: Mapping[str, str], inputs: dict[str, str]
    ) -> None:
        """Inputs for the names the cell changed without binding them anew: written through
        an alias (`row.append(0)` inside `for row in rows.values()` changes `rows`), or stored
        again with a group a name it bound joined. Their value after the cell is the one they
        had, changed, so a replay, which binds the recorded value, is right only when they hold
        what they held before the recorded run, whether or not the cell read them."""
        carried = {n: before[n] for n, entry in changed.items() if n in before and n not in inputs and entry.kind == VALUE}
        if not carried:
            return
        sure = bound_for_sure(plan.transformed or plan.code) if run_status(reply) == "ok" else frozenset()
        inputs.update((n, key) for n, key in carried.items() if n not in sure)

    def run_record(
        self,
        plan: CellPlan,
        count: int,
        decision: str,
        reason: str,
        duration: float,
        *,
        status: str,
        reply: dict[str, Any] | None,
        outputs: str | None,
        inputs: dict[str, str] | None,
        reads: list[str] | None = None,
        writes: list[str] | None = None,
        deletes: list[str] | None = None,
        bytes_written: int = 0,
    ) -> CellRun:
        """The catalog record of one cell run of this kernel."""
        return CellRun(
            session=self._session_id,
            kernel=self._mode,
            execution_count=count,
            cell_id=plan.cell_id,
            code=plan.code,
            code_digest=plan.code_digest,
            decision=decision,
            reason=reason,
            status=status,
            reply=reply,
            outputs=outputs,
            inputs=inputs,
            reads=reads,
            writes=writes,
            deletes=deletes,
            started=time.time() - duration,
            duration=duration,
            bytes_written=bytes_written,
        )

    def _rebound_unchanged(self, plan: CellPlan, reply: Mapping[str, Any]) -> set[str]:
        """Names the cell certainly bound that kept their value (no new entry): writes all the
        same, so a replay binds them whatever an earlier cell left (`analysis.bound`)."""
        if run_status(reply) != "ok":
            return set()
        ns, entries = self._shell.user_ns, self._state.entries
        return {n for n in bound_for_sure(plan.transformed or plan.code) if n in entries and dict.__contains__(ns, n)}

    def _checkpoint_names(self, plan: CellPlan) -> tuple[CheckpointResult, list[Any]]:
        """Re-digest and stage every name the cell could have changed; also the record of
        how to make its unstorable values again, if it made any."""
        assert plan.effects is not None
        ns = self._shell.user_ns
        state = self._state
        objects = self._objects
        user = user_names(self._shell)
        effects = plan.effects
        candidates = state.rebound(user, ns) | set(effects.writes) | set(effects.deferred_writes)
        candidates |= self._reached(plan, user)
        if effects.dynamic:
            candidates |= user
        before = {k: (v.digest, v.to_meta()) for k, v in state.entries.items()}
        context_docs: list[Any] = []

        def rebuild_context() -> dict[str, Any]:
            # How to make an unstorable value again: this cell's code and the state it started from.
            if not context_docs:
                stored = (digest for digest, _ in before.values() if is_digest(digest))
                context_docs.append(stage_json(objects, {"entries": before}, stored))
            return {"code": plan.transformed, "parent_entries": context_docs[0].digest}

        result = state.checkpoint(ns, user, candidates, unserializable_context=rebuild_context)
        classes = tuple(dict.__getitem__(ns, n) for n in result.changed if isinstance(dict.get(ns, n), type))
        if classes:
            # Instances pickle their class: changing a class (`C.f = ...`) changes every instance of it.
            instances = {
                n for n in user - set(result.changed) if dict.__contains__(ns, n) and isinstance(dict.__getitem__(ns, n), classes)
            }
            if instances:
                more = state.checkpoint(ns, user, instances, unserializable_context=rebuild_context)
                result.changed.update(more.changed)
                result.staged.extend(more.staged)
                result.bytes_written += more.bytes_written
                result.unserializable.update(more.unserializable)
        if isinstance(ns, LazyNamespace):
            for name in result.changed:
                ns.discard_pending(name)
        return result, context_docs

    def _add_rngs(self, plan: CellPlan, draft: Draft) -> None:
        """The global RNG states the cell read (inputs) and moved (writes)."""
        inputs = draft.inputs
        rng_left = self._rng.left
        rng_after = randomness.rng_states()
        saved = randomness.capture_rng()
        if self._touches_rng(plan):
            # It may read a global RNG's state without drawing (`random.getstate()`).
            for which, digest in plan.rng_key_before.items():
                if not plan.seeded.get(which):
                    inputs[pseudo.name(Pseudo.RNG, which)] = digest
        for which, digest in rng_after.items():
            if which not in rng_left:
                rng_left[which] = digest
            if plan.rng_before.get(which) != digest:
                if which == randomness.RANDOM and plan.background_draws_only:
                    # Only distributed's own threads moved it (checkpoint/draws.py): not the
                    # cell's doing, so neither an input nor part of what a replay restores.
                    continue
                if which in plan.rng_before and not plan.seeded.get(which):
                    # Consumed an existing state. A generator that only came into
                    # being in this cell (numpy imported) was not an input.
                    inputs[pseudo.name(Pseudo.RNG, which)] = plan.rng_key_before[which]
                rng_left[which] = digest
                stored = stage_group(self._objects, {"state": saved[which]})
                if isinstance(stored, Unserializable):
                    continue
                draft.staged.append(stored)
                draft.changed[pseudo.name(Pseudo.RNG, which)] = Entry(stored.digest, HIDDEN, digest, (), {"what": "rng", "rng": which})
                draft.written += stored.new_bytes

    def _pin_unrestorable_updates(self, plan: CellPlan, draft: Draft) -> None:
        """A cell in the life of an unstorable value (it made or read one: an open file) that
        appended to or updated a file whose earlier content no checkpoint holds never replays.

        Replayed, it would be deferred, and re-run later to bring the value back
        (`Rebuilder.replay_life`) over the file as the replays left it, with nothing to put
        back what it found: the append would land twice. Run instead, it finds the file as a
        fresh run does. (A file an earlier cell wrote is put back from its checkpoint.)"""
        entries = self._state.entries
        in_a_life = bool(draft.unserializable) or any(
            (e := entries.get(n)) is not None and e.kind == UNSERIALIZABLE for n in plan.reads
        )
        if not in_a_life:
            return
        lost = []
        for name, found in draft.inputs.items():
            parsed = pseudo.parse(name)
            if parsed is None or parsed[0] is not Pseudo.FILE or found == ABSENT or name not in draft.changed:
                continue
            before = entries.get(name)
            if before is None or before.key != found:
                lost.append(parsed[1])
        if lost:
            why = f"updated {', '.join(sorted(lost))} (content no checkpoint holds) while making or using a value that cannot be stored"
            outside.note_impure(draft.inputs, [why])

    def _add_env_and_cwd(self, plan: CellPlan, draft: Draft) -> None:
        """Environment variables the cell set and the working directory it moved to."""
        for var, value in hidden.env_diff(plan.env_before, hidden.env_snapshot()).items():
            draft.changed[pseudo.name(Pseudo.ENV, var)] = Entry(ABSENT, HIDDEN, env_key(value), (), {"what": "env", "var": var, "value": value})
        if os.getcwd() != plan.cwd_before:
            rel = self._paths.rel(os.getcwd())
            draft.changed[pseudo.name(Pseudo.CWD)] = Entry(ABSENT, HIDDEN, rel, (), {"what": "cwd", "path": rel})

    def _add_tasks(self, plan: CellPlan, draft: Draft, task_cache: TaskCache | None) -> list[TaskLogRow]:
        """The Dask tasks the cell computed or loaded (their log rows), and the files their results rest on."""
        inputs = draft.inputs
        tasks = task_cache.drain_log() if task_cache is not None else []
        if tasks and task_cache is not None:
            # A task served from the cache opened nothing: the files its result rests on
            # (recorded when it ran) are inputs of this cell all the same.
            for path, digest in task_cache.file_inputs(tasks).items():
                inputs.setdefault(pseudo.name(Pseudo.FILE, self._paths.rel(path)), digest)
            for path, digest in task_cache.dir_inputs(tasks).items():
                inputs.setdefault(pseudo.name(Pseudo.LISTING, self._paths.rel(path)), digest)
        if any(k.startswith((Pseudo.FILE.value, Pseudo.LISTING.value)) for k in inputs):
            inputs[pseudo.name(Pseudo.CWD)] = self._paths.rel(plan.cwd_before)
        return tasks

    def _reached(self, plan: CellPlan, user: set[str]) -> set[str]:
        """Names whose values the cell could have changed in place: everything it reached,
        except what `purity` proves untouched (immutable, or only used in ways that cannot
        mutate a value of exactly its type)."""
        assert plan.effects is not None
        ns = self._shell.user_ns
        direct = set(plan.effects.reads) - set(plan.effects.deferred_reads)
        if plan.uses is None:
            direct = set()
        out = set(plan.effects.mutated) | set(plan.effects.deletes)
        for name in (plan.reads | set(plan.effects.mutated)) & user:
            if not dict.__contains__(ns, name) or name in out:
                continue
            if name in direct and purity.proven_unchanged(dict.__getitem__(ns, name), (plan.uses or {}).get(name), ns):
                continue
            out.add(name)
        return out

    def _touches_rng(self, plan: CellPlan) -> bool:
        if plan.uses is not None and outside.touches_rng(set(plan.uses) | attribute_names(plan.transformed)):
            # Attribute names count too: `np.random.get_state()` touches an RNG.
            return True
        ns = self._shell.user_ns
        for name in plan.reads - set(plan.effects.reads if plan.effects else ()):
            if dict.__contains__(ns, name) and outside.touches_rng(outside.code_names(dict.__getitem__(ns, name))):
                return True
        return plan.uses is None

    def _note_library_calls(self, plan: CellPlan, draft: Draft, shown: bool) -> None:
        """Calls that change what a library keeps (`libcalls`): the cell always runs, and
        later cells are keyed on each call's text and the values its arguments read."""
        imports = self._outside.imports
        roots = imports.bound
        held = self._state.library_objects()
        if held:
            roots = {**held, **roots}  # `codes = responses`: codes is that library's object too
        calls = libcalls.library_calls(plan.transformed or plan.code, roots, shown=shown, effectful=imports.effectful)
        if not calls:
            return
        outside.note_impure(draft.inputs, [f"{c.verb} {c.target}, which changes what a library keeps" for c in calls])
        keys = {}
        for call in calls:
            values = []
            for name in sorted(call.reads):
                entry = draft.changed.get(name)
                values.append(f"{name}={entry.key if entry is not None else draft.inputs.get(name, '')}")
            keys[call.text] = "\0".join(values)
        self._outside.note_library_calls(keys)

    def _result(self, count: int, staged: list[Any]) -> dict[str, Any] | None:
        """What is kept of the value the cell put into the output history (`results`)."""
        try:
            return results.record_result(self._shell, self._state, self._objects, count, staged)
        except Exception as exc:  # pickling a user's value may raise anything
            return {"unstored": f"{type(exc).__name__}: {exc}"}

    def _stage_outputs(self, outputs: list[Any], staged: list[Any], result: dict[str, Any] | None) -> str | None:
        if not outputs and result is None:
            return None
        payload, buffers = encode_outputs(outputs, result)
        objects = self._objects
        blobs = [objects.stage_blob(b) for b in buffers]
        # The stored result is the last child: gc keeps it, pack ships it, verify checks it.
        kept = results.result_digest(result)
        tree = objects.stage_tree([b.digest for b in blobs] + ([kept] if kept else []), payload)
        staged.extend([*blobs, tree])
        return tree.digest

    def _count(self, reply: Mapping[str, Any]) -> int:
        count = reply.get("execution_count")
        return int(count) if isinstance(count, int) else int(self._shell.execution_count) - 1
