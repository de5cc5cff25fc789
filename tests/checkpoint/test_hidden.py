"""Hidden state: RNG states, tracked file opens, file digests, environment, cwd."""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import xxhash

from nbrewind.checkpoint import hidden
from nbrewind.checkpoint.hidden import (
    FileTracker,
    cwd,
    env_diff,
    env_snapshot,
    file_digest,
)
from nbrewind.checkpoint.randomness import capture_rng, restore_rng, rng_states

# -- RNG -------------------------------------------------------------------------------


def test_random_digest_changes_when_drawn_and_returns_on_restore() -> None:
    saved = capture_rng()
    before = rng_states()
    random.random()
    assert rng_states()["random"] != before["random"]
    restore_rng(saved)
    assert rng_states() == before
    first = random.random()
    restore_rng(saved)
    assert random.random() == first


def test_numpy_global_state_is_digested_and_restored() -> None:
    outer = capture_rng()
    try:
        np.random.seed(7)
        saved = capture_rng()
        before = rng_states()
        drawn = np.random.random(3)
        after = rng_states()
        assert after["numpy.random"] != before["numpy.random"]
        assert after["random"] == before["random"]
        restore_rng(saved)
        assert rng_states() == before
        np.testing.assert_array_equal(np.random.random(3), drawn)
    finally:
        restore_rng(outer)


def test_numpy_is_left_alone_when_numpy_random_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "numpy.random")
    assert set(rng_states()) == {"random"}
    assert set(capture_rng()) == {"random"}


def test_rng_digest_is_pinned() -> None:
    state = random.Random(1234).getstate()
    saved = random.getstate()
    try:
        random.setstate(state)
        assert rng_states()["random"] == "c455bdcbb5f499f7f1d01a02b047a58c"
    finally:
        random.setstate(saved)


# -- file tracking ---------------------------------------------------------------------


def test_tracked_reads_and_writes_are_recorded(tmp_path: Path) -> None:
    source, target = tmp_path / "in.csv", tmp_path / "out.csv"
    source.write_text("a,b\n")
    tracker = FileTracker()
    with tracker.tracking():
        data = source.read_text()
        with open(target, "w") as handle:
            handle.write(data)
    assert tracker.reads == {str(source)}
    assert tracker.writes == {str(target)}


def test_modes_read_plus_and_append(tmp_path: Path) -> None:
    paths = {name: tmp_path / name for name in ("r_plus", "w_plus", "append", "exclusive")}
    paths["r_plus"].write_text("x")
    paths["append"].write_text("x")
    tracker = FileTracker()
    with tracker.tracking():
        open(paths["r_plus"], "r+").close()
        open(paths["w_plus"], "w+").close()
        open(paths["append"], "a").close()
        open(paths["exclusive"], "xb").close()
    assert tracker.reads == {str(paths["r_plus"]), str(paths["append"])}
    assert tracker.writes == {str(path) for path in paths.values()}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (os.O_RDONLY, (True, False)),
        (os.O_WRONLY | os.O_CREAT, (False, True)),
        (os.O_RDWR, (True, True)),
        (os.O_RDWR | os.O_TRUNC, (False, True)),
        (os.O_WRONLY | os.O_APPEND, (True, True)),
    ],
)
def test_os_open_flags(tmp_path: Path, flags: int, expected: tuple[bool, bool]) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(b"")
    tracker = FileTracker()
    with tracker.tracking():
        os.close(os.open(path, flags))
    assert (str(path) in tracker.reads, str(path) in tracker.writes) == expected


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tracker = FileTracker()
    with tracker.tracking():
        Path("rel.txt").write_text("x")
    assert tracker.writes == {str(tmp_path / "rel.txt")}


def test_exclusions(tmp_path: Path) -> None:
    store = tmp_path / "nb.nbrewind"
    store.mkdir()
    kept = tmp_path / "data.txt"
    tracker = FileTracker(exclude=[store])
    with tracker.tracking():
        (store / "object").write_bytes(b"x")
        kept.write_text("x")
        open(os.__file__).close()  # the stdlib
        open("/proc/self/status").close()
    assert tracker.writes == {str(kept)}
    assert tracker.reads == set()
    assert tracker.excluded(str(store)) and not tracker.excluded(str(tmp_path / "nb.nbrewind2"))


def test_a_dask_clusters_scratch_space_is_not_the_notebooks(tmp_path: Path) -> None:
    """A LocalCluster started in a cell writes lock files and worker directories under
    dask-scratch-space (in the temp folder, or where temporary-directory says): none of
    it is the cell's output, and a replay must not make those files again."""
    import dask
    from distributed import Client, LocalCluster

    mine = tmp_path / "result.txt"
    tracker = FileTracker()
    with dask.config.set({"temporary-directory": str(tmp_path / "scratch")}), tracker.tracking():
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
            with Client(cluster) as client:
                assert client.submit(sum, [1, 2]).result() == 3
        mine.write_text("3")
    assert list((tmp_path / "scratch").rglob("*.lock")), "the cluster wrote no lock file: nothing was tested"
    # The cluster made the folder temporary-directory names; holding only its scratch space,
    # it is the cluster's, and the recorder leaves it out.
    from nbrewind.session.filerecord import _holds_only_excluded

    scratch = str(tmp_path / "scratch")
    assert tracker.writes == {str(mine), scratch} and tracker.made_dirs == {scratch}
    assert _holds_only_excluded(scratch, tracker.excluded)
    assert not _holds_only_excluded(str(tmp_path), tracker.excluded)
    assert not [path for path in tracker.reads if str(tmp_path / "scratch") in path]


