"""IPython's output history across replays: `_`, `__`, `___`, `_N`, `Out[N]` and `_oh`.

A cell whose last expression shows a value puts that value into the output history. A
replayed cell re-sends what was shown, but a later cell reading `_` or `Out[3]` needs the
value itself, as a fresh run has it. So a recorded run keeps its result: by reference when
a notebook name holds that very object (a cell ending in `df`), else stored as a value of
its own (`1 + 1`, `df.describe()`). A replay notes the result under its new execution count
and nothing is loaded until a cell that can read the history runs (`OutputHistory.fill`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint.functions import restoring_into
from nbrewind.checkpoint.serialize import Unserializable
from nbrewind.checkpoint.values import load_group, stage_group
from nbrewind.session.state import UNSERIALIZABLE, VALUE, Entry

if TYPE_CHECKING:
    from nbrewind.session.notices import Notices
    from nbrewind.session.state import LiveState
    from nbrewind.store.objects import ObjectStore

__all__ = ["OutputHistory", "record_result", "result_digest", "shown"]

_UNDERS = ("_", "__", "___")
_SAME = object()


def _output_hist(shell: Any) -> dict[int, Any] | None:
    hist = getattr(getattr(shell, "history_manager", None), "output_hist", None)
    return hist if isinstance(hist, dict) else None


def shown(shell: Any, count: int) -> bool:
    """Whether cell `count` put a value into the output history."""
    hist = _output_hist(shell)
    return hist is not None and count in hist


def record_result(shell: Any, state: LiveState, objects: ObjectStore, count: int, staged: list[Any]) -> dict[str, Any] | None:
    """What to keep of the value cell `count` put into the output history, or None when it
    showed none. Call after the cell's checkpoint (names are indexed by then); a value
    stored here joins `staged`."""
    hist = _output_hist(shell)
    if hist is None or count not in hist:
        return None
    value = hist[count]
    name = state.name_bound_to(value)
    if name is not None:
        entry = state.entries.get(name)
        if entry is not None and entry.kind in (VALUE, UNSERIALIZABLE):
            return {"name": name, "digest": entry.digest, "kind": str(entry.kind)}
    group = stage_group(objects, {"value": value})
    if isinstance(group, Unserializable):
        return {"unstored": group.reason}
    staged.append(group)
    return {"digest": group.digest}


def result_digest(spec: dict[str, Any] | None) -> str | None:
    """The stored object a result record keeps alive (its outputs tree's last child)."""
    if spec is None or "unstored" in spec:
        return None
    digest = spec.get("digest")
    return digest if isinstance(digest, str) and spec.get("kind") != str(UNSERIALIZABLE) else None


class OutputHistory:
    """Results of replayed cells, put into the output history when a cell may read it."""

    def __init__(self, shell: Any, state: LiveState, notices: Notices) -> None:
        self._shell = shell
        self._state = state
        self._notices = notices
        self._pending: list[tuple[int, dict[str, Any]]] = []
        self._rebound: dict[int, Entry | None] = {}
        """Pending results (by count) whose name a later cell may have bound to another object:
        the name's entry just before that cell (what the object held then)."""

    def note(self, count: int, spec: dict[str, Any] | None) -> None:
        """A replayed cell showed its recorded result as cell `count`."""
        if spec is not None:
            self._pending.append((count, spec))

    def binds(self, names: AbstractSet[str] | None) -> None:
        """A cell (replayed or run) may bind `names` (None: any name). A result shown by
        name is that name's object only until it is bound anew; changed in place, it is
        still the same object, as `Out[N]` is in a fresh run."""
        for count, spec in self._pending:
            if "name" in spec and count not in self._rebound and (names is None or spec["name"] in names):
                self._rebound[count] = self._state.entries.get(spec["name"])

    def fill(self) -> None:
        """Put the pending results into `Out`, `_N`, and `_`, `__`, `___` as the displayhook
        would have, had the replayed cells run."""
        if not self._pending:
            return
        shell = self._shell
        hist = _output_hist(shell)
        hook = getattr(shell, "displayhook", None)
        if hist is None or hook is None:
            self._pending.clear()
            return
        pending, self._pending = self._pending, []
        rebound, self._rebound = self._rebound, {}
        ns = shell.user_ns
        missing = []
        for count, spec in pending:
            try:
                value = self._value(spec, rebound[count] if count in rebound else _SAME)
            except LookupError as exc:
                missing.append(f"Out[{count}] ({exc})")
                continue
            hist[count] = value
            dict.__setitem__(ns, f"_{count}", value)
        # `_`, `__`, `___` are the last three results, unless the user bound one of them.
        latest = [hist[c] for c in sorted(hist)[-3:]][::-1]
        latest += [""] * (3 - len(latest))
        mine = any(u in ns and getattr(hook, u, None) is not ns[u] for u in _UNDERS)
        for under, value in zip(_UNDERS, latest):
            setattr(hook, under, value)
            if not mine:
                dict.__setitem__(ns, under, value)
        if missing:
            self._notices.notice(
                f"NBRewind warning: {', '.join(missing)} of a replayed cell could not be stored, so this cell does "
                "not find it in the output history; run that cell (edit it, or use the audit kernel) to have it"
            )

    def _value(self, spec: dict[str, Any], before_rebound: Entry | None | object) -> Any:
        """The result's value; `before_rebound` is the name's entry just before a cell bound
        it anew (the shown object as it was left), or `_SAME` while the name still holds it."""
        if "unstored" in spec:
            raise LookupError(spec["unstored"])
        ns = self._shell.user_ns
        name = spec.get("name")
        if name is not None:
            if before_rebound is _SAME and name in ns:
                return ns[name]  # still the object it showed (loaded now if pending)
            left = before_rebound if isinstance(before_rebound, Entry) else None
            if left is not None and left.kind != VALUE or left is None and spec.get("kind") != str(VALUE):
                raise LookupError(f"{name} was bound anew and the value it showed cannot be stored")
            with restoring_into(ns):
                return load_group(self._state.objects, left.digest if left is not None else spec["digest"])[name]
        with restoring_into(ns):
            return load_group(self._state.objects, spec["digest"])["value"]
