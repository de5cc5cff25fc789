"""Making values again by re-running the cells that made them.

A value whose stored objects cannot be read is regenerated: the cell run that wrote it
runs again from the checkpoint it started from, and the result must have the recorded
content (it is stored again, which repairs the store). A value that could never be
stored (a lock, a Dask client) is rebuilt the same way from the record its cell left.
Either way the cell runs in a scratch namespace, with the RNG states, environment and
working directory of that moment, and the process is left as it was found.

An unstorable value is a resource with a recorded life: the cell that made it and the
cells that used it. On repeat, cells that made or used one while it was still pending
replayed from their records and were deferred here (`defer`); the first cell that runs
and needs one runs the deferred cells, in notebook order, in one world of made-again
objects (`replay_life`), so a cluster that is closed by the notebook's last cell is never
started, and one that is needed is what the recorded cells left it.
"""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.serialize import Unserializable
from nbrewind.checkpoint.values import StagedGroup, load_json, stage_group
from nbrewind.identity import settings as settings_registry
from nbrewind.session import history, policy
from nbrewind.session.history import Deferred
from nbrewind.session.state import UNSERIALIZABLE, VALUE, Entry, value_key
from nbrewind.session.then import FilesThen, as_then, written_files
from nbrewind.store.walk import walk

if TYPE_CHECKING:
    from nbrewind.session.notices import Notices
    from nbrewind.session.plan import Paths
    from nbrewind.session.state import LiveState
    from nbrewind.session.writer import BackgroundWriter
    from nbrewind.store.catalog import Catalog

__all__ = ["Rebuilder"]

_MAX_REGENERATION_DEPTH = 50


