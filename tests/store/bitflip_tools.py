"""Bit flips in every kind of file of a real store, and what reading them gives.

A real audit kernel records a small notebook (numpy arrays large enough to be
chunked, printed outputs, a ``threading.Lock`` that is rebuilt on repeat, Dask
tasks whose results are cached under refs). Every file of its store is then
damaged one bit at a time, at every bit of its header and at sampled bytes of
its body, and read back the way NBRewind reads it. Each flip ends as

- ``detected``: the read raised the store's typed error (a ``StoreError``), or,
  for the catalog, the store's signature no longer matches (the kernel then
  runs every cell and says why);
- ``intact``: the read gave back exactly what was stored (the flip hit a bit
  that carries nothing, e.g. the kind byte of a tree, which is judged by its
  content);
- ``missed``: a different value, or an exception that is not the store's.

Run ``python -m tests.store.bitflip_tools`` for the figures in docs/reliability.md.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from nbrewind.errors import StoreError
from nbrewind.store import Store, records
from nbrewind.store.walk import walk
from nbrewind.store.frame import HEADER_SIZE, KIND_TREE
from nbrewind.store.objects import TREE_MAGIC
from nbrewind.store.store import CATALOG_NAME, MARKER_NAME

CELLS = [
    "import threading\nimport numpy as np\nimport dask",
    "a = (np.arange(700_000, dtype=np.float64) % 977) * 0.5\n"
    "b = np.random.default_rng(1).random(300_000)\n"
    "small = {'k': [1, 2, 3], 's': 'text ' * 40}\n"
    "print('made', a.size, b.size)",
    "lock = threading.Lock()\ntotal = float(a.sum()) + float(b.sum())",
    "x = dask.delayed(sum)([1, 2, 3]).compute(scheduler='threads')\n"
    "y = dask.delayed(lambda v: v * 2)(x).compute(scheduler='threads')\nx, y",
    "with lock:\n    print(round(total, 6), small['k'], x, y, float(a[::1000].sum()))",
]
"""The audited notebook."""

REPEAT_CELLS = [
    *CELLS[:3],
    CELLS[3].replace("\nx, y", "\nx, y, 'again'"),
    CELLS[4].replace("float(a[::1000].sum()))", "float(a[::1000].sum()), float(b[:10].sum()), 'again')"),
]
"""The notebook the repeat runs: the last two cells changed, so they run and need
the lock rebuilt, the arrays loaded and the tasks' cached results."""

KINDS = (
    "leaf object",
    "tree",
    "blob chunk",
    "chunk list",
    "outputs",
    "rebuild record",
    "ref",
    "catalog",
    "marker",
)


@dataclass(frozen=True)
class StoreFile:
    """One file of the store and what it is."""

    kind: str
    path: Path
    digest: str | None = None
    ref: tuple[str, str] | None = None


@dataclass
class Tally:
    """What the flips in one kind of file gave."""

    files: int = 0
    flips: int = 0
    detected: int = 0
    intact: int = 0
    missed: list[str] = field(default_factory=list)
    rewritten: int = 0
    """Object flips after which a put (put_tree for a tree) of the same bytes replaces the file:
    what the write path's cheap check notices."""

    def add(self, outcome: str, where: str) -> None:
        self.flips += 1
        if outcome == "detected":
            self.detected += 1
        elif outcome == "intact":
            self.intact += 1
        else:
            self.missed.append(f"{where}: {outcome}")


def write_notebook(path: Path, cells: list[str]) -> Path:
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(path))
    return path


def audit(folder: Path) -> tuple[Path, Path]:
    """Record CELLS on a real audit kernel; returns (notebook, store)."""
    from nbrewind.run import run_notebook

    folder.mkdir(parents=True, exist_ok=True)
    nb = write_notebook(folder / "flips.ipynb", CELLS)
    store = folder / "flips.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store)
    return nb, store


