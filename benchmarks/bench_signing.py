"""What signing stores costs: per cell commit, per opened store, per ref.

Run ``python -m benchmarks.bench_signing [--json OUT] [--commits N]``. In one run
it times the catalog transaction a kernel makes per cell (a cell run, its
checkpoint of E entries, its task-log rows, the update that links them) on a
signed catalog and on the same catalog with signing switched off, for several
sizes; the full check a kernel makes when it opens a store (every row hashed) for
catalogs of several sizes; and the MAC of one ref. The trust database and secret
live in a temporary folder. Times are CPU time of the measuring thread (user and
system), which other work on a shared machine disturbs far less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _unsigned(catalog: Any) -> None:
    """Switch a catalog's signing off, triggers included: the baseline."""
    catalog._signer = None
    conn = catalog._conn
    for (name,) in conn.execute("SELECT name FROM temp.sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER temp.{name}")


def _commit(catalog: Any, i: int, entries: int, tasks: int) -> None:
    from nbrewind.store import CellRun, TaskLogEntry

    digest = f"{i:032x}"
    with catalog.transaction():
        run = catalog.add_cell_run(CellRun(
            session="bench", kernel="audit", execution_count=i, code=f"x{i} = {i}", code_digest=digest,
            decision="executed", reason="new code", status="ok", reply={"status": "ok"}, outputs=digest,
            inputs={f"v{k}": digest for k in range(5)}, reads=["a", "b"], writes=[f"x{i}"], started=time.time(),
            duration=0.01, bytes_written=1000, task_hits=0, task_misses=tasks,
        ))
        checkpoint = catalog.add_checkpoint(run, None, {f"v{k}": (digest, {"kind": "value", "key": digest}) for k in range(entries)})
        catalog.set_cell_run_checkpoint(run, checkpoint)
        if tasks:
            catalog.log_tasks([TaskLogEntry(fingerprint=f"{i}-{k}", cell_run_id=run, result_digest=digest) for k in range(tasks)])


def per_commit(root: Path, commits: int, entries: int, tasks: int) -> dict[str, float]:
    from nbrewind.store import Store

    times: dict[str, list[float]] = {"signed": [], "unsigned": []}
    stores = {}
    for kind in times:
        stores[kind] = Store.open(root / f"{kind}-{entries}-{tasks}.nbrewind")
        if kind == "unsigned":
            _unsigned(stores[kind].catalog)
    for i in range(commits):  # alternate, so load on the machine hits both alike
        for kind, store in stores.items():
            start = time.thread_time()
            _commit(store.catalog, i, entries, tasks)
            times[kind].append(time.thread_time() - start)
    for store in stores.values():
        store.close()
    signed, unsigned = statistics.median(times["signed"]), statistics.median(times["unsigned"])
    return {
        "entries": entries, "tasks": tasks, "signed_ms": signed * 1e3, "unsigned_ms": unsigned * 1e3,
        "extra_ms": (signed - unsigned) * 1e3,
    }


def open_check(root: Path, rows: int) -> dict[str, float]:
    from nbrewind.store import Store, TaskLogEntry
    from nbrewind.store.origin import store_trust

    path = root / f"open-{rows}.nbrewind"
    with Store.open(path) as store:
        done = 0
        while done < rows:
            batch = min(10_000, rows - done)
            store.catalog.log_tasks([TaskLogEntry(fingerprint=f"t{done + k}", result_digest=f"{k:032x}") for k in range(batch)])
            done += batch
    start = time.thread_time()
    verdict = store_trust(path)
    seconds = time.thread_time() - start
    assert verdict.trusted
    return {"rows": rows, "seconds": seconds, "us_per_row": seconds / rows * 1e6}


def ref_mac_cost(n: int = 20_000) -> float:
    from nbrewind.store.signing import ref_mac, user_keys

    keys = user_keys()
    start = time.thread_time()
    for i in range(n):
        ref_mac(keys, "tasks", f"{i:032x}", f"{i:032x}")
    return (time.thread_time() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nbrewind-bench-signing-") as tmp:
        os.environ["NBREWIND_TRUST_DB"] = str(Path(tmp) / "trust" / "trust.db")
        root = Path(tmp)
        commits = [per_commit(root, args.commits, e, t) for e, t in ((10, 0), (100, 0), (1000, 0), (10, 100))]
        opens = [open_check(root, n) for n in (1_000, 10_000, 100_000)]
        ref_us = ref_mac_cost()
    print("per cell commit (median):")
    for c in commits:
        print(f"  {c['entries']:5d} entries, {c['tasks']:3d} task rows: signed {c['signed_ms']:.3f} ms, "
              f"unsigned {c['unsigned_ms']:.3f} ms, signing adds {c['extra_ms']:.3f} ms")
    print("opening a store (every row hashed once):")
    for o in opens:
        print(f"  {o['rows']:7,d} rows: {o['seconds'] * 1e3:.1f} ms ({o['us_per_row']:.2f} us per row)")
    print(f"ref MAC: {ref_us:.2f} us per ref")
    if args.json:
        Path(args.json).write_text(json.dumps({"commits": commits, "opens": opens, "ref_mac_us": ref_us}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
