"""Fixtures of the reliability tests (helpers: reliability_tools.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def kernel_env(tmp_path: Path) -> dict[str, str]:
    """The environment kernels start with: the test's own store, the tree under test first on the path."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    env["NBREWIND_STORE"] = str(tmp_path / "nb.ipynb.nbrewind")
    return env
