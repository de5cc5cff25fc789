"""The cell-run log as rows for people (`%nbrewind log`, `jupyter nbrewind log`) and programs (`--json`).

Everything here reads the catalog through its public read methods and returns plain
data: cell rows with what a replay saved, the tasks of those rows, one run's summary
table, and a store's status.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nbrewind.store.store import Store

if TYPE_CHECKING:
    from nbrewind.store import CellRun

_SOURCE_RUN = re.compile(r"cell run #(\d+)")


@dataclass(frozen=True)
class LogRow:
    """One cell run: what the kernel decided and why, and what it cost."""

    id: int
    session: str | None
    kernel: str | None
    execution_count: int | None
    cell_id: str | None
    decision: str | None
    reason: str | None
    status: str | None
    duration: float | None
    bytes_written: int | None
    task_hits: int
    task_misses: int
    code: str
    inputs: int = 0
    """How many recorded inputs the cell key checked."""
    replayed_from: int | None = None
    """For a replay: the id of the recorded run whose outputs were re-sent."""
    recorded_duration: float | None = None
    """For a replay: how long the recorded run took."""
    saved: float = 0.0
    """Seconds saved against the recorded runs: a replay's recorded time less its own,
    plus the recorded compute time of each task loaded from the cache."""
    started: float | None = None
    """When the cell run started (seconds since the epoch)."""

    @property
    def why(self) -> str:
        """The decision in words: for a replay, that nothing it depends on changed."""
        if self.decision == "replayed":
            source = f" (cell run #{self.replayed_from})" if self.replayed_from else ""
            return f"code and all {self.inputs} recorded inputs unchanged{source}"
        return self.reason or ""


@dataclass(frozen=True)
class TaskRow:
    """One Dask task a cell run computed or loaded from the cache."""

    cell_run_id: int | None
    fingerprint: str
    key_prefix: str | None
    hit: bool
    duration: float | None
    worker: str | None
    nbytes: int | None
    saved: float
    """For a hit: the recorded compute time of the task."""


def cell_log(store: Store, *, session: str | None = None, last_session: bool = False) -> list[LogRow]:
    """Cell runs in order; only one kernel session's if `session` (or the newest, with `last_session`)."""
    everything = store.catalog.cell_runs()
    runs = everything
    if last_session and runs:
        session = runs[-1].session
    if session is not None:
        runs = [r for r in runs if r.session == session]
    by_id = {r.id: r for r in everything}
    wanted = {r.id for r in runs}
    tasks: dict[int, tuple[int, int, float]] = {}
    compute = _compute_seconds(store)
    for entry in store.catalog.task_log():
        if entry.cell_run_id is None or entry.cell_run_id not in wanted:
            continue
        hits, misses, saved = tasks.get(entry.cell_run_id, (0, 0, 0.0))
        gain = max(0.0, compute.get(entry.fingerprint, 0.0) - (entry.duration or 0.0)) if entry.hit else 0.0
        tasks[entry.cell_run_id] = (hits + int(entry.hit), misses + int(not entry.hit), saved + gain)
    rows = []
    for r in runs:
        hits, misses, task_saved = tasks.get(r.id, (r.task_hits or 0, r.task_misses or 0, 0.0))
        source = _source_run(r, by_id)
        recorded = source.duration if source is not None else None
        saved = task_saved
        if r.decision == "replayed" and recorded is not None:
            saved += max(0.0, recorded - (r.duration or 0.0))
        rows.append(
            LogRow(
                id=r.id,
                session=r.session,
                kernel=r.kernel,
                execution_count=r.execution_count,
                cell_id=r.cell_id,
                decision=r.decision,
                reason=r.reason,
                status=r.status,
                duration=r.duration,
                bytes_written=r.bytes_written,
                task_hits=hits,
                task_misses=misses,
                code=r.code,
                inputs=len(r.inputs or {}),
                replayed_from=source.id if source is not None else None,
                recorded_duration=recorded,
                saved=saved,
                started=r.started,
            )
        )
    return rows


def _source_run(run: CellRun, by_id: dict[int, CellRun]) -> CellRun | None:
    """The executed run a replay re-sent: named in its reason (followed through replays of
    replays), else the newest earlier executed run of the same code."""
    if run.decision != "replayed":
        return None
    found: CellRun | None = run
    seen: set[int] = set()
    while found is not None and found.decision == "replayed" and found.id not in seen:
        seen.add(found.id)
        match = _SOURCE_RUN.search(found.reason or "")
        found = by_id.get(int(match.group(1))) if match else None
    if found is not None:
        return found
    earlier = [r for r in by_id.values() if r.code_digest == run.code_digest and r.decision == "executed" and r.id < run.id]
    return earlier[-1] if earlier else None


