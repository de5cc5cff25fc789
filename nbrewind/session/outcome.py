"""What the kernel did with one execute_request, for ``metadata.nbrewind`` of its reply.

Frontends (the JupyterLab extension, VS Code, nbclient users) read this instead of
parsing logs; docs/reply-metadata.md is the contract. Every value is JSON, small,
and present in every reply of an NBRewind kernel to a non-silent execute_request:

``decision``   "replayed", "ran" or "not recorded"
``reason``     why, in words (the same text `%nbrewind why` shows)
``duration``   seconds this request took in the kernel (replay or run)
``recorded_duration``, ``saved``
               for a replay: what the replayed run took, and the difference
``task_hits``, ``task_misses``
               Dask tasks loaded from the task cache and computed, for a cell that ran
``cell_run``   for a replay, the id of the recorded cell run it replayed; None for a
               cell that ran (its record is written in the background after the reply)
``recorded``   whether this request leaves a record a repeat can replay
``brought_back``
               what the request spent bringing back values replays had left pending
               (loaded from the store, or rebuilt by re-running the cell that made them)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbrewind.store import CellRun

if TYPE_CHECKING:
    from nbrewind.session.restore import BroughtBack

__all__ = ["VERSION", "brought_back", "not_recorded", "ran", "replayed"]

#: At most this many names are listed per kind; the counts are always complete.
MAX_NAMES = 20

VERSION = 1


def _base(decision: str, reason: str, duration: float | None, recorded: bool) -> dict[str, Any]:
    return {
        "version": VERSION,
        "decision": decision,
        "reason": reason,
        "duration": None if duration is None else round(duration, 6),
        "recorded_duration": None,
        "saved": None,
        "task_hits": 0,
        "task_misses": 0,
        "cell_run": None,
        "recorded": recorded,
        "brought_back": {"seconds": 0.0, "loaded": 0, "rebuilt": 0, "names": []},
    }


def brought_back(what: BroughtBack) -> dict[str, Any]:
    """``brought_back``: seconds, how many values were loaded and rebuilt, and the first
    :data:`MAX_NAMES` names (rebuilt ones first: they cost most)."""
    names = [*what.rebuilt, *what.loaded][:MAX_NAMES]
    return {"seconds": round(what.seconds, 6), "loaded": len(what.loaded), "rebuilt": len(what.rebuilt), "names": names}


def replayed(reason: str, duration: float, run: CellRun) -> dict[str, Any]:
    """A replay of recorded cell run `run`, which took `duration` seconds."""
    out = _base("replayed", reason, duration, True)
    if run.duration is not None:
        out["recorded_duration"] = round(run.duration, 6)
        out["saved"] = round(max(0.0, run.duration - duration), 6)
    out["cell_run"] = run.id
    return out


def ran(reason: str, duration: float, task_hits: int, task_misses: int) -> dict[str, Any]:
    """A cell that ran and was recorded."""
    out = _base("ran", reason, duration, True)
    out["task_hits"], out["task_misses"] = task_hits, task_misses
    return out


def not_recorded(reason: str, duration: float | None = None) -> dict[str, Any]:
    """A cell that ran as on a plain kernel and left no record."""
    return _base("not recorded", reason, duration, False)
