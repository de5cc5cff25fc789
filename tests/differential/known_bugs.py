"""Known NBRewind bugs the differential harness finds, and which generated cases hit them.

Each predicate looks only at a case's structure (families, edit labels, where
cells sit), so the expectation is exact and the tests can mark those cases
`xfail(strict=True)`. When a bug is fixed its cases XPASS, strict xfail turns
that into a failure, and the entry here should be deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from differential.generator import Case

__all__ = ["FIDELITY_BUGS", "MINIMAL_WORK_BUGS", "Bug", "expected_failures"]


@dataclass(frozen=True)
class Bug:
    """One known bug: a one-line description and which cases it breaks."""

    reason: str
    hits: Callable[[Case, str], bool]


def _restored_view_base(case: Case, tier: str) -> bool:
    # The views fragment's reader prints `v.base is a`. With view-bounds, `v = a[lo:hi]` is
    # its own edited cell, so it runs on an `a` the repeat restored alone: zero-copy loads
    # make every restored array a view of its load buffer, and numpy then gives `v` that
    # buffer as its base. (A view restored with its base is fine: the base owns its memory.)
    return "views" in case.families and "views:view-bounds" in case.labels


FIDELITY_BUGS: list[Bug] = [
    Bug(
        "an array restored on its own is a view of its load buffer (zero-copy), so a view sliced "
        "from it after the restore has v.base is a False (True in a fresh run)",
        _restored_view_base,
    ),
]
"""Open: above. Fixed, with their cases kept in the harness:
- a restored numpy array and its view came back as views of a hidden load buffer, so
  `v.base is a` was False (a root shared by views in its group now comes back owning
  its memory);
- a call mutating a notebook function's mutable default was not checkpointed (called
  notebook functions are now re-digested after the cell);
- reading os.environ was not an input (variables the notebook set are inputs of cells
  that mention environ/getenv, and of dynamic cells);
- appending to a file did not record its prior content (the digest is taken when the
  cell first opens the file);
- a globals() cell ignored names absent at record time (the set of names is an input);
- a replayed error showed the recorded source after a cosmetic edit (a run that raised
  replays only for identical text)."""

MINIMAL_WORK_BUGS: list[Bug] = []
"""None open. Was: a cell calling random.seed recorded the RNG state before it as an
input, so it never replayed in a new process."""


def expected_failures(case: Case, bugs: list[Bug], tier: str) -> list[str]:
    """Reasons of the known bugs in `bugs` that `case` hits on `tier` ("inprocess" or "kernel")."""
    return [bug.reason for bug in bugs if bug.hits(case, tier)]
