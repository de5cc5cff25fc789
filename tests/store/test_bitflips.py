"""Bit flips in every kind of store file (issue 13): reading gives the stored value
or the store's typed error, the repeat kernel re-runs around the damage with a
plain kernel's outputs, and `jupyter nbrewind verify` names it without a traceback.

The store comes from a real audit kernel; the flips are in its real files (see
``bitflip_tools``, which also prints the figures recorded in docs/reliability.md).
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bitflip_tools import KINDS, REPEAT_CELLS, audit, catalog_snapshot, classify, copy_store, flipped, run_suite, write_notebook

from nbrewind.errors import StoreError
from nbrewind.run import run_notebook
from nbrewind.store import Store
from nbrewind.store.store import CATALOG_NAME

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A store recorded by a real audit kernel, its WAL folded into catalog.sqlite;
    tests work on copies (a signature covers content, not place)."""
    folder = tmp_path_factory.mktemp("flips")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NBREWIND_TRUST_DB", str(folder / "trust.db"))
        _, store = audit(folder / "nb")
        with sqlite3.connect(store / CATALOG_NAME) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        yield store


@pytest.fixture
def trust_db(audited: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(audited.parent.parent / "trust.db"))


def _outputs(path: Path) -> list[Any]:
    cleaned = []
    for cell in json.loads(path.read_text())["cells"]:
        outs = []
        for out in cell["outputs"]:
            out = {k: v for k, v in out.items() if k not in ("metadata", "execution_count")}
            if out.get("output_type") == "error":
                out["traceback"] = out["traceback"][-1:]
            outs.append(out)
        cleaned.append(outs)
    return cleaned


def test_every_kind_of_store_file_is_present(audited: Path, trust_db: None) -> None:
    kinds = {f.kind for f in classify(audited)}
    assert kinds == set(KINDS)


def test_no_bit_flip_reads_back_as_a_wrong_value(audited: Path, trust_db: None, tmp_path: Path) -> None:
    store = copy_store(audited, tmp_path / "s")
    tallies = run_suite(store, object_samples=6, catalog_samples=150, seed=7)
    for kind, tally in tallies.items():
        assert tally.files >= 1, kind
        assert tally.missed == [], (kind, tally.missed[:5])
        assert tally.detected >= tally.flips * 0.9 or kind == "catalog", (kind, tally)
    for kind in ("leaf object", "tree", "blob chunk", "chunk list", "outputs", "rebuild record"):
        tally = tallies[kind]
        # Every header bit is caught by the put path too (only a large leaf's kind bit
        # is not), so re-storing the same bytes replaces the damaged file; so is every
        # flip in a file small enough to re-hash.
        assert tally.rewritten >= tally.files * (64 - 1), (kind, tally)
        if kind not in ("blob chunk",):
            # A flip that still reads back as what was stored (a bit nothing decodes) leaves a
            # sound file, which a put may keep; every other flip is rewritten.
            assert tally.flips - tally.intact <= tally.rewritten <= tally.flips, (kind, tally)
    assert tallies["catalog"].detected > 0 and tallies["catalog"].intact > 0


def test_a_damaged_catalog_index_never_proposes_another_cells_run(audited: Path, trust_db: None, tmp_path: Path) -> None:
    """SQLite answers from a damaged index as it stands, rowids included: the catalog
    must re-read each proposed row and check its code digest."""
    store = copy_store(audited, tmp_path / "s")
    db = store / CATALOG_NAME
    with sqlite3.connect(db) as conn:
        page = next(p for name, p in conn.execute("SELECT name, pageno FROM dbstat") if name == "cell_runs_code_digest")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    runs, _, _, by_code = catalog_snapshot(store)
    rng = random.Random(3)
    proposed_wrong = damaged = 0
    for offset in range((page - 1) * size, page * size):
        restore = flipped(db, offset, rng.randrange(8))
        try:
            try:
                with Store.open(store, create=False, readonly=True) as opened:
                    for digest, ids in by_code.items():
                        for run in opened.catalog.find_cell_runs(digest):
                            if run.id not in ids or run not in runs:
                                proposed_wrong += 1
            except StoreError:
                damaged += 1
        finally:
            restore()
    assert proposed_wrong == 0
    assert damaged < size  # most flips are read, not refused: the check above did run


def test_a_damaged_catalog_file_is_reported_by_name(audited: Path, trust_db: None, tmp_path: Path) -> None:
    store = copy_store(audited, tmp_path / "s")
    flipped(store / CATALOG_NAME, 3, 2)  # inside "SQLite format 3"
    with pytest.raises(StoreError, match=r"catalog .*catalog\.sqlite is damaged") as raised:
        Store.open(store, create=False)
    assert "backup" in str(raised.value)
    result = subprocess.run(
        [sys.executable, "-m", "nbrewind.cli", "log", "--store", str(store)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "catalog.sqlite" in result.stderr and "damaged" in result.stderr


def _flip_for(kind: str, path: Path, store: Path) -> tuple[int, int]:
    """A flip that damages a file of this kind in a way its reader must notice."""
    if kind == "catalog":
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            page = next(p for name, p in conn.execute("SELECT name, pageno FROM dbstat") if name == "cell_runs")
        conn.close()
        return page * 4096 - 200, 1  # inside a cell run's row (the code text, near the page's end)
    if kind in ("marker", "ref"):
        return 3, 0
    return 7, 0  # the frame header's reserved byte


@pytest.mark.parametrize("kind", KINDS)
def test_the_repeat_kernel_reruns_around_a_damaged_file(audited: Path, trust_db: None, tmp_path: Path, kind: str) -> None:
    store = copy_store(audited, tmp_path / "flips.ipynb.nbrewind")
    nb = write_notebook(tmp_path / "flips.ipynb", REPEAT_CELLS)
    run_notebook(nb, kernel="python3", output=tmp_path / "plain.ipynb")
    target = next(f for f in classify(store) if f.kind == kind)
    offset, bit = _flip_for(kind, target.path, store)
    flipped(target.path, offset, bit)
    if target.digest is not None:
        other = copy_store(store, tmp_path / "verified" / "flips.ipynb.nbrewind")
        verified = subprocess.run(
            [sys.executable, "-m", "nbrewind.cli", "verify", str(other)], capture_output=True, text=True, timeout=300
        )
        assert verified.returncode == 1 and "Traceback" not in verified.stderr
        assert f"corrupt: {target.digest}" in verified.stdout and "broken: " in verified.stdout
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "repeat.ipynb", allow_errors=True)
    assert _outputs(tmp_path / "repeat.ipynb") == _outputs(tmp_path / "plain.ipynb")
