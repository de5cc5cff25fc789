"""Shared test setup.

Every test gets its own store through NBREWIND_STORE so nothing is ever written
into the repository, and kernels started by tests inherit it. The whole run signs
stores with a trust database and secret of its own (NBREWIND_TRUST_DB), set before
any fixture starts a kernel, a JupyterLab or a Dask cluster, so they all share it
and nothing touches the user's trust database; kernels remember file digests in a
memo of the run's own (NBREWIND_DIGEST_MEMO), not in the user's cache folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_trust(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("trust") / "trust.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NBREWIND_TRUST_DB", str(path))
        patch.setenv("NBREWIND_DIGEST_MEMO", str(path.with_name("file-digests.sqlite")))
        yield path


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    store = tmp_path_factory.mktemp("store") / "default.nbrewind"
    monkeypatch.setenv("NBREWIND_STORE", str(store))
    yield store
