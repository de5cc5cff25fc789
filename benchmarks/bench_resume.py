"""Benchmark: work redone after a worker is killed mid-task, with and without checkpoints.

A LocalCluster of two Nanny worker processes (one thread each) runs one task of
``--steps`` steps of ``--step-ms`` ms under NBRewind's task cache. On its first
attempt the task kills its worker (``os._exit``) after ``--kill-at`` steps; the
scheduler retries it on a worker. Without checkpoints the retry starts over;
with ``nbrewind.checkpoint`` every K steps it resumes from the last checkpoint,
so at most K - 1 steps are redone. Every executed step is appended to a log file
(which survives the dead process), and every checkpoint write is timed inside
the task. ``--state-mb`` adds a NumPy array to the checkpointed state (one
element changes per step) to show the cost of larger state.

Run: ``python -m benchmarks.bench_resume [--steps 200] [--kill-at 145] [--state-mb 0 8]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK = '''
import os, time
import nbrewind

def long_task(steps, every, step_s, kill_at, folder, state_bytes):
    import numpy as np
    start = {"i": 0, "total": 0, "array": np.zeros(state_bytes // 8)}
    state = nbrewind.resume(start) if every else start
    i, total, array = state["i"], state["total"], state["array"]
    while i < steps:
        with open(os.path.join(folder, "steps.log"), "a") as log:
            log.write(f"{i}\\n")
        time.sleep(step_s)
        total += i * i
        if len(array):
            array[i % len(array)] += 1
        i += 1
        if every and i % every == 0:
            t = time.perf_counter()
            nbrewind.checkpoint({"i": i, "total": total, "array": array})
            with open(os.path.join(folder, "checkpoints.log"), "a") as log:
                log.write(f"{time.perf_counter() - t}\\n")
        marker = os.path.join(folder, "killed")
        if i == kill_at and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
    return total
'''


@dataclass(frozen=True)
class Run:
    """One configuration's outcome."""

    every: int
    state_mb: float
    executed: int
    redone: int
    wall: float
    checkpoint_ms: list[float]


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}  # functions travel to the workers by value
    exec(compile(TASK, "<bench>", "exec"), ns)
    return ns


def run_once(client: Any, every: int, *, steps: int, step_s: float, kill_at: int, state_mb: float) -> Run:
    """Run the task once in a fresh store and folder; the first attempt kills its worker."""
    from nbrewind.tasks.cache import TaskCache
    from nbrewind.tasks.intercept import intercepting

    ns = _namespace()
    with tempfile.TemporaryDirectory(prefix="nbrewind-bench-resume-") as tmp:
        folder = Path(tmp) / "work"
        folder.mkdir()
        client.wait_for_workers(2)
        with intercepting(TaskCache(Path(tmp) / "store.nbrewind")):
            start = time.perf_counter()
            future = client.submit(ns["long_task"], steps, every, step_s, kill_at, str(folder),
                                   int(state_mb * 2**20))
            result = future.result(timeout=600)
            wall = time.perf_counter() - start
            del future
        assert result == sum(i * i for i in range(steps)), result
        executed = len((folder / "steps.log").read_text().split())
        log = folder / "checkpoints.log"
        writes = [1000 * float(x) for x in log.read_text().split()] if log.exists() else []
    return Run(every, state_mb, executed, executed - steps, wall, writes)


def measure(steps: int, step_s: float, kill_at: int, intervals: list[int], state_mbs: list[float]) -> list[Run]:
    """Every (interval, state size) combination on one two-worker cluster (0 = no checkpoints)."""
    from distributed import Client, LocalCluster

    runs = []
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        for state_mb in state_mbs:
            for every in intervals:
                runs.append(run_once(client, every, steps=steps, step_s=step_s, kill_at=kill_at, state_mb=state_mb))
    return runs


def format_table(runs: list[Run], steps: int, step_s: float) -> str:
    """Render the runs as a plain-text table."""
    lines = [f"{'checkpoint every':>16} {'state MB':>8} {'executed':>8} {'redone':>6} {'redone s':>8} "
             f"{'wall s':>7} {'writes':>6} {'write ms (median/max)':>22}"]
    for r in runs:
        every = f"{r.every} steps" if r.every else "never"
        cost = (f"{statistics.median(r.checkpoint_ms):.2f} / {max(r.checkpoint_ms):.2f}"
                if r.checkpoint_ms else "-")
        lines.append(f"{every:>16} {r.state_mb:>8g} {r.executed:>8} {r.redone:>6} {r.redone * step_s:>8.2f} "
                     f"{r.wall:>7.2f} {len(r.checkpoint_ms):>6} {cost:>22}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=10.0, help="duration of one step")
    parser.add_argument("--kill-at", type=int, default=145, help="the first attempt dies after this many steps")
    parser.add_argument("--every", type=int, nargs="+", default=[0, 50, 10, 1],
                        help="checkpoint intervals in steps (0: no checkpoints)")
    parser.add_argument("--state-mb", type=float, nargs="+", default=[0.0, 8.0],
                        help="size of the array in the checkpointed state")
    args = parser.parse_args(argv)
    step_s = args.step_ms / 1000
    runs = measure(args.steps, step_s, args.kill_at, args.every, args.state_mb)
    print(f"1 task x {args.steps} steps x {args.step_ms:g} ms; worker killed after step {args.kill_at} "
          f"on the first attempt; 2 Nanny workers x 1 thread")
    print(format_table(runs, args.steps, step_s))


if __name__ == "__main__":
    main()
