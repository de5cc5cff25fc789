"""The live checkpoint: what the store holds for every user name right now, and how
one executed cell turns into the next checkpoint.

A checkpoint maps each name to an `Entry`. Entries of co-variables (names that
share objects) point at one stored group, so `b is a` survives a restore. A cell
only re-digests the names it may have changed (its candidates) and the names that
share objects with them; an unchanged digest writes nothing.
"""

from __future__ import annotations

import enum
import importlib
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbrewind.analysis import reach, value_reads
from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.live import qualified_name
from nbrewind.checkpoint.serialize import Unserializable, restoring_into
from nbrewind.identity.finalizers import DeathWatch
from nbrewind.identity.modules import is_local_module
from nbrewind.session.plain import holds_only_plain
from nbrewind.checkpoint.values import StagedGroup, load_group, stage_group, stage_json
from nbrewind.store.objects import StagedBlob
from nbrewind.store.digest import digest_bytes
from nbrewind.store.rows import dumps
from nbrewind.store.objects import ObjectStore

class EntryKind(enum.StrEnum):
    """What a checkpoint entry holds. A str enum: checkpoints store the plain string."""

    VALUE = "value"
    """A stored group of values."""
    MODULE = "module"
    """A module, imported again by name."""
    UNSERIALIZABLE = "unserializable"
    """A record of how to make the value again (the cell that made it and its pre-state)."""
    HIDDEN = "hidden"
    """A pseudo-variable: an RNG state, a file, an environment variable, a setting..."""


VALUE, MODULE, UNSERIALIZABLE, HIDDEN = EntryKind.VALUE, EntryKind.MODULE, EntryKind.UNSERIALIZABLE, EntryKind.HIDDEN


@dataclass(frozen=True)
class Entry:
    """One name in a checkpoint.

    `digest` names the store object holding the value (its group, a module
    reference or an Unserializable record); `key` is the digest a cell key
    compares: the value's content plus the names it shares objects with.
    """

    digest: str
    kind: EntryKind
    key: str
    group: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_meta(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "key": self.key, "group": list(self.group), **self.extra}

    def meta_text(self) -> str:
        """`to_meta()` as the catalog stores it, made once per entry: a checkpoint row is
        written for every name after every cell, and most entries outlive many cells."""
        text: str | None = self.__dict__.get("_meta_text")
        if text is None:
            text = dumps(self.to_meta())
            assert text is not None
            object.__setattr__(self, "_meta_text", text)
        return text

    @classmethod
    def from_meta(cls, digest: str, meta: Mapping[str, Any]) -> Entry:
        extra = {k: v for k, v in meta.items() if k not in ("kind", "key", "group")}
        return cls(digest, EntryKind(meta["kind"]), meta["key"], tuple(meta.get("group", ())), extra)


def value_key(value_digest: str, group: tuple[str, ...]) -> str:
    return digest_bytes(("v1|" + value_digest + "|" + ",".join(group)).encode())


def resource_key(
    record_digest: str, why: Unserializable, group: tuple[str, ...], *, made_by: bool, reads: Iterable[str] = ()
) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """Key, group and extra of an unstorable value's entry (a resource: a client, a lock).

    With a record of the cell that made it (`made_by`), the key names that record (its code
    and the state it started from): two resources are the same input only if the same
    cell run made them. Without one, the key is the type alone, which no replay may trust
    (`replayable_resource` is False for it). `reads` are the globals its code reads when
    used (a generator's, the methods' of a notebook class's instance): inputs of a cell
    that uses it.
    """
    extra: dict[str, Any] = {"type": why.type_name, "reason": why.reason}
    if reads:
        extra[READS] = sorted(reads)
    if made_by:
        return digest_bytes(("resource|" + record_digest).encode()), group, {**extra, MADE_BY: True}
    return digest_bytes(("unserializable|" + why.type_name).encode()), group, extra


MADE_BY = "made_by"
"""Entry extra of a resource whose key names the cell run that made it."""


