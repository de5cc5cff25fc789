"""Helpers for the command-line tests (imported by the tests and conftest.py): the CLI as a real subprocess, and small notebooks.

The suite-wide NBREWIND_STORE (tests/conftest.py) is dropped from the commands'
environment unless a test sets it, since finding the store is what is under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nbformat

Cli = Callable[..., subprocess.CompletedProcess[str]]


def cli_env(store: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this one's, without NBREWIND_STORE unless given."""
    env = {k: v for k, v in os.environ.items() if k != "NBREWIND_STORE"}
    if store is not None:
        env["NBREWIND_STORE"] = store
    env.update(extra)
    return env


def make_cli(tmp_path: Path) -> Cli:
    """Run `jupyter nbrewind ARGS` as a subprocess in `tmp_path` (or `cwd`)."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nbrewind.cli", *args], capture_output=True, text=True, timeout=timeout,
            cwd=cwd or tmp_path, env=env if env is not None else cli_env(),
        )

    return run


def write_notebook(path: Path, cells: Sequence[str | tuple[str, list[str]]]) -> Path:
    """A notebook of code cells; a (source, tags) pair gives a cell tags. It carries the
    kernelspec and language_info papermill needs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.metadata["language_info"] = {"name": "python"}
    for cell in cells:
        source, tags = (cell, []) if isinstance(cell, str) else cell
        new = nbformat.v4.new_code_cell(source)
        if tags:
            new.metadata["tags"] = list(tags)
        nb.cells.append(new)
    nbformat.write(nb, str(path))
    return path


def code_outputs(path: Path) -> list[list[dict[str, Any]]]:
    """Each code cell's outputs without the fields that vary between runs (execution counts)."""
    nb = nbformat.read(str(path), as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for o in cell.outputs:
            o = dict(o)
            o.pop("execution_count", None)
            if o.get("output_type") == "stream":
                o["text"] = "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
            outs.append(o)
        out.append(outs)
    return out
