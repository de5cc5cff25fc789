"""The kernel's state as a forecast sees it when each cell arrives (`Foreseen`), and what
a cell that runs or may run does to it (`after_running`).

A forecast is never optimistic (see forecast.py): where a running cell may change a
name, a file, a setting or an RNG, the key of that input becomes the set of cells whose
results decide it, and every later cell reading it "depends" on them.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from nbrewind.analysis import RecordedReads
from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.serialize import Unserializable
from nbrewind.session import pseudo
from nbrewind.session.clients import may_need_client
from nbrewind.session.keys import user_names
from nbrewind.session.outside import SYS_PATH_INPUT
from nbrewind.session.plan import CellPlan, is_function_entry
from nbrewind.session.state import MODULE, PLAIN, READS, UNSERIALIZABLE, VALUE, Entry, value_key
from nbrewind.store.digest import digest_bytes

if TYPE_CHECKING:
    from nbrewind.session.keys import Keys
    from nbrewind.session.state import LiveState

__all__ = ["UNFORESEEN", "Cells", "Foreseen", "View", "after_running", "declared_global"]

Cells = frozenset[int]
"""The indices of the cells that will or may run and decide a value."""

UNFORESEEN: Cells = frozenset({-1})
"""A key the forecast cannot work out (no cell decides it): the cell "depends"."""

_WORLD = frozenset({pseudo.Pseudo.LISTING, pseudo.Pseudo.STAT, pseudo.Pseudo.KIND})
_MODULE = frozenset({pseudo.Pseudo.SOURCE, pseudo.Pseudo.MODULE_STATE})


class Foreseen:
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
            if parsed is not None and parsed[0] in _MODULE and (self._module_written(parsed[1]) or self._sys_path_moved()):
                # Where the module will be found (and what it will hold) is not worked out here.
                return UNFORESEEN
        return self._keys.current_key(name)

    def _sys_path_moved(self) -> bool:
        """Whether a foreseen replay changes sys.path (replays put it back at once)."""
        known = self.known.get(SYS_PATH_INPUT)
        return known is not None and known != self._keys.current_key(SYS_PATH_INPUT)

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


class View(RecordedReads):
    """The namespace as `transitive_reads` will see it when a cell arrives."""

    def __init__(self, seen: Foreseen, real: RecordedReads) -> None:
        self._seen = seen
        self._real = real
        self.unrecorded: set[str] = set()
        """Functions a foreseen replay binds whose reads were not recorded (an old store)."""

    def foresees(self, name: str) -> bool:
        """Whether `name` may be bound when the cell arrives (a replay or run before it binds it)."""
        seen = self._seen
        return name in seen.names or name in seen.bound or name in seen.unknown

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


def declared_global(codes: Iterable[str]) -> set[str]:
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


def _reaches_outside(plan: CellPlan, seen: Foreseen) -> bool:
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


def _may_change_in_place(name: str, seen: Foreseen, ns: Any) -> bool:
    """Whether a cell that reads `name` may leave it with another key: not a module (kept by
    name) or a number or string (immutable); anything else may be changed in place."""
    entry = seen.entries.get(name)
    if name not in seen.bound and dict.__contains__(ns, name):
        value = dict.__getitem__(ns, name)
        return not isinstance(value, (types.ModuleType, int, float, complex, str, bytes, bool, type(None)))
    if entry is None:
        return True
    if entry.kind == MODULE:
        return bool(entry.extra.get("attr"))  # a library's object (`state.library_object`) may be changed in place
    return str(entry.extra.get("type", "")) not in _SCALARS


_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def _deleted_at_top_level(code: str) -> set[str]:
    """Names a cell's own top-level `del` statements unbind (not those in a branch or loop)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    return {t.id for stmt in tree.body if isinstance(stmt, ast.Delete) for t in stmt.targets if isinstance(t, ast.Name)}


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


def after_running(cells: Cells, sure: bool, plan: CellPlan, seen: Foreseen, writers: set[str], shell: Any) -> None:
    """What a cell that runs (`sure`) or may run leaves: everything it may change depends
    on `cells` (the cell itself and the cells that decide whether it runs)."""
    effects = plan.effects
    assert effects is not None
    literals = _literal_bindings(plan.transformed or plan.code)
    if literals is not None:
        # A parameter cell: its values, and so their keys, are known without running it
        # (an atom shares objects with nothing, so its group is itself).
        for name, value in literals.items():
            digest = digest_value(value)
            if isinstance(digest, Unserializable):
                seen.make_unknown([name], cells)
                continue
            key = value_key(digest, (name,))
            seen.entries[name] = Entry("", VALUE, key, (name,), {"type": f"builtins.{type(value).__name__}"})
            seen.make_known(name, key)
            seen.names.add(name)
            seen.bound.discard(name)
        return
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
    if sure:
        # A top-level `del` of a cell that runs leaves the name unbound: a later cell that
        # reads every name (globals()) does not read it, nor an unstorable value it held.
        for name in _deleted_at_top_level(plan.transformed or plan.code) - set(effects.writes):
            seen.names.discard(name)
            seen.entries.pop(name, None)
