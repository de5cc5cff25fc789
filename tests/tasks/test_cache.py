"""The task cache on the local schedulers (threads, sync, processes), counting real calls.

"Notebook functions" are source exec'd into a dict with ``__name__ == '__main__'``;
"an edited notebook" is the edited source exec'd into a new dict. Every task
function drops a uniquely named file into a counts folder, so calls are counted
wherever they ran (threads, worker processes). The folder is a directory, which
fingerprints by name only, so counting never changes a fingerprint.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")

import dask.base  # noqa: E402

delayed_module = sys.modules["dask.delayed"]

from nbrewind.tasks import impure  # noqa: E402
from nbrewind.tasks.cache import REF_NAMESPACE, TaskCache  # noqa: E402
from nbrewind.tasks.intercept import current_cache, intercepting  # noqa: E402

from counting import Calls  # noqa: E402  (tests/tasks/counting.py)

NOTEBOOK = '''
import os, uuid
from nbrewind.identity.files import quietly
COUNTS = {counts!r}
SCALE = 2

def tick(name):
    # The test's own observation, not the task's effect: unseen, or every task would run.
    with quietly(), open(os.path.join(COUNTS, name + "-" + uuid.uuid4().hex), "w"):
        pass

def helper(x):
    return x * SCALE

def load(i):
    tick("load")
    return i

def work(x):
    tick("work")
    return helper(x) + 1

def total(xs):
    tick("total")
    return sum(xs)

def part(df):
    tick("part")
    return df * SCALE

def block(a):
    tick("block")
    return a * SCALE + 1
'''

#: name -> (old text, new text) of one notebook edit.
EDITS = {
    "body": ("return helper(x) + 1", "return helper(x) + 2"),
    "helper": ("return x * SCALE", "return x * SCALE - 0"),
    "constant": ("SCALE = 2", "SCALE = 3"),
}


def notebook(counts: Path, edit: str | None = None) -> dict[str, Any]:
    """The notebook's functions, optionally after one edit, as a fresh namespace."""
    source = NOTEBOOK.format(counts=str(counts))
    if edit is not None:
        old, new = EDITS[edit]
        assert old in source
        source = source.replace(old, new)
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), ns)
    return ns


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[TaskCache]:
    c = TaskCache(tmp_path / "store.nbrewind")
    with intercepting(c):
        yield c


def chain(ns: dict[str, Any], n: int) -> Any:
    """load(i) -> work -> one total: the delayed pipeline of the table tests."""
    delayed = dask.delayed
    return delayed(ns["total"])([delayed(ns["work"])(delayed(ns["load"])(i)) for i in range(n)])


def expected_total(n: int, scale: int = 2, plus: int = 1) -> int:
    return sum(i * scale + plus for i in range(n))


# -- the table, on the threaded scheduler --------------------------------------------------------


@pytest.mark.parametrize("edit", [None, "body", "helper", "constant"])
def test_delayed_edits_rerun_exactly_the_changed_tasks(cache: TaskCache, calls: Calls, edit: str | None) -> None:
    n = 6
    base = notebook(calls.folder)
    assert chain(base, n).compute(scheduler="threads") == expected_total(n)
    assert calls.take() == {"load": n, "work": n, "total": 1}
    first = cache.drain_log()
    assert len(first) == 2 * n + 1 and not any(r.hit for r in first)
    assert all(r.result_digest and r.nbytes and r.worker for r in first)

    edited = notebook(calls.folder, edit)
    value = chain(edited, n).compute(scheduler="threads")
    plain = {None: expected_total(n), "body": expected_total(n, plus=2), "helper": expected_total(n),
             "constant": expected_total(n, scale=3)}[edit]
    assert value == plain
    if edit is None:
        assert calls.take() == {}
        rows = cache.drain_log()
        assert [(r.key_prefix, r.hit) for r in rows] == [("total", True)]  # the rest was culled
    else:
        assert calls.take() == {"work": n, "total": 1}
        rows = cache.drain_log()
        assert cache.stats(rows) == (n, n + 1)  # n loads hit, n works + total ran
        assert {r.key_prefix for r in rows if r.hit} == {"load"}


