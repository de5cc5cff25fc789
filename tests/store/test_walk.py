"""The one tree walk and what gc, du, verify and pack make of it, on real store
files: rebuild records (new and old form) keep their pre-cell state, verify names
the broken record and moves damaged files aside, and a put replaces a damaged file."""

from __future__ import annotations

import json
import os
import sqlite3
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard

from nbrewind.checkpoint.values import StagedGroup, load_json, stage_group, stage_json
from nbrewind.errors import CorruptObjectError, PackError
from nbrewind.store import BLOB_CHUNK_SIZE, CellRun, Store, du, gc, records, verify_store
from nbrewind.store import frame
from nbrewind.store.walk import MISSING, walk


def _age(store: Store, seconds: float = 7200) -> None:
    """Make every object older than gc's grace period."""
    old = time.time() - seconds
    for digest in store.objects.iter_digests():
        os.utime(store.objects.path_of(digest), (old, old))


def _damage(store: Store, digest: str, offset: int = -1) -> None:
    """Flip one bit of an object file (its last byte by default)."""
    path = store.objects.path_of(digest)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _only_the_lock_entry(store: Store) -> None:
    """Drop every checkpoint entry but the lock's, so the values are reachable only
    through its rebuild record (a plain SQL edit of the real catalog file)."""
    with sqlite3.connect(store.catalog.path) as conn:
        conn.execute("DELETE FROM checkpoint_entries WHERE name != 'lock'")
    conn.close()


