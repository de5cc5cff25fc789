"""Every store-reading command finds the store the same way:
--store, then NBREWIND_STORE, then NOTEBOOK.nbrewind, then ./.nbrewind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_tools import Cli, cli_env

from nbrewind.store import Store


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, Path]:
    made = {
        "flag": tmp_path / "flag-store",
        "env": tmp_path / "env-store",
        "notebook": tmp_path / "nb.ipynb.nbrewind",
        "default": tmp_path / ".nbrewind",
    }
    for path in made.values():
        Store.open(path).close()
    return made


def store_of(cli: Cli, *args: str, env: dict[str, str] | None = None) -> Path:
    result = cli("status", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return Path(json.loads(result.stdout)["store"])


def test_the_order_is_flag_env_notebook_default(cli: Cli, stores: dict[str, Path]) -> None:
    env = cli_env(store=str(stores["env"]))
    assert store_of(cli, "nb.ipynb", "--store", str(stores["flag"]), env=env) == stores["flag"]
    assert store_of(cli, "nb.ipynb", env=env) == stores["env"]
    assert store_of(cli, "nb.ipynb") == stores["notebook"]
    assert store_of(cli) == stores["default"]
    assert store_of(cli, str(stores["flag"])) == stores["flag"]  # a store folder as the argument
    assert store_of(cli, str(stores["flag"]), env=env) == stores["flag"]  # ... is as explicit as --store


@pytest.mark.parametrize("command", ["log", "du", "gc", "verify", "status"])
def test_each_command_takes_a_notebook(cli: Cli, tmp_path: Path, command: str) -> None:
    Store.open(tmp_path / "nb.ipynb.nbrewind").close()
    assert cli(command, "nb.ipynb", "--json").returncode == 0
    without = cli(command)
    assert without.returncode == 2 and "no store: .nbrewind (the default) does not exist" in without.stderr
    missing = cli(command, "other.ipynb")
    assert missing.returncode == 2
    assert "other.ipynb does not exist (and neither does its store other.ipynb.nbrewind)" in missing.stderr


def test_status_shows_trust_writes_session_and_size(cli: Cli, stores: dict[str, Path]) -> None:
    result = cli("status", "nb.ipynb")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"store:           {stores['notebook']}"
    assert lines[1].startswith("trust:           trusted (")
    assert lines[2] == "pending writes:  none (everything recorded is durable)"
    assert lines[3].startswith("size:            ") and "bytes on disk" in lines[3]
    assert lines[4] == "history:         0 session(s), 0 cell run(s)"
