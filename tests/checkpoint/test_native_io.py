"""pyarrow's C++ file I/O is reported to the file tracker as the interpreter's own opens,
and every wrapped entry point is put back when the context exits. Real pyarrow, real
files, the real audit hook."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from nbrewind.checkpoint.hidden import FileTracker
from nbrewind.checkpoint.native_io import reporting_native_io


def tracked(work: Path, action: object) -> FileTracker:
    tracker = FileTracker()
    with reporting_native_io(), tracker.tracking():
        action()  # type: ignore[operator]
    return tracker


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_parquet_through_pandas_and_pyarrow_is_read_and_written(work: Path) -> None:
    frame = pd.DataFrame({"v": [1, 2]})
    wrote = tracked(work, lambda: frame.to_parquet("a.parquet"))
    assert str(work / "a.parquet") in wrote.writes and not wrote.reads
    wrote = tracked(work, lambda: pq.write_table(pa.table({"v": [3]}), work / "b.parquet"))
    assert str(work / "b.parquet") in wrote.writes
    read = tracked(work, lambda: (pd.read_parquet("a.parquet"), pq.read_table("b.parquet"), pq.ParquetFile("a.parquet")))
    assert read.reads == {str(work / "a.parquet"), str(work / "b.parquet")} and not read.writes
    assert read.read_digests[str(work / "a.parquet")] is not None  # the content the cell found


def test_a_dataset_folder_reads_every_file_and_writes_the_new_ones(work: Path) -> None:
    table = pa.table({"k": [1, 2], "v": [3, 4]})
    wrote = tracked(work, lambda: pq.write_to_dataset(table, "ds", partition_cols=["k"], basename_template="p-{i}.parquet"))
    files = {str(p) for p in (work / "ds").rglob("*.parquet")}
    assert len(files) == 2 and files <= wrote.writes
    read = tracked(work, lambda: (pq.read_table("ds"), ds.dataset("ds", format="parquet").to_table()))
    assert files <= read.reads and not read.writes
    again = tracked(work, lambda: pq.write_to_dataset(table, "ds", partition_cols=["k"], basename_template="q-{i}.parquet"))
    assert files.isdisjoint(again.writes) and len(again.writes) == 2  # only what this write made


def test_pyarrow_csv_and_os_files(work: Path) -> None:
    wrote = tracked(work, lambda: pacsv.write_csv(pa.table({"v": [1]}), "t.csv"))
    assert str(work / "t.csv") in wrote.writes
    read = tracked(work, lambda: (pacsv.read_csv("t.csv"), pa.OSFile("t.csv").read(), pa.memory_map("t.csv").read()))
    assert read.reads == {str(work / "t.csv")}
    handle = tracked(work, lambda: pa.OSFile("u.bin", "w").close())
    assert str(work / "u.bin") in handle.writes


def test_other_filesystems_and_file_objects_are_left_alone(work: Path) -> None:
    pq.write_table(pa.table({"v": [1]}), "a.parquet")
    with open("a.parquet", "rb") as opened:
        data = opened.read()
    tracker = FileTracker()
    with reporting_native_io():
        with tracker.tracking():
            pq.read_table(pa.BufferReader(data))
            with pytest.raises(Exception):
                pq.read_table("s3://no-such-bucket/a.parquet")  # not reported: another machine's file
    assert not tracker.reads and not tracker.writes


def test_every_entry_point_is_put_back(work: Path) -> None:
    before = (pq.read_table, pq.write_table, pq.ParquetFile.__init__, pacsv.read_csv, pa.OSFile, pa.memory_map, ds.dataset)
    with reporting_native_io():
        during = (pq.read_table, pq.write_table, pq.ParquetFile.__init__, pacsv.read_csv, pa.OSFile, pa.memory_map, ds.dataset)
        assert all(a is not b for a, b in zip(before, during))
        assert issubclass(pa.OSFile, before[4]) and isinstance(pa.OSFile(os.devnull), before[4])
    after = (pq.read_table, pq.write_table, pq.ParquetFile.__init__, pacsv.read_csv, pa.OSFile, pa.memory_map, ds.dataset)
    assert all(a is b for a, b in zip(before, after))
