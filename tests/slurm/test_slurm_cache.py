"""The task cache with Slurm workers, through the real NBRewind kernels (nbclient).

The notebook (``slurm_notebook.py``) makes a ``dask_jobqueue.SLURMCluster`` of two
one-core jobs whose workers run in their own folder and environment, and computes
a delayed graph of 25 tasks on it. Audit it, repeat it unchanged, repeat it with the
printed label edited (same graph), then with one of its 12 inputs edited. Hits and
misses come from the store's cell log and task log; the calls each task function
left in a folder show what ran, in which Slurm job and in which working directory.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from slurm_notebook import (
    EDITED_VALUES,
    N_TASKS,
    VALUES,
    Places,
    expected_total,
    run_sequence,
)

pytestmark = [pytest.mark.slurm, pytest.mark.kernel, pytest.mark.timeout(900)]


def test_repeat_on_slurm_recomputes_exactly_the_changed_tasks(tmp_path: Path, partition: str, job_name: str) -> None:
    audit, unchanged, relabelled, edited = run_sequence(tmp_path, partition, job_name)
    places = Places(tmp_path)

    assert audit.decisions == ["executed"] * 5
    assert (audit.compute_hits, audit.compute_misses) == (0, N_TASKS)
    assert audit.missed_prefixes == Counter(step1=len(VALUES), step2=len(VALUES), total=1)
    assert audit.calls_by_function == Counter(step1=len(VALUES), step2=len(VALUES), total=1)
    assert audit.jobs_submitted == 2
    assert audit.printed.split() == ["total", str(expected_total(VALUES))]
    # Every task ran in a Slurm job, in the jobs' own folder, on this environment's Python,
    # and was logged with its worker.
    assert all(call.job.isdigit() for call in audit.calls)
    assert {call.cwd for call in audit.calls} == {str(places.jobs)}
    assert {call.python for call in audit.calls} == {sys.executable}
    assert all(w and w.startswith("tcp://") for w in audit.task_workers)

    # Unchanged: every cell replayed, no task run or loaded, no job submitted.
    assert unchanged.decisions == ["replayed"] * 5
    assert (unchanged.compute_hits, unchanged.compute_misses) == (0, 0)
    assert unchanged.calls == [] and unchanged.jobs_submitted == 0
    assert unchanged.printed == audit.printed

    # Same graph in a cell that runs again: the cluster is rebuilt and the output task
    # is loaded from the store by a worker (everything it needed is culled).
    assert relabelled.decisions[-1] == "executed"
    assert (relabelled.compute_hits, relabelled.compute_misses) == (1, 0)
    assert relabelled.calls == []
    assert relabelled.jobs_submitted == 2
    assert relabelled.printed.split()[-1] == str(expected_total(VALUES))

    # One input edited: its two steps and the total run, the 11 other step2 results load.
    assert edited.decisions[-2:] == ["executed", "executed"]
    assert (edited.compute_hits, edited.compute_misses) == (len(VALUES) - 1, 3)
    assert edited.missed_prefixes == Counter(step1=1, step2=1, total=1)
    assert edited.calls_by_function == Counter(step1=1, step2=1, total=1)
    assert {call.cwd for call in edited.calls} == {str(places.jobs)}
    assert edited.printed.split()[-1] == str(expected_total(EDITED_VALUES))
