"""Issue 13, items 3 and 4 on real kernels: what a rebuild record needs survives gc
and pack, and `verify` plus a re-audit repairs a damaged object.

A lock, a generator or a Dask client cannot be stored; the repeat kernel makes it
again by re-running its cell from the state before it. That state used to be named
only inside the record's JSON, so `gc --yes` past the grace period and
`pack`→`unpack`→`trust` lost it and the repeat failed with ``NameError``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nbrewind.run import run_notebook
from nbrewind.store import Store, verify_store

pytestmark = pytest.mark.kernel

LOCK_CELLS = [
    "import threading\nbase = [1, 2, 3]",
    "lock = threading.Lock()\nmade = sum(base)",
    "with lock:\n    print('inside', made, base)",
]
CLIENT_CELLS = [
    "from distributed import Client, LocalCluster\nbase = [1, 2, 3]",
    "cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)\n"
    "client = Client(cluster)",
    "print(client.submit(sum, base).result())",
]


def _notebook(path: Path, cells: list[str]) -> Path:
    sources = [
        {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": s}
        for i, s in enumerate(cells)
    ]
    meta = {"language_info": {"name": "python"}}
    path.write_text(json.dumps({"cells": sources, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _outputs(path: Path) -> list[Any]:
    return [cell["outputs"] for cell in json.loads(path.read_text())["cells"]]


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbrewind.cli", *args], capture_output=True, text=True, timeout=300, check=check
    )


def _edited(cells: list[str]) -> list[str]:
    """The last cell changed, so it runs on repeat and needs the unstorable value."""
    last = cells[-1]
    return [*cells[:-1], last[: last.rindex(")")] + ", 'again')"]


@pytest.fixture(autouse=True)
def _own_trust_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "trust.db"))


@pytest.mark.parametrize(
    "cells",
    [pytest.param(LOCK_CELLS, id="lock"), pytest.param(CLIENT_CELLS, id="client", marks=pytest.mark.cluster)],
)
def test_gc_past_the_grace_period_keeps_what_a_rebuild_needs(tmp_path: Path, cells: list[str]) -> None:
    nb = _notebook(tmp_path / "nb.ipynb", cells)
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store)
    with Store.open(store, create=False) as opened:
        old = time.time() - 7200
        for digest in opened.objects.iter_digests():
            os.utime(opened.objects.path_of(digest), (old, old))
    result = json.loads(_cli("gc", "--yes", "--json", "--store", str(store)).stdout)
    assert result["removed"] == [] and result["reachable"] > 0
    _notebook(nb, _edited(cells))
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "repeat.ipynb")
    run_notebook(nb, kernel="python3", output=tmp_path / "plain.ipynb")
    assert _outputs(tmp_path / "repeat.ipynb") == _outputs(tmp_path / "plain.ipynb")
    assert "again" in json.dumps(_outputs(tmp_path / "repeat.ipynb")[-1])
    with Store.open(store, create=False, readonly=True) as opened:
        assert verify_store(opened).ok
        assert [r.decision for r in opened.catalog.cell_runs() if r.kernel == "repeat"] == [
            "replayed", "replayed", "executed",
        ]


@pytest.mark.parametrize(
    "cells",
    [pytest.param(LOCK_CELLS, id="lock"), pytest.param(CLIENT_CELLS, id="client", marks=pytest.mark.cluster)],
)
def test_pack_unpack_trust_keeps_what_a_rebuild_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cells: list[str]) -> None:
    from nbrewind.pack import pack, trust, unpack

    a = tmp_path / "A"
    a.mkdir()
    nb = _notebook(a / "nb.ipynb", cells)
    run_notebook(nb, kernel="audit")
    archive = tmp_path / "nb.backpack.tar.zst"
    pack(nb, archive)
    shutil.rmtree(a)
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "receiver-trust.db"))
    b = tmp_path / "B"
    unpack(archive, b)
    trust(b)
    _notebook(b / "nb.ipynb", _edited(cells))
    run_notebook(b / "nb.ipynb", kernel="repeat", output=b / "repeat.ipynb")
    run_notebook(b / "nb.ipynb", kernel="python3", output=b / "plain.ipynb")
    assert _outputs(b / "repeat.ipynb") == _outputs(b / "plain.ipynb")
    with Store.open(b / "nb.ipynb.nbrewind", create=False, readonly=True) as opened:
        decisions = [r.decision for r in opened.catalog.cell_runs() if r.kernel == "repeat"]
        assert decisions == ["replayed", "replayed", "executed"]
        assert verify_store(opened).ok


REPAIR_CELLS = [
    "import numpy as np\nbig = np.arange(600_000, dtype=np.float64) * 1.5",
    "small = {'k': list(range(50))}\nprint(len(small['k']))",
    "import threading\nlock = threading.Lock()",
]


def _damaged_audit(tmp_path: Path, which: tuple[str, ...]) -> tuple[Path, Path, dict[str, str]]:
    """Audit REPAIR_CELLS, then flip a body bit (only a full re-hash sees it) in the
    objects named by ``which``: "small" (a value group), "chunk" (a chunk of big),
    "state" (the state the lock is rebuilt from)."""
    nb = _notebook(tmp_path / "nb.ipynb", REPAIR_CELLS)
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store)
    with Store.open(store, create=False) as opened:
        entries = opened.catalog.checkpoint_entries(opened.catalog.cell_runs()[-1].checkpoint_id or 0)
        chunk_list = opened.objects.get_tree(entries["big"][0])[0][0]
        digests = {
            "small": entries["small"][0],
            "chunk": opened.objects.get_tree(chunk_list)[0][1],
            "state": json.loads(opened.objects.get_tree(entries["lock"][0])[1])["parent_entries"],
        }
        for key in which:
            path = opened.objects.path_of(digests[key])
            path.chmod(0o644)
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0x04
            path.write_bytes(bytes(data))
    return nb, store, {k: digests[k] for k in which}


def test_verify_names_the_damage_and_a_re_audit_repairs_it(tmp_path: Path) -> None:
    """verify moves damaged files aside and names the cell runs; running the notebook
    again on the audit kernel writes the same objects again, and verify passes."""
    nb, store, damaged = _damaged_audit(tmp_path, ("small", "chunk"))
    found = _cli("verify", str(store), check=False)
    assert found.returncode == 1 and "Traceback" not in found.stderr
    corrupt = sorted(line.split()[1].rstrip(":") for line in found.stdout.splitlines() if line.startswith("corrupt:"))
    assert corrupt == sorted(damaged.values())
    broken = [line for line in found.stdout.splitlines() if line.startswith("broken:")]
    assert any("checkpoint entry 'small'" in line and "cell run #2 (In [2]) and 1 later" in line for line in broken), broken
    assert any("checkpoint entry 'big'" in line and "cell run #1 (In [1]) and 2 later" in line for line in broken), broken
    assert any("rebuild record of 'lock'" in line for line in broken), broken  # its state holds both
    assert all("audit kernel" in line for line in broken)
    for digest in damaged.values():
        assert (store / "corrupt" / digest).is_file() and not (store / "objects" / digest[:2] / digest[2:]).exists()

    run_notebook(nb, kernel="audit", store=store)
    again = _cli("verify", str(store), check=False)
    assert again.returncode == 0, again.stdout
    with Store.open(store, create=False, readonly=True) as opened:
        for digest in damaged.values():
            opened.objects.verify(digest)


def test_a_re_audit_mends_a_damaged_rebuild_state(tmp_path: Path) -> None:
    nb, store, damaged = _damaged_audit(tmp_path, ("state",))
    found = _cli("verify", str(store), check=False)
    assert found.returncode == 1 and "rebuild record of 'lock'" in found.stdout
    run_notebook(nb, kernel="audit", store=store)
    assert _cli("verify", str(store), check=False).returncode == 0