def _compute_seconds(store: Store) -> dict[str, float]:
    """Per task fingerprint, the time its first computation took."""
    seconds: dict[str, float] = {}
    for entry in store.catalog.task_log():
        if not entry.hit and entry.duration is not None and entry.fingerprint not in seconds:
            seconds[entry.fingerprint] = entry.duration
    return seconds


def task_rows(store: Store, cell_run_ids: Iterable[int]) -> list[TaskRow]:
    """The tasks of these cell runs (the same scope as the cell rows), in log order."""
    wanted = set(cell_run_ids)
    compute = _compute_seconds(store)
    return [
        TaskRow(
            e.cell_run_id, e.fingerprint, e.key_prefix, bool(e.hit), e.duration, e.worker, e.nbytes,
            max(0.0, compute.get(e.fingerprint, 0.0) - (e.duration or 0.0)) if e.hit else 0.0,
        )
        for e in store.catalog.task_log()
        if e.cell_run_id in wanted
    ]


def format_log(rows: list[LogRow]) -> str:
    """A fixed-width table, one line per cell run."""
    if not rows:
        return "no cell runs recorded"
    header = f"{'run':>5} {'kernel':<7} {'In':>4} {'decision':<9} {'status':<7} {'time':>9} {'saved':>9} {'bytes':>12} {'tasks hit/miss':>14}  reason / code"
    lines = [header, "-" * len(header)]
    for r in rows:
        first = (r.code.strip().splitlines() or [""])[0][:40]
        tasks = f"{r.task_hits}/{r.task_misses}" if (r.task_hits or r.task_misses) else "-"
        lines.append(
            f"{r.id:>5} {r.kernel or '':<7} {r.execution_count if r.execution_count is not None else '':>4} "
            f"{r.decision or '':<9} {r.status or '':<7} {_seconds(r.duration):>9} {_seconds(r.saved) if r.saved else '-':>9} "
            f"{r.bytes_written or 0:>12,} {tasks:>14}  {r.why} | {first}"
        )
    return "\n".join(lines)


