"""Route every Dask graph through the task cache before it reaches a scheduler.

:func:`intercepting` installs, for the duration of a ``with`` block:

- ``distributed.Client._graph_to_futures``: the one step every client
  submission goes through (``submit``, ``map``, ``compute``, ``persist``,
  ``get``, and ``dask.compute`` / ``.compute()`` / ``.persist()`` with a default
  client, which call ``Client.get`` / ``Client.persist``). The graph is
  materialized on the client, rewritten, and sent as a graph expression that
  carries the original per-key annotations (retries, priority, resources,
  workers...).
- ``dask.base.get_scheduler``: the local schedulers (threads, processes, sync,
  or any callable) it returns are wrapped so the graph they get is rewritten. A
  client's ``get`` is returned unwrapped (it is intercepted above). Creating a
  ``Client`` resets dask's ``scheduler`` setting; that does not matter here
  because ``get_scheduler`` itself is wrapped.
- ``Client.submit`` / ``Client.map`` with ``pure=False`` and
  ``dask.delayed`` calls made with ``pure=False`` mark their tasks impure.

Modules not imported yet are patched when they are first imported (a
post-import hook on ``sys.meta_path``), so entering the context costs nothing
and imports no dask. Every patch restores the original attribute exactly when
the last active context exits; contexts nest (the innermost cache is used).
Any failure while rewriting is logged and the original graph runs unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from nbrewind.identity.imports import after_import
from nbrewind.tasks.cache import TaskCache
from nbrewind.tasks.remote import StoreLink
from nbrewind.tasks.rewrite import Rewritten, flatten_keys, rewrite_graph

__all__ = ["current_cache", "intercepting"]

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_active: list[TaskCache] = []
_patches: contextlib.ExitStack | None = None
_local = threading.local()


def current_cache() -> TaskCache | None:
    """The cache of the innermost active :func:`intercepting` context, if any."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def intercepting(cache: TaskCache) -> Iterator[TaskCache]:
    """Cache every Dask task computed inside the block in ``cache``; restore everything after."""
    global _patches
    with _lock:
        if _patches is None:
            _patches = _install()
        _active.append(cache)
    try:
        yield cache
    finally:
        with _lock:
            for i in range(len(_active) - 1, -1, -1):
                if _active[i] is cache:
                    del _active[i]
                    break
            if not _active and _patches is not None:
                stack, _patches = _patches, None
                stack.close()
            still_active = any(c is cache for c in _active)
        if not still_active:
            _close(cache)


def _close(cache: TaskCache) -> None:
    try:
        cache.close()
    except Exception:  # leaving must not fail: results not written yet are just not cached
        logger.warning("NBRewind: could not write the last task results workers sent", exc_info=True)


# -- installing patches ---------------------------------------------------------------------------


def _set(stack: contextlib.ExitStack, owner: Any, name: str, replacement: Any) -> None:
    """Set ``owner.name``; the stack restores exactly what was there (or removes it)."""
    namespace = vars(owner)
    if name in namespace:
        stack.callback(setattr, owner, name, namespace[name])
    else:
        stack.callback(delattr, owner, name)
    setattr(owner, name, replacement)


_TARGETS: dict[str, Callable[[contextlib.ExitStack, ModuleType], None]] = {}


def _install() -> contextlib.ExitStack:
    """Patch every target module now if it is loaded, else right after its first import."""
    stack = contextlib.ExitStack()
    done: set[str] = set()

    def patch(name: str, module: ModuleType) -> None:
        with _lock:
            if name in done:
                return
            done.add(name)
            try:
                _TARGETS[name](stack, module)
            except Exception:  # a changed dask layout must not break the import
                logger.warning("NBRewind: could not intercept %s; its tasks are not cached", name, exc_info=True)

    for name in _TARGETS:
        hook = after_import(name, functools.partial(patch, name))
        if hook is not None:
            stack.callback(hook.remove)
    return stack


# -- distributed ----------------------------------------------------------------------------------


