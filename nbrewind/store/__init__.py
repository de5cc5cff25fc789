"""The store: content-addressed objects, refs and the SQLite catalog.

Imports no other nbrewind package except ``nbrewind.errors``. See
``docs/design/store-api.md`` for the contract other layers rely on.
"""

from __future__ import annotations

from nbrewind.store.catalog import Catalog, CellRun, Checkpoint, TaskLogEntry
from nbrewind.store.digest import digest_bytes, is_digest, new_hasher
from nbrewind.store.maintenance import CorruptObject, DuReport, GcReport, VerifyReport, du, gc, verify_store
from nbrewind.store.objects import BLOB_CHUNK_SIZE, ObjectStore
from nbrewind.store.store import Store, resolve_store_path

__all__ = [
    "BLOB_CHUNK_SIZE",
    "Catalog",
    "CellRun",
    "Checkpoint",
    "CorruptObject",
    "DuReport",
    "GcReport",
    "ObjectStore",
    "Store",
    "TaskLogEntry",
    "VerifyReport",
    "digest_bytes",
    "du",
    "gc",
    "is_digest",
    "new_hasher",
    "resolve_store_path",
    "verify_store",
]