def format_tasks(tasks: Sequence[TaskRow]) -> str:
    """The tasks of the shown cell runs: hit or miss, duration and worker."""
    if not tasks:
        return "no Dask tasks recorded for these cell runs"
    header = f"{'run':>5} {'task':<12} {'key':<24} {'hit':<4} {'time':>9} {'saved':>9} {'bytes':>12}  worker"
    lines = [header, "-" * len(header)]
    for t in tasks:
        lines.append(
            f"{t.cell_run_id if t.cell_run_id is not None else '':>5} {t.fingerprint[:12]:<12} {(t.key_prefix or '')[:24]:<24} "
            f"{'hit' if t.hit else 'miss':<4} {_seconds(t.duration):>9} {_seconds(t.saved) if t.saved else '-':>9} "
            f"{t.nbytes or 0:>12,}  {t.worker or 'local'}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class SummaryRow:
    """One code cell of a headless run, joined with what the kernel recorded for it."""

    cell: int
    execution_count: int | None
    decision: str
    why: str
    seconds: float | None
    task_hits: int
    task_misses: int
    saved: float
    error: str | None


def run_summary(store: Store, cells: Sequence[tuple[int, int | None, float | None, str | None]]) -> list[SummaryRow]:
    """The final table of a run: for each (cell number, execution count, seconds, error)
    the newest session's record with that execution count ("ran" or "replayed")."""
    rows = {r.execution_count: r for r in cell_log(store, last_session=True)}
    out = []
    for cell, count, seconds, error in cells:
        row = rows.get(count) if count is not None else None
        if row is None:
            out.append(SummaryRow(cell, count, "not run" if count is None else "?",
                                  "not reached" if count is None else "no record found", seconds, 0, 0, 0.0, error))
            continue
        decision = "replayed" if row.decision == "replayed" else "ran"
        out.append(SummaryRow(cell, count, decision, row.why, seconds, row.task_hits, row.task_misses, row.saved, error))
    return out


def format_summary(rows: Sequence[SummaryRow]) -> str:
    """The table `jupyter nbrewind run` prints at the end, with a totals line."""
    header = f"{'cell':>4} {'In':>4}  {'':<8} {'time':>9} {'tasks hit/miss':>14} {'saved':>9}  why"
    lines = [header, "-" * len(header)]
    for r in rows:
        tasks = f"{r.task_hits}/{r.task_misses}" if (r.task_hits or r.task_misses) else "-"
        why = r.why if r.error is None else f"{r.why}; raised {r.error}".lstrip("; ")
        lines.append(
            f"{r.cell:>4} {r.execution_count if r.execution_count is not None else '':>4}  {r.decision:<8} "
            f"{_seconds(r.seconds):>9} {tasks:>14} {_seconds(r.saved) if r.saved else '-':>9}  {why}"
        )
    replayed = sum(r.decision == "replayed" for r in rows)
    ran = sum(r.decision == "ran" for r in rows)
    hits, misses = sum(r.task_hits for r in rows), sum(r.task_misses for r in rows)
    lines.append(
        f"{replayed} replayed, {ran} ran; tasks {hits} hit / {misses} missed; "
        f"time saved against the recorded runs: {_seconds(sum(r.saved for r in rows)) or '0 ms'}"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class SessionInfo:
    """One kernel session as the catalog holds it."""

    session: str | None
    kernel: str | None
    started: float | None
    cells: int
    replayed: int
    executed: int
    errors: int


@dataclass(frozen=True)
class StoreStatus:
    """What `jupyter nbrewind status` shows: where, whether trusted, what is in flight, what it holds."""

    store: str
    trusted: bool
    trust_reason: str
    writes_in_progress: int
    """Temporary files of writes not finished yet (a kernel writing now, or one that died mid-write)."""
    sessions: int
    cell_runs: int
    last_session: SessionInfo | None
    stored_bytes: int
    objects: int


def sessions(store: Store) -> list[SessionInfo]:
    """Every kernel session, oldest first."""
    grouped: dict[str | None, list[CellRun]] = {}
    for run in store.catalog.cell_runs():
        grouped.setdefault(run.session, []).append(run)
    out = []
    for session, runs in grouped.items():
        out.append(SessionInfo(
            session, runs[0].kernel, runs[0].started, len(runs),
            sum(r.decision == "replayed" for r in runs),
            sum(r.decision == "executed" for r in runs),
            sum(r.status == "error" for r in runs),
        ))
    return out


def trust_of(store: Store) -> tuple[bool, str]:
    """Whether this user trusts `store`, and why (a catalog that cannot be read is not trusted)."""
    from nbrewind.errors import StoreError
    from nbrewind.store.origin import store_trust

    try:
        verdict = store_trust(store.root)
    except StoreError as exc:
        return False, str(exc)
    return verdict.trusted, verdict.reason


def store_status(store: Store) -> StoreStatus:
    """Trust, writes in flight, the newest session and the size on disk; reads no object."""
    from nbrewind.store.fsio import TEMP_PREFIX

    trusted, reason = trust_of(store)
    temp = stored = objects = 0
    for folder, _dirs, files in os.walk(store.root):
        for name in files:
            if name.startswith(TEMP_PREFIX):
                temp += 1
                continue
            try:
                stored += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
            if Path(folder).parent.name == "objects":
                objects += 1
    known = sessions(store)
    return StoreStatus(str(store.root), trusted, reason, temp, len(known), sum(s.cells for s in known),
                       known[-1] if known else None, stored, objects)


def format_status(status: StoreStatus) -> str:
    """`status` as lines of text."""
    lines = [
        f"store:           {status.store}",
        f"trust:           {'trusted' if status.trusted else 'NOT trusted'} ({status.trust_reason})",
        f"pending writes:  {status.writes_in_progress} write(s) in progress" if status.writes_in_progress
        else "pending writes:  none (everything recorded is durable)",
        f"size:            {status.stored_bytes:,} bytes on disk, {status.objects:,} objects",
        f"history:         {status.sessions} session(s), {status.cell_runs} cell run(s)",
    ]
    last = status.last_session
    if last is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.started)) if last.started else "?"
        lines.append(
            f"last session:    {last.session} on {last.kernel} at {when}: {last.cells} cell(s), "
            f"{last.replayed} replayed, {last.executed} executed, {last.errors} error(s)"
        )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