def test_nothing_is_recorded_outside_the_context(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    tracker = FileTracker()
    with tracker.tracking():
        pass
    path.write_text("before")
    with tracker.tracking():
        path.read_text()
    path.write_text("after")
    assert hidden._hook_installed and hidden._active == ()
    assert tracker.reads == {str(path)} and tracker.writes == set()


def test_other_threads_count_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "worker.txt"
    path.write_text("x")

    def read_in_thread() -> None:
        worker = threading.Thread(target=path.read_text)
        worker.start()
        worker.join()

    every, own = FileTracker(), FileTracker(all_threads=False)
    with every.tracking(), own.tracking():
        read_in_thread()
    assert every.reads == {str(path)}
    assert own.reads == set()


def test_clear_and_digest_reads_are_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("x")
    tracker = FileTracker()
    with tracker.tracking():
        assert file_digest(path) is not None
    assert tracker.reads == set()
    with tracker.tracking():
        path.read_text()
    tracker.clear()
    assert tracker.reads == set() and tracker.writes == set()


# -- file digests ----------------------------------------------------------------------


def test_file_digest_content_missing_and_memo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data.bin"
    assert file_digest(path) is None
    assert file_digest(tmp_path) is None  # a directory is not file content
    payload = os.urandom(3 * (1 << 20) + 17)  # spans several read chunks
    path.write_bytes(payload)
    assert file_digest(path) == xxhash.xxh3_128_hexdigest(payload)

    calls: list[str] = []
    from nbrewind.identity import files

    real_hash = files._hash_file

    def counting_hash(target: str) -> str:
        calls.append(target)
        return real_hash(target)

    monkeypatch.setattr(files, "_hash_file", counting_hash)
    assert file_digest(str(path)) == xxhash.xxh3_128_hexdigest(payload)
    assert calls == []  # unchanged: served from the memo
    path.write_bytes(payload + b"!")
    assert file_digest(path) == xxhash.xxh3_128_hexdigest(payload + b"!")
    assert calls == [str(path)]


def test_a_file_read_for_storing_gives_its_digest_and_needs_no_second_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbrewind.identity import files

    path = tmp_path / "written.bin"
    payload = os.urandom((1 << 20) + 5)
    path.write_bytes(payload)
    calls: list[str] = []
    real_hash = files._hash_file
    monkeypatch.setattr(files, "_hash_file", lambda target: calls.append(target) or real_hash(target))
    data, digest = files.read_file(path)
    assert data == payload and digest == xxhash.xxh3_128_hexdigest(payload)
    assert file_digest(path) == digest and calls == []  # remembered from the read
    path.write_bytes(payload[:-1])
    assert file_digest(path) == xxhash.xxh3_128_hexdigest(payload[:-1]) and calls == [str(path)]


# -- environment and cwd ---------------------------------------------------------------


def test_env_snapshot_and_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBREWIND_TEST_CHANGED", "old")
    monkeypatch.setenv("NBREWIND_TEST_REMOVED", "gone")
    before = env_snapshot()
    monkeypatch.setenv("NBREWIND_TEST_CHANGED", "new")
    monkeypatch.setenv("NBREWIND_TEST_ADDED", "1")
    monkeypatch.delenv("NBREWIND_TEST_REMOVED")
    after = env_snapshot()
    assert env_diff(before, after) == {
        "NBREWIND_TEST_CHANGED": "new",
        "NBREWIND_TEST_ADDED": "1",
        "NBREWIND_TEST_REMOVED": None,
    }
    after["NBREWIND_TEST_ADDED"] = "changed only in the copy"
    assert os.environ["NBREWIND_TEST_ADDED"] == "1"
    assert env_diff(after, after) == {}


def test_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cwd() == str(tmp_path)


def test_opening_a_directory_for_an_unnamed_temp_file_is_not_a_write(tmp_path: Path) -> None:
    import os
    import tempfile

    from nbrewind.checkpoint.hidden import FileTracker

    tracker = FileTracker()
    with tracker.tracking():
        tempfile.TemporaryFile(dir=tmp_path).close()
    assert str(tmp_path) not in tracker.writes and not any(os.path.isdir(p) for p in tracker.writes)


# -- paths changed without an open: removals, renames, links, truncation -----------------


def test_removed_renamed_truncated_and_linked_files_are_writes(tmp_path: Path) -> None:
    names = ["gone.txt", "old.txt", "short.txt", "target.txt", "byfd.txt"]
    for name in names:
        (tmp_path / name).write_text("abc")
    tracker = FileTracker()
    with tracker.tracking():
        os.remove(tmp_path / "gone.txt")
        os.replace(tmp_path / "old.txt", tmp_path / "new.txt")
        os.truncate(tmp_path / "short.txt", 1)
        os.link(tmp_path / "target.txt", tmp_path / "hard.txt")
        os.symlink(tmp_path / "target.txt", tmp_path / "soft.txt")
        folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.unlink("byfd.txt", dir_fd=folder)  # relative to a directory descriptor, as rmtree does
        finally:
            os.close(folder)
    expected = {"gone.txt", "old.txt", "new.txt", "short.txt", "hard.txt", "soft.txt", "byfd.txt"}
    assert tracker.writes == {str(tmp_path / n) for n in expected}
    assert tracker.reads == set() and tracker.dirs == set()
    assert tracker.created == {str(tmp_path / n) for n in ("new.txt", "hard.txt", "soft.txt")}


def test_a_removed_or_moved_tree_is_recorded_with_everything_under_it(tmp_path: Path) -> None:
    import shutil

    for folder in ("doomed", "moving"):
        (tmp_path / folder / "sub").mkdir(parents=True)
        (tmp_path / folder / "a.txt").write_text("a")
        (tmp_path / folder / "sub" / "b.txt").write_text("b")
    tracker = FileTracker()
    with tracker.tracking():
        shutil.rmtree(tmp_path / "doomed")
        os.rename(tmp_path / "moving", tmp_path / "moved")
    under = ("", "/a.txt", "/sub", "/sub/b.txt")
    assert {str(tmp_path / "doomed") + u for u in under} <= tracker.writes
    assert {str(tmp_path / "moving") + u for u in under} <= tracker.writes
    assert {str(tmp_path / "moved") + u for u in ("", "/a.txt", "/sub/b.txt")} <= tracker.writes
    assert {str(tmp_path / "doomed"), str(tmp_path / "doomed/sub"), str(tmp_path / "moving")} <= tracker.dirs
    assert not any(p.endswith(".txt") for p in tracker.dirs)


def test_removals_outside_tracking_or_under_exclusions_are_not_recorded(tmp_path: Path) -> None:
    kept, outside = tmp_path / "kept", tmp_path / "outside.txt"
    kept.mkdir()
    (kept / "x.txt").write_text("x")
    outside.write_text("o")
    os.remove(outside)  # no tracker is active
    tracker = FileTracker(exclude=[kept])
    with tracker.tracking():
        os.remove(kept / "x.txt")
    assert tracker.writes == set()


def test_what_a_removal_or_rename_depended_on_is_found_before_it(tmp_path: Path) -> None:
    import shutil

    from nbrewind.checkpoint.world import listing_key, stat_key

    (tmp_path / "a.txt").write_text("abc")
    (tmp_path / "b.txt").write_text("b")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("x")
    (tmp_path / "e").mkdir()
    made = tmp_path / "made.txt"
    expected = {
        ("stat", str(tmp_path / "a.txt")): stat_key(str(tmp_path / "a.txt")),
        ("kind", str(tmp_path / "moved.txt")): "absent",
        ("kind", str(tmp_path / "b.txt")): "file",
        ("stat", str(tmp_path / "d")): "dir",
        ("listing", str(tmp_path / "d")): listing_key(str(tmp_path / "d")),
        ("stat", str(tmp_path / "d" / "x.txt")): stat_key(str(tmp_path / "d" / "x.txt")),
        ("kind", str(tmp_path / "d2")): "absent",
        ("kind", str(tmp_path / "e")): "dir",
    }
    tracker = FileTracker()
    with tracker.tracking():
        os.rename(tmp_path / "a.txt", tmp_path / "moved.txt")
        os.remove(tmp_path / "b.txt")
        os.rename(tmp_path / "d", tmp_path / "d2")
        shutil.rmtree(tmp_path / "e")
        made.write_text("mine")
        os.remove(made)  # the cell made it: its existence is the cell's doing, not an input
    assert tracker.found == expected


def test_made_folders_are_writes_and_only_a_strict_mkdir_depends_on_the_path(tmp_path: Path) -> None:
    (tmp_path / "there").mkdir()
    tracker = FileTracker()
    with tracker.tracking():
        os.makedirs(tmp_path / "a" / "b", exist_ok=True)
        (tmp_path / "p").mkdir(exist_ok=True)
        os.makedirs(tmp_path / "there", exist_ok=True)  # exists: tolerated, nothing made
        os.mkdir(tmp_path / "strict")
    made = {str(tmp_path / n) for n in ("a", "a/b", "p", "strict")}
    assert made <= tracker.made_dirs and made <= tracker.writes
    # Only the bare os.mkdir fails when the path exists: its outcome depends on it.
    assert tracker.found == {("kind", str(tmp_path / "strict")): "absent"}
