"""The round trip of issue 7 on real kernels: audit in folder A, pack with the
data, delete A, unpack into B elsewhere; repeat refuses the untrusted store and
runs every cell, then after `trust` replays every cell with identical outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from backpack_tools import CSV, notebook_json

from nbrewind.pack import pack, trust, unpack
from nbrewind.run import run_notebook
from nbrewind.store import Store

pytestmark = pytest.mark.kernel

CELLS = (
    "import csv\nfrom pathlib import Path\nimport dask\nfrom helpers import total",
    "lines = Path('data.csv').read_text().splitlines()\nrows = [[int(v) for v in r] for r in list(csv.reader(lines))[1:]]\nprint(rows)",
    "parts = [dask.delayed(sum)(r) for r in rows]\nresult = dask.compute(*parts, scheduler='sync')\nresult",
    "total(rows) * 2",
)


def _outputs(path: Path) -> list[Any]:
    return [cell["outputs"] for cell in json.loads(path.read_text())["cells"]]


def _repeat_runs(store: Path) -> list[str]:
    with Store.open(store, create=False, readonly=True) as opened:
        return [r.decision or "" for r in opened.catalog.cell_runs() if r.kernel == "repeat"]


def test_audit_pack_unpack_trust_repeat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "A"
    a.mkdir()
    (a / "data.csv").write_bytes(CSV)
    (a / "helpers.py").write_text("def total(rows):\n    return sum(sum(r) for r in rows)\n")
    (a / "nb.ipynb").write_text(notebook_json(*CELLS))
    run_notebook(a / "nb.ipynb", kernel="audit", output=a / "audited.ipynb")
    audited = _outputs(a / "audited.ipynb")
    assert "".join(audited[1][0]["text"]) == "[[1, 2], [3, 4]]\n"
    assert "".join(audited[3][0]["data"]["text/plain"]) == "20"

    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "packer-trust.db"))
    archive = tmp_path / "shipped" / "nb.backpack.tar.zst"
    archive.parent.mkdir()
    pack(a / "nb.ipynb", archive, include_data=True)
    shutil.rmtree(a)  # with --include-data nothing of A is needed

    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "receiver-trust.db"))  # another machine
    b = tmp_path / "elsewhere" / "B"
    b.parent.mkdir()
    result = unpack(archive, b)
    assert not result.trusted and result.environment == []
    store = b / "nb.ipynb.nbrewind"

    capfd.readouterr()
    run_notebook(b / "nb.ipynb", kernel="repeat", output=b / "untrusted.ipynb")
    untrusted = _outputs(b / "untrusted.ipynb")
    # The notice goes to the kernel's own stderr (the terminal of `jupyter nbrewind run`),
    # never into the notebook: the outputs are a plain kernel's.
    warning = capfd.readouterr().err
    assert "has not trusted" in warning and f"jupyter nbrewind trust {b}" in warning
    assert untrusted[0] == audited[0]
    assert untrusted[1:] == audited[1:]  # every cell ran, as on a plain kernel
    assert _repeat_runs(store) == []  # nothing read from (or written to) the untrusted store

    trust(b)
    run_notebook(b / "nb.ipynb", kernel="repeat", output=b / "trusted.ipynb")
    assert _repeat_runs(store) == ["replayed"] * len(CELLS)
    assert _outputs(b / "trusted.ipynb") == audited
