"""Store signatures on real files and real SQLite: what we write stays trusted, and
no edit, copy, deletion or addition by anyone else makes a store trusted."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbrewind.errors import UntrustedStoreError
from nbrewind.pack import trust
from nbrewind.store import Catalog, CellRun, Store, TaskLogEntry, digest_bytes
from nbrewind.store.origin import check_store_origin, is_trusted, store_trust
from nbrewind.store.signing import catalog_head, secret_path, signature_db, user_keys

def _record(store: Store, session: str = "s", n: int = 3) -> None:
    """Every kind of write the kernels make, plus the odd values SQLite stores."""
    catalog, objects = store.catalog, store.objects
    for i in range(n):
        value = objects.put(f"value {session} {i}".encode())
        with catalog.transaction():
            run = catalog.add_cell_run(CellRun(
                session=session, kernel="audit", code=f"x = {i}  # é ☃ \U0001F600", code_digest=digest_bytes(b"%d" % i),
                started=3, duration=0.5, reply={"status": "ok", "n": i}, inputs={"@file:a.csv": value},
            ))
            checkpoint = catalog.add_checkpoint(run, None, {"x": (value, {"kind": "value"}), "y": (value, None)})
            catalog.set_cell_run_checkpoint(run, checkpoint)
            catalog.log_tasks([TaskLogEntry(fingerprint=f"{session}-{i}", hit=True, duration=2, result_digest=value)])
        with catalog.transaction():  # rows of the refs table, as catalogs from before refs were files have
            for digest in (value, value[::-1]):  # REPLACE deletes the old row
                catalog._conn.execute(
                    "INSERT OR REPLACE INTO refs (namespace, name, digest, updated) VALUES ('names', ?, ?, 0)",
                    (f"{session}{i}", digest),
                )
            catalog._conn.execute("DELETE FROM refs WHERE name = 'absent'")
        objects.ref_set("tasks", f"{session}{i}", value)


def _signed(root: Path) -> bool:
    return is_trusted(root)  # False for a catalog that cannot even be read


def test_every_write_keeps_the_store_signed(tmp_path: Path) -> None:
    root = tmp_path / "s.nbrewind"
    with Store.open(root) as store:
        assert _signed(root)  # signed when created, before any row
        _record(store)
        assert _signed(root)
        # The head kept row by row is the head computed from every row.
        with sqlite3.connect(root / "catalog.sqlite") as conn:
            kept = conn.execute("SELECT value FROM meta WHERE key = ?", (f"head:{user_keys().key_id}",)).fetchone()[0]
            assert int(kept, 16) == catalog_head(conn, user_keys().rows)
    with Store.open(root) as store:  # a later kernel goes on from the signed head
        _record(store, session="t", n=2)
    assert _signed(root) and check_store_origin(root) is None


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO task_log (fingerprint, cell_run_id, created) VALUES ('more', 1, 1.5)",  # into an existing group
        "INSERT INTO task_log (fingerprint, cell_run_id, created) VALUES ('none', NULL, 2)",  # the NULL group
        "INSERT INTO task_log (fingerprint, cell_run_id, created) VALUES ('real', 1.0, 2)",  # 1.0 is not 1
        "UPDATE task_log SET cell_run_id = 2 WHERE id = 1",  # a row moves to another group
        "UPDATE task_log SET hit = 1",
        "DELETE FROM task_log WHERE id = 2",
        "DELETE FROM task_log",
        "DELETE FROM checkpoint_entries WHERE name = 'x'",
        "UPDATE checkpoint_entries SET meta = NULL WHERE checkpoint_id = 1",
        "INSERT INTO checkpoint_entries (checkpoint_id, name, digest) VALUES (1, 'late', 'd')",
        "INSERT OR REPLACE INTO checkpoint_entries (checkpoint_id, name, digest) VALUES (2, 'x', 'd')",
        "UPDATE cell_runs SET code = 'edited', duration = NULL WHERE id = 3",
        "DELETE FROM checkpoint_entries WHERE checkpoint_id = 3",  # a whole group goes
        "UPDATE refs SET digest = 'z'",
    ],
)
def test_any_write_through_the_catalog_keeps_it_signed(tmp_path: Path, sql: str) -> None:
    """The head kept write by write equals the head computed from all rows, whatever
    the statement: inserts into old groups, moves between groups, deletes, replaces."""
    root = tmp_path / "s.nbrewind"
    with Store.open(root) as store:
        _record(store)
        catalog = store.catalog
        with catalog.transaction():
            catalog._conn.execute(sql)
        assert _signed(root)
        catalog.log_tasks([TaskLogEntry(fingerprint="after", cell_run_id=1)])  # and the next commit builds on it
        assert _signed(root)


def test_secret_is_private_and_made_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "fresh" / "trust.db"))
    script = "from nbrewind.store.signing import user_keys; print(user_keys().key_id)"
    children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    ids = {child.communicate(timeout=60)[0].strip() for child in children}
    assert len(ids) == 1 and all(children[i].returncode == 0 for i in range(4))  # racing creators agree
    path = secret_path()
    assert path == tmp_path / "fresh" / "trust.secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert user_keys().key_id in ids
    assert [p.name for p in path.parent.iterdir()] == ["trust.secret"]


def test_an_edited_row_is_untrusted(tmp_path: Path) -> None:
    root = tmp_path / "s.nbrewind"
    with Store.open(root) as store:
        _record(store)
    evil = digest_bytes(b"someone else's object")
    with sqlite3.connect(root / "catalog.sqlite") as conn:
        conn.execute("UPDATE checkpoint_entries SET digest = ? WHERE name = 'x' AND checkpoint_id = 1", (evil,))
    verdict = store_trust(root)
    assert not verdict.trusted and "changed outside NBRewind" in verdict.reason
    with pytest.raises(UntrustedStoreError, match=f"jupyter nbrewind trust {root}"):
        check_store_origin(root)
    # Writing on top does not launder the edit: it is never signed.
    with Store.open(root) as store:
        store.catalog.add_cell_run(CellRun(session="later", code="y = 1"))
    assert not _signed(root)


@pytest.mark.parametrize(
    "edit",
    [
        "DELETE FROM task_log WHERE id = 1",
        "INSERT INTO refs (namespace, name, digest, updated) VALUES ('names', 'evil', '" + "e" * 32 + "', 0)",
        "UPDATE meta SET value = '0' WHERE key = 'schema_version'",
        "CREATE TRIGGER evil AFTER INSERT ON cell_runs BEGIN DELETE FROM task_log; END",
        "CREATE INDEX evil ON cell_runs(code)",
        "UPDATE cell_runs SET code = CAST(code AS BLOB) WHERE id = 1",  # the same bytes, another type
    ],
)
def test_any_other_edit_is_untrusted(tmp_path: Path, edit: str) -> None:
    root = tmp_path / "s.nbrewind"
    with Store.open(root) as store:
        store.catalog.add_cell_run(CellRun(session="s", code="x = 1", execution_count=1))
        _record(store, n=1)
    with sqlite3.connect(root / "catalog.sqlite") as conn:
        conn.execute(edit)
    assert not _signed(root)


def test_manifest_presence_or_absence_grants_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s.nbrewind"
    with Store.open(root) as store:
        _record(store, n=1)
    (root / "manifest.json").write_text("{}")
    assert not _signed(root)  # adding a manifest makes it another store
    (root / "manifest.json").unlink()
    assert _signed(root)  # back to what we signed
    # An untrusted store stays untrusted whatever happens to its manifest.
    with sqlite3.connect(root / "catalog.sqlite") as conn:
        conn.execute("UPDATE cell_runs SET code = 'evil' WHERE id = 1")
    for present in (True, False):
        if present:
            (root / "manifest.json").write_text("{}")
        else:
            (root / "manifest.json").unlink()
        assert not _signed(root)


def test_copies_are_trusted_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.nbrewind"
    with Store.open(mine) as store:
        _record(store)
    shutil.copytree(mine, tmp_path / "copy.nbrewind")
    assert _signed(tmp_path / "copy.nbrewind")  # a copy of what I signed is what I signed

    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "alice" / "trust.db"))  # another user's secret
    with Store.open(tmp_path / "alices.nbrewind") as store:
        _record(store, session="alice")
    assert _signed(tmp_path / "alices.nbrewind")
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "bob" / "trust.db"))
    subprocess.run(["cp", "-r", str(tmp_path / "alices.nbrewind"), str(tmp_path / "bobs-copy.nbrewind")], check=True)
    assert not _signed(tmp_path / "alices.nbrewind") and not _signed(tmp_path / "bobs-copy.nbrewind")
    assert not _signed(mine)  # and Bob does not trust my store either
    with Store.open(tmp_path / "bobs-copy.nbrewind") as store:
        assert store.objects.ref_get("tasks", "alice0") is None  # Alice's refs are misses for Bob
        store.catalog.add_cell_run(CellRun(session="bob", code="x = 1"))  # writing does not make it Bob's
    assert not _signed(tmp_path / "bobs-copy.nbrewind")

    result = trust(tmp_path / "bobs-copy.nbrewind")  # until Bob says so
    assert result.newly_trusted and result.manifest_sha256 is None and result.refs_signed == 3
    assert _signed(tmp_path / "bobs-copy.nbrewind")
    with Store.open(tmp_path / "bobs-copy.nbrewind") as store:
        assert store.objects.ref_get("tasks", "alice0") is not None
        _record(store, session="bob2", n=1)  # and from then on Bob's writes keep it signed
    assert _signed(tmp_path / "bobs-copy.nbrewind")


def test_refs_need_this_users_mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store.open(tmp_path / "s.nbrewind") as store:
        objects = store.objects
        good, evil = objects.put(b"good"), objects.put(b"evil")
        objects.ref_set("tasks", "f1", good)
        assert objects.ref_get("tasks", "f1") == good
        path = objects.refs_dir / "tasks" / "f1" / "f1"
        text = path.read_text()
        assert text.startswith(good + " ") and len(text.split()) == 2
        for forged in (f"{evil}\n", text.replace(good, evil), f"{evil} {'0' * 64}\n"):
            path.chmod(0o644)
            path.write_text(forged)
            assert objects.ref_get("tasks", "f1") is None  # a miss, never the forged target
        objects.ref_set("tasks", "f2", good)
        moved = objects.refs_dir / "tasks" / "f3" / "f3"  # a valid MAC under another name is no MAC
        moved.parent.mkdir()
        shutil.copy(objects.refs_dir / "tasks" / "f2" / "f2", moved)
        assert objects.ref_get("tasks", "f3") is None
        assert dict(objects.iter_refs("tasks", trusted_only=True)) == {"f2": good}
        assert dict(objects.iter_refs("tasks")) == {"f1": evil, "f2": good, "f3": good}  # gc still sees them all


def test_signatures_are_culled_per_store(tmp_path: Path) -> None:
    root = tmp_path / "s.nbrewind"
    with Store.open(root) as store:
        for i in range(30):
            store.catalog.add_cell_run(CellRun(session="s", code=f"x = {i}"))
    with sqlite3.connect(signature_db().path) as conn:
        kept = conn.execute("SELECT COUNT(*) FROM signatures WHERE store = ?", (str(root),)).fetchone()[0]
    assert kept == 8 and _signed(root)


KILL_BETWEEN_SIGN_AND_COMMIT = """
    import os, signal, sys
    from nbrewind.store import CellRun, Store
    from nbrewind.store.signing import CatalogSigner

    signed = CatalogSigner.before_commit

    def sign_then_die(self, conn):
        signed(self, conn)
        if self._pending is not None and os.environ.get("DIE") == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # signed, not committed

    CatalogSigner.before_commit = sign_then_die
    with Store.open(sys.argv[1]) as store:
        store.catalog.add_cell_run(CellRun(session="s", code="first"))
        os.environ["DIE"] = "1"
        store.catalog.add_cell_run(CellRun(session="s", code="second"))
