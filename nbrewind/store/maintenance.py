"""Store upkeep behind ``jupyter nbrewind du / verify / gc``.

Each function returns a frozen dataclass the CLI prints (as a table or, via
``dataclasses.asdict``, as JSON). Reachability starts from the catalog's roots
(checkpoint entries, cell-run outputs, task-log results, catalog refs) plus every
ref file under ``refs/``, and follows trees to their children.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from nbrewind.errors import CorruptObjectError, NotATreeError, ObjectNotFoundError, ReadOnlyStoreError
from nbrewind.store.digest import is_digest
from nbrewind.store.objects import TREE_MAGIC
from nbrewind.store.store import Store

__all__ = ["CorruptObject", "DuReport", "GcReport", "VerifyReport", "du", "gc", "verify_store"]


@dataclass(frozen=True)
class DuReport:
    """Space used by a store.

    ``logical_bytes`` is the decoded size of the objects present; ``referenced_bytes``
    what the catalog's references add up to when every reference counts in full (an
    array unchanged across ten checkpoints counts ten times), i.e. what a store
    without deduplication would hold.
    """

    objects: int
    stored_bytes: int
    logical_bytes: int
    referenced_bytes: int
    compression_ratio: float
    dedup_ratio: float


@dataclass(frozen=True)
class CorruptObject:
    """An object that failed verification and why."""

    digest: str
    problem: str


@dataclass(frozen=True)
class VerifyReport:
    """Result of re-hashing every object of a store."""

    checked: int
    corrupt: list[CorruptObject] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is corrupt and nothing referenced is missing."""
        return not self.corrupt and not self.missing


@dataclass(frozen=True)
class GcReport:
    """What ``gc`` removed (or, with ``dry_run``, would remove)."""

    dry_run: bool
    reachable: int
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    kept_recent: int = 0
    missing: list[str] = field(default_factory=list)
    incomplete_trees: dict[str, list[str]] = field(default_factory=dict)
    temp_files: list[str] = field(default_factory=list)


def _roots(store: Store) -> Iterator[str]:
    yield from store.catalog.referenced_digests()
    for namespace in store.objects.ref_namespaces():
        for _, digest in store.objects.iter_refs(namespace):
            yield digest


def du(store: Store) -> DuReport:
    """Count objects and bytes, stored and logical, and the deduplication ratio."""
    objects = store.objects
    count = stored = logical = 0
    sizes: dict[str, int] = {}
    for digest in objects.iter_digests():
        try:
            stored_size = objects.stored_size(digest)
            size = objects.logical_size(digest)
        except (ObjectNotFoundError, CorruptObjectError):
            continue  # deleted meanwhile, or damaged (verify reports those)
        count += 1
        stored += stored_size
        logical += size or 0
        sizes[digest] = size or 0

    expanded: dict[str, int] = {}

    def expand(digest: str) -> int:
        # The user-visible size: a tree counts as its payload plus its children.
        if digest in expanded:
            return expanded[digest]
        expanded[digest] = 0  # guards against a (corrupt) cycle
        total = sizes.get(digest, 0)
        if digest in sizes:
            try:
                if objects.is_tree(digest):
                    children, payload = objects.get_tree(digest)
                    total = len(payload) + sum(expand(c) for c in children)
            except (CorruptObjectError, NotATreeError, ObjectNotFoundError):
                pass
        expanded[digest] = total
        return total

    counts = store.catalog.reference_counts()
    for namespace in objects.ref_namespaces():
        for _, digest in objects.iter_refs(namespace):
            counts[digest] += 1
    referenced = sum(expand(d) * n for d, n in counts.items() if is_digest(d))
    return DuReport(
        objects=count,
        stored_bytes=stored,
        logical_bytes=logical,
        referenced_bytes=referenced,
        compression_ratio=logical / stored if stored else 1.0,
        dedup_ratio=referenced / logical if logical else 1.0,
    )


def verify_store(store: Store) -> VerifyReport:
    """Re-hash every object; list the corrupt ones, and digests that the catalog,
    refs or a tree point at but that are not in the store."""
    objects = store.objects
    checked = 0
    corrupt: list[CorruptObject] = []
    present: set[str] = set()
    wanted: set[str] = {d for d in _roots(store) if is_digest(d)}
    for digest in objects.iter_digests():
        try:
            content = objects.get(digest)
        except ObjectNotFoundError:
            continue  # removed by a concurrent gc
        except CorruptObjectError as exc:
            corrupt.append(CorruptObject(digest, str(exc)))
            present.add(digest)
            checked += 1
            continue
        checked += 1
        present.add(digest)
        if content.startswith(TREE_MAGIC) and objects.is_tree(digest):
            wanted.update(objects.get_tree(digest)[0])
    return VerifyReport(checked=checked, corrupt=corrupt, missing=sorted(wanted - present))


def gc(
    store: Store,
    *,
    dry_run: bool = True,
    grace_seconds: float = 900.0,
    temp_max_age: float = 3600.0,
) -> GcReport:
    """Remove objects no root reaches, and temporary files older than ``temp_max_age``.

    Objects modified less than ``grace_seconds`` ago are kept even when unreachable:
    a kernel may have stored them and not yet recorded them in the catalog (a
    re-put refreshes an object's mtime too). Run gc when no kernel is writing for
    a guaranteed result. ``dry_run`` (the default) only reports.
    """
    if not dry_run and store.readonly:
        raise ReadOnlyStoreError(f"gc cannot remove anything from {store.root}: it was opened read-only")
    objects = store.objects
    reachable: set[str] = set()
    missing: set[str] = set()
    incomplete: dict[str, list[str]] = {}
    stack = [d for d in _roots(store) if is_digest(d)]
    while stack:
        digest = stack.pop()
        if digest in reachable or digest in missing:
            continue
        if not objects.has(digest):
            missing.add(digest)
            continue
        reachable.add(digest)
        try:
            if not objects.is_tree(digest):
                continue
            children = objects.get_tree(digest)[0]
        except (CorruptObjectError, NotATreeError, ObjectNotFoundError):
            continue  # kept as reachable; verify reports the damage
        absent = [c for c in children if not objects.has(c)]
        if absent:
            incomplete[digest] = absent
        stack.extend(children)

    now = time.time()
    removed: list[str] = []
    removed_bytes = kept_recent = 0
    for digest in objects.iter_digests():
        if digest in reachable:
            continue
        try:
            info = objects.path_of(digest).stat()
        except FileNotFoundError:
            continue
        if now - info.st_mtime < grace_seconds:
            kept_recent += 1
            continue
        if dry_run or objects.delete(digest):
            removed.append(digest)
            removed_bytes += info.st_size

    temps: list[str] = []
    for path in objects.iter_temp_files():
        try:
            if now - path.stat().st_mtime < temp_max_age:
                continue
            if not dry_run:
                path.unlink()
        except FileNotFoundError:
            continue  # its writer finished (renamed it) meanwhile
        temps.append(str(path))

    return GcReport(
        dry_run=dry_run,
        reachable=len(reachable),
        removed=sorted(removed),
        removed_bytes=removed_bytes,
        kept_recent=kept_recent,
        missing=sorted(missing),
        incomplete_trees=incomplete,
        temp_files=sorted(temps),
    )
