"""Benchmark: a shuffle-like aggregation over 20 inputs, with and without ``nbrewind.update_task``.

A LocalCluster of two Nanny worker processes (one thread each) makes ``--inputs``
arrays of ``--input-mb`` MB (each costs ``--produce-ms`` ms of upstream work, so
they arrive over time, as in a shuffle) and one task aggregates them into a
histogram of ``--bins`` bins, one input at a time. Three ways to write that task:

- ``stock``: plain Dask, every input an argument: the task starts once all inputs
  exist, and all of them are gathered onto its worker first;
- ``keep``: inputs passed as handles and fetched one by one; after each one the
  task publishes its histogram and names a replacement resuming from it, but keeps
  the inputs it consumed (``update_task(publish=..., replacement=...)``);
- ``release``: the same, also releasing each input once consumed
  (``update_task(..., release=[input])``).

Each way runs ``--runs`` times without a loss, sampling every 10 ms the bytes of
keys in memory on the cluster (the scheduler's count) and how far each worker's RSS
grew above its level before the run, and ``--runs`` times with the aggregating task's worker killed
(``os._exit``) after it consumed ``--kill-at`` inputs, counting (from files the
tasks append to) the inputs consumed again and the inputs recomputed.

Run: ``python -m benchmarks.bench_update_task [--runs 3] [--inputs 20] [--input-mb 40] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MODES = ("stock", "keep", "release")

TASK = '''
import os, time
import numpy as np
import nbrewind
from distributed import get_worker
from nbrewind.tasks.update import fetch, ref

def log(folder, name, line):
    with open(os.path.join(folder, name), "a") as f:
        f.write(f"{line}\\n")

def make_input(i, n, produce_s, folder):
    time.sleep(produce_s)  # the upstream work that makes this partition
    log(folder, "computed.log", i)
    return np.random.default_rng(i).random(n)

def histogram(part, bins):
    return np.bincount((part * bins).astype(np.int64), minlength=bins).astype(np.float64)

def maybe_die(folder, consumed, kill_at):
    marker = os.path.join(folder, "killed")
    if consumed == kill_at and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)

def aggregate_stock(bins, folder, kill_at, *parts):
    acc = np.zeros(bins)
    for consumed, part in enumerate(parts, 1):
        acc += histogram(part, bins)
        log(folder, "consumed.log", consumed)
        maybe_die(folder, consumed, kill_at)
    return acc

def aggregate(inputs, bins, folder, kill_at, release, consumed=0, acc=None):
    key = get_worker().get_current_task()
    acc = np.zeros(bins) if acc is None else acc
    for pos, h in enumerate(inputs):
        part = fetch(h)
        acc = acc + histogram(part, bins)
        del part
        consumed += 1
        log(folder, "consumed.log", consumed)
        maybe_die(folder, consumed, kill_at)
        piece = f"{key}-acc-{consumed}"
        previous = [f"{key}-acc-{consumed - 1}"] if consumed > 1 else []
        nbrewind.update_task(
            publish={piece: acc},
            release=([h] if release else []) + previous,
            replacement=(aggregate, inputs[pos + 1:], bins, folder, kill_at, release, consumed, ref(piece)),
        )
    return acc
'''


@dataclass(frozen=True)
class Run:
    """One run's outcome."""

    mode: str
    killed: bool
    wall: float
    peak_keys_mb: float
    peak_rss_mb: float
    consumed_again: int
    recomputed: int


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}  # functions travel to the workers by value
    exec(compile(TASK, "<bench-update>", "exec"), ns)
    return ns


class Sampler:
    """Peak bytes of keys in memory (scheduler's count) and peak growth of a worker's RSS, every 10 ms."""

    def __init__(self, scheduler: Any, pids: list[int]) -> None:
        import psutil

        self.scheduler = scheduler
        self.processes = [psutil.Process(p) for p in pids]
        self.baseline = {p.pid: p.memory_info().rss for p in self.processes}
        self.peak_keys = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_keys = max(self.peak_keys, sum(ws.nbytes for ws in list(self.scheduler.workers.values())))
            except RuntimeError:  # the dict changed size while read: sample again
                pass
            for p in self.processes:
                try:
                    self.peak_rss = max(self.peak_rss, p.memory_info().rss - self.baseline[p.pid])
                except Exception:  # a killed worker
                    pass
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _worker_pids(client: Any) -> list[int]:
    """The worker processes' pids, once both workers answer (a restarted one may still be closing)."""
    for _ in range(20):
        client.wait_for_workers(2)
        try:
            return list(client.run(os.getpid).values())
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the workers did not come back")


