"""Rewrite a Dask graph so cached tasks are loaded and the others store their results.

Given a materialized graph and the keys wanted, :func:`rewrite_graph`

1. fingerprints every task the wanted keys depend on, with the library settings
   of this moment (:func:`~nbrewind.tasks.settings.task_settings`, read once per
   graph) folded into each (keys that cannot be fingerprinted, impure tasks,
   tasks drawing from a global RNG and everything downstream of one stay as they
   are; so does the whole graph when a setting cannot be read);
2. walks down from the wanted keys: a task whose fingerprint has a cached entry
   becomes a load task (no dependencies: what fed it is culled unless another
   task still needs it); any other cacheable task is wrapped to store its result
   where it runs (and to see its fingerprint while it runs, for
   ``nbrewind.checkpoint``/``resume``: see ``resume.py``), except that of
   several tasks with one fingerprint only the first stores (the others only
   run): one result object and one ref per fingerprint; the walk continues
   below uncached tasks only;
3. queues one task-log row per load or wrapped task on the :class:`TaskCache`,
   with the local files its fingerprint covers (a wrapped task also stores them
   with its result, so a later hit can report them).

Keys are kept, so futures, per-key annotations and output keys are unaffected.
Dask is imported lazily.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbrewind.identity.interpreter import collector_paused
from nbrewind.tasks.cache import TaskCache, is_impure, load_result
from nbrewind.tasks.effects import mutated_parameters, side_effect
from nbrewind.tasks.reads import changed_reads
from nbrewind.tasks.remote import StoreLink
from nbrewind.tasks.resume import run_resumable
from nbrewind.tasks.settings import task_settings

__all__ = ["FALLBACK_LIMIT", "Rewritten", "flatten_keys", "rewrite_graph"]

Key = Hashable

#: A load task carries the original task and the upstream work it culled, so a
#: damaged entry can be recomputed on the spot, when that is at most this many tasks.
FALLBACK_LIMIT = 256


@dataclass
class Rewritten:
    """The rewritten graph and what the rewrite decided."""

    dsk: dict[Key, Any]
    hits: int = 0
    misses: int = 0
    uncached: int = 0
    culled: int = 0
    fingerprints: dict[Key, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether any task was replaced (if not, the original graph can be sent as it was)."""
        return bool(self.hits or self.misses)


def flatten_keys(keys: Any) -> list[Key]:
    """The keys of a (possibly nested) list of keys, or of a single key."""
    if not isinstance(keys, list):
        return [keys]
    out: list[Key] = []
    stack = [iter(keys)]
    while stack:
        for k in stack[-1]:
            if isinstance(k, list):
                stack.append(iter(k))
                break
            out.append(k)
        else:
            stack.pop()
    return out


def _key_token(key: Key) -> str | None:
    if isinstance(key, tuple) and key:
        key = key[0]
    if isinstance(key, str):
        return key[-36:]  # dask.delayed names impure calls "<name>-<uuid4>"
    return None


def _node_impure(node: Any, ts: Any, funcs: dict[int, bool], inners: dict[int, bool]) -> bool:
    """Whether ``node`` calls an impure function (memos for one graph, which holds every
    object they key on: ``funcs`` by function id, ``inners`` by a fused task's inner graph,
    which blockwise fusion shares between all the chunks' tasks)."""
    if not isinstance(node, ts.Task):
        return False
    func = node.func
    marked = funcs.get(id(func))
    if marked is None:
        marked = funcs[id(func)] = is_impure(func) or side_effect(func) is not None
    if marked:
        return True
    args = node.args
    changed = mutated_parameters(func)
    if changed and _changes_held_object(func, changed, node, ts):
        return True
    for a in itertools.chain(args, node.kwargs.values()):
        if isinstance(a, (types.FunctionType, functools.partial)):  # map_blocks(f), bag.map(f)
            passed = funcs.get(id(a))
            if passed is None:
                passed = funcs[id(a)] = is_impure(a) or side_effect(a) is not None
            if passed:
                return True
    if func is ts._execute_subgraph and args and isinstance(args[0], dict):
        inner = args[0]
        found = inners.get(id(inner))
        if found is None:
            found = inners[id(inner)] = any(_node_impure(n, ts, funcs, inners) for n in inner.values())
        return found
    Task = ts.Task
    return any(
        _node_impure(a, ts, funcs, inners) for a in itertools.chain(args, node.kwargs.values()) if isinstance(a, Task)
    )


