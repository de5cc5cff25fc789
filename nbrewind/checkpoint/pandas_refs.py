"""pandas copy-on-write links between restored frames and series that share memory.

With copy-on-write (always on since pandas 3.0), ``s = df["x"]`` gives a series whose
block is a view of the frame's block, and both blocks hold the same
``BlockValuesRefs``: a write through either one sees the other and copies first, so
``s.iloc[0] = 9`` leaves ``df`` as it was. Those references are not part of a pickle.
A checkpoint keeps the shared memory (the views are rebuilt on one root, see
:mod:`nbrewind.checkpoint.reducers`) but each unpickled block starts with references of
its own, so after a restore the same write went through to ``df``.

The storing pickler reduces each block manager to :func:`load_manager` over pandas' own
reduction (values, placements and axes unchanged) plus one token per block for the
references object it holds; while one pickle loads (:func:`linking`), blocks that held the
same references live share them again. Only references are restored, exactly as they were:
frames made with ``copy=False`` over one numpy array share its memory but not references,
and still write through to each other. Digests keep pandas' own reduction, so cell keys
do not change.

pandas is never imported here: only values the notebook made can be pandas objects.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["RefsToken", "linking", "load_manager", "manager_reducers"]

_loading = threading.local()


class RefsToken:
    """Stands, inside one pickle, for one live ``BlockValuesRefs``: pickled once and
    referenced by every block that held it, so the blocks share references again."""

    __slots__ = ()


def manager_reducers() -> dict[type, Callable[[Any], Any]]:
    """Reductions for pandas' block managers by exact type, for one pickle (one token per
    live references object); empty while pandas is not loaded."""
    managers = sys.modules.get("pandas.core.internals.managers")
    if managers is None:
        return {}
    tokens: dict[int, tuple[object, RefsToken]] = {}

    def token(refs: object) -> RefsToken:
        held = tokens.get(id(refs))
        if held is None:
            held = tokens[id(refs)] = (refs, RefsToken())  # the refs kept alive: their id stays theirs
        return held[1]

    def reduce(manager: Any) -> Any:
        try:
            shared = tuple(token(block.refs) for block in manager.blocks)
        except AttributeError:  # a pandas without per-block references
            return manager.__reduce_ex__(5)
        return load_manager, (manager.__reduce_ex__(5), shared)

    kinds = (getattr(managers, "BlockManager", None), getattr(managers, "SingleBlockManager", None))
    return {kind: reduce for kind in kinds if isinstance(kind, type)}


def load_manager(reduced: tuple[Any, ...], shared: tuple[RefsToken, ...] = ()) -> Any:
    """Rebuild a block manager from pandas' own reduction, as pickle would; inside
    :func:`linking`, each block joins the references of the blocks loaded before it in the
    same pickle that held the same references live (`shared`, one token per block)."""
    make, args, *rest = reduced
    manager = make(*args)
    state = rest[0] if rest else None
    if state is not None:
        setstate = getattr(manager, "__setstate__", None)
        if setstate is None:
            raise TypeError(f"cannot restore the state of a {type(manager).__name__}")
        setstate(state)
    _link(manager, shared)
    return manager


@contextlib.contextmanager
def linking() -> Iterator[None]:
    """Within the block, managers loaded by :func:`load_manager` on this thread share
    references by token (one registry per pickle)."""
    before = getattr(_loading, "tokens", None)
    _loading.tokens = {}
    try:
        yield
    finally:
        _loading.tokens = before


def _link(manager: Any, shared: tuple[RefsToken, ...]) -> None:
    seen: dict[int, tuple[RefsToken, Any]] | None = getattr(_loading, "tokens", None)
    if seen is None or not shared:
        return
    blocks = manager.blocks
    if len(blocks) != len(shared):
        return  # pandas rebuilt the blocks differently: leave them as they are
    for block, token in zip(blocks, shared, strict=True):
        first = seen.get(id(token))
        if first is None:
            seen[id(token)] = (token, block)
            continue
        refs = first[1].refs
        if block.refs is not refs:
            block.refs = refs
            refs.add_reference(block)
