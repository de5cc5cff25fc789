"""pack: deterministic archives with the layout of issue 7, and what goes into them."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from pathlib import Path

import pytest
from backpack_tools import CSV, read_members

from nbrewind.errors import PackError
from nbrewind.pack import pack
from nbrewind.pack.build import FIXED_MTIME
from nbrewind.store import Store
from nbrewind.store.origin import is_trusted


def test_packing_twice_gives_identical_bytes(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, _ = project
    first = pack(folder / "nb.ipynb", tmp_path / "one.tar.zst", include_data=True)
    second = pack(folder / "nb.ipynb", tmp_path / "two.tar.zst", include_data=True)
    assert (tmp_path / "one.tar.zst").read_bytes() == (tmp_path / "two.tar.zst").read_bytes()
    assert first.manifest_sha256 == second.manifest_sha256
    latest = pack(folder / "nb.ipynb", tmp_path / "three.tar.zst", history="latest")
    assert latest.manifest_sha256 != first.manifest_sha256


def test_layout_headers_and_manifest(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, digests = project
    result = pack(folder / "nb.ipynb", tmp_path / "b.tar.zst")
    members = read_members(tmp_path / "b.tar.zst")
    names = [m.name for m, _ in members]
    assert names[0] == "nbrewind/manifest.json"
    assert names[1:] == sorted(names[1:])
    for info, _ in members:
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (FIXED_MTIME, 0, 0, "", "", 0o644)
        assert info.type == tarfile.REGTYPE and not info.pax_headers
    assert {"workflow/nb.ipynb", "workflow/helpers.py", "workflow/util.py", "software/requirements.txt",
            "software/environment.yml", "data/data.yml", "compute/compute.yml", "nbrewind/catalog.sqlite",
            "nbrewind/nbrewind-store.json"} <= set(names)
    assert "workflow/unrelated.py" not in names  # not imported
    assert "data/data.csv" not in names  # only with --include-data
    objects = {n.split("/", 2)[2].replace("/", "") for n in names if n.startswith("nbrewind/objects/")}
    assert objects == {digests["old"], digests["new"], digests["outputs"], digests["output_child"]}
    assert result.objects == 4 and result.cell_runs == 2

    blobs = dict((m.name, data) for m, data in members)
    manifest = json.loads(blobs["nbrewind/manifest.json"])
    assert (manifest["format"], manifest["version"], manifest["notebook"]) == ("nbrewind-backpack", 1, "nb.ipynb")
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(listed) == set(names[1:])
    assert listed["data/data.yml"]["size"] == len(blobs["data/data.yml"])
    assert [r["session"] for r in manifest["cell_runs"]] == ["s1", "s2"]
    requirements = blobs["software/requirements.txt"].decode()
    assert "# python: 3." in requirements and "zstandard==" in requirements
    assert "- python=3." in blobs["software/environment.yml"].decode()
    assert "cores:" in blobs["compute/compute.yml"].decode()
    assert is_trusted(tmp_path) and result.manifest_sha256  # a store without a manifest is local, trusted


def test_data_yml_lists_inputs_and_include_data_packs_them(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, _ = project
    pack(folder / "nb.ipynb", tmp_path / "b.tar.zst", include_data=True)
    blobs = {m.name: data for m, data in read_members(tmp_path / "b.tar.zst")}
    assert blobs["data/data.csv"] == CSV
    data_yml = blobs["data/data.yml"].decode()
    assert 'path: "data.csv"' in data_yml and "size: 12" in data_yml
    assert 'checksum: "sha256:' in data_yml and 'source: "backpack://data/data.csv"' in data_yml
    assert "elsewhere.zip" not in data_yml  # recorded as absent: not an input


def test_changed_input_is_reported(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, _ = project
    (folder / "data.csv").write_bytes(b"x,y\n9,9\n")
    result = pack(folder / "nb.ipynb", tmp_path / "b.tar.zst")
    assert any("data.csv changed since the audit" in w for w in result.warnings)


def test_history_latest_keeps_only_the_newest_session(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, digests = project
    pack(folder / "nb.ipynb", tmp_path / "b.tar.zst", history="latest")
    members = read_members(tmp_path / "b.tar.zst")
    names = {m.name for m, _ in members}
    assert f"nbrewind/objects/{digests['new'][:2]}/{digests['new'][2:]}" in names
    assert f"nbrewind/objects/{digests['old'][:2]}/{digests['old'][2:]}" not in names
    catalog = tmp_path / "catalog.sqlite"
    catalog.write_bytes(dict((m.name, d) for m, d in members)["nbrewind/catalog.sqlite"])
    conn = sqlite3.connect(catalog)
    try:
        assert conn.execute("SELECT DISTINCT session FROM cell_runs").fetchall() == [("s2",)]
        assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (1,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        conn.close()


def test_damaged_store_is_not_packed(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, digests = project
    with Store.open(folder / "nb.ipynb.nbrewind") as store:
        path = store.objects.path_of(digests["new"])
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    with pytest.raises(PackError, match="cannot be packed"):
        pack(folder / "nb.ipynb", tmp_path / "b.tar.zst")
    assert not (tmp_path / "b.tar.zst").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_bad_arguments(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, _ = project
    with pytest.raises(PackError, match="not a notebook"):
        pack(folder / "data.csv")
    with pytest.raises(PackError, match="history"):
        pack(folder / "nb.ipynb", history="some")
