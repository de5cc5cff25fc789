"""What the catalog holds: cell runs, checkpoints, the task log, and what they point at.

A mixin of `Catalog`, which owns the connection, the transactions and the
signature; here are only the rows, going in and out as the typed records of
`nbrewind.store.rows`.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from nbrewind.store.rows import CELL_RUN_COLUMNS, CELL_RUN_JSON, TASK_COLUMNS, CellRun, Checkpoint, TaskLogEntry, dumps, loads

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from nbrewind.errors import StoreError

__all__ = ["CatalogTablesMixin"]

_CELL_RUN_SELECT = f"SELECT {', '.join(CELL_RUN_COLUMNS)} FROM cell_runs"
_TASK_SELECT = f"SELECT {', '.join(TASK_COLUMNS)} FROM task_log"
_HIT = TASK_COLUMNS.index("hit")


def _cell_run(row: tuple[Any, ...]) -> CellRun:
    return CellRun(**{name: loads(value) if name in CELL_RUN_JSON else value for name, value in zip(CELL_RUN_COLUMNS, row)})


def _task(row: tuple[Any, ...]) -> TaskLogEntry:
    return TaskLogEntry(**{**dict(zip(TASK_COLUMNS, row)), "hit": bool(row[_HIT])})


class CatalogTablesMixin:
    """Cell runs, checkpoints and the task log of a `Catalog`."""

    if TYPE_CHECKING:  # provided by Catalog
        _conn: sqlite3.Connection

        def transaction(self) -> AbstractContextManager[None]: ...
        def _write(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor: ...
        def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]: ...
        def _translate(self, exc: sqlite3.Error) -> StoreError: ...

    # -- cell runs ---------------------------------------------------------------

    def add_cell_run(self, run: CellRun) -> int:
        """Record a cell run and return its id (``run.id`` is ignored)."""
        columns = CELL_RUN_COLUMNS[1:]
        values = [dumps(getattr(run, n)) if n in CELL_RUN_JSON else getattr(run, n) for n in columns]
        cursor = self._write(
            f"INSERT INTO cell_runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", values
        )
        return int(cursor.lastrowid or 0)

    def set_cell_run_checkpoint(self, cell_run_id: int, checkpoint_id: int) -> None:
        """Point a recorded cell run at the checkpoint made after it (which names the run
        in turn, so one of the two rows is written first)."""
        cursor = self._write("UPDATE cell_runs SET checkpoint_id = ? WHERE id = ?", (checkpoint_id, cell_run_id))
        if cursor.rowcount != 1:
            raise KeyError(f"no cell run with id {cell_run_id}")

    def get_cell_run(self, cell_run_id: int) -> CellRun:
        """The cell run with this id; KeyError if there is none."""
        rows = self._query(f"{_CELL_RUN_SELECT} WHERE id = ?", (cell_run_id,))
        if not rows:
            raise KeyError(f"no cell run with id {cell_run_id}")
        return _cell_run(rows[0])

    def cell_runs(self, session: str | None = None) -> list[CellRun]:
        """All cell runs in the order they were recorded, or only one session's."""
        if session is None:
            rows = self._query(f"{_CELL_RUN_SELECT} ORDER BY id")
        else:
            rows = self._query(f"{_CELL_RUN_SELECT} WHERE session = ? ORDER BY id", (session,))
        return [_cell_run(r) for r in rows]

    def find_cell_runs(self, code_digest: str) -> list[CellRun]:
        """Cell runs of code with this digest, newest first (candidates for replay).

        The index only proposes row ids; each row is read from the table and its
        digest checked again, because SQLite answers from a damaged index as it
        stands (a flipped bit there could otherwise propose another cell's run).
        """
        return list(self.iter_cell_runs(code_digest))

    def iter_cell_runs(self, code_digest: str) -> Iterator[CellRun]:
        """`find_cell_runs`, read and decoded one row at a time: a repeat usually replays the
        newest run, and a notebook repeated many times has many runs of each cell (every
        repeat records its replays), so only their ids are read at once (from the index)."""
        ids = self._query("SELECT id FROM cell_runs WHERE code_digest = ? ORDER BY id DESC", (code_digest,))
        for (run_id,) in ids:
            rows = self._query(f"{_CELL_RUN_SELECT} WHERE id = ?", (run_id,))
            if not rows:
                continue  # deleted since (retention in another process)
            run = _cell_run(rows[0])
            if run.code_digest == code_digest:
                yield run

    def has_cell_id(self, cell_id: str) -> bool:
        """Whether any recorded run came from the frontend cell `cell_id`."""
        return bool(self._query("SELECT 1 FROM cell_runs WHERE cell_id = ? LIMIT 1", (cell_id,)))

    # -- checkpoints -------------------------------------------------------------

    def add_checkpoint(
        self,
        cell_run_id: int | None,
        parent_id: int | None,
        entries: Mapping[str, tuple[str, Mapping[str, Any] | str | None]],
    ) -> int:
        """Record a checkpoint with its full ``name -> (digest, meta)`` map (meta as a mapping,
        or as the JSON text `dumps` makes of it); returns its id."""
        with self.transaction():
            cursor = self._write(
                "INSERT INTO checkpoints (cell_run_id, parent_id, created) VALUES (?, ?, ?)",
                (cell_run_id, parent_id, time.time()),
            )
            checkpoint_id = int(cursor.lastrowid or 0)
            try:
                self._conn.executemany(
                    "INSERT INTO checkpoint_entries (checkpoint_id, name, digest, meta) VALUES (?, ?, ?, ?)",
                    [(checkpoint_id, name, digest, meta if isinstance(meta, str) else dumps(meta)) for name, (digest, meta) in entries.items()],
                )
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
        return checkpoint_id

    def get_checkpoint(self, checkpoint_id: int) -> Checkpoint:
        """A checkpoint's header; KeyError if there is none."""
        rows = self._query("SELECT id, cell_run_id, parent_id, created FROM checkpoints WHERE id = ?", (checkpoint_id,))
        if not rows:
            raise KeyError(f"no checkpoint with id {checkpoint_id}")
        return Checkpoint(*rows[0])

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint's header, oldest first (parents and owners, for retention)."""
        return [Checkpoint(*row) for row in self._query("SELECT id, cell_run_id, parent_id, created FROM checkpoints ORDER BY id")]

    def checkpoint_entries(self, checkpoint_id: int, names: Iterable[str] | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
        """The checkpoint's ``name -> (digest, meta)`` map (meta is ``{}`` when none was given),
        or only its entries for `names` (a replay binds what the run wrote, not every name)."""
        if names is None:
            rows = self._query(
                "SELECT name, digest, meta FROM checkpoint_entries WHERE checkpoint_id = ? ORDER BY name",
                (checkpoint_id,),
            )
        else:
            wanted = sorted(set(names))
            if not wanted:
                return {}
            rows = []
            for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
                part = wanted[start : start + 500]
                rows += self._query(
                    f"SELECT name, digest, meta FROM checkpoint_entries WHERE checkpoint_id = ? AND name IN ({', '.join('?' * len(part))})",
                    (checkpoint_id, *part),
                )
        return {name: (digest, loads(meta) or {}) for name, digest, meta in rows}

    # -- task log ----------------------------------------------------------------

    def log_tasks(self, entries: Iterable[TaskLogEntry]) -> int:
        """Append task-log entries (``id`` ignored, ``created`` 0 means now) in one
        transaction; returns the count."""
        now = time.time()

        def row(entry: TaskLogEntry) -> Iterator[Any]:
            for name in TASK_COLUMNS[1:]:
                value = getattr(entry, name)
                yield int(bool(value)) if name == "hit" else (value or now) if name == "created" else value

        records = [tuple(row(e)) for e in entries]
        columns = TASK_COLUMNS[1:]
        with self.transaction():
            try:
                self._conn.executemany(
                    f"INSERT INTO task_log ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", records
                )
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
        return len(records)

    def task_log(self, cell_run_id: int | None = None) -> list[TaskLogEntry]:
        """The task log in order, or only the tasks of one cell run."""
        if cell_run_id is None:
            rows = self._query(f"{_TASK_SELECT} ORDER BY id")
        else:
            rows = self._query(f"{_TASK_SELECT} WHERE cell_run_id = ? ORDER BY id", (cell_run_id,))
        return [_task(r) for r in rows]

    def task_result(self, fingerprint: str) -> str | None:
        """The newest recorded result digest for a task fingerprint, or None."""
        rows = self._query(
            "SELECT result_digest FROM task_log WHERE fingerprint = ? AND result_digest IS NOT NULL "
            "ORDER BY id DESC LIMIT 1",
            (fingerprint,),
        )
        return rows[0][0] if rows else None

    # -- retention ---------------------------------------------------------------

    def delete_rows(self, *, cell_runs: Iterable[int] = (), checkpoints: Iterable[int] = (), tasks: Iterable[int] = ()) -> None:
        """Delete cell runs, checkpoints (with their entries) and task-log rows by id, in
        one signed transaction. The caller keeps what the rest still names (`prune`)."""
        with self.transaction():
            try:
                for table, column, ids in (
                    ("checkpoint_entries", "checkpoint_id", checkpoints),
                    ("checkpoints", "id", checkpoints),
                    ("cell_runs", "id", cell_runs),
                    ("task_log", "id", tasks),
                ):
                    # Newest first: a checkpoint's parent is older, and its row must outlive the child's.
                    self._conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(i,) for i in sorted(ids, reverse=True)])
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    # -- reachability ------------------------------------------------------------

    def reference_counts(self) -> Counter[str]:
        """How many times each digest is pointed at by checkpoint entries, cell-run
        outputs, task-log results and rows of the old ``refs`` table (the roots of gc,
        with multiplicity). Task-result refs are files now (`ObjectStore.ref_set`); a
        catalog from before keeps its rows, and what they name stays reachable."""
        rows = self._query(
            "SELECT digest, COUNT(*) FROM checkpoint_entries GROUP BY digest "
            "UNION ALL SELECT outputs, COUNT(*) FROM cell_runs WHERE outputs IS NOT NULL GROUP BY outputs "
            "UNION ALL SELECT result_digest, COUNT(*) FROM task_log WHERE result_digest IS NOT NULL "
            "GROUP BY result_digest "
            "UNION ALL SELECT digest, COUNT(*) FROM refs GROUP BY digest"
        )
        counts: Counter[str] = Counter()
        for digest, count in rows:
            counts[digest] += count
        return counts

    def referenced_digests(self) -> set[str]:
        """Every digest the catalog points at."""
        return set(self.reference_counts())
