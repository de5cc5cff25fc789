"""How to stage a checkpoint so the next cell may edit its arrays in place: four ways, side by side.

Run ``python -m benchmarks.bench_staging [--sizes 32,128,384] [--small 500] [--repeats 5] [--json OUT]``.

A checkpoint must keep the bytes it recorded until they are on disk, while the
user's next cell already runs (and may run ``a[::2] += 1``). Each trial stages one
freshly made float64 array of the given size (every chunk new to the store) as the
kernel does before its reply, then, as the next cell, edits every page of it in
place while the write goes on, then waits until the blob is durable and re-reads
every chunk (verified against the digest recorded before the edit). Contenders,
all through ``ObjectStore``:

- ``view``: ``stage_blob`` alone, views of the live buffer copied and re-checked by
  the writer (the code before issue 13): cheapest before the reply, but the edit
  makes the writer refuse the chunks and the checkpoint is lost;
- ``copy``: ``stage_blob`` + ``protect`` copying each new chunk before the reply;
- ``snapshot``: ``stage_blob`` + ``protect`` forking a child that writes from a
  copy-on-write snapshot; the next cell's edit pays the page copies instead;
- ``sync``: hash and write (fsync) everything before the reply (``put_blob``).

``--small N`` adds a case of N separate 32 KiB values (many small blobs), where
writing synchronously costs one fsync per value.

Every trial runs in a fresh interpreter, since a kernel's copies land in fresh memory
(page faults included), and the contenders alternate within each repeat, so they
share the machine's load. Medians over repeats are reported: the time before the
reply, the next cell's edit, the time until durable, and whether the checkpoint
survived.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from nbrewind.errors import StoreError
from nbrewind.store.digest import digest_bytes
from nbrewind.store.objects import BLOB_CHUNK_SIZE, ObjectStore, StagedBlob

STRATEGIES = ("view", "copy", "snapshot", "sync")
SMALL_VALUE = 32 * 1024


def _chunks(buf: np.ndarray) -> list[memoryview]:
    view = memoryview(buf).cast("B")
    return [view[i : i + BLOB_CHUNK_SIZE] for i in range(0, len(view), BLOB_CHUNK_SIZE)]


def _edit(values: list[np.ndarray]) -> float:
    """The next cell: an in-place edit that touches every page."""
    started = time.perf_counter()
    for value in values:
        value[::2] += 1.0
    return time.perf_counter() - started


def trial(strategy: str, values: list[np.ndarray], root: Path) -> dict[str, Any]:
    """One staging of `values` by `strategy`, the next cell's edit, and the wait until durable."""
    objects = ObjectStore(root)
    objects.snapshot_min_bytes = 0 if strategy == "snapshot" else 1 << 62
    expected = {digest_bytes(p) for v in values for p in _chunks(v)}  # the content that must come back
    result: dict[str, Any] = {"strategy": strategy, "mb": sum(v.nbytes for v in values) / 1e6, "values": len(values)}
    failure: list[str] = []
    staged: list[StagedBlob] = []
    started = time.perf_counter()
    if strategy == "sync":
        for value in values:
            objects.put_blob(value)
    else:
        staged = [objects.stage_blob(v) for v in values]
        if strategy != "view":
            result["protected_by"] = objects.protect(staged)
    result["before_reply_s"] = time.perf_counter() - started

    def background() -> None:
        try:
            for blob in staged:
                objects.commit(blob)
        except StoreError as exc:
            failure.append(str(exc))

    writer = threading.Thread(target=background)
    writer.start()
    result["next_cell_edit_s"] = _edit(values)
    writer.join()
    result["durable_s"] = time.perf_counter() - started
    kept = not failure
    try:
        for digest in expected:
            objects.verify(digest)  # re-read and re-hashed: the bytes from before the edit
    except StoreError:
        kept = False
    result["checkpoint_kept"] = kept
    return result


def _make(case: str) -> list[np.ndarray]:
    rng = np.random.default_rng(time.time_ns() % 2**32)  # every trial's data is new to the store
    if case.startswith("small"):
        return [rng.random(SMALL_VALUE // 8) for _ in range(int(case[5:]))]
    return [rng.random(int(float(case) * 1e6) // 8)]


def _run_trial(strategy: str, case: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_staging", "--trial", strategy, case],
        check=True,
        capture_output=True,
        text=True,
    )
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (case, strategy)."""
    table = []
    for case in dict.fromkeys(r["case"] for r in rows):
        for strategy in STRATEGIES:
            mine = [r for r in rows if r["case"] == case and r["strategy"] == strategy]
            if not mine:
                continue
            entry: dict[str, Any] = {"case": case, "strategy": strategy, "repeats": len(mine), "mb": mine[0]["mb"]}
            for key in ("before_reply_s", "next_cell_edit_s", "durable_s"):
                entry[key] = statistics.median(r[key] for r in mine)
            entry["kept"] = f"{sum(r['checkpoint_kept'] for r in mine)}/{len(mine)}"
            table.append(entry)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="32,128,384", help="array sizes in MB, comma-separated")
    parser.add_argument("--small", type=int, default=500, help="also N values of 32 KiB (0: skip)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--trial", nargs=2, metavar=("STRATEGY", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trial:
        strategy, case = args.trial
        values = _make(case)
        with tempfile.TemporaryDirectory(prefix="bench-staging-") as folder:
            row = trial(strategy, values, Path(folder) / "store")
        print(json.dumps({**row, "case": case}))
        return 0
    cases = [c for c in args.sizes.split(",") if c] + ([f"small{args.small}"] if args.small else [])
    strategies = [s for s in args.strategies.split(",") if s]
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for case in cases:
            order = strategies[repeat % len(strategies) :] + strategies[: repeat % len(strategies)]
            for strategy in order:
                rows.append(_run_trial(strategy, case))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = summarize(rows)
    print(f"{'case':>10} {'strategy':>9} {'before reply ms':>16} {'next cell ms':>13} {'durable ms':>11} {'kept':>6}")
    for e in table:
        print(
            f"{e['case']:>10} {e['strategy']:>9} {e['before_reply_s'] * 1e3:16.1f} {e['next_cell_edit_s'] * 1e3:13.1f}"
            f" {e['durable_s'] * 1e3:11.0f} {e['kept']:>6}"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "medians": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
