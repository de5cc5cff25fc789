"""Store upkeep behind ``jupyter nbrewind du / verify / gc``.

Each function returns a frozen dataclass the CLI prints (as a table or, via
``dataclasses.asdict``, as JSON). What is reachable is decided by one walk
(``nbrewind.store.walk``) from the same roots for all three: every cell run's
checkpoint entries (rebuild records included, whose pre-cell state is a tree
child) and outputs, the task log's results, the ref files, and anything else the
catalog names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nbrewind.errors import CorruptObjectError, ObjectNotFoundError, ReadOnlyStoreError, StoreError
from nbrewind.store.digest import is_digest
from nbrewind.store.store import Store
from nbrewind.store.walk import MISSING, Record, Walk, records, walk

__all__ = ["BrokenRecord", "CorruptObject", "DuReport", "GcReport", "VerifyReport", "du", "gc", "verify_store"]


@dataclass(frozen=True)
class DuReport:
    """Space used by a store.

    ``logical_bytes`` is the decoded size of the objects present; ``referenced_bytes``
    what the catalog's references add up to when every reference counts in full (an
    array unchanged across ten checkpoints counts ten times; a rebuild record counts
    the pre-cell state it is rebuilt from), i.e. what a store without deduplication
    would hold. ``reachable_objects`` are the objects the roots reach (what gc
    keeps); ``unreachable_bytes`` what the others occupy on disk.
    """

    objects: int
    stored_bytes: int
    logical_bytes: int
    referenced_bytes: int
    compression_ratio: float
    dedup_ratio: float
    reachable_objects: int = 0
    unreachable_bytes: int = 0


@dataclass(frozen=True)
class CorruptObject:
    """An object that failed verification and why."""

    digest: str
    problem: str


@dataclass(frozen=True)
class BrokenRecord:
    """A record (checkpoint entry, rebuild record, outputs, task result, ref) that
    reaches objects that are missing or damaged, and what to do about it.

    ``cell_run_id``/``execution_count`` name the first cell run whose record holds
    it; ``later_runs`` counts later cell runs whose checkpoints carry the same entry
    (an unchanged value is carried forward, so one lost object breaks them all).
    """

    kind: str
    digest: str
    name: str | None
    cell_run_id: int | None
    execution_count: int | None
    later_runs: int
    missing: list[str]
    corrupt: list[str]
    advice: str

    @property
    def message(self) -> str:
        """One line for people: which record, what is wrong, what to do."""
        return f"{_label(self)}: {_damage(self)}. {self.advice}"


@dataclass(frozen=True)
class VerifyReport:
    """Result of re-hashing every object of a store and walking every record.

    ``corrupt`` and ``missing`` list objects; ``broken`` the records they break.
    ``quarantined`` is true when damaged files were moved aside to ``corrupt/``
    (a writable store), so the next write of the same bytes recreates them.
    """

    checked: int
    corrupt: list[CorruptObject] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    broken: list[BrokenRecord] = field(default_factory=list)
    records: int = 0
    quarantined: bool = False

    @property
    def ok(self) -> bool:
        """True when nothing is corrupt and nothing referenced is missing."""
        return not self.corrupt and not self.missing


@dataclass(frozen=True)
class GcReport:
    """What ``gc`` removed (or, with ``dry_run``, would remove).

    ``damaged`` lists reachable objects that could not be read; they are kept,
    but a damaged tree's children cannot be known (``jupyter nbrewind verify``).
    """

    dry_run: bool
    reachable: int
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    kept_recent: int = 0
    missing: list[str] = field(default_factory=list)
    incomplete_trees: dict[str, list[str]] = field(default_factory=dict)
    temp_files: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)


def _walk(store: Store, *, verify: bool = False, quarantine: bool = False) -> tuple[list[Record], Walk]:
    roots = records(store.catalog, store.objects)
    return roots, walk(store.objects, (r.digest for r in roots), verify=verify, quarantine=quarantine)


def du(store: Store) -> DuReport:
    """Count objects and bytes, stored and logical, what the roots reach, and the
    deduplication ratio."""
    objects = store.objects
    count = stored = logical = 0
    sizes: dict[str, int] = {}
    stored_sizes: dict[str, int] = {}
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
        stored_sizes[digest] = stored_size
    _, reached = _walk(store)
    counts = store.catalog.reference_counts()
    for namespace in objects.ref_namespaces():
        for _, digest in objects.iter_refs(namespace):
            counts[digest] += 1
    memo: dict[str, int] = {}
    referenced = sum(reached.expanded_size(d, sizes, memo) * n for d, n in counts.items() if is_digest(d))
    reachable = reached.reached
    return DuReport(
        objects=count,
        stored_bytes=stored,
        logical_bytes=logical,
        referenced_bytes=referenced,
        compression_ratio=logical / stored if stored else 1.0,
        dedup_ratio=referenced / logical if logical else 1.0,
        reachable_objects=len(reachable & stored_sizes.keys()),
        unreachable_bytes=sum(n for d, n in stored_sizes.items() if d not in reachable),
    )


def verify_store(store: Store, *, quarantine: bool | None = None) -> VerifyReport:
    """Re-hash every object and walk every record; list the corrupt objects, the
    referenced ones that are missing, and the records they break.

    With ``quarantine`` (the default in a writable store) each damaged file is
    moved aside to ``corrupt/``: the next write of the same bytes, e.g. by running
    the notebook again on the audit kernel, then recreates it instead of keeping
    the damaged file.
    """
    objects = store.objects
    move = (not store.readonly) if quarantine is None else quarantine
    roots, reached = _walk(store, verify=True, quarantine=move)
    problems = dict(reached.problems)
    checked = len(reached.reached)
    for digest in objects.iter_digests():
        if digest in reached.children or digest in problems:
            continue
        try:
            objects.verify(digest, move_corrupt=move)
        except ObjectNotFoundError:
            continue  # removed by a concurrent gc
        except CorruptObjectError as exc:
            problems[digest] = str(exc)
        checked += 1
    corrupt = [CorruptObject(d, p) for d, p in sorted(problems.items()) if p != MISSING]
    missing = sorted(d for d, p in problems.items() if p == MISSING)
    return VerifyReport(
        checked=checked,
        corrupt=corrupt,
        missing=missing,
        broken=_broken(roots, reached),
        records=len(roots),
        quarantined=move and bool(corrupt),
    )


def _broken(roots: list[Record], reached: Walk) -> list[BrokenRecord]:
    """The records whose objects are not all there and sound, one per distinct
    (kind, name, digest): the first cell run holding it, and how many later ones do."""
    if not reached.problems:
        return []
    first: dict[tuple[str, str | None, str], Record] = {}
    later: dict[tuple[str, str | None, str], int] = {}
    for record in roots:
        if not reached.problems_below(record.digest):
            continue
        key = (record.kind, record.name, record.digest)
        if key in first:
            later[key] = later.get(key, 0) + 1
        else:
            first[key] = record
    out = []
    for key, record in first.items():
        bad = reached.problems_below(record.digest)
        out.append(
            BrokenRecord(
                kind=record.kind,
                digest=record.digest,
                name=record.name,
                cell_run_id=record.cell_run_id,
                execution_count=record.execution_count,
                later_runs=later.get(key, 0),
                missing=sorted(d for d in bad if reached.problems[d] == MISSING),
                corrupt=sorted(d for d in bad if reached.problems[d] != MISSING),
                advice=_advice(record),
            )
        )
    return out


_AUDIT_AGAIN = (
    "Run the notebook again on the audit kernel (`jupyter nbrewind run NOTEBOOK --kernel audit`): "
    "a value that comes out the same is stored under the same digest, which mends this record"
)


def _advice(record: Record) -> str:
    """What repairs a broken record, and what happens until then (only what is true)."""
    name = repr(record.name)
    if record.kind == "checkpoint":
        return f"Until then a repeat cannot restore {name} from this record. {_AUDIT_AGAIN}"
    if record.kind == "rebuild":
        made = f" ({record.type})" if record.type else ""
        return (
            f"{name}{made} cannot be stored; a repeat rebuilds it by re-running its cell from the state "
            f"before it, and that state is not all there. Run the notebook again on the audit kernel "
            f"(`jupyter nbrewind run NOTEBOOK --kernel audit`): the new cell run records how to make {name} "
            f"again, and a state that comes out the same mends this record too"
        )
    if record.kind == "outputs":
        return f"Until then a repeat cannot replay this cell run and runs the cell instead. {_AUDIT_AGAIN}"
    if record.kind == "task" or (record.kind == "ref" and (record.name or "").startswith("tasks/")):
        return (
            "The next run that submits this task finds no usable cached result, recomputes it and stores "
            "it again"
        )
    if record.kind == "ref":
        return f"Delete the ref file refs/{record.name}, or store its object again"
    return _AUDIT_AGAIN


def _label(record: BrokenRecord) -> str:
    run = ""
    if record.cell_run_id is not None:
        run = f"cell run #{record.cell_run_id}"
        if record.execution_count is not None:
            run += f" (In [{record.execution_count}])"
        if record.later_runs:
            run += f" and {record.later_runs} later"
    what = {
        "checkpoint": f"checkpoint entry {record.name!r}",
        "rebuild": f"rebuild record of {record.name!r}",
        "outputs": "outputs",
        "task": f"task result {record.name!r}",
        "ref": f"ref {record.name}",
    }.get(record.kind, f"catalog reference {record.digest}")
    return f"{run}: {what}" if run else what


def _damage(record: BrokenRecord) -> str:
    parts = []
    if record.missing:
        parts.append(f"{len(record.missing)} object(s) missing (first {record.missing[0]})")
    if record.corrupt:
        parts.append(f"{len(record.corrupt)} object(s) damaged (first {record.corrupt[0]})")
    return " and ".join(parts)


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
    if not dry_run and store.catalog_recreated:
        raise StoreError(
            f"gc refuses to run on {store.root}: its catalog was missing or empty, so nothing would count as "
            "reachable and every object would be removed. Restore the catalog, or audit the notebook again first"
        )
    objects = store.objects
    _, reached = _walk(store)
    reachable = reached.reached

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
        missing=sorted(reached.missing),
        incomplete_trees=reached.incomplete_trees(),
        temp_files=sorted(temps),
        damaged=sorted(reached.corrupt),
    )
