"""The one walk over the store's object graph, shared by gc, du, verify and pack.

Starting from root digests it follows every tree to its children, so that what
gc keeps, what du counts, what verify checks and what pack ships are the same
set of objects. A tree is recognised by its content, not by its header's kind
byte, which no digest covers: a flipped kind byte cannot hide a tree's children.

Stores written before rebuild records named the pre-cell state as a tree child
kept those references only inside the records' JSON (``"parent_entries"``: the
digest of a document whose ``"entries"`` map names to ``[digest, meta]``). A
childless tree with such a JSON payload has those digests followed as its
children, so old stores keep their rebuild records through gc and pack.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from nbrewind.errors import CorruptObjectError, NotATreeError, ObjectNotFoundError
from nbrewind.store.catalog import Catalog
from nbrewind.store.digest import is_digest
from nbrewind.store.objects import ObjectStore

__all__ = ["MISSING", "Record", "Walk", "records", "walk"]

T = TypeVar("T")

MISSING = "missing"
"""The problem reported for an object that is referenced but not in the store."""


@dataclass
class Walk:
    """What a walk reached.

    ``children`` holds every reached object that could be read: trees map to
    their children (legacy JSON references included), leaves to ``()``.
    ``problems`` holds every reached digest that is missing (``MISSING``) or
    damaged (why). ``payload_sizes`` is each tree's payload length, for du.
    """

    children: dict[str, tuple[str, ...]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    payload_sizes: dict[str, int] = field(default_factory=dict)
    _bad_below: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    @property
    def reached(self) -> set[str]:
        """Every digest the roots reach that is in the store (damaged ones included)."""
        return set(self.children) | {d for d, p in self.problems.items() if p != MISSING}

    @property
    def missing(self) -> set[str]:
        """Digests reached but not in the store."""
        return {d for d, p in self.problems.items() if p == MISSING}

    @property
    def corrupt(self) -> dict[str, str]:
        """Digests reached whose file is damaged, with why."""
        return {d: p for d, p in self.problems.items() if p != MISSING}

    def incomplete_trees(self) -> dict[str, list[str]]:
        """Trees with children that are not in the store: tree -> those children."""
        missing = self.missing
        out: dict[str, list[str]] = {}
        for digest, kids in self.children.items():
            absent = [c for c in kids if c in missing]
            if absent:
                out[digest] = absent
        return out

    def problems_below(self, root: str) -> frozenset[str]:
        """The missing or damaged digests ``root`` reaches (itself included)."""

        def combine(digest: str, below: list[frozenset[str]]) -> frozenset[str]:
            bad = {digest} if digest in self.problems else set()
            for part in below:
                bad |= part
            return frozenset(bad) if bad else _NONE

        return self._fold(root, self._bad_below, combine)

    def expanded_size(self, root: str, sizes: dict[str, int], memo: dict[str, int]) -> int:
        """What ``root`` holds when every reference counts in full: a tree is its
        payload plus its children's expanded sizes, a leaf its ``sizes`` entry."""

        def combine(digest: str, below: list[int]) -> int:
            if digest in self.payload_sizes:
                return self.payload_sizes[digest] + sum(below)
            return sizes.get(digest, 0)

        return self._fold(root, memo, combine)

    def _fold(self, root: str, memo: dict[str, T], combine: Callable[[str, list[T]], T]) -> T:
        """``combine(digest, [children's values])`` bottom-up from ``root``, each digest
        once (``memo``). Iterative: chains of rebuild records can be as deep as a
        notebook is long."""
        if root in memo:
            return memo[root]
        stack: list[tuple[str, bool]] = [(root, False)]
        open_: set[str] = set()  # expanded, children not done yet (a cycle back to one adds nothing)
        while stack:
            digest, expanded = stack.pop()
            if digest in memo or (not expanded and digest in open_):
                continue
            kids = self.children.get(digest, ())
            if not expanded:
                pending = [c for c in kids if c not in memo]
                if pending:
                    open_.add(digest)
                    stack.append((digest, True))
                    stack.extend((c, False) for c in pending)
                    continue
            open_.discard(digest)
            memo[digest] = combine(digest, [memo[c] for c in kids if c in memo])
        return memo[root]


_NONE: frozenset[str] = frozenset()

# The checkpoint-entry kind of a value that could not be stored and is rebuilt by
# re-running its cell (the session's word; the store only uses it for labels).
_UNSERIALIZABLE = "unserializable"


