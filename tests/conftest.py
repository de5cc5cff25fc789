"""Shared test setup.

Every test gets its own store through NBREWIND_STORE so nothing is ever written
into the repository, and kernels started by tests inherit it. The whole run signs
stores with a trust database and secret of its own (NBREWIND_TRUST_DB), set before
any fixture starts a kernel, a JupyterLab or a Dask cluster, so they all share it
and nothing touches the user's trust database; kernels remember file digests in a
memo of the run's own (NBREWIND_DIGEST_MEMO), not in the user's cache folder.

Tests kill Nanny workers on purpose, often the same one twice in a few seconds.
distributed's SpecCluster (LocalCluster) closes a worker's Nanny for good when,
``distributed.deploy.lost-worker-timeout`` after *a* loss of it, no worker of that
name is registered; the timer of an earlier loss is not cancelled when the worker
comes back, so it can fire inside the restart gap of a later loss (seen under load:
"Closing Nanny ... Reason: nanny-close" one second after a kill, and the test then
waiting for a worker that never returns). The run sets that timeout to an hour,
for this process and, through the environment, for kernels and their clusters.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dask
import distributed  # noqa: F401
import pytest

LOST_WORKER_TIMEOUT = "1h"


@pytest.fixture(scope="session", autouse=True)
def _isolated_trust(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("trust") / "trust.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NBREWIND_TRUST_DB", str(path))
        patch.setenv("NBREWIND_DIGEST_MEMO", str(path.with_name("file-digests.sqlite")))
        yield path


@pytest.fixture(scope="session", autouse=True)
def _lost_workers_come_back() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DASK_DISTRIBUTED__DEPLOY__LOST_WORKER_TIMEOUT", LOST_WORKER_TIMEOUT)
        yield


@pytest.fixture(autouse=True)
def _lost_workers_come_back_in_this_process() -> Iterator[None]:
    # Set for every test, not once: the in-process differential runs put dask.config back
    # to what it was when they were imported (before any fixture), and a replayed cell
    # restores the config its notebook had. distributed is imported above so that its
    # defaults are in dask.config first: set on a config without a `distributed` key, this
    # would remove the whole key on exit, defaults added by a later import included, and the
    # next test's LocalCluster fails with KeyError: 'comm'.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": LOST_WORKER_TIMEOUT}):
        yield


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    store = tmp_path_factory.mktemp("store") / "default.nbrewind"
    monkeypatch.setenv("NBREWIND_STORE", str(store))
    yield store
