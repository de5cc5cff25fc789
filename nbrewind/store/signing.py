"""Per-user signatures of stores, the way Jupyter signs notebooks.

Loading a checkpoint unpickles it, and unpickling runs code, so a kernel loads
only stores this user signed. The pieces:

- The secret (`secret`): 32 random bytes in a file (mode 0600) next to the trust
  database, created on first use. Nothing else is secret; everything below is keyed by it.
- The catalog head: the sum, modulo 2**256, of a keyed hash of every catalog
  row (table name and every column), or of every group of rows for the tables
  that grow by the hundred (``GROUPED``: a checkpoint's entries, a cell run's
  tasks). A sum can be kept up to date as rows change (an insert adds a term, a
  delete subtracts one, an update does both), so signing a commit costs a few
  microseconds per written row; rows carry their primary key and groups their
  group's, so no two terms are alike, and without the secret nobody can compute
  a term, so nobody can change a row and keep the head.
- The frame digest: the catalog's schema (tables, indexes, triggers, views) and
  its ``meta`` rows, so SQL that would run on our writes is covered too.
- The store signature: HMAC(secret, head, frame digest, SHA-256 of the backpack
  manifest at the store's root or nothing). Signatures live in the trust
  database (`trustdb`), outside every store; a store is trusted when the signature of what
  it holds now is there. No file's presence or absence grants anything.
- Ref MACs: task-result refs are files, not catalog rows; each carries
  HMAC(secret, namespace, name, digest), and a ref whose MAC fails is a miss.

This module imports no other nbrewind package except ``nbrewind.errors``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from nbrewind.store.secret import Keys, secret_path, trust_db_path, user_keys
from nbrewind.store.trustdb import SignatureDB, signature_db

__all__ = [
    "HEAD_KEY_PREFIX",
    "MANIFEST_NAME",
    "CatalogSigner",
    "Keys",
    "SignatureDB",
    "GROUPED",
    "catalog_head",
    "frame_digest",
    "group_term",
    "manifest_digest",
    "ref_mac",
    "row_term",
    "secret_path",
    "signature_db",
    "store_signature",
    "trust_db_path",
    "user_keys",
]

MANIFEST_NAME = "manifest.json"
HEAD_KEY_PREFIX = "head:"
"""``meta`` key prefix of a head (one per user key, so two users' heads never mix)."""

_MODULUS = 1 << 256


# -- catalog heads ------------------------------------------------------------------


GROUPED = {"checkpoint_entries": "checkpoint_id", "task_log": "cell_run_id"}
"""Tables whose rows count by group, one term per checkpoint or per cell run:
they come many at a time, and hashing a group at once costs a quarter of hashing
its rows one by one. Any other table counts row by row."""


def _prf(key: bytes, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("ascii"), key=key, digest_size=32).digest(), "big")


def row_term(key: bytes, row: tuple[Any, ...]) -> int:
    """The keyed hash of one row, ``(table, column values...)``.

    ``ascii()`` of a tuple of SQLite values (None, int, float, str, bytes) is
    canonical: types stay apart, floats print exactly, and every non-ASCII
    character is escaped the same way on every Python version.
    """
    return _prf(key, ascii(row))


def group_term(key: bytes, table: str, group: str, lines: list[str]) -> int:
    """The keyed hash of one group of a ``GROUPED`` table: its key (``ascii()`` of
    the group column's value) and the ``ascii()`` of each of its rows, in sorted
    order, so it does not depend on the order rows come in. Always starts with
    "g", never with the "(" of a row term."""
    return _prf(key, "g" + ascii((table, group)) + "\n" + "\n".join(sorted(lines)))


def signed_tables(conn: sqlite3.Connection) -> list[tuple[str, list[str]]]:
    """Every table whose rows the head covers (all but ``meta`` and SQLite's own),
    with its columns in declaration order."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name != 'meta' "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        )
    ]
    return [(name, [c[1] for c in conn.execute(f'PRAGMA main.table_info("{name}")')]) for name in names]


def group_index(table: str, columns: list[str]) -> int | None:
    """Where a ``GROUPED`` table's group column is among its columns (None: row by row)."""
    column = GROUPED.get(table)
    return columns.index(column) if column in columns else None


