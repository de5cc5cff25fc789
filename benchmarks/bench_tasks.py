"""Task cache costs: fingerprint + rewrite per task, the store wrapper's per-task overhead,
what writing results costs, and real kernels on a 100k-task graph.

Run: ``python -m benchmarks.bench_tasks [--tasks N] [--rounds R] [--skip-kernels] [--million]``,
or ``python -m benchmarks.bench_tasks --compare /tmp/wt-fp-old [--rounds R]`` for fingerprint +
rewrite of this tree against another (``git worktree add /tmp/wt-fp-old COMMIT``), side by side.
Not a test; prints tables.

1. A 100k-task dask.array graph (and a 32k-task dask.dataframe graph) is
   materialized once, then fingerprinted and rewritten (cold: every task a
   miss, wrapped; warm: outputs hit, the rest culled). Per-task figures divide by
   the number of tasks in the graph. Beside them, the floor: pickling every task
   with cloudpickle and hashing the bytes (xxh3), what any content hash of a task
   costs at least when done the simple way.
2. Writing results, in one run: 2,000 tasks with distinct results on the threaded
   scheduler, uncached vs one fsync per object (a worker on another machine) vs
   deferred writes and one barrier (the client's machine), plus the barrier itself.
3. The same 400 small notebook tasks on a 2-worker LocalCluster (worker
   processes), uncached vs cached cold (run + store) vs cached warm (load).
4. Real kernels (nbclient, threaded scheduler) on a 3-cell notebook whose compute
   cell runs a ~100k-task ``da.ones`` graph: python3 vs audit, then the compute
   cell edited (output text only) on the repeat kernel, over the collection
   restored from its checkpoint: every task it reaches must hit. Medians of rounds.
5. With ``--million``: peak RSS and time of fingerprint + rewrite on a 1M-task
   graph, in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
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


def bench_rewrite(name: str, collection: Any, repeat: int = 5) -> list[str]:
    """Medians of ``repeat`` runs (and the best) of fingerprinting, and fingerprint + rewrite."""
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
        med, best = statistics.median(times), min(times)
        rows.append(f"{name:<22} {n:>7} {label:<36} {med * 1e3:>9.1f} ms {med / n * 1e6:>8.1f} us/task"
                    f"   (best {best / n * 1e6:.1f})")
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


def bench_floor(name: str, collection: Any) -> list[str]:
    """What pickling each task (cloudpickle) and hashing the bytes costs per task."""
    import cloudpickle
    import xxhash

    dsk, _ = _graph(collection)
    n = len(dsk)
    nodes = list(dsk.values())
    t = time.perf_counter()
    for node in nodes:
        xxhash.xxh3_128_digest(cloudpickle.dumps(node, protocol=5))
    seconds = time.perf_counter() - t
    return [f"{name:<22} {n:>7} {'floor: cloudpickle + xxh3 per task':<36} {seconds * 1e3:>9.1f} ms "
            f"{seconds / n * 1e6:>8.1f} us/task"]


def bench_writes(n_tasks: int = 2000, repeat: int = 3) -> list[str]:
    """Distinct results on the threaded scheduler: uncached, fsync per object, deferred + barrier."""
    import dask.array as da

    from nbrewind.store import fsio

    counts = {"fsync": 0, "syncfs": 0}
    real_fsync, real_syncfs = os.fsync, fsio._syncfs

    def fsync(fd: int) -> None:
        counts["fsync"] += 1
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        counts["syncfs"] += 1
        real_syncfs(fd)

    rows = []
    times: dict[str, list[float]] = {"uncached": [], "fsync per object": [], "deferred + one barrier": []}
    syncs: dict[str, tuple[int, int]] = {}
    os.fsync, fsio._syncfs = fsync, syncfs  # type: ignore[assignment]
    try:
        for r in range(repeat):
            for mode in times:
                # Distinct chunks (and so distinct fingerprints) in every round and mode.
                offset = (r * 3 + list(times).index(mode)) * n_tasks * 10
                x = da.arange(offset, offset + n_tasks * 10, chunks=10, dtype="f8") + 1
                with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
                    cache = TaskCache(Path(tmp) / "store")
                    cache.objects
                    cache.objects.barrier()
                    if mode == "fsync per object":
                        cache.host = "another-machine"  # its workers fsync each write, as before
                    counts.update(fsync=0, syncfs=0)
                    t = time.perf_counter()
                    if mode == "uncached":
                        x.sum().compute(scheduler="threads")
                    else:
                        with intercepting(cache):
                            x.sum().compute(scheduler="threads")
                        cache.drain_log()
                        cache.objects.barrier()
                    times[mode].append(time.perf_counter() - t)
                    syncs[mode] = (counts["fsync"], counts["syncfs"])
    finally:
        os.fsync, fsio._syncfs = real_fsync, real_syncfs  # type: ignore[assignment]
    base = statistics.median(times["uncached"])
    for mode, values in times.items():
        med = statistics.median(values)
        rows.append(f"{'writes, threads':<22} {n_tasks:>7} {mode:<36} {med * 1e3:>9.1f} ms "
                    f"{(med - base) / n_tasks * 1e6:>8.1f} us/task over uncached   "
                    f"fsyncs {syncs[mode][0]}, syncfs {syncs[mode][1]}")
    return rows


NOTEBOOK_CELLS = [
    "import dask\nimport dask.array as da\ndask.config.set(scheduler='threads');",
    "x = da.ones(({chunks} * 10,), chunks=10) + 1",
    "total = float(x.sum(split_every=32).compute())\nprint(total)",
]
EDITED_COMPUTE = "total = float(x.sum(split_every=32).compute())\nprint('total:', total)"


def _write_notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))


def _newest_cells(store: Path) -> list[tuple[str | None, int | None, int | None]]:
    from nbrewind.store import Store

    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
    newest = runs[-1].session
    return [(r.decision, r.task_hits, r.task_misses) for r in runs if r.session == newest]


def bench_kernels(chunks: int, rounds: int) -> dict[str, Any]:
    """python3 vs audit on the compute cell, then the compute cell edited on the repeat kernel."""
    from nbrewind.run import run_notebook

    cells = [c.replace("{chunks}", str(chunks)) for c in NOTEBOOK_CELLS]
    per: dict[str, list[float]] = {"python3": [], "audit": [], "repeat_edited": [], "python3_edited": []}
    details: dict[str, Any] = {}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
            nb = Path(tmp) / "tasks100k.ipynb"
            store = Path(tmp) / "tasks100k.ipynb.nbrewind"
            _write_notebook(nb, cells)
            per["python3"].append(run_notebook(nb, kernel="python3", timeout=1800).cell_seconds[2])
            per["audit"].append(run_notebook(nb, kernel="audit", store=store, timeout=1800).cell_seconds[2])
            details["audit_cells"] = _newest_cells(store)
            _write_notebook(nb, [*cells[:2], EDITED_COMPUTE])
            per["repeat_edited"].append(run_notebook(nb, kernel="repeat", store=store, timeout=1800).cell_seconds[2])
            details["repeat_cells"] = _newest_cells(store)
            per["python3_edited"].append(run_notebook(nb, kernel="python3", timeout=1800).cell_seconds[2])
    med = {k: statistics.median(v) for k, v in per.items()}
    return {"chunks": chunks, "rounds": rounds, "seconds": per, "median": med,
            "audit_ratio": med["audit"] / med["python3"],
            "repeat_edited_ratio": med["repeat_edited"] / med["python3_edited"], **details}


_MILLION = """
import resource, sys, tempfile, time
from pathlib import Path
import dask.array as da
from benchmarks.bench_tasks import _graph
from nbrewind.tasks.cache import TaskCache
from nbrewind.tasks.rewrite import rewrite_graph
n = int(sys.argv[1])
x = (da.ones((n * 10,), chunks=10) + 1).sum(split_every=32)
t = time.perf_counter(); dsk, keys = _graph(x); build = time.perf_counter() - t
graph_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tempfile.TemporaryDirectory() as tmp:
    cache = TaskCache(Path(tmp) / "store"); cache.objects
    t = time.perf_counter(); done = rewrite_graph(cache, dsk, keys); seconds = time.perf_counter() - t
    rows = cache.drain_log()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"tasks": len(dsk), "materialize_s": build, "rewrite_s": seconds, "us_per_task": seconds / len(dsk) * 1e6,
                  "graph_peak_rss_mb": graph_rss / 1024, "peak_rss_mb": peak / 1024, "misses": done.misses, "rows": len(rows)}))
