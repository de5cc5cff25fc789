"""Damaged stores on real kernels: the user's cells never see NBRewind fail, and NBRewind
never writes into a cell's outputs.

A notice goes to the kernel's log: in a kernel, fd 2 is a pipe into the cell's
outputs (ipykernel captures it), so anything NBRewind printed there would be
shown, recorded and replayed as if the notebook had printed it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernels.test_kernels import outputs_of, write_notebook
from nbrewind.run import run_notebook
from nbrewind.store import Store, verify_store
from nbrewind.store.report import cell_log

pytestmark = pytest.mark.kernel

CELLS = [
    "import numpy as np\nrng = np.random.default_rng(7)\na = rng.normal(size=300_000)",
    "b = float(a.sum())\nprint(round(b, 6))",
    "c = a[:3].round(6).tolist()\nprint(c)",
]
EDITED = [*CELLS[:2], "c = a[:4].round(6).tolist()\nprint(c)"]


def _all_text(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return json.dumps([c.get("outputs", []) for c in nb.cells])


def _entry_digest(store: Path, name: str, cell: int = 0) -> str:
    with Store.open(store, create=False) as opened:
        runs = [r for r in opened.catalog.cell_runs() if r.kernel == "audit"]
        return opened.catalog.checkpoint_entries(runs[cell].checkpoint_id)[name][0]


def _chunks(store: Path, digest: str) -> list[Path]:
    with Store.open(store, create=False) as opened:
        children, _ = opened.objects.get_tree(digest)
        return [opened.objects.path_of(c) for c in children]


def _flip(path: Path, at: int = -7) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def _runs(tmp_path: Path, damage: Any) -> tuple[Path, list[str]]:
    nb = write_notebook(tmp_path / "nb.ipynb", CELLS)
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store, output=tmp_path / "audit.ipynb", quiet=True)
    damage(store)
    write_notebook(nb, EDITED)
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "repeat.ipynb")
    run_notebook(nb, kernel="python3", output=tmp_path / "fresh.ipynb", quiet=True)
    with Store.open(store, create=False) as opened:
        decisions = [r.decision for r in cell_log(opened, last_session=True)]
    return store, decisions


def test_a_deleted_value_runs_its_cell_instead_of_replaying(tmp_path: Path) -> None:
    """The replay of cell 0 would bind `a`, whose object is gone: cell 0 runs, `a` is stored
    again, and what follows is a plain run's."""
    store, decisions = _runs(tmp_path, lambda s: Store.open(s).objects.path_of(_entry_digest(s, "a")).unlink())
    assert outputs_of(tmp_path / "repeat.ipynb") == outputs_of(tmp_path / "fresh.ipynb")
    assert "NBRewind" not in _all_text(tmp_path / "repeat.ipynb")
    assert decisions == ["executed", "replayed", "executed"]
    with Store.open(store, create=False) as opened:
        assert verify_store(opened).ok


def test_a_corrupt_chunk_is_made_again_inside_the_users_cell(tmp_path: Path) -> None:
    """`a` is bound lazily by the replay of cell 0; the edited cell 2 loads it, finds a chunk
    corrupt, and NBRewind makes `a` again by re-running cell 0 from the state before it,
    with its RNG: cell 2 shows what a plain run shows, and the store is whole again."""
    def damage(store: Path) -> None:
        _flip(_chunks(store, _entry_digest(store, "a"))[0])

    store, decisions = _runs(tmp_path, damage)
    assert outputs_of(tmp_path / "repeat.ipynb") == outputs_of(tmp_path / "fresh.ipynb")
    assert "NBRewind" not in _all_text(tmp_path / "repeat.ipynb")
    assert decisions == ["replayed", "replayed", "executed"]
    with Store.open(store, create=False) as opened:
        assert verify_store(opened).ok, "the value made again was not stored again"


def test_a_value_that_cannot_be_made_again_fails_the_cell_once_and_is_not_recorded(tmp_path: Path) -> None:
    """`a` comes from os.urandom: re-running its cell cannot give the recorded value, and a
    different value would be stale. The user's cell gets one clear NameError with no
    NBRewind frames; that run is not recorded, so the next repeat does not replay the
    failure: it runs the cells again and they succeed. Why the name is gone is in the
    kernel's log."""
    cells = ["import os\na = list(os.urandom(8))", "print(len(a))"]
    edited = [cells[0], "print(len(a), 'edited')"]
    nb = write_notebook(tmp_path / "nb.ipynb", cells)
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store, quiet=True)
    with Store.open(store, create=False) as opened:
        _flip(opened.objects.path_of(_entry_digest(store, "a")), at=-3)
    write_notebook(nb, edited)
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "first.ipynb", allow_errors=True)
    first = nbformat.read(str(tmp_path / "first.ipynb"), as_version=4)
    (error,) = first.cells[1].outputs
    assert error["output_type"] == "error" and error["ename"] == "NameError"
    assert error["evalue"] == "name 'a' is not defined", "what a plain kernel says for a name nobody defined"
    assert not [line for line in error["traceback"] if "nbrewind" in line], "NBRewind frames in the traceback"
    with Store.open(store, create=False) as opened:
        assert [r.decision for r in cell_log(opened, last_session=True)] == ["replayed"]
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "second.ipynb")
    second = nbformat.read(str(tmp_path / "second.ipynb"), as_version=4)
    assert second.cells[1].outputs[0]["text"] == "8 edited\n"
    assert "NBRewind" not in _all_text(tmp_path / "second.ipynb")


def test_notices_go_to_the_kernel_log_not_the_cells_outputs(tmp_path: Path) -> None:
    """A cell whose value cannot be stored makes NBRewind say so; with NBREWIND_DEBUG the
    info lines are written too. None of it may reach the notebook."""
    cells = ["import threading\nlock = threading.Lock()", "with lock:\n    x = 1\nprint(x)"]
    nb = write_notebook(tmp_path / "nb.ipynb", cells)
    env = {**os.environ, "NBREWIND_DEBUG": "1"}
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store, output=tmp_path / "audit.ipynb", env=env)
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "repeat.ipynb", env=env)
    for name in ("audit.ipynb", "repeat.ipynb"):
        assert "NBRewind" not in _all_text(tmp_path / name), name
