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
    assert tracker.kinds[str(tmp_path / "flag")] == "absent" and str(tmp_path / "flag") not in tracker.stats
    assert tracker.stats[str(data / "a.csv")] == stat_key(str(data / "a.csv")) and "file|1|" in tracker.stats[str(data / "a.csv")]
    assert str(tmp_path / "x.db") in tracker.databases
    (data / "b.csv").write_text("22")
    assert listing_key(str(data)) != tracker.listings[str(data)]  # a new file changes the key


def test_an_existence_check_records_only_what_it_can_tell(tmp_path: Path) -> None:
    # PIL's Image.save asks os.path.exists(out) before writing: a plot cell must not be keyed
    # on the content of the previous run's picture.
    out = tmp_path / "plot.png"
    out.write_bytes(b"old picture")
    other = tmp_path / "data.csv"
    other.write_text("1,2")
    tracker = _tracker()
    with tracker.tracking():
        _as_cell(
            "a = os.path.exists(out); b = os.path.isfile(out); c = Path(out).exists(); d = os.path.isdir(str(tmp))\n"
            "e = Path(other).exists(); n = os.path.getsize(other)",
            os=os, Path=Path, out=str(out), other=str(other), tmp=tmp_path,
        )
    assert tracker.kinds == {str(out): "file", str(tmp_path): "dir", str(other): "file"}
    assert str(out) not in tracker.stats and str(tmp_path) not in tracker.stats
    assert tracker.stats[str(other)] == stat_key(str(other))  # getsize tells the size: a full stat
    out.write_bytes(b"a new picture, another size")
    assert stat_key(str(out), kind_only=True) == "file"  # the existence check's answer is unchanged
    out.unlink()
    assert stat_key(str(out), kind_only=True) == "absent"


def test_the_check_pil_makes_before_overwriting_a_picture_is_not_the_cells(tmp_path: Path) -> None:
    """matplotlib's savefig reaches PIL's Image.save, which asks whether the file exists only
    to remove a partial one after a failed write: a plot cell repeated after the audit wrote
    its picture must not run again for that. The cell's own check stays an input."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "plot.png"
    tracker = _tracker()
    with tracker.tracking():
        _as_cell("fig, ax = plt.subplots()\nfig.savefig(out)\nplt.close(fig)", plt=plt, out=str(out))
    assert out.exists() and str(out) not in tracker.kinds and str(out) not in tracker.stats
    with tracker.tracking():
        _as_cell("here = os.path.exists(out)", os=os, out=str(out))
    assert tracker.kinds[str(out)] == "file"


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