def _notebook_state(store: Store, *, old_form: bool = False) -> dict[str, str]:
    """What an audit of `base = [...]; arr = np...` then `lock = threading.Lock()` records:
    two value groups, the pre-cell state document and the lock's rebuild record, in
    the catalog as two cell runs. ``old_form``: as NBRewind wrote them before the
    pre-cell state became a tree child (references only inside the JSON)."""
    objects, catalog = store.objects, store.catalog
    base = stage_group(objects, {"base": [1, 2, 3]})
    arr = stage_group(objects, {"arr": np.arange(3 * BLOB_CHUNK_SIZE // 8, dtype=np.float64)})
    assert isinstance(base, StagedGroup) and isinstance(arr, StagedGroup)
    base.commit(objects)
    arr.commit(objects)
    before = {
        "base": (base.digest, {"kind": "value", "key": "k1", "group": ["base"]}),
        "arr": (arr.digest, {"kind": "value", "key": "k2", "group": ["arr"]}),
    }
    state = stage_json(objects, {"entries": before}, () if old_form else [base.digest, arr.digest])
    objects.commit(state)
    doc = {"type": "_thread.lock", "reason": "cannot pickle", "code": "lock = threading.Lock()", "parent_entries": state.digest}
    record = stage_json(objects, doc, () if old_form else [state.digest])
    objects.commit(record)
    first = catalog.add_cell_run(CellRun(code="base = ...", code_digest="c1", execution_count=1, status="ok"))
    cp1 = catalog.add_checkpoint(first, None, before)
    catalog.set_cell_run_checkpoint(first, cp1)
    second = catalog.add_cell_run(CellRun(code="lock = threading.Lock()", code_digest="c2", execution_count=2, status="ok"))
    lock_meta = {"kind": "unserializable", "key": "k3", "group": ["lock"], "type": "_thread.lock"}
    cp2 = catalog.add_checkpoint(second, cp1, {**before, "lock": (record.digest, lock_meta)})
    catalog.set_cell_run_checkpoint(second, cp2)
    return {"base": base.digest, "arr": arr.digest, "state": state.digest, "record": record.digest}


@pytest.mark.parametrize("old_form", [False, True], ids=["tree-child", "old-json-only"])
def test_gc_keeps_what_a_rebuild_record_needs(store: Store, old_form: bool) -> None:
    names = _notebook_state(store, old_form=old_form)
    # The pre-cell state is reachable only through the rebuild record: drop the first
    # checkpoint's references to the values so nothing else keeps them.
    _only_the_lock_entry(store)
    _age(store)
    before = set(store.objects.iter_digests())
    report = gc(store, dry_run=False, grace_seconds=900)
    assert report.removed == [] and not report.missing
    assert set(store.objects.iter_digests()) == before
    record = load_json(store.objects, names["record"])
    assert load_json(store.objects, record["parent_entries"])["entries"]["arr"][0] == names["arr"]
    assert verify_store(store).ok


def test_walk_reaches_the_pre_cell_state_through_the_record(store: Store) -> None:
    names = _notebook_state(store)
    reached = walk(store.objects, [names["record"]], verify=True)
    assert reached.children[names["record"]] == (names["state"],)
    assert set(reached.children[names["state"]]) == {names["base"], names["arr"]}
    assert not reached.problems
    chunks = store.objects.get_tree(store.objects.get_tree(names["arr"])[0][0])[0]
    assert set(chunks) <= reached.reached  # down to the array's chunks


def test_roots_name_their_cell_runs(store: Store) -> None:
    _notebook_state(store)
    store.objects.ref_set("tasks", "f00d", store.objects.put(b"a worker's result"))
    found = {(r.kind, r.name, r.cell_run_id) for r in records(store.catalog, store.objects)}
    assert ("rebuild", "lock", 2) in found
    assert ("checkpoint", "arr", 1) in found and ("checkpoint", "arr", 2) in found
    assert ("ref", "tasks/f00d", None) in found


def test_verify_names_the_broken_rebuild_record_and_quarantines(store: Store) -> None:
    names = _notebook_state(store)
    _damage(store, names["state"])
    report = verify_store(store)
    assert not report.ok and report.quarantined
    assert [c.digest for c in report.corrupt] == [names["state"]]
    broken = {(b.kind, b.name): b for b in report.broken}
    assert set(broken) == {("rebuild", "lock")}  # the values themselves are sound
    lock = broken[("rebuild", "lock")]
    assert lock.cell_run_id == 2 and lock.execution_count == 2 and lock.corrupt == [names["state"]]
    assert "cell run #2 (In [2])" in lock.message and "audit kernel" in lock.advice
    # Moved aside: the file is gone from objects/ and kept under corrupt/ ...
    assert not store.objects.has(names["state"])
    assert (store.root / "corrupt" / names["state"]).is_file()
    again = verify_store(store)
    assert again.missing == [names["state"]] and not again.corrupt
    assert again.broken[0].missing == [names["state"]]
    # ... so storing the same state again (what a re-audit does) repairs the store.
    before = {"base": (names["base"], {"kind": "value", "key": "k1", "group": ["base"]}),
              "arr": (names["arr"], {"kind": "value", "key": "k2", "group": ["arr"]})}
    store.objects.commit(stage_json(store.objects, {"entries": before}, [names["base"], names["arr"]]))
    assert verify_store(store).ok


def test_verify_reports_a_value_broken_across_later_checkpoints(store: Store) -> None:
    names = _notebook_state(store)
    chunk = store.objects.get_tree(store.objects.get_tree(names["arr"])[0][0])[0][1]
    store.objects.delete(chunk)
    report = verify_store(store)
    arr = [b for b in report.broken if b.name == "arr" and b.kind == "checkpoint"]
    assert len(arr) == 1 and arr[0].cell_run_id == 1 and arr[0].later_runs == 1
    assert arr[0].missing == [chunk]
    # The rebuild record's pre-cell state holds arr too: it is broken as well.
    assert any(b.kind == "rebuild" and b.missing == [chunk] for b in report.broken)


def test_readonly_verify_moves_nothing(store: Store) -> None:
    names = _notebook_state(store)
    _damage(store, names["base"])
    with Store.open(store.root, create=False, readonly=True) as reader:
        report = verify_store(reader)
    assert [c.digest for c in report.corrupt] == [names["base"]] and not report.quarantined
    assert store.objects.has(names["base"])


def test_du_follows_rebuild_records(store: Store) -> None:
    names = _notebook_state(store)
    orphan = store.objects.put(os.urandom(5000))
    report = du(store)
    assert report.reachable_objects == report.objects - 1
    assert report.unreachable_bytes == store.objects.stored_size(orphan)
    arr_bytes = 3 * BLOB_CHUNK_SIZE
    # arr counts in full in both checkpoints and once more in the state the lock is rebuilt from.
    assert 3 * arr_bytes < report.referenced_bytes < 3 * arr_bytes + 10_000
    assert names  # (the walk is the one gc uses: see test_gc_keeps_what_a_rebuild_record_needs)


def test_pack_ships_the_pre_cell_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbrewind.pack import pack

    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "trust.db"))
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with Store.open(tmp_path / "nb.ipynb.nbrewind") as store:
        names = _notebook_state(store, old_form=True)
        _only_the_lock_entry(store)
    result = pack(nb, tmp_path / "nb.tar.zst", trust=False)
    with open(tmp_path / "nb.tar.zst", "rb") as raw:
        with zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                shipped = {m.name for m in tar}
    for key in ("record", "state", "base", "arr"):
        digest = names[key]
        assert f"nbrewind/objects/{digest[:2]}/{digest[2:]}" in shipped, key
    assert result.objects == len([n for n in shipped if n.startswith("nbrewind/objects/")])


def test_pack_refuses_a_broken_rebuild_record_and_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbrewind.pack import pack

    monkeypatch.setenv("NBREWIND_TRUST_DB", str(tmp_path / "trust.db"))
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with Store.open(tmp_path / "nb.ipynb.nbrewind") as store:
        names = _notebook_state(store)
        _only_the_lock_entry(store)
        store.objects.delete(names["base"])
    with pytest.raises(PackError, match=r"rebuild record 'lock' of cell run #2 reaches " + names["base"]):
        pack(nb, tmp_path / "nb.tar.zst", trust=False)


def test_a_tree_whose_kind_byte_flipped_keeps_its_children(store: Store) -> None:
    """The kind byte is the one header byte no digest covers: the walk judges a tree
    by its content, so gc never drops the children of a tree that reads as a leaf."""
    blob = store.objects.put_blob(os.urandom(2 * BLOB_CHUNK_SIZE + 10))
    store.catalog.add_checkpoint(None, None, {"x": (blob, {})})
    path = store.objects.path_of(blob)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    assert data[6] == frame.KIND_TREE
    data[6] = frame.KIND_LEAF
    path.write_bytes(bytes(data))
    _age(store)
    assert gc(store, dry_run=False, grace_seconds=0).removed == []
    assert len(store.objects.get_blob(blob)) == 2 * BLOB_CHUNK_SIZE + 10
    # put_tree sees a tree stored as a leaf and rewrites it with the right kind.
    children, payload = store.objects.get_tree(blob)
    store.objects.put_tree(children, payload)
    assert store.objects.is_tree(blob)


def test_a_leaf_whose_kind_byte_says_tree_is_corrupt(store: Store) -> None:
    digest = store.objects.put(b"plain bytes, not a tree")
    path = store.objects.path_of(digest)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[6] = frame.KIND_TREE
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="header says tree"):
        store.objects.get(digest)


