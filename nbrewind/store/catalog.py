"""The SQLite catalog: cell runs, checkpoints, the task log and named refs.

One connection per Catalog, shared by threads under a lock; WAL so readers in
other processes never block the writer; explicit transactions (``BEGIN
IMMEDIATE`` takes the write lock up front, so two processes never deadlock
upgrading a read to a write). The schema is versioned in ``meta`` and upgraded
by the numbered ``MIGRATIONS``; a catalog written by a newer NBRewind is refused
rather than misread. JSON columns are encoded and decoded here so callers only
see Python values.

A writable catalog keeps itself signed for this user (``signing.CatalogSigner``):
every row written through it moves the catalog's head, and every commit records
the new head's signature in the trust database before it commits. ``signature``
recomputes that signature from the rows, which is how a store is checked.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nbrewind.errors import ReadOnlyStoreError, SchemaTooNewError, StoreError, StoreFullError
from nbrewind.store.digest import is_digest
from nbrewind.store.schema import MIGRATIONS, SCHEMA_VERSION
from nbrewind.store.signing import CatalogSigner, catalog_head, frame_digest, manifest_digest, store_signature, user_keys

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Catalog", "CellRun", "Checkpoint", "TaskLogEntry"]


_BUSY_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class CellRun:
    """One execute_request handled by a kernel, as recorded."""

    id: int
    session: str | None = None
    kernel: str | None = None
    execution_count: int | None = None
    cell_id: str | None = None
    code: str = ""
    code_digest: str | None = None
    decision: str | None = None
    reason: str | None = None
    status: str | None = None
    reply: Any = None
    outputs: str | None = None
    inputs: dict[str, str] | None = None
    reads: Any = None
    writes: Any = None
    deletes: Any = None
    checkpoint_id: int | None = None
    started: float | None = None
    duration: float | None = None
    bytes_written: int | None = None
    task_hits: int | None = None
    task_misses: int | None = None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's header; its entries come from ``Catalog.checkpoint_entries``."""

    id: int
    cell_run_id: int | None
    parent_id: int | None
    created: float


@dataclass(frozen=True)
class TaskLogEntry:
    """One Dask task the kernel saw: computed (``hit=False``) or loaded from cache."""

    id: int
    fingerprint: str
    key_prefix: str | None = None
    cell_run_id: int | None = None
    hit: bool = False
    duration: float | None = None
    nbytes: int | None = None
    worker: str | None = None
    result_digest: str | None = None
    created: float = 0.0


_CELL_RUN_COLUMNS = tuple(f.name for f in fields(CellRun))
_CELL_RUN_JSON = frozenset({"reply", "inputs", "reads", "writes", "deletes"})
_TASK_COLUMNS = tuple(f.name for f in fields(TaskLogEntry))


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    try:
        return None if text is None else json.loads(text)
    except (TypeError, ValueError) as exc:  # a damaged page can still read as a value of another type
        raise StoreError(
            f"the catalog holds a damaged record ({exc}); restore catalog.sqlite from a backup or a backpack, "
            f"or move it aside and run the notebook on the audit kernel to record it again"
        ) from None


def _check_fields(given: Iterable[str], allowed: Iterable[str], what: str) -> None:
    unknown = set(given) - set(allowed)
    if unknown:
        raise TypeError(f"unknown {what} field(s): {', '.join(sorted(unknown))}")