def catalog_head(conn: sqlite3.Connection, key: bytes) -> int:
    """The head of a catalog, computed from all its rows."""
    total = 0
    for table, columns in signed_tables(conn):
        select = ", ".join(f'"{c}"' for c in columns)
        rows = conn.execute(f'SELECT {select} FROM main."{table}"')
        index = group_index(table, columns)
        if index is None:
            for row in rows:
                total += row_term(key, (table, *row))
            continue
        groups: dict[str, list[str]] = {}
        for row in rows:
            groups.setdefault(ascii(row[index]), []).append(ascii(row))
        for group, lines in groups.items():
            total += group_term(key, table, group, lines)
    return total % _MODULUS


def frame_digest(conn: sqlite3.Connection) -> bytes:
    """SHA-256 over the schema and the ``meta`` rows other than heads."""
    schema = conn.execute(
        "SELECT type, name, tbl_name, sql FROM main.sqlite_master ORDER BY type, name"
    ).fetchall()
    try:
        meta = conn.execute(
            "SELECT key, value FROM main.meta WHERE substr(key, 1, ?) != ? ORDER BY key",
            (len(HEAD_KEY_PREFIX), HEAD_KEY_PREFIX),
        ).fetchall()
    except sqlite3.OperationalError:
        meta = []  # no meta table yet
    return hashlib.sha256(ascii((schema, meta)).encode("ascii")).digest()


def store_signature(keys: Keys, head: int, frame: bytes, manifest: str | None) -> str:
    """The signature of a store holding this head, frame and backpack manifest."""
    message = b"nbrewind store v1\0" + head.to_bytes(32, "big") + frame + (manifest or "").encode("ascii")
    return hmac.new(keys.stores, message, "sha256").hexdigest()


def manifest_digest(store_root: str | os.PathLike[str]) -> str | None:
    """SHA-256 hex of the backpack manifest at the store's root, or None."""
    try:
        data = (Path(store_root) / MANIFEST_NAME).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return "unreadable"  # present but not a readable file: not what anybody signed
    return hashlib.sha256(data).hexdigest()


def ref_mac(keys: Keys, namespace: str, name: str, digest: str) -> str:
    """The MAC a ref file carries after its digest."""
    return hmac.new(keys.refs, f"{namespace}\0{name}\0{digest}".encode("ascii"), "sha256").hexdigest()


# -- keeping a writable catalog signed ------------------------------------------------------


_DELTA = "nbrewind_delta"


