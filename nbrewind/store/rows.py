"""The catalog's rows as typed records, and how their JSON columns are encoded.

Callers build a `CellRun` or a `TaskLogEntry` and hand it to the catalog; the
catalog gives the same types back. ``id`` is the catalog's: 0 on a record not
yet written, ignored when one is added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from nbrewind.errors import StoreError

__all__ = ["CELL_RUN_COLUMNS", "CELL_RUN_JSON", "TASK_COLUMNS", "CellRun", "Checkpoint", "TaskLogEntry"]


@dataclass(frozen=True, kw_only=True)
class CellRun:
    """One execute_request handled by a kernel, as recorded."""

    id: int = 0
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


@dataclass(frozen=True, kw_only=True)
class TaskLogEntry:
    """One Dask task the kernel saw: computed (``hit=False``) or loaded from cache.
    ``created`` 0 on a new entry means "now" when it is logged."""

    id: int = 0
    fingerprint: str
    key_prefix: str | None = None
    cell_run_id: int | None = None
    hit: bool = False
    duration: float | None = None
    nbytes: int | None = None
    worker: str | None = None
    result_digest: str | None = None
    created: float = 0.0


CELL_RUN_COLUMNS = tuple(f.name for f in fields(CellRun))
CELL_RUN_JSON = frozenset({"reply", "inputs", "reads", "writes", "deletes"})
TASK_COLUMNS = tuple(f.name for f in fields(TaskLogEntry))


def dumps(value: Any) -> str | None:
    """A JSON column's text (None stays NULL); sorted and compact, so equal values sign alike."""
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def loads(text: str | None) -> Any:
    """A JSON column's value; a damaged one is a StoreError that says what to do."""
    try:
        return None if text is None else json.loads(text)
    except (TypeError, ValueError) as exc:  # a damaged page can still read as a value of another type
        raise StoreError(
            f"the catalog holds a damaged record ({exc}); restore catalog.sqlite from a backup or a backpack, "
            f"or move it aside and run the notebook on the audit kernel to record it again"
        ) from None
