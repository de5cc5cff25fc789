"""What the write path's check of an existing object costs (docs/reliability.md).

A put that finds its object present used to refresh the file's mtime and trust it
(``os.utime``; ``put_tree`` also read the header to see it was a tree). It now
opens the file, checks the header against the file's length and the expected
size, re-hashes files of up to 64 KiB, and refreshes the mtime through the open
descriptor. Run ``python tests/store/put_check_cost.py`` on an idle machine.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nbrewind.store import Store
from nbrewind.store.objects import ObjectStore


def _old_put_check(objects: ObjectStore, path: Path, size: int) -> bool:
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    return True


def _old_tree_check(objects: ObjectStore, path: Path, size: int) -> bool:
    if not _old_put_check(objects, path, size):
        return False
    return objects.is_tree(path.parent.name + path.name)


def _new_check(objects: ObjectStore, path: Path, size: int) -> bool:
    return objects._touch_if_present(path, size)


def _per_call(check: Callable[[ObjectStore, Path, int], bool], objects: ObjectStore, items: list[tuple[Path, int]]) -> float:
    """Median over rounds of the mean seconds per call, over distinct files."""
    rounds = []
    for _ in range(7):
        started = time.perf_counter()
        for path, size in items:
            check(objects, path, size)
        rounds.append((time.perf_counter() - started) / len(items))
    return statistics.median(rounds)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nbrewind-putcost-") as scratch:
        with Store.open(Path(scratch) / "s") as store:
            objects = store.objects
            cases = {
                "tree, 300 B (a value group, a JSON record)": [
                    (objects.put_tree([], os.urandom(300)), 300 + 11) for _ in range(2000)
                ],
                "leaf, 4 KiB, compressible": [(objects.put((b"row %d " % i) * 600), 0) for i in range(2000)],
                "leaf, 60 KiB, random": [(objects.put(os.urandom(60_000)), 60_000) for _ in range(500)],
                "blob chunk, 2 MiB, random (stored raw)": [(objects.put(os.urandom(2 << 20)), 2 << 20) for _ in range(60)],
            }
            print("| object | before (utime; put_tree also read the header) | now | extra per put that finds its object |")
            print("|---|---:|---:|---:|")
            for label, made in cases.items():
                items = []
                for digest, size in made:
                    path = objects.path_of(digest)
                    items.append((path, size or len(objects.get(digest))))
                old = _old_tree_check if label.startswith("tree") else _old_put_check
                before = _per_call(old, objects, items)
                now = _per_call(_new_check, objects, items)
                print(f"| {label} | {before * 1e6:.1f} µs | {now * 1e6:.1f} µs | {(now - before) * 1e6:+.1f} µs |")


if __name__ == "__main__":
    main()
