"""Fixtures the task-cache tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from counting import Calls  # tests/tasks/counting.py


@pytest.fixture
def calls(tmp_path: Path) -> Calls:
    """Counts, in files, how often each task function really ran (also on worker processes)."""
    folder = tmp_path / "counts"
    folder.mkdir()
    return Calls(folder)