class Rebuilder:
    """Re-runs recorded cells in a scratch namespace to make values again."""

    def __init__(
        self,
        shell: Any,
        *,
        state: LiveState,
        catalog: Catalog,
        writer: BackgroundWriter,
        paths: Paths,
        notices: Notices,
    ) -> None:
        self._shell = shell
        self._state = state
        self._catalog = catalog
        self._writer = writer
        self._paths = paths
        self._notices = notices
        # What a setting is before any cell changed it (a checkpoint records only changes):
        # taken when the session opens, before the first cell.
        self._initial_settings = settings_registry.capture_settings(s.name for s in settings_registry.REGISTRY)
        self._making: set[str] = set()
        self._deferred: list[Deferred] = []
        # Unstorable values made again, by the digest of their entry: one object per recorded
        # resource, shared by every re-run that reads it (futures find the client made for them).
        self._made = _MadeAgain()
        # Stored values a deferred cell wrote again while its life was replayed, whose stored
        # objects are damaged, by entry digest: the way to make them again without running
        # that cell once more against a resource that has already lived past it.
        self._life_values: dict[str, dict[str, Any]] = {}
        self._replaying = False
        self.before_run: Callable[[], None] = lambda: None  # the Restorer's: temp files replayed cells left are written first

    # -- resources: deferred cells ---------------------------------------------------

    def defer(self, step: Deferred) -> None:
        """Remember a replayed cell run that made or used a pending resource."""
        self._deferred.append(step)

    def deferred(self) -> list[Deferred]:
        return list(self._deferred)

    def forget_made(self, digest: str) -> None:
        """A resource's entry is bound again (its cell replayed again): the next use makes a new one."""
        self._made.pop(digest, None)

    def hold_weakly(self, digest: str) -> None:
        """A cell is about to drop the resource made again for `digest`: keep it only while
        something else does (`_MadeAgain.hold_weakly`)."""
        self._made.hold_weakly(digest)

    def replay_life(self) -> None:
        """Run every deferred cell run, in order, each from the state it started from, with
        the resources it read as the earlier ones left them (see the module docstring)."""
        if self._replaying or not self._deferred:
            return
        steps, self._deferred = self._deferred, []
        self._writer.flush()
        catalog = self._catalog
        self._notices.info(
            f"NBRewind: bringing back values that cannot be stored (a Dask client, a lock...) by re-running "
            f"{len(steps)} replayed cell{'s' if len(steps) != 1 else ''} that made or used them; their side effects happen again"
        )
        worlds = []
        for step in steps:
            header = catalog.get_checkpoint(step.checkpoint_id)
            before = catalog.checkpoint_entries(header.parent_id) if header.parent_id is not None else {}
            run = catalog.get_cell_run(header.cell_run_id) if header.cell_run_id is not None else None
            worlds.append((step, before, catalog.checkpoint_entries(step.checkpoint_id), (run.inputs if run else None) or {}))
        # The files the chain writes, as each cell found them: not as later replays left them.
        files = FilesThen(set().union(*(written_files(b, a) for _, b, a, _ in worlds)), self._state.objects, self._paths)
        self._replaying = True
        damaged: dict[str, bool] = {}
        try:
            for step, before, after, inputs in worlds:
                files.set(before, inputs)
                label = "<nbrewind re-run of a replayed cell>"
                unstorable = {n: d for n, (d, meta) in after.items() if meta.get("kind") == UNSERIALIZABLE}
                wrote = history.wrote(before, after)
                if isinstance(self._shell.user_ns, LazyNamespace):
                    found = self._rerun_in_kernel(step.code, before, label, step.failed, {*unstorable, *wrote})
                else:
                    scratch = self._rerun(step.code, before, label, failed=step.failed)
                    found = {n: dict.__getitem__(scratch, n) for n in {*unstorable, *wrote} if dict.__contains__(scratch, n)}
                self._made.update({d: found[n] for n, d in unstorable.items() if n in found})
                # Only damaged ones are kept (a sound one loads from the store as usual), as
                # each step ends: a later step may read one, as the notebook's later cell did.
                for n, d in wrote.items():
                    if n not in found:
                        continue
                    if d not in damaged:
                        damaged[d] = bool(walk(self._state.objects, [d], verify=True).problems)
                    if damaged[d]:
                        self._life_values.setdefault(d, {})[n] = found[n]
        finally:
            self._replaying = False
            files.put_back()

    def _written_by_deferred(self, digest: str) -> bool:
        """Whether a deferred cell run wrote the stored value `digest`."""
        return history.written_by(self._catalog, [step.checkpoint_id for step in self._deferred], digest)

    def _made_for(self, name: str, entry: Entry) -> dict[str, Any] | None:
        """`name` and the kernel's other pending resources already made again, or None."""
        if entry.digest not in self._made:
            return None
        made = {name: self._made[entry.digest]}
        ns = self._shell.user_ns
        if isinstance(ns, LazyNamespace):
            for other, token in ns.pending().items():
                if isinstance(token, Entry) and token.kind == UNSERIALIZABLE and token.digest in self._made:
                    made.setdefault(other, self._made[token.digest])
        return made

    def _producer(self, name: str, entry: Entry) -> tuple[str, dict[str, Any], bool] | None:
        """The newest recorded cell run that made `entry` for `name` (`history.producers`), or None."""
        return next(history.producers(self._catalog, name, entry.digest), None)

    def regenerate(self, name: str, entry: Entry, depth: int = 0, into: dict[str, Any] | None = None) -> dict[str, Any]:
        """Make a stored value whose objects cannot be read again, by re-running the cell
        run that wrote it from the state it started from (whose unreadable values are
        made again the same way, and so on back).

        The value made again must have the recorded content (else LookupError: a stale
        value is worse than none). It is stored again, which repairs the store, and
        loaded back from there into `into` (the kernel's namespace by default), so its
        functions see that namespace as their globals, as restored values always do.
        """
        if depth > _MAX_REGENERATION_DEPTH:
            raise RecursionError(f"more than {_MAX_REGENERATION_DEPTH} earlier cells would have to run again")
        group = self._from_life(name, entry)
        if group is None:
            if entry.digest in self._making:
                # A value can come back to itself (made by one cell, changed by the next, changed
                # back by a third): the run that needs it now cannot be the way to make it.
                raise LookupError(f"making {name!r} again would need {name!r} as it is stored")
            self._making.add(entry.digest)
            try:
                group = self._made_again(name, entry, depth)
            finally:
                self._making.discard(entry.digest)
        staged = stage_group(self._state.objects, group)
        if not isinstance(staged, StagedGroup):
            raise LookupError(f"{name!r} made again cannot be stored ({staged.reason})")
        staged.commit(self._state.objects)
        target = self._shell.user_ns if into is None else into
        stored = Entry(staged.digest, VALUE, entry.key, entry.group, entry.extra)
        values = self._state.load(stored, namespace=target)
        if into is None and staged.digest != entry.digest:
            for member in group:  # pickles of equal values may differ: point at the new one
                old = self._state.entries.get(member)
                if old is not None and old.digest == entry.digest:
                    self._state.entries[member] = Entry(staged.digest, old.kind, old.key, old.group, old.extra)
        return values

    def _from_life(self, name: str, entry: Entry) -> dict[str, Any] | None:
        """`entry`'s group as the replayed life of the kernel's resources made it, when the
        cell run that wrote it is one of the deferred ones: re-running that cell on its own
        would use the resources (a cached function, a client) once more than the notebook
        did. Kept after use: a later deferred run may read the same entry. None when no
        deferred run wrote it, or what the life made is not the recorded value."""
        if entry.digest not in self._life_values and self._deferred and self._written_by_deferred(entry.digest):
            self.replay_life()
        group = self._life_values.get(entry.digest)
        if group is None or name not in group:
            return None
        value = digest_value(group[name])
        if isinstance(value, Unserializable) or value_key(value, entry.group or (name,)) != entry.key:
            return None
        return group

    def _made_again(self, name: str, entry: Entry, depth: int) -> dict[str, Any]:
        """`entry`'s group, made again by the newest recorded run that makes it with the
        recorded content (older runs are tried when a newer one cannot)."""
        members = entry.group or (name,)
        problem: Exception = LookupError(f"no recorded cell run wrote {name!r} as it is stored")
        for code, parent_entries, _failed in history.producers(self._catalog, name, entry.digest):
            try:
                code = history.transform(self._shell, code)
            except Exception:
                pass
            try:
                # May raise where it did not then (a folder it made is there now): what it bound
                # before counts, as for a run that failed, and is accepted only as recorded.
                scratch = self._rerun(code, parent_entries, f"<nbrewind re-run to make {name} again>", depth + 1, True)
            except RecursionError:
                raise
            except Exception as exc:
                problem = exc
                continue
            group = {m: dict.__getitem__(scratch, m) for m in members if dict.__contains__(scratch, m)}
            if name not in group:
                problem = NameError(f"re-running the cell that made {name!r} did not define it again")
                continue
            value = digest_value(group[name])
            if isinstance(value, Unserializable) or value_key(value, members) != entry.key:
                # Something the cell read then (a file, a setting) is not what it is now: the
                # value made again is not the recorded one.
                problem = LookupError(f"re-running the cell that wrote {name!r} gave a different value than the recorded one")
                continue
            return group
        raise problem

    def _rerun(
        self, code: str, entries: Mapping[str, Any], label: str, depth: int = 0, failed: bool = False
    ) -> LazyNamespace:
        """Run `code` in a scratch namespace holding `entries` (a checkpoint's name ->
        (digest, meta)), loaded lazily so only what it reads is loaded, with the global
        RNGs as that checkpoint had them; the process is left as it was found. A cell whose
        recorded run ended in an error (`failed`) may raise again: what it bound before
        counts, and the caller checks that against the record."""
        scratch = LazyNamespace()
        dict.update(scratch, {k: v for k, v in dict.items(self._shell.user_ns) if k in policy.MODULE_DUNDERS})

        scratch.set_loader(self._loader(scratch, depth, same_group=False))
        try:
            with as_then(entries, self._state.objects, self._paths, self._initial_settings) as names:
                for member, item in names.items():
                    scratch.set_pending(member, item)
                self._exec(code, label, scratch, failed)
        finally:
            scratch.set_loader(None)
        return scratch

    def _loader(self, namespace: LazyNamespace, depth: int, *, same_group: bool) -> Callable[[str, Any], dict[str, Any]]:
        """The loader of a namespace a recorded cell re-runs in: unstorable values from the
        ones made again (or rebuilt), stored ones loaded with `namespace` as their globals (or
        made again when unreadable), with the pending co-members of their group (only those
        pending under the same entry, with `same_group`)."""

        def load(member: str, token: Any) -> dict[str, Any]:
            item: Entry = token
            if item.kind == UNSERIALIZABLE:
                if item.digest in self._made:
                    return {member: self._made[item.digest]}
                return {member: self.rebuild(member, item)[member]}
            try:
                values = self._state.load(item, namespace=namespace)
            except Exception:
                values = self.regenerate(member, item, depth, into=namespace)
            pending = namespace.pending()

            def wanted(k: str) -> bool:
                other = pending.get(k)
                return isinstance(other, Entry) and (not same_group or other.digest == item.digest)

            return {k: v for k, v in values.items() if k == member or wanted(k)}

        return load

    def _exec(self, code: str, label: str, namespace: dict[str, Any], failed: bool) -> None:
        self.before_run()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            # The shell's own compiler flags (a cell's `from __future__ import ...` lasts),
            # never this module's: inherited, they would change what the code compiles to.
            flags = getattr(getattr(self._shell, "compile", None), "flags", 0)
            try:
                exec(compile(code, label, "exec", flags=flags, dont_inherit=True), namespace)
            except Exception:
                if not failed:
                    raise

    def _rerun_in_kernel(self, code: str, entries: Mapping[str, Any], label: str, failed: bool, want: Iterable[str]) -> dict[str, Any]:
        """Run `code` in the kernel's own namespace, made for the duration what `entries`
        (a checkpoint) say, then put the namespace back exactly as it was. Returns the
        values it left for the names in `want`, by name.

        The kernel's namespace, not a scratch one: what the cell makes (a generator, an
        object whose methods read globals) keeps it as its globals, so later it reads the
        notebook's names as they are then, as in a fresh run, and while the deferred cells
        run it reads them as each of those cells found them."""
        ns = self._shell.user_ns
        assert isinstance(ns, LazyNamespace)
        saved = ns.save()
        hidden_ns = getattr(self._shell, "user_ns_hidden", {})

        made: dict[str, Any] = {}
        try:
            ns.set_loader(self._loader(ns, 0, same_group=True))
            with as_then(entries, self._state.objects, self._paths, self._initial_settings) as names:
                for name in [n for n in ns.keys() if policy.is_user_name(n, dict.get(ns, n), hidden_ns)]:
                    dict.pop(ns, name, None)
                    ns.discard_pending(name)
                for member, item in names.items():
                    if item.kind == UNSERIALIZABLE and item.digest in self._made:
                        dict.__setitem__(ns, member, self._made[item.digest])
                    else:
                        ns.set_pending(member, item)
                self._exec(code, label, ns, failed)
                for name in want:
                    if dict.__contains__(ns, name):
                        made[name] = dict.__getitem__(ns, name)
        finally:
            ns.put_back(saved)
        return made

    def rebuild(self, name: str, entry: Entry) -> dict[str, Any]:
        """Make an unstorable value again by re-running the cell that made it.

        The cell runs in a scratch namespace holding the state from just before
        it originally ran (see `_rerun`). `name` is taken from the scratch
        namespace, and so is every other pending value the same cell run made
        (a cluster and its client come back together, from one re-run).

        Deferred cells (`defer`) run first: the value may be one they made or changed.
        """
        self.replay_life()
        made_again = self._made_for(name, entry)
        if made_again is not None:
            return made_again
        self._writer.flush()
        parent: str | None = None
        try:
            record = load_json(self._state.objects, entry.digest)
            code, parent = record.get("code"), record.get("parent_entries")
            entries = load_json(self._state.objects, parent)["entries"] if parent is not None else {}
        except Exception:
            # The record (or the state it names) cannot be read: the catalog holds the same
            # two things, the cell run's code and the checkpoint it started from.
            producer = self._producer(name, entry)
            if producer is None:
                raise
            code, entries, _ = producer
            try:
                code = history.transform(self._shell, code)
            except Exception:
                pass
        if not code:
            raise NameError(f"{name!r} could not be stored and no record says how it was made; re-run the cell that defines it")
        self._notices.info(
            f"NBRewind: rebuilding {name!r} ({entry.extra.get('type')}, which cannot be stored) by re-running the cell "
            f"that made it; side effects of that cell happen again"
        )
        ns = self._shell.user_ns
        twins: dict[str, str] = {}
        if isinstance(ns, LazyNamespace) and parent is not None:
            for other, token in ns.pending().items():
                if other == name or not isinstance(token, Entry) or token.kind != UNSERIALIZABLE:
                    continue
                try:
                    twin = load_json(self._state.objects, token.digest)
                except Exception:
                    continue  # its own rebuild will find its way
                if twin.get("code") == code and twin.get("parent_entries") == parent:
                    twins[other] = token.digest
        label = f"<nbrewind rebuild of {name}>"
        want = {name: entry.digest, **twins}
        if isinstance(ns, LazyNamespace):
            left = self._rerun_in_kernel(code, entries, label, False, want)
        else:
            scratch = self._rerun(code, entries, label)
            left = {n: dict.__getitem__(scratch, n) for n in want if dict.__contains__(scratch, n)}
        found = {want[n]: v for n, v in left.items()}
        if entry.digest not in found:
            raise NameError(f"re-running the cell that made {name!r} did not define it again")
        self._made.update(found)
        made = {name: found[entry.digest]}
        made.update({other: found[digest] for other, digest in twins.items() if digest in found})
        return made


