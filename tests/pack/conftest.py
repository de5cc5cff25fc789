"""Fixtures for the backpack tests: a private trust database and a recorded project."""

from __future__ import annotations

from pathlib import Path

import pytest
from backpack_tools import make_project


@pytest.fixture(autouse=True)
def trust_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test trusts nothing of the user's: its own (initially absent) trust database."""
    path = tmp_path / "trust" / "trust.db"
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(path))
    return path


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Folder A with nb.ipynb, its modules, data.csv and a two-session store."""
    folder = tmp_path / "A"
    return folder, make_project(folder)
