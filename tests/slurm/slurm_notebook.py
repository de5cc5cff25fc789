"""A notebook whose Dask workers are Slurm jobs, run through the real NBRewind kernels.

The notebook makes a ``dask_jobqueue.SLURMCluster`` (one core and 1 GB per job, two
jobs), builds a delayed graph of 25 tasks (12 ``step1`` -> 12 ``step2`` -> one
``total``; ``step1`` and ``step2`` sleep ``DELAY`` seconds each) and computes it on
the cluster. Every task call leaves a file in a calls folder, holding the Slurm job
id and working directory it ran in, so work done is counted where it happened.

:func:`run_sequence` runs it four times against one store:

1. ``audit``: the notebook on the audit kernel;
2. ``repeat``: the same notebook on the repeat kernel;
3. ``repeat, output edited``: the compute cell prints a different label (same graph);
4. ``repeat, input edited``: one of the 12 input values changed.

Run as a script (``python tests/slurm/slurm_notebook.py``, with a Slurm running, e.g.
after ``.ci/install-slurm``) it prints the figures docs/hpc.md quotes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from slurm_tools import (  # noqa: E402
    WORKER_TIMEOUT,
    cancel_jobs,
    cluster_options,
    default_partition,
    unique_job_name,
)

VALUES = list(range(1, 13))
EDITED_AT = 3
EDITED_VALUES = [*VALUES[:EDITED_AT], 40, *VALUES[EDITED_AT + 1 :]]
DELAY = 0.2
N_TASKS = 2 * len(VALUES) + 1
COMPUTE_MARK = "client.compute"

IMPORTS = "import os\nimport sys\nimport time\nfrom dask import delayed\nfrom dask_jobqueue import SLURMCluster\nfrom distributed import Client"

CLUSTER = """\
cluster = SLURMCluster(
    {options},
)
cluster.scale(jobs=2)
client = Client(cluster)
client.wait_for_workers(2, timeout={timeout})"""

FUNCTIONS = """\
from nbrewind.identity.files import quietly

CALLS = {calls!r}
DELAY = {delay!r}

def mark(name):
    path = os.path.join(CALLS, f"{{name}}.{{os.getpid()}}.{{time.monotonic_ns()}}")
    # The test's record of the call, not the task's effect: unseen, or no task would be cached.
    with quietly(), open(path, "w") as f:
        f.write(f"{{os.environ.get('SLURM_JOB_ID')}}\\t{{os.getcwd()}}\\t{{sys.executable}}")

def step1(v):
    mark("step1")
    time.sleep(DELAY)
    return v * v

def step2(x):
    mark("step2")
    time.sleep(DELAY)
    return x + 1

def total(xs):
    mark("total")
    return sum(xs)"""

INPUTS = "VALUES = {values!r}"

COMPUTE = """\
parts = [delayed(step2)(delayed(step1)(v)) for v in VALUES]
result = client.compute(delayed(total)(parts)).result()
print({label!r}, result)"""


def expected_total(values: list[int]) -> int:
    """What the notebook's graph computes."""
    return sum(v * v + 1 for v in values)


@dataclass
class Places:
    """The folders one sequence uses: notebook, store, the jobs' working folder, job logs, calls."""

    root: Path

    @property
    def notebook(self) -> Path:
        return self.root / "nb" / "slurm.ipynb"

    @property
    def store(self) -> Path:
        return self.root / "store.nbrewind"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def logs(self) -> Path:
        return self.root / "job-logs"

    @property
    def calls(self) -> Path:
        return self.root / "calls"


def cells(places: Places, partition: str, job_name: str, *, values: list[int], label: str) -> list[str]:
    """The notebook's code cells."""
    options = cluster_options(partition, job_name, places.jobs, places.logs)
    return [
        IMPORTS,
        CLUSTER.format(options=",\n    ".join(f"{k}={v!r}" for k, v in options.items()), timeout=WORKER_TIMEOUT),
        FUNCTIONS.format(calls=str(places.calls), delay=DELAY),
        INPUTS.format(values=values),
        COMPUTE.format(label=label),
    ]


def write_notebook(path: Path, sources: list[str]) -> None:
    """An nbformat 4 notebook of code cells (no cell ids: nbclient sends none)."""
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
            for src in sources
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 4,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))


@dataclass(frozen=True)
class Call:
    """One call of a task function: which, and the Slurm job, working folder and Python it ran in."""

    function: str
    job: str
    cwd: str
    python: str


def take_calls(folder: Path) -> list[Call]:
    """The task calls recorded since the last take; removes their files."""
    calls = []
    for path in sorted(folder.iterdir()):
        job, cwd, python = path.read_text().split("\t")
        calls.append(Call(path.name.split(".")[0], job, cwd, python))
        path.unlink()
    return calls