"""


def test_a_kill_between_signing_and_commit_stays_trusted(tmp_path: Path) -> None:
    root = tmp_path / "s.nbrewind"
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(KILL_BETWEEN_SIGN_AND_COMMIT), str(root)], timeout=60)
    assert child.returncode == -9
    with Catalog(root / "catalog.sqlite", readonly=True) as catalog:
        assert [r.code for r in catalog.cell_runs()] == ["first"]  # the second never committed
    assert _signed(root)
    with Store.open(root) as store:
        store.catalog.add_cell_run(CellRun(session="s", code="third"))
    assert _signed(root)


TWIN = """
    import sys
    from nbrewind.store import CellRun, Store, TaskLogEntry
    with Store.open(sys.argv[1]) as store:
        for i in range(25):
            with store.catalog.transaction():
                store.catalog.add_cell_run(CellRun(session=sys.argv[2], code=f"step {i}", status="ok"))
                store.catalog.log_tasks([TaskLogEntry(fingerprint=f"{sys.argv[2]}-{i}")])
"""


def test_two_processes_writing_at_once_keep_it_signed(tmp_path: Path) -> None:
    root = tmp_path / "s.nbrewind"
    Store.open(root).close()
    children = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(TWIN), str(root), tag], stderr=subprocess.PIPE, text=True)
        for tag in ("p1", "p2")
    ]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    with Catalog(root / "catalog.sqlite", readonly=True) as catalog:
        assert len(catalog.cell_runs()) == 50
    assert _signed(root)


def test_a_store_from_before_signing_is_untrusted_until_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "trust" / "trust.db"))
    root = tmp_path / "old.nbrewind"
    with Store.open(root) as store:
        _record(store)
    # What an NBRewind that did not sign stores left: the same rows, no signature.
    signature_db().close()
    os.remove(signature_db().path)
    verdict = store_trust(root)
    assert not verdict.trusted and "did not sign" in verdict.reason
    with pytest.raises(UntrustedStoreError) as raised:
        check_store_origin(root)
    assert f"run `jupyter nbrewind trust {root}`" in str(raised.value)
    trust(root)
    assert is_trusted(root)
    with Store.open(root) as store:
        _record(store, session="after", n=1)
    assert is_trusted(root)
