"""The store: content-addressed objects, refs and the SQLite catalog.

Imports no other nbrewind package except ``nbrewind.errors``. See
``docs/design/store-api.md`` for the contract other layers rely on.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbrewind.store.catalog import Catalog, CellRun, Checkpoint, TaskLogEntry
    from nbrewind.store.digest import digest_bytes, is_digest, new_hasher
    from nbrewind.store.maintenance import BrokenRecord, CorruptObject, DuReport, GcReport, VerifyReport, du, gc, verify_store
    from nbrewind.store.objects import BLOB_CHUNK_SIZE, ObjectStore
    from nbrewind.store.store import Store, resolve_store_path
    from nbrewind.store.walk import Record, Walk, records

# Looked up on first use: a Dask worker storing task results needs `ObjectStore`, not the
# catalog, maintenance or walk modules (nor sqlite3). The walk itself is
# `nbrewind.store.walk.walk`: the package attribute `walk` is that submodule.
_WHERE = {
    "Catalog": "catalog",
    "CellRun": "catalog",
    "Checkpoint": "catalog",
    "TaskLogEntry": "catalog",
    "digest_bytes": "digest",
    "is_digest": "digest",
    "new_hasher": "digest",
    "BrokenRecord": "maintenance",
    "CorruptObject": "maintenance",
    "DuReport": "maintenance",
    "GcReport": "maintenance",
    "VerifyReport": "maintenance",
    "du": "maintenance",
    "gc": "maintenance",
    "verify_store": "maintenance",
    "BLOB_CHUNK_SIZE": "objects",
    "ObjectStore": "objects",
    "Store": "store",
    "resolve_store_path": "store",
    "Record": "walk",
    "Walk": "walk",
    "records": "walk",
}

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
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
