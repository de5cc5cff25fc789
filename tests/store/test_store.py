"""The store facade, its location rules, and du / verify / gc."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from nbrewind.errors import NotAStoreError, ReadOnlyStoreError, SchemaTooNewError
from nbrewind.store import BLOB_CHUNK_SIZE, CellRun, Store, TaskLogEntry, du, gc, resolve_store_path, verify_store


def test_create_then_reopen(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "store"
    with Store.open(root) as store:
        digest = store.objects.put(b"persisted")
        run = store.catalog.add_cell_run(CellRun(code="x", outputs=digest))
    marker = json.loads((root / "nbrewind-store.json").read_text())
    assert marker == {"format": "nbrewind-store", "version": 1}
    assert (root / "catalog.sqlite").is_file() and (root / "objects").is_dir()
    with Store.open(root, create=False) as again:
        assert again.objects.get(digest) == b"persisted"
        assert again.catalog.get_cell_run(run).outputs == digest


def test_empty_folder_becomes_a_store(tmp_path: Path) -> None:
    Store.open(tmp_path).close()
    assert (tmp_path / "nbrewind-store.json").is_file()


def test_foreign_folder_is_not_adopted(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(NotAStoreError, match="not empty"):
        Store.open(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["thesis.tex"]


def test_missing_or_file_or_bad_marker(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError):
        Store.open(tmp_path / "absent", create=False)
    with pytest.raises(NotAStoreError):
        Store.open(tmp_path / "absent", readonly=True)
    assert not (tmp_path / "absent").exists()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NotAStoreError, match="file"):
        Store.open(tmp_path / "a-file")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "nbrewind-store.json").write_text("{not json")
    with pytest.raises(NotAStoreError, match="marker"):
        Store.open(bad)


def test_newer_store_format_is_refused(tmp_path: Path) -> None:
    Store.open(tmp_path).close()
    (tmp_path / "nbrewind-store.json").write_text(json.dumps({"format": "nbrewind-store", "version": 2}))
    with pytest.raises(SchemaTooNewError, match="Upgrade nbrewind"):
        Store.open(tmp_path)


def test_readonly_open(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        digest = store.objects.put(b"v")
    with Store.open(tmp_path, readonly=True) as reader:
        assert reader.objects.get(digest) == b"v"
        with pytest.raises(ReadOnlyStoreError):
            reader.objects.put(b"w")
        with pytest.raises(ReadOnlyStoreError):
            reader.catalog.add_cell_run(CellRun(code=""))
        with pytest.raises(ReadOnlyStoreError):
            gc(reader, dry_run=False)


def test_resolve_store_path(tmp_path: Path) -> None:
    cwd = tmp_path / "work"
    assert resolve_store_path({"NBREWIND_STORE": "/data/s"}, "nb.ipynb", cwd) == Path("/data/s")
    assert resolve_store_path({"NBREWIND_STORE": "rel"}, None, cwd) == cwd / "rel"
    assert resolve_store_path({}, "/home/u/a.ipynb", cwd) == Path("/home/u/a.ipynb.nbrewind")
    assert resolve_store_path({}, "sub/a.ipynb", cwd) == cwd / "sub" / "a.ipynb.nbrewind"
    assert resolve_store_path({"JPY_SESSION_NAME": "/p/q.ipynb"}, None, cwd) == Path("/p/q.ipynb.nbrewind")
    # A console session name is not a notebook path.
    assert resolve_store_path({"JPY_SESSION_NAME": "console-1"}, None, cwd) == cwd / ".nbrewind"
    assert resolve_store_path({}, None, cwd) == cwd / ".nbrewind"
    assert resolve_store_path({"NBREWIND_STORE": ""}, None, cwd) == cwd / ".nbrewind"


def _populate(store: Store) -> dict[str, str]:
    """A checkpointed 3-chunk array referenced twice, an output, a task result,
    a ref-file result, and one orphan."""
    objects = store.objects
    array = np.random.default_rng(7).random(3 * BLOB_CHUNK_SIZE // 8)
    blob = objects.put_blob(array)
    out = objects.put(b"outputs" * 100)
    result = objects.put(b"task result")
    worker_result = objects.put(b"written by a worker")
    orphan = objects.put(b"nobody points here")
    run = store.catalog.add_cell_run(CellRun(code="a = ...", outputs=out))
    first = store.catalog.add_checkpoint(run, None, {"a": (blob, {})})
    store.catalog.add_checkpoint(run, first, {"a": (blob, {})})
    store.catalog.log_tasks([TaskLogEntry(fingerprint="f", result_digest=result)])
    objects.ref_set("tasks", "ffee", worker_result)
    return {"blob": blob, "out": out, "result": result, "worker": worker_result, "orphan": orphan}


def test_du(store: Store) -> None:
    names = _populate(store)
    report = du(store)
    chunks = 3
    assert report.objects == chunks + 1 + 4  # chunks, chunk list, out, result, worker, orphan
    assert report.stored_bytes == sum(store.objects.stored_size(d) for d in store.objects.iter_digests())
    blob_bytes = 3 * BLOB_CHUNK_SIZE
    assert blob_bytes < report.logical_bytes < blob_bytes + 10_000
    payload = len(store.objects.get_tree(names["blob"])[1])
    assert report.referenced_bytes == 2 * (blob_bytes + payload) + 700 + len(b"task result") + len(
        b"written by a worker"
    )
    assert 1.9 < report.dedup_ratio < 2.0  # the array is referenced by two checkpoints


def test_verify_store(store: Store) -> None:
    names = _populate(store)
    assert verify_store(store).ok
    chunk = store.objects.get_tree(names["blob"])[0][0]
    path = store.objects.path_of(chunk)
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\xff\xfe")
    store.objects.delete(names["result"])
    report = verify_store(store)
    assert report.checked == 7
    assert [c.digest for c in report.corrupt] == [chunk]
    assert report.missing == [names["result"]]
    assert not report.ok
    # The corrupt chunk was moved aside: the next verify reports it missing, and
    # storing the array again (re-running the cell) brings it back.
    assert verify_store(store).missing == sorted([chunk, names["result"]])
    array = np.random.default_rng(7).random(3 * BLOB_CHUNK_SIZE // 8)
    assert store.objects.put_blob(array) == names["blob"]
    assert store.objects.get_blob(names["blob"]) == array.tobytes()


def test_gc_dry_run_then_real(store: Store) -> None:
    names = _populate(store)
    (store.root / "objects" / "ab").mkdir(exist_ok=True)
    stale_temp = store.root / "objects" / "ab" / ".tmp-leftover-1-2"
    stale_temp.write_bytes(b"partial")
    old = time.time() - 7200
    os.utime(stale_temp, (old, old))

    recent = gc(store)  # default grace period keeps the just-written orphan
    assert recent.removed == [] and recent.kept_recent == 1

    preview = gc(store, dry_run=True, grace_seconds=0)
    assert preview.removed == [names["orphan"]]
    assert preview.temp_files == [str(stale_temp)]
    assert preview.reachable == 3 + 1 + 3  # chunks + chunk list + out, result, worker
    assert store.objects.has(names["orphan"]) and stale_temp.exists()

    done = gc(store, dry_run=False, grace_seconds=0)
    assert done.removed == [names["orphan"]] and done.removed_bytes > 0
    assert not store.objects.has(names["orphan"]) and not stale_temp.exists()
    assert verify_store(store).ok
    assert store.objects.get_blob(names["blob"])  # still whole


def test_gc_reports_trees_with_missing_children(store: Store) -> None:
    names = _populate(store)
    lost_chunk = store.objects.get_tree(names["blob"])[0][1]
    store.objects.delete(lost_chunk)
    report = gc(store, dry_run=True, grace_seconds=0)
    assert report.incomplete_trees == {names["blob"]: [lost_chunk]}
    assert report.missing == [lost_chunk]


def test_a_deleted_catalog_is_noticed_and_gc_refuses_to_empty_the_store(tmp_path: Path) -> None:
    """A store whose catalog was deleted still holds its objects: opening it says the
    catalog was recreated, and gc --yes refuses (every object would look unreachable)."""
    from nbrewind.errors import StoreError
    from nbrewind.store import gc

    root = tmp_path / "s"
    with Store.open(root) as store:
        digest = store.objects.put(b"kept")
        assert not store.catalog_recreated
    (root / "catalog.sqlite").unlink()
    with Store.open(root) as store:
        assert store.catalog_recreated
        with pytest.raises(StoreError, match="catalog was missing or empty"):
            gc(store, dry_run=False, grace_seconds=0)
        assert store.objects.has(digest)
    with Store.open(tmp_path / "fresh") as store:
        assert not store.catalog_recreated
