"""Helpers for the Slurm suite: whether a Slurm answers, its default partition, the
``SLURMCluster`` options every test uses, cancelling a test's jobs, and task code
sent to workers by value.

Workers are Slurm jobs started with ``--export=NONE`` and ``--chdir`` to a folder of
their own: they see neither the test's environment nor its working directory, as on
a real cluster, and reach the store only through the absolute path in the graph.
The one variable they need, ``NBREWIND_TRUST_DB`` (where the secret that signs task
refs lives; the tests use a secret of their own), is exported by the job script.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

#: Seconds to wait for Slurm jobs to start and their workers to connect: the
#: machine is small and shared, and ``--export=NONE`` loads a login environment.
WORKER_TIMEOUT = 240
#: Seconds a command-line call to Slurm may take.
COMMAND_TIMEOUT = 30


def slurm_problem() -> str | None:
    """What keeps the Slurm suite from running here (None when nothing does)."""
    if importlib.util.find_spec("dask_jobqueue") is None:
        return "dask-jobqueue (pip install dask-jobqueue)"
    if shutil.which("sinfo") is None:
        return "Slurm's sinfo on PATH"
    try:
        out = subprocess.run(["sinfo", "--noheader", "--format=%P %a %D"], capture_output=True, text=True, check=False,
                             timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a Slurm controller that answers sinfo ({exc})"
    if out.returncode != 0:
        return f"a Slurm controller that answers sinfo ({out.stderr.strip() or out.returncode})"
    if not any(line.split()[1:2] == ["up"] for line in out.stdout.splitlines()):
        return "a Slurm partition that is up (sinfo lists none)"
    return None


def default_partition() -> str:
    """The default partition (sinfo marks it with ``*``), else the first one."""
    out = subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT, check=True)
    names = out.stdout.split()
    for name in names:
        if name.endswith("*"):
            return name[:-1]
    return names[0]


def unique_job_name(prefix: str = "nbr-test") -> str:
    """A job name no other run uses, so a test cancels only its own jobs."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def worker_environment() -> list[str]:
    """Job-script lines giving workers what they need of this environment: the secret's place."""
    trust = os.environ.get("NBREWIND_TRUST_DB")
    return [f"export NBREWIND_TRUST_DB={trust}"] if trust else []


def cluster_options(partition: str, job_name: str, job_dir: Path, log_dir: Path) -> dict[str, Any]:
    """Keyword arguments for ``dask_jobqueue.SLURMCluster``: one core and 1 GB per job,
    workers in their own folder and environment, a dashboard on a free port."""
    job_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    return {
        "cores": 1,
        "processes": 1,
        "memory": "1GB",
        "queue": partition,
        "walltime": "00:20:00",
        "job_name": job_name,
        "job_extra_directives": [f"--chdir={job_dir}", "--export=NONE"],
        "job_script_prologue": worker_environment(),
        "local_directory": str(job_dir),
        "log_directory": str(log_dir),
        "scheduler_options": {"dashboard_address": ":0"},
    }


def job_ids(job_name: str) -> list[str]:
    """Ids of this name's jobs that are pending, running or completing."""
    out = subprocess.run(["squeue", "--noheader", f"--name={job_name}", "--format=%i"], capture_output=True,
                         text=True, timeout=COMMAND_TIMEOUT, check=True)
    return out.stdout.split()


def cancel_jobs(job_name: str, timeout: float = 120.0) -> None:
    """Cancel every job of this name and wait until Slurm has let them go, so the
    node's cores are free for the next test."""
    subprocess.run(["scancel", f"--name={job_name}"], capture_output=True, timeout=COMMAND_TIMEOUT, check=False)
    deadline = time.monotonic() + timeout
    while job_ids(job_name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs named {job_name} still in the queue {timeout:.0f} s after scancel")
        time.sleep(0.5)


def by_value(code: str) -> dict[str, Any]:
    """Run ``code`` as a module named ``__main__`` and return its namespace: functions
    defined there travel to workers by value, as a notebook's do (workers cannot
    import the test modules)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(code, "<slurm-test>", "exec"), namespace)
    return namespace


def wait_until(condition: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``condition()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
