"""Asking the scheduler for a bump: :func:`prioritize` and the keys it targets."""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from nbrewind.tasks.priority.plugins import plugin_class

if TYPE_CHECKING:
    from distributed import Client

_installed: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def install(client: Client) -> None:
    """Register the scheduler and worker plugins on ``client``'s cluster, once.

    Registration is idempotent on the scheduler, so several clients share one
    plugin (and one bump counter); new workers receive the worker plugin too.
    """
    address = str(_scheduler_rpc(client).address)
    if _installed.get(client) == address:
        return
    client.register_plugin(plugin_class("PrioritySchedulerPlugin")())
    client.register_plugin(plugin_class("PriorityWorkerPlugin")())
    _installed[client] = address


async def install_async(client: Client) -> None:
    """:func:`install` for an asynchronous client, awaited on its event loop."""
    if client.scheduler is None:
        raise ValueError("the client is not connected to a scheduler")
    address = str(client.scheduler.address)
    if _installed.get(client) == address:
        return
    await client.register_plugin(plugin_class("PrioritySchedulerPlugin")())
    await client.register_plugin(plugin_class("PriorityWorkerPlugin")())
    _installed[client] = address


def is_installed(client: Client) -> bool:
    """Whether :func:`install` already ran for ``client``'s current scheduler."""
    scheduler = client.scheduler
    return scheduler is not None and _installed.get(client) == str(scheduler.address)


def prioritize(obj: Any, client: Client | None = None) -> int:
    """Run ``obj`` and everything it waits on before all other pending work.

    ``obj`` is a Future, a Dask collection (persisted, or built on persisted
    pieces, e.g. a slice), or a list, tuple, set or dict of those. For a
    collection the bump targets the futures its graph reaches from its output
    keys, so a slice of a persisted array bumps only the chunks it needs.
    A later call wins over an earlier one. Returns once the bump is in effect,
    with the number of tasks whose priority was raised. Keys still on their
    way to the scheduler are waited for up to :data:`ARRIVAL_WAIT` seconds;
    any that have not arrived by then count once each and are raised when
    their graph arrives.
    """
    client = _resolve_client(obj, client)
    keys = _target_keys(obj, client)
    if not keys:
        return 0
    install(client)
    reply = client.sync(_scheduler_rpc(client).nbrewind_prioritize, keys=list(keys))
    return int(reply["bumped"]) + int(reply["deferred"])


def _scheduler_rpc(client: Client) -> Any:
    if client.asynchronous:
        raise TypeError("nbrewind priority bumps need a synchronous Client")
    if client.scheduler is None:
        raise ValueError("the client is not connected to a scheduler")
    return client.scheduler


def _resolve_client(obj: Any, client: Client | None) -> Client:
    if client is not None:
        return client
    from distributed import Future
    from distributed.client import default_client

    for item in _walk(obj):
        if isinstance(item, Future):
            found: Client = item.client
            return found
    current: Client = default_client()
    return current


def _walk(obj: Any) -> Iterator[Any]:
    """Yield the leaves of nested lists, tuples, sets and dict values."""
    if isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            yield from _walk(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _walk(item)
    else:
        yield obj


def _target_keys(obj: Any, client: Client) -> set[Hashable]:
    """The keys of ``obj`` that are (or sit behind) futures of ``client``."""
    from dask.base import is_dask_collection
    from distributed import Future

    keys: set[Hashable] = set()
    for item in _walk(obj):
        if isinstance(item, Future):
            keys.add(item.key)
        elif is_dask_collection(item):
            keys |= _collection_future_keys(item, client)
        else:
            raise TypeError(f"cannot prioritize {type(item).__name__}: expected futures or Dask collections")
    return keys


def _collection_future_keys(collection: Any, client: Client) -> set[Hashable]:
    """Walk a collection's graph from its outputs down to the first futures on each path."""
    from dask.core import flatten, get_dependencies
    from dask.utils import ensure_dict
    from distributed import Future

    graph = ensure_dict(collection.__dask_graph__())
    found: set[Hashable] = set()
    seen: set[Hashable] = set()
    stack = list(flatten(collection.__dask_keys__()))
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        value = graph.get(key)
        if isinstance(value, Future):
            found.add(value.key)
        elif key in client.futures:
            found.add(key)
        elif value is not None:
            stack.extend(get_dependencies(graph, key))
    return found
