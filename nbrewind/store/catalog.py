"""The SQLite catalog: cell runs, checkpoints and the task log (rows: `catalog_tables`).

One connection per Catalog, shared by threads under a lock; WAL so readers in
other processes never block the writer, except on a network filesystem, where
WAL's shared memory cannot reach other machines and a rollback journal is used
(`nbrewind.store.fstype` decides); explicit transactions (``BEGIN IMMEDIATE``
takes the write lock up front, so two processes never deadlock upgrading a read
to a write). The schema is versioned in ``meta`` and upgraded
by the numbered ``MIGRATIONS``; a catalog written by a newer NBRewind is refused
rather than misread. Rows go in and come out as the typed records of
`nbrewind.store.rows`, JSON columns encoded and decoded on the way.

A writable catalog keeps itself signed for this user (``signing.CatalogSigner``):
every row written through it moves the catalog's head, and every commit records
the new head's signature in the trust database before it commits. ``signature``
recomputes that signature from the rows, which is how a store is checked.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nbrewind.errors import ReadOnlyStoreError, SchemaTooNewError, StoreError, StoreFullError
from nbrewind.store.catalog_tables import CatalogTablesMixin
from nbrewind.store.fstype import JOURNAL_ENV, JournalChoice, choose_journal
from nbrewind.store.rows import CellRun, Checkpoint, TaskLogEntry
from nbrewind.store.schema import MIGRATIONS, SCHEMA_VERSION
from nbrewind.store.signing import CatalogSigner, catalog_head, frame_digest, manifest_digest, store_signature, user_keys

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Catalog", "CellRun", "Checkpoint", "TaskLogEntry"]


_BUSY_TIMEOUT_MS = 30_000
_LEAVE_WAL_SECONDS = 5.0
"""How long to wait for other connections to close when a WAL catalog must change to a
rollback journal: SQLite allows that only to the one connection left."""


class Catalog(CatalogTablesMixin):
    """The SQLite catalog of one store. Use as a context manager or call ``close``."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._depth = 0
        self._signer = None if readonly else CatalogSigner(self.path)
        if readonly and not self.path.is_file():
            raise StoreError(f"no catalog at {self.path}")
        self.journal: JournalChoice | None = None if readonly else choose_journal(self.path)
        """The journal mode this writable catalog uses and why (None when read-only)."""
        if not readonly:
            _create_shareable(self.path)
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
                if self.journal is not None:
                    self._set_journal_mode(self.journal)
                    # A rollback journal is crash-safe only with FULL; WAL is with NORMAL.
                    self._conn.execute(f"PRAGMA synchronous = {'FULL' if self.journal.rollback else 'NORMAL'}")
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

    def _set_journal_mode(self, choice: JournalChoice) -> None:
        # Entering WAL needs an exclusive lock and SQLite does not wait for it (no busy
        # handler), so a second process creating the catalog at the same moment gets
        # "database is locked": retry until the busy timeout. Leaving WAL needs this to
        # be the only connection: wait a little for others to close, then explain.
        started, current = time.monotonic(), ""
        while True:
            try:
                current = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
                if current != choice.mode:
                    self._conn.execute(f"PRAGMA journal_mode = {choice.mode.upper()}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise
                waited = time.monotonic() - started
                if current == "wal" and waited > _LEAVE_WAL_SECONDS:
                    raise StoreError(
                        f"the catalog {self.path} is in WAL mode, which breaks when processes on different machines "
                        f"use it, and needs a rollback journal because {choice.reason}; another process has it open, "
                        f"so it cannot be switched now. Stop the other kernels and `jupyter nbrewind` commands using "
                        f"this store (on every machine) and open it again, or set {JOURNAL_ENV}=wal if every process "
                        f"using this store runs on this machine"
                    ) from exc
                if waited > _BUSY_TIMEOUT_MS / 1000:
                    raise
                time.sleep(0.01)

    @property
    def journal_mode(self) -> str:
        """SQLite's journal mode of this connection (``wal``, ``truncate``, ``delete``...)."""
        with self._lock:
            try:
                return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0])
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    def shared_fs_notice(self) -> str | None:
        """A warning for the user when this store's filesystem makes sharing it between
        machines unsafe (locks that stay local, or WAL forced on a network filesystem)."""
        return None if self.journal is None else self.journal.notice()

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


def _create_shareable(path: Path) -> None:
    """Create an empty catalog file with the permissions the umask allows (SQLite would
    create it 0644 whatever the umask), so a store in a group's folder with umask 002 is
    writable by the group; SQLite gives its journal files the catalog's permissions."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError:
        return  # it exists, or SQLite reports why it cannot be created
    os.close(fd)


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements (sqlite3's executescript would commit
    the surrounding transaction, so each statement is executed inside it)."""
    return [s.strip() for s in script.split(";") if s.strip()]