@dataclass(frozen=True)
class Record:
    """A root of the walk: something the catalog or a ref file keeps, and the object it names.

    ``kind`` is ``"checkpoint"`` (a name in a cell run's checkpoint), ``"rebuild"``
    (a name whose value could not be stored: its record says how to make it again,
    from the state before its cell), ``"outputs"`` (a cell run's recorded outputs),
    ``"task"`` (a task-log result), ``"ref"`` (a ref file, e.g. a task result
    written by a worker) or ``"catalog"`` (any other digest the catalog names).
    """

    kind: str
    digest: str
    cell_run_id: int | None = None
    execution_count: int | None = None
    name: str | None = None
    """The variable, the task's key prefix (or fingerprint), or the ref's ``namespace/name``."""
    type: str | None = None
    """For a checkpoint or rebuild record: the value's type, when recorded."""


def records(catalog: Catalog, objects: ObjectStore) -> list[Record]:
    """Every root: each cell run's checkpoint entries and outputs, the task log's
    results, the ref files, and whatever else the catalog points at."""
    found: list[Record] = []
    for run in catalog.cell_runs():
        if run.outputs and is_digest(run.outputs):
            found.append(Record("outputs", run.outputs, run.id, run.execution_count))
        if run.checkpoint_id is None:
            continue
        for name, (digest, meta) in catalog.checkpoint_entries(run.checkpoint_id).items():
            if not is_digest(digest):
                continue  # a pseudo-entry with nothing stored ("absent")
            kind = "rebuild" if meta.get("kind") == _UNSERIALIZABLE else "checkpoint"
            type_name = meta.get("type")
            found.append(
                Record(kind, digest, run.id, run.execution_count, name, type_name if isinstance(type_name, str) else None)
            )
    for task in catalog.task_log():
        if task.result_digest and is_digest(task.result_digest):
            found.append(Record("task", task.result_digest, task.cell_run_id, None, task.key_prefix or task.fingerprint))
    for namespace in objects.ref_namespaces():
        for name, digest in objects.iter_refs(namespace):
            found.append(Record("ref", digest, name=f"{namespace}/{name}"))
    covered = {r.digest for r in found}
    for digest in sorted(catalog.referenced_digests() - covered):
        if is_digest(digest):
            found.append(Record("catalog", digest))
    return found


def _legacy_references(payload: bytes) -> list[str]:
    """Digests an old rebuild record or pre-cell state document names in its JSON."""
    if not payload.startswith(b"{") or (b'"entries"' not in payload and b'"parent_entries"' not in payload):
        return []
    try:
        doc = json.loads(payload)
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    found: list[str] = []
    parent = doc.get("parent_entries")
    if isinstance(parent, str) and is_digest(parent):
        found.append(parent)
    entries = doc.get("entries")
    if isinstance(entries, dict):
        for item in entries.values():
            if isinstance(item, list) and item and isinstance(item[0], str) and is_digest(item[0]):
                found.append(item[0])
    return sorted(set(found))


def walk(
    objects: ObjectStore, roots: Iterable[str], *, verify: bool = False, quarantine: bool = False
) -> Walk:
    """Follow ``roots`` (non-digests are ignored) through every tree they reach.

    With ``verify`` every reached object is read in full and re-hashed; without,
    only trees are read (a tree is always verified before its children are
    trusted) and a leaf costs a look at its first bytes. With ``quarantine`` a
    damaged object is moved aside to ``corrupt/`` (in a writable store), so that
    the next write of the same bytes recreates it.
    """
    result = Walk()
    stack = sorted({d for d in roots if is_digest(d)}, reverse=True)
    while stack:
        digest = stack.pop()
        if digest in result.children or digest in result.problems:
            continue
        try:
            tree = objects.get_children(digest, verify=verify, move_corrupt=quarantine)
        except ObjectNotFoundError:
            result.problems[digest] = MISSING
            continue
        except (CorruptObjectError, NotATreeError) as exc:
            result.problems[digest] = str(exc)
            continue
        if tree is None:
            result.children[digest] = ()
            continue
        kids, payload = tree
        if not kids:
            kids = _legacy_references(payload)
        result.children[digest] = tuple(kids)
        result.payload_sizes[digest] = len(payload)
        stack.extend(reversed(kids))
    return result
