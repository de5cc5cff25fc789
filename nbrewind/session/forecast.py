"""Which cells of a notebook will replay and which will run, asked before running any.

A frontend sends the notebook's code cells in order; `forecast` walks them against the
state the kernel has now, with the same analysis, keys and match rules the kernel uses
when a cell arrives (`Keys.analyse`, `matching.never_replayed`, `unusable_run`,
`state.used_entries`), and answers per cell:

- ``replay``: every input of a recorded run is as it will be when the cell arrives
  (after the cells before it replayed as foreseen), so the kernel will replay it;
- ``run``: no recorded run can match (new code, an input already different, a value
  that cannot be compared);
- ``depends``: whether it replays depends on what an earlier cell that runs computes
  (``after`` lists those cells); a run that reproduces the recorded values lets it
  replay, any other makes it run.

A forecast is never optimistic: what a running cell may change is taken widely. Every
name it writes, deletes, mutates or reads (it may change a value in place) and the names
sharing objects with those, every name some notebook function declares ``global`` when
the cell calls anything, and every pseudo-input (files, RNG states, settings, the
environment) unless the cell imports nothing and calls only inert builtins (`print`,
`len`...). The kernel's state is only read:
nothing is loaded or run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbrewind.session import pseudo
from nbrewind.session.foreseen import UNFORESEEN, Cells, Foreseen, View, after_running, declared_global
from nbrewind.session.matching import Miss, never_replayed, unusable_run
from nbrewind.session.pseudo import ABSENT
from nbrewind.session.state import Entry, used_entries

if TYPE_CHECKING:
    from nbrewind.session.keys import Keys
    from nbrewind.session.plan import CellPlan
    from nbrewind.session.state import LiveState
    from nbrewind.store.catalog import Catalog, CellRun

__all__ = ["Forecast", "forecast"]

AUDIT_REASON = "the audit kernel runs and records every cell"


@dataclass
class Forecast:
    """What the kernel will do with one cell."""

    index: int
    cell_id: str | None
    decision: str
    """``replay``, ``run`` or ``depends``."""
    reason: str
    cell_run: int | None = None
    """For a replay, the recorded run it will replay (None when either of two may be)."""
    saves: float | None = None
    """For a replay, how long the recorded run took."""
    after: list[int] = field(default_factory=list)
    """For ``depends``: the earlier cells (indices) whose results decide it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "cell_id": self.cell_id, "decision": self.decision, "reason": self.reason,
            "cell_run": self.cell_run, "saves": self.saves, "after": self.after,
        }


def _run_matches(run: CellRun, seen: Foreseen) -> tuple[str | None, Cells]:
    """How `run`'s inputs compare with the foreseen keys: the first known mismatch (or
    None), and the cells that decide the inputs not yet known."""
    deciders: Cells = frozenset()
    for name, recorded in (run.inputs or {}).items():
        now = seen.key(name)
        if isinstance(now, frozenset):
            deciders |= now
            continue
        if now != recorded:
            what = name[1:] if pseudo.is_pseudo(name) else name
            return f"input {what} changed", deciders
    return None, deciders


def forecast(
    cells: Sequence[tuple[str | None, str]],
    *,
    mode: str,
    keys: Keys,
    state: LiveState,
    catalog: Catalog,
    shell: Any,
) -> list[Forecast]:
    """What the kernel will do with each of `cells` ((cell id, code) in order) if they are
    sent now, one after another; see the module docstring."""
    if mode != "repeat":
        return [Forecast(i, cid, "run", AUDIT_REASON) for i, (cid, _) in enumerate(cells)]
    seen = Foreseen(keys, state, shell)
    real_view = keys.function_view()
    writers = declared_global([code for _, code in cells] + [r.code for r in catalog.cell_runs()])
    out: list[Forecast] = []
    for index, (cell_id, code) in enumerate(cells):
        view = View(seen, real_view)
        plan = keys.analyse(code, cell_id, None, view, foreseen=view.foresees)
        one = _one(index, plan, seen, view, catalog)
        out.append(one)
        if one.decision == "replay":
            continue
        after_running(frozenset({index, *one.after}) - UNFORESEEN, one.decision == "run", plan, seen, writers, shell)
    return out


