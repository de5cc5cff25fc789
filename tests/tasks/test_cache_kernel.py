"""The task cache through real kernels: audit a notebook with Dask tasks, edit one
function, repeat it, and read the hits and misses back from the cell log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("dask")

from nbrewind.run import run_notebook  # noqa: E402
from nbrewind.store import Store  # noqa: E402
from nbrewind.store.report import cell_log  # noqa: E402

CELLS = [
    "import dask\nfrom dask import delayed\nSCALE = 2",
    "def work(x):\n    return x * SCALE + 1",
    "def total(xs):\n    return sum(xs)",
    "result = delayed(total)([delayed(work)(i) for i in range(6)]).compute(scheduler='threads')\nresult",
]


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


@pytest.mark.kernel
def test_repeat_recomputes_only_the_edited_task(tmp_path: Path) -> None:
    notebook = tmp_path / "tasks.ipynb"
    store = tmp_path / "tasks.ipynb.nbrewind"
    write_notebook(notebook, CELLS)
    run_notebook(notebook, kernel="audit", store=store)
    edited = [*CELLS[:2], "def total(xs):\n    return sum(xs) + 0", CELLS[3]]
    write_notebook(notebook, edited)
    run_notebook(notebook, kernel="repeat", store=store)
    with Store.open(store, create=False) as opened:
        rows = cell_log(opened)
    dask_rows = [r for r in rows if r.code.startswith("result =")]
    audit, repeat = dask_rows
    assert (audit.kernel, audit.decision, audit.task_hits, audit.task_misses) == ("audit", "executed", 0, 7)
    assert (repeat.kernel, repeat.decision, repeat.task_hits, repeat.task_misses) == ("repeat", "executed", 6, 1)