def test_map_over_100_plus_10_new_inputs(cache: TaskCache, calls: Calls) -> None:
    ns = notebook(calls.folder)
    delayed = dask.delayed

    def run(n: int) -> int:
        return int(delayed(ns["total"])([delayed(ns["work"])(i) for i in range(n)]).compute())

    assert run(100) == expected_total(100)
    assert calls.take() == {"work": 100, "total": 1}
    cache.drain_log()
    assert run(110) == expected_total(110)
    assert calls.take() == {"work": 10, "total": 1}
    assert cache.stats(cache.drain_log()) == (100, 11)
    assert run(110) == expected_total(110)
    assert calls.take() == {}


def write_csvs(folder: Path, n: int) -> list[Path]:
    import pandas as pd

    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"part-{i}.csv"
        pd.DataFrame({"x": range(10 * i, 10 * i + 10), "y": [float(i)] * 10}).to_csv(path, index=False)
        paths.append(path)
    return paths


def csv_total(ns: dict[str, Any], folder: Path, scheduler: Any = None) -> float:
    import dask.dataframe as dd

    ddf = dd.read_csv(str(folder / "*.csv"))
    return float(ddf.map_partitions(ns["part"], meta=ddf._meta).x.sum().compute(scheduler=scheduler))


def test_dataframe_one_changed_csv_reruns_one_partition(cache: TaskCache, calls: Calls, tmp_path: Path) -> None:
    import pandas as pd

    ns = notebook(calls.folder)
    paths = write_csvs(tmp_path / "data", 4)
    assert csv_total(ns, tmp_path / "data", "threads") == 2 * sum(range(40))
    assert calls.take() == {"part": 4}
    cache.drain_log()
    assert csv_total(ns, tmp_path / "data", "threads") == 2 * sum(range(40))
    assert calls.take() == {}
    cache.drain_log()

    pd.DataFrame({"x": [1000, 1001], "y": [9.0, 9.0]}).to_csv(paths[2], index=False)
    assert csv_total(ns, tmp_path / "data", "threads") == 2 * (sum(range(40)) - sum(range(20, 30)) + 2001)
    assert calls.take() == {"part": 1}
    rows = cache.drain_log()
    ran = Counter(r.key_prefix for r in rows if not r.hit)
    assert ran["read-csv"] == 1 and ran["part"] == 1
    assert ran["sum-tree"] == 1  # the reduction


def test_array_edit_and_nothing_changed(cache: TaskCache, calls: Calls) -> None:
    import dask.array as da
    import numpy as np

    def run(ns: dict[str, Any]) -> float:
        x = da.arange(40, chunks=10, dtype=float)
        return float(x.map_blocks(ns["block"], dtype=float, meta=np.array((), dtype=float)).sum().compute())

    assert run(notebook(calls.folder)) == float(np.sum(np.arange(40.0) * 2 + 1))
    assert calls.take() == {"block": 4}
    assert run(notebook(calls.folder)) == float(np.sum(np.arange(40.0) * 2 + 1))
    assert calls.take() == {}
    assert run(notebook(calls.folder, "constant")) == float(np.sum(np.arange(40.0) * 3 + 1))
    assert calls.take() == {"block": 4}


def test_bag_on_the_process_scheduler(cache: TaskCache, calls: Calls) -> None:
    import dask.bag as db

    def run(ns: dict[str, Any], n: int) -> int:
        return int(db.from_sequence(range(n), npartitions=4).map(ns["work"]).sum().compute(scheduler="processes"))

    assert run(notebook(calls.folder), 20) == expected_total(20)
    assert calls.take() == {"work": 20}
    workers = {r.worker for r in cache.drain_log() if not r.hit}
    assert f"{os.uname().nodename}:{os.getpid()}" not in workers  # stored by the worker processes
    assert run(notebook(calls.folder), 20) == expected_total(20)
    assert calls.take() == {}
    assert run(notebook(calls.folder, "body"), 20) == expected_total(20, plus=2)
    assert calls.take() == {"work": 20}


def test_sync_scheduler_and_collection_defaults(cache: TaskCache, calls: Calls) -> None:
    ns = notebook(calls.folder)
    assert chain(ns, 3).compute(scheduler="sync") == expected_total(3)
    assert chain(ns, 3).compute(scheduler="sync") == expected_total(3)
    persisted = dask.persist(chain(ns, 3))[0]
    assert persisted.compute() == expected_total(3)
    assert calls.take() == {"load": 3, "work": 3, "total": 1}


