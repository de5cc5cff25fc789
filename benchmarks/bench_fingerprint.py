"""Fingerprinting cost per task on a dask.array and a dask.dataframe graph, against dask's tokenize.

Run: ``python -m benchmarks.bench_fingerprint``. "cold" is a fresh Fingerprinter
(module versions looked up, code digested); "warm" reuses it, as a kernel does
from the second cell on. The goal is at most 20 µs per task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def array_graph() -> dict[Any, Any]:
    """About 33k tasks: 10k chunks of ones, +1, a per-chunk sum and its tree reduction."""
    import dask.array as da

    return dict((da.ones((2000, 2000), chunks=(20, 20)) + 1).sum().__dask_graph__())


def dataframe_graph() -> dict[Any, Any]:
    """About 8k tasks: 1300 pandas partitions, arithmetic on columns and a groupby-sum."""
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"x": np.arange(13_000.0), "y": np.arange(13_000) % 7})
    ddf = dd.from_pandas(df, npartitions=1300)
    return dict((ddf.x * 2 + ddf.y).groupby(ddf.y).sum().__dask_graph__())


def _best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(name: str, dsk: dict[Any, Any]) -> dict[str, float]:
    """µs per task: cold and warm fingerprinting, and dask.base.tokenize of each task."""
    from dask.base import tokenize

    from nbrewind.tasks.fingerprint import Fingerprinter

    n = len(dsk)
    start = time.perf_counter()
    fp = Fingerprinter()
    fps = fp.fingerprint_graph(dsk)
    cold = time.perf_counter() - start
    if len(fps) != n:
        raise SystemExit(f"{name}: {n - len(fps)} tasks not fingerprinted: {list(fp.failures.items())[:3]}")
    warm = _best_of(3, lambda: fp.fingerprint_graph(dsk))
    # Task caches its token on the object after the first call: only a first pass is fair.
    tok = _best_of(1, lambda: [tokenize(task) for task in dsk.values()])
    return {"tasks": n, "cold": cold / n * 1e6, "warm": warm / n * 1e6, "tokenize": tok / n * 1e6}


def main() -> None:
    print(f"{'graph':<10} {'tasks':>7} {'cold µs':>9} {'warm µs':>9} {'tokenize µs':>12}")
    for name, build in (("array", array_graph), ("dataframe", dataframe_graph)):
        r = measure(name, build())
        print(f"{name:<10} {r['tasks']:>7.0f} {r['cold']:>9.1f} {r['warm']:>9.1f} {r['tokenize']:>12.1f}")


if __name__ == "__main__":
    main()
