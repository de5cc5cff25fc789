"""Deciding whether a cell can be replayed: a recorded run whose code and every input match.

`find_match` is a pure question over what the session knows now: the cell's plan
(its code digest and the names it reads), the recorded runs of the same code,
and a function giving the current key of any input. It answers a `Match` (the
run to replay, and why) or a `Miss` (the reason the cell must run), so the
kernel's decision and a frontend's "what would happen" query share one answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nbrewind.session import outside, policy, pseudo
from nbrewind.session.plan import CellPlan
from nbrewind.session.state import UNSERIALIZABLE, Entry, replayable_resource
from nbrewind.store.catalog import CellRun

__all__ = ["Match", "Miss", "find_match", "first_changed_input", "never_replayed", "unusable_run"]


@dataclass(frozen=True)
class Match:
    """Replay ``run``."""

    run: CellRun
    reason: str


@dataclass(frozen=True)
class Miss:
    """Run the cell, because of ``reason``."""

    reason: str


def find_match(
    plan: CellPlan,
    entries: Mapping[str, Entry],
    recorded_runs: Callable[[], Iterable[CellRun]],
    had_cell: Callable[[], bool],
    current_key: Callable[[str], str],
    is_pending: Callable[[str], bool] = lambda name: False,
) -> Match | Miss:
    """The run of ``plan``'s code to replay, or why there is none.

    ``recorded_runs()`` yields the recorded runs of the same code, newest first (the first
    that matches is replayed, so the rest need not be read);
    ``had_cell()`` says whether this cell id was ever recorded (so a new digest
    reads "code changed"); ``current_key(name)`` is an input's key now;
    ``is_pending(name)`` says whether a name is still only a record (not loaded or made).

    A cell may read a value that cannot be stored (a Dask client, a lock) and still
    replay, if that value is still pending and its key names the recorded cell run that
    made it: then every cell that touched it so far replayed from records too, so it is
    as the recorded run found it, and the replay only defers this cell's effect on it
    (the `Rebuilder` runs the deferred cells, in order, when a cell that runs needs it).
    Once made, it lives in the kernel and its state cannot be compared: cells that read
    it run.
    """
    never = never_replayed(plan, entries, is_pending)
    if never is not None:
        return never
    first_mismatch = ""
    any_run = False
    for run in recorded_runs():
        any_run = True
        unusable = unusable_run(plan, run)
        if unusable is not None:
            first_mismatch = first_mismatch or unusable
            continue
        mismatch = first_changed_input(run, current_key)
        if mismatch is None:
            return Match(run, f"code and {len(run.inputs or {})} inputs match cell run #{run.id}")
        first_mismatch = first_mismatch or mismatch
    if not any_run:
        return Miss("code changed" if had_cell() else "no record of this code")
    return Miss(first_mismatch or "no usable record")


def never_replayed(plan: CellPlan, entries: Mapping[str, Entry], is_pending: Callable[[str], bool]) -> Miss | None:
    """Why no recorded run of ``plan`` may be replayed, whatever its inputs, or None."""
    effects = plan.effects
    assert effects is not None
    if policy.reads_history(plan.reads):
        return Miss("reads IPython output history (_, Out, In)")
    if effects.syntax_error:
        return Miss("syntax error")
    unstorable = sorted(
        n for n in plan.reads
        if (e := entries.get(n)) is not None and e.kind == UNSERIALIZABLE and not (replayable_resource(e) and is_pending(n))
    )
    if unstorable:
        return Miss(f"reads {', '.join(unstorable)}, whose state cannot be stored or compared")
    if "get_ipython" in effects.reads:
        return Miss("uses magics or get_ipython(), whose effects on the kernel a replay cannot restore")
    return None


def unusable_run(plan: CellPlan, run: CellRun) -> str | None:
    """Why ``run`` cannot be replayed for ``plan`` whatever the inputs (it did not finish,
    or its traceback shows other source), or None; "" for a run that did not finish."""
    if run.status not in ("ok", "error") or run.checkpoint_id is None:
        return ""
    if run.status == "error" and run.code != plan.code:
        # Its traceback shows the recorded source lines; the edited cell must show its own.
        return "the recorded run raised and its traceback shows the old source"
    return None


def first_changed_input(run: CellRun, current_key: Callable[[str], str]) -> str | None:
    """Why ``run`` cannot be replayed now (its first input whose key changed), or None."""
    for name, recorded in (run.inputs or {}).items():
        if current_key(name) != recorded:
            if name == outside.IMPURE:
                said = "" if "which a replay cannot" in recorded else ", which a replay cannot do"
                return f"the recorded run {recorded}{said}"
            what = name[1:] if pseudo.is_pseudo(name) else name
            return f"input {what} changed"
    return None
