"""Automatic bumps: whatever an enabled client waits for is prioritized first.

A client is enabled by :func:`enable_auto_priority` (one client, for a ``with``
block) or by being created inside :func:`auto_priority_for_new_clients` (every
``Client`` made in the block, for its lifetime: what the NBRewind kernels enter).
While either is active, these waits bump the pending futures they wait on:

- ``Future.result()``, and so ``await future`` (``Future.__await__`` calls it);
- ``Client.gather``, and so ``.compute()``, ``dask.compute`` and ``Client.get``,
  which wait with it: computing a slice of a persisted collection bumps the
  chunks it needs;
- ``distributed.wait``: a module function that notebooks import by name, so it
  is caught where every binding of it goes, ``Client.sync(_wait, ...)``;
- ``as_completed`` iteration: when the next step would block, the iterator's
  futures not bumped yet (all of them the first time, later only those added).

Bumps are sent to the scheduler without waiting for the reply, so a wait is never
slower by a round trip. They are skipped when :func:`~.switch.auto_priority_enabled`
is false, inside a Dask task, when the futures waited for are all the futures the
client holds (there is nothing they could overtake), and, on the scheduler, when no
other task is going to run (waiting for a whole computation). A failed bump logs
one warning per client; the wait goes on as if nothing had been asked.

The patches are on distributed's classes, installed when the first context is
entered and restored exactly when the last one exits. If ``distributed`` is not
imported yet they are installed right after it is (a post-import hook), so
entering a context imports nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from nbrewind.identity.imports import AfterImport
from nbrewind.tasks.priority.client import _walk, install, install_async, is_installed
from nbrewind.tasks.priority.switch import auto_priority_enabled

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

_lock = threading.RLock()
#: Active contexts of either kind; the patches exist while it is positive.
_users = 0
_patches: contextlib.ExitStack | None = None
#: Clients enabled by enable_auto_priority, with how many blocks enable them.
_explicit: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
#: Clients created inside an auto_priority_for_new_clients block.
_enrolled: weakref.WeakSet[Any] = weakref.WeakSet()
#: Active auto_priority_for_new_clients blocks, each with the clients it enrolled.
_enrollers: list[weakref.WeakSet[Any]] = []
#: Futures added to an as_completed iterator and not bumped yet.
_unbumped: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_warned: weakref.WeakSet[Any] = weakref.WeakSet()
_warned_without_client = False
#: Bumps and plugin registrations in flight (asyncio keeps only weak references to tasks).
_in_flight: set[Any] = set()
#: A client's plugin registration started on its event loop, shared by its bumps.
_registering: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _enabled_for(client: Any) -> bool:
    return client in _explicit or client in _enrolled


def _warn_once(client: Any, what: str) -> None:
    """Log ``what`` once per client (once in all for failures tied to no client)."""
    global _warned_without_client
    with _lock:
        if client is None:
            if _warned_without_client:
                return
            _warned_without_client = True
        else:
            try:
                if client in _warned:
                    return
                _warned.add(client)
            except TypeError:  # not weak-referenceable: warn every time rather than never
                pass
    logger.warning("NBRewind: %s; waiting without a priority bump", what, exc_info=True)


def _in_task() -> bool:
    from distributed.worker import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def bump_waited(futures: Iterable[Any]) -> int:
    """Bump the pending ones of ``futures`` whose client has automatic bumps on.

    Called by every patched wait; returns how many bump requests it sent (one
    per client at most). Never raises: a failure is one warning per client.
    """
    if not (_explicit or _enrolled):
        return 0
    sent = 0
    try:
        if not auto_priority_enabled():
            return 0
        from distributed import Future

        by_client: dict[Any, set[Any]] = {}
        for future in futures:
            if isinstance(future, Future) and not future.done():
                keys = by_client.get(future.client)
                if keys is None:
                    keys = by_client[future.client] = set()
                keys.add(future.key)
        targets = [(client, keys) for client, keys in by_client.items() if _enabled_for(client)]
        if not targets or _in_task():
            return 0
        for client, keys in targets:
            sent += _send(client, keys)
    except Exception:  # noqa: BLE001 - a failed bump must never fail the wait
        _warn_once(None, "could not raise the priority of the futures waited for")
    return sent


def _send(client: Any, keys: set[Any]) -> int:
    # Every future the client holds is waited for: nothing of its own to overtake.
    if len(keys) >= len(client.futures):
        return 0
    try:
        client.loop.add_callback(_request, client, list(keys))
    except Exception:  # noqa: BLE001
        _warn_once(client, f"could not raise the priority of {len(keys)} futures")
        return 0
    return 1


def _registered(client: Any) -> Awaitable[None]:
    """On ``client``'s event loop: its plugin registration, started once and shared, so
    a bump sent while it is under way goes out after it."""
    task = _registering.get(client)
    if task is None:
        task = asyncio.ensure_future(install_async(client))
        _registering[client] = task
        # Forgotten once done: a failed one is tried again by the next bump.
        task.add_done_callback(lambda _: _registering.pop(client, None))
    return task


async def _ensure_registered(client: Any) -> None:
    if not is_installed(client):
        await _registered(client)


@contextlib.contextmanager
def _in_flight_task() -> Iterator[None]:
    task = asyncio.current_task()
    _in_flight.add(task)
    try:
        yield
    finally:
        _in_flight.discard(task)


async def _register(client: Any) -> None:
    """Register the plugins of a client just created, from its event loop, without
    holding up ``Client()``; log, never raise (a client that closed meanwhile: silently)."""
    with _in_flight_task():
        try:
            await _ensure_registered(client)
        except Exception:  # noqa: BLE001
            if client.status not in ("closing", "closed"):
                _warn_once(client, "could not register the priority plugins on the cluster")


async def _request(client: Any, keys: list[Any]) -> None:
    """Send one automatic bump from the client's event loop; log, never raise."""
    with _in_flight_task():
        try:
            await _ensure_registered(client)
            await client.scheduler.nbrewind_prioritize(keys=keys, auto=True)
        except Exception:  # noqa: BLE001
            _warn_once(client, f"could not raise the priority of {len(keys)} futures")