class CatalogSigner:
    """Keeps the head of one writable catalog connection and signs every commit.

    The catalog calls ``begin`` after ``BEGIN IMMEDIATE``, ``before_commit``
    before ``COMMIT`` and ``end`` after the transaction. Temporary triggers
    (``attach``) copy every row written through the connection, with +1 for a
    new row and -1 for a removed one, into one temporary delta table; the commit
    hashes those rows in one pass, cheaper than a Python call per row. A change
    to ``meta`` (other than a head) or to the schema re-reads the frame.

    It signs only a head it knows to be ours: the head of a catalog it is
    creating, or a signed head plus the rows this connection wrote. A catalog
    whose current head is not signed is never signed here (that is what
    ``jupyter nbrewind trust`` is for), so no write launders someone else's rows.
    """

    def __init__(self, catalog_path: Path) -> None:
        self.root = catalog_path.absolute().parent
        self.keys: Keys | None = None
        self.db: SignatureDB | None = None
        self.signing: bool | None = None
        """None until the first transaction decides; then whether commits are signed."""
        self._columns: dict[str, list[str]] = {}
        """Each catalog table's columns, in the order its delta rows carry them."""
        self._base = 0
        self._frame = b""
        self._schema_version: int | None = None
        self._manifest: str | None = None
        self._data_version: int | None = None
        self._resign = False
        self._pending: tuple[int, bytes] | None = None

    def attach(self, conn: sqlite3.Connection) -> None:
        """Create the delta table and the triggers that fill it, on this connection only
        (outside a transaction: the catalog calls it once its schema is up to date)."""
        conn.execute("PRAGMA recursive_triggers = ON")  # so REPLACE's implicit deletes fire too
        conn.execute("PRAGMA temp_store = MEMORY")  # the delta table never needs a file
        self._detach(conn)
        tables = signed_tables(conn)
        width = max((len(columns) for _, columns in tables), default=0)
        # No column types: no affinity, so each value keeps the type it has in the catalog.
        conn.execute(f"CREATE TEMP TABLE {_DELTA} (sign, tbl, {', '.join(f'c{i}' for i in range(width)) or 'c0'})")
        # A trigger body may not qualify its table; the temp schema is searched first.
        for table, columns in [*tables, ("meta", [])]:
            slots = ", ".join(["sign", "tbl", *(f"c{i}" for i in range(len(columns)))])
            tag = table.replace("'", "''")

            def insert(sign: int, row: str, columns: list[str] = columns, tag: str = tag, slots: str = slots) -> str:
                values = "".join(f', {row}."{c}"' for c in columns)
                return f"INSERT INTO {_DELTA} ({slots}) VALUES ({sign}, '{tag}'{values});"

            when = {"INSERT": "", "DELETE": "", "UPDATE": ""}
            if table == "meta":  # only whether it changed matters; heads are ours
                when = {k: f" WHEN substr({'OLD' if k == 'DELETE' else 'NEW'}.key, 1, 5) != 'head:'" for k in when}
            safe = "".join(ch if ch.isalnum() else "_" for ch in table)
            for kind, body in (
                ("INSERT", insert(1, "NEW")),
                ("DELETE", insert(-1, "OLD")),
                ("UPDATE", insert(-1, "OLD") + " " + insert(1, "NEW")),
            ):
                conn.execute(f'CREATE TEMP TRIGGER nbrewind_sign_{kind.lower()}_{safe} AFTER {kind} ON main."{table}"{when[kind]} BEGIN {body} END')
        self._columns = dict(tables)

    def _detach(self, conn: sqlite3.Connection) -> None:
        for (name,) in conn.execute(
            "SELECT name FROM temp.sqlite_master WHERE type = 'trigger' AND name LIKE 'nbrewind_sign_%'"
        ).fetchall():
            conn.execute(f"DROP TRIGGER temp.{name}")
        conn.execute(f"DROP TABLE IF EXISTS temp.{_DELTA}")
        self._columns = {}

    def _take_delta(self, conn: sqlite3.Connection) -> tuple[int, bool]:
        """Empty the delta table; return how much its rows move the head, and whether
        ``meta`` changed."""
        assert self.keys is not None
        if not self._columns:
            return 0, False
        rows = conn.execute(f"SELECT * FROM temp.{_DELTA}").fetchall()
        if not rows:
            return 0, False
        conn.execute(f"DELETE FROM temp.{_DELTA}")
        key, total, meta = self.keys.rows, 0, False
        by_table: dict[str, list[Any]] = {}
        for row in rows:
            by_table.setdefault(row[1], []).append(row)
        for table, changed in by_table.items():
            columns = self._columns.get(table)
            if columns is None:
                meta = True
                continue
            width = len(columns) + 2
            index = group_index(table, columns)
            if index is None:
                for row in changed:
                    total += row[0] * row_term(key, (table, *row[2:width]))
            else:
                total += self._group_delta(conn, table, columns, index, [(r[0], *r[2:width]) for r in changed])
        return total, meta

    def _group_delta(self, conn: sqlite3.Connection, table: str, columns: list[str], index: int, rows: list[Any]) -> int:
        assert self.keys is not None
        key, total = self.keys.rows, 0
        added: dict[str, list[str]] = {}
        removed: dict[str, list[str]] = {}
        values_of: dict[str, Any] = {}
        at = index + 1  # rows are (sign, *columns)
        last: Any = object()
        group = ""
        for row in rows:
            value = row[at]
            if type(value) is not type(last) or value != last:  # rows of a group come together
                last, group = value, ascii(value)
                values_of.setdefault(group, value)
            (added if row[0] > 0 else removed).setdefault(group, []).append(ascii(row[1:]))
        column = f'"{columns[index]}"'
        for group, value in values_of.items():
            plus, minus = added.get(group, []), removed.get(group, [])
            if not minus:
                (count,) = conn.execute(f'SELECT COUNT(*) FROM main."{table}" WHERE {column} IS ?', (value,)).fetchone()
                if count == len(plus):  # a new group, the common case: the rows are the ones just written
                    total += group_term(key, table, group, plus)
                    continue
            select = ", ".join(f'"{c}"' for c in columns)
            now = [
                ascii(r)
                for r in conn.execute(f'SELECT {select} FROM main."{table}" WHERE {column} IS ?', (value,))
                if ascii(r[index]) == group
            ]
            before = Counter(now)
            before.subtract(plus)
            before.update(minus)
            if now:
                total += group_term(key, table, group, now)
            if +before:
                total -= group_term(key, table, group, list((+before).elements()))
        return total

    def creating(self) -> None:
        """The current transaction creates the catalog: it is ours from the start."""
        self.keys = self.keys or user_keys()
        self.signing = True
        self._resign = True

    def migrating(self) -> None:
        """The current transaction changes the schema: re-sign from all rows."""
        self._resign = True

    def begin(self, conn: sqlite3.Connection) -> None:
        """Start a transaction: decide, or re-check, the head this one builds on."""
        self._resign = False
        self._pending = None
        if self.signing is False:
            return
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if self.signing and version == self._data_version:
            return
        self._data_version = version
        self.keys = self.keys or user_keys()
        self.db = self.db or signature_db()
        db = self.db
        self._take_delta(conn)  # rows already in the catalog count in the head found below
        self._manifest = manifest_digest(self.root)
        self._frame = frame_digest(conn)
        self._schema_version = conn.execute("PRAGMA schema_version").fetchone()[0]
        row = conn.execute("SELECT value FROM main.meta WHERE key = ?", (HEAD_KEY_PREFIX + self.keys.key_id,)).fetchone()
        if row is not None:
            try:
                head = int(row[0], 16) % _MODULUS
            except ValueError:
                head = None
            if head is not None and db.has(store_signature(self.keys, head, self._frame, self._manifest)):
                self.signing, self._base = True, head
                return
        head = catalog_head(conn, self.keys.rows)
        self.signing = db.has(store_signature(self.keys, head, self._frame, self._manifest))
        self._base = head
        if not self.signing:
            self._detach(conn)  # nothing to keep track of for a store we never sign

    def before_commit(self, conn: sqlite3.Connection) -> None:
        """Sign the head this transaction leaves, before it commits: a kill between
        the two leaves an unused signature, never an unsigned store of ours."""
        if not self.signing:
            return
        assert self.keys is not None
        self.db = self.db or signature_db()
        if self._resign:
            self._take_delta(conn)  # (none yet while the catalog is created: it attaches after)
            self._manifest = manifest_digest(self.root)
            frame = frame_digest(conn)
            head = catalog_head(conn, self.keys.rows)
        else:
            delta, meta_changed = self._take_delta(conn)
            schema = conn.execute("PRAGMA schema_version").fetchone()[0]
            frame = self._frame
            if meta_changed or schema != self._schema_version:  # what this transaction did to them counts too
                frame = frame_digest(conn)
            if delta % _MODULUS == 0 and frame == self._frame:
                return
            head = (self._base + delta) % _MODULUS
        conn.execute(
            "INSERT OR REPLACE INTO main.meta (key, value) VALUES (?, ?)",
            (HEAD_KEY_PREFIX + self.keys.key_id, f"{head:064x}"),
        )
        self.db.add(store_signature(self.keys, head, frame, self._manifest), str(self.root))
        self._pending = (head, frame)
        self._schema_version = conn.execute("PRAGMA schema_version").fetchone()[0]

    def end(self, committed: bool) -> None:
        """The transaction is over; a committed head becomes the base of the next.
        (A rolled-back transaction takes its delta rows with it: they are temporary
        rows of the same transaction.)"""
        if committed and self._pending is not None:
            self._base, self._frame = self._pending
        self._resign = False
        self._pending = None
