"""The pack / unpack / verify / trust commands: thin, with --json and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbrewind.cli import main


def test_commands_end_to_end(project: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = project
    archive = tmp_path / "b.tar.zst"
    assert main(["pack", str(folder / "nb.ipynb"), "-o", str(archive), "--include-data", "--json"]) == 0
    packed = json.loads(capsys.readouterr().out)
    assert packed["archive"] == str(archive) and packed["data_included"] is True
    assert main(["verify", str(archive)]) == 0
    assert "backpack" in capsys.readouterr().out
    assert main(["unpack", str(archive), "-d", str(tmp_path / "B"), "--json"]) == 0
    unpacked = json.loads(capsys.readouterr().out)
    assert unpacked["trusted"] is True  # packed on this machine
    assert main(["trust", str(tmp_path / "B")]) == 0
    assert "already trusted" in capsys.readouterr().out
    assert main(["verify", str(folder / "nb.ipynb.nbrewind")]) == 0  # a plain store: the store check
    assert "objects" in capsys.readouterr().out

    (tmp_path / "B" / "data.csv").write_text("changed")
    assert main(["verify", str(tmp_path / "B"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and any("data/data.csv" in p for p in report["problems"])
    assert main(["trust", str(tmp_path / "B")]) == 1
    assert "does not verify" in capsys.readouterr().err


def test_unpack_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.tar.zst"
    bogus.write_bytes(b"not an archive at all")
    assert main(["unpack", str(bogus), "-d", str(tmp_path / "B")]) == 1
    assert "does not verify" in capsys.readouterr().err
    assert not (tmp_path / "B").exists()
