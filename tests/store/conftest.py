"""Fixtures for the store tests: a fresh store in a temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nbrewind.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A new writable store, closed after the test."""
    with Store.open(tmp_path / "store") as opened:
        yield opened
