"""`jupyter nbrewind run` as a drop-in for papermill, on real kernels through the real CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from cli_tools import Cli, cli_env, code_outputs, write_notebook

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(600)]

PARAMETERIZED = [
    ("N = 3\nlabel = 'default'\nscale = 1.0", ["parameters"]),
    "total = sum(range(N)) * scale\nprint(label, N, total)",
    "import os\nprint(os.path.basename(os.getcwd()))",
    "{'n': N, 'label': label, 'type': type(N).__name__}",
]


def papermill(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "papermill", *args], capture_output=True, text=True, cwd=cwd,
                          env=cli_env(), timeout=240)


def test_parameters_give_papermills_outputs_and_replay_on_the_second_run(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", PARAMETERIZED)
    (tmp_path / "params.yaml").write_text("N: 5\nscale: 2.5\n")
    pm = papermill("nb.ipynb", "pm.ipynb", "-k", "python3", "-f", "params.yaml", "-p", "label", "x", "--no-progress-bar", cwd=tmp_path)
    assert pm.returncode == 0, pm.stderr

    first = cli("run", "nb.ipynb", "-o", "audit.ipynb", "-f", "params.yaml", "-p", "label", "x", "--json")
    assert first.returncode == 0, first.stderr
    assert "without encryption" not in first.stderr  # IPC transport: no TCP warning
    assert code_outputs(tmp_path / "audit.ipynb") == code_outputs(tmp_path / "pm.ipynb")
    ours, theirs = nbformat.read(str(tmp_path / "audit.ipynb"), 4), nbformat.read(str(tmp_path / "pm.ipynb"), 4)
    assert [c.source for c in ours.cells] == [c.source for c in theirs.cells]
    assert ours.cells[1].metadata["tags"] == ["injected-parameters"]
    assert "N = 5" in ours.cells[1].source and 'label = "x"' in ours.cells[1].source
    assert json.loads(first.stdout)["parameters"] == {"N": 5, "scale": 2.5, "label": "x"}

    second = cli("run", "nb.ipynb", "--kernel", "nbrewind-repeat", "-o", "repeat.ipynb", "-f", "params.yaml", "-p", "label", "x", "--json")
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)["summary"]
    assert [s["decision"] for s in summary] == ["replayed"] * 5
    assert all(s["why"].startswith("code and all ") and "recorded inputs unchanged" in s["why"] for s in summary)
    assert code_outputs(tmp_path / "repeat.ipynb") == code_outputs(tmp_path / "pm.ipynb")

    changed = cli("run", "nb.ipynb", "--kernel", "repeat", "-p", "N", "6", "-f", "params.yaml", "--json")
    decisions = [s["decision"] for s in json.loads(changed.stdout)["summary"]]
    assert decisions[0] == "replayed" and decisions[1] == "ran"  # the injected cell changed


def test_papermill_on_the_audit_kernel_lands_in_runs_store(cli: Cli, tmp_path: Path) -> None:
    """Papermill tells the kernel only its cwd and environment: NBREWIND_STORE puts both in one store."""
    write_notebook(tmp_path / "nb.ipynb", PARAMETERIZED)
    env = cli_env(store=str(tmp_path / "nb.ipynb.nbrewind"))
    pm = subprocess.run([sys.executable, "-m", "papermill", "nb.ipynb", "pm.ipynb", "-k", "nbrewind-audit", "-p", "N", "4",
                         "--no-progress-bar"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert pm.returncode == 0, pm.stderr
    repeat = cli("run", "nb.ipynb", "--kernel", "repeat", "-p", "N", "4", "--json")
    assert [s["decision"] for s in json.loads(repeat.stdout)["summary"]] == ["replayed"] * 5


def test_a_failing_cell_is_one_line_exit_1_and_the_partial_output_is_written(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["x = 1\nprint('before')", "1/0", "print('after')"])
    result = cli("run", "nb.ipynb", "-o", "out.ipynb", "--quiet")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "jupyter nbrewind run: cell 2 (In [2]): ZeroDivisionError: division by zero; partial outputs written to out.ipynb"
    ]
    outputs = code_outputs(tmp_path / "out.ipynb")
    assert outputs[0][0]["text"] == "before\n" and outputs[1][0]["ename"] == "ZeroDivisionError" and outputs[2] == []


def test_allow_errors_lists_the_errors_and_exits_0(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["1/0", "print('after')", "raise KeyError('k')"])
    result = cli("run", "nb.ipynb", "--allow-errors", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["error"] == "cell 1 (In [1]): ZeroDivisionError: division by zero"
    assert [(e["cell"], e["ename"]) for e in report["errors"]] == [(1, "ZeroDivisionError"), (3, "KeyError")]
    assert [c["nbrewind"]["decision"] for c in report["cells"]] == ["ran"] * 3  # each reply's metadata.nbrewind
    text = cli("run", "nb.ipynb", "--allow-errors", "--kernel", "repeat")
    assert text.returncode == 0
    assert text.stderr.splitlines()[-3:] == [
        "2 cell(s) raised (--allow-errors):",
        "  cell 1 (In [1]): ZeroDivisionError: division by zero",
        "  cell 3 (In [3]): KeyError: 'k'",
    ]
    table = text.stdout.splitlines()
    assert table[0].split() == ["cell", "In", "time", "tasks", "hit/miss", "saved", "why"]
    assert "replayed" in table[2] and "raised ZeroDivisionError: division by zero" in table[2]
    assert table[-2].startswith("3 replayed, 0 ran; tasks 0 hit / 0 missed; time saved against the recorded runs: ")


def test_ctrl_c_interrupts_the_cell_keeps_the_record_and_writes_the_output(tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["x = 1", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)", "y = 2"])
    process = subprocess.Popen([sys.executable, "-m", "nbrewind.cli", "run", "nb.ipynb", "-o", "out.ipynb"], cwd=tmp_path,
                               env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _has_cell_runs(tmp_path / "nb.ipynb.nbrewind", 1):
        time.sleep(0.2)
    time.sleep(1.5)  # into the sleeping cell
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Error" not in stderr
    assert stderr.splitlines()[-1] == "jupyter nbrewind run: interrupted; partial outputs written to out.ipynb"
    outputs = code_outputs(tmp_path / "out.ipynb")
    assert outputs[1][0]["text"] == "sleeping\n" and outputs[1][-1]["ename"] == "KeyboardInterrupt" and outputs[2] == []


def _has_cell_runs(store: Path, count: int) -> bool:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{store / 'catalog.sqlite'}?mode=ro", uri=True) as db:
            return bool(db.execute("SELECT COUNT(*) FROM cell_runs").fetchone()[0] >= count)
    except sqlite3.Error:
        return False


def test_an_untrusted_store_is_said_by_run_itself(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["x = 1"])
    assert cli("run", "nb.ipynb", "--quiet").returncode == 0
    import sqlite3

    with sqlite3.connect(tmp_path / "nb.ipynb.nbrewind" / "catalog.sqlite") as db:  # changed outside NBRewind
        db.execute("UPDATE cell_runs SET reason = 'edited'")
    result = cli("run", "nb.ipynb", "--kernel", "repeat", "--quiet")
    assert result.returncode == 0
    assert result.stderr.splitlines()[0].startswith(f"NBRewind: the store at {tmp_path}/nb.ipynb.nbrewind is not signed by you: ")
    assert f"run `jupyter nbrewind trust {tmp_path}/nb.ipynb.nbrewind`" in result.stderr


def test_cwd_sets_the_kernels_working_directory(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    write_notebook(tmp_path / "nb.ipynb", ["import os\nprint(os.getcwd())"])
    result = cli("run", "nb.ipynb", "--cwd", "work", "-o", "out.ipynb", "-k", "python3", "--quiet")
    assert result.returncode == 0, result.stderr
    assert code_outputs(tmp_path / "out.ipynb")[0][0]["text"] == f"{tmp_path / 'work'}\n"


def test_run_points_at_the_store_papermill_made_without_nbrewind_store(cli: Cli, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", PARAMETERIZED)
    pm = papermill("nb.ipynb", "pm.ipynb", "-k", "nbrewind-audit", "--no-progress-bar", cwd=tmp_path)
    assert pm.returncode == 0, pm.stderr
    assert (tmp_path / ".nbrewind").is_dir() and not (tmp_path / "nb.ipynb.nbrewind").exists()
    hinted = cli("run", "nb.ipynb", "--kernel", "repeat", "--quiet")
    assert hinted.stderr.splitlines()[0] == (
        "jupyter nbrewind run: no store at nb.ipynb.nbrewind yet, so every cell runs; .nbrewind exists (papermill's "
        "kernels store there unless NBREWIND_STORE is set): pass --store .nbrewind to replay from it"
    )
    replay = cli("run", "nb.ipynb", "--kernel", "repeat", "--store", ".nbrewind", "--json")
    assert [s["decision"] for s in json.loads(replay.stdout)["summary"]] == ["replayed"] * 4
