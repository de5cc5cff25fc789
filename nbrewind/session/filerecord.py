"""The files, listings and library state an executed cell read and wrote, as its record.

After a cell runs, the file tracker knows what it opened, removed, renamed and made;
the world tracker what listings and metadata it looked at; `outside` what library
settings and local modules it read or changed.  `WrittenFiles` turns that into the
cell's inputs (digests and facts as found) and writes (file blobs, folders made,
removals), and keeps the files earlier cells wrote, so that a file written through a
handle an earlier cell left open still counts as written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import hidden
from nbrewind.identity.files import read_file
from nbrewind.session import outside, pseudo
from nbrewind.session.plan import env_key
from nbrewind.session.pseudo import ABSENT, Pseudo
from nbrewind.session.state import HIDDEN, Entry

if TYPE_CHECKING:
    from nbrewind.checkpoint.world import WorldTracker
    from nbrewind.session.plan import CellPlan, Paths
    from nbrewind.store.objects import ObjectStore

__all__ = ["Draft", "WrittenFiles"]

_KEPT_LIMIT = 10_000
"""Files written by earlier cells whose signature every executed cell compares (two stats each)."""

_FOUND = {"kind": Pseudo.KIND, "stat": Pseudo.STAT, "listing": Pseudo.LISTING}
"""`FileTracker.found`'s kinds of fact as the pseudo-inputs that key them now."""


@dataclass
class Draft:
    """What the record of the cell holds so far, while `record` adds the hidden state."""

    inputs: dict[str, str]
    changed: dict[str, Entry]
    staged: list[Any]
    written: int
    unserializable: set[str] = field(default_factory=set)


class WrittenFiles:
    """Adds an executed cell's file, listing and library inputs and writes to its record."""

    def __init__(
        self, objects: ObjectStore, tracker: hidden.FileTracker, world: WorldTracker, outside: outside.Outside, paths: Paths
    ) -> None:
        self._objects = objects
        self._tracker = tracker
        self._world = world
        self._outside = outside
        self._paths = paths
        self._kept: dict[str, None] = {}
        """Files executed cells of this kernel wrote, in order (at most `_KEPT_LIMIT`)."""

    def signatures(self) -> dict[str, tuple[int, int, int] | None]:
        """The signature of every file earlier cells wrote, taken before a cell runs."""
        return {path: _signature(path) for path in self._kept}

    def add(self, plan: CellPlan, draft: Draft) -> None:
        """Files read and written, directory listings and file metadata, library settings
        and local modules' state; and why a replay could not do what the cell did."""
        assert plan.effects is not None
        inputs, changed, rel = draft.inputs, draft.changed, self._paths.rel
        files, world = self._tracker, self._world
        for path, db_digest in world.databases.items():
            # sqlite opens its file in C: read before, and possibly written by, the cell.
            files.read_digests.setdefault(path, db_digest)
            files.reads.add(path)
            files.writes.add(path)
        for path in sorted(files.reads):
            found = files.read_digests.get(path, hidden.file_digest(path))
            inputs[pseudo.name(Pseudo.FILE, rel(path))] = found or ABSENT
        self._outside.world_inputs(world, plan.env_before, inputs, env_key)
        for (how, path), key in sorted(files.found.items()):
            # What a removal, rename or link found: whether the path existed, its content, a folder's names.
            inputs.setdefault(pseudo.name(_FOUND[how], rel(path)), key)
        outside_bytes, impure = self._outside.after(plan.outside_before, inputs, changed, draft.staged)
        draft.written += outside_bytes
        if not any(k.startswith(Pseudo.SETTING.value) for k in changed):
            impure += [f"changes module {m}, which a replay cannot restore" for m in outside.rebound_modules(plan.module_bindings)]
        if "reload" in plan.effects.reads or "reload" in plan.reads:
            impure.append("reloads a module")
        outside.note_impure(inputs, impure)
        for path, before in plan.kept_before.items():
            if path not in files.writes and _signature(path) != before:
                files.writes.add(path)  # written through a handle an earlier cell opened: no open now
        if len(self._kept) < _KEPT_LIMIT:
            self._kept.update(dict.fromkeys(sorted(files.writes)))
        for path in sorted(files.writes):
            relpath = rel(path)
            if os.path.isdir(path):
                if path in files.made_dirs and not _holds_only_excluded(path, files.excluded):
                    made = {"what": "file", "path": relpath, "dir": True}
                    # Keyed as a file input of the path is keyed then: a folder has no content (ABSENT).
                    changed[pseudo.name(Pseudo.FILE, relpath)] = Entry(ABSENT, HIDDEN, ABSENT, (), made)
                continue
            if not os.path.lexists(path) and path in files.created:
                continue  # made and removed by the cell: nothing on disk changed
            if os.path.isfile(path):
                data, key = read_file(path)  # one read gives both the stored bytes and the key
                blob = self._objects.stage_blob(data, owned=True)
                draft.staged.append(blob)
                draft.written += blob.new_bytes
                changed[pseudo.name(Pseudo.FILE, relpath)] = Entry(blob.digest, HIDDEN, key, (), {"what": "file", "path": relpath})
            else:
                gone: dict[str, Any] = {"what": "file", "path": relpath, "deleted": True}
                if path in files.dirs:
                    gone["dir"] = True  # removed with everything under it
                changed[pseudo.name(Pseudo.FILE, relpath)] = Entry(ABSENT, HIDDEN, ABSENT, (), gone)
        if files.writes:
            inputs[pseudo.name(Pseudo.CWD)] = rel(plan.cwd_before)


def _holds_only_excluded(folder: str, excluded: Callable[[str], bool]) -> bool:
    """Whether a folder the cell made holds nothing but what the file tracker leaves out
    (a Dask cluster's scratch space made where `temporary-directory` says): that folder is
    the cluster's, not the notebook's."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return bool(names) and all(excluded(os.path.join(folder, name)) for name in names)


def _signature(path: str) -> tuple[int, int, int] | None:
    """What tells that a file changed: its size, modification time and inode (None: gone)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ino)
