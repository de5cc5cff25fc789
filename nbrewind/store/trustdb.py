"""The trust database: the signatures of the stores this user trusts, outside every store.

SQLite with a rollback journal (so it works on an NFS home) and without fsync: a
killed kernel loses nothing; a power cut can lose the newest signatures, and then
the user trusts the store again. Culled per store folder and in total, the way
Jupyter culls its notebook signatures. This module imports no other nbrewind
package except ``nbrewind.errors``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbrewind.errors import StoreError
from nbrewind.store.secret import trust_db_path

__all__ = ["SignatureDB", "signature_db"]

_KEEP_PER_STORE = 8
"""Signatures kept per store folder: the committed head is always among the newest."""
_KEEP_TOTAL = 20_000
"""Beyond this many signatures the least recently seen go, as Jupyter culls its db."""


class SignatureDB:
    """The signatures this user made or accepted, and the backpack manifests whose
    refs they accepted. One connection per process, shared under a lock.

    A rollback journal (not WAL) so it works on a home folder on NFS; no fsync,
    because a signature must survive the kernel being killed, which the OS
    guarantees, while a power cut only costs a ``jupyter nbrewind trust``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0

    def _connection(self, *, create: bool) -> sqlite3.Connection | None:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        if not create and not self.path.is_file():
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = PERSIST")
            conn.execute("PRAGMA synchronous = OFF")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS signatures (signature TEXT NOT NULL, store TEXT NOT NULL, "
                "last_seen REAL NOT NULL, PRIMARY KEY (signature, store)) WITHOUT ROWID"
            )
            conn.execute("CREATE INDEX IF NOT EXISTS signatures_by_store ON signatures(store, last_seen)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS manifests (sha256 TEXT PRIMARY KEY, source TEXT, added REAL NOT NULL)"
            )
            (count,) = conn.execute("SELECT COUNT(*) FROM signatures").fetchone()
            if count > _KEEP_TOTAL:
                conn.execute(
                    "DELETE FROM signatures WHERE last_seen <= (SELECT last_seen FROM signatures "
                    "ORDER BY last_seen DESC LIMIT 1 OFFSET ?)",
                    (_KEEP_TOTAL * 3 // 4,),
                )
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _run(self, action: Callable[[sqlite3.Connection], Any], *, write: bool) -> Any:
        with self._lock:
            try:
                conn = self._connection(create=write)
                if conn is None:
                    return None
                return action(conn)
            except sqlite3.Error as exc:
                self._conn = None
                if not write:
                    return None  # an unreadable database trusts nothing
                raise StoreError(
                    f"cannot record a store signature in {self.path} ({exc}); make that file writable, "
                    f"move it away if it is damaged (stores then need `jupyter nbrewind trust` again), "
                    f"or set NBREWIND_TRUST_DB"
                ) from exc
            except OSError as exc:
                self._conn = None
                if not write:
                    return None
                raise StoreError(f"cannot create the trust database {self.path} ({exc}); set NBREWIND_TRUST_DB") from exc

    def has(self, signature: str) -> bool:
        """Whether this signature was made or accepted here."""
        row = self._run(
            lambda c: c.execute("SELECT 1 FROM signatures WHERE signature = ? LIMIT 1", (signature,)).fetchone(),
            write=False,
        )
        return row is not None

    def add(self, signature: str, store: str) -> bool:
        """Record ``signature`` for the store folder ``store`` (refreshing it if
        known), keep only that folder's newest few; return whether it was new."""

        def add(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                known = conn.execute("SELECT 1 FROM signatures WHERE signature = ? LIMIT 1", (signature,)).fetchone()
                conn.execute(
                    "INSERT OR REPLACE INTO signatures (signature, store, last_seen) VALUES (?, ?, ?)",
                    (signature, store, time.time()),
                )
                conn.execute(
                    "DELETE FROM signatures WHERE store = ? AND last_seen < (SELECT last_seen FROM signatures "
                    "WHERE store = ? ORDER BY last_seen DESC LIMIT 1 OFFSET ?)",
                    (store, store, _KEEP_PER_STORE - 1),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return known is None

        return bool(self._run(add, write=True))

    def has_manifest(self, sha256: str) -> bool:
        """Whether the user accepted the backpack manifest with this SHA-256 (and so
        the ref files it lists)."""
        row = self._run(lambda c: c.execute("SELECT 1 FROM manifests WHERE sha256 = ?", (sha256,)).fetchone(), write=False)
        return row is not None

    def add_manifest(self, sha256: str, source: str) -> None:
        """Accept the ref files a verified backpack manifest lists."""
        self._run(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO manifests (sha256, source, added) VALUES (?, ?, ?)", (sha256, source, time.time())
            ),
            write=True,
        )

    def close(self) -> None:
        """Close the connection (a later call reopens it)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


_dbs: dict[str, SignatureDB] = {}
_dbs_lock = threading.Lock()


def signature_db() -> SignatureDB:
    """The trust database at ``trust_db_path()``, one per path and process."""
    path = trust_db_path()
    with _dbs_lock:
        db = _dbs.get(str(path))
        if db is None:
            db = _dbs[str(path)] = SignatureDB(path)
        return db
