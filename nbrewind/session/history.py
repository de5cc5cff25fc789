"""What the catalog recorded about which cell run wrote which value.

Making a value again starts from its history: the recorded cell runs that wrote it, each
with the checkpoint it started from and the one it left, and the replayed runs deferred to
run again (`Deferred`). These are read-only questions to the catalog, kept apart from the
re-running itself (`rebuild`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbrewind.session.state import VALUE

if TYPE_CHECKING:
    from nbrewind.store.catalog import Catalog

__all__ = ["Deferred", "producers", "transform", "written_by", "wrote"]


@dataclass(frozen=True)
class Deferred:
    """A replayed cell run that made or used a pending resource: to run again, in order,
    when a resource is needed live."""

    code: str
    """The cell's code as IPython runs it (transformed)."""
    checkpoint_id: int
    """The recorded run's checkpoint: what it left; its parent is the state it started from."""
    failed: bool
    """The recorded run ended in an error (it may raise again; what it did before counts)."""


def wrote(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, str]:
    """The stored values a cell run wrote: name -> entry digest, for the names of the
    checkpoint it left (`after`) whose value differs from the one it started from."""
    return {n: d for n, (d, meta) in after.items() if meta.get("kind") == VALUE and before.get(n, ("",))[0] != d}


def _before(catalog: Catalog, checkpoint_id: int) -> dict[str, Any]:
    """The entries of the checkpoint a run started from (its checkpoint's parent)."""
    parent = catalog.get_checkpoint(checkpoint_id).parent_id
    return catalog.checkpoint_entries(parent) if parent is not None else {}


def written_by(catalog: Catalog, checkpoint_ids: Iterable[int], digest: str) -> bool:
    """Whether one of the cell runs that left `checkpoint_ids` wrote the stored value
    `digest` (made it, rather than kept it from the state it started from)."""
    for checkpoint_id in checkpoint_ids:
        after = catalog.checkpoint_entries(checkpoint_id)
        if any(d == digest for d, _ in after.values()) and digest in wrote(_before(catalog, checkpoint_id), after).values():
            return True
    return False


def producers(catalog: Catalog, name: str, digest: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """The recorded cell runs that bound `name` to the entry `digest`, newest first: each
    one's code, the checkpoint entries it started from, and whether it ended in an error (a
    cell may bind a name and then raise: what it bound is still the state).

    A run that started from the same entry did not make it (it stored the name again,
    unchanged): re-running it would need the very value being made."""
    for run in reversed(catalog.cell_runs()):
        if run.checkpoint_id is None or run.status not in ("ok", "error") or name not in (run.writes or ()):
            continue
        if catalog.checkpoint_entries(run.checkpoint_id).get(name, ("",))[0] != digest:
            continue
        before = _before(catalog, run.checkpoint_id)
        if before.get(name, ("",))[0] == digest:
            continue
        yield run.code, before, run.status == "error"


def transform(shell: Any, code: str) -> str:
    """Recorded cell code as IPython would run it (magics, shell escapes), without the
    prefilter's per-line look-ups in the user's namespace: those would load pending
    names, the very ones being made again."""
    manager = getattr(shell, "input_transformer_manager", None)
    return str(manager.transform_cell(code) if manager is not None else shell.transform_cell(code))