def replayable_resource(entry: Entry) -> bool:
    """Whether a cell that reads this unstorable value may be replayed while it is still
    pending: its key says which recorded cell run made it (see `resource_key`)."""
    return entry.kind == UNSERIALIZABLE and bool(entry.extra.get(MADE_BY))


@dataclass
class CheckpointResult:
    """What one checkpoint changed and cost."""

    changed: dict[str, Entry]
    deleted: set[str]
    bytes_written: int
    seconds: float
    unserializable: dict[str, Unserializable]
    staged: list[StagedGroup | StagedBlob] = field(default_factory=list)
    """Groups hashed and copied but not written yet: commit them (in order) to make this checkpoint durable."""


class LiveState:
    """The current name -> Entry map plus what is needed to update it cheaply."""

    def __init__(self, objects: ObjectStore, namespace: dict[str, Any]) -> None:
        self.objects = objects
        self.namespace = namespace
        self.entries: dict[str, Entry] = {}
        # The object each name was bound to at the last checkpoint, compared by identity:
        # held weakly where it can be (`remember`), so a cell that deletes or rebinds a name
        # frees its old value when a plain kernel would, not when the cell ends.
        self._last: dict[str, Callable[[], Any]] = {}
        self._reach: dict[str, set[int]] = {}
        self._holders: dict[int, set[str]] = {}
        # Names whose reach holds an object whose death a notebook can see (`reach`).
        self._finalizes: set[str] = set()
        # A value found inside another name's complete reach is indexed by its own id only
        # (it reaches nothing more: `ax` inside `fig`). Such a short reach is as good as a
        # full one while that other name's reach stands; when it is forgotten, the short
        # ones become stale and are walked in full before the next grouping.
        self._inside: dict[str, str] = {}
        self._holds_inside: dict[str, set[str]] = {}
        self._stale: set[str] = set()
        self._staged: list[StagedGroup | StagedBlob] = []
        self.imports: Mapping[str, str] = {}
        """Notebook name -> the dotted name an import bound it to (`libcalls.Imports.bound`):
        a name still holding that library's own object is stored as a reference to it."""
        # Values this checkpoint's grouping just indexed: `remember` need not walk them again.
        self._indexed_now: dict[str, Any] = {}

    # -- identity tracking ----------------------------------------------------

    def last(self, name: str) -> Any:
        """The object `name` was bound to at its last checkpoint, or `_NOTHING` (also once
        that object is gone: whatever `name` holds now is then another one)."""
        ref = self._last.get(name)
        if ref is None:
            return _NOTHING
        value = ref()
        return _NOTHING if value is None and not isinstance(ref, _Held) else value

    def remember(self, name: str, value: Any) -> None:
        """Record that `name` is bound to `value`, as stored in its entry."""
        if self._indexed_now.get(name, _NOTHING) is not value:
            self._index(name, value)
        try:
            self._last[name] = weakref.ref(value)
        except TypeError:  # lists, dicts, tuples, numbers, strings: held as they are...
            # ...unless holding one would keep alive an object whose death the notebook sees
            # (a list of open files): then nothing is held, and the name counts as rebound
            # at every checkpoint (walked and digested again: never stale, only slower).
            self._last[name] = _Held(value) if name not in self._finalizes else _forgotten

    def release(self, name: str) -> None:
        """Stop holding the object `name` was bound to at its last checkpoint (a cell is
        about to drop it): the name then counts as rebound."""
        if name in self._last:
            self._last[name] = _forgotten

    def _remember_member(self, name: str, value: Any, group: tuple[str, ...]) -> None:
        """`remember`, for a member of a group this checkpoint just digested.

        A member the cell could not have changed (not walked by this checkpoint's grouping,
        which walks every candidate), still bound to the object its indexed reach was taken
        from, joined the group only because a walked member shares objects with it (`row`
        left by `for row in rows`). Walking it again would find what its reach already
        holds, plus at most what the walked members reach (objects put into it through
        them): its reach gains theirs instead of a second walk of a large container.
        Reaching too much only groups more names together; reaching too little would split
        a shared object on restore, which this never does.
        """
        if (
            name in self._indexed_now
            or name in self._stale
            or name not in self._reach
            or self.last(name) is not value
        ):
            self.remember(name, value)
            return
        ids = self._reach[name]
        for other in group:
            if other != name and other in self._indexed_now:
                more = self._reach.get(other, set()) - ids
                ids |= more
                for oid in more:
                    self._holders.setdefault(oid, set()).add(name)

    def name_bound_to(self, value: Any) -> str | None:
        """A name whose checkpointed object is `value` itself (the first in order), or None."""
        for name in sorted(self._holders.get(id(value), ())):
            if self.last(name) is value:
                return name
        return None

    def mark_used(self, reads: Iterable[str], code_digest: str, inputs: Mapping[str, str]) -> None:
        """A cell run (recorded or replayed) read these names: every unstorable one it did
        not bind anew gets a key that says so, so a later cell keys on the resource's whole
        life (made by one run, used by these), never only on the run that made it.

        `inputs` are the run's recorded input keys: a replay's are the recorded run's, so
        a replayed cell leaves the key the recorded one left."""
        self.entries.update(used_entries(self.entries, reads, code_digest, inputs))

    def forget(self, name: str) -> None:
        """Drop what is known about `name`'s current object (it is pending, deleted or lost)."""
        self._last.pop(name, None)
        self.forget_reach(name)

    def rebound(self, names: Iterable[str], namespace: dict[str, Any]) -> set[str]:
        """Names whose binding is new or differs (by identity) from the last checkpoint."""
        out = set()
        for name in names:
            if not dict.__contains__(namespace, name):
                continue
            if self.last(name) is not dict.__getitem__(namespace, name):
                out.add(name)
        return out

    def _index(self, name: str, value: Any, complete: dict[str, set[int]] | None = None) -> None:
        """Index what `value` reaches under `name`; `complete` holds this grouping's complete
        reaches so far (and gets this one if it is complete)."""
        self.forget_reach(name)
        if isinstance(value, types.ModuleType):
            return
        key = id(value)
        owner = next((other for other, ids in (complete or {}).items() if key in ids), None)
        if owner is not None:
            ids = {key}
            self._inside[name] = owner
            self._holds_inside.setdefault(owner, set()).add(name)
            if owner in self._finalizes:  # perhaps not this part of it: bringing it back early is harmless
                self._finalizes.add(name)
        else:
            ids, whole, finalizes = reach(value, watch=DeathWatch())
            if whole and complete is not None:
                complete[name] = ids
            if finalizes:
                self._finalizes.add(name)
        self._reach[name] = ids
        for oid in ids:
            self._holders.setdefault(oid, set()).add(name)

    def forget_reach(self, name: str) -> None:
        self._stale.discard(name)
        self._finalizes.discard(name)
        owner = self._inside.pop(name, None)
        if owner is not None:
            self._holds_inside.get(owner, set()).discard(name)
        self._stale.update(self._holds_inside.pop(name, ()))
        for oid in self._reach.pop(name, ()):
            holders = self._holders.get(oid)
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self._holders[oid]

    def _groups(self, candidates: set[str], namespace: dict[str, Any], present: set[str]) -> list[tuple[str, ...]]:
        """Co-variable groups containing the candidates, from fresh reach sets."""
        complete: dict[str, set[int]] = {}
        # Larger reaches first, so the values inside them need no walk of their own.
        for name in sorted((n for n in candidates if n in present), key=lambda n: (-len(self._reach.get(n, ())), n)):
            value = dict.__getitem__(namespace, name)
            self._index(name, value, complete)
            self._indexed_now[name] = value
        while self._stale:
            name = self._stale.pop()
            if name in present:
                value = dict.__getitem__(namespace, name)
                self._index(name, value)
                self._indexed_now[name] = value
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        todo = [n for n in candidates if n in present]
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            find(name)
            for oid in self._reach.get(name, ()):
                for other in self._holders.get(oid, ()):
                    if other != name and other in present:
                        parent[find(other)] = find(name)
                        if other not in seen:
                            todo.append(other)
        comps: dict[str, list[str]] = {}
        for name in seen:
            comps.setdefault(find(name), []).append(name)
        return [tuple(sorted(c)) for c in comps.values()]

    # -- checkpointing --------------------------------------------------------

    def checkpoint(
        self,
        namespace: dict[str, Any],
        user_names: set[str],
        candidates: set[str],
        *,
        unserializable_context: Callable[[], dict[str, Any]] | None = None,
    ) -> CheckpointResult:
        """Bring the entries up to date with `namespace` after a cell ran.

        `user_names` are the user's names now present (or pending); `candidates`
        are names the cell may have rebound or mutated.
        """
        started = time.perf_counter()
        staged: list[StagedGroup | StagedBlob] = []  # in commit order
        self._staged = staged
        try:
            return self._checkpoint(namespace, user_names, candidates, staged, started, unserializable_context)
        finally:
            self._indexed_now.clear()

    def _checkpoint(
        self,
        namespace: dict[str, Any],
        user_names: set[str],
        candidates: set[str],
        staged: list[StagedGroup | StagedBlob],
        started: float,
        unserializable_context: Callable[[], dict[str, Any]] | None,
    ) -> CheckpointResult:
        written = 0
        seen: dict[int, str | Unserializable] = {}  # aliases share one object: digest it once
        changed: dict[str, Entry] = {}
        unser: dict[str, Unserializable] = {}
        deleted = {n for n in self.entries if n not in user_names and not n.startswith("@")}
        for name in deleted:
            self.entries.pop(name, None)
            self.forget(name)
        present = {n for n in user_names if dict.__contains__(namespace, n)}
        candidates = (candidates & present) | (present - set(self.entries) - set(self._last))
        for group in self._groups(candidates, namespace, present):
            values: dict[str, Any] = {n: dict.__getitem__(namespace, n) for n in group}
            modules = {n for n, v in values.items() if isinstance(v, types.ModuleType) and _importable(v)}
            for name in modules:
                mod = values.pop(name)
                staged_doc = stage_json(self.objects, {"module": mod.__name__})
                staged.append(staged_doc)
                entry = Entry(
                    staged_doc.digest,
                    MODULE,
                    digest_bytes(("module|" + mod.__name__).encode()),
                    (name,),
                    {"module": mod.__name__, **({"local": True} if is_local_module(mod) else {})},
                )
                if self.entries.get(name) != entry:
                    changed[name] = entry
                self.entries[name] = entry
                self.remember(name, mod)
            refs = {id(values[n]): ref for n in values if n in self.imports and (ref := library_object(self.imports[n], values[n]))}
            for name in [n for n in values if id(values[n]) in refs] if refs else ():
                # Another name for the same object (`params = rcParams`) is that reference too.
                value = values.pop(name)
                module_name, attr = refs[id(value)]
                staged_doc = stage_json(self.objects, {"module": module_name, "attr": attr})
                staged.append(staged_doc)
                # Keyed on the content as well: a cell may change the object in place.
                content = _digest_once(value, seen)
                key = f"object|{module_name}|{attr}" + ("" if isinstance(content, Unserializable) else f"|{content}")
                entry = Entry(staged_doc.digest, MODULE, digest_bytes(key.encode()), (name,), {"module": module_name, "attr": attr})
                if self.entries.get(name) != entry:
                    changed[name] = entry
                self.entries[name] = entry
                self.remember(name, value)
            if not values:
                continue
            names = tuple(sorted(values))
            digests: dict[str, str | Unserializable] = {n: _digest_once(v, seen) for n, v in values.items()}
            bad = {n: d for n, d in digests.items() if isinstance(d, Unserializable)}
            if bad:
                written += self._store_split(values, names, bad, changed, unser, unserializable_context)
                continue
            keys = {n: value_key(str(digests[n]), names) for n in names}
            if all(self.entries.get(n) is not None and self.entries[n].key == keys[n] for n in names):
                for n in names:
                    self._remember_member(n, values[n], names)
                continue
            result = stage_group(self.objects, values)
            if isinstance(result, Unserializable):
                written += self._store_split(values, names, {}, changed, unser, unserializable_context)
                continue
            staged.append(result)
            digest = result.digest
            written += result.new_bytes
            for n in names:
                entry = Entry(digest, VALUE, keys[n], names, _value_extra(values[n], n in self._finalizes))
                self.entries[n] = entry
                changed[n] = entry
                self._remember_member(n, values[n], names)
        return CheckpointResult(changed, deleted, written, time.perf_counter() - started, unser, staged)

    def _store_split(
        self,
        values: dict[str, Any],
        names: tuple[str, ...],
        bad: dict[str, Unserializable],
        changed: dict[str, Entry],
        unser: dict[str, Unserializable],
        context: Callable[[], dict[str, Any]] | None,
    ) -> int:
        """Store a group that holds unserializable members: each member on its own.

        A member that pickles but shares objects with one that does not (`buf` under
        `mv = memoryview(buf)`, a StringIO a csv writer writes into) is not stored either:
        restored on its own it would be a copy the rebuilt value no longer sees. It is
        rebuilt with the others, by the cells that made and changed them."""
        written = 0
        # Still the object its producing cell made: keep pointing at that cell.
        kept = {n for n in names if (old := self.entries.get(n)) is not None and old.kind == UNSERIALIZABLE and self.last(n) is values[n]}
        results: dict[str, StagedGroup | Unserializable] = dict(bad)
        if not bad and not kept:
            results = {n: stage_group(self.objects, {n: values[n]}) for n in names}
        unstorable = sorted(kept | {n for n, r in results.items() if isinstance(r, Unserializable)})
        for n in names:
            if unstorable and not isinstance(results.get(n), Unserializable):
                holders = ", ".join(u for u in unstorable if u != n)
                results[n] = Unserializable(qualified_name(type(values[n])), f"shares objects with {holders}, which cannot be stored")
        for n in names:
            if n in kept:
                continue
            value = values[n]
            result = results[n]
            if isinstance(result, Unserializable):
                # The name makes each unstorable value of one cell run a record of its own:
                # two handles a cell opened must not come back as one object.
                record = {"name": n, "type": result.type_name, "reason": result.reason, **(context() if context else {})}
                parent = record.get("parent_entries")
                # The pre-cell state is the record's child, not only a digest in its JSON:
                # gc, du, verify and pack follow it.
                staged_doc = stage_json(self.objects, record, [parent] if parent else ())
                self._staged.append(staged_doc)
                key, group, extra = resource_key(staged_doc.digest, result, (n,), made_by=parent is not None, reads=value_reads(value))
                if n in self._finalizes:
                    extra[FINALIZES] = True
                entry = Entry(staged_doc.digest, UNSERIALIZABLE, key, group, extra)
                unser[n] = result
            else:
                self._staged.append(result)
                digest = result.digest
                written += result.new_bytes
                vd = digest_value(value)
                entry = Entry(digest, VALUE, value_key(str(vd), (n,)), (n,), _value_extra(value, n in self._finalizes))
            if self.entries.get(n) != entry:
                changed[n] = entry
            self.entries[n] = entry
            self.remember(n, value)
        return written

    def library_objects(self) -> dict[str, str]:
        """Names stored as a library's own object (`library_object`) -> its dotted name."""
        return {
            name: f"{entry.extra['module']}.{entry.extra['attr']}"
            for name, entry in self.entries.items()
            if entry.kind == MODULE and entry.extra.get("attr")
        }

    # -- restoring -------------------------------------------------------------

    def load(self, entry: Entry, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
        """The values stored for `entry`'s group (or its module); notebook functions among
        them get `namespace` (the kernel's, by default) as their globals."""
        if entry.kind == MODULE:
            found: Any = importlib.import_module(entry.extra["module"])
            attr = entry.extra.get("attr")
            for part in str(attr).split(".") if attr else ():
                found = getattr(found, part)
            return {entry.group[0]: found}
        if entry.kind != VALUE:
            raise LookupError(f"entry of kind {entry.kind} has no stored value")
        with restoring_into(self.namespace if namespace is None else namespace):
            return load_group(self.objects, entry.digest)


_BY_VALUE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, int, float, complex, str, bytes, bool, tuple, frozenset, type(None))