def _one(index: int, plan: CellPlan, seen: Foreseen, view: View, catalog: Catalog) -> Forecast:
    """Forecast one analysed cell and, for a replay, bind what it writes in `seen`."""
    cid = plan.cell_id
    if view.unrecorded:
        return Forecast(index, cid, "depends", f"what {', '.join(sorted(view.unrecorded))} reads was not recorded")
    sure = never_replayed(plan, seen.entries, lambda n: seen.is_pending(n, live_if_unsure=False))
    if isinstance(sure, Miss):
        return Forecast(index, cid, "run", sure.reason)
    unsure = never_replayed(plan, seen.entries, lambda n: seen.is_pending(n, live_if_unsure=True))
    live_deciders: Cells = frozenset()
    if isinstance(unsure, Miss):
        live_deciders = frozenset().union(*(seen.live.get(n, frozenset()) for n in plan.reads))
    first_mismatch = ""
    any_run = False
    maybe: list[CellRun] = []
    maybe_deciders: Cells = live_deciders
    chosen: CellRun | None = None
    for run in catalog.iter_cell_runs(plan.code_digest):
        any_run = True
        unusable = unusable_run(plan, run)
        if unusable is not None:
            first_mismatch = first_mismatch or unusable
            continue
        mismatch, deciders = _run_matches(run, seen)
        if mismatch is not None:
            first_mismatch = first_mismatch or mismatch
            continue
        if deciders or live_deciders:
            maybe.append(run)
            maybe_deciders |= deciders
            continue
        chosen = run
        break
    if chosen is None:
        if maybe:
            if maybe_deciders <= UNFORESEEN:
                return Forecast(index, cid, "depends", "it reads files or folders that replayed cells write, which a forecast does not work out")
            return Forecast(index, cid, "depends", "replays only if the cells it depends on reproduce their recorded values",
                            after=sorted(maybe_deciders - UNFORESEEN))
        if not any_run:
            had = cid is not None and catalog.has_cell_id(cid)
            return Forecast(index, cid, "run", "code changed" if had else "no record of this code")
        return Forecast(index, cid, "run", first_mismatch or "no usable record")
    candidates = [*maybe, chosen]
    _bind_replay(candidates, plan, seen, catalog, maybe_deciders)
    sure_run = chosen if not maybe else None
    reason = f"code and {len(chosen.inputs or {})} inputs match cell run #{chosen.id}"
    if maybe:
        reason = f"replays cell run #{chosen.id} or a newer one"
    return Forecast(index, cid, "replay", reason, sure_run.id if sure_run else None, chosen.duration)


def _bind_replay(candidates: list[CellRun], plan: CellPlan, seen: Foreseen, catalog: Catalog, deciders: Cells) -> None:
    """What a replay of one of `candidates` leaves: their writes bound (pending), their
    deletes gone, the unstorable values they read re-keyed; where candidates disagree, the
    key depends on `deciders`."""
    results: list[dict[str, Entry | None]] = []
    for run in candidates:
        assert run.checkpoint_id is not None
        written = catalog.checkpoint_entries(run.checkpoint_id, run.writes or ())
        after: dict[str, Entry | None] = {k: Entry.from_meta(d, m) for k, (d, m) in written.items()}
        current = dict(seen.entries)
        current.update({k: v for k, v in after.items() if v is not None})
        for name in run.deletes or ():
            current.pop(name, None)  # a value the cell read, then deleted (`h.close(); del h`), is gone
        for name, entry in used_entries(current, run.reads or (), plan.code_digest, run.inputs or {}).items():
            after[name] = entry
        for name in run.deletes or ():
            after[name] = None
        results.append(after)
    names = set().union(*results)
    for name in names:
        if name.startswith(pseudo.Pseudo.FILE.value):
            seen.files_written.add(name[len(pseudo.Pseudo.FILE.value):])
        outcomes = [r.get(name, seen.entries.get(name)) for r in results]
        first = outcomes[0]
        if any((o.key if o else None) != (first.key if first else None) for o in outcomes):
            seen.make_unknown([name], deciders)
            continue
        if first is None:
            seen.entries.pop(name, None)
            seen.make_known(name, ABSENT)
            seen.names.discard(name)
            seen.bound.discard(name)
            continue
        seen.entries[name] = first
        seen.make_known(name, first.key)
        if not pseudo.is_pseudo(name):
            seen.names.add(name)
            seen.bound.add(name)
            seen.live.pop(name, None)
