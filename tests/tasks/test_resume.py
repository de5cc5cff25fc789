"""Checkpoints inside Dask tasks: nbrewind.checkpoint / resume / publish.

The task under test sums ``i * i`` over N steps, checkpoints every K steps and
appends every step it executes to ``steps.log`` in a folder passed as an argument
(folders fingerprint by name only, so the log never changes the task's
fingerprint), so counts include work done in worker processes that were killed.
On its first attempt (no marker file yet) it crashes at step CRASH_AT, between
two checkpoints: by ``os._exit`` on a Nanny worker, or by an exception /
KeyboardInterrupt on the local schedulers. Resuming from the checkpoint at step
20 must keep the steps executed in total within N + K.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

import nbrewind  # noqa: E402
from nbrewind.tasks.cache import REF_NAMESPACE, TaskCache, TaskSpec  # noqa: E402
from nbrewind.tasks.intercept import intercepting  # noqa: E402
from nbrewind.tasks.resume import (  # noqa: E402
    CHECKPOINT_NAMESPACE,
    PUBLISHED_NAMESPACE,
    Published,
    current_task,
    run_resumable,
)

N, K, CRASH_AT = 40, 10, 25
EXPECTED = sum(i * i for i in range(N))

NOTEBOOK = '''
import os, time
import nbrewind
from nbrewind.identity.files import quietly

def long_sum(n, k, folder, crash_at, how, pause=0.0, publish_at=None):
    state = nbrewind.resume({"i": 0, "total": 0})
    i, total = state["i"], state["total"]
    while i < n:
        with quietly(), open(os.path.join(folder, "steps.log"), "a") as log:  # the test's record, not the task's effect
            log.write(f"{i}\\n")
        total += i * i
        i += 1
        time.sleep(pause)
        if i % k == 0:
            nbrewind.checkpoint({"i": i, "total": total})
        if i == publish_at:
            nbrewind.publish(f"half-{os.path.basename(folder)}", total)
        marker = os.path.join(folder, "crashed")
        if i == crash_at and not os.path.exists(marker):
            with quietly():
                open(marker, "w").close()
            if how == "exit":
                os._exit(1)
            if how == "interrupt":
                raise KeyboardInterrupt
            raise RuntimeError("crash on the first attempt")
    return total
'''


def notebook() -> dict[str, Any]:
    """The notebook's functions (``__main__``, so they travel to workers by value)."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(NOTEBOOK, "<notebook>", "exec"), ns)
    return ns


def steps(folder: Path) -> list[int]:
    """The steps the task executed, in every attempt, in order."""
    log = folder / "steps.log"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def refs(store: Path, namespace: str) -> list[str]:
    base = store / "refs" / namespace
    return sorted(p.name for p in base.rglob("*") if p.is_file()) if base.exists() else []


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    f = tmp_path / "work"
    f.mkdir()
    return f


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[TaskCache]:
    c = TaskCache(tmp_path / "store.nbrewind")
    with intercepting(c):
        yield c


# -- outside a task ---------------------------------------------------------------------------------


def test_outside_a_task_checkpoint_is_a_no_op_and_resume_returns_the_default() -> None:
    assert current_task() is None
    assert nbrewind.checkpoint({"i": 3}) is False
    assert nbrewind.resume() is None
    assert nbrewind.resume({"i": 0}) == {"i": 0}
    handle = nbrewind.publish("part", [1, 2])
    assert not handle.durable and nbrewind.published(handle) == [1, 2]


def test_without_the_cache_the_task_runs_from_the_start(folder: Path) -> None:
    ns = notebook()
    task = dask.delayed(ns["long_sum"])(N, K, str(folder), CRASH_AT, "raise")
    with pytest.raises(RuntimeError):
        task.compute(scheduler="threads")
    assert task.compute(scheduler="threads") == EXPECTED
    assert len(steps(folder)) == CRASH_AT + N


# -- the name nbrewind.checkpoint ---------------------------------------------------------------------


