"""Files a cell leaves in the temp folder (issue 15, item 7).

A replay does not write them back into the temp folder: they stay pending until user code
runs again (a cell that runs, or a recorded cell the Rebuilder re-runs), so a repeat that
runs nothing leaves the temp folder alone. While pending, keys see each path as it will be:
a replayed chain that reads, stats or lists them still matches, and a record made while one
was missing does not. The notebook's own files are still written back at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any as Runner  # the fixture type lives in conftest.py

import pytest

from nbrewind.checkpoint import hidden
from nbrewind.store import Store


def decisions(outcomes: list) -> str:
    return "".join(o.decision[0].upper() for o in outcomes)  # R(eplayed) / E(xecuted)


WRITE = (
    "import os, tempfile\n"
    "fd, path = tempfile.mkstemp(suffix='.txt', prefix='nbrewind-test-')\n"
    "with os.fdopen(fd, 'w') as fh:\n"
    "    fh.write('alpha\\nbeta\\n')\n"
    "del fd, fh"
)
READ = "with open(path) as fh:\n    first = fh.readline().strip()\ndel fh"
OTHER = "print('done')\nthird = 3"
READ_ALL = "with open(path) as fh:\n    text = fh.read().upper()\ndel fh"


@pytest.fixture
def temp_files() -> Iterator[list[str]]:
    """Paths the test's cells made in the temp folder, removed afterwards."""
    made: list[str] = []
    yield made
    for path in made:
        Path(path).unlink(missing_ok=True)
        if os.path.basename(os.path.dirname(path)).startswith("nbrewind-test-"):
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def audit_and_remove(runner: Runner, cells: list[str], temp_files: list[str]) -> str:
    """Audit `cells`, then remove the temp file they made (as a reboot or a tmp cleaner does)."""
    out = runner.run(cells)
    assert all(o.success for o in out), [o.error for o in out]
    path = str(runner.ns["path"])
    temp_files.append(path)
    assert hidden.in_temp_folder(os.path.realpath(path), runner.workdir.resolve())
    os.remove(path)
    return path


def test_an_unmodified_repeat_replays_every_cell_and_leaves_the_temp_folder_alone(runner: Runner, temp_files: list[str]) -> None:
    path = audit_and_remove(runner, [WRITE, READ, OTHER], temp_files)
    out = runner.run([WRITE, READ, OTHER], "repeat")
    assert decisions(out) == "RRR", [o.reason for o in out]
    assert not os.path.exists(path)
    assert runner.ns["first"] == "alpha" and runner.ns["third"] == 3


def test_a_cell_that_runs_after_replays_finds_the_temp_file_as_a_fresh_run_would(runner: Runner, temp_files: list[str]) -> None:
    path = audit_and_remove(runner, [WRITE, READ, OTHER], temp_files)
    out = runner.run([WRITE, READ, READ_ALL], "repeat")
    assert decisions(out) == "RRE", [o.reason for o in out]
    assert out[2].success, out[2].error
    assert runner.ns["text"] == "ALPHA\nBETA\n"  # what a fresh run of these cells reads
    with open(path) as fh:
        assert fh.read() == "alpha\nbeta\n"


def test_a_replayed_cell_that_reads_a_pending_temp_file_still_replays(runner: Runner, temp_files: list[str]) -> None:
    """The reader's `@file:` input is keyed on the pending content, not on the missing file."""
    path = audit_and_remove(runner, [WRITE, READ], temp_files)
    out = runner.run([WRITE, READ], "repeat")
    assert decisions(out) == "RR", [o.reason for o in out]
    assert not os.path.exists(path)
    # ...and once a cell runs, the file is there and the chain goes on as recorded.
    out = runner.run(["print(first)"], "repeat", fresh=False)
    assert decisions(out) == "E" and os.path.exists(path)


WRITE_IN_DIR = (
    "import os, tempfile\n"
    "folder = tempfile.mkdtemp(prefix='nbrewind-test-')\n"
    "path = os.path.join(folder, 'data.txt')\n"
    "with open(path, 'w') as fh:\n"
    "    fh.write('alpha\\nbeta\\n')\n"
    "del fh"
)
CHECKS = (
    "import os\n"
    "exists = os.path.exists(path)\n"
    "size = os.path.getsize(path)\n"
    "is_folder = os.path.isdir(folder)\n"
    "names = sorted(os.listdir(folder))"
)


