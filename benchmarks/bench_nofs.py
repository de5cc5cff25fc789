"""Workers without the store: what the relay through the kernel costs per task, against
workers that read and write the store directly.

Run as root (it needs ``unshare -m``): ``python -m benchmarks.bench_nofs [--rounds 5]
[--small 200] [--large 6] [--mb 32]``. Not a test; prints a table.

One cluster serves every figure: a scheduler in this process and two ``dask worker``
processes (one thread each) in their own mount namespace, with an empty tmpfs over
the folder that holds the "hidden" stores. A store elsewhere is one the workers see
(the shared mode); a store in that folder is one they cannot see (the relay mode).

Two graphs, each submitted with ``Client.map`` and waited for on the cluster (no
result is gathered to this process, so the figures are the cache's work, not the
transfer of outputs):

- ``small``: ``--small`` tasks returning an int;
- ``large``: ``--large`` tasks returning a ``--mb`` MB float64 array each.

For each: uncached (no interception), cached cold (every task a miss: run + store)
and cached warm (every task a hit: load), with a shared store and with a hidden one;
a new store each round; the timed span ends when the task log has been drained (for
the relay, when the kernel has written what the workers sent). Beside them, the
other way to serve hits without a shared filesystem: read every entry in this
process and ``Client.scatter`` the values to the workers. Medians of ``--rounds``.

Then in-task checkpoints: the mean time of one ``nbrewind.checkpoint`` call inside a
task (``--checkpoints`` per task, two tasks at once), a small dict and a
``--checkpoint-mb`` MB array with one chunk changed per call, shared against relay.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nbrewind.tasks.cache import TaskCache, load_entry
from nbrewind.tasks.intercept import intercepting

REPO = Path(__file__).resolve().parents[1]


def small(i: int) -> int:
    """A small task."""
    return i * 2 + 1


def large(i: int, mb: int) -> Any:
    """A task returning an ``mb`` MB float64 array."""
    import numpy as np

    return np.random.default_rng(i).random(mb * (1 << 20) // 8)


def checkpointing(i: int, count: int, mb: int) -> float:
    """A task that writes ``count`` checkpoints (a small dict, or an ``mb`` MB array with one
    changed chunk each time); returns the mean seconds one ``nbrewind.checkpoint`` took."""
    import numpy as np

    import nbrewind

    array = np.random.default_rng(i).random(mb * (1 << 20) // 8) if mb else None
    spent = 0.0
    for step in range(count):
        if array is not None:
            array[(step * 262144) % array.size] += 1.0  # one 2 MiB chunk changes
        state = array if array is not None else {"step": step, "i": i}
        started = time.perf_counter()
        if not nbrewind.checkpoint(state):
            raise RuntimeError("a checkpoint was not written")
        spent += time.perf_counter() - started
    return spent / count


@contextmanager
def hidden_cluster(hidden: Path, workers: int = 2) -> Iterator[Any]:
    """A client of a scheduler in this process and ``workers`` worker processes that see an
    empty tmpfs at ``hidden``."""
    from distributed import Client, LocalCluster

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise SystemExit("bench_nofs needs root and `unshare` (it hides a folder from the workers)")
    dask_cli = Path(sys.executable).with_name("dask")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as cluster, Client(cluster) as client:
        procs = []
        try:
            for i in range(workers):
                script = (f"mount -t tmpfs nbrewind-bench '{hidden}' && exec '{dask_cli}' worker "
                          f"{cluster.scheduler_address} --nthreads 1 --no-nanny --no-dashboard --name bench-{i}")
                procs.append(subprocess.Popen(["unshare", "-m", "sh", "-c", script], env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            client.wait_for_workers(workers, timeout=60)
            yield client
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _run(client: Any, submit: Callable[[str], list[Any]], tag: str, cache: TaskCache | None) -> tuple[float, list[str]]:
    """Seconds until the graph ran and its task log was drained, and the result digests logged."""
    from distributed import wait

    started = time.perf_counter()
    futures = submit(tag)
    wait(futures)
    rows = cache.drain_log() if cache is not None else []
    seconds = time.perf_counter() - started
    client.cancel(futures)
    return seconds, [r.result_digest for r in rows if r.result_digest]


def identity(x: Any) -> Any:
    """The task a hit would become once its value was scattered."""
    return x


def _scatter_hits(client: Any, cache: TaskCache, digests: list[str], tag: str) -> float:
    """Hits served the other way: entries read here, values scattered to the workers, one
    task per hit taking its scattered value (what the graph would then run)."""
    from distributed import wait

    started = time.perf_counter()
    values = [load_entry(cache.objects, d) for d in digests]
    scattered = client.scatter(values, hash=False)
    futures = client.map(identity, scattered, key=[f"alias-{tag}-{i}" for i in range(len(scattered))])
    wait(futures)
    seconds = time.perf_counter() - started
    client.cancel(futures + scattered)
    return seconds


def bench_graph(client: Any, name: str, n: int, submit: Callable[[str], list[Any]], base: Path,
                rounds: int) -> list[str]:
    """Medians of every mode for one graph, as table rows."""
    times: dict[str, list[float]] = {k: [] for k in (
        "uncached", "shared miss", "shared hit", "relay miss", "relay hit", "scatter hit")}
    for r in range(rounds):
        times["uncached"].append(_run(client, submit, f"u{r}", None)[0])
        for mode, folder in (("shared", base / "visible"), ("relay", base / "hidden")):
            cache = TaskCache(folder / f"{name}-{r}.nbrewind")
            with intercepting(cache):
                seconds, digests = _run(client, submit, f"{mode}-miss-{r}", cache)
                times[f"{mode} miss"].append(seconds)
                times[f"{mode} hit"].append(_run(client, submit, f"{mode}-hit-{r}", cache)[0])
            if len(digests) != n:
                raise SystemExit(f"{mode}: {len(digests)} of {n} results stored")
            if mode == "relay":
                relay = cache.relay
                if relay is None or relay.stats.stored != n or relay.stats.served != n or relay.stats.failed:
                    raise SystemExit(f"the relay did not serve every task: {relay}")
                times["scatter hit"].append(_scatter_hits(client, cache, digests, f"{r}"))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for k, v in med.items():
        ratio = ""
        if k.startswith("relay"):
            shared = med["shared" + k[5:]]
            ratio = f"{v / shared:5.2f}x shared, {(v - shared) / n * 1e3:+8.2f} ms/task"
        elif k == "scatter hit":
            ratio = f"{v / med['shared hit']:5.2f}x shared, {v / med['relay hit']:5.2f}x relay"
        rows.append(f"{name:<8} {n:>5} {k:<12} {v * 1e3:>9.1f} ms {v / n * 1e3:>9.3f} ms/task  {ratio}")
    return rows


def bench_checkpoints(client: Any, base: Path, rounds: int, count: int, mb: int) -> list[str]:
    """Mean seconds per in-task checkpoint, a small state and an ``mb`` MB array, shared
    against relay (two tasks at once, one per worker; medians over rounds)."""
    rows = []
    for label, size in (("small", 0), (f"{mb} MB", mb)):
        per: dict[str, list[float]] = {"shared": [], "relay": []}
        for r in range(rounds):
            for mode, folder in (("shared", base / "visible"), ("relay", base / "hidden")):
                cache = TaskCache(folder / f"ckpt-{size}-{r}.nbrewind")
                with intercepting(cache):
                    futures = client.map(checkpointing, range(2), [count] * 2, [size] * 2,
                                         key=[f"ckpt-{mode}-{size}-{r}-{i}" for i in range(2)])
                    per[mode] += client.gather(futures)
                    client.cancel(futures)
                    cache.drain_log()
                if mode == "relay" and (cache.relay is None or cache.relay.stats.stored < 2 * count):
                    raise SystemExit(f"the checkpoints did not go through the kernel: {cache.relay}")
        shared, relay = statistics.median(per["shared"]), statistics.median(per["relay"])
        rows.append(f"checkpoint {label:<8} shared {shared * 1e3:8.2f} ms  relay {relay * 1e3:8.2f} ms  "
                    f"{relay / shared:5.2f}x, {(relay - shared) * 1e3:+8.2f} ms per checkpoint")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=200, help="tasks of the small graph")
    parser.add_argument("--large", type=int, default=6, help="tasks of the large graph")
    parser.add_argument("--mb", type=int, default=32, help="MB each large task returns")
    parser.add_argument("--checkpoints", type=int, default=20, help="checkpoints per task (0: none measured)")
    parser.add_argument("--checkpoint-mb", type=int, default=8, help="MB of the large checkpointed state")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "hidden").mkdir()
        (base / "visible").mkdir()
        os.environ.setdefault("NBREWIND_TRUST_DB", str(base / "trust.db"))  # sign with a throwaway secret
        with hidden_cluster(base / "hidden") as client:
            def submit_small(tag: str) -> list[Any]:
                return client.map(small, range(args.small), key=[f"small-{tag}-{i}" for i in range(args.small)])

            def submit_large(tag: str) -> list[Any]:
                return client.map(large, range(args.large), [args.mb] * args.large,
                                  key=[f"large-{tag}-{i}" for i in range(args.large)])

            print(f"{'graph':<8} {'tasks':>5} {'mode':<12} {'median':>12} {'per task':>15}", flush=True)
            for name, n, submit in (("small", args.small, submit_small), ("large", args.large, submit_large)):
                for row in bench_graph(client, name, n, submit, base, args.rounds):
                    print(row, flush=True)
            if args.checkpoints:
                for row in bench_checkpoints(client, base, args.rounds, args.checkpoints, args.checkpoint_mb):
                    print(row, flush=True)


if __name__ == "__main__":
    main()