def test_checkpoint_is_both_the_subpackage_and_the_function() -> None:
    import importlib
    import pickle

    import nbrewind.checkpoint.values as values

    assert callable(nbrewind.checkpoint)
    assert nbrewind.checkpoint.values is values
    assert importlib.import_module("nbrewind.checkpoint") is nbrewind.checkpoint
    assert pickle.loads(pickle.dumps(nbrewind.checkpoint)) is nbrewind.checkpoint


def test_importing_a_checkpoint_submodule_first_keeps_it_callable() -> None:
    import subprocess
    import sys

    code = ("import nbrewind.checkpoint.serialize, sys\n"
            "import nbrewind\n"
            "print(callable(nbrewind.checkpoint), nbrewind.checkpoint(1), 'nbrewind.tasks.resume' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "False", "True"]


# -- the wrapper, directly ----------------------------------------------------------------------------


def _spec(tmp_path: Path) -> TaskSpec:
    return TaskSpec(str(tmp_path / "store"), "0123456789abcdef0123456789abcdef", "work")


def test_each_checkpoint_replaces_the_last_and_success_drops_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    seen: list[Any] = []

    def work(fail: bool) -> str:
        seen.append(nbrewind.resume("nothing"))
        assert nbrewind.checkpoint({"step": 1}) and nbrewind.checkpoint({"step": 2})
        if fail:
            raise ValueError("fail")
        return "done"

    with pytest.raises(ValueError):
        run_resumable(spec, work, True)
    assert refs(tmp_path / "store", CHECKPOINT_NAMESPACE) == [spec.fingerprint]
    assert run_resumable(spec, work, False) == "done"
    assert seen == ["nothing", {"step": 2}]
    assert refs(tmp_path / "store", CHECKPOINT_NAMESPACE) == []
    assert refs(tmp_path / "store", REF_NAMESPACE) == [spec.fingerprint]  # the result is cached instead
    assert current_task() is None


def test_min_interval_skips_writes(tmp_path: Path) -> None:
    def work() -> list[bool]:
        return [nbrewind.checkpoint(i, min_interval=60.0) for i in range(3)]

    assert run_resumable(_spec(tmp_path), work) == [True, False, False]


def test_a_damaged_checkpoint_means_starting_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = _spec(tmp_path)

    def save() -> None:
        nbrewind.checkpoint({"step": 7})
        raise ValueError("stop")

    with pytest.raises(ValueError):
        run_resumable(spec, save)
    objects = tmp_path / "store" / "objects"
    for path in objects.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
            path.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="nbrewind.tasks.resume"):
        assert run_resumable(spec, lambda: nbrewind.resume("fresh")) == "fresh"
    assert "could not read the checkpoint" in caplog.text


def test_an_unpicklable_state_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import threading

    with caplog.at_level(logging.WARNING, logger="nbrewind.tasks.resume"):
        assert run_resumable(_spec(tmp_path), lambda: nbrewind.checkpoint(threading.Lock())) is False
    assert "could not write a checkpoint" in caplog.text


def test_publish_stores_a_durable_handle(tmp_path: Path) -> None:
    import pickle

    spec = _spec(tmp_path)
    handle = run_resumable(spec, lambda: nbrewind.publish("part", list(range(5))))
    assert isinstance(handle, Published) and handle.durable
    assert refs(tmp_path / "store", PUBLISHED_NAMESPACE) == [f"{spec.fingerprint}.part"]
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle and nbrewind.published(copy) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        nbrewind.publish("no/slashes", 1)


# -- local schedulers: interrupted, then run again ------------------------------------------------------


@pytest.mark.parametrize(("scheduler", "how", "error"), [
    ("threads", "raise", RuntimeError),
    ("sync", "interrupt", KeyboardInterrupt),
])
def test_a_rerun_resumes_from_the_last_checkpoint(
    cache: TaskCache, folder: Path, scheduler: str, how: str, error: type[BaseException]
) -> None:
    ns = notebook()
    with pytest.raises(error):
        dask.delayed(ns["long_sum"])(N, K, str(folder), CRASH_AT, how).compute(scheduler=scheduler)
    assert len(steps(folder)) == CRASH_AT
    # The same task, built again (a new key) as a re-run cell would: same fingerprint.
    assert dask.delayed(ns["long_sum"])(N, K, str(folder), CRASH_AT, how).compute(scheduler=scheduler) == EXPECTED
    done = steps(folder)
    assert len(done) <= N + K
    assert done[CRASH_AT:] == list(range(20, N))  # resumed at the checkpoint of step 20
    assert refs(cache.root, CHECKPOINT_NAMESPACE) == []
    rows = cache.drain_log()
    assert [r.hit for r in rows] == [False, False] and rows[-1].nbytes


