"""What the client, the scheduler half and the worker half of a priority bump agree on.

The plugin's name and the two operations it adds, the scheduler states a bump
looks at, the timing bounds, and how a bump orders: the priority prefix it gives
(:func:`bump_head`), recognizes (:func:`is_bumped`) and takes off again
(:func:`strip_bump`), and how a changed priority is made to take effect in a heap
(:func:`reheap`). Both halves also switch their transition hook on and off the
same way (:func:`follow_transitions`).

It is its own module so that ``scheduler_side`` and ``worker_side`` share these
without importing each other, and so that the client side and the package's
public names can read them without loading either half. Nothing here imports dask.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACTIVE_STATES",
    "ARRIVAL_WAIT",
    "BUMPABLE_STATES",
    "HOLD_TIMEOUT",
    "PENDING_TTL",
    "PLUGIN_NAME",
    "SCHEDULER_OP",
    "WORKER_OP",
    "Priority",
    "bump_head",
    "follow_transitions",
    "is_bumped",
    "reheap",
    "strip_bump",
]

PLUGIN_NAME = "nbrewind-priority"
#: RPC operation the scheduler plugin adds to ``Scheduler.handlers``.
SCHEDULER_OP = "nbrewind_prioritize"
#: Stream operation the worker plugin adds to ``Worker.stream_handlers``.
WORKER_OP = "nbrewind-prioritize"
#: Scheduler states in which a task still has work ahead of it.
BUMPABLE_STATES = frozenset({"released", "waiting", "queued", "no-worker", "processing"})
#: Scheduler states of tasks that will run without anything else being asked for.
ACTIVE_STATES = ("waiting", "queued", "no-worker", "processing")
#: Seconds a key the scheduler does not know yet stays marked for a bump.
PENDING_TTL = 60.0
#: Seconds a request waits for unknown keys to arrive before replying.
ARRIVAL_WAIT = 2.0
#: Seconds a worker keeps the thread of a finished link of a bumped chain free for the
#: next link, at most (it arrives a scheduler round trip later; see ``worker_side``).
HOLD_TIMEOUT = 0.02

_MARK = float("-inf")

Priority = tuple[float, ...]


def bump_head(sequence: int) -> Priority:
    """Return the prefix that bump number ``sequence`` puts before a priority.

    Any prefixed priority sorts before every unbumped one, and a larger
    ``sequence`` sorts before a smaller one.
    """
    return (_MARK, -float(sequence))


def strip_bump(priority: Priority) -> Priority:
    """Return ``priority`` without the prefix an earlier bump gave it."""
    if priority and priority[0] == _MARK:
        return tuple(priority[2:])
    return tuple(priority)


def is_bumped(priority: Any) -> bool:
    """Whether ``priority`` (a task's, or None) carries a bump's prefix."""
    return bool(priority) and priority[0] == _MARK


def reheap(heap: Any) -> None:
    """Rebuild a distributed ``HeapSet`` after its members' priorities changed.

    A HeapSet computes each member's sort key when the member is added and
    never again, so changed priorities take effect only after re-adding every
    member. Members are re-added in their old order so that ties stay as they were.
    """
    if not heap:
        return
    members = list(heap.sorted())
    heap.clear()
    for member in members:
        heap.add(member)


def follow_transitions(plugin: Any, method: str, on: bool) -> None:
    """Make ``plugin``'s method ``method`` its ``transition`` hook while ``on``, and drop it otherwise.

    distributed calls every plugin's ``transition`` on every transition. The hook is
    an instance attribute, set only while the plugin has something to follow; without
    it the base class's empty one is called, so the plugin costs exactly what any
    plugin costs. Setting it when it is already set does nothing.
    """
    if on:
        if "transition" not in plugin.__dict__:
            plugin.__dict__["transition"] = getattr(plugin, method)
    else:
        plugin.__dict__.pop("transition", None)
