"""Tests for nbrewind.tasks.rewrite: the graph rewrite that turns cached tasks into loads.

Real parts only: a real store in ``tmp_path`` behind a real :class:`TaskCache`,
real Dask graphs (legacy tuples, converted by the rewrite as the interception
hands them over), executed on Dask's synchronous scheduler so the task functions
run in this process. Every task function leaves a file in a counts folder
(:class:`counting.Calls`), so a test sees exactly which tasks ran.
"""

from __future__ import annotations

import decimal
import os
import uuid
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")

from counting import Calls  # noqa: E402  (tests/tasks/counting.py)

from nbrewind.identity.files import quietly  # noqa: E402
from nbrewind.store import Store  # noqa: E402
from nbrewind.tasks import rewrite  # noqa: E402
from nbrewind.tasks.cache import TaskCache, TaskCacheError, impure  # noqa: E402
from nbrewind.tasks.rewrite import Rewritten, flatten_keys, rewrite_graph  # noqa: E402

Graph = dict[Hashable, Any]


def tick(folder: str, name: str) -> None:
    # The test's own observation, not the task's effect: unseen, or every task would run.
    with quietly(), open(os.path.join(folder, name + "-" + uuid.uuid4().hex), "w"):
        pass


def load(folder: str, i: int) -> int:
    tick(folder, "load")
    return i


def work(folder: str, x: int) -> int:
    tick(folder, "work")
    return 2 * x + 1


def total(folder: str, xs: list[int]) -> int:
    tick(folder, "total")
    return sum(xs)


@impure
def noisy(folder: str, x: int) -> int:
    tick(folder, "noisy")
    return x + 100


@pytest.fixture
def cache(tmp_path: Path) -> TaskCache:
    root = tmp_path / "store.nbrewind"
    Store.open(root, create=True).close()
    return TaskCache(root)


def pipeline(folder: Path, n: int = 3, inputs: list[int] | None = None) -> Graph:
    """load(i) -> work -> one total, as a legacy graph with Dask-style keys."""
    values = inputs if inputs is not None else list(range(n))
    dsk: Graph = {("load", i): (load, str(folder), v) for i, v in enumerate(values)}
    dsk.update({("work", i): (work, str(folder), ("load", i)) for i in range(len(values))})
    dsk["total"] = (total, str(folder), [("work", i) for i in range(len(values))])
    return dsk


def expected(inputs: list[int]) -> int:
    return sum(2 * v + 1 for v in inputs)


def run(done: Rewritten, keys: list[Any]) -> list[Any]:
    """Execute a rewritten graph on Dask's synchronous scheduler."""
    return list(dask.get(done.dsk, keys))


# -- hits and misses -----------------------------------------------------------------------------


def test_first_rewrite_wraps_every_task_and_running_it_fills_the_cache(cache: TaskCache, calls: Calls) -> None:
    """A cold cache: every task misses, keeps its key, runs once, and stores its result."""
    dsk = pipeline(calls.folder)
    done = rewrite_graph(cache, dsk, ["total"])
    assert (done.hits, done.misses, done.uncached, done.culled) == (0, 7, 0, 0)
    assert done.changed
    assert set(done.dsk) == set(dsk)
    assert all(node.key == key for key, node in done.dsk.items())
    assert run(done, ["total"]) == [expected([0, 1, 2])]
    assert calls.take() == {"load": 3, "work": 3, "total": 1}
    rows = cache.drain_log()
    assert len(rows) == 7 and not any(r.hit for r in rows)
    assert all(r.result_digest and cache.lookup(r.fingerprint) == r.result_digest for r in rows)
    assert sorted(r.key_prefix for r in rows) == ["load"] * 3 + ["total"] + ["work"] * 3


def test_a_cached_output_becomes_one_load_and_its_upstream_is_culled(cache: TaskCache, calls: Calls) -> None:
    """A warm cache: the wanted key loads its stored result; nothing upstream is sent or run."""
    dsk = pipeline(calls.folder)
    run(rewrite_graph(cache, dsk, ["total"]), ["total"])
    calls.take()
    cache.drain_log()

    done = rewrite_graph(cache, dsk, ["total"])
    assert (done.hits, done.misses, done.culled) == (1, 0, 6)
    assert list(done.dsk) == ["total"]
    assert not done.dsk["total"].dependencies  # a load needs nothing from the graph
    assert run(done, ["total"]) == [expected([0, 1, 2])]
    assert calls.take() == {}
    assert [(r.key_prefix, r.hit) for r in cache.drain_log()] == [("total", True)]