class Catalog:
    """The SQLite catalog of one store. Use as a context manager or call ``close``."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._depth = 0
        self._signer = None if readonly else CatalogSigner(self.path)
        if readonly and not self.path.is_file():
            raise StoreError(f"no catalog at {self.path}")
        try:
            self._conn = self._connect(immutable=False)
            self._setup()
        except StoreError:
            if not readonly or os.access(self.path.parent, os.W_OK):
                raise
            # A WAL database on a read-only filesystem cannot get its shared-memory
            # file, so SQLite refuses it; nothing can change it there either, so
            # reading it as immutable is safe.
            self._conn = self._connect(immutable=True)
            self._setup()

    def _connect(self, *, immutable: bool) -> sqlite3.Connection:
        try:
            if self.readonly:
                uri = f"{self.path.resolve().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}"
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            else:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        return conn

    # -- connection, transactions, schema ---------------------------------------

    def _translate(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc).lower()
        if "readonly" in text or "read-only" in text or ("unable to open" in text and self.readonly):
            return ReadOnlyStoreError(f"catalog {self.path} cannot be written: {exc}")
        if "disk is full" in text or "database or disk is full" in text:
            return StoreFullError(f"no space left for catalog {self.path}: free space and run the cell again")
        if "not a database" in text or "malformed" in text:
            return StoreError(
                f"catalog {self.path} is damaged ({exc}); `jupyter nbrewind verify` checks the objects, "
                f"the catalog itself must be restored from a backup or a backpack"
            )
        return StoreError(f"catalog {self.path}: {exc}")

    def _setup(self) -> None:
        try:
            self._setup_schema()
            if self._signer is not None:
                with self._lock:
                    try:
                        self._signer.attach(self._conn)
                    except sqlite3.Error as exc:
                        raise self._translate(exc) from exc
        except BaseException:
            self._conn.close()
            raise

    def _setup_schema(self) -> None:
        with self._lock:
            try:
                if not self.readonly:
                    self._enable_wal()
                    self._conn.execute("PRAGMA synchronous = NORMAL")
                self._conn.execute("PRAGMA foreign_keys = ON")
                version = self._schema_version()
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            self._refuse_newer(version)
            if version == SCHEMA_VERSION:
                return
            if self.readonly:
                raise ReadOnlyStoreError(
                    f"catalog {self.path} has schema {version}, this NBRewind needs {SCHEMA_VERSION}; "
                    f"open it writable once to upgrade it"
                )
            with self.transaction():
                version = self._schema_version()  # another process may have just migrated
                self._refuse_newer(version)
                if self._signer is not None and version < SCHEMA_VERSION:
                    if version == 0 and not self._has_tables():
                        self._signer.creating()
                    else:
                        self._signer.migrating()
                for number in range(version, SCHEMA_VERSION):
                    for statement in _split_sql(MIGRATIONS[number]):
                        self._conn.execute(statement)
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )

    def _enable_wal(self) -> None:
        # Switching to WAL needs an exclusive lock and SQLite does not wait for
        # it (no busy handler), so a second process creating the catalog at the
        # same moment gets "database is locked": retry until the busy timeout.
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self._conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _schema_version(self) -> int:
        has_meta = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            if not self.readonly:
                self._conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            return 0
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _has_tables(self) -> bool:
        return self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name != 'meta' LIMIT 1"
        ).fetchone() is not None

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"catalog {self.path} has schema version {version}; this NBRewind understands up to "
                f"{SCHEMA_VERSION}. Upgrade nbrewind to read this store"
            )

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """A write transaction; nested uses join the outermost one.

        Everything inside commits together or not at all, and other threads of
        this process wait until it ends.
        """
        with self._lock:
            if self.readonly:
                raise ReadOnlyStoreError(f"catalog {self.path} was opened read-only")
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            signer = self._signer
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            self._depth = 1
            try:
                if signer is not None:
                    signer.begin(self._conn)
                yield
                if signer is not None:
                    signer.before_commit(self._conn)
            except BaseException as exc:
                self._depth = 0
                self._conn.execute("ROLLBACK")
                if signer is not None:
                    signer.end(committed=False)
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc) from exc
                raise
            self._depth = 0
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._conn.execute("ROLLBACK")
                if signer is not None:
                    signer.end(committed=False)
                raise self._translate(exc) from exc
            if signer is not None:
                signer.end(committed=True)

    def _write(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self.transaction():
            try:
                return self._conn.execute(sql, tuple(params))
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The schema version stored in the catalog."""
        with self._lock:
            return self._schema_version()

    # -- signature ---------------------------------------------------------------

    def signature(self) -> str:
        """This user's signature of what the catalog holds now: its rows, schema and
        ``meta``, and the backpack manifest beside it. Reads every row, once; the store
        is trusted when this signature is in the trust database."""
        return self.signature_with(manifest_digest(self.path.parent))

    def signature_with(self, manifest_sha256: str | None) -> str:
        """`signature` as if the backpack manifest beside it had this SHA-256 (None: none)."""
        keys = user_keys()
        with self._lock:
            try:
                if self._depth:  # inside our own transaction: already one snapshot
                    head, frame = catalog_head(self._conn, keys.rows), frame_digest(self._conn)
                else:
                    self._conn.execute("BEGIN")  # one snapshot for the rows and the frame
                    try:
                        head, frame = catalog_head(self._conn, keys.rows), frame_digest(self._conn)
                    finally:
                        self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
        return store_signature(keys, head, frame, manifest_sha256)

    # -- cell runs ---------------------------------------------------------------

    def add_cell_run(self, **values: Any) -> int:
        """Record a cell run and return its id. Fields are CellRun's (except id);
        JSON fields take any JSON-serialisable value."""
        _check_fields(values, _CELL_RUN_COLUMNS[1:], "cell run")
        names = list(values)
        row = [_dumps(values[n]) if n in _CELL_RUN_JSON else values[n] for n in names]
        if not names:
            cursor = self._write("INSERT INTO cell_runs DEFAULT VALUES")
        else:
            cursor = self._write(
                f"INSERT INTO cell_runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", row
            )
        return int(cursor.lastrowid or 0)

    def update_cell_run(self, cell_run_id: int, **values: Any) -> None:
        """Change some fields of a recorded cell run (e.g. duration, outputs)."""
        _check_fields(values, _CELL_RUN_COLUMNS[1:], "cell run")
        if not values:
            return
        assignments = ", ".join(f"{n} = ?" for n in values)
        row = [_dumps(v) if n in _CELL_RUN_JSON else v for n, v in values.items()]
        cursor = self._write(f"UPDATE cell_runs SET {assignments} WHERE id = ?", [*row, cell_run_id])
        if cursor.rowcount != 1:
            raise KeyError(f"no cell run with id {cell_run_id}")

    @staticmethod
    def _cell_run(row: tuple[Any, ...]) -> CellRun:
        values = {
            name: _loads(value) if name in _CELL_RUN_JSON else value
            for name, value in zip(_CELL_RUN_COLUMNS, row)
        }
        return CellRun(**values)

    _CELL_RUN_SELECT = f"SELECT {', '.join(_CELL_RUN_COLUMNS)} FROM cell_runs"

    def get_cell_run(self, cell_run_id: int) -> CellRun:
        """The cell run with this id; KeyError if there is none."""
        rows = self._query(f"{self._CELL_RUN_SELECT} WHERE id = ?", (cell_run_id,))
        if not rows:
            raise KeyError(f"no cell run with id {cell_run_id}")
        return self._cell_run(rows[0])

    def cell_runs(self, session: str | None = None) -> list[CellRun]:
        """All cell runs in the order they were recorded, or only one session's."""
        if session is None:
            rows = self._query(f"{self._CELL_RUN_SELECT} ORDER BY id")
        else:
            rows = self._query(f"{self._CELL_RUN_SELECT} WHERE session = ? ORDER BY id", (session,))
        return [self._cell_run(r) for r in rows]

    def find_cell_runs(self, code_digest: str) -> list[CellRun]:
        """Cell runs of code with this digest, newest first (candidates for replay).

        The index only proposes row ids; each row is read from the table and its
        digest checked again, because SQLite answers from a damaged index as it
        stands (a flipped bit there could otherwise propose another cell's run).
        """
        rows = self._query(
            f"{self._CELL_RUN_SELECT} WHERE id IN (SELECT id FROM cell_runs WHERE code_digest = ?) ORDER BY id DESC",
            (code_digest,),
        )
        return [run for run in map(self._cell_run, rows) if run.code_digest == code_digest]

    def has_cell_id(self, cell_id: str) -> bool:
        """Whether any recorded run came from the frontend cell `cell_id`."""
        return bool(self._query("SELECT 1 FROM cell_runs WHERE cell_id = ? LIMIT 1", (cell_id,)))

    # -- checkpoints -------------------------------------------------------------

    def add_checkpoint(
        self,
        cell_run_id: int | None,
        parent_id: int | None,
        entries: Mapping[str, tuple[str, Mapping[str, Any] | None]],
    ) -> int:
        """Record a checkpoint with its full ``name -> (digest, meta)`` map; returns its id."""
        with self.transaction():
            cursor = self._write(
                "INSERT INTO checkpoints (cell_run_id, parent_id, created) VALUES (?, ?, ?)",
                (cell_run_id, parent_id, time.time()),
            )
            checkpoint_id = int(cursor.lastrowid or 0)
            try:
                self._conn.executemany(
                    "INSERT INTO checkpoint_entries (checkpoint_id, name, digest, meta) VALUES (?, ?, ?, ?)",
                    [(checkpoint_id, name, digest, _dumps(meta)) for name, (digest, meta) in entries.items()],
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

    def checkpoint_entries(self, checkpoint_id: int) -> dict[str, tuple[str, dict[str, Any]]]:
        """The checkpoint's ``name -> (digest, meta)`` map (meta is ``{}`` when none was given)."""
        rows = self._query(
            "SELECT name, digest, meta FROM checkpoint_entries WHERE checkpoint_id = ? ORDER BY name",
            (checkpoint_id,),
        )
        return {name: (digest, _loads(meta) or {}) for name, digest, meta in rows}

    # -- task log ----------------------------------------------------------------

    def log_tasks(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Append task-log rows (TaskLogEntry fields except id; ``fingerprint``
        required, ``created`` defaults to now) in one transaction; returns the count."""
        now = time.time()
        records = []
        for row in rows:
            _check_fields(row, _TASK_COLUMNS[1:], "task log")
            if "fingerprint" not in row:
                raise TypeError("a task-log row needs a fingerprint")
            values = {**{n: None for n in _TASK_COLUMNS[1:]}, "hit": False, "created": now, **row}
            values["hit"] = int(bool(values["hit"]))
            records.append(tuple(values[n] for n in _TASK_COLUMNS[1:]))
        columns = ", ".join(_TASK_COLUMNS[1:])
        with self.transaction():
            try:
                self._conn.executemany(
                    f"INSERT INTO task_log ({columns}) VALUES ({', '.join('?' * (len(_TASK_COLUMNS) - 1))})",
                    records,
                )
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
        return len(records)

    def task_log(self, cell_run_id: int | None = None) -> list[TaskLogEntry]:
        """The task log in order, or only the tasks of one cell run."""
        select = f"SELECT {', '.join(_TASK_COLUMNS)} FROM task_log"
        if cell_run_id is None:
            rows = self._query(f"{select} ORDER BY id")
        else:
            rows = self._query(f"{select} WHERE cell_run_id = ? ORDER BY id", (cell_run_id,))
        return [TaskLogEntry(**{**dict(zip(_TASK_COLUMNS, r)), "hit": bool(r[4])}) for r in rows]

    def task_result(self, fingerprint: str) -> str | None:
        """The newest recorded result digest for a task fingerprint, or None."""
        rows = self._query(
            "SELECT result_digest FROM task_log WHERE fingerprint = ? AND result_digest IS NOT NULL "
            "ORDER BY id DESC LIMIT 1",
            (fingerprint,),
        )
        return rows[0][0] if rows else None

    # -- refs --------------------------------------------------------------------

    def set_ref(self, namespace: str, name: str, digest: str) -> None:
        """Point a named ref at a digest (replacing any previous target)."""
        if not is_digest(digest):
            raise ValueError(f"{digest!r} is not a digest")
        self._write(
            "INSERT OR REPLACE INTO refs (namespace, name, digest, updated) VALUES (?, ?, ?, ?)",
            (namespace, name, digest, time.time()),
        )

    def get_ref(self, namespace: str, name: str) -> str | None:
        """The digest a named ref points at, or None."""
        rows = self._query("SELECT digest FROM refs WHERE namespace = ? AND name = ?", (namespace, name))
        return rows[0][0] if rows else None

    def delete_ref(self, namespace: str, name: str) -> bool:
        """Remove a named ref; return whether it existed."""
        return self._write("DELETE FROM refs WHERE namespace = ? AND name = ?", (namespace, name)).rowcount > 0

    # -- reachability ------------------------------------------------------------

    def reference_counts(self) -> Counter[str]:
        """How many times each digest is pointed at by checkpoint entries, cell-run
        outputs, task-log results and refs (the roots of gc, with multiplicity)."""
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


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements (sqlite3's executescript would commit
    the surrounding transaction, so each statement is executed inside it)."""
    return [s.strip() for s in script.split(";") if s.strip()]
