"""A notebook where most cells use a LocalCluster client or its futures: python3 vs audit vs repeat.

Run: `python -m benchmarks.bench_futures [--runs N] [--json OUT]`.

The notebook (written here, 12 code cells) starts a 2-worker LocalCluster, maps and
submits tasks, gathers futures, persists a dask array and reduces it, iterates with
`as_completed`, and closes the client and the cluster. In each round, side by side: a
plain python3 kernel, the audit kernel, the repeat kernel on the unmodified notebook,
and the repeat kernel after editing the gather cell (which needs the futures, so the
cluster is started again and the cells that made them re-run). Per-cell times are
nbclient's execute_input -> execute_reply span, so kernel start-up is excluded.
Medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import nbformat

from nbrewind.run import run_notebook
from nbrewind.store import Store

CELLS = [
    "import time\nimport dask.array as da\nfrom distributed import Client, LocalCluster, as_completed, wait",
    "cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=':0')\nclient = Client(cluster)\n"
    "print(len(cluster.workers), 'workers')",
    "def work(i):\n    time.sleep(0.02)\n    return i * i",
    "futs = client.map(work, range(40))\nwait(futs)\nprint(len(futs), 'tasks done')",
    "total = sum(client.gather(futs))\nprint('total', total)",
    "big = client.submit(sum, futs)\nprint('sum via a task', big.result())",
    "x = client.persist(da.arange(4_000_000, chunks=250_000).reshape(2000, 2000))\nwait(x)\nprint(x.chunksize)",
    "col = x[:, 7].sum().compute()\nprint('column 7', int(col))",
    "stats = client.compute([x.mean(), x.std()], sync=True)\nprint([round(float(v), 3) for v in stats])",
    "seen = sorted(f.result() for f in as_completed(client.map(work, range(40, 60))))\nprint(seen[:3], len(seen))",
    "print('keys held', len(client.who_has(futs)))",
    "client.close()\ncluster.close()",
]
EDIT = 4  # the gather cell
EDITED = "total = sum(client.gather(futs)) + 1\nprint('total', total)"


def _notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def _decisions(store: Path) -> list[str]:
    """What the newest session did with each cell: replayed or executed."""
    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
        return [r.decision or "" for r in runs if r.session == runs[-1].session]


def one_round(work: Path) -> dict[str, Any]:
    nb = work / "futures.ipynb"
    store = work / "futures.ipynb.nbrewind"
    _notebook(nb, CELLS)
    out: dict[str, Any] = {}
    out["python3"] = run_notebook(nb, kernel="python3").cell_seconds
    out["audit"] = run_notebook(nb, kernel="audit", store=store).cell_seconds
    out["repeat"] = run_notebook(nb, kernel="repeat", store=store).cell_seconds
    out["repeat_decisions"] = _decisions(store)
    edited = list(CELLS)
    edited[EDIT] = EDITED
    _notebook(nb, edited)
    out["fresh_edited"] = run_notebook(nb, kernel="python3").cell_seconds
    out["repeat_edited"] = run_notebook(nb, kernel="repeat", store=store).cell_seconds
    out["edited_decisions"] = _decisions(store)
    return out


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def total(kind: str) -> float:
        return statistics.median(sum(r[kind]) for r in rounds)

    s = {kind: total(kind) for kind in ("python3", "audit", "repeat", "fresh_edited", "repeat_edited")}
    s["audit_overhead"] = s["audit"] / s["python3"] - 1
    s["unmodified_speedup"] = s["python3"] / s["repeat"]
    s["modified_speedup"] = s["fresh_edited"] / s["repeat_edited"]
    s["repeat_decisions"] = rounds[-1]["repeat_decisions"]
    s["edited_decisions"] = rounds[-1]["edited_decisions"]
    s["per_cell_ms"] = {
        kind: [round(statistics.median(r[kind][i] for r in rounds) * 1e3, 1) for i in range(len(CELLS))]
        for kind in ("python3", "audit", "repeat", "fresh_edited", "repeat_edited")
    }
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp)))
    s = summarize(rounds)
    print(f"cell time, median of {args.runs}: python3 {s['python3']:.3f} s, audit {s['audit']:.3f} s "
          f"({s['audit_overhead']:+.1%}), unmodified repeat {s['repeat']:.3f} s ({s['unmodified_speedup']:.1f}x), "
          f"edited: fresh {s['fresh_edited']:.3f} s vs repeat {s['repeat_edited']:.3f} s ({s['modified_speedup']:.2f}x)")
    print("unmodified repeat decisions:", s["repeat_decisions"])
    print("edited repeat decisions:    ", s["edited_decisions"])
    for kind, cells in s["per_cell_ms"].items():
        print(f"{kind:>14}: {cells}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": s}, indent=1))


if __name__ == "__main__":
    main()