def test_one_changed_input_reruns_its_chain_and_loads_the_rest(cache: TaskCache, calls: Calls) -> None:
    """Only what depends on the changed literal misses; its cached siblings load, their inputs culled."""
    run(rewrite_graph(cache, pipeline(calls.folder, inputs=[0, 1, 2]), ["total"]), ["total"])
    calls.take()
    cache.drain_log()

    edited = pipeline(calls.folder, inputs=[0, 10, 2])
    done = rewrite_graph(cache, edited, ["total"])
    assert (done.hits, done.misses, done.culled) == (2, 3, 2)
    assert set(done.dsk) == {"total", ("work", 0), ("work", 1), ("load", 1), ("work", 2)}
    assert run(done, ["total"]) == [expected([0, 10, 2])]
    assert calls.take() == {"load": 1, "work": 1, "total": 1}
    hits = {r.key_prefix for r in cache.drain_log() if r.hit}
    assert hits == {"work"}


def test_several_wanted_keys_each_hit_and_are_logged_once(cache: TaskCache, calls: Calls) -> None:
    """Wanted keys that share upstream are each decided once; duplicates in ``keys`` count once."""
    dsk = pipeline(calls.folder)
    wanted: list[Hashable] = ["total", ("work", 1), "total"]
    first = rewrite_graph(cache, dsk, wanted)
    assert first.misses == 7
    run(first, ["total", ("work", 1)])
    calls.take()
    cache.drain_log()
    again = rewrite_graph(cache, dsk, wanted)
    assert (again.hits, again.misses) == (2, 0)
    assert set(again.dsk) == {"total", ("work", 1)}
    assert run(again, ["total", ("work", 1)]) == [expected([0, 1, 2]), 3]
    assert calls.take() == {}
    assert len(cache.drain_log()) == 2


def test_keys_not_in_the_graph_are_ignored(cache: TaskCache, calls: Calls) -> None:
    """A wanted key the graph does not hold (already computed elsewhere) is not an error."""
    done = rewrite_graph(cache, pipeline(calls.folder), ["not-there", ("work", 0)])
    assert set(done.dsk) == {("work", 0), ("load", 0)}
    assert done.culled == 5
    assert done.fingerprints.keys() == {("work", 0)}


# -- what must not be cached ---------------------------------------------------------------------


def test_impure_tasks_and_their_dependents_run_every_time(cache: TaskCache, calls: Calls) -> None:
    """An @impure task and everything downstream of it stay as they are; what feeds it is cached."""
    folder = str(calls.folder)
    dsk: Graph = {
        "a": (load, folder, 5),
        "b": (noisy, folder, "a"),
        "c": (work, folder, "b"),
        "d": (work, folder, "a"),
    }
    first = rewrite_graph(cache, dsk, ["c", "d"])
    assert (first.hits, first.misses, first.uncached) == (0, 2, 2)  # a, d wrapped; b, c as they are
    assert first.fingerprints.keys() == {"d"}  # a tainted output has no fingerprint to remember
    assert run(first, ["c", "d"]) == [2 * 105 + 1, 11]
    assert calls.take() == {"load": 1, "noisy": 1, "work": 2}
    cache.drain_log()

    second = rewrite_graph(cache, dsk, ["c", "d"])
    assert (second.hits, second.misses, second.uncached) == (2, 0, 2)  # a and d load
    assert set(second.dsk) == {"a", "b", "c", "d"}
    assert run(second, ["c", "d"]) == [2 * 105 + 1, 11]
    assert calls.take() == {"noisy": 1, "work": 1}  # b and c ran again, a was loaded


def test_all_impure_leaves_the_graph_unchanged(cache: TaskCache, calls: Calls) -> None:
    """``all_impure`` (a ``pure=False`` submit): nothing is wrapped, logged or remembered."""
    dsk = pipeline(calls.folder)
    run(rewrite_graph(cache, dsk, ["total"]), ["total"])  # even with a warm cache
    calls.take()
    cache.drain_log()
    known = dict(cache.known_fingerprints())

    done = rewrite_graph(cache, dsk, ["total"], all_impure=True)
    assert not done.changed
    assert (done.hits, done.misses, done.uncached, done.culled) == (0, 0, 7, 0)
    assert done.fingerprints == {}
    assert cache.drain_log() == []
    assert cache.known_fingerprints() == known
    assert run(done, ["total"]) == [expected([0, 1, 2])]
    assert calls.take() == {"load": 3, "work": 3, "total": 1}


