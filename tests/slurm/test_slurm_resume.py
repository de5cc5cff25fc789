"""In-task checkpoints when Slurm cancels the job running the task.

A long task (``long_sum``: N steps, a checkpoint every K) runs under NBRewind's task
cache on a ``SLURMCluster`` kept at two jobs by ``adapt(minimum=2, maximum=2)``.
Once it has written a checkpoint, the test runs ``scancel`` on the job the task
reports running in. The scheduler reschedules the task of the lost worker, Slurm
starts a replacement job, and the retry resumes from the last checkpoint. Each
attempt appends to a log in a folder passed as an argument (folders fingerprint by
name, so the log does not change the task's fingerprint): where it started, in
which job, every step it ran and every checkpoint it wrote.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_tools import WORKER_TIMEOUT, by_value, cluster_options, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

N, K = 60, 10
PAUSE = 0.2
EXPECTED = sum(i * i for i in range(N))

TASK = '''
import os, time
import nbrewind

def long_sum(n, k, folder, pause):
    state = nbrewind.resume({"i": 0, "total": 0})
    i, total = state["i"], state["total"]
    job = os.environ.get("SLURM_JOB_ID")
    log = os.path.join(folder, "attempts.log")
    with open(log, "a") as f:
        f.write(f"start {i} {job}\\n")
    while i < n:
        with open(log, "a") as f:
            f.write(f"step {i} {job}\\n")
        total += i * i
        i += 1
        time.sleep(pause)
        if i % k == 0 and nbrewind.checkpoint({"i": i, "total": total}):
            with open(log, "a") as f:
                f.write(f"checkpoint {i} {job}\\n")
    return total
'''


def read_log(folder: Path) -> list[tuple[str, int, str]]:
    """(event, step, job id) for every complete line the attempts wrote, in order (a line
    being appended while the test reads is left for the next read)."""
    path = folder / "attempts.log"
    if not path.exists():
        return []
    complete = path.read_text().split("\n")[:-1]
    return [(kind, int(step), job) for kind, step, job in (line.split() for line in complete)]


def worker_jobs(client: Any) -> set[str]:
    """The Slurm job ids of the connected workers."""
    return set(client.run(lambda: os.environ.get("SLURM_JOB_ID")).values())


@pytest.fixture
def cluster_client(tmp_path: Path, partition: str, job_name: str) -> Iterator[Any]:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    import dask

    options = cluster_options(partition, job_name, tmp_path / "jobs", tmp_path / "job-logs")
    # distributed's own default: a cancelled job's worker leaves the cluster's spec this long
    # after it is lost, and only then does adapt() submit a replacement job (the suite sets an
    # hour for LocalCluster Nannies that tests kill and expect back; see tests/conftest.py).
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "15s"}), \
            SLURMCluster(**options) as cluster, Client(cluster) as client:
        cluster.adapt(minimum=2, maximum=2)
        client.wait_for_workers(2, timeout=WORKER_TIMEOUT)
        yield client


def test_a_cancelled_job_s_task_resumes_from_its_last_checkpoint_in_another_job(
    tmp_path: Path, cluster_client: Any
) -> None:
    from nbrewind.tasks.cache import TaskCache
    from nbrewind.tasks.intercept import intercepting
    from nbrewind.tasks.resume import CHECKPOINT_NAMESPACE

    client = cluster_client
    folder = tmp_path / "work"
    folder.mkdir()
    store = tmp_path / "store.nbrewind"
    jobs_before = worker_jobs(client)
    task = by_value(TASK)["long_sum"]
    with intercepting(TaskCache(store)):
        future = client.submit(task, N, K, str(folder), PAUSE)
        wait_until(lambda: any(kind == "checkpoint" for kind, _, _ in read_log(folder)), WORKER_TIMEOUT,
                   "the task's first checkpoint")
        first_job = read_log(folder)[0][2]
        checkpointed = max(step for kind, step, _ in read_log(folder) if kind == "checkpoint")
        subprocess.run(["scancel", first_job], check=True, timeout=30)
        assert future.result(timeout=WORKER_TIMEOUT) == EXPECTED
    log = read_log(folder)
    starts = [(step, job) for kind, step, job in log if kind == "start"]
    assert len(starts) == 2, log
    (first_start, job_a), (resumed_at, job_b) = starts
    assert (first_start, job_a) == (0, first_job)
    assert job_b != job_a  # the retry ran in another Slurm job
    # It resumed from a checkpoint at least as late as the one seen before scancel, not from 0.
    assert resumed_at >= checkpointed > 0 and resumed_at % K == 0
    retry_steps = [step for kind, step, job in log if kind == "step" and job == job_b]
    assert retry_steps == list(range(resumed_at, N))
    first_steps = [step for kind, step, job in log if kind == "step" and job == job_a]
    assert first_steps == list(range(len(first_steps))) and len(first_steps) < N
    assert (store / "refs" / CHECKPOINT_NAMESPACE).is_dir()
    assert not [p for p in (store / "refs" / CHECKPOINT_NAMESPACE).rglob("*") if p.is_file()]  # dropped on success
    # Slurm brought up a replacement for the cancelled job.
    wait_until(lambda: len(worker_jobs(client)) == 2 and first_job not in worker_jobs(client), WORKER_TIMEOUT,
               "a replacement job's worker", interval=0.5)
    assert len(worker_jobs(client) - jobs_before) == 1
