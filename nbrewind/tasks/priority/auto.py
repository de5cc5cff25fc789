"""Automatic bumps: whatever an enabled client blocks on is prioritized first."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from nbrewind.tasks.priority.client import _walk, install, prioritize

if TYPE_CHECKING:
    from distributed import Client, Future

logger = logging.getLogger(__name__)

_auto_lock = threading.Lock()
_auto_clients: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_auto_patches: contextlib.ExitStack | None = None


def _bump_waited(client: Any, futures: Iterable[Any]) -> None:
    """Bump the pending ones of ``futures`` if auto-priority is on for ``client``.

    Called on every ``Future.result`` / ``Client.gather`` while patched, so it
    costs nothing unless something is pending, and a failure only logs: the
    caller still gets its result, just without the bump.
    """
    if client not in _auto_clients or getattr(client, "asynchronous", False):
        return
    pending = [f for f in futures if f.client is client and not f.done()]
    if not pending:
        return
    try:
        prioritize(pending, client)
    except Exception:  # noqa: BLE001 - a failed bump must not fail the user's request
        logger.warning("nbrewind: could not raise the priority of %d futures", len(pending), exc_info=True)


def _patch(stack: contextlib.ExitStack, owner: type, name: str, replacement: Any) -> None:
    """Set ``owner.name`` to ``replacement``; the stack restores the original exactly."""
    if name in vars(owner):
        stack.callback(setattr, owner, name, vars(owner)[name])
    else:
        stack.callback(delattr, owner, name)
    setattr(owner, name, replacement)


def _install_patches() -> contextlib.ExitStack:
    from distributed import Client, Future

    original_result = Future.result
    original_gather = Client.gather

    def result(self: Future, *args: Any, **kwargs: Any) -> Any:
        _bump_waited(self.client, [self])
        return original_result(self, *args, **kwargs)

    def gather(self: Client, futures: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("asynchronous"):
            _bump_waited(self, [f for f in _walk(futures) if isinstance(f, Future)])
        return original_gather(self, futures, *args, **kwargs)

    result.__doc__ = original_result.__doc__
    gather.__doc__ = original_gather.__doc__
    stack = contextlib.ExitStack()
    _patch(stack, Future, "result", result)
    _patch(stack, Client, "gather", gather)
    return stack


@contextlib.contextmanager
def enable_auto_priority(client: Client) -> Iterator[Client]:
    """Bump whatever ``client`` blocks on, for the duration of the ``with`` block.

    Inside it, ``Future.result()`` on a pending future of ``client`` and
    ``Client.gather`` of pending futures (which is how ``collection.compute()``
    waits, so computing a slice of a persisted collection bumps the persisted
    chunks it needs) call :func:`prioritize` first. The patches are on
    distributed's ``Future.result`` and ``Client.gather``; they are shared by all
    enabled clients, act only for those, and are removed when the last one exits.
    """
    install(client)
    global _auto_patches
    with _auto_lock:
        if _auto_patches is None:
            _auto_patches = _install_patches()
        _auto_clients[client] = _auto_clients.get(client, 0) + 1
    try:
        yield client
    finally:
        with _auto_lock:
            remaining = _auto_clients.get(client, 1) - 1
            if remaining:
                _auto_clients[client] = remaining
            else:
                _auto_clients.pop(client, None)
            if not _auto_clients and _auto_patches is not None:
                _auto_patches.close()
                _auto_patches = None
