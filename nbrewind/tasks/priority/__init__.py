"""Raise the priority of the Dask work a user is waiting for.

A notebook user who asks for one piece of a large pending computation
(``fut.result()``, ``x[150].compute()`` on a persisted array) would otherwise
wait for everything submitted before it. :func:`prioritize` moves the requested
keys, and every unfinished task they transitively wait on, ahead of all other
work: on the scheduler (released, waiting, queued, no-worker and processing
tasks, re-sorting the queue) and on the workers that already hold some of them
(re-sorting their ready, constrained and fetch heaps). When the bumped work is a
chain (a chunk, the task that slices it, dask's ``finalize``), a worker keeps the
thread a link frees for the next link, which the scheduler sends a round trip later,
for at most :data:`HOLD_TIMEOUT` seconds (see ``worker_side``).
:func:`enable_auto_priority` does the same whenever a client blocks on pending
futures.

How a bump orders: distributed compares ``TaskState.priority`` tuples, lower
first. A bumped task gets ``(-inf, -n, *original)`` where ``n`` counts bumps on
that scheduler, so it sorts before every unbumped task, a later bump sorts
before an earlier one, and tasks within one bump keep their original relative
order (dependencies before dependents, as ``dask.order`` decided).

The scheduler and worker sides are distributed plugins, registered through
``Client.register_plugin``; they add one scheduler RPC handler and one worker
stream handler. Their classes subclass distributed's plugin bases, so they are
built on first use (see :func:`__getattr__`) to keep importing this module free
of any dask import.

The package: ``protocol`` (what the halves share: names, operations, timings and
how a bump orders), ``scheduler_side`` and ``worker_side`` (the two halves' logic),
``plugins`` (the plugin classes built from them, where pickle finds them),
``client`` (:func:`prioritize` and the keys it targets), ``auto`` (bumps whenever a
client waits), ``switch`` (the config key that turns automatic bumps off).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbrewind.tasks.priority.auto import auto_priority_for_new_clients, bump_waited, enable_auto_priority
    from nbrewind.tasks.priority.client import install, prioritize
    from nbrewind.tasks.priority.protocol import (
        ARRIVAL_WAIT,
        HOLD_TIMEOUT,
        PENDING_TTL,
        PLUGIN_NAME,
        SCHEDULER_OP,
        WORKER_OP,
        bump_head,
        reheap,
        strip_bump,
    )
    from nbrewind.tasks.priority.switch import CONFIG_KEY, auto_priority_enabled, set_auto_priority

# Looked up on first use: a worker unpickling the plugins (``plugins``) needs only
# ``protocol`` and ``worker_side``, not the client half and its imports.
_WHERE = {
    **dict.fromkeys(("auto_priority_for_new_clients", "bump_waited", "enable_auto_priority"), "auto"),
    **dict.fromkeys(("install", "prioritize"), "client"),
    **dict.fromkeys(
        ("ARRIVAL_WAIT", "HOLD_TIMEOUT", "PENDING_TTL", "PLUGIN_NAME", "SCHEDULER_OP", "WORKER_OP", "bump_head", "reheap", "strip_bump"),
        "protocol",
    ),
    **dict.fromkeys(("CONFIG_KEY", "auto_priority_enabled", "set_auto_priority"), "switch"),
}

__all__ = [
    "ARRIVAL_WAIT",
    "CONFIG_KEY",
    "HOLD_TIMEOUT",
    "PENDING_TTL",
    "PLUGIN_NAME",
    "SCHEDULER_OP",
    "WORKER_OP",
    "auto_priority_enabled",
    "auto_priority_for_new_clients",
    "bump_head",
    "bump_waited",
    "enable_auto_priority",
    "install",
    "prioritize",
    "reheap",
    "set_auto_priority",
    "strip_bump",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
