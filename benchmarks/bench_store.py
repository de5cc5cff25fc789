"""Throughput of the object store against the machine's raw speeds.

Run ``python -m benchmarks.bench_store [--json OUT] [--size-mb N] [--dir D]``.
In one run it measures raw xxh3-128 hashing, raw write+fsync of one file and raw
read of it, then ``put_blob`` / ``get_blob`` of random float64 (incompressible,
stored raw) and of zeros (compressible and, chunk for chunk, identical), and a
re-put of identical data (which should only hash and check existence). Each
figure is the best of ``--repeat`` runs; reads come from the page cache, as they
do right after a kernel wrote them.

It also puts the random data with the chunks' fsyncs deferred and one barrier
(``syncfs``) after them, as task results are written, alternating with the
fsync-per-chunk put: whether checkpoints of large values would gain from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nbrewind.store import Store, digest_bytes
from nbrewind.store.fsio import deferred_sync

MB = 1024 * 1024


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _best(repeat: int, run: Callable[[], object]) -> float:
    """Best wall time of ``run()`` over ``repeat`` runs."""
    return min(_seconds(run) for _ in range(repeat))


def _raw_write(path: Path, data: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        while offset < len(data):
            offset += os.write(fd, data[offset:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_read(path: Path, size: int) -> bytearray:
    out = bytearray(size)
    with open(path, "rb", buffering=0) as handle:
        handle.readinto(out)
    return out


def run(size_mb: int = 200, repeat: int = 3, directory: str | None = None) -> dict[str, Any]:
    """Measure everything once and return ``{"params", "raw", "store"}`` in MB/s."""
    workdir = Path(tempfile.mkdtemp(prefix="nbrewind-bench-", dir=directory))
    try:
        size = size_mb * MB
        noise = np.random.default_rng(0).random(size // 8)
        zeros = np.zeros(size // 8)
        view = noise.data.cast("B")
        raw_file = workdir / "raw.bin"

        raw: dict[str, float] = {
            "xxh3": size_mb / _best(repeat + 1, lambda: digest_bytes(view)),
            "write_fsync": size_mb / _best(repeat, lambda: _raw_write(raw_file, view)),
            "read": size_mb / _best(repeat, lambda: _raw_read(raw_file, size)),
        }

        results: dict[str, float] = {}
        per_chunk, deferred = [], []
        for attempt in range(repeat):  # alternating, so both see the same drift
            for label, times in (("fsync", per_chunk), ("deferred", deferred))[:: 1 if attempt % 2 == 0 else -1]:
                os.sync()  # start each from a clean page cache of dirty data
                with Store.open(workdir / f"{label}-put-{attempt}") as fresh:
                    if label == "fsync":
                        times.append(_seconds(lambda: fresh.objects.put_blob(noise)))
                    else:

                        def put_deferred() -> None:
                            with deferred_sync(fresh.objects.root):
                                fresh.objects.put_blob(noise)
                            fresh.objects.barrier()

                        times.append(_seconds(put_deferred))
        results["durable_put_fsync_per_chunk"] = size_mb / statistics.median(per_chunk)
        results["durable_put_deferred_one_barrier"] = size_mb / statistics.median(deferred)
        for label, array in (("random_f64", noise), ("zeros", zeros)):
            put_times, paired = [], []
            for attempt in range(repeat):  # each put into a new, empty store
                # The disk is shared and its speed drifts: time a raw write right
                # before each put and keep the ratio of the pair as well.
                raw_time = _seconds(lambda: _raw_write(raw_file, view))
                raw_file.unlink()
                with Store.open(workdir / f"{label}-{attempt}") as fresh:
                    put_times.append(_seconds(lambda: fresh.objects.put_blob(array)))
                paired.append(raw_time / put_times[-1])
            results[f"put_blob_{label}"] = size_mb / min(put_times)
            results[f"put_blob_{label}_vs_paired_raw"] = statistics.median(paired)
            with Store.open(workdir / f"{label}-0") as store:
                digest = store.objects.put_blob(array)
                results[f"reput_{label}"] = size_mb / _best(repeat + 1, lambda: store.objects.put_blob(array))
                if store.objects.get_blob(digest) != array.data.cast("B"):
                    raise AssertionError(f"get_blob returned different bytes for {label}")
                results[f"get_blob_{label}"] = size_mb / _best(repeat, lambda: store.objects.get_blob(digest))
                stored = sum(store.objects.stored_size(d) for d in store.objects.iter_digests())
                results[f"stored_mb_{label}"] = stored / MB
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "params": {
            "size_mb": size_mb,
            "repeat": repeat,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "raw": raw,
        "store": results,
    }


def _table(result: dict[str, Any]) -> str:
    raw, store = result["raw"], result["store"]
    rows: list[tuple[str, float, tuple[float, str] | None]] = [
        ("raw xxh3-128", raw["xxh3"], None),
        ("raw write+fsync", raw["write_fsync"], None),
        ("raw read (page cache)", raw["read"], None),
    ]
    reference = {"put_blob": "write_fsync", "get_blob": "read", "reput": "xxh3"}
    for label in ("random_f64", "zeros"):
        for op in ("put_blob", "get_blob", "reput"):
            speed = store[f"{op}_{label}"]
            rows.append((f"{op} {label}", speed, (speed / raw[reference[op]], reference[op])))
    lines = [f"{'measure':<24}{'MB/s':>10}  ratio vs raw", "-" * 52]
    for name, speed, ratio in rows:
        note = f"{ratio[0]:.2f}x {ratio[1]}" if ratio else ""
        lines.append(f"{name:<24}{speed:>10.0f}  {note}")
    for label in ("random_f64", "zeros"):
        lines.append(
            f"put_blob {label} vs a raw write timed just before it (median): "
            f"{store[f'put_blob_{label}_vs_paired_raw']:.2f}x"
        )
    lines.append(
        f"durable put random_f64, median: fsync per chunk {store['durable_put_fsync_per_chunk']:.0f} MB/s, "
        f"deferred + one barrier {store['durable_put_deferred_one_barrier']:.0f} MB/s"
    )
    size = result["params"]["size_mb"]
    for label in ("random_f64", "zeros"):
        lines.append(f"stored for {size} MB {label}: {store[f'stored_mb_{label}']:.1f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: run, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="where to create the scratch stores (default: the temp folder)")
    args = parser.parse_args(argv)
    result = run(size_mb=args.size_mb, repeat=args.repeat, directory=args.dir)
    print(_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
