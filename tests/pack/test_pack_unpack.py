"""unpack and verify: a good backpack becomes a working folder; every bad one is
refused with a clear error, writes nothing outside the target and leaves nothing
partial behind."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from backpack_tools import CSV, entry, read_members, resign, write_members

from nbrewind.errors import PackError
from nbrewind.pack import pack, unpack, verify
from nbrewind.store import Store

Members = list[tuple[tarfile.TarInfo, bytes]]


@pytest.fixture
def archive(project: tuple[Path, dict[str, str]], tmp_path: Path) -> Path:
    folder, _ = project
    out = tmp_path / "in" / "nb.backpack.tar.zst"
    out.parent.mkdir()
    pack(folder / "nb.ipynb", out, include_data=True, trust=False)
    return out


def test_unpack_makes_a_working_folder(archive: Path, tmp_path: Path) -> None:
    dest = tmp_path / "far" / "away" / "B"
    dest.parent.mkdir(parents=True)
    result = unpack(archive, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["data.csv", "helpers.py", "nb.ipynb", "nb.ipynb.nbrewind", "util.py"]
    assert (dest / "data.csv").read_bytes() == CSV
    store = dest / "nb.ipynb.nbrewind"
    assert (store / "manifest.json").is_file()
    assert (store / "backpack" / "software" / "requirements.txt").is_file()
    assert (store / "backpack" / "data" / "data.yml").is_file()
    with Store.open(store, create=False, readonly=True) as opened:
        assert len(opened.catalog.cell_runs()) == 2
    assert not result.trusted and result.data_included and result.environment == []
    assert verify(dest).ok and verify(store).ok and verify(archive).ok
    assert [p.name for p in dest.parent.iterdir()] == ["B"]  # the staging folder is gone


def test_unpack_refuses_a_used_destination(archive: Path, tmp_path: Path) -> None:
    dest = tmp_path / "B"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    with pytest.raises(PackError, match="not an empty folder"):
        unpack(archive, dest)
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]


def test_verify_folder_reports_every_problem(archive: Path, tmp_path: Path) -> None:
    dest = tmp_path / "B"
    unpack(archive, dest)
    (dest / "helpers.py").write_text("tampered = True\n")
    (dest / "util.py").unlink()
    result = verify(dest)
    assert not result.ok
    assert any("workflow/helpers.py: content differs" in p for p in result.problems)
    assert any("workflow/util.py: missing" in p for p in result.problems)


def _flip_object(members: Members) -> Members:
    out = []
    flipped = 0
    for info, data in members:
        if info.name.startswith("nbrewind/objects/") and flipped < 2:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
            flipped += 1
        out.append((info, data))
    return out


def _edit_manifest(members: Members) -> Members:
    manifest = json.loads(members[0][1])
    manifest["files"][0]["size"] += 1
    return [(members[0][0], json.dumps(manifest).encode()), *members[1:]]


def _extra_file(members: Members) -> Members:
    return [*members, entry("workflow/evil.py", b"import os\n")]


def _dotdot(members: Members) -> Members:
    return [*members, entry("workflow/../../evil.txt", b"escaped")]


def _absolute(members: Members) -> Members:
    return [*members, entry("/tmp/nbrewind-evil.txt", b"escaped")]


def _symlink(members: Members) -> Members:
    return [*members, entry("workflow/link", kind=tarfile.SYMTYPE, linkname="../../evil.txt")]


def _bomb(members: Members) -> Members:
    return [members[0], entry("data/zeros.bin", bytes(64 * 1024 * 1024)), *members[1:]]


def _wrong_version(members: Members) -> Members:
    manifest = json.loads(members[0][1])
    manifest["version"] = 2
    return [(members[0][0], resign(manifest)), *members[1:]]


def _manifest_not_first(members: Members) -> Members:
    return [*members[1:], members[0]]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_flip_object, "SHA-256 does not match"),
        (_edit_manifest, "manifest.json was edited"),
        (_extra_file, "extra file 'workflow/evil.py' is not in the manifest"),
        (_dotdot, "refused entry 'workflow/../../evil.txt'"),
        (_absolute, "absolute path"),
        (_symlink, "symbolic link"),
        (_bomb, "decompression bomb"),
        (_wrong_version, "format version 2 is not supported.*upgrade"),
        (_manifest_not_first, "first entry"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else "",
)
def test_bad_archives_are_refused(
    archive: Path, tmp_path: Path, edit: Callable[[Members], Members], message: str
) -> None:
    bad = archive.with_name("bad.tar.zst")
    write_members(bad, edit(read_members(archive)))
    _assert_refused(bad, tmp_path, message)
    report = verify(bad)
    assert not report.ok and any(re.search(message, p) for p in report.problems)
    if edit is _flip_object:
        assert sum("SHA-256 does not match" in p for p in report.problems) == 2  # each problem, not the first


def test_truncated_archive_is_refused(archive: Path, tmp_path: Path) -> None:
    data = archive.read_bytes()
    for cut in (len(data) // 3, len(data) - 8):
        bad = archive.with_name(f"cut{cut}.tar.zst")
        bad.write_bytes(data[:cut])
        _assert_refused(bad, tmp_path, "truncated|missing from the archive")


def test_flipped_byte_in_the_compressed_file_is_refused(archive: Path, tmp_path: Path) -> None:
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad = archive.with_name("flipped.tar.zst")
    bad.write_bytes(bytes(data))
    _assert_refused(bad, tmp_path, "does not verify")


def _assert_refused(bad: Path, tmp_path: Path, message: str) -> None:
    parent = tmp_path / "out"
    parent.mkdir(exist_ok=True)
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(bad.parent))
    with pytest.raises(PackError, match=message):
        unpack(bad, parent / "B")
    assert not (parent / "B").exists()
    assert os.listdir(parent) == []  # no staging folder left behind
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(bad.parent))) == before
    assert not Path("/tmp/nbrewind-evil.txt").exists() and not (tmp_path / "evil.txt").exists()


def test_other_package_versions_are_reported(archive: Path, tmp_path: Path) -> None:
    members = read_members(archive)
    manifest = json.loads(members[0][1])
    edited: Members = []
    for info, data in members[1:]:
        if info.name == "software/requirements.txt":
            data += b"zstandard==0.0.1\n"
            listed = next(f for f in manifest["files"] if f["path"] == info.name)
            listed["size"], listed["sha256"] = len(data), hashlib.sha256(data).hexdigest()
        edited.append((info, data))
    resigned = archive.with_name("other-env.tar.zst")
    write_members(resigned, [(members[0][0], resign(manifest)), *edited])
    result = unpack(resigned, tmp_path / "B")
    assert any(d.startswith("zstandard: backpack 0.0.1, here ") for d in result.environment)
