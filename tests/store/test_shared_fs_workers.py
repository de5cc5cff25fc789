"""Dask workers never touch the catalog: on a cluster they may run on machines whose
locks the catalog's host never sees, so only the kernel may use it.

A real LocalCluster worker process gets an audit hook that records every SQLite
connection it makes and every file it opens whose name starts with the catalog's.
The worker then runs what workers run for NBRewind: a missed task (run and store),
the same task again (load), a task that checkpoints, resumes and publishes, and a
graph with dependencies. The hook must have seen nothing, and the catalog file
must be byte for byte what it was. A control call, in the same worker, that does
open the catalog shows that the hook would have seen it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

from nbrewind.tasks.cache import TaskCache  # noqa: E402
from nbrewind.tasks.intercept import intercepting  # noqa: E402

pytestmark = pytest.mark.cluster

TASKS = '''
import nbrewind

def square(x):
    return x * x

def steps(n):
    state = nbrewind.resume({"i": 0, "total": 0})
    for i in range(state["i"], n):
        state = {"i": i + 1, "total": state["total"] + i}
        nbrewind.checkpoint(state)
    nbrewind.publish("partial-total", state["total"], register=False)
    return state["total"]

def add(a, b):
    return a + b
'''


def _tasks() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}  # pickled by value, as notebook functions are
    exec(compile(TASKS, "<notebook>", "exec"), ns)
    return ns


def _watch_catalog() -> None:
    """Runs on the worker: remember every SQLite connection and every catalog file opened."""
    import sys

    seen: list[str] = []
    sys.modules["__nbrewind_catalog_watch__"] = seen  # type: ignore[assignment]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "sqlite3.connect":
            seen.append(f"sqlite3.connect {args[0]}")
        elif event == "open" and args and "catalog.sqlite" in str(args[0]):
            seen.append(f"open {args[0]}")

    sys.addaudithook(hook)


def _seen() -> list[str]:
    import sys

    return list(sys.modules["__nbrewind_catalog_watch__"])  # type: ignore[call-overload]


def _open_catalog(root: str) -> int:
    """The control: what a worker that did read the catalog would do."""
    from nbrewind.store import Store

    with Store.open(root, readonly=True) as store:
        return len(store.catalog.cell_runs())


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as c,
    ):
        yield c


def _fingerprint_of(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_workers_never_open_the_catalog(tmp_path: Path, client: Client) -> None:
    root = tmp_path / "store.nbrewind"
    cache = TaskCache(root)
    catalog = root / "catalog.sqlite"
    client.run(_watch_catalog)
    [pid] = client.run(lambda: __import__("os").getpid()).values()
    assert pid != __import__("os").getpid()  # the tasks run in another process
    ns = _tasks()
    with intercepting(cache):
        cache.objects  # the kernel creates the store (and its catalog) before any task runs  # noqa: B018
        before = _fingerprint_of(catalog)
        assert client.submit(ns["square"], 7).result() == 49  # miss: run and store
        assert client.submit(ns["square"], 7).result() == 49  # hit: load
        assert client.submit(ns["steps"], 5).result() == 10  # checkpoint, resume, publish
        square = dask.delayed(ns["square"], pure=True)
        graph = dask.delayed(ns["add"], pure=True)(square(3), square(4))
        assert client.compute(graph).result() == 25
        assert client.compute(graph).result() == 25
    rows = cache.drain_log()
    assert {r.hit for r in rows} == {True, False}  # the cache did its work on the worker
    assert {"task-published", "tasks"} <= set(cache.objects.ref_namespaces())
    assert [events for events in client.run(_seen).values()] == [[]]
    assert _fingerprint_of(catalog) == before

    assert list(client.run(_open_catalog, str(root)).values()) == [0]
    [events] = client.run(_seen).values()
    assert any(e.startswith("sqlite3.connect") and "catalog.sqlite" in e for e in events), events
