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

import ast
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbrewind.analysis import RecordedReads
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.session import pseudo
from nbrewind.session.clients import may_need_client
from nbrewind.session.keys import user_names
from nbrewind.session.matching import Miss, never_replayed, unusable_run
from nbrewind.session.plan import CellPlan, is_function_entry
from nbrewind.session.pseudo import ABSENT
from nbrewind.checkpoint.serialize import Unserializable, digest_value
from nbrewind.session.state import MODULE, PLAIN, READS, UNSERIALIZABLE, VALUE, Entry, used_entries, value_key
from nbrewind.store.digest import digest_bytes

if TYPE_CHECKING:
    from nbrewind.session.keys import Keys
    from nbrewind.session.state import LiveState
    from nbrewind.store.catalog import Catalog, CellRun

__all__ = ["Forecast", "forecast"]

AUDIT_REASON = "the audit kernel runs and records every cell"

Cells = frozenset[int]
"""The indices of the cells that will or may run and decide a value."""

UNFORESEEN: Cells = frozenset({-1})
"""A key the forecast cannot work out (no cell decides it): the cell "depends"."""

_WORLD = frozenset({pseudo.Pseudo.LISTING, pseudo.Pseudo.STAT, pseudo.Pseudo.KIND})
_MODULE = frozenset({pseudo.Pseudo.SOURCE, pseudo.Pseudo.MODULE_STATE})


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


class _Foreseen:
    """The kernel's state as it will be when each cell arrives, as far as it can be known.

    A name's key is a string when known, or the set of cells whose results decide it.
    Later facts win: a replay that binds a name makes it known again."""

    def __init__(self, keys: Keys, state: LiveState, shell: Any) -> None:
        self._keys = keys
        self._ns = shell.user_ns
        self.entries: dict[str, Entry] = dict(state.entries)
        self.known: dict[str, str] = {}
        self.unknown: dict[str, Cells] = {}
        self.every_name: Cells = frozenset()
        self.every_pseudo: Cells = frozenset()
        self.bound: set[str] = set()
        """Names a foreseen replay binds: pending in the kernel afterwards."""
        self.live: dict[str, Cells] = {}
        """Unstorable values a running cell makes live (an empty set: certainly)."""
        self.names: set[str] = set(user_names(shell))
        self.names_unknown: Cells = frozenset()
        self.files_written: set[str] = set()
        """Files (paths as in `@file:` names) that foreseen replays write."""

    def key(self, name: str) -> str | Cells:
        if name in self.known:
            return self.known[name]
        if name in self.unknown:
            return self.unknown[name]
        if self.every_name:
            return self.every_name
        if pseudo.is_pseudo(name):
            if name == pseudo.name(pseudo.Pseudo.NAMES):
                if self.names_unknown:
                    return self.names_unknown
                return digest_bytes("\n".join(sorted(self.names)).encode())
            if self.every_pseudo:
                return self.every_pseudo
            parsed = pseudo.parse(name)
            if parsed is not None and parsed[0] in _WORLD and self._written_at(parsed[1]):
                # A replayed cell wrote files there; what a listing or stat will then say
                # is not worked out here.
                return UNFORESEEN
            if parsed is not None and parsed[0] in _MODULE and self._module_written(parsed[1]):
                return UNFORESEEN
        return self._keys.current_key(name)

    def _module_written(self, module: str) -> bool:
        tail = module.replace(".", "/")
        return any(w.endswith((tail + ".py", tail + "/__init__.py")) or w.endswith(".pth") for w in self.files_written)

    def _written_at(self, path: str) -> bool:
        prefix = "" if path in (".", "") else path.rstrip("/") + "/"
        return any(w == path or w.startswith(prefix) for w in self.files_written)

    def is_pending(self, name: str, *, live_if_unsure: bool) -> bool:
        if name in self.live:
            return bool(self.live[name]) and not live_if_unsure
        if name in self.bound:
            return True
        ns = self._ns
        return isinstance(ns, LazyNamespace) and ns.is_pending(name)

    def make_unknown(self, names: Iterable[str], cells: Cells) -> None:
        for name in names:
            self.known.pop(name, None)
            self.unknown[name] = self.unknown.get(name, frozenset()) | cells

    def make_known(self, name: str, key: str) -> None:
        self.unknown.pop(name, None)
        self.known[name] = key


