"""Retention: drop all but the newest kernel sessions from a store's catalog, so a store
does not grow forever (`jupyter nbrewind prune`).

What the kept sessions still need stays: the recorded runs their replays re-sent, every
checkpoint those runs restore from and the checkpoints they were built on, and each
task whose fingerprint a kept session computed or loaded (its log rows and its cache
ref). The rows are removed through the catalog's own connection inside its
transaction, so the catalog's signature follows the change; then gc removes the
objects nothing reaches any more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbrewind.errors import StoreError
from nbrewind.store.maintenance import gc
from nbrewind.store.report import _source_run, sessions
from nbrewind.store.store import Store

#: The ref namespace of the task cache (``nbrewind.tasks.cache.REF_NAMESPACE``; the
#: store layer does not import tasks).
TASK_REF_NAMESPACE = "tasks"


@dataclass
class PrunePlan:
    """What pruning to the newest `keep_sessions` sessions removes, or removed."""

    store: str
    keep_sessions: int
    dry_run: bool
    kept_sessions: list[str | None] = field(default_factory=list)
    dropped_sessions: list[str | None] = field(default_factory=list)
    cell_runs: int = 0
    """Cell runs removed (older sessions' runs that no kept replay needs)."""
    cell_runs_kept_for_replays: int = 0
    checkpoints: int = 0
    task_rows: int = 0
    task_refs: int = 0
    objects_removed: int = 0
    bytes_removed: int = 0
    objects_kept_recent: int = 0


def plan_prune(store: Store, keep_sessions: int) -> tuple[PrunePlan, set[int], set[int], set[int], set[str]]:
    """The plan, and the ids of the cell runs, checkpoints and task rows to delete and
    the task fingerprints whose cache refs go."""
    if keep_sessions < 1:
        raise StoreError("--keep-sessions must be at least 1")
    known = sessions(store)
    kept = {s.session for s in known[-keep_sessions:]}
    plan = PrunePlan(str(store.root), keep_sessions, True, [s.session for s in known[-keep_sessions:]],
                     [s.session for s in known[:-keep_sessions]])
    runs = store.catalog.cell_runs()
    by_id = {r.id: r for r in runs}
    keep = {r.id for r in runs if r.session in kept}
    for run_id in list(keep):  # the recorded runs kept replays re-sent
        source = _source_run(by_id[run_id], by_id)
        if source is not None:
            keep.add(source.id)
    headers = store.catalog.checkpoints()
    parents = {c.id: c.parent_id for c in headers}
    owners = {c.id: c.cell_run_id for c in headers}
    kept_checkpoints: set[int] = set()
    pending = [by_id[i].checkpoint_id for i in keep if by_id[i].checkpoint_id is not None]
    while pending:
        checkpoint = pending.pop()
        if checkpoint is None or checkpoint in kept_checkpoints:
            continue
        kept_checkpoints.add(checkpoint)
        owner = owners.get(checkpoint)
        if owner is not None and owner not in keep:
            keep.add(owner)  # a checkpoint row names its cell run: that run stays with it
            if by_id.get(owner) is not None and by_id[owner].checkpoint_id is not None:
                pending.append(by_id[owner].checkpoint_id)
        pending.append(parents.get(checkpoint))
    drop_runs = {r.id for r in runs} - keep
    drop_checkpoints = set(parents) - kept_checkpoints
    tasks = store.catalog.task_log()
    kept_fingerprints = {t.fingerprint for t in tasks if t.cell_run_id in keep}
    drop_tasks = {t.id for t in tasks if t.fingerprint not in kept_fingerprints}
    drop_refs = {t.fingerprint for t in tasks if t.fingerprint not in kept_fingerprints}
    plan.cell_runs = len(drop_runs)
    plan.cell_runs_kept_for_replays = len(keep - {r.id for r in runs if r.session in kept})
    plan.checkpoints, plan.task_rows, plan.task_refs = len(drop_checkpoints), len(drop_tasks), len(drop_refs)
    return plan, drop_runs, drop_checkpoints, drop_tasks, drop_refs


def prune(store: Store, keep_sessions: int, *, dry_run: bool = True, min_age_seconds: float = 900.0) -> PrunePlan:
    """Keep the newest `keep_sessions` kernel sessions and what they need; with
    ``dry_run`` (the default) only report. Objects younger than `min_age_seconds` are
    kept by the gc that follows, as `gc` keeps them (a kernel may be writing)."""
    plan, runs, checkpoints, tasks, refs = plan_prune(store, keep_sessions)
    if dry_run:
        return plan
    store.catalog.delete_rows(cell_runs=runs, checkpoints=checkpoints, tasks=tasks)
    for fingerprint in refs:
        store.objects.ref_delete(TASK_REF_NAMESPACE, fingerprint)
    report = gc(store, dry_run=False, grace_seconds=min_age_seconds)
    plan.dry_run = False
    plan.objects_removed, plan.bytes_removed = len(report.removed), report.removed_bytes
    plan.objects_kept_recent = report.kept_recent
    return plan