def test_stats_and_listings_of_pending_temp_files_see_them_written(runner: Runner, temp_files: list[str]) -> None:
    """The temp folder the cell made is gone too (a reboot): the file's folder is made when it is written."""
    path = audit_and_remove(runner, [WRITE_IN_DIR, CHECKS], temp_files)
    os.rmdir(os.path.dirname(path))
    out = runner.run([WRITE_IN_DIR, CHECKS], "repeat")
    assert decisions(out) == "RR", [o.reason for o in out]
    assert not os.path.exists(os.path.dirname(path))
    ns = runner.ns
    assert (ns["exists"], ns["size"], ns["is_folder"], ns["names"]) == (True, 11, True, ["data.txt"])
    out = runner.run(["sizes = [os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)]"], "repeat", fresh=False)
    assert decisions(out) == "E" and out[0].success and runner.ns["sizes"] == [11]


def test_a_record_made_while_the_temp_file_was_missing_is_not_replayed_after_the_writer_replays(
    runner: Runner, temp_files: list[str]
) -> None:
    """The audit checks the file, removes it and checks again: the newest record of the check
    says "missing". After the writer replays, a fresh run finds the file: replaying that
    newest record would be stale."""
    check = "import os\nfound = os.path.exists(path)"
    out = runner.run([WRITE, check, "os.remove(path)", check])
    assert all(o.success for o in out) and runner.ns["found"] is False
    temp_files.append(str(runner.ns["path"]))
    out = runner.run([WRITE, check], "repeat")
    assert decisions(out) == "RR", [o.reason for o in out]
    assert runner.ns["found"] is True


def test_a_value_made_again_by_rerunning_a_replayed_cell_finds_the_temp_file_it_read(
    runner: Runner, temp_files: list[str]
) -> None:
    """A replayed value whose stored object is lost is made again by re-running its cell, which
    reads the pending temp file: the Rebuilder writes pending files back first."""
    count = "with open(path) as fh:\n    lines = fh.read().splitlines()\ndel fh"
    path = audit_and_remove(runner, [WRITE, count], temp_files)
    out = runner.run([WRITE, count], "repeat")
    assert decisions(out) == "RR", [o.reason for o in out]
    assert not os.path.exists(path)
    assert runner.session is not None
    digest = runner.session.state.entries["lines"].digest
    with Store.open(runner.store) as store:
        store.objects.path_of(digest).unlink()
    assert runner.ns["lines"] == ["alpha", "beta"]
    assert os.path.exists(path)


def test_the_notebooks_own_files_are_still_written_back_at_once(runner: Runner) -> None:
    cells = ["with open('out.txt', 'w') as fh:\n    fh.write('kept')\ndel fh", "x = 1"]
    runner.run(cells)
    os.remove("out.txt")
    out = runner.run(cells, "repeat")
    assert decisions(out) == "RR"
    assert Path("out.txt").read_text() == "kept"


def test_in_temp_folder_leaves_a_notebook_folder_inside_the_temp_folder_its_own(tmp_path: Path) -> None:
    temp = os.path.realpath(tempfile.gettempdir())
    inside = os.path.join(temp, "nbrewind-notebook-folder")
    elsewhere = os.path.join(os.path.dirname(temp) or "/", "home-of-the-notebook")
    assert hidden.in_temp_folder(os.path.join(temp, "tmpabc.txt"), elsewhere)
    assert hidden.in_temp_folder(os.path.join(temp, "tmpabc.txt"), inside)
    assert not hidden.in_temp_folder(os.path.join(inside, "out.csv"), inside)
    assert not hidden.in_temp_folder(os.path.join(temp, "out.csv"), temp)
    assert hidden.in_temp_folder(os.path.join(temp, "tmpabc.txt"), "/")
    assert not hidden.in_temp_folder(os.path.join(elsewhere, "out.csv"), elsewhere)