def registration(client: Client) -> concurrent.futures.Future[None]:
    """The plugin registration of an enabled client, as a future another thread can wait
    for (it starts one if none is under way)."""
    loop = client.loop
    if loop is None:
        raise ValueError("the client has no event loop")
    return asyncio.run_coroutine_threadsafe(_ensure_registered(client), loop.asyncio_loop)  # type: ignore[attr-defined]


# -- patches ----------------------------------------------------------------------


def _patch(stack: contextlib.ExitStack, owner: type, name: str, replacement: Any) -> None:
    """Set ``owner.name`` to ``replacement``; the stack restores the original exactly."""
    if name in vars(owner):
        stack.callback(setattr, owner, name, vars(owner)[name])
    else:
        stack.callback(delattr, owner, name)
    original = getattr(owner, name)
    replacement.__doc__ = getattr(original, "__doc__", None)
    replacement.__wrapped__ = original
    setattr(owner, name, replacement)


def _patch_distributed(stack: contextlib.ExitStack) -> None:
    from distributed import client as client_module

    client_cls, future_cls, as_completed = client_module.Client, client_module.Future, client_module.as_completed
    original_init: Callable[..., None] = client_cls.__init__
    original_result: Callable[..., Any] = future_cls.result
    original_gather: Callable[..., Any] = client_cls.gather
    original_sync: Callable[..., Any] = client_cls.sync
    wait_impl = client_module._wait
    futures_of: Callable[[Any], list[Any]] = client_module.futures_of
    original_update: Callable[..., None] = as_completed.update
    original_next: Callable[[Any], Any] = as_completed.__next__
    original_anext: Callable[[Any], Awaitable[Any]] = as_completed.__anext__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if _enrollers:
            _enroll(self)

    def result(self: Any, *args: Any, **kwargs: Any) -> Any:
        bump_waited((self,))
        return original_result(self, *args, **kwargs)

    def gather(self: Any, futures: Any, *args: Any, **kwargs: Any) -> Any:
        bump_waited(_walk(futures))
        return original_gather(self, futures, *args, **kwargs)

    def sync(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func is wait_impl and args:
            bump_waited(futures_of(args[0]))
        return original_sync(self, func, *args, **kwargs)

    def update(self: Any, futures: Any) -> None:
        futures = list(futures)
        original_update(self, futures)
        with _lock:
            added = _unbumped.setdefault(self, [])
            added.extend(futures)
            # An iterator whose steps never block never pops this list: keep only what it
            # still waits for, so finished futures (and their data) are not held here.
            if len(added) > 2 * len(self.futures) + 16:
                remaining = self.futures
                added[:] = [f for f in added if f in remaining]

    def _bump_next(iterator: Any) -> None:
        if not iterator.queue.empty():
            return
        with _lock:
            added = _unbumped.pop(iterator, None)
        if added:
            remaining = iterator.futures
            bump_waited(f for f in added if f in remaining)

    def __next__(self: Any) -> Any:
        _bump_next(self)
        return original_next(self)

    async def __anext__(self: Any) -> Any:
        _bump_next(self)
        return await original_anext(self)

    _patch(stack, client_cls, "__init__", __init__)
    _patch(stack, future_cls, "result", result)
    _patch(stack, client_cls, "gather", gather)
    _patch(stack, client_cls, "sync", sync)
    _patch(stack, as_completed, "update", update)
    _patch(stack, as_completed, "__next__", __next__)
    _patch(stack, as_completed, "next", __next__)
    _patch(stack, as_completed, "__anext__", __anext__)
    stack.callback(_unbumped.clear)


def _enroll(client: Any) -> None:
    """Turn automatic bumps on for a client just created inside an enrolling block."""
    with _lock:
        if not _enrollers:
            return
        _enrolled.add(client)
        _enrollers[-1].add(client)
    if client.asynchronous or client.status != "running":
        return  # installed from its event loop at its first bump
    try:
        # Registering takes two round trips to the scheduler (and from it to every worker):
        # started on the client's loop, it overlaps the notebook's next steps; a bump waits for it.
        if auto_priority_enabled():
            client.loop.add_callback(_register, client)
    except Exception:  # noqa: BLE001 - Client() must work even if the plugins cannot be registered
        _warn_once(client, "could not register the priority plugins on the cluster")


def _install() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()

    def patch_now() -> None:
        try:
            _patch_distributed(stack)
        except Exception:  # noqa: BLE001 - a changed distributed must not break its import
            logger.warning("NBRewind: automatic priority bumps are off: could not patch distributed", exc_info=True)

    if "distributed.client" in sys.modules:
        patch_now()
        return stack
    hook = AfterImport("distributed", lambda module: patch_now())
    sys.meta_path.insert(0, hook)
    stack.callback(hook.remove)
    return stack


@contextlib.contextmanager
def _patched() -> Iterator[None]:
    global _users, _patches
    with _lock:
        if _patches is None:
            _patches = _install()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if not _users and _patches is not None:
                stack, _patches = _patches, None
                stack.close()


@contextlib.contextmanager
def enable_auto_priority(client: Client) -> Iterator[Client]:
    """Bump whatever ``client`` waits for, for the duration of the ``with`` block.

    Inside it, ``Future.result()`` (and ``await``), ``Client.gather`` (and so
    ``.compute()``), ``distributed.wait`` and ``as_completed`` iteration on
    pending futures of ``client`` bump them first. Blocks nest. When the last
    active block (of this or :func:`auto_priority_for_new_clients`) ends,
    distributed is exactly as before.
    """
    if not client.asynchronous:
        install(client)
    with _patched():
        with _lock:
            _explicit[client] = _explicit.get(client, 0) + 1
        try:
            yield client
        finally:
            with _lock:
                remaining = _explicit.get(client, 1) - 1
                if remaining:
                    _explicit[client] = remaining
                else:
                    _explicit.pop(client, None)


@contextlib.contextmanager
def auto_priority_for_new_clients() -> Iterator[None]:
    """Turn automatic bumps on for every ``Client`` created inside the block, for its lifetime.

    This is what the NBRewind kernels enter for their own lifetime: a notebook's
    ``Client(...)`` (or ``cluster.get_client()``) is enabled as it is created,
    and its priority plugins are registered from its event loop then, without
    holding up ``Client()`` (a bump sent before that finishes waits for it). ``nbrewind.auto-priority: false`` in the dask config
    switches the bumps off (see :mod:`.switch`). Entering imports no dask; on
    exit the clients it enabled are disabled and every patch is undone.
    """
    mine: weakref.WeakSet[Any] = weakref.WeakSet()
    with _patched():
        with _lock:
            _enrollers.append(mine)
        try:
            yield
        finally:
            with _lock:
                _enrollers.remove(mine)
                for client in list(mine):
                    if not any(client in other for other in _enrollers):
                        _enrolled.discard(client)