def _changes_held_object(func: Any, changed: frozenset[str], node: Any, ts: Any) -> bool:
    """Whether a parameter ``func`` changes in place gets an object the graph holds (the
    notebook's ``acc``), not another task's result: a hit would leave it unchanged."""
    code = func.__code__
    names = code.co_varnames[: code.co_argcount]
    given = {**dict(zip(names, node.args)), **node.kwargs}
    return any(p in given and not isinstance(given[p], (ts.GraphNode, ts.TaskRef)) for p in changed)


def _tainted(dsk: Mapping[Key, Any], cache: TaskCache, all_impure: bool, ts: Any, also: Iterable[Key] = ()) -> set[Key]:
    """Impure tasks (and the keys ``also``) and every task downstream of one."""
    if all_impure:
        return set(dsk)
    tokens = cache.impure_tokens
    funcs: dict[int, bool] = {}  # the graph holds every function, so no id is reused meanwhile
    inners: dict[int, bool] = {}
    also = set(also)
    bad = {k for k, node in dsk.items()
           if k in also or _node_impure(node, ts, funcs, inners) or (tokens and _key_token(k) in tokens)}
    if not bad:
        return bad
    dependents: dict[Key, list[Key]] = {}
    for k, node in dsk.items():
        for d in node.dependencies:
            dependents.setdefault(d, []).append(k)
    stack = list(bad)
    while stack:
        for k in dependents.get(stack.pop(), ()):
            if k not in bad:
                bad.add(k)
                stack.append(k)
    return bad


def _cacheable(node: Any, ts: Any, coroutines: dict[int, bool]) -> bool:
    # Plain tasks only: literals, aliases and container nodes cost nothing to recompute.
    if type(node) is not ts.Task:
        return False
    func = node.func
    is_coroutine = coroutines.get(id(func))
    if is_coroutine is None:  # costly for a toolz.curry, which builds its signature
        is_coroutine = coroutines[id(func)] = inspect.iscoroutinefunction(func)
    return not is_coroutine


_TASK_SLOTS = ("key", "_dependencies", "func", "args", "kwargs", "_data_producer", "_token", "_is_coro", "_repr")
_wrap_makers: dict[type, Any] = {}


def _wrap_maker(ts: Any) -> Any:
    """A function building ``run_resumable``'s wrapper of a miss's task, as
    ``ts.Task(key, run_resumable, spec, node.func, *node.args, _data_producer=...,
    **node.kwargs)`` would, without the constructor's scan of every argument.

    The wrapper's dependencies are the task's own (the spec and the function are no graph
    nodes), so its slots are set directly, the way a ``Task`` is unpickled. Only if dask's
    ``Task`` has exactly the slots this was written for and a probe built both ways agrees
    slot by slot; otherwise the constructor is used.
    """
    Task = ts.Task
    maker = _wrap_makers.get(Task)
    if maker is not None:
        return maker

    def construct(key: Key, spec: Any, node: Any) -> Any:
        return Task(key, run_resumable, spec, node.func, *node.args,
                    _data_producer=node.data_producer, **node.kwargs)

    new = object.__new__

    def direct(key: Key, spec: Any, node: Any) -> Any:
        t = new(Task)
        t.key = key
        t._dependencies = node._dependencies
        t.func = run_resumable
        t.args = (spec, node.func, *node.args)
        kwargs = node.kwargs
        t.kwargs = dict(kwargs) if kwargs else {}
        t._data_producer = node._data_producer
        t._token = t._is_coro = t._repr = None
        return t

    maker = construct
    try:
        slots = [s for c in Task.__mro__ for s in c.__dict__.get("__slots__", ())]
        if sorted(slots) == sorted(_TASK_SLOTS):
            probe = Task("p", max, ts.TaskRef("a"), ts.DataNode(None, 1), _data_producer=True, k=ts.TaskRef("b"))
            spec = object()
            a, b = construct("w", spec, probe), direct("w", spec, probe)
            if type(a) is type(b) and all(getattr(a, s) == getattr(b, s) for s in _TASK_SLOTS):
                maker = direct
    except Exception:  # any change in dask's Task: the constructor is always right
        maker = construct
    _wrap_makers[Task] = maker
    return maker