def classify(root: Path) -> list[StoreFile]:
    """Every file of the store at ``root`` with its kind."""
    files: list[StoreFile] = [StoreFile("marker", root / MARKER_NAME), StoreFile("catalog", root / CATALOG_NAME)]
    with Store.open(root, create=False, readonly=True) as store:
        objects = store.objects
        roots = records(store.catalog, objects)
        graph = walk(objects, (r.digest for r in roots), verify=True)
        assert not graph.problems, graph.problems
        role: dict[str, str] = {}
        for record in roots:
            if record.kind == "outputs":
                role[record.digest] = "outputs"
            elif record.kind == "rebuild":
                role[record.digest] = "rebuild record"
        for digest, kids in graph.children.items():
            if digest in role:
                continue
            if digest in graph.payload_sizes:
                payload = objects.get_tree(digest, move_corrupt=False)[1]
                is_list = payload.startswith(b"{") and b'"blob"' in payload and b'"chunk_size"' in payload
                role[digest] = "chunk list" if is_list else "tree"
                for kid in kids:
                    if is_list:
                        role[kid] = "blob chunk"
        for digest in objects.iter_digests():
            files.append(StoreFile(role.get(digest, "leaf object"), objects.path_of(digest), digest=digest))
        for namespace in objects.ref_namespaces():
            base = objects.refs_dir / namespace
            for path in sorted(p for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")):
                files.append(StoreFile("ref", path, ref=(namespace, path.name)))
    return files


def flips(size: int, header: int, samples: int, rng: random.Random) -> Iterator[tuple[int, int]]:
    """(byte offset, bit) pairs: every bit of the first ``header`` bytes, then one
    random bit at each of ``samples`` random body offsets."""
    for offset in range(min(header, size)):
        for bit in range(8):
            yield offset, bit
    body = range(min(header, size), size)
    for offset in sorted(rng.sample(body, min(samples, len(body)))):
        yield offset, rng.randrange(8)


def flipped(path: Path, offset: int, bit: int) -> Callable[[], None]:
    """Flip one bit of ``path`` in place; returns the function that puts it back."""
    path.chmod(0o644)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        old = handle.read(1)
        handle.seek(offset)
        handle.write(bytes((old[0] ^ (1 << bit),)))

    def restore() -> None:
        with open(path, "r+b") as handle:
            handle.seek(offset)
            handle.write(old)

    return restore


def catalog_snapshot(root: Path, *, readonly: bool = True) -> Any:
    """Everything the kernels read from the catalog, as plain values: every table
    scanned in order, and what the lookups that go through an index answer."""
    with Store.open(root, create=False, readonly=readonly) as store:
        catalog = store.catalog
        runs = catalog.cell_runs()
        entries = {r.id: catalog.checkpoint_entries(r.checkpoint_id) for r in runs if r.checkpoint_id is not None}
        by_code = {r.code_digest: [x.id for x in catalog.find_cell_runs(r.code_digest)] for r in runs if r.code_digest}
        return runs, entries, catalog.task_log(), by_code


def _trusted(root: Path) -> bool:
    from nbrewind.store.origin import is_trusted

    return is_trusted(root)


def _read_object(root: Path, item: StoreFile, original: bytes) -> str:
    with Store.open(root, create=False, readonly=True) as store:
        try:
            got = store.objects.get(item.digest or "", move_corrupt=False)
        except StoreError:
            return "detected"
        except Exception as exc:  # the suite's point: any other exception is a miss
            return f"untyped {type(exc).__name__}: {exc}"
    return "intact" if got == original else "wrong value"


def _read_ref(root: Path, item: StoreFile, original: str) -> str:
    assert item.ref is not None
    with Store.open(root, create=False, readonly=True) as store:
        objects = store.objects
        try:
            got = objects.ref_get(*item.ref)
        except StoreError:
            return "detected"
        except Exception as exc:
            return f"untyped {type(exc).__name__}: {exc}"
        if got == original:
            return "intact"
        if got is None or not objects.has(got):
            return "detected"  # a miss: the task is recomputed
        return f"wrong value: points at {got}, which exists"


def _open_marker(root: Path, baseline: Any) -> str:
    try:
        with Store.open(root, create=False, readonly=True) as store:
            store.catalog.cell_runs()
    except StoreError:
        return "detected"
    except Exception as exc:
        return f"untyped {type(exc).__name__}: {exc}"
    return "intact"


def _read_catalog(root: Path, baseline: Any) -> str:
    """Open a copy of the damaged catalog both ways a kernel or the CLI does and
    read everything; the store itself is left alone."""
    scratch = root.parent / f"{root.name}-catalog-flip"
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir()
    try:
        shutil.copy2(root / MARKER_NAME, scratch / MARKER_NAME)
        shutil.copy2(root / CATALOG_NAME, scratch / CATALOG_NAME)
        (scratch / "objects").mkdir()
        outcomes = []
        for readonly in (True, False):
            try:
                now = catalog_snapshot(scratch, readonly=readonly)
            except StoreError:
                outcomes.append("detected")
                continue
            except Exception as exc:
                return f"untyped {type(exc).__name__}: {exc}"
            if now == baseline:
                outcomes.append("intact")
            elif now[:3] == baseline[:3] and all(set(ids) <= set(baseline[3].get(d, ())) for d, ids in now[3].items()):
                outcomes.append("detected")  # a damaged index hides runs: those cells run instead of replaying
            else:
                outcomes.append("detected" if not _trusted(scratch) else "changed rows, still trusted")
        bad = [o for o in outcomes if o not in ("detected", "intact")]
        if bad:
            return bad[0]
        return "detected" if "detected" in outcomes else "intact"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_suite(root: Path, *, object_samples: int = 16, catalog_samples: int = 400, seed: int = 13) -> dict[str, Tally]:
    """Flip bits in every file of the store at ``root`` (restoring each after its
    read) and tally the outcomes per kind of file."""
    rng = random.Random(seed)
    tallies = {kind: Tally() for kind in KINDS}
    with sqlite3.connect(root / CATALOG_NAME) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # one file holds the whole catalog
    conn.close()
    baseline = catalog_snapshot(root)
    for item in classify(root):
        tally = tallies[item.kind]
        tally.files += 1
        data = item.path.read_bytes()
        if item.kind == "catalog":
            positions = flips(len(data), 100, catalog_samples, rng)  # SQLite's header is 100 bytes

            def check() -> str:
                return _read_catalog(root, baseline)
        elif item.kind == "marker":
            positions = flips(len(data), len(data), 0, rng)

            def check() -> str:
                return _open_marker(root, baseline)
        elif item.kind == "ref":
            positions = flips(len(data), len(data), 0, rng)
            with Store.open(root, create=False, readonly=True) as store:
                target = store.objects.ref_get(*item.ref)  # type: ignore[misc]
            assert target is not None

            def check() -> str:
                return _read_ref(root, item, target)
        else:
            with Store.open(root, create=False, readonly=True) as store:
                content = store.objects.get(item.digest or "", move_corrupt=False)
            positions = flips(len(data), HEADER_SIZE, object_samples, rng)

            def check() -> str:
                return _read_object(root, item, content)

        for offset, bit in positions:
            restore = flipped(item.path, offset, bit)
            try:
                outcome = check()
                tally.add(outcome, f"{item.path.relative_to(root)} byte {offset} bit {bit}")
                if item.digest is not None:
                    with Store.open(root, create=False) as store:
                        # What put (a leaf) or put_tree (a tree) of the same bytes decides:
                        # keep the file, or replace it as damaged.
                        kind = store.objects._present_kind(item.path, len(content))
                        if kind is None or (content.startswith(TREE_MAGIC) and kind != KIND_TREE):
                            tally.rewritten += 1
            finally:
                restore()
        if item.digest is not None:
            item.path.chmod(0o444)
    assert catalog_snapshot(root) == baseline
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| kind of file | files | bits flipped | detected | read back intact | missed | put rewrites |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    total = Tally()
    for kind, t in tallies.items():
        rewrites = f"{t.rewritten}" if kind not in ("ref", "catalog", "marker") else "-"
        lines.append(f"| {kind} | {t.files} | {t.flips} | {t.detected} | {t.intact} | {len(t.missed)} | {rewrites} |")
        total.files += t.files
        total.flips += t.flips
        total.detected += t.detected
        total.intact += t.intact
        total.missed += t.missed
        total.rewritten += t.rewritten
    lines.append(
        f"| **all** | {total.files} | {total.flips} | {total.detected} | {total.intact} | {len(total.missed)} | {total.rewritten} |"
    )
    return "\n".join(lines)


def copy_store(source: Path, target: Path) -> Path:
    """A copy of a store (a signature covers content, not place: the copy is trusted too)."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    return target


def main() -> None:
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nbrewind-flips-") as scratch:
        os.environ.setdefault("NBREWIND_TRUST_DB", str(Path(scratch) / "trust.db"))
        _, store = audit(Path(scratch) / "nb")
        tallies = run_suite(store)
        print(table(tallies))
        for kind, t in tallies.items():
            for miss in t.missed[:20]:
                print(f"missed in {kind}: {miss}")


if __name__ == "__main__":
    main()

