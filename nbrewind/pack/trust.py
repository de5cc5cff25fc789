"""``trust``: accept an unpacked backpack's checkpoints on this machine.

Unpickling a checkpoint runs code, so a store unpacked from a backpack is
untrusted until its manifest digest is recorded in the local trust database
(see ``nbrewind.store.origin``, which the kernels consult). Trusting first
re-verifies the folder: a digest is only recorded for content that matches it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nbrewind.errors import PackError
from nbrewind.pack.verify import locate, verify
from nbrewind.store.origin import is_trusted, record_trust, trust_db_path

__all__ = ["TrustResult", "is_trusted", "trust"]


@dataclass(frozen=True)
class TrustResult:
    """What ``trust`` recorded."""

    folder: str
    store: str
    manifest_sha256: str
    newly_trusted: bool
    trust_db: str


def trust(path: str | os.PathLike[str]) -> TrustResult:
    """Verify the unpacked backpack at ``path`` and trust its manifest digest."""
    target = Path(path).absolute()
    if target.is_file():
        raise PackError(f"{target} is a file; unpack it first (`jupyter nbrewind unpack {target}`), then trust the folder")
    folder = locate(target)
    report = verify(target)
    if not report.ok or report.manifest_sha256 is None:
        raise PackError(f"{target} does not verify, so it was not trusted:\n  " + "\n  ".join(report.problems))
    newly = record_trust(report.manifest_sha256, str(folder.manifest_path.parent))
    return TrustResult(str(target), str(folder.manifest_path.parent), report.manifest_sha256, newly, str(trust_db_path()))