# -- impure tasks, unpicklable results, a damaged store ------------------------------------------


def test_impure_tasks_and_their_dependents_are_never_cached(cache: TaskCache, calls: Calls) -> None:
    import nbrewind

    assert nbrewind.impure is impure  # the public spelling, as a decorator on notebook functions
    ns = notebook(calls.folder)
    marked = nbrewind.impure(ns["work"])
    for _ in range(2):
        dask.delayed(ns["total"])([dask.delayed(marked)(1)]).compute()
    assert calls.take() == {"work": 2, "total": 2}
    for _ in range(2):
        leaf = dask.delayed(ns["load"], pure=False)(5)
        assert dask.delayed(ns["helper"])(leaf).compute() == 10
    assert calls.take() == {"load": 2}
    assert cache.drain_log() == []


def test_unpicklable_result_runs_and_is_not_cached(cache: TaskCache, calls: Calls) -> None:
    ns = notebook(calls.folder)
    exec("def make_lock(x):\n    tick('lock')\n    return threading.Lock()\n", ns)
    ns["threading"] = threading
    for _ in range(2):
        lock = dask.delayed(ns["make_lock"])(1).compute(scheduler="sync")
        assert hasattr(lock, "acquire")
    assert calls.take() == {"lock": 2}
    rows = cache.drain_log()
    assert [r.hit for r in rows] == [False, False] and rows[0].result_digest is None


def test_corrupt_result_is_recomputed(cache: TaskCache, calls: Calls) -> None:
    ns = notebook(calls.folder)
    assert chain(ns, 2).compute() == expected_total(2)
    calls.take()
    fingerprint = next(r.fingerprint for r in cache.drain_log() if r.key_prefix == "total")
    entry = cache.objects.ref_get(REF_NAMESPACE, fingerprint)
    assert entry is not None
    payload = cache.objects.get_tree(entry)[0][0]
    path = cache.objects.path_of(payload)
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    assert chain(ns, 2).compute() == expected_total(2)
    assert calls.take() == {"load": 2, "work": 2, "total": 1}  # the fallback recomputed it all
    assert chain(ns, 2).compute() == expected_total(2)
    assert calls.take() == {}  # and stored it again


def test_unwritable_store_never_fails_a_task(cache: TaskCache, calls: Calls) -> None:
    ns = notebook(calls.folder)
    objects = cache.objects
    objects.readonly = True
    try:
        assert chain(ns, 2).compute() == expected_total(2)
        assert chain(ns, 2).compute() == expected_total(2)
    finally:
        objects.readonly = False
    assert calls.take() == {"load": 4, "work": 4, "total": 2}


def test_results_round_trip_large_buffers(cache: TaskCache) -> None:
    import numpy as np
    import pandas as pd

    big = np.arange(300_000, dtype=np.float64)
    frame = pd.DataFrame({"a": big, "b": big.astype(np.int32)})
    value = dask.delayed(pickle.loads)(pickle.dumps(frame))  # a library task with a large literal
    first = value.compute()
    again = value.compute()
    pd.testing.assert_frame_equal(first, frame)
    pd.testing.assert_frame_equal(again, frame)
    rows = cache.drain_log()
    assert [r.hit for r in rows] == [False, True] and rows[0].nbytes >= big.nbytes


# -- the patches -----------------------------------------------------------------------------------


def test_patches_are_restored_exactly_and_nest(tmp_path: Path) -> None:
    originals = (dask.base.get_scheduler, delayed_module.tokenize)
    outer, inner = TaskCache(tmp_path / "a"), TaskCache(tmp_path / "b")
    with intercepting(outer):
        patched = dask.base.get_scheduler
        assert patched is not originals[0] and current_cache() is outer
        with intercepting(inner):
            assert dask.base.get_scheduler is patched and current_cache() is inner
        assert current_cache() is outer
    assert (dask.base.get_scheduler, delayed_module.tokenize) == originals
    assert current_cache() is None
    assert not any("PostImportHook" in type(f).__name__ for f in sys.meta_path)
