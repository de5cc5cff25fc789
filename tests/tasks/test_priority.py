"""Tests for nbrewind.tasks.priority: bumps on the scheduler, on workers, and automatic ones.

Cluster tests use a real ``LocalCluster`` with one worker and one thread.
``processes=False`` keeps start-up near 0.1 s; it does not weaken them, because
the scheduler, the worker state machine and the batched streams between them
are the same objects and messages as with worker processes (only the transport
is in-memory).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, Future, LocalCluster  # noqa: E402
from distributed.collections import HeapSet  # noqa: E402

from nbrewind.tasks import priority  # noqa: E402
from nbrewind.tasks.priority import (  # noqa: E402
    bump_head,
    enable_auto_priority,
    install,
    prioritize,
    reheap,
    strip_bump,
)

#: Duration of one task (D).
D = 0.02
N_TASKS = 200
TARGET = 150
#: Fixed cost on top of the tasks ahead: the scheduler ingesting the 200-task
#: graph, the bump request, compute-task and task-finished messages and the
#: result fetch. Measured as (latency of task #0) - D: 15-20 ms on a quiet
#: machine, and the 3-task-duration figure is measured by
#: benchmarks/bench_priority.py. Under a loaded CI machine the same path took up
#: to 0.27 s, so the tests allow 0.4 s: still over 6x below the unbumped wait of
#: ~150 D = 3 s that test_without_a_bump_the_request_waits_its_turn asserts.
SLACK = 0.4
DEFAULT_SATURATION = 1.1
SATURATIONS = [
    pytest.param(DEFAULT_SATURATION, id="queued-on-scheduler"),
    pytest.param(float("inf"), id="all-on-worker"),
]


def started_at(i: int) -> float:
    """Sleep one task duration; return when the task started (clock shared in-process)."""
    start = time.perf_counter()
    time.sleep(D)
    return start


def sleep_inc(x: float) -> float:
    time.sleep(D)
    return x + 1


def _worker_task_count(dask_worker: Any) -> int:
    return len(dask_worker.state.tasks)


@contextlib.contextmanager
def one_thread_cluster(saturation: float = DEFAULT_SATURATION) -> Iterator[Client]:
    """A 1 worker x 1 thread cluster whose leftover work is cancelled before it closes."""
    # dashboard ":0": another cluster may hold 8787, and distributed leaks a socket
    # (a ResourceWarning, an error here) when it retries on a taken port.
    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
        with (
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            install(client)  # as the kernels do at start, so timings exclude registration
            try:
                yield client
            finally:
                client.cancel([Future(key, client) for key in list(client.futures)])
                # A task cut off by the worker closing logs a warning: let it end first.
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and any(client.run(_worker_task_count).values()):
                    time.sleep(0.01)


def scheduler_priorities(client: Client, keys: list[Any]) -> list[tuple[float, ...]]:
    def read(dask_scheduler: Any) -> list[tuple[float, ...]]:
        return [tuple(dask_scheduler.tasks[k].priority) for k in keys]

    return client.run_on_scheduler(read)


def time_request(future: Future, bump: bool) -> float:
    start = time.perf_counter()
    if bump:
        assert prioritize(future) == 1
    future.result()
    return time.perf_counter() - start


# -- pure helpers --------------------------------------------------------------


def test_bumped_priorities_sort_first_and_later_bumps_win() -> None:
    ordinary = [(0, 1, 5), (-(10**9), 0, 0), (3, 7, 1), (0.0, 2.0)]
    first = [bump_head(1) + p for p in ordinary]
    second = [bump_head(2) + p for p in ordinary]
    assert max(second) < min(first)
    assert max(first) < min(ordinary)
    # within one bump the original order is kept
    assert sorted(first) == [bump_head(1) + p for p in sorted(ordinary)]


def test_strip_bump_recovers_the_original_priority() -> None:
    original = (0, 3, 17)
    assert strip_bump(bump_head(4) + original) == original
    assert strip_bump(bump_head(5) + strip_bump(bump_head(4) + original)) == original
    assert strip_bump(original) == original


class _Item:
    def __init__(self, name: str, priority: tuple[float, ...]) -> None:
        self.name = name
        self.priority = priority


def test_reheap_makes_a_heapset_follow_changed_priorities() -> None:
    heap: HeapSet[_Item] = HeapSet(key=lambda item: item.priority)
    items = [_Item(str(i), (0, i)) for i in range(10)]
    for item in items:
        heap.add(item)
    items[7].priority = bump_head(1) + items[7].priority
    assert heap.peek() is items[0]  # the stale order a plain HeapSet keeps
    reheap(heap)
    order = [heap.pop().name for _ in range(len(items))]
    assert order == ["7", "0", "1", "2", "3", "4", "5", "6", "8", "9"]


def test_importing_the_module_imports_no_dask() -> None:
    code = "import sys, nbrewind.tasks.priority; print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- bumps on a real cluster -----------------------------------------------------

needs_cluster = pytest.mark.cluster


@needs_cluster
def test_prioritize_rejects_plain_values() -> None:
    with one_thread_cluster() as client, pytest.raises(TypeError, match="cannot prioritize int"):
        prioritize([client.submit(sleep_inc, 1), 3], client)


@needs_cluster
@pytest.mark.parametrize("saturation", SATURATIONS)
def test_requested_task_jumps_the_queue(saturation: float) -> None:
    with one_thread_cluster(saturation) as client:
        futures = client.map(started_at, range(N_TASKS))
        elapsed = time_request(futures[TARGET], bump=True)
        assert elapsed < 3 * D + SLACK, f"{elapsed / D:.1f} task durations"


@needs_cluster
@pytest.mark.parametrize("saturation", SATURATIONS)
def test_without_a_bump_the_request_waits_its_turn(saturation: float) -> None:
    with one_thread_cluster(saturation) as client:
        futures = client.map(started_at, range(N_TASKS))
        elapsed = time_request(futures[TARGET], bump=False)
        assert elapsed > 100 * D, f"{elapsed / D:.1f} task durations"


@needs_cluster
def test_a_later_bump_wins_over_an_earlier_one() -> None:
    with one_thread_cluster() as client:
        futures = client.map(started_at, range(N_TASKS))
        assert prioritize(futures[50]) == 1
        assert prioritize(futures[150]) == 1
        p50, p150, p10 = scheduler_priorities(client, [futures[i].key for i in (50, 150, 10)])
        assert p150 < p50 < p10
        start150, start50 = futures[150].result(), futures[50].result()
        assert start150 < start50
        assert not futures[20].done()  # both ran ahead of the unbumped tasks


@needs_cluster
def test_bumping_a_key_bumps_the_chain_it_waits_on() -> None:
    # Every task is sent to the worker at once, so the chain's first link sits in
    # the worker's ready heap behind 100 others and the rest wait on the scheduler.
    with one_thread_cluster(float("inf")) as client:
        noise = client.map(started_at, range(100))  # noqa: F841 - keeps the worker busy

        def chain(length: int) -> list[Future]:
            links = [client.submit(sleep_inc, 0, priority=-1, pure=False)]
            for _ in range(length - 1):
                links.append(client.submit(sleep_inc, links[-1], priority=-1, pure=False))
            return links

        bumped, control = chain(5), chain(5)
        start = time.perf_counter()
        assert prioritize(bumped[-1]) == 5
        assert bumped[-1].result() == 5
        elapsed = time.perf_counter() - start
        # While a finished link's successor travels from the scheduler, the freed
        # thread starts a noise task: up to 2 D per link, plus the one running now.
        assert elapsed < (2 * 5 + 1) * D + SLACK, f"{elapsed / D:.1f} task durations"
        assert all(p[0] == float("-inf") for p in scheduler_priorities(client, [f.key for f in bumped]))
        assert not control[0].done()


@needs_cluster
def test_bumping_a_slice_of_a_persisted_collection_bumps_only_what_it_needs() -> None:
    da = pytest.importorskip("dask.array")
    with one_thread_cluster() as client:
        persisted = da.zeros(N_TASKS, chunks=1).map_blocks(_sleep_block, dtype=float).persist()
        piece = persisted[TARGET : TARGET + 1]
        start = time.perf_counter()
        assert prioritize(piece) == 1
        assert piece.compute().tolist() == [1.0]
        elapsed = time.perf_counter() - start
        assert elapsed < 3 * D + SLACK, f"{elapsed / D:.1f} task durations"


def _sleep_block(block: Any) -> Any:
    time.sleep(D)
    return block + 1


@needs_cluster
def test_prioritizing_finished_work_changes_nothing() -> None:
    with one_thread_cluster() as client:
        future = client.submit(sleep_inc, 1)
        future.result()
        assert prioritize(future) == 0


# -- automatic bumps -------------------------------------------------------------


@needs_cluster
@pytest.mark.parametrize("saturation", SATURATIONS)
def test_auto_priority_bumps_a_future_on_result(saturation: float) -> None:
    with one_thread_cluster(saturation) as client, enable_auto_priority(client):
        futures = client.map(started_at, range(N_TASKS))
        elapsed = time_request(futures[TARGET], bump=False)
        assert elapsed < 3 * D + SLACK, f"{elapsed / D:.1f} task durations"


@needs_cluster
def test_auto_priority_bumps_a_computed_slice_of_a_persisted_collection() -> None:
    da = pytest.importorskip("dask.array")
    with one_thread_cluster(float("inf")) as client, enable_auto_priority(client):
        persisted = da.zeros(N_TASKS, chunks=1).map_blocks(_sleep_block, dtype=float).persist()
        start = time.perf_counter()
        assert persisted[TARGET : TARGET + 1].compute().tolist() == [1.0]
        elapsed = time.perf_counter() - start
        assert elapsed < 3 * D + SLACK, f"{elapsed / D:.1f} task durations"


@needs_cluster
def test_auto_priority_restores_what_it_patched() -> None:
    original_result, original_gather = Future.result, Client.gather
    with one_thread_cluster() as client:
        with enable_auto_priority(client):
            with enable_auto_priority(client):
                assert Future.result is not original_result
            assert Future.result is not original_result  # the outer block is still active
            assert client.submit(sleep_inc, 1).result() == 2
        assert Future.result is original_result
        assert Client.gather is original_gather
        with pytest.raises(RuntimeError, match="boom"), enable_auto_priority(client):
            raise RuntimeError("boom")
        assert Future.result is original_result
        assert Client.gather is original_gather
        assert "result" not in vars(Future) or vars(Future)["result"] is original_result
        assert not priority._auto_clients
