"""The kernels take file digests from the memo of earlier kernels (`nbrewind.identity.memo`).

Real audit and repeat kernels through `nbrewind.run`. The observable: a memo row forged
for the notebook's input file (valid checksum, wrong digest) makes the repeat see a
changed input and run the cell that reads it, where an honest memo replays it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import nbformat
import pytest

from nbrewind.identity import memo as memo_module
from nbrewind.run import run_notebook
from nbrewind.store import Store
from nbrewind.store.report import cell_log

pytestmark = pytest.mark.kernel


def decisions(store: Path) -> list[str]:
    with Store.open(store, create=False) as opened:
        return [r.decision for r in cell_log(opened, last_session=True)]


def test_the_repeat_kernel_takes_file_digests_from_the_memo(tmp_path: Path) -> None:
    memo_file = Path(os.environ["NBREWIND_DIGEST_MEMO"])
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(50_000))
    nb = tmp_path / "nb.ipynb"
    cells = ["n = len(open('data.bin', 'rb').read())", "print(n)"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), nb)
    store = tmp_path / "nb.ipynb.nbrewind"
    while time.time_ns() - data.stat().st_ctime_ns < memo_module.SETTLED_NS:
        time.sleep(0.2)  # old enough to be remembered (see memo.SETTLED_NS)
    run_notebook(nb, kernel="audit", store=store, quiet=True)
    with sqlite3.connect(memo_file) as conn:
        row = conn.execute("SELECT host, dev, ino, size, mtime, ctime, digest FROM digests WHERE path = ?", (str(data),)).fetchone()
    assert row is not None  # the audit kernel remembered the input it hashed
    run_notebook(nb, kernel="repeat", store=store, quiet=True)
    assert decisions(store) == ["replayed", "replayed"]

    host, *sig, _ = row
    forged = "f" * 32
    with sqlite3.connect(memo_file) as conn:
        conn.execute(
            "UPDATE digests SET digest = ?, check_ = ? WHERE path = ?",
            (forged, memo_module._check(str(data), host, tuple(sig), forged), str(data)),
        )
    run_notebook(nb, kernel="repeat", store=store, quiet=True)
    assert decisions(store)[0] == "executed"  # the kernel believed the memo: the input "changed"
