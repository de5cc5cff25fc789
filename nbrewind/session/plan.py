"""What the session keeps about one request, and the small rules shared by recording and replay."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbrewind.analysis import CellEffects, RecordedReads
from nbrewind.analysis.uses import Use
from nbrewind.checkpoint.draws import DrawWatch
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.session.patches import PatchWatch
from nbrewind.session.pseudo import ABSENT
from nbrewind.session.state import READS, Entry
from nbrewind.store.catalog import CellRun
from nbrewind.store.digest import digest_bytes

Emit = Callable[[str, dict[str, Any], dict[str, Any], list[bytes]], None]


@dataclass
class CellPlan:
    """What the session decided for one execute_request, and what it saw before the cell ran."""

    record: bool
    replay: bool = False
    code: str = ""
    transformed: str = ""
    code_digest: str = ""
    cell_id: str | None = None
    msg_id: str | None = None
    effects: CellEffects | None = None
    reads: set[str] = field(default_factory=set)
    inputs: dict[str, str] = field(default_factory=dict)
    kept_before: dict[str, tuple[int, int, int] | None] = field(default_factory=dict)
    """Before the cell ran, the stat signature of each file earlier cells wrote (see
    `Recorder.start`): one that changes while the cell runs, though it opens nothing, was
    written through a handle an earlier cell kept open."""
    prior: dict[str, str] = field(default_factory=dict)
    """Keys, before the cell runs, of the names it may bind that it does not read: where the
    run leaves one unchanged, its value before is what the cell left (an input after all)."""
    match: CellRun | None = None
    resources: list[str] = field(default_factory=list)
    """Pending unstorable values the matched cell reads (its effect on them is deferred)."""
    reason: str = ""
    started: float = 0.0
    prepared: float = 0.0
    """Seconds the request spent before the run started (putting back what replays left
    pending): part of its duration, in the reply and in the record."""
    rng_before: dict[str, str] = field(default_factory=dict)
    rng_key_before: dict[str, str] = field(default_factory=dict)
    env_before: dict[str, str] = field(default_factory=dict)
    cwd_before: str = ""
    tracking: contextlib.ExitStack | None = None
    seeded: dict[str, bool] = field(default_factory=dict)
    draws: DrawWatch | None = None
    background_draws_only: bool = False
    outside_before: dict[str, str] = field(default_factory=dict)
    uses: dict[str, list[Use]] | None = None
    module_bindings: dict[str, dict[str, int]] = field(default_factory=dict)
    patch_watch: PatchWatch | None = None
    """Library modules and classes the cell may patch, as they were before it ran."""


@dataclass
class LastCell:
    """The most recent decision, for `%nbrewind why` and `status`."""

    execution_count: int
    decision: str
    reason: str
    seconds: float = 0.0
    bytes_written: int = 0
    checkpoint_seconds: float = 0.0


@dataclass
class RngLedger:
    """What the session knows of the global RNGs between cells, and the temp files replayed
    cells left: read and written by the keys, the recorder, replay and restore, which is why
    it is one object."""

    pending: dict[str, Entry] = field(default_factory=dict)
    """States replayed cells left, applied just before the next cell runs."""
    left: dict[str, str] = field(default_factory=dict)
    """Digest of each global RNG state as the last recorded or replayed cell left it."""
    files: dict[str, Entry] = field(default_factory=dict)
    """`@file:` entries of files in the temp folder (`hidden.in_temp_folder`) that replayed
    cells wrote or deleted, by absolute path: written (or removed) just before user code runs
    again (`Restorer.apply_pending`), so a repeat that runs nothing leaves the temp folder alone.
    Until then a key sees each path as its entry says."""


@dataclass(frozen=True)
class Paths:
    """Paths in keys and records are relative to the kernel's start folder when they lie
    inside it, so that a store moved with its notebook still matches."""

    start_dir: Path

    def rel(self, path: str) -> str:
        """A path relative to the kernel's start folder when it lies inside it (portable keys)."""
        p = Path(path).resolve()
        try:
            return p.relative_to(self.start_dir).as_posix() or "."
        except ValueError:
            return p.as_posix()

    def abs(self, rel: str) -> str:
        return rel if os.path.isabs(rel) else str(self.start_dir / rel)


class FunctionView(RecordedReads):
    """The namespace as transitive_reads sees it: a pending function's reads come from its
    checkpoint entry (recorded when it was stored); one stored without them is loaded."""

    def __init__(self, namespace: dict[str, Any], entries: Mapping[str, Entry]) -> None:
        self._ns = namespace
        self._entries = entries

    def reads_of(self, name: str) -> frozenset[str] | None:
        ns = self._ns
        if isinstance(ns, LazyNamespace) and ns.is_pending(name):
            entry = self._entries.get(name)
            recorded = entry.extra.get(READS) if entry is not None else None
            if isinstance(recorded, list):
                return frozenset(recorded)
        return None

    def __getitem__(self, name: str) -> Any:
        ns = self._ns
        if dict.__contains__(ns, name):
            return dict.__getitem__(ns, name)
        if isinstance(ns, LazyNamespace) and ns.is_pending(name):
            if is_function_entry(self._entries.get(name)):
                return ns.materialize(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.keys(self._ns))

    def __len__(self) -> int:
        return dict.__len__(self._ns)


def is_function_entry(entry: Entry | None) -> bool:
    return entry is not None and bool(entry.extra.get("callable"))


def env_key(value: str | None) -> str:
    return ABSENT if value is None else digest_bytes(("env|" + value).encode())


def run_status(reply: Mapping[str, Any]) -> str:
    status = reply.get("status", "ok")
    if status == "error" and reply.get("ename") in ("KeyboardInterrupt", "CancelledError"):
        return "aborted"
    return str(status)


def reply_record(reply: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("status", "ename", "evalue", "traceback", "payload")
    record: dict[str, Any] = json.loads(json.dumps({k: reply[k] for k in keep if k in reply}, default=str))
    return record