"""


_SIDE = """
import json, sys, tempfile, time
from pathlib import Path
import dask.array as da
import nbrewind
from benchmarks.bench_tasks import _graph
from nbrewind.tasks.cache import TaskCache
from nbrewind.tasks.rewrite import rewrite_graph
n, reps = int(sys.argv[1]), int(sys.argv[2])
dsk, keys = _graph((da.ones((n * 10,), chunks=10) + 1).sum(split_every=32))
fp, rw = [], []
with tempfile.TemporaryDirectory() as tmp:
    cache = TaskCache(Path(tmp) / "store"); cache.objects
    for _ in range(reps):
        t = time.perf_counter(); cache.fingerprinter.fingerprint_graph(dsk, keys); fp.append(time.perf_counter() - t)
        t = time.perf_counter(); rewrite_graph(cache, dsk, keys); rw.append(time.perf_counter() - t)
        cache.drain_log()
    fps = sorted(set(cache.fingerprinter.fingerprint_graph(dsk, keys).values()))
print(json.dumps({"src": nbrewind.__file__, "tasks": len(dsk), "fp": [t / len(dsk) * 1e6 for t in fp],
                  "rw": [t / len(dsk) * 1e6 for t in rw], "fingerprints": fps}))
"""


def bench_compare(other: Path, chunks: int, rounds: int = 4, reps: int = 3) -> list[str]:
    """This tree against ``other`` (e.g. an old commit's git worktree): fingerprint only and
    fingerprint + rewrite all-miss on the dask.array graph, each side in its own process
    (working directory and PYTHONPATH at its tree), alternating, medians of rounds x reps.
    Also checks that both give the same fingerprints (without settings: ``sys.path``, one
    of the settings, differs between trees)."""
    trees = {"before": other.resolve(), "after": Path(__file__).resolve().parents[1]}
    got: dict[str, dict[str, Any]] = {name: {"fp": [], "rw": [], "fps": None} for name in trees}
    for r in range(rounds):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            env = dict(os.environ, PYTHONPATH=str(trees[name]))
            out = subprocess.run([sys.executable, "-c", _SIDE, str(chunks), str(reps)], cwd=trees[name], env=env,
                                 capture_output=True, text=True, check=True)
            d = json.loads(out.stdout.strip().splitlines()[-1])
            if not d["src"].startswith(str(trees[name])):
                raise SystemExit(f"{name} imported nbrewind from {d['src']}")
            got[name]["fp"] += d["fp"]
            got[name]["rw"] += d["rw"]
            got[name]["fps"] = d["fingerprints"]
            tasks = d["tasks"]
    rows = []
    for name, v in got.items():
        for label, key in (("fingerprint only", "fp"), ("fingerprint + rewrite, all miss", "rw")):
            rows.append(f"{name + ' ' + trees[name].name:<22} {tasks:>7} {label:<36} median "
                        f"{statistics.median(v[key]):>6.1f} us/task (best {min(v[key]):.1f}, n={len(v[key])})")
    same = got["before"]["fps"] == got["after"]["fps"]
    rows.append(f"same fingerprints before and after: {same}")
    return rows


def bench_million(chunks: int = 1_000_000) -> dict[str, Any]:
    """Fingerprint + rewrite of a ~1M-task graph in a fresh process: time and peak RSS."""
    out = subprocess.run([sys.executable, "-c", "import json\n" + _MILLION, str(chunks)],
                         capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="chunks of the dask.array graphs (about tasks)")
    parser.add_argument("--rounds", type=int, default=3, help="kernel rounds")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--million", action="store_true", help="also the 1M-task memory and time check")
    parser.add_argument("--json", type=Path, help="write the kernel figures here")
    parser.add_argument("--compare", type=Path, metavar="TREE",
                        help="only: fingerprint + rewrite of this tree against TREE (an old commit's worktree)")
    args = parser.parse_args(argv)
    n = args.tasks
    if args.compare:
        print("\n".join(bench_compare(args.compare, n, rounds=max(args.rounds, 2))), flush=True)
        return
    array = (da.ones((n * 10,), chunks=10) + 1).sum(split_every=32)  # n fused chunk tasks + a tree
    frame = dd.from_pandas(pd.DataFrame({"x": range(80_000)}), npartitions=8000)
    frame = (frame.x + 1).sum()
    print(f"{'graph':<22} {'tasks':>7} {'what':<36} {'median':>12} {'per task':>16}")
    rows = bench_rewrite("dask.array", array) + bench_floor("dask.array", array)
    rows += bench_rewrite("dask.dataframe", frame) + bench_floor("dask.dataframe", frame)
    print("\n".join(rows), flush=True)
    print("\n".join(bench_writes()), flush=True)
    print("\n".join(bench_cluster()), flush=True)
    if args.million:
        print("1M-task graph:", json.dumps(bench_million()), flush=True)
    if not args.skip_kernels:
        result = bench_kernels(n, args.rounds)
        print(json.dumps(result, indent=1), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
