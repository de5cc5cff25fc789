"""Bad inputs get one clear line on stderr and exit 2, never a traceback (unless --debug).

Each row of issue 15's table is a real `jupyter nbrewind` subprocess and its exact message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_tools import Cli, cli_env, write_notebook

from nbrewind.store import Store

pytestmark = pytest.mark.timeout(300)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (and the check that there is only one)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_run_given_a_python_file(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "file.py").write_text("print(1)\n")
    result = cli("run", "file.py")
    assert result.returncode == 2
    assert one_line(result) == f"jupyter nbrewind run: {tmp_path}/file.py is not a notebook: expected an .ipynb file"


def test_run_given_a_json_file(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text('{"a": 1}\n')
    result = cli("run", "data.json")
    assert result.returncode == 2
    assert one_line(result) == f"jupyter nbrewind run: {tmp_path}/data.json is not a notebook: expected an .ipynb file"


def test_run_given_a_notebook_that_is_not_json(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "broken.ipynb").write_text("not json at all")
    result = cli("run", "broken.ipynb")
    assert result.returncode == 2
    assert one_line(result).startswith(f"jupyter nbrewind run: {tmp_path}/broken.ipynb is not a Jupyter notebook (")


def test_run_given_a_missing_notebook(cli: Cli, tmp_path: Path) -> None:
    result = cli("run", "missing.ipynb")
    assert result.returncode == 2
    assert one_line(result) == f"jupyter nbrewind run: {tmp_path}/missing.ipynb does not exist"


def test_run_given_an_unknown_kernel(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["x = 1"])
    result = cli("run", "nb.ipynb", "--kernel", "bogus")
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind run: unknown kernel 'bogus'; choose one of audit, repeat, python3, nbrewind-audit, nbrewind-repeat"
    )


def test_pack_given_a_missing_notebook(cli: Cli) -> None:
    result = cli("pack", "missing.ipynb")
    assert result.returncode == 2
    assert one_line(result) == "jupyter nbrewind pack: missing.ipynb does not exist"


def test_unpack_given_a_text_file(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("some notes\n")
    result = cli("unpack", "notes.txt")
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind unpack: notes.txt is not a backpack (a .tar.zst archive made by `jupyter nbrewind pack`)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_verify_given_a_notebook_checks_its_store(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "analysis.ipynb", ["x = 1"])
    result = cli("verify", "analysis.ipynb")
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind verify: no store: analysis.ipynb.nbrewind (the notebook analysis.ipynb) does not exist; "
        "no *.nbrewind store nearby: run the notebook on the audit kernel first"
    )
    Store.open(tmp_path / "analysis.ipynb.nbrewind").close()
    result = cli("verify", "analysis.ipynb")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"checked 0 objects in {tmp_path}/analysis.ipynb.nbrewind: ok"


def test_verify_given_a_missing_notebook(cli: Cli) -> None:
    result = cli("verify", "analysis.ipynb")
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind verify: analysis.ipynb does not exist (and neither does its store analysis.ipynb.nbrewind)"
    )


def test_log_beside_a_notebook_names_the_stores_nearby(cli: Cli, tmp_path: Path) -> None:
    Store.open(tmp_path / "analysis.ipynb.nbrewind").close()
    result = cli("log")
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind log: no store: .nbrewind (the default) does not exist; stores nearby: "
        "analysis.ipynb.nbrewind (name one with --store, or pass its notebook)"
    )


def test_a_missing_store_is_reported_as_missing(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    result = cli("du", "--store", str(missing))
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind du: no store: nonexistent (--store) does not exist; "
        "no *.nbrewind store nearby: run the notebook on the audit kernel first"
    )


def test_a_folder_that_is_not_a_store(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "a.txt").write_text("x")
    result = cli("log", "--store", "stuff")
    assert result.returncode == 2
    assert one_line(result) == (
        "jupyter nbrewind log: stuff is not an NBRewind store (no nbrewind-store.json; store from --store); "
        "no *.nbrewind store nearby: run the notebook on the audit kernel first"
    )


def test_log_given_a_file_that_is_neither_notebook_nor_store(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    result = cli("log", "notes.txt")
    assert result.returncode == 2
    assert one_line(result) == "jupyter nbrewind log: notes.txt is neither a notebook (.ipynb) nor a store folder"


def test_debug_shows_the_traceback(cli: Cli) -> None:
    result = cli("--debug", "pack", "missing.ipynb")
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "BadInput: missing.ipynb does not exist" in result.stderr


def test_a_closed_pipe_ends_log_quietly(tmp_path: Path) -> None:
    Store.open(tmp_path / "nb.ipynb.nbrewind").close()
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: `log --json | head -0`
    try:
        result = subprocess.run(
            [sys.executable, "-m", "nbrewind.cli", "log", "nb.ipynb", "--json"], stdout=write,
            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=cli_env(), timeout=120,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == 1
