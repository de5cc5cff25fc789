"""Whether a cell that runs may need the Dask client replayed cells left pending.

A client that replayed cells made is brought back (its cluster started) before a cell
that may use it runs: with it, `.compute()` goes to the cluster as in a fresh run, and
`get_client()` finds it. Starting a cluster costs seconds, so a cell that provably
cannot reach Dask (it reads only plain values, notebook functions and modules of the
standard library or of libraries that never call Dask) runs without it. The proof is
conservative: anything it cannot see through (exec, a notebook class's instance, a
module of another library, a local module) counts as a possible use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.session.plain import plain_module, plain_type, plain_value
from nbrewind.session.plan import CellPlan
from nbrewind.session.state import MODULE, PLAIN, UNSERIALIZABLE, VALUE, Entry

__all__ = ["may_need_client"]


def _plain_entry(entry: Entry) -> bool:
    if entry.kind == MODULE:
        return not entry.extra.get("local") and plain_module(str(entry.extra.get("module", "")))
    if entry.kind in (VALUE, UNSERIALIZABLE):
        kind = str(entry.extra.get("type", ""))
        return bool(entry.extra.get(PLAIN)) or (bool(kind) and plain_type(kind))
    return True


def may_need_client(plan: CellPlan, entries: Mapping[str, Entry], namespace: dict[str, Any]) -> bool:
    """False only when the cell provably cannot reach Dask (see the module docstring)."""
    effects = plan.effects
    if effects is None or effects.dynamic or effects.syntax_error:
        return True
    if any(not plain_module(module) for module in effects.imports):
        return True
    for name in plan.reads:
        if dict.__contains__(namespace, name):
            if not plain_value(dict.__getitem__(namespace, name)):
                return True
        elif isinstance(namespace, LazyNamespace) and namespace.is_pending(name):
            entry = entries.get(name)
            if entry is None or not _plain_entry(entry):
                return True
    return False
