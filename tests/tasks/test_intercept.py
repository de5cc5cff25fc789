"""Interception of distributed submissions, on a real 2-worker LocalCluster (worker processes).

Every client path (submit, map, compute, persist, get; dask.compute, .compute()
and .persist() with a default client) must reach the cache; the table of
issue 5 must hold when the tasks run in other processes; per-key annotations
must reach the scheduler. Calls are counted by files the task functions write
(see test_cache.py), so counts include work done in the worker processes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402
from test_cache import Calls, chain, csv_total, expected_total, notebook, write_csvs  # noqa: E402

from nbrewind.tasks.cache import TaskCache  # noqa: E402
from nbrewind.tasks.intercept import intercepting  # noqa: E402

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", resources={"slot": 2}) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def cache(tmp_path: Path, client: Client) -> Iterator[TaskCache]:
    c = TaskCache(tmp_path / "store.nbrewind")
    with intercepting(c):
        yield c


def _submit(c: Client, ns: dict[str, Any]) -> Any:
    return c.submit(ns["work"], 3).result()


def _map(c: Client, ns: dict[str, Any]) -> Any:
    return c.gather(c.map(ns["work"], [3, 4]))


def _compute(c: Client, ns: dict[str, Any]) -> Any:
    return c.compute(chain(ns, 2)).result()


def _persist(c: Client, ns: dict[str, Any]) -> Any:
    return c.persist(chain(ns, 2)).compute()


def _get(c: Client, ns: dict[str, Any]) -> Any:
    return c.get({"a": (ns["load"], 3), "b": (ns["work"], "a")}, "b")


def _dask_compute(c: Client, ns: dict[str, Any]) -> Any:
    return dask.compute(chain(ns, 2))[0]


def _method_compute(c: Client, ns: dict[str, Any]) -> Any:
    return chain(ns, 2).compute()


def _method_persist(c: Client, ns: dict[str, Any]) -> Any:
    return chain(ns, 2).persist().compute()


PATHS: dict[str, Callable[[Client, dict[str, Any]], Any]] = {
    "submit": _submit, "map": _map, "compute": _compute, "persist": _persist, "get": _get,
    "dask.compute": _dask_compute, ".compute()": _method_compute, ".persist()": _method_persist,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_client_path_is_intercepted(cache: TaskCache, calls: Calls, client: Client, path: str) -> None:
    run = PATHS[path]
    first = run(client, notebook(calls.folder))
    assert sum(calls.take().values()) > 0
    rows = cache.drain_log()
    assert rows and not any(r.hit for r in rows)
    assert all(r.worker in client.scheduler_info()["workers"] for r in rows)  # stored where they ran
    assert run(client, notebook(calls.folder)) == first
    assert calls.take() == {}
    rows = cache.drain_log()
    assert rows and all(r.hit for r in rows)


@pytest.mark.parametrize("edit", [None, "body", "helper", "constant"])
def test_edits_on_the_cluster(cache: TaskCache, calls: Calls, client: Client, edit: str | None) -> None:
    n = 4
    assert client.compute(chain(notebook(calls.folder), n)).result() == expected_total(n)
    assert calls.take() == {"load": n, "work": n, "total": 1}
    cache.drain_log()
    value = client.compute(chain(notebook(calls.folder, edit), n)).result()
    assert value == {None: expected_total(n), "body": expected_total(n, plus=2), "helper": expected_total(n),
                     "constant": expected_total(n, scale=3)}[edit]
    assert calls.take() == ({} if edit is None else {"work": n, "total": 1})


def test_map_100_plus_10_with_futures_as_arguments(cache: TaskCache, calls: Calls, client: Client) -> None:
    def run(ns: dict[str, Any], n: int) -> int:
        parts = client.map(ns["work"], range(n))
        return int(client.submit(ns["total"], parts).result())

    assert run(notebook(calls.folder), 100) == expected_total(100)
    assert calls.take() == {"work": 100, "total": 1}
    cache.drain_log()
    assert run(notebook(calls.folder), 110) == expected_total(110)
    assert calls.take() == {"work": 10, "total": 1}
    assert cache.stats(cache.drain_log()) == (100, 11)
    assert run(notebook(calls.folder), 110) == expected_total(110)
    assert calls.take() == {}


def test_dataframe_csv_change_on_the_cluster(cache: TaskCache, calls: Calls, client: Client, tmp_path: Path) -> None:
    import pandas as pd

    ns = notebook(calls.folder)
    paths = write_csvs(tmp_path / "data", 3)
    assert csv_total(ns, tmp_path / "data") == 2 * sum(range(30))
    assert calls.take() == {"part": 3}
    # Not the first file: dask.dataframe puts a sample of it (for the header) in every read task.
    pd.DataFrame({"x": [7], "y": [0.5]}).to_csv(paths[1], index=False)
    cache.drain_log()
    assert csv_total(ns, tmp_path / "data") == 2 * (sum(range(10)) + sum(range(20, 30)) + 7)
    assert calls.take() == {"part": 1}
    ran = Counter(r.key_prefix for r in cache.drain_log() if not r.hit)
    assert ran["read-csv"] == 1 and ran["sum-tree"] == 1


def test_bag_and_array_on_the_cluster(cache: TaskCache, calls: Calls, client: Client) -> None:
    import dask.array as da
    import dask.bag as db
    import numpy as np

    def run(ns: dict[str, Any]) -> tuple[int, float]:
        bag = db.from_sequence(range(8), npartitions=2).map(ns["work"]).sum()
        arr = da.ones(20, chunks=5).map_blocks(ns["block"], dtype=float, meta=np.array((), dtype=float)).sum()
        b, a = dask.compute(bag, arr)
        return int(b), float(a)

    assert run(notebook(calls.folder)) == (expected_total(8), 60.0)
    assert calls.take() == {"work": 8, "block": 4}
    assert run(notebook(calls.folder)) == (expected_total(8), 60.0)
    assert calls.take() == {}


def test_annotations_survive_the_rewrite(cache: TaskCache, calls: Calls, client: Client) -> None:
    ns = notebook(calls.folder)
    workers = sorted(client.scheduler_info()["workers"])
    with dask.annotate(retries=2, priority=5, resources={"slot": 1}, workers=[workers[0]]):
        annotated = dask.delayed(ns["work"])(10)
    plain = dask.delayed(ns["work"])(11)
    fut_a, fut_p = client.compute([annotated, plain])
    assert (fut_a.result(), fut_p.result()) == (21, 23)

    def restrictions(dask_scheduler: Any, keys: list[Any]) -> list[Any]:
        out = []
        for key in keys:
            ts = dask_scheduler.tasks[key]
            out.append((ts.retries, ts.priority[0], ts.resource_restrictions, sorted(ts.worker_restrictions or ())))
        return out

    annotated_state, plain_state = client.run_on_scheduler(restrictions, keys=[fut_a.key, fut_p.key])
    assert annotated_state == (2, -5, {"slot": 1}, [workers[0]])
    assert plain_state[:2] == (0, 0) and not plain_state[2] and not plain_state[3]
    assert cache.stats(cache.drain_log()) == (0, 2)
