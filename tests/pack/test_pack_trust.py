"""Trust: stores this user signed are trusted, unpacked backpacks only after `trust`,
and the check the kernels make (check_store_origin) refuses or warns accordingly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nbrewind.errors import PackError, UntrustedStoreError
from nbrewind.pack import is_trusted, pack, trust, unpack
from nbrewind.store.origin import check_store_origin, environment_differences


@pytest.fixture
def unpacked(project: tuple[Path, dict[str, str]], tmp_path: Path) -> Path:
    folder, _ = project
    pack(folder / "nb.ipynb", tmp_path / "b.tar.zst", trust=False)
    unpack(tmp_path / "b.tar.zst", tmp_path / "B")
    return tmp_path / "B"


def test_local_store_is_trusted_and_unpacked_one_is_not(project: tuple[Path, dict[str, str]], unpacked: Path) -> None:
    folder, _ = project
    assert is_trusted(folder / "nb.ipynb.nbrewind")
    assert check_store_origin(folder / "nb.ipynb.nbrewind") is None
    store = unpacked / "nb.ipynb.nbrewind"
    assert not is_trusted(store)
    with pytest.raises(UntrustedStoreError, match=f"jupyter nbrewind trust {unpacked}"):
        check_store_origin(store)


def test_trust_records_a_signature_of_the_store(unpacked: Path, trust_db: Path) -> None:
    result = trust(unpacked)
    assert result.newly_trusted and Path(result.trust_db) == trust_db
    store = unpacked / "nb.ipynb.nbrewind"
    assert is_trusted(store) and check_store_origin(store) is None
    conn = sqlite3.connect(trust_db)
    try:
        rows = conn.execute("SELECT signature FROM signatures WHERE store = ?", (str(store),)).fetchall()
        assert rows == [(result.signature,)]  # the packed project's own store has signatures too
        assert conn.execute("SELECT sha256 FROM manifests").fetchall() == [(result.manifest_sha256,)]
    finally:
        conn.close()
    assert not trust(store).newly_trusted  # the store folder names the same backpack
    (store / "manifest.json").write_bytes((store / "manifest.json").read_bytes() + b" ")
    assert not is_trusted(store)  # an edited manifest is another backpack


def test_trust_refuses_a_tampered_folder(unpacked: Path) -> None:
    (unpacked / "helpers.py").write_text("import os; os.system('boom')\n")
    with pytest.raises(PackError, match="does not verify"):
        trust(unpacked)
    assert not is_trusted(unpacked / "nb.ipynb.nbrewind")


def test_packing_here_trusts_the_backpack(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    folder, _ = project
    pack(folder / "nb.ipynb", tmp_path / "b.tar.zst")
    assert unpack(tmp_path / "b.tar.zst", tmp_path / "B").trusted


def test_environment_differences() -> None:
    text = f"# python: 2.7\nzstandard==0.0.1\nnot-installed-anywhere==1.0\npytest=={pytest.__version__}\n"
    found = environment_differences(text)
    assert found[0].startswith("python: backpack 2.7, here 3.")
    assert any(d.startswith("zstandard: backpack 0.0.1, here ") for d in found)
    assert "not-installed-anywhere: backpack 1.0, not installed here" in found
    assert not any(d.startswith("pytest") for d in found)
    assert environment_differences("Some_Pkg==1.0", installed={"some-pkg": "1.0"}) == []


def test_trusted_backpack_from_another_environment_warns(unpacked: Path) -> None:
    store = unpacked / "nb.ipynb.nbrewind"
    trust(unpacked)
    requirements = store / "backpack" / "software" / "requirements.txt"
    requirements.write_text(requirements.read_text() + "zstandard==0.0.1\n")
    notice = check_store_origin(store)
    assert notice is not None and "zstandard: backpack 0.0.1" in notice and "still replay" in notice