class _View(RecordedReads):
    """The namespace as `transitive_reads` will see it when a cell arrives."""

    def __init__(self, seen: _Foreseen, real: RecordedReads) -> None:
        self._seen = seen
        self._real = real
        self.unrecorded: set[str] = set()
        """Functions a foreseen replay binds whose reads were not recorded (an old store)."""

    def reads_of(self, name: str) -> frozenset[str] | None:
        seen = self._seen
        if name in seen.bound:
            entry = seen.entries.get(name)
            recorded = entry.extra.get(READS) if entry is not None else None
            if isinstance(recorded, list):
                return frozenset(recorded)
            return None
        if name in seen.unknown or seen.every_name:
            return frozenset()  # its key already depends on a cell that runs
        return self._real.reads_of(name)

    def __getitem__(self, name: str) -> Any:
        seen = self._seen
        if name in seen.bound:
            if is_function_entry(seen.entries.get(name)):
                self.unrecorded.add(name)
            raise KeyError(name)
        if name in seen.unknown or seen.every_name:
            raise KeyError(name)
        return self._real[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._seen.names))

    def __len__(self) -> int:
        return len(self._seen.names)


def _declared_global(codes: Iterable[str]) -> set[str]:
    """Names some code declares `global` (a function that rebinds a notebook name)."""
    out: set[str] = set()
    for code in codes:
        if "global" not in code:
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                out.update(node.names)
    return out


#: Builtins that compute from their arguments and print, and change nothing outside the
#: namespace: a cell that calls only these (on values of no notebook class) cannot move
#: a setting, an RNG, a file or the environment.
_INERT_BUILTINS = frozenset({
    "print", "len", "range", "sorted", "list", "dict", "set", "tuple", "frozenset", "str", "int", "float", "bool",
    "complex", "bytes", "sum", "min", "max", "abs", "round", "enumerate", "zip", "isinstance", "issubclass", "repr",
    "format", "any", "all", "reversed", "divmod", "pow", "hash", "id", "type", "chr", "ord", "hex", "bin", "oct",
})


_CONTAINERS = frozenset({"builtins.list", "builtins.dict", "builtins.set", "builtins.tuple", "builtins.frozenset"})


def _reaches_outside(plan: CellPlan, seen: _Foreseen) -> bool:
    """Whether running the cell may change state outside the namespace (settings, RNGs,
    files, the environment): any import, `with`, `await` or call of anything but an inert
    builtin, or any value of a notebook function or class it reads (its code may run)."""
    try:
        tree = ast.parse(plan.transformed or plan.code)
    except SyntaxError:
        return True
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.With, ast.AsyncWith, ast.Await, ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            if not (isinstance(func, ast.Name) and func.id in _INERT_BUILTINS and func.id not in seen.names):
                return True
    for name in plan.reads:
        entry = seen.entries.get(name)
        if entry is None:
            continue
        kind = str(entry.extra.get("type", ""))
        if entry.extra.get(READS) is not None or entry.extra.get("callable") or kind.startswith("__main__."):
            return True
        if kind in _CONTAINERS and not entry.extra.get(PLAIN):
            return True  # printing or sorting it calls its items' methods, which may be notebook code
    return False


_SCALARS = frozenset({"builtins.int", "builtins.float", "builtins.complex", "builtins.str", "builtins.bytes", "builtins.bool", "builtins.NoneType"})


def _may_change_in_place(name: str, seen: _Foreseen, ns: Any) -> bool:
    """Whether a cell that reads `name` may leave it with another key: not a module (kept by
    name) or a number or string (immutable); anything else may be changed in place."""
    entry = seen.entries.get(name)
    if name not in seen.bound and dict.__contains__(ns, name):
        value = dict.__getitem__(ns, name)
        return not isinstance(value, (types.ModuleType, int, float, complex, str, bytes, bool, type(None)))
    if entry is None:
        return True
    return entry.kind != MODULE and str(entry.extra.get("type", "")) not in _SCALARS


def _run_matches(run: CellRun, seen: _Foreseen) -> tuple[str | None, Cells]:
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
    seen = _Foreseen(keys, state, shell)
    real_view = keys.function_view()
    writers = _declared_global([code for _, code in cells] + [r.code for r in catalog.cell_runs()])
    out: list[Forecast] = []
    for index, (cell_id, code) in enumerate(cells):
        view = _View(seen, real_view)
        plan = keys.analyse(code, cell_id, None, view)
        one = _one(index, plan, seen, view, catalog)
        out.append(one)
        if one.decision == "replay":
            continue
        _after_running(index, one, plan, seen, writers, shell)
    return out


def _one(index: int, plan: CellPlan, seen: _Foreseen, view: _View, catalog: Catalog) -> Forecast:
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


