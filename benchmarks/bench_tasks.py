"""Task cache costs: fingerprint + rewrite per task, and the store wrapper's per-task overhead.

Run: ``python benchmarks/bench_tasks.py``. Not a test; prints a table.

1. A 20k-task dask.array graph (and an ~8k-task dask.dataframe graph) is
   materialized once, then fingerprinted and rewritten (cold: every task a
   miss, wrapped; warm: outputs hit, the rest culled). Per-task figures divide by
   the number of tasks in the graph.
2. The same 400 small notebook tasks on a 2-worker LocalCluster (worker
   processes), uncached vs cached cold (run + store) vs cached warm (load):
   wall time per task, in one run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from nbrewind.tasks.cache import TaskCache
from nbrewind.tasks.intercept import intercepting
from nbrewind.tasks.rewrite import flatten_keys, rewrite_graph
from nbrewind.tasks.settings import task_settings


def _graph(collection: Any) -> tuple[dict[Any, Any], list[Any]]:
    from dask._expr import FinalizeCompute
    from dask._task_spec import convert_legacy_graph
    from dask.base import collections_to_expr

    expr = FinalizeCompute(collections_to_expr([collection], True)).optimize()  # what dask.compute sends
    return convert_legacy_graph(dict(expr.__dask_graph__())), flatten_keys(expr.__dask_keys__())


def bench_rewrite(name: str, collection: Any, repeat: int = 3) -> list[str]:
    dsk, keys = _graph(collection)
    n = len(dsk)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = TaskCache(Path(tmp) / "store")
        cache.objects  # create the store outside the timing
        fp_times, cold, warm = [], [], []
        for _ in range(repeat):
            t = time.perf_counter()
            cache.fingerprinter.fingerprint_graph(dsk, keys)
            fp_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            rewrite_graph(cache, dsk, keys)
            cold.append(time.perf_counter() - t)
            cache.drain_log()
        # Make the outputs hits, as after a first run.
        for k in keys:
            fp = cache.fingerprinter.fingerprint_graph(dsk, [k], settings=task_settings())[k]
            entry = cache.objects.put_tree([cache.objects.put(b"x")], b'{"format": "nbrewind-task-result/1"}')
            cache.objects.ref_set("tasks", fp, entry)
        for _ in range(repeat):
            t = time.perf_counter()
            done = rewrite_graph(cache, dsk, keys)
            warm.append(time.perf_counter() - t)
            cache.drain_log()
        assert done.hits == len(keys)
    for label, times in (("fingerprint only", fp_times), ("fingerprint + rewrite, all miss", cold),
                         ("fingerprint + rewrite, outputs hit", warm)):
        best = min(times)
        rows.append(f"{name:<22} {n:>7} {label:<36} {best * 1e3:>9.1f} ms {best / n * 1e6:>8.1f} us/task")
    return rows


def bench_cluster(n_tasks: int = 400) -> list[str]:
    import dask
    from distributed import Client, LocalCluster

    ns: dict[str, Any] = {"__name__": "__main__"}
    exec("def inc(x):\n    return x + 1\n", ns)
    rows = []
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        def run(offset: int) -> float:
            tasks = [dask.delayed(ns["inc"])(i + offset) for i in range(n_tasks)]
            t = time.perf_counter()
            dask.compute(*tasks)
            return time.perf_counter() - t

        run(10**6)  # warm up the workers
        uncached = statistics.median(run(10**7 + k * n_tasks) for k in range(3))
        cache = TaskCache(Path(tmp) / "store")
        with intercepting(cache):
            cold = statistics.median(run(10**8 + k * n_tasks) for k in range(3))
            warm = statistics.median(run(10**8 + k * n_tasks) for k in range(3))
            cache.drain_log()
        for label, seconds in (("uncached", uncached), ("cached, cold (run + store)", cold),
                               ("cached, warm (load)", warm)):
            rows.append(f"{'LocalCluster 2 procs':<22} {n_tasks:>7} {label:<36} {seconds * 1e3:>9.1f} ms "
                        f"{seconds / n_tasks * 1e6:>8.1f} us/task")
        rows.append(f"{'':<22} {'':>7} {'store overhead per task (cold - uncached)':<47} "
                    f"{(cold - uncached) / n_tasks * 1e6:>8.1f} us/task")
    return rows


def main() -> None:
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    array = (da.ones((20_000 * 10,), chunks=10) + 1).sum(split_every=32)  # 20k fused chunk tasks + a tree
    frame = dd.from_pandas(pd.DataFrame({"x": range(80_000)}), npartitions=8000)
    frame = (frame.x + 1).sum()
    print(f"{'graph':<22} {'tasks':>7} {'what':<36} {'best':>12} {'per task':>16}")
    rows = bench_rewrite("dask.array", array) + bench_rewrite("dask.dataframe", frame) + bench_cluster()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
