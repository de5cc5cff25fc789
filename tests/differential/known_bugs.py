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


FIDELITY_BUGS: list[Bug] = []
"""None open. Fixed, with their cases kept in the harness:
- an array restored on its own was a view of its load buffer (zero-copy), so a view
  sliced from it after the restore had `v.base is a` False (loads now make every array
  own its memory: the load buffer becomes the array);
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
