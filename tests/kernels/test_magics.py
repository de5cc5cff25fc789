"""Magics the session trusts replay on real kernels (`nbrewind.session.policy`)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from kernels.test_kernels import write_notebook
from nbrewind.run import run_notebook
from nbrewind.store import Store
from nbrewind.store.report import cell_log

pytestmark = pytest.mark.kernel

CELLS = [
    "%matplotlib inline",
    "import matplotlib.pyplot as plt\nxs = [1, 2, 3]",
    "%time total = sum(xs)",
    "print(total)",
]


def test_matplotlib_and_time_cells_replay_and_their_writes_come_back(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", CELLS)
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store, quiet=True)
    write_notebook(nb, [*CELLS[:3], "print(total, 'edited')\nplt.plot(xs)\nprint(plt.get_backend())"])
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "repeat.ipynb", quiet=True)
    run_notebook(nb, kernel="python3", output=tmp_path / "fresh.ipynb", quiet=True)
    with Store.open(store, create=False) as opened:
        decisions = [(r.decision, r.reason) for r in cell_log(opened, last_session=True)]
    assert [d for d, _ in decisions] == ["replayed", "replayed", "replayed", "executed"], decisions
    repeat = nbformat.read(str(tmp_path / "repeat.ipynb"), as_version=4).cells[3].outputs
    fresh = nbformat.read(str(tmp_path / "fresh.ipynb"), as_version=4).cells[3].outputs
    # Stream text may arrive in one message or two: compare what it says.
    text = lambda outs: "".join(o.get("text", "") for o in outs if o["output_type"] == "stream")  # noqa: E731
    assert text(repeat) == text(fresh) == "6 edited\ninline\n", "the backend %matplotlib chose, as in a fresh run"
    kinds = lambda outs: [(o["output_type"], sorted(o.get("data", {}))) for o in outs if o["output_type"] != "stream"]  # noqa: E731
    assert kinds(repeat) == kinds(fresh), "the plot of the edited cell, shown inline as on a plain kernel"