def test_keys_named_by_an_impure_call_token_are_not_cached(cache: TaskCache, calls: Calls) -> None:
    """A key carrying a token dask.delayed made for ``pure=False`` taints it and its dependents."""
    token = str(uuid.uuid4())
    folder = str(calls.folder)
    dsk: Graph = {
        "a": (load, folder, 1),
        f"work-{token}": (work, folder, "a"),
        "after": (work, folder, f"work-{token}"),
    }
    cache.impure_tokens.add(token)
    done = rewrite_graph(cache, dsk, ["after"])
    assert (done.misses, done.uncached) == (1, 2)
    assert done.fingerprints == {}
    cache.impure_tokens.discard(token)
    assert rewrite_graph(cache, dsk, ["after"]).misses == 3  # the same graph, the token forgotten


def test_literals_and_aliases_are_kept_and_not_counted_as_tasks(cache: TaskCache, calls: Calls) -> None:
    """Data nodes and aliases cost nothing to recompute: kept as they are, then culled below a hit."""
    folder = str(calls.folder)
    dsk: Graph = {"x": 4, "y": "x", "z": (work, folder, "y")}
    first = rewrite_graph(cache, dsk, ["z"])
    assert (first.hits, first.misses, first.uncached) == (0, 1, 0)
    assert run(first, ["z"]) == [9]
    second = rewrite_graph(cache, dsk, ["z"])
    assert (second.hits, second.culled) == (1, 2)
    assert run(second, ["z"]) == [9]
    assert calls.take() == {"work": 1}


def test_a_changed_library_setting_misses(cache: TaskCache, calls: Calls) -> None:
    """The settings at submission are part of every fingerprint: decimal's precision changes them."""
    dsk = pipeline(calls.folder)
    run(rewrite_graph(cache, dsk, ["total"]), ["total"])
    with decimal.localcontext() as context:
        context.prec = 7
        changed = rewrite_graph(cache, dsk, ["total"])
    assert (changed.hits, changed.misses) == (0, 7)
    assert rewrite_graph(cache, dsk, ["total"]).hits == 1  # back to the setting it was stored under


# -- dependencies outside the graph (futures, persisted collections) ------------------------------


def test_dependents_of_a_submitted_key_follow_that_keys_fingerprint(cache: TaskCache, calls: Calls) -> None:
    """A graph that refers to an earlier output by key (a future) is fingerprinted through what
    that key computed: same key name, different upstream, so the dependent must miss."""
    import dask._task_spec as ts

    folder = str(calls.folder)
    run(rewrite_graph(cache, pipeline(calls.folder, inputs=[0, 1]), ["total"]), ["total"])
    after: Graph = {"after": ts.Task("after", work, folder, ts.TaskRef("total"))}  # "total" is a future now

    first = rewrite_graph(cache, after, ["after"])
    assert first.misses == 1
    first.dsk["total"] = ts.DataNode("total", expected([0, 1]))  # what the future holds
    assert run(first, ["after"]) == [2 * expected([0, 1]) + 1]
    assert rewrite_graph(cache, after, ["after"]).hits == 1

    run(rewrite_graph(cache, pipeline(calls.folder, inputs=[5, 1]), ["total"]), ["total"])  # "total" again
    assert rewrite_graph(cache, after, ["after"]).misses == 1


def test_an_unknown_outside_key_is_not_cached(cache: TaskCache, calls: Calls) -> None:
    """A dependency the graph lacks and the cache never saw cannot be fingerprinted: the task runs as it is."""
    import dask._task_spec as ts

    graph: Graph = {"after": ts.Task("after", work, str(calls.folder), ts.TaskRef("nobody-knows"))}
    done = rewrite_graph(cache, graph, ["after"])
    assert (done.hits, done.misses, done.uncached) == (0, 0, 1)
    assert not done.changed and done.fingerprints == {}
    assert done.dsk["after"] is graph["after"]


# -- keys and annotations ------------------------------------------------------------------------


def test_rewritten_graph_keeps_keys_so_annotations_still_apply(cache: TaskCache, calls: Calls) -> None:
    """Per-key annotations are looked up by key: the rewrite keeps every key it does not cull, and
    the interception's graph expression (its caller) carries the annotations over unchanged."""
    import dask.delayed
    from dask.base import collections_to_expr

    from nbrewind.tasks.intercept import _rewrite_expr

    folder = str(calls.folder)
    with dask.annotate(retries=3, priority=7):
        parts = [dask.delayed(work, pure=True)(folder, i) for i in range(3)]
    summed = dask.delayed(total, pure=True)(folder, parts)
    expr = collections_to_expr([summed])
    annotations = expr.__dask_annotations__()
    assert set(annotations) == {"retries", "priority"} and len(annotations["retries"]) == 3
    keys = flatten_keys(expr.__dask_keys__())

    done = rewrite_graph(cache, expr.__dask_graph__(), keys)
    assert done.misses == 4
    assert all(key in done.dsk and done.dsk[key].key == key for key in annotations["retries"])
    rewritten = _rewrite_expr(cache, expr, keys)
    assert rewritten is not expr
    assert rewritten.__dask_annotations__() == annotations
    assert flatten_keys(rewritten.__dask_keys__()) == keys
    assert run(Rewritten(dict(rewritten.__dask_graph__())), keys) == [sum(2 * i + 1 for i in range(3))]