def job_logs(folder: Path) -> set[str]:
    """Names of the job logs dask-jobqueue's jobs wrote: one per job submitted."""
    return {p.name for p in folder.glob("*.err")}


@dataclass
class RunFigures:
    """What one run of the notebook did and cost."""

    name: str
    kernel: str
    seconds: float
    cell_seconds: list[float]
    decisions: list[str]
    compute_hits: int
    compute_misses: int
    missed_prefixes: Counter[str]
    task_workers: list[str | None]
    calls: list[Call]
    jobs_submitted: int
    printed: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def calls_by_function(self) -> Counter[str]:
        return Counter(call.function for call in self.calls)


def _printed(output: Path) -> str:
    nb = json.loads(output.read_text())
    last = nb["cells"][-1]
    return "".join("".join(o.get("text", "")) for o in last.get("outputs", []) if o.get("output_type") == "stream")


def run_one(places: Places, name: str, kernel: str, sources: list[str]) -> RunFigures:
    """Run the notebook once on `kernel` and read back what it did from the store."""
    from nbrewind.run import run_notebook
    from nbrewind.store import Store
    from nbrewind.store.report import cell_log, task_rows

    write_notebook(places.notebook, sources)
    before = job_logs(places.logs)
    output = places.root / f"out-{name.replace(' ', '-').replace(',', '')}.ipynb"
    result = run_notebook(places.notebook, kernel=kernel, store=places.store, output=output, timeout=600, quiet=True)
    with Store.open(places.store, create=False) as opened:
        rows = cell_log(opened, last_session=True)
        compute = [r for r in rows if COMPUTE_MARK in r.code]
        tasks = task_rows(opened, [r.id for r in compute])
    return RunFigures(
        name=name,
        kernel=kernel,
        seconds=result.seconds,
        cell_seconds=list(result.cell_seconds),
        decisions=[r.decision or "" for r in rows],
        compute_hits=sum(r.task_hits for r in compute),
        compute_misses=sum(r.task_misses for r in compute),
        missed_prefixes=Counter(t.key_prefix or "" for t in tasks if not t.hit),
        task_workers=[t.worker for t in tasks],
        calls=take_calls(places.calls),
        jobs_submitted=len(job_logs(places.logs) - before),
        printed=_printed(output),
    )


def run_sequence(root: Path, partition: str, job_name: str) -> list[RunFigures]:
    """Audit, unchanged repeat, repeat with the output label edited, repeat with one
    input edited; the jobs of each run are cancelled before the next one starts."""
    places = Places(root)
    places.calls.mkdir(parents=True, exist_ok=True)
    plan = [
        ("audit", "audit", VALUES, "total"),
        ("repeat", "repeat", VALUES, "total"),
        ("repeat, output edited", "repeat", VALUES, "sum of the parts:"),
        ("repeat, input edited", "repeat", EDITED_VALUES, "sum of the parts:"),
    ]
    figures = []
    for name, kernel, values, label in plan:
        try:
            figures.append(run_one(places, name, kernel, cells(places, partition, job_name, values=values, label=label)))
        finally:
            cancel_jobs(job_name)
    return figures


def _table(figures: list[RunFigures]) -> str:
    lines = [
        "| run | kernel | wall s | cluster cell s | compute cell s | tasks hit | tasks missed | task calls | jobs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        cluster_s, compute_s = f.cell_seconds[1], f.cell_seconds[-1]
        lines.append(
            f"| {f.name} | {f.kernel} | {f.seconds:.1f} | {cluster_s:.2f} | {compute_s:.2f} | {f.compute_hits} | "
            f"{f.compute_misses} | {len(f.calls)} | {f.jobs_submitted} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the sequence once in a temporary folder and print the figures as a table."""
    job_name = unique_job_name("nbr-measure")
    with tempfile.TemporaryDirectory(prefix="nbrewind-slurm-") as tmp:
        os.environ.setdefault("NBREWIND_TRUST_DB", str(Path(tmp) / "trust" / "trust.db"))
        started = time.perf_counter()
        figures = run_sequence(Path(tmp), default_partition(), job_name)
        print(_table(figures))
        print(f"\n{N_TASKS} tasks; {len(VALUES)} values; DELAY {DELAY} s; whole sequence {time.perf_counter() - started:.1f} s")
        for f in figures:
            print(f"{f.name}: decisions {f.decisions}; printed {f.printed.strip()!r}; missed {dict(f.missed_prefixes)}")


if __name__ == "__main__":
    main()