def _fallback(dsk: Mapping[Key, Any], key: Key) -> tuple[dict[Key, Any], Key] | None:
    """``key``'s task with everything upstream of it, if small and self-contained."""
    sub: dict[Key, Any] = {}
    stack = [key]
    while stack:
        k = stack.pop()
        if k in sub:
            continue
        node = dsk.get(k)
        if node is None or len(sub) >= FALLBACK_LIMIT:
            return None
        sub[k] = node
        stack.extend(node.dependencies)
    return sub, key


def rewrite_graph(
    cache: TaskCache,
    dsk: Mapping[Key, Any],
    keys: Iterable[Key],
    *,
    all_impure: bool = False,
    link: StoreLink | None = None,
) -> Rewritten:
    """Rewrite ``dsk`` (materialized; legacy tuples allowed) for the wanted ``keys``
    (``link``: for a distributed scheduler, how workers without the store reach it)."""
    with collector_paused():
        return _rewrite(cache, dsk, keys, all_impure, link)


def _rewrite(
    cache: TaskCache, dsk: Mapping[Key, Any], keys: Iterable[Key], all_impure: bool, link: StoreLink | None
) -> Rewritten:
    import dask._task_spec as ts
    from dask.utils import key_split

    graph: dict[Key, Any] = ts.convert_legacy_graph(dict(dsk))
    outputs = list(dict.fromkeys(k for k in keys if k in graph))
    known = cache.known_fingerprints()
    external = {}
    if known:
        for node in graph.values():
            for d in node.dependencies:
                if d not in graph and d in known:
                    external[d] = known[d]
    settings = task_settings()
    if settings is None:
        all_impure = True  # settings we cannot read cannot vouch for a cached result
    with cache.lock:
        fingerprinter = cache.fingerprinter
        fps = fingerprinter.fingerprint_graph(
            graph, outputs, external=external, external_files=cache.known_files(external), settings=settings
        )
        files = fingerprinter.file_inputs
    # Results whose task read files or folders (by paths no fingerprint names) that changed
    # since: those tasks, and everything downstream, run uncached.
    stale = changed_reads(cache.objects, set(fps.values())) if fps else set()
    tainted = _tainted(graph, cache, all_impure, ts, {k for k, fp in fps.items() if fp in stale})
    # Per graph, once each: a fingerprint's lookup, a key name's prefix, a function's
    # coroutine check, and the worker-side spec (shared by equal tasks: it is immutable).
    looked_up: dict[str, str | None] = {}
    prefixes: dict[Any, str] = {}
    coroutines: dict[int, bool] = {}
    specs: dict[tuple[str, str, int, bool], Any] = {}
    claimed: set[str] = set()
    notes: list[tuple[str, str, bool, str | None, Mapping[str, str] | None]] = []
    out = Rewritten({})
    new = out.dsk
    wrap = _wrap_maker(ts)
    Task = ts.Task
    hits = misses = uncached = 0
    stack = list(reversed(outputs))
    while stack:
        k = stack.pop()
        if k in new:
            continue
        node = graph.get(k)
        if node is None:
            continue  # a dependency outside the graph (a persisted future's key)
        fp = fps.get(k)
        if fp is not None and k not in tainted and _cacheable(node, ts, coroutines):
            name = k[0] if type(k) is tuple and k else k
            prefix = prefixes.get(name)
            if prefix is None:
                prefix = prefixes[name] = key_split(k)
            task_files = files.get(k)
            if fp in looked_up:
                entry = looked_up[fp]
            else:
                entry = looked_up[fp] = cache.lookup(fp)
            store = entry is not None or fp not in claimed  # a hit's fallback stores what it recomputes
            spec_key = (fp, prefix, id(task_files), store)
            spec = specs.get(spec_key)
            if spec is None:
                spec = specs[spec_key] = cache.spec(fp, prefix, task_files, store=store, link=link)
            notes.append((fp, prefix, entry is not None, entry, task_files))
            if entry is not None:
                new[k] = Task(k, load_result, spec, entry, _fallback(graph, k))
                hits += 1
                continue
            claimed.add(fp)
            new[k] = wrap(k, spec, node)
            misses += 1
        else:
            new[k] = node
            uncached += isinstance(node, Task)
        stack.extend(node.dependencies)  # those already rewritten or outside are skipped when popped
    out.hits, out.misses, out.uncached = hits, misses, uncached
    cache.note_many(notes)
    out.culled = len(graph) - len(new)
    out.fingerprints = {k: fps[k] for k in outputs if k in fps and k not in tainted}
    cache.remember(out.fingerprints, {k: files[k] for k in out.fingerprints if k in files})
    return out
