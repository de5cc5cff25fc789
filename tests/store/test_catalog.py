"""The SQLite catalog: records, JSON columns, transactions, schema versions."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from nbrewind.errors import ReadOnlyStoreError, SchemaTooNewError, StoreError
from nbrewind.store import Catalog, CellRun, TaskLogEntry, digest_bytes
from nbrewind.store.catalog import SCHEMA_VERSION

D1, D2, D3 = (digest_bytes(bytes([i])) for i in range(3))


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog(tmp_path / "catalog.sqlite") as opened:
        yield opened


def test_wal_and_schema_version(catalog: Catalog) -> None:
    assert catalog.schema_version == SCHEMA_VERSION
    with closing(sqlite3.connect(catalog.path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cell_run_roundtrip_with_json_fields(catalog: Catalog) -> None:
    run_id = catalog.add_cell_run(CellRun(
        session="s1",
        execution_count=3,
        code="x = 1",
        code_digest=D1,
        reply={"status": "ok", "payload": []},
        inputs={"y": D2},
        reads=["y"],
        writes=["x"],
        deletes=[],
        started=12.5,
    ))
    run = catalog.get_cell_run(run_id)
    assert isinstance(run, CellRun)
    assert (run.id, run.session, run.execution_count, run.code) == (run_id, "s1", 3, "x = 1")
    assert run.reply == {"status": "ok", "payload": []}
    assert run.inputs == {"y": D2} and run.reads == ["y"] and run.deletes == []
    assert run.outputs is None and run.duration is None

    checkpoint = catalog.add_checkpoint(run_id, None, {"x": (D3, None)})
    catalog.set_cell_run_checkpoint(run_id, checkpoint)
    assert catalog.get_cell_run(run_id) == CellRun(**{**run.__dict__, "checkpoint_id": checkpoint})
    with pytest.raises(KeyError):
        catalog.set_cell_run_checkpoint(run_id + 100, checkpoint)
    with pytest.raises(KeyError):
        catalog.get_cell_run(run_id + 100)


def test_the_given_id_is_the_catalogs(catalog: Catalog) -> None:
    first = catalog.add_cell_run(CellRun(id=77, code="a"))
    second = catalog.add_cell_run(CellRun(id=77, code="b"))
    assert first != second and 77 not in (first, second)
    catalog.log_tasks([TaskLogEntry(id=5, fingerprint="f"), TaskLogEntry(id=5, fingerprint="g")])
    assert [e.id for e in catalog.task_log()] == [1, 2]


def test_cell_run_ordering_and_lookup(catalog: Catalog) -> None:
    first = catalog.add_cell_run(CellRun(session="a", code="x", code_digest=D1))
    second = catalog.add_cell_run(CellRun(session="b", code="y", code_digest=D2))
    third = catalog.add_cell_run(CellRun(session="a", code="x", code_digest=D1))
    assert [r.id for r in catalog.cell_runs()] == [first, second, third]
    assert [r.id for r in catalog.cell_runs(session="a")] == [first, third]
    assert [r.id for r in catalog.find_cell_runs(D1)] == [third, first]
    assert catalog.find_cell_runs(D3) == []


def test_checkpoints(catalog: Catalog) -> None:
    run = catalog.add_cell_run(CellRun(code="a = 1"))
    first = catalog.add_checkpoint(run, None, {"a": (D1, {"type": "int"}), "b": (D2, {})})
    second = catalog.add_checkpoint(run, first, {"a": (D1, None)})
    assert catalog.checkpoint_entries(first) == {"a": (D1, {"type": "int"}), "b": (D2, {})}
    assert catalog.checkpoint_entries(second) == {"a": (D1, {})}
    header = catalog.get_checkpoint(second)
    assert (header.cell_run_id, header.parent_id) == (run, first)
    assert catalog.checkpoint_entries(999) == {}


def test_task_log(catalog: Catalog) -> None:
    run = catalog.add_cell_run(CellRun(code="compute"))
    count = catalog.log_tasks(
        [
            TaskLogEntry(fingerprint="f1", key_prefix="sum", cell_run_id=run, hit=False, result_digest=D1),
            TaskLogEntry(fingerprint="f2", cell_run_id=run, hit=True, nbytes=8),
            TaskLogEntry(fingerprint="f1", cell_run_id=None, result_digest=D2, created=5.0),
        ]
    )
    assert count == 3
    entries = catalog.task_log()
    assert [(e.fingerprint, e.hit) for e in entries] == [("f1", False), ("f2", True), ("f1", False)]
    assert entries[2].created == 5.0 and entries[0].created > 5.0
    assert [e.fingerprint for e in catalog.task_log(cell_run_id=run)] == ["f1", "f2"]
    assert catalog.task_result("f1") == D2
    assert catalog.task_result("f2") is None


def test_referenced_digests(catalog: Catalog) -> None:
    run = catalog.add_cell_run(CellRun(code="", outputs=D3))
    catalog.add_checkpoint(run, None, {"a": (D1, None)})
    catalog.add_checkpoint(run, None, {"a": (D1, None)})
    catalog.log_tasks([TaskLogEntry(fingerprint="f", result_digest=D3)])
    with catalog.transaction():  # a row of the refs table, as a catalog from before refs were files has
        catalog._conn.execute("INSERT INTO refs (namespace, name, digest, updated) VALUES ('latest', 'nb', ?, 0)", (D2,))
    assert catalog.referenced_digests() == {D1, D2, D3}
    assert catalog.reference_counts() == {D1: 2, D2: 1, D3: 2}


def test_transaction_rolls_back_everything(catalog: Catalog) -> None:
    with pytest.raises(RuntimeError):
        with catalog.transaction():
            run = catalog.add_cell_run(CellRun(code="lost"))
            catalog.add_checkpoint(run, None, {"a": (D1, None)})
            raise RuntimeError("boom")
    assert catalog.cell_runs() == []
    assert catalog.referenced_digests() == set()


def test_threads_share_one_catalog(catalog: Catalog) -> None:
    def work(n: int) -> None:
        for i in range(25):
            with catalog.transaction():
                run = catalog.add_cell_run(CellRun(session=f"t{n}", code=str(i)))
                catalog.add_checkpoint(run, None, {"v": (D1, {"i": i})})

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(catalog.cell_runs()) == 100
    assert [r.code for r in catalog.cell_runs(session="t2")] == [str(i) for i in range(25)]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    Catalog(path).close()
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaTooNewError, match="Upgrade nbrewind"):
        Catalog(path)
    with pytest.raises(SchemaTooNewError):
        Catalog(path, readonly=True)


def test_reopen_keeps_data_and_version(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    with Catalog(path) as first:
        run = first.add_cell_run(CellRun(code="kept"))
    with Catalog(path) as second:
        assert second.get_cell_run(run).code == "kept"
        assert second.schema_version == SCHEMA_VERSION


def test_readonly_catalog(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    with Catalog(path) as writer:
        run = writer.add_cell_run(CellRun(code="x"))
    with Catalog(path, readonly=True) as reader:
        assert reader.get_cell_run(run).code == "x"
        with pytest.raises(ReadOnlyStoreError):
            reader.add_cell_run(CellRun(code="y"))
    with pytest.raises(StoreError, match="no catalog"):
        Catalog(tmp_path / "missing.sqlite", readonly=True)


def test_garbage_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="damaged"):
        Catalog(path)


def test_migration_upgrades_an_older_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbrewind.store import catalog as catalog_module

    path = tmp_path / "catalog.sqlite"
    with Catalog(path) as old:
        run = old.add_cell_run(CellRun(code="before the upgrade"))
    upgraded = (*catalog_module.MIGRATIONS, "CREATE TABLE extra (x INTEGER); INSERT INTO extra VALUES (7)")
    monkeypatch.setattr(catalog_module, "MIGRATIONS", upgraded)
    monkeypatch.setattr(catalog_module, "SCHEMA_VERSION", len(upgraded))
    with Catalog(path) as new:
        assert new.schema_version == SCHEMA_VERSION + 1
        assert new.get_cell_run(run).code == "before the upgrade"
        assert new._query("SELECT x FROM extra") == [(7,)]
    monkeypatch.undo()
    with pytest.raises(SchemaTooNewError):
        Catalog(path)  # the older code refuses the upgraded catalog