def library_object(dotted: str, value: Any) -> tuple[str, str] | None:
    """(module, attribute path) when `value` is the very object a loaded library (not a local
    module) holds at `dotted` (``matplotlib.rcParams``, ``os.environ``, ``sys.path``), else None.

    Stored by value, a replay would bind a copy, and a later cell changing it through this
    name would change the copy, not the library's. Classes, functions and immutable values
    are left to pickling, which keeps them by name or cannot tell a copy apart."""
    if isinstance(value, (_BY_VALUE, types.ModuleType)):
        return None
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        if is_local_module(module):
            return None
        found: Any = module
        for part in parts[cut:]:
            found = getattr(found, part, _NOTHING)
        return (module.__name__, ".".join(parts[cut:])) if found is value else None
    return None


def _importable(module: types.ModuleType) -> bool:
    """Whether importing ``module``'s name gives it back: only then is it recorded by name.

    A module loaded from a file without entering ``sys.modules`` (``spec_from_file_location``
    and ``exec_module``), or made with ``types.ModuleType``, is not: re-importing its name
    fails or gives another module. It is kept like any value bytes cannot bring back."""
    return sys.modules.get(module.__name__) is module


def _digest_once(value: Any, seen: dict[int, str | Unserializable]) -> str | Unserializable:
    key = id(value)  # valid here: every value is alive in the namespace during the checkpoint
    if key not in seen:
        seen[key] = digest_value(value)
    return seen[key]