def run_once(client: Any, cluster: Any, ns: dict[str, Any], mode: str, *, killed: bool, inputs: int,
             input_mb: float, produce_s: float, bins: int, kill_at: int, tag: str) -> Run:
    """One aggregation in a fresh folder (the update plugins are installed)."""
    from nbrewind.tasks import update

    n = int(input_mb * 2**20 / 8)
    with tempfile.TemporaryDirectory(prefix="nbrewind-bench-update-") as tmp:
        folder = Path(tmp)
        pids = _worker_pids(client)
        kill = kill_at if killed else -1
        start = time.perf_counter()
        with Sampler(cluster.scheduler, pids) as sampler:
            parts = client.map(ns["make_input"], range(inputs), n=n, produce_s=produce_s, folder=tmp,
                               key=[f"part-{tag}-{i}" for i in range(inputs)])
            if mode == "stock":
                agg = client.submit(ns["aggregate_stock"], bins, tmp, kill, *parts, key=f"agg-{tag}", priority=10)
            else:
                agg = client.submit(ns["aggregate"], update.handles(parts), bins, tmp, kill, mode == "release",
                                    key=f"agg-{tag}", priority=10)
            del parts
            result = agg.result(timeout=600)
            wall = time.perf_counter() - start
            del agg
        consumed = (folder / "consumed.log").read_text().split()
        computed = (folder / "computed.log").read_text().split()
    assert result.sum() == inputs * n, (result.sum(), inputs * n)
    return Run(mode, killed, wall, sampler.peak_keys / 2**20, sampler.peak_rss / 2**20,
               len(consumed) - inputs, len(computed) - inputs)


def measure(runs: int, modes: list[str], **sizes: Any) -> list[Run]:
    """Every mode, ``runs`` times without a loss and ``runs`` times with one, alternating modes."""
    from distributed import Client, LocalCluster

    ns = _namespace()
    out = []
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        tempfile.TemporaryDirectory(prefix="nbrewind-bench-update-store-") as store,
    ):
        from nbrewind.tasks import update

        update.install(client, store=store)
        for r in range(runs):
            for killed in (False, True):
                for mode in modes:
                    tag = f"{mode}-{int(killed)}-{r}"
                    out.append(run_once(client, cluster, ns, mode, killed=killed, tag=tag, **sizes))
    return out


def medians(runs: list[Run]) -> list[dict[str, Any]]:
    """Median of every figure per (mode, killed)."""
    table = []
    for killed in (False, True):
        for mode in MODES:
            rs = [r for r in runs if r.mode == mode and r.killed == killed]
            if not rs:
                continue
            row: dict[str, Any] = {"mode": mode, "killed": killed, "runs": len(rs)}
            for name in ("wall", "peak_keys_mb", "peak_rss_mb", "consumed_again", "recomputed"):
                row[name] = statistics.median(getattr(r, name) for r in rs)
            table.append(row)
    return table


def format_table(table: list[dict[str, Any]]) -> str:
    """Render the medians as a plain-text table."""
    lines = [f"{'mode':>8} {'worker lost':>11} {'runs':>4} {'peak keys MB':>12} {'peak RSS+ MB':>12} "
             f"{'consumed again':>14} {'recomputed':>10} {'wall s':>7}"]
    for r in table:
        lines.append(f"{r['mode']:>8} {'yes' if r['killed'] else 'no':>11} {r['runs']:>4} {r['peak_keys_mb']:>12.0f} "
                     f"{r['peak_rss_mb']:>12.0f} {r['consumed_again']:>14g} {r['recomputed']:>10g} {r['wall']:>7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the benchmark and print the table of medians."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per mode, with and without a worker loss")
    parser.add_argument("--inputs", type=int, default=20)
    parser.add_argument("--input-mb", type=float, default=40.0)
    parser.add_argument("--produce-ms", type=float, default=300.0, help="upstream work per input")
    parser.add_argument("--bins", type=int, default=100_000, help="histogram bins (the aggregate's size)")
    parser.add_argument("--kill-at", type=int, default=13, help="the first attempt dies after this many inputs")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path, help="also write every run and the medians here")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    runs = measure(args.runs, modes, inputs=args.inputs, input_mb=args.input_mb, produce_s=args.produce_ms / 1000,
                   bins=args.bins, kill_at=args.kill_at)
    table = medians(runs)
    print(f"{args.inputs} inputs x {args.input_mb:g} MB ({args.produce_ms:g} ms each to make), histogram of "
          f"{args.bins} bins; 2 Nanny workers x 1 thread; worker lost after input {args.kill_at}; medians")
    print(format_table(table))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "runs": [asdict(r) for r in runs], "medians": table}, indent=1))


if __name__ == "__main__":
    main()
