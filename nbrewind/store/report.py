"""The cell-run log as rows for people (`%nbrewind log`, `jupyter nbrewind log`) and programs (`--json`)."""

from __future__ import annotations

from dataclasses import dataclass

from nbrewind.store.store import Store


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


def cell_log(store: Store, *, session: str | None = None, last_session: bool = False) -> list[LogRow]:
    """Cell runs in order; only one kernel session's if `session` (or the newest, with `last_session`)."""
    runs = store.catalog.cell_runs()
    if last_session and runs:
        session = runs[-1].session
    if session is not None:
        runs = [r for r in runs if r.session == session]
    tasks: dict[int, tuple[int, int]] = {}
    for entry in store.catalog.task_log():
        if entry.cell_run_id is None:
            continue
        hits, misses = tasks.get(entry.cell_run_id, (0, 0))
        tasks[entry.cell_run_id] = (hits + int(entry.hit), misses + int(not entry.hit))
    rows = []
    for r in runs:
        hits, misses = tasks.get(r.id, (r.task_hits or 0, r.task_misses or 0))
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
            )
        )
    return rows


def format_log(rows: list[LogRow]) -> str:
    """A fixed-width table, one line per cell run."""
    if not rows:
        return "no cell runs recorded"
    header = f"{'run':>5} {'kernel':<7} {'In':>4} {'decision':<9} {'status':<7} {'time':>9} {'bytes':>12} {'tasks hit/miss':>14}  reason / code"
    lines = [header, "-" * len(header)]
    for r in rows:
        first = (r.code.strip().splitlines() or [""])[0][:40]
        tasks = f"{r.task_hits}/{r.task_misses}" if (r.task_hits or r.task_misses) else "-"
        lines.append(
            f"{r.id:>5} {r.kernel or '':<7} {r.execution_count if r.execution_count is not None else '':>4} "
            f"{r.decision or '':<9} {r.status or '':<7} {_seconds(r.duration):>9} {r.bytes_written or 0:>12,} {tasks:>14}  "
            f"{r.reason or ''} | {first}"
        )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
