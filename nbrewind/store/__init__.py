"""The store: content-addressed objects, refs and the SQLite catalog.

Imports no other nbrewind package except ``nbrewind.errors``. See
``docs/design/store-api.md`` for the contract other layers rely on.
"""

from __future__ import annotations

from nbrewind.store.catalog import Catalog, CellRun, Checkpoint, TaskLogEntry
from nbrewind.store.digest import digest_bytes, is_digest, new_hasher
from nbrewind.store.maintenance import BrokenRecord, CorruptObject, DuReport, GcReport, VerifyReport, du, gc, verify_store
from nbrewind.store.objects import BLOB_CHUNK_SIZE, ObjectStore
from nbrewind.store.store import Store, resolve_store_path
from nbrewind.store.walk import Record, Walk, records, walk

__all__ = [
    "BLOB_CHUNK_SIZE",
    "BrokenRecord",
    "Catalog",
    "CellRun",
    "Checkpoint",
    "CorruptObject",
    "DuReport",
    "GcReport",
    "ObjectStore",
    "Record",
    "Store",
    "TaskLogEntry",
    "VerifyReport",
    "Walk",
    "digest_bytes",
    "du",
    "gc",
    "is_digest",
    "new_hasher",
    "records",
    "resolve_store_path",
    "verify_store",
    "walk",
]