_ABSENT = object()


class _Weak:
    __slots__ = ("ref",)

    def __init__(self, ref: weakref.ref[Any]) -> None:
        self.ref = ref


class _MadeAgain(dict[str, Any]):
    """Unstorable values made again, by entry digest. Held strongly (a cluster made for a
    re-run lives until the notebook's name for it is bound), except one a cell is about to
    drop: held weakly from then on, so the drop frees it (and runs its finalizer) as in a
    plain kernel, while every re-run still finds it as long as it lives (one that takes no
    weak reference is let go: a later re-run makes it again)."""

    def __contains__(self, digest: object) -> bool:
        value = dict.get(self, digest, _ABSENT) if isinstance(digest, str) else _ABSENT
        return value is not _ABSENT and (not isinstance(value, _Weak) or value.ref() is not None)

    def __getitem__(self, digest: str) -> Any:
        value = dict.__getitem__(self, digest)
        if isinstance(value, _Weak):
            value = value.ref()
            if value is None:
                raise KeyError(digest)
        return value

    def hold_weakly(self, digest: str) -> None:
        value = dict.get(self, digest, _ABSENT)
        if value is _ABSENT or isinstance(value, _Weak):
            return
        try:
            dict.__setitem__(self, digest, _Weak(weakref.ref(value)))
        except TypeError:  # a dict or list takes no weak reference: let go of it
            dict.pop(self, digest, None)

