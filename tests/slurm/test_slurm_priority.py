"""``nbrewind.prioritize`` on a ``SLURMCluster``: the requested piece of a running
computation gets done before the rest.

Two one-core jobs, so two workers of one thread each. The tasks wait at the start
for a gate (a file the test creates) and append their label to a shared file as
they finish, so the file holds the order the workers chose; the assertions are on
that order, never on durations. The gate opens only once the scheduler, and the
worker holding the task, show the bump. With the gate closed each worker runs one
task and holds one more (distributed's worker-saturation 1.1), so on the worker
that runs it a bumped task finishes at most after those two; unbumped, it waits for
the tasks before it. The order is read per worker (each line names its process):
once the gate opens one worker may finish any number of tasks while the other,
descheduled on a loaded machine, still has its first one to finish.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_tools import (
    WORKER_TIMEOUT,
    by_value,
    cancel_jobs,
    cluster_options,
    unique_job_name,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

N_TASKS = 60
TARGET = 50
#: Places on its worker a bumped task may finish after: the running task and the held one.
FIRST_PLACES = 3

TASKS = '''
import os, time

def gated(i, gate, record):
    deadline = time.monotonic() + 300
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError("the gate never opened")
        time.sleep(0.01)
    with open(record, "a") as f:
        f.write(f"{i} {os.getpid()}\\n")
    return i

def gated_block(block, gate, record, block_id=None):
    gated(block_id[0], gate, record)
    return block + 1
'''


class Round:
    """One gate and one finishing record, in their own files."""

    def __init__(self, folder: Path, name: str) -> None:
        self.gate = str(folder / f"{name}.open")
        self.record = str(folder / f"{name}.order")

    def open(self) -> None:
        Path(self.gate).touch()

    def _lines(self) -> list[tuple[int, str]]:
        return [(int(i), pid) for i, pid in (line.split() for line in Path(self.record).read_text().splitlines())]

    def order(self) -> list[int]:
        """Labels in the order they finished, over both workers."""
        return [i for i, _ in self._lines()]

    def place(self, label: int) -> int:
        return self.order().index(label)

    def place_on_its_worker(self, label: int) -> tuple[int, list[int]]:
        """Where ``label`` finished among the tasks of the worker that ran it, and that order."""
        lines = self._lines()
        pid = dict(lines)[label]
        mine = [i for i, p in lines if p == pid]
        return mine.index(label), mine


def _bump_shows(client: Any, key: Hashable) -> bool:
    """Whether the scheduler shows ``key`` bumped and, once it sent it to a worker, that
    worker too (a worker that does not hold it yet would be no evidence)."""

    def on_scheduler(dask_scheduler: Any) -> tuple[bool, str]:
        ts = dask_scheduler.tasks.get(key)
        bumped = ts is not None and ts.priority is not None and ts.priority[0] == float("-inf")
        sent_to = ts.processing_on.address if bumped and ts.processing_on is not None else ""
        return bumped, sent_to

    def on_worker(dask_worker: Any) -> bool:
        ts = dask_worker.state.tasks.get(key)
        return ts is None or ts.priority is None or ts.priority[0] == float("-inf")

    def held_bumped(dask_worker: Any) -> bool:
        ts = dask_worker.state.tasks.get(key)
        return ts is not None and ts.priority is not None and ts.priority[0] == float("-inf")

    bumped, sent_to = client.run_on_scheduler(on_scheduler)
    if not bumped or not all(client.run(on_worker).values()):
        return False
    return not sent_to or bool(client.run(held_bumped, workers=[sent_to])[sent_to])


def _running(client: Any) -> int:
    """Tasks the scheduler has sent to workers (both workers busy at the gate: 2 or more)."""

    def count(dask_scheduler: Any) -> int:
        return sum(len(ws.processing) for ws in dask_scheduler.workers.values())

    return int(client.run_on_scheduler(count))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, partition: str) -> Iterator[Any]:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    root = tmp_path_factory.mktemp("slurm-priority")
    name = unique_job_name()
    try:
        with SLURMCluster(**cluster_options(partition, name, root / "jobs", root / "job-logs")) as cluster:
            cluster.scale(jobs=2)
            with Client(cluster) as c:
                c.wait_for_workers(2, timeout=WORKER_TIMEOUT)
                yield c
    finally:
        cancel_jobs(name)


@pytest.fixture
def tasks() -> dict[str, Callable[..., Any]]:
    return by_value(TASKS)


def _gated_round(client: Any, tasks: dict[str, Callable[..., Any]], rnd: Round) -> list[Any]:
    futures = client.map(tasks["gated"], range(N_TASKS), gate=rnd.gate, record=rnd.record)
    wait_until(lambda: _running(client) >= 2, WORKER_TIMEOUT, "both workers to take a task")
    return list(futures)


def test_without_a_bump_the_request_waits_its_turn(client: Any, tasks: dict[str, Any], tmp_path: Path) -> None:
    """The control: unbumped, the requested task finishes after most of those before it."""
    rnd = Round(tmp_path, "control")
    futures = _gated_round(client, tasks, rnd)
    rnd.open()
    assert futures[TARGET].result(timeout=WORKER_TIMEOUT) == TARGET
    client.gather(futures)
    assert rnd.place(TARGET) > TARGET - 10, rnd.order()


def test_a_prioritized_future_jumps_the_queue(client: Any, tasks: dict[str, Any], tmp_path: Path) -> None:
    from nbrewind import prioritize

    rnd = Round(tmp_path, "future")
    futures = _gated_round(client, tasks, rnd)
    assert prioritize(futures[TARGET]) == 1
    wait_until(lambda: _bump_shows(client, futures[TARGET].key), WORKER_TIMEOUT, "the bump to show")
    rnd.open()
    assert futures[TARGET].result(timeout=WORKER_TIMEOUT) == TARGET
    client.gather(futures)
    assert sorted(rnd.order()) == list(range(N_TASKS))
    place, mine = rnd.place_on_its_worker(TARGET)
    assert place < FIRST_PLACES, mine[:10]


def test_a_prioritized_slice_of_a_persisted_array_goes_first(
    client: Any, tasks: dict[str, Any], tmp_path: Path
) -> None:
    import dask.array as da
    import numpy as np

    from nbrewind import prioritize

    rnd = Round(tmp_path, "slice")
    x = da.zeros(N_TASKS, chunks=1).map_blocks(
        tasks["gated_block"], rnd.gate, rnd.record, meta=np.empty((0,), dtype=float)
    ).persist()
    wait_until(lambda: _running(client) >= 2, WORKER_TIMEOUT, "both workers to take a chunk")
    piece = x[TARGET : TARGET + 1]
    assert prioritize(piece) == 1
    wait_until(lambda: _bump_shows(client, x.__dask_keys__()[TARGET]), WORKER_TIMEOUT, "the bump to show")
    rnd.open()
    assert piece.compute().tolist() == [1.0]
    place, mine = rnd.place_on_its_worker(TARGET)
    assert place < FIRST_PLACES, mine[:10]
    assert x.sum().compute() == N_TASKS
