"""The catalog's schema, as numbered migrations.

Migration ``n`` (1-based) takes a catalog from schema version ``n - 1`` to ``n``.
Never edit a released migration: append a new one, so every existing catalog
can be brought forward step by step. Statements are separated by ``;`` and run
inside one transaction.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema.
    """
    CREATE TABLE cell_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session TEXT, kernel TEXT, execution_count INTEGER, cell_id TEXT,
        code TEXT NOT NULL DEFAULT '', code_digest TEXT,
        decision TEXT, reason TEXT, status TEXT,
        reply TEXT, outputs TEXT, inputs TEXT, reads TEXT, writes TEXT, deletes TEXT,
        checkpoint_id INTEGER, started REAL, duration REAL,
        bytes_written INTEGER, task_hits INTEGER, task_misses INTEGER
    );
    CREATE INDEX cell_runs_code_digest ON cell_runs(code_digest);
    CREATE INDEX cell_runs_session ON cell_runs(session);
    CREATE TABLE checkpoints (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cell_run_id INTEGER REFERENCES cell_runs(id),
        parent_id INTEGER REFERENCES checkpoints(id),
        created REAL NOT NULL
    );
    CREATE TABLE checkpoint_entries (
        checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),
        name TEXT NOT NULL, digest TEXT NOT NULL, meta TEXT,
        PRIMARY KEY (checkpoint_id, name)
    ) WITHOUT ROWID;
    CREATE INDEX checkpoint_entries_digest ON checkpoint_entries(digest);
    CREATE TABLE task_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        fingerprint TEXT NOT NULL, key_prefix TEXT, cell_run_id INTEGER,
        hit INTEGER NOT NULL DEFAULT 0, duration REAL, nbytes INTEGER, worker TEXT,
        result_digest TEXT, created REAL NOT NULL
    );
    CREATE INDEX task_log_fingerprint ON task_log(fingerprint);
    CREATE INDEX task_log_cell_run ON task_log(cell_run_id);
    CREATE TABLE refs (
        namespace TEXT NOT NULL, name TEXT NOT NULL, digest TEXT NOT NULL, updated REAL NOT NULL,
        PRIMARY KEY (namespace, name)
    ) WITHOUT ROWID;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
