"""`jupyter nbrewind prune NB --keep-sessions N`: a dry run by default; what kept sessions need stays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_tools import Cli, write_notebook

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(600)]


def cells(values: str) -> list[str]:
    return [f"import dask\nv = dask.delayed(sum)([{values}]).compute(scheduler='sync')", "w = v * 2\nprint(w)"]


def decisions(cli: Cli, *args: str) -> list[str]:
    result = cli("run", "nb.ipynb", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [s["decision"] for s in json.loads(result.stdout)["summary"]]


def test_prune_keeps_what_the_newest_session_replays(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", cells("1, 2"))
    assert decisions(cli) == ["ran", "ran"]  # session 1: audit
    write_notebook(tmp_path / "nb.ipynb", cells("1, 3"))
    assert decisions(cli) == ["ran", "ran"]  # session 2: audit of the edit
    log = json.loads(cli("log", "nb.ipynb", "--tasks", "--json").stdout)
    assert [t["cell_run_id"] for t in log["tasks"]] == [log["cell_runs"][0]["id"]]  # this session's task only
    assert log["tasks"][0]["duration"] is not None
    text = cli("log", "nb.ipynb", "--tasks").stdout.split("\n\n")[1].splitlines()
    assert text[0].split() == ["run", "task", "key", "hit", "time", "saved", "bytes", "worker"] and len(text) == 3
    assert decisions(cli, "--kernel", "repeat") == ["replayed", "replayed"]  # session 3

    before = json.loads(cli("log", "nb.ipynb", "--all", "--json").stdout)["cell_runs"]
    dry = cli("prune", "nb.ipynb", "--keep-sessions", "1")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == "dry run: run again with --yes to remove them"
    assert json.loads(cli("log", "nb.ipynb", "--all", "--json").stdout)["cell_runs"] == before

    done = json.loads(cli("prune", "nb.ipynb", "--keep-sessions", "1", "--yes", "--min-age", "0", "--json").stdout)
    assert len(done["dropped_sessions"]) == 2 and done["cell_runs"] == 2 and done["cell_runs_kept_for_replays"] == 2
    assert done["task_rows"] == 1 and done["task_refs"] == 1 and done["bytes_removed"] > 0
    after = json.loads(cli("log", "nb.ipynb", "--all", "--json").stdout)["cell_runs"]
    assert [r["code"] for r in after] == [r["code"] for r in before[2:]]

    assert cli("verify", "nb.ipynb").returncode == 0
    assert json.loads(cli("status", "nb.ipynb", "--json").stdout)["trusted"] is True
    assert decisions(cli, "--kernel", "repeat") == ["replayed", "replayed"]
    write_notebook(tmp_path / "nb.ipynb", cells("1, 2"))
    result = json.loads(cli("run", "nb.ipynb", "--kernel", "repeat", "--json").stdout)["summary"]
    assert result[0]["decision"] == "ran" and result[0]["task_misses"] == 1  # session 1's record and task are gone
