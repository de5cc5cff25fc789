"""Setup for the Slurm suite: skipping it when no Slurm answers, its partition, and
job names whose jobs are cancelled after each test.

The tests (marked `slurm`) run Dask workers as jobs of a real Slurm through
dask-jobqueue. Without a Slurm controller that answers ``sinfo`` (or without
dask-jobqueue) they are skipped with the reason, unless NBREWIND_REQUIRE_SLURM=1 is
set (CI sets it after `.ci/install-slurm`), which turns the skip into a failure so a
broken install cannot pass unnoticed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from slurm_tools import cancel_jobs, default_partition, slurm_problem, unique_job_name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (or, when required, fail) Slurm tests when no Slurm answers."""
    slurm_items = [item for item in items if item.get_closest_marker("slurm") is not None]
    if not slurm_items:
        return
    problem = slurm_problem()
    if problem is None:
        return
    reason = f"the Slurm suite needs {problem}; run .ci/install-slurm"
    if os.environ.get("NBREWIND_REQUIRE_SLURM") == "1":
        raise pytest.UsageError(reason + " (NBREWIND_REQUIRE_SLURM=1)")
    for item in slurm_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def partition() -> str:
    """The partition the tests submit to: the cluster's default one."""
    return default_partition()


@pytest.fixture
def job_name() -> Iterator[str]:
    """A job name of this test's own; its jobs are cancelled (and gone) after the test."""
    name = unique_job_name()
    try:
        yield name
    finally:
        cancel_jobs(name)