def _bind_replay(candidates: list[CellRun], plan: CellPlan, seen: _Foreseen, catalog: Catalog, deciders: Cells) -> None:
    """What a replay of one of `candidates` leaves: their writes bound (pending), their
    deletes gone, the unstorable values they read re-keyed; where candidates disagree, the
    key depends on `deciders`."""
    results: list[dict[str, Entry | None]] = []
    for run in candidates:
        assert run.checkpoint_id is not None
        written = catalog.checkpoint_entries(run.checkpoint_id, run.writes or ())
        after: dict[str, Entry | None] = {k: Entry.from_meta(d, m) for k, (d, m) in written.items()}
        for name in run.deletes or ():
            after[name] = None
        current = dict(seen.entries)
        current.update({k: v for k, v in after.items() if v is not None})
        for name, entry in used_entries(current, run.reads or (), plan.code_digest, run.inputs or {}).items():
            after[name] = entry
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


_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def _literal_bindings(code: str) -> dict[str, Any] | None:
    """`{name: value}` when the cell only binds names to literal numbers, strings, booleans
    or None (a parameter cell), and shows names or literals; otherwise None."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    out: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Name, ast.Constant)):
            continue
        if not isinstance(stmt, ast.Assign) or not all(isinstance(t, ast.Name) for t in stmt.targets):
            return None
        try:
            value = ast.literal_eval(stmt.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if type(value) not in _ATOMS:
            return None
        for target in stmt.targets:
            assert isinstance(target, ast.Name)
            out[target.id] = value
    return out or None


def _after_running(index: int, one: Forecast, plan: CellPlan, seen: _Foreseen, writers: set[str], shell: Any) -> None:
    """What a cell that runs (or may run) leaves: everything it may change depends on it."""
    effects = plan.effects
    assert effects is not None
    literals = _literal_bindings(plan.transformed or plan.code)
    if literals is not None:
        # A parameter cell: its values, and so their keys, are known without running it
        # (an atom shares objects with nothing, so its group is itself).
        for name, value in literals.items():
            digest = digest_value(value)
            if isinstance(digest, Unserializable):
                seen.make_unknown([name], frozenset({index, *one.after}) - UNFORESEEN)
                continue
            key = value_key(digest, (name,))
            seen.entries[name] = Entry("", VALUE, key, (name,), {"type": f"builtins.{type(value).__name__}"})
            seen.make_known(name, key)
            seen.names.add(name)
            seen.bound.discard(name)
        return
    cells = frozenset({index, *one.after}) - UNFORESEEN
    sure = one.decision == "run"
    if effects.dynamic:
        seen.every_name |= cells.union(*seen.unknown.values())
        seen.known.clear()
        seen.unknown.clear()
    touched = set(effects.writes) | set(effects.deferred_writes) | set(effects.mutated) | set(effects.deletes)
    touched |= {n for n in plan.reads if n in seen.names and _may_change_in_place(n, seen, shell.user_ns)}
    calls = _reaches_outside(plan, seen)
    if calls:
        touched |= writers
    for name in list(touched):
        entry = seen.entries.get(name)
        if entry is not None:
            touched.update(entry.group)
    seen.make_unknown(touched, cells)
    if calls:
        # Later facts win: what a replay left in the files, settings and RNGs is unknown now.
        for name in [n for n in [*seen.known, *seen.unknown] if pseudo.is_pseudo(n)]:
            seen.known.pop(name, None)
            seen.every_pseudo |= seen.unknown.pop(name, frozenset())
        seen.every_pseudo |= cells
    seen.names_unknown |= cells
    seen.names |= set(effects.writes)
    resources = [n for n in plan.reads if (e := seen.entries.get(n)) is not None and e.kind == UNSERIALIZABLE]
    if may_need_client(plan, seen.entries, shell.user_ns):
        resources += [
            n for n, e in seen.entries.items()
            if e.kind == UNSERIALIZABLE and str(e.extra.get("type", "")).startswith("distributed.")
            and str(e.extra.get("type", "")).endswith("Client")
        ]
    if any(seen.is_pending(n, live_if_unsure=False) for n in resources):
        # Making one pending resource re-runs every deferred cell (`Rebuilder.replay_life`):
        # every pending resource comes back with it.
        resources += [n for n, e in seen.entries.items() if e.kind == UNSERIALIZABLE and seen.is_pending(n, live_if_unsure=False)]
    seen.bound -= touched
    for name in resources:
        seen.live[name] = frozenset() if sure else seen.live.get(name, frozenset()) | cells