def _patch_client(stack: contextlib.ExitStack, module: ModuleType) -> None:
    client_cls = module.Client
    original = client_cls._graph_to_futures
    original_submit = client_cls.submit
    original_map = client_cls.map

    def _graph_to_futures(self: Any, expr: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
        cache = current_cache()
        if cache is not None and not kwargs.get("actors"):
            expr = _rewrite_expr(cache, expr, keys, cache.link_for(self))
        return original(self, expr, keys, *args, **kwargs)

    def submit(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        with _impure_if(kwargs.get("pure", True) is False):
            return original_submit(self, func, *args, **kwargs)

    def map(self: Any, func: Any, *iterables: Any, **kwargs: Any) -> Any:  # noqa: A001 - Client.map
        with _impure_if(kwargs.get("pure", True) is False):
            return original_map(self, func, *iterables, **kwargs)

    pairs: list[tuple[Any, Any]] = [(_graph_to_futures, original), (submit, original_submit), (map, original_map)]
    for fn, orig in pairs:
        fn.__doc__ = orig.__doc__
        fn.__wrapped__ = orig
        _set(stack, client_cls, orig.__name__, fn)


@contextlib.contextmanager
def _impure_if(flag: bool) -> Iterator[None]:
    if not flag:
        yield
        return
    before = getattr(_local, "impure", False)
    _local.impure = True
    try:
        yield
    finally:
        _local.impure = before


def _rewrite_expr(cache: TaskCache, expr: Any, keys: Any, link: StoreLink | None = None) -> Any:
    """The graph expression to send instead of ``expr`` (``expr`` itself if nothing changes)."""
    try:
        dsk = expr.__dask_graph__()
        annotations = expr.__dask_annotations__()
        wanted = flatten_keys(list(keys))
        done = rewrite_graph(cache, dsk, wanted, all_impure=getattr(_local, "impure", False), link=link)
        if not done.changed:
            return expr
        return _as_expr(done, wanted, annotations)
    except Exception:  # never fail the user's computation because of the cache
        logger.warning("NBRewind: could not rewrite a Dask graph; it runs uncached", exc_info=True)
        return expr


def _as_expr(done: Rewritten, keys: list[Any], annotations: dict[str, dict[Any, Any]]) -> Any:
    """A graph expression holding the rewritten graph and the original per-key annotations."""
    import uuid

    from dask._expr import HLGExpr, LLGExpr
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    dsk = done.dsk
    annotations = {t: v for t, v in annotations.items() if v}
    if not annotations:
        return LLGExpr(dsk, _determ_token=uuid.uuid4().hex)
    groups: dict[tuple[str, ...], dict[Any, Any]] = {}
    for k, node in dsk.items():
        kinds = tuple(t for t, per_key in annotations.items() if k in per_key)
        groups.setdefault(kinds, {})[k] = node
    layers = {}
    for i, (kinds, part) in enumerate(groups.items()):
        layer_annotations = {t: annotations[t].get for t in kinds} or None
        layers[f"nbrewind-{i}"] = MaterializedLayer(part, annotations=layer_annotations)
    hlg = HighLevelGraph(layers, {name: set() for name in layers})
    return HLGExpr(hlg, output_keys=keys, _determ_token=uuid.uuid4().hex)


# -- local schedulers -----------------------------------------------------------------------------


class _CachingScheduler:
    """A local scheduler ``get`` whose graphs are rewritten first; compares equal to it."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        cache = current_cache()
        if cache is not None:
            try:
                graph = dsk.__dask_graph__() if hasattr(dsk, "__dask_graph__") else dict(dsk)
                done = rewrite_graph(cache, graph, flatten_keys(keys))
                if done.changed:
                    dsk = done.dsk
            except Exception:  # never fail the user's computation because of the cache
                logger.warning("NBRewind: could not rewrite a Dask graph; it runs uncached", exc_info=True)
        return self.inner(dsk, keys, **kwargs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _CachingScheduler):
            other = other.inner
        return bool(self.inner == other)

    def __hash__(self) -> int:
        return hash(self.inner)

    def __repr__(self) -> str:
        return f"<nbrewind caching {self.inner!r}>"


def _is_client_get(scheduler: Any) -> bool:
    owner = getattr(scheduler, "__self__", None)
    client_module = sys.modules.get("distributed.client")
    return owner is not None and client_module is not None and isinstance(owner, client_module.Client)


def _patch_get_scheduler(stack: contextlib.ExitStack, module: ModuleType) -> None:
    original = module.get_scheduler

    def get_scheduler(*args: Any, **kwargs: Any) -> Any:
        scheduler = original(*args, **kwargs)
        if scheduler is None or _is_client_get(scheduler) or isinstance(scheduler, _CachingScheduler):
            return scheduler
        return _CachingScheduler(scheduler)

    get_scheduler.__doc__ = original.__doc__
    get_scheduler.__wrapped__ = original  # type: ignore[attr-defined]
    _set(stack, module, "get_scheduler", get_scheduler)


def _patch_delayed(stack: contextlib.ExitStack, module: ModuleType) -> None:
    original = module.tokenize

    def tokenize(*args: Any, pure: bool | None = None, **kwargs: Any) -> str:
        token: str = original(*args, pure=pure, **kwargs)
        cache = current_cache()
        if pure is False and cache is not None:
            cache.impure_tokens.add(token)
        return token

    tokenize.__doc__ = original.__doc__
    tokenize.__wrapped__ = original  # type: ignore[attr-defined]
    _set(stack, module, "tokenize", tokenize)


_TARGETS.update({
    "distributed.client": _patch_client,
    "dask.base": _patch_get_scheduler,
    "dask.delayed": _patch_delayed,
})
