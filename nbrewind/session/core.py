"""The Session: what the kernels ask before and after every execute_request.

Audit: every cell runs; afterwards its outputs, the names it read (with their
digests) and a checkpoint are recorded. Repeat: a cell whose normalized code and
every recorded input still match an earlier run is replayed (outputs re-sent,
writes bound lazily from the store); any other cell runs and is recorded.

Any failure in here is reported once on stderr and the cell runs as it would on
a plain kernel.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbrewind.analysis import DYNAMIC_NAMES, CellEffects, analyze_cell, transitive_reads
from nbrewind.analysis.uses import attribute_names, name_uses
from nbrewind.checkpoint import hidden
from nbrewind.checkpoint.draws import DrawWatch
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.outputs import OutputCapture, decode_outputs, encode_outputs, for_replay
from nbrewind.checkpoint.serialize import Unserializable, digest_value
from nbrewind.checkpoint.values import stage_group, stage_json
from nbrewind.checkpoint.world import WorldTracker
from nbrewind.errors import NbrewindError, UntrustedStoreError
from nbrewind.session import outside, policy, pseudo, purity
from nbrewind.session.pseudo import Pseudo
from nbrewind.session.plan import (
    ABSENT,
    CellPlan,
    Emit,
    FunctionView,
    LastCell,
    env_key,
    reply_record,
    run_status,
)
from nbrewind.session.commit import Committer
from nbrewind.session.matching import Match, find_match
from nbrewind.session.notices import Notices
from nbrewind.session.restore import RestoreMixin
from nbrewind.session.state import HIDDEN, Entry, LiveState
from nbrewind.session.writer import BackgroundWriter
from nbrewind.store import Store, resolve_store_path
from nbrewind.store.digest import digest_bytes, is_digest
from nbrewind.store.origin import check_store_origin
from nbrewind.tasks.cache import TaskCache
from nbrewind.tasks.intercept import intercepting


class Session(RestoreMixin):
    """Per-kernel NBRewind state: the store, the live checkpoint and the decisions."""

    @staticmethod
    def make_namespace(mode: str) -> LazyNamespace | None:
        """The user namespace the kernel should start with (lazy on repeat)."""
        if mode == "repeat" and os.environ.get("NBREWIND_LAZY", "1") != "0":
            return LazyNamespace()
        return None

    @classmethod
    def for_shell(cls, shell: Any, *, mode: str, emit: Emit, log: Callable[[str], None] | None = None) -> Session:
        """A session for an IPython shell, storing where DESIGN.md says; `log` writes one
        line to the kernel's log (see `notice`)."""
        return cls(shell, mode=mode, emit=emit, log=log)

    def __init__(
        self,
        shell: Any,
        *,
        mode: str,
        emit: Emit,
        store_path: Path | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if mode not in ("audit", "repeat"):
            raise ValueError(f"mode must be 'audit' or 'repeat', not {mode!r}")
        self.shell = shell
        self.mode = mode
        self.emit = emit
        self.session_id = uuid.uuid4().hex
        self.enabled = True
        self.capture = OutputCapture()
        self.channel = Notices(log)
        self.unrecordable: list[str] = []
        """Why the current cell must not be recorded (a value NBRewind could not bring back, a lost output)."""
        self.start_dir = Path(os.getcwd()).resolve()
        self._store_path = store_path
        self._store: Store | None = None
        self._state: LiveState | None = None
        self._store_failed = False
        self._files: hidden.FileTracker | None = None
        self._world: WorldTracker | None = None
        self._outside: outside.Outside | None = None
        self.last: LastCell | None = None
        self._pending_rng: dict[str, Entry] = {}
        self._rng_left: dict[str, str] = {}
        """Digest of each global RNG state as the last recorded or replayed cell left it."""
        self.writer = BackgroundWriter()
        self.committer = Committer(self.writer)
        self._task_cache: TaskCache | None = None
        self._interception = contextlib.ExitStack()
        ns = shell.user_ns
        if isinstance(ns, LazyNamespace):
            ns.set_loader(self._load_pending)

    # -- plumbing ---------------------------------------------------------------

    @property
    def namespace(self) -> dict[str, Any]:
        ns: dict[str, Any] = self.shell.user_ns
        return ns

    def observe_sends(self, session: Any) -> contextlib.AbstractContextManager[None]:
        """Wrap the kernel's message session so cell outputs are captured."""
        return self.capture.observing(session)

    def store_location(self) -> Path:
        """Where this kernel's store is: see `resolve_store_path`. The notebook path comes from
        Jupyter's ``JPY_SESSION_NAME``, IPython's ``__session__`` or, under VS Code, the
        ``__vsc_ipynb_file__`` it sets in the namespace before the first cell."""
        if self._store_path is not None:
            return self._store_path
        ns = self.namespace
        candidates = (os.environ.get("JPY_SESSION_NAME"), dict.get(ns, "__session__"), dict.get(ns, "__vsc_ipynb_file__"))
        notebook = next((str(c) for c in candidates if c and str(c).endswith(".ipynb")), None)
        return resolve_store_path(notebook_path=notebook, cwd=self.start_dir)

    @property
    def store(self) -> Store:
        if self._store is None:
            # A store this user has not signed raises UntrustedStoreError here, before
            # it is opened: nothing in it is read, let alone unpickled, and no task
            # interception starts, so no task result is loaded from it either.
            notice = check_store_origin(self.store_location())
            if notice:
                self.notice(notice)
            self._store = Store.open(self.store_location(), create=True)
            if self._store.catalog_recreated:
                self.notice(
                    f"NBRewind warning: the catalog of the store at {self._store.root} was missing or empty although "
                    "the store holds objects: which cells were recorded is lost, so every cell runs and is recorded "
                    "again (the stored objects are reused)."
                )
            self._state = LiveState(self._store.objects, self.namespace)
            self._files = hidden.FileTracker(exclude=[str(self._store.root), *hidden.default_exclusions()])
            files = self._files
            self._world = WorldTracker(files.excluded, lambda path: path in files.writes)
            self._outside = outside.Outside(self._store.objects, self._state.entries, self._rel, self._abs)
            # What the task layer logs is a notice too: the root logger's fallback would
            # write it to sys.stderr, which in a kernel is the cell's output.
            self._interception.enter_context(self.channel.routed_logs())
            # Every Dask task run from now until close() is cached in this store.
            self._task_cache = self._interception.enter_context(intercepting(TaskCache(self._store.root)))
        return self._store

    @property
    def state(self) -> LiveState:
        self.store
        assert self._state is not None
        return self._state

    @property
    def notices(self) -> list[str]:
        """Every notice said in this kernel (`Notices.notices`)."""
        return self.channel.notices

    @property
    def infos(self) -> list[str]:
        return self.channel.infos

    def notice(self, text: str) -> None:
        """Tell the user something about NBRewind itself: see `Notices.notice`."""
        self.channel.notice(text)

    def info(self, text: str) -> None:
        self.channel.info(text)

    def _warn(self, what: str, exc: BaseException | None = None) -> None:
        self.channel.warn(what, exc)

    def _ready(self) -> bool:
        if not self.enabled or self._store_failed:
            return False
        try:
            self.store
        except UntrustedStoreError as exc:
            self._store_failed = True
            self.notice(str(exc))  # already says what happens and which command trusts the store
            return False
        except (NbrewindError, OSError) as exc:
            self._store_failed = True
            self._warn(f"recording is off for this kernel: the store at {self.store_location()} cannot be used", exc)
            return False
        return True

    # -- before a cell ------------------------------------------------------------

    def begin(
        self, code: str, *, silent: bool = False, store_history: bool = True, cell_id: str | None = None, msg_id: str | None = None
    ) -> CellPlan:
        """Analyse the request and decide: replay it, or run and record it."""
        if not silent:
            self.channel.new_request()
            self.unrecordable = []
        if silent or not store_history or not self._ready():
            return CellPlan(record=False)
        for name in self.committer.take_lost():
            self.state.entries.pop(name, None)
            self.state.forget(name)
        self.channel.report_write_failures(self.writer)
        try:
            plan = self._plan(code, cell_id, msg_id)
        except Exception as exc:
            self._warn("could not analyse the cell; it is not recorded", exc)
            return CellPlan(record=False)
        if plan.replay:
            return plan
        try:
            self._start_run(plan)
        except Exception as exc:
            self._warn("could not start recording the cell", exc)
            return CellPlan(record=False)
        return plan

    def _plan(self, code: str, cell_id: str | None, msg_id: str | None) -> CellPlan:
        try:
            transformed = self.shell.transform_cell(code)
        except Exception:
            transformed = code
        effects = analyze_cell(transformed, allowed_magics=policy.ALLOWED_MAGICS, code_magics=policy.CODE_MAGICS)
        plan = CellPlan(
            record=True,
            code=code,
            transformed=transformed,
            code_digest=policy.code_digest(transformed),
            cell_id=cell_id,
            msg_id=msg_id,
            effects=effects,
        )
        plan.reads = self._reads(effects)
        plan.inputs = {name: self._key(name) for name in sorted(plan.reads)}
        if effects.dynamic or plan.reads & DYNAMIC_NAMES:
            # `'x' in globals()`: which names exist is itself an input.
            plan.inputs[pseudo.name(Pseudo.NAMES)] = self._hidden_key(pseudo.name(Pseudo.NAMES))
        if self.mode == "repeat":
            self._find_match(plan)
        return plan

    def _user_names(self) -> set[str]:
        ns = self.namespace
        hidden_ns = getattr(self.shell, "user_ns_hidden", {})
        return {n for n in ns.keys() if policy.is_user_name(n, dict.get(ns, n), hidden_ns)}

    def _reads(self, effects: CellEffects) -> set[str]:
        """Every name whose value the cell may depend on (statically, and through the
        notebook functions it calls)."""
        if effects.dynamic:
            return self._user_names() | set(effects.reads) | set(effects.mutated)
        reads = set(effects.reads) | set(effects.mutated) | set(effects.deletes)
        reads |= set(transitive_reads(frozenset(reads), FunctionView(self.namespace, self.state.entries)))
        if reads & DYNAMIC_NAMES:
            return reads | self._user_names()
        return reads

    def _key(self, name: str) -> str:
        """The digest a cell key records for `name` now."""
        entry = self.state.entries.get(name)
        ns = self.namespace
        present = dict.__contains__(ns, name)
        if entry is not None and (not present or self.state.rebound([name], ns) == set()):
            return entry.key
        if isinstance(ns, LazyNamespace) and ns.is_pending(name) and entry is not None:
            return entry.key
        if not present:
            return ABSENT
        vd = digest_value(dict.__getitem__(ns, name))
        if isinstance(vd, Unserializable):
            return "unserializable|" + vd.type_name
        return "untracked|" + vd

    @property
    def outside(self) -> outside.Outside:
        self.store
        assert self._outside is not None
        return self._outside

    def _hidden_key(self, name: str) -> str:
        """The key a pseudo-input (`session.pseudo`) has now."""
        parsed = pseudo.parse(name)
        if parsed is None:
            return ABSENT
        kind, arg = parsed
        if kind in outside.OWNED:
            return self.outside.key(kind, arg)
        if kind is Pseudo.RNG:
            pending = self._pending_rng.get(arg)
            if pending is not None:
                return pending.key
            left = self._rng_left.get(arg)
            return left if left is not None else hidden.rng_states().get(arg, ABSENT)
        if kind is Pseudo.FILE:
            return hidden.file_digest(self._abs(arg)) or ABSENT
        if kind is Pseudo.CWD:
            return self._rel(os.getcwd())
        if kind is Pseudo.ENV:
            return env_key(os.environ.get(arg))
        if kind is Pseudo.NAMES:
            return digest_bytes("\n".join(sorted(self._user_names())).encode())
        return ABSENT

    def _find_match(self, plan: CellPlan) -> None:
        result = find_match(
            plan,
            self.state.entries,
            lambda: self.store.catalog.find_cell_runs(plan.code_digest),
            lambda: plan.cell_id is not None and self.store.catalog.has_cell_id(plan.cell_id),
            self._current_key,
        )
        plan.reason = result.reason
        if isinstance(result, Match):
            plan.replay, plan.match = True, result.run

    def _current_key(self, name: str) -> str:
        """The key an input of a recorded run has now: a name's, or a pseudo-input's."""
        return self._hidden_key(name) if pseudo.is_pseudo(name) else self._key(name)

    def _start_run(self, plan: CellPlan) -> None:
        self._apply_pending_rng()
        self.outside.apply_pending()
        try:
            self._rebuild_pending(plan.reads)
        except Exception as exc:
            self._warn("could not bring back a value that cannot be stored (a Dask client, a lock...)", exc)
        plan.outside_before = self.outside.before()
        if plan.effects is not None and plan.effects.mutated:
            plan.module_bindings = outside.bindings(outside.installed_modules(plan.effects.mutated, self.namespace))
        plan.inputs.update(plan.outside_before)
        plan.uses = name_uses(plan.transformed)  # only a cell that runs needs them
        plan.started = time.perf_counter()
        plan.rng_before = hidden.rng_states()
        # Between cells only the kernel's own threads run (distributed's, a thread a cell left
        # behind), whenever they get to it: a cell is keyed on the state the last cell left.
        plan.rng_key_before = {which: self._rng_left.get(which, digest) for which, digest in plan.rng_before.items()}
        plan.env_before = hidden.env_snapshot()
        plan.cwd_before = os.getcwd()
        if plan.msg_id:
            self.capture.start(plan.msg_id)
        stack = contextlib.ExitStack()
        assert self._files is not None
        self._files.clear()
        stack.enter_context(self._files.tracking())
        assert self._world is not None
        self._world.clear()
        stack.enter_context(self._world.tracking())
        plan.seeded = stack.enter_context(hidden.watching_seeds())
        plan.draws = stack.enter_context(DrawWatch().watching())
        plan.tracking = stack

    # -- after a cell ran -----------------------------------------------------------

    def finish(self, plan: CellPlan, reply: Mapping[str, Any]) -> None:
        """Record the cell run and its checkpoint."""
        if not plan.record or plan.replay:
            return
        outputs = self.capture.stop(plan.msg_id) if plan.msg_id else []
        if plan.msg_id and not self.capture.complete(plan.msg_id):
            self.unrecordable.append("an output message")
            self.notice("NBRewind warning: an output of this cell could not be recorded; this cell is not recorded")
        if plan.tracking is not None:
            if plan.draws is not None:
                plan.background_draws_only = plan.draws.explained()
            plan.tracking.close()
        duration = time.perf_counter() - plan.started
        if self.unrecordable:
            # A record would replay a failure that was NBRewind's, not the notebook's, or
            # miss an output the cell showed (the notice said which).
            return
        try:
            self._record(plan, reply, outputs, duration)
        except KeyboardInterrupt:
            self._warn("checkpointing was interrupted; this cell is not recorded")
        except Exception as exc:
            self._warn("could not checkpoint the cell; it is not recorded", exc)

    def _record(self, plan: CellPlan, reply: Mapping[str, Any], outputs: list[Any], duration: float) -> None:
        assert plan.effects is not None and self._files is not None
        ns = self.namespace
        state = self.state
        objects = self.store.objects
        user = self._user_names()
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
        changed = dict(result.changed)
        written = result.bytes_written
        staged: list[Any] = [*context_docs, *result.staged]
        inputs = dict(plan.inputs)
        # Hidden state: RNGs, files, environment, working directory.
        rng_after = hidden.rng_states()
        saved = hidden.capture_rng()
        if self._touches_rng(plan):
            # It may read a global RNG's state without drawing (`random.getstate()`).
            for which, digest in plan.rng_key_before.items():
                if not plan.seeded.get(which):
                    inputs[pseudo.name(Pseudo.RNG, which)] = digest
        for which, digest in rng_after.items():
            if which not in self._rng_left:
                self._rng_left[which] = digest
            if plan.rng_before.get(which) != digest:
                if which == hidden.RANDOM and plan.background_draws_only:
                    # Only distributed's own threads moved it (checkpoint/draws.py): not the
                    # cell's doing, so neither an input nor part of what a replay restores.
                    continue
                if which in plan.rng_before and not plan.seeded.get(which):
                    # Consumed an existing state. A generator that only came into
                    # being in this cell (numpy imported) was not an input.
                    inputs[pseudo.name(Pseudo.RNG, which)] = plan.rng_key_before[which]
                self._rng_left[which] = digest
                stored = stage_group(objects, {"state": saved[which]})
                if isinstance(stored, Unserializable):
                    continue
                staged.append(stored)
                changed[pseudo.name(Pseudo.RNG, which)] = Entry(stored.digest, HIDDEN, digest, (), {"what": "rng", "rng": which})
                written += stored.new_bytes
        world = self._world
        assert world is not None
        for path, db_digest in world.databases.items():
            # sqlite opens its file in C: read before, and possibly written by, the cell.
            self._files.read_digests.setdefault(path, db_digest)
            self._files.reads.add(path)
            self._files.writes.add(path)
        for path in sorted(self._files.reads):
            found = self._files.read_digests.get(path, hidden.file_digest(path))
            inputs[pseudo.name(Pseudo.FILE, self._rel(path))] = found or ABSENT
        self.outside.world_inputs(world, plan.env_before, inputs, env_key)
        outside_bytes, impure = self.outside.after(plan.outside_before, inputs, changed, staged)
        written += outside_bytes
        if not any(k.startswith(Pseudo.SETTING.value) for k in changed):
            impure += [f"changes module {m}, which a replay cannot restore" for m in outside.rebound_modules(plan.module_bindings)]
        if "reload" in effects.reads or "reload" in plan.reads:
            impure.append("reloads a module")
        if impure:
            inputs[outside.IMPURE] = "; ".join(sorted(set([inputs[outside.IMPURE]] if outside.IMPURE in inputs else []) | set(impure)))
        for path in sorted(self._files.writes):
            rel = self._rel(path)
            if os.path.isdir(path):
                continue
            if not os.path.lexists(path) and path in self._files.created:
                continue  # made and removed by the cell: nothing on disk changed
            if os.path.isfile(path):
                blob = objects.stage_blob(Path(path).read_bytes())
                staged.append(blob)
                written += blob.new_bytes
                changed[pseudo.name(Pseudo.FILE, rel)] = Entry(blob.digest, HIDDEN, hidden.file_digest(path) or ABSENT, (), {"what": "file", "path": rel})
            else:
                changed[pseudo.name(Pseudo.FILE, rel)] = Entry(ABSENT, HIDDEN, ABSENT, (), {"what": "file", "path": rel, "deleted": True})
        if self._files.writes:
            inputs[pseudo.name(Pseudo.CWD)] = self._rel(plan.cwd_before)
        for var, value in hidden.env_diff(plan.env_before, hidden.env_snapshot()).items():
            changed[pseudo.name(Pseudo.ENV, var)] = Entry(ABSENT, HIDDEN, env_key(value), (), {"what": "env", "var": var, "value": value})
        if os.getcwd() != plan.cwd_before:
            rel = self._rel(os.getcwd())
            changed[pseudo.name(Pseudo.CWD)] = Entry(ABSENT, HIDDEN, rel, (), {"what": "cwd", "path": rel})
        state.entries.update({k: v for k, v in changed.items() if pseudo.is_pseudo(k)})
        tasks = self._task_cache.drain_log() if self._task_cache is not None else []
        if tasks and self._task_cache is not None:
            # A task served from the cache opened nothing: the files its result rests on
            # (recorded when it ran) are inputs of this cell all the same.
            for path, digest in self._task_cache.file_inputs(tasks).items():
                inputs.setdefault(pseudo.name(Pseudo.FILE, self._rel(path)), digest)
        if any(k.startswith(Pseudo.FILE.value) for k in inputs):
            inputs[pseudo.name(Pseudo.CWD)] = self._rel(plan.cwd_before)
        outputs_digest = self._stage_outputs(outputs, staged)
        count = self._count(reply)
        reason = "audit records every cell" if self.mode == "audit" else plan.reason
        run = self._run_record(
            plan, count, "executed", reason, duration,
            status=run_status(reply),
            reply=reply_record(reply),
            outputs=outputs_digest,
            inputs=inputs,
            reads=sorted(plan.reads),
            writes=sorted(changed),
            deletes=sorted(result.deleted),
            bytes_written=written,
        )
        self.last = LastCell(count, "executed", reason, duration, written, result.seconds)
        self._submit(run, staged, written, tasks)
        if result.unserializable:
            names = ", ".join(sorted(result.unserializable))
            self.info(f"NBRewind: {names} cannot be stored; a repeat rebuilds it by running this cell.")

    def _reached(self, plan: CellPlan, user: set[str]) -> set[str]:
        """Names whose values the cell could have changed in place: everything it reached,
        except what `purity` proves untouched (immutable, or only used in ways that cannot
        mutate a value of exactly its type)."""
        assert plan.effects is not None
        ns = self.namespace
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
        ns = self.namespace
        for name in plan.reads - set(plan.effects.reads if plan.effects else ()):
            if dict.__contains__(ns, name) and outside.touches_rng(outside.code_names(dict.__getitem__(ns, name))):
                return True
        return plan.uses is None

    def _run_record(
        self, plan: CellPlan, count: int, decision: str, reason: str, duration: float, **fields: Any
    ) -> dict[str, Any]:
        """The catalog fields of one cell run of this kernel (the rest come in `fields`)."""
        return {
            "session": self.session_id,
            "kernel": self.mode,
            "execution_count": count,
            "cell_id": plan.cell_id,
            "code": plan.code,
            "code_digest": plan.code_digest,
            "decision": decision,
            "reason": reason,
            "started": time.time() - duration,
            "duration": duration,
            **fields,
        }

    def _stage_outputs(self, outputs: list[Any], staged: list[Any]) -> str | None:
        if not outputs:
            return None
        payload, buffers = encode_outputs(outputs)
        objects = self.store.objects
        blobs = [objects.stage_blob(b) for b in buffers]
        tree = objects.stage_tree([b.digest for b in blobs], payload)
        staged.extend([*blobs, tree])
        return tree.digest

    def _submit(self, run: dict[str, Any], staged: list[Any], nbytes: int, tasks: list[Any] | None = None) -> None:
        """Queue the cell run's record with the checkpoint as it is now (the full name -> entry map)."""
        entries = {k: (v.digest, v.to_meta()) for k, v in self.state.entries.items()}
        self.committer.submit(self.store, self._task_cache, run, entries, staged, nbytes, tasks or [])

    def _count(self, reply: Mapping[str, Any]) -> int:
        count = reply.get("execution_count")
        return int(count) if isinstance(count, int) else int(self.shell.execution_count) - 1

    # -- replay ------------------------------------------------------------------------

    def replay(self, plan: CellPlan) -> dict[str, Any] | None:
        """Send the matched run's outputs, bind its writes, and return its reply.

        Returns None when the replay cannot be prepared; the cell then runs.
        """
        run = plan.match
        assert run is not None and run.checkpoint_id is not None
        try:
            entries = {
                k: Entry.from_meta(d, m) for k, (d, m) in self.store.catalog.checkpoint_entries(run.checkpoint_id).items()
            }
            outputs = []
            if run.outputs:
                children, payload = self.store.objects.get_tree(run.outputs)
                outputs = decode_outputs(payload, [bytes(self.store.objects.get_blob(c)) for c in children])
            started = time.perf_counter()
            objects = self.store.objects
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
            # State first, outputs second: if binding fails, nothing was shown and the cell
            # simply runs (recomputing the names it writes).
            self._apply(entries, run.writes or [], run.deletes or [])
            for line in policy.magic_lines_to_rerun(plan.transformed):
                # Kernel state a magic set up (a plotting backend) is not a value to restore.
                exec(compile(line, "<nbrewind replayed magic>", "exec", dont_inherit=True), self.namespace)
        except Exception as exc:
            self._warn(f"could not replay cell run #{run.id}; running the cell instead", exc)
            plan.reason = f"its record cannot be replayed ({type(exc).__name__}: {exc})"
            plan.replay = False
            self._start_run(plan)
            return None
        count = int(self.shell.execution_count)
        for message in outputs:
            m = for_replay(message, count)
            self.emit(m.msg_type, m.content, m.metadata, m.buffers)
        self._advance_history(plan.code, count)
        duration = time.perf_counter() - started
        self.last = LastCell(count, "replayed", plan.reason, duration, 0, 0.0)
        self._rng_left.update({w: e.key for w, e in self._pending_rng.items()})
        loaded = (hidden.RANDOM, hidden.NUMPY_RANDOM) if hidden.NUMPY_RANDOM in sys.modules else (hidden.RANDOM,)
        if any(which not in self._rng_left for which in loaded):
            # Only until every loaded generator has a key: digesting states costs ~0.1 ms a replay.
            self._rng_left = {**hidden.rng_states(), **self._rng_left}
        record = self._run_record(
            plan, count, "replayed", plan.reason, duration,
            status=run.status,
            reply=run.reply,
            outputs=run.outputs,
            inputs=run.inputs,
            reads=run.reads,
            writes=run.writes,
            deletes=run.deletes,
            bytes_written=0,
        )
        self._submit(record, [], 0)
        reply = dict(run.reply or {"status": "ok"})
        reply["execution_count"] = count
        reply.setdefault("user_expressions", {})
        reply.setdefault("payload", [])
        return reply

    def magic(self, line: str) -> None:
        """`%nbrewind status|why|log|off|on|restore N`."""
        from nbrewind.session.magic import run_magic

        run_magic(self, line)

    def close(self) -> None:
        """Finish pending writes, undo the Dask interception, close the store."""
        self.writer.close()
        with contextlib.suppress(Exception):
            self._interception.close()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()

    # -- paths -------------------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        """A path relative to the kernel's start folder when it lies inside it (portable keys)."""
        p = Path(path).resolve()
        try:
            return p.relative_to(self.start_dir).as_posix() or "."
        except ValueError:
            return p.as_posix()

    def _abs(self, rel: str) -> str:
        return rel if os.path.isabs(rel) else str(self.start_dir / rel)

