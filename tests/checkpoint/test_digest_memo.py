"""File digests remembered across kernels (`nbrewind.identity.memo`): used only for a file
every stat field says is unchanged, never for one written in the clock tick it was hashed in."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from nbrewind.identity import files, memo
from nbrewind.identity.memo import DigestMemo


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files `file_digest` actually reads, with an empty in-process cache (a new kernel)."""
    calls: list[str] = []
    real = files._hash_file

    def counting(path: str) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(files, "_hash_file", counting)
    monkeypatch.setattr(files, "_digest_cache", type(files._digest_cache)())
    monkeypatch.setattr(files, "_remembered", set())
    return calls


@pytest.fixture
def settled_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "SETTLED_NS", 0)  # every file counts as settled: no 3 s waits


def new_process() -> None:
    files._digest_cache.clear()
    files._remembered.clear()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(100_000))
    return path


@pytest.fixture
def memo_file(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "memo" / "file-digests.sqlite"


def digest_of(path: Path) -> str:
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def test_a_later_process_takes_the_digest_from_the_memo(hashed: list[str], settled_now: None, data: Path, memo_file: Path) -> None:
    with files.remembering(DigestMemo(memo_file)):
        assert files.file_digest(data) == digest_of(data)
    assert hashed == [str(data)]
    new_process()
    remembered = DigestMemo(memo_file)
    with files.remembering(remembered):
        assert files.file_digest(data) == digest_of(data)
        assert remembered.hits == 1
    assert hashed == [str(data)]  # not read again


@pytest.mark.parametrize("change", ["same size, mtime put back", "replaced by rename", "appended"])
def test_any_write_since_means_hashing_again(hashed: list[str], settled_now: None, data: Path, memo_file: Path, change: str) -> None:
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)
    before = data.stat()
    if change == "same size, mtime put back":
        with open(data, "r+b") as handle:
            handle.write(b"X" * 10)
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))  # the ctime still moves
    elif change == "replaced by rename":
        other = data.with_name("other.bin")
        other.write_bytes(data.read_bytes()[::-1])
        os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(other, data)
    else:
        with open(data, "ab") as handle:
            handle.write(b"more")
    new_process()
    with files.remembering(DigestMemo(memo_file)):
        assert files.file_digest(data) == digest_of(data)
    assert hashed == [str(data), str(data)]


def test_a_file_written_within_the_settling_time_is_not_remembered(hashed: list[str], data: Path, memo_file: Path) -> None:
    """Its ctime could be shared by a later write of the same size in the same clock tick."""
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)  # written just now
        files.file_digest(data)
    new_process()
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)
    assert hashed == [str(data), str(data)]
    with sqlite3.connect(memo_file) as conn:
        assert conn.execute("SELECT count(*) FROM digests").fetchone() == (0,)


def test_a_fresh_digest_is_remembered_once_the_file_has_settled(
    hashed: list[str], data: Path, memo_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashed while fresh (as a cell's file record does), offered again on a later cache hit
    or when the kernel closes, once settled."""
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)
        monkeypatch.setattr(memo, "SETTLED_NS", 0)  # time passes
    new_process()
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)
    assert hashed == [str(data)]


def test_rows_of_another_host_or_with_a_bad_checksum_are_not_used(
    hashed: list[str], settled_now: None, data: Path, memo_file: Path
) -> None:
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)
    with sqlite3.connect(memo_file) as conn:
        conn.execute("UPDATE digests SET digest = ?", ("0" * 32,))
    new_process()
    with files.remembering(DigestMemo(memo_file)):
        assert files.file_digest(data) == digest_of(data)
    with sqlite3.connect(memo_file) as conn:
        conn.execute("UPDATE digests SET host = 'elsewhere'")
    new_process()
    with files.remembering(DigestMemo(memo_file)):
        assert files.file_digest(data) == digest_of(data)
    assert hashed == [str(data)] * 3


def test_a_damaged_memo_is_made_again_and_off_means_off(
    monkeypatch: pytest.MonkeyPatch, memo_file: Path, settled_now: None, hashed: list[str], data: Path
) -> None:
    memo_file.parent.mkdir(parents=True)
    memo_file.write_bytes(b"not a database" * 100)
    monkeypatch.setenv("NBREWIND_DIGEST_MEMO", str(memo_file))
    opened = DigestMemo.open_default()
    assert opened is not None
    with files.remembering(opened):
        assert files.file_digest(data) == digest_of(data)
    monkeypatch.setenv("NBREWIND_DIGEST_MEMO", "off")
    assert DigestMemo.open_default() is None
    monkeypatch.delenv("NBREWIND_DIGEST_MEMO")
    monkeypatch.setenv("XDG_CACHE_HOME", str(memo_file.parent / "xdg"))
    assert memo.default_memo_path() == memo_file.parent / "xdg" / "nbrewind" / "file-digests.sqlite"


def test_remembering_is_undone_on_exit(memo_file: Path) -> None:
    before = files._memo
    with files.remembering(DigestMemo(memo_file)):
        assert files._memo is not None
    assert files._memo is before


def test_files_on_a_filesystem_that_may_not_keep_ctimes_are_not_remembered(
    hashed: list[str], settled_now: None, data: Path, memo_file: Path
) -> None:
    """FAT, NTFS, SMB and FUSE mounts may report a ctime a copy reproduces: always hashed."""
    from nbrewind.store.fstype import Mount

    remembered = DigestMemo(memo_file)
    assert remembered.keeps_ctime(str(data))  # this test's folder: a local filesystem that keeps them
    remembered._mounts = [Mount("/", "vfat", "/dev/sdz1", frozenset())]
    remembered._kept_by_folder.clear()
    with files.remembering(remembered):
        files.file_digest(data)
    new_process()
    with files.remembering(DigestMemo(memo_file)):
        files.file_digest(data)
    assert hashed == [str(data), str(data)]
