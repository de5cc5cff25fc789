"""The `cli` fixture: `jupyter nbrewind ...` as a real subprocess in the test's folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_tools import Cli, make_cli


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return make_cli(tmp_path)
