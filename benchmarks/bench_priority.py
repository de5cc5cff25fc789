"""Benchmark: how soon a requested task finishes, with and without a priority bump.

One worker with one thread, ``--tasks`` tasks of ``--duration`` seconds submitted
at once, then the task at ``--target`` is requested. Without a bump it waits for
the tasks ahead of it; with ``prioritize`` it should finish within about three
task durations. Both scheduler modes are measured: the default queueing
(``worker-saturation`` 1.1, tasks wait on the scheduler) and ``inf`` (every task
is sent to the worker at once, so the bump must reach the worker).

Run: ``python -m benchmarks.bench_priority [--repeat 5] [--processes]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measurement:
    """One configuration's timings, in seconds."""

    saturation: float
    bumped: bool
    request_latency: list[float]
    time_to_result: list[float]
    first_result: list[float]


def _sleep_task(i: int, duration: float) -> int:
    time.sleep(duration)
    return i


def run_once(
    saturation: float, bumped: bool, *, tasks: int, target: int, duration: float, processes: bool
) -> tuple[float, float, float]:
    """Return seconds spent in ``prioritize``, until the target's result, until task #0's.

    Task #0 is only awaited (first) when not bumping: its latency minus one task
    duration is the fixed cost of getting the graph to the worker and back.
    """
    import dask
    from distributed import Client, LocalCluster

    from nbrewind.tasks.priority import install, prioritize

    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=processes, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            install(client)
            futures = client.map(_sleep_task, range(tasks), duration=duration)
            client.wait_for_workers(1)
            start = time.perf_counter()
            if bumped:
                prioritize(futures[target])
            requested = time.perf_counter()
            first = float("nan")
            if not bumped:
                futures[0].result()
                first = time.perf_counter() - start
            futures[target].result()
            done = time.perf_counter()
            client.cancel(futures)
            _wait_idle(client)
    return requested - start, done - start, first


def _worker_task_count(dask_worker: Any) -> int:
    return len(dask_worker.state.tasks)


def _wait_idle(client: Any) -> None:
    """Let the cancelled task still running on the worker end before the cluster closes.

    Closing a worker mid-task cancels it and distributed logs a warning.
    """
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(client.run(_worker_task_count).values()):
        time.sleep(0.01)


def measure(repeat: int, tasks: int, target: int, duration: float, processes: bool) -> list[Measurement]:
    """Measure every (saturation, bumped) combination; unbumped runs once (it is slow and steady)."""
    results = []
    for saturation in (1.1, float("inf")):
        for bumped in (False, True):
            latencies, totals, firsts = [], [], []
            for _ in range(repeat if bumped else 1):
                latency, total, first = run_once(
                    saturation, bumped, tasks=tasks, target=target, duration=duration, processes=processes
                )
                latencies.append(latency)
                totals.append(total)
                firsts.append(first)
            results.append(Measurement(saturation, bumped, latencies, totals, firsts))
    return results


def format_table(results: list[Measurement], duration: float) -> str:
    """Render the measurements as a plain-text table."""
    lines = [
        f"{'saturation':>10} {'bump':>5} {'runs':>4} {'median s':>9} {'max s':>7} "
        f"{'median/D':>9} {'prioritize ms':>14} {'task #0 s':>10}",
    ]
    for m in results:
        median = statistics.median(m.time_to_result)
        lines.append(
            f"{m.saturation:>10} {'yes' if m.bumped else 'no':>5} {len(m.time_to_result):>4} "
            f"{median:>9.3f} {max(m.time_to_result):>7.3f} {median / duration:>9.1f} "
            f"{1000 * statistics.median(m.request_latency):>14.2f} "
            f"{statistics.median(m.first_result):>10.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per bumped configuration")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--target", type=int, default=150)
    parser.add_argument("--duration", type=float, default=0.02, help="seconds per task (D)")
    parser.add_argument("--processes", action="store_true", help="worker in its own process")
    args = parser.parse_args(argv)
    results = measure(args.repeat, args.tasks, args.target, args.duration, args.processes)
    print(
        f"{args.tasks} tasks x {args.duration * 1000:.0f} ms, 1 worker x 1 thread, "
        f"{'processes' if args.processes else 'threads'}; task #{args.target} requested"
    )
    print(format_table(results, args.duration))


if __name__ == "__main__":
    main()
