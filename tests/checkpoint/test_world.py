"""WorldTracker: what a cell read of the world besides file contents, on real files, a real
sqlite database and a real subprocess."""

from __future__ import annotations

import glob
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from nbrewind.checkpoint.world import WorldTracker, listing_key, stat_key


def _tracker() -> WorldTracker:
    return WorldTracker(lambda path: False)


def _as_cell(code: str, **names: Any) -> None:
    """Run `code` as notebook code runs: in a namespace whose __name__ is __main__."""
    exec(compile(code, "<cell>", "exec"), {"__name__": "__main__", **names})


def test_listings_stats_and_databases_are_recorded_with_what_they_saw(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("1")
    tracker = _tracker()
    with tracker.tracking():
        _as_cell(
            "names = sorted(os.listdir(d)); found = glob.glob(d + '/*.csv'); n = len(list(os.scandir(d)))\n"
            "here = os.path.exists(f); size = os.path.getsize(g)\n"
            "sqlite3.connect(db).close()",
            os=os, glob=glob, sqlite3=sqlite3, d=str(data), f=str(tmp_path / "flag"), g=str(data / "a.csv"),
            db=str(tmp_path / "x.db"),
        )
    assert tracker.listings[str(data)] == listing_key(str(data))
    assert tracker.stats[str(tmp_path / "flag")] == "absent"
    assert tracker.stats[str(data / "a.csv")] == stat_key(str(data / "a.csv")) and "file|1|" in tracker.stats[str(data / "a.csv")]
    assert str(tmp_path / "x.db") in tracker.databases
    (data / "b.csv").write_text("22")
    assert listing_key(str(data)) != tracker.listings[str(data)]  # a new file changes the key


def test_environment_reads_and_impure_calls_are_the_cells(tmp_path: Path) -> None:
    tracker = _tracker()
    os.environ["NBREWIND_WORLD_TEST"] = "1"
    try:
        with tracker.tracking():
            _as_cell(
                "def f():\n    return os.environ.get('NBREWIND_WORLD_TEST'), os.getenv('NBREWIND_WORLD_ABSENT')\n"
                "f()\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)",
                os=os, subprocess=subprocess, sys=sys,
            )
    finally:
        del os.environ["NBREWIND_WORLD_TEST"]
    assert {"NBREWIND_WORLD_TEST", "NBREWIND_WORLD_ABSENT"} <= tracker.env_reads
    assert tracker.impure == ["starts a subprocess"]


def test_what_libraries_do_for_themselves_is_not_recorded(tmp_path: Path) -> None:
    """Code of distributed (here: code that says it is) and of modules being imported is theirs."""
    tracker = _tracker()
    with tracker.tracking():
        exec(
            compile("os.listdir(d); os.path.exists(d); os.environ.get('HOME')", "<lib>", "exec"),
            {"__name__": "distributed.fake", "os": os, "d": str(tmp_path)},
        )
    assert tracker.listings == {} and tracker.stats == {} and tracker.env_reads == set()


def test_tracking_puts_os_stat_and_environ_back() -> None:
    stat, lstat = os.stat, os.lstat
    getitem = type(os.environ).__getitem__
    with _tracker().tracking():
        assert os.stat is not stat
    assert os.stat is stat and os.lstat is lstat and type(os.environ).__getitem__ is getitem