def used_entries(entries: Mapping[str, Entry], reads: Iterable[str], code_digest: str, inputs: Mapping[str, str]) -> dict[str, Entry]:
    """The entries `LiveState.mark_used` gives the unstorable names a run read (a forecast
    of the notebook applies the same rule to the state it foresees)."""
    out = {}
    listed = ""
    for name in reads:
        entry = entries.get(name)
        if entry is None or entry.kind != UNSERIALIZABLE or inputs.get(name) != entry.key:
            continue
        listed = listed or "|".join(f"{k}={v}" for k, v in sorted(inputs.items()))
        used = digest_bytes(("used|" + code_digest + "|" + listed).encode())
        out[name] = Entry(entry.digest, entry.kind, used, entry.group, entry.extra)
    return out


READS = "reads"
"""Entry extra of a stored function or class: the globals it reads (`value_reads`)."""


def _value_extra(value: Any, finalizes: bool = False) -> dict[str, Any]:
    """Metadata the repeat kernel uses without loading the value: its type, for a function
    or class what it reads, so keying a cell that calls it loads nothing, and whether
    dropping it runs a finalizer a notebook can see (`FINALIZES`)."""
    extra: dict[str, Any] = {"type": f"{type(value).__module__}.{type(value).__qualname__}"}
    if finalizes:
        extra[FINALIZES] = True
    if isinstance(value, (types.FunctionType, type)):
        extra["callable"] = True
        extra[READS] = sorted(value_reads(value))
    elif type(value) in (list, tuple, dict, set, frozenset) and holds_only_plain(value):
        extra[PLAIN] = True
    return extra


FINALIZES = "finalizes"
"""Entry extra of a value whose reach holds an object with a finalizer a notebook can see
(`nbrewind.identity.finalizers`): a repeat brings it back before a cell drops it."""

def finalizes_on_drop(token: Any) -> bool:
    """Whether the pending value behind `token` (an Entry) must load before a cell drops it."""
    return isinstance(token, Entry) and bool(token.extra.get(FINALIZES))


PLAIN = "plain"
"""Entry extra of a stored container that holds nothing that can reach Dask (`session.plain`)."""


_NOTHING = object()


def _forgotten() -> None:
    """A `_last` record that holds nothing (as a dead weak reference)."""
    return None


class _Held:
    """A strong reference with `weakref.ref`'s call, for values that take no weak one."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value
