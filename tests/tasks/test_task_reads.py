"""What a task read while it ran (`nbrewind.tasks.reads`), on real files and real imports."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from nbrewind.tasks.reads import digest_reads, recording_reads


def test_a_module_imported_from_its_cache_is_recorded_as_its_source(tmp_path: Path, monkeypatch) -> None:
    """An import that finds an up-to-date ``__pycache__`` reads only the ``.pyc``; the
    record names the ``.py`` (whose edit the ``.pyc`` shows only after the next import, and
    which another folder has without the cache)."""
    (tmp_path / "nbr_reads_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    importlib.import_module("nbr_reads_mod")  # compiles and writes the cache
    del sys.modules["nbr_reads_mod"]
    assert list((tmp_path / "__pycache__").glob("nbr_reads_mod.*.pyc"))
    with recording_reads() as reads:
        importlib.import_module("nbr_reads_mod")
        os.listdir(tmp_path / "__pycache__")
    del sys.modules["nbr_reads_mod"]
    assert any(path.endswith(".pyc") for path in reads.files), "the import read its cache"
    recorded = digest_reads(reads)
    assert recorded is not None
    assert list(recorded["files"]) == ["nbr_reads_mod.py"]
    assert recorded["dirs"] == {}


def test_reads_of_the_running_system_are_not_the_tasks(tmp_path: Path, monkeypatch) -> None:
    """``/proc``, ``/sys`` and ``/dev`` describe the running system: a worker's garbage
    collection reads ``/proc/<pid>/statm`` on the task's thread (distributed's gc callback),
    and recording it made the cell that computed the task run again on every repeat."""
    import gc

    data = tmp_path / "data.txt"
    data.write_text("1")
    monkeypatch.chdir(tmp_path)

    def statm(phase: str, info: dict) -> None:
        with open(f"/proc/{os.getpid()}/statm") as handle:
            handle.read()

    gc.callbacks.append(statm)
    try:
        with recording_reads() as reads:
            gc.collect()
            os.listdir("/proc/self/fd")
            with open("/dev/null") as handle:
                handle.read()
            data.read_text()
    finally:
        gc.callbacks.remove(statm)
    recorded = digest_reads(reads)
    assert recorded is not None
    assert list(recorded["files"]) == ["data.txt"]
    assert recorded["dirs"] == {}