# -- a real cluster: a Nanny worker dies mid-task -------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.mark.cluster
def test_a_killed_worker_retry_resumes(client: Client, cache: TaskCache, folder: Path) -> None:
    ns = notebook()
    future = client.submit(ns["long_sum"], N, K, str(folder), CRASH_AT, "exit", 0.01)
    assert future.result(timeout=60) == EXPECTED
    done = steps(folder)
    assert (folder / "crashed").exists() and len(done) > N  # the first attempt did die mid-task
    assert len(done) <= N + K
    assert done[CRASH_AT:] == list(range(20, N))
    assert refs(cache.root, CHECKPOINT_NAMESPACE) == []
    del future


@pytest.mark.cluster
def test_a_killed_worker_retry_resumes_through_the_kernel(cache: TaskCache, folder: Path) -> None:
    """The same on workers told to go through the kernel (`NBREWIND_WORKER_STORE=relay`, as
    where they cannot see the store): each checkpoint returns once the kernel took it, so the
    one at step 20 outlives the worker killed at step 25, and the retry gets it from the kernel."""
    from nbrewind.tasks.remote import RELAY_VARIABLE

    ns = notebook()
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", env={RELAY_VARIABLE: "relay"}) as cluster,
        Client(cluster) as c,
    ):
        future = c.submit(ns["long_sum"], N, K, str(folder), CRASH_AT, "exit", 0.01)
        assert future.result(timeout=120) == EXPECTED
        del future
        assert cache.relay is not None and cache.relay.flush(30)
    done = steps(folder)
    assert (folder / "crashed").exists() and len(done) > N  # the first attempt did die mid-task
    assert done[CRASH_AT:] == list(range(20, N))  # resumed at the checkpoint of step 20
    stats = cache.relay.stats
    # checkpoints 10 and 20, then 30 and 40, and the result; the checkpoint at 20 sent back once
    assert (stats.stored, stats.served, stats.failed) == (5, 1, 0)
    assert refs(cache.root, CHECKPOINT_NAMESPACE) == []  # dropped through the kernel once the task succeeded
    assert len(refs(cache.root, REF_NAMESPACE)) == 1


@pytest.mark.cluster
def test_a_published_partial_result_survives_losing_its_worker(
    client: Client, cache: TaskCache, folder: Path
) -> None:
    ns = notebook()
    name = f"half-{folder.name}"
    half = sum(i * i for i in range(N // 2))
    future = client.submit(ns["long_sum"], N, K, str(folder), CRASH_AT, "exit", 0.01, N // 2)
    assert future.result(timeout=60) == EXPECTED
    long_key = future.key
    del future  # else losing the worker that holds its result would (rightly) rerun it
    _wait_released(client, long_key)
    part = client.get_dataset(name)
    try:
        assert part.key.startswith("nbrewind-published-")
        assert part.result(timeout=30) == half
        holders = [w for ws in client.who_has([part]).values() for w in ws]
        client.restart_workers(holders)
        before = len(steps(folder))
        # Depending on the key after its worker is gone: the scheduler reloads it from the store.
        assert client.submit(lambda x: x + 1, part).result(timeout=30) == half + 1
        assert len(steps(folder)) == before  # the long task was not run again
    finally:
        client.unpublish_dataset(name)
    del part


def _wait_released(client: Client, key: Any, timeout: float = 10.0) -> None:
    import time

    def known(dask_scheduler: Any, key: Any) -> bool:
        return key in dask_scheduler.tasks

    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(known, key=key):
        assert time.monotonic() < deadline, f"the scheduler still holds {key!r}"
        time.sleep(0.02)