def test_walk_reports_missing_and_damaged_below_each_root(store: Store) -> None:
    leaf = store.objects.put(b"x" * 300)
    other = store.objects.put(b"y" * 10)
    tree = store.objects.put_tree([leaf, other], b"payload")
    top = store.objects.put_tree([tree], b"")
    lost = "0" * 32
    _damage(store, leaf)
    reached = walk(store.objects, [top, lost, "not a digest"], verify=True)
    assert reached.problems[lost] == MISSING
    assert "corrupt" in reached.problems[leaf]
    assert reached.problems_below(top) == {leaf}
    assert reached.problems_below(other) == frozenset()
    assert store.objects.has(leaf)  # no quarantine unless asked


@pytest.mark.parametrize("size", [200, 40_000, BLOB_CHUNK_SIZE], ids=["small", "medium", "chunk"])
def test_put_replaces_a_damaged_file(store: Store, size: int) -> None:
    """What makes "re-run the cell" a repair: storing the same bytes again rewrites a
    file that the write path can tell is damaged (a damaged header always; a damaged
    body when the file is small enough to re-hash)."""
    data = os.urandom(size)
    digest = store.objects.put(data)
    damages = [0, 5, 7] + ([size // 2] if size <= 64 * 1024 else [])
    for offset in damages:
        _damage(store, digest, offset)
        assert store.objects.put(data) == digest
        assert store.objects.get(digest) == data, offset
    # A truncated raw file is caught by its length.
    path = store.objects.path_of(digest)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-1])
    store.objects.put(data)
    assert store.objects.get(digest) == data


def test_put_keeps_a_sound_file_and_refreshes_it(store: Store) -> None:
    digest = store.objects.put(b"z" * 1000)
    path = store.objects.path_of(digest)
    old = time.time() - 7200
    os.utime(path, (old, old))
    inode = path.stat().st_ino
    written = store.objects.bytes_written
    store.objects.put(b"z" * 1000)
    assert path.stat().st_ino == inode and store.objects.bytes_written == written
    assert path.stat().st_mtime > old + 3600


def test_reserved_header_byte_is_checked(store: Store) -> None:
    digest = store.objects.put(b"r" * 100)
    _damage(store, digest, 7)
    with pytest.raises(CorruptObjectError, match="header"):
        store.objects.get(digest)
    assert frame.decode_header(frame.encode_header(frame.CODEC_RAW, frame.KIND_LEAF)) is not None
    assert frame.decode_header(frame.encode_header(frame.CODEC_RAW, frame.KIND_LEAF)[:7] + b"\x01") is None


def test_a_flipped_zstd_size_field_is_corrupt_not_a_memory_error(store: Store) -> None:
    """A flip in the zstd frame's content size would ask the decoder for terabytes."""
    digest = store.objects.put(b"abc" * 100_000)
    path = store.objects.path_of(digest)
    data = bytearray(path.read_bytes())
    assert data[5] == frame.CODEC_ZSTD
    payload = bytes(data[frame.HEADER_SIZE :])
    size_at = frame.HEADER_SIZE + zstandard.frame_header_size(payload) - 1  # the size field's top byte
    path.chmod(0o644)
    data[size_at] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError):
        store.objects.get(digest)