def test_flatten_keys_walks_nested_lists_in_order() -> None:
    """Dask's nested output keys become one flat list in order; a single key is a one-item list."""
    assert flatten_keys([[("x", 0), ("x", 1)], [("x", 2)], ("y", 0), [[["z"]]]]) == [
        ("x", 0), ("x", 1), ("x", 2), ("y", 0), "z"
    ]
    assert flatten_keys("total") == ["total"]
    assert flatten_keys(("x", 0)) == [("x", 0)]
    assert flatten_keys([]) == []


# -- damaged entries -----------------------------------------------------------------------------


def _delete_entry_of(cache: TaskCache, done: Rewritten, key: Hashable) -> None:
    """Delete the stored entry a load task of ``done`` reads (as a concurrent gc might)."""
    entry = cache.lookup(done.fingerprints[key])
    assert entry is not None
    assert cache.objects.delete(entry)


def test_a_load_whose_entry_vanished_recomputes_from_the_culled_upstream(cache: TaskCache, calls: Calls) -> None:
    """A hit carries its upstream work, so an entry lost after the rewrite is recomputed, not an error."""
    dsk = pipeline(calls.folder)
    run(rewrite_graph(cache, dsk, ["total"]), ["total"])
    calls.take()
    done = rewrite_graph(cache, dsk, ["total"])
    assert done.hits == 1
    _delete_entry_of(cache, done, "total")
    assert run(done, ["total"]) == [expected([0, 1, 2])]
    assert calls.take() == {"load": 3, "work": 3, "total": 1}
    assert cache.lookup(done.fingerprints["total"]) is not None  # and the recomputed result is stored again


def test_a_load_with_too_much_upstream_to_carry_fails_clearly(
    cache: TaskCache, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past FALLBACK_LIMIT upstream tasks a load carries no fallback: a lost entry is a TaskCacheError.

    The limit is lowered (a module constant, not a mock) so a 7-task graph is over it.
    """
    monkeypatch.setattr(rewrite, "FALLBACK_LIMIT", 3)
    dsk = pipeline(calls.folder)
    run(rewrite_graph(cache, dsk, ["total"]), ["total"])
    done = rewrite_graph(cache, dsk, ["total"])
    assert done.hits == 1
    _delete_entry_of(cache, done, "total")
    with pytest.raises(TaskCacheError, match="cannot be loaded"):
        run(done, ["total"])


def test_a_miss_wrapper_is_the_task_the_constructor_would_build() -> None:
    """The rewrite sets a miss wrapper's slots directly (dask's constructor scans every
    argument again); slot for slot it must be what ``Task(...)`` builds."""
    import dask._task_spec as ts

    from nbrewind.tasks.resume import run_resumable

    maker = rewrite._wrap_maker(ts)
    assert maker.__name__ == "direct"  # the dask this was written for: the fast path is on
    node = ts.Task(("x", 1), max, ts.TaskRef("a"), ts.DataNode(None, 2), ts.List(ts.TaskRef("b")),
                   _data_producer=True, default=ts.TaskRef("c"))
    spec = object()
    built = maker(("x", 1), spec, node)
    expected = ts.Task(("x", 1), run_resumable, spec, node.func, *node.args,
                       _data_producer=node.data_producer, **node.kwargs)
    assert type(built) is ts.Task
    for slot in rewrite._TASK_SLOTS:
        assert getattr(built, slot) == getattr(expected, slot), slot
    assert built.dependencies == {"a", "b", "c"}
    assert built.kwargs is not node.kwargs


def test_the_cyclic_gc_is_back_on_after_a_rewrite_even_one_that_failed(tmp_path: Path) -> None:
    import gc

    from dask._task_spec import Task

    cache = TaskCache(tmp_path / "store")
    rewrite_graph(cache, {"a": Task("a", int, 1)}, ["a"])
    assert gc.isenabled()
    with pytest.raises(KeyError):
        cache.fingerprinter.fingerprint_graph({"a": Task("a", int, 1)}, ["missing"])
    assert gc.isenabled()
    gc.disable()
    try:
        rewrite_graph(cache, {"a": Task("a", int, 1)}, ["a"])
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
