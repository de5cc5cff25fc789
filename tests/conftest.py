"""Shared test setup.

Every test gets its own store through NBREWIND_STORE so nothing is ever written
into the repository, and kernels started by tests inherit it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    store = tmp_path_factory.mktemp("store") / "default.nbrewind"
    monkeypatch.setenv("NBREWIND_STORE", str(store))
    yield store
