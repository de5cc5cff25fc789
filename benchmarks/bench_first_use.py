"""What a kernel pays the first time it touches a store or a cluster, side by side.

Run: `python -m benchmarks.bench_first_use [--rounds N] [--dirty-mb MB]`; to compare two
checkouts, alternate `PYTHONPATH=<tree>` runs of it (see docs/benchmarks.md).

1. **First barrier.** One process writes a task result the deferred way (no fsync) and
   runs the durability barrier, as an audit does; then ``--dirty-mb`` MB are written, not
   synced, elsewhere on the same filesystem (a notebook's data files, another program);
   then a new process, as the next kernel on the store, runs its first barrier. Printed:
   whether that barrier synced and how long it took.
2. **First compute.** A notebook starts a 2-worker LocalCluster, then computes 40 small
   `dask.delayed` tasks four times (new tasks each time), on python3 and on the audit
   kernel. Printed: the time each compute took inside its cell (`time.perf_counter`
   around `dask.compute`), so the first compute's one-time costs stand out against the
   later ones. Medians over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from nbrewind.run import run_notebook

_AUDIT = (
    "import sys; from pathlib import Path; from nbrewind.store import ObjectStore, fsio\n"
    "o = ObjectStore(Path(sys.argv[1]))\n"
    "with fsio.deferred_sync(o.root):\n    o.put(b'a task result')\n"
    "assert o.barrier()\n"
)
_NEXT = (
    "import sys, time; from pathlib import Path; from nbrewind.store import ObjectStore\n"
    "o = ObjectStore(Path(sys.argv[1]))\n"
    "t = time.perf_counter(); synced = o.barrier()\n"
    "print(int(synced), time.perf_counter() - t)\n"
)

_COMPUTE = (
    "import time\nt = time.perf_counter()\nr{n} = dask.compute(*[dask.delayed(np.arange)(i) for i in range({a}, {a} + 40)])\n"
    "print('inside', time.perf_counter() - t)"
)
CELLS = [
    "import dask\nimport numpy as np\nfrom distributed import Client, LocalCluster\n"
    "cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=':0')\nclient = Client(cluster)",
    *(_COMPUTE.format(n=n, a=1000 * (n + 1)) for n in range(4)),
    "client.close()\ncluster.close()",
]


def first_barrier(dirty_mb: int) -> tuple[bool, float]:
    """(synced, seconds) of a new process's first barrier on a store another process synced."""
    with tempfile.TemporaryDirectory(prefix="nbrewind-barrier-") as tmp:
        root = Path(tmp) / "store"
        subprocess.run([sys.executable, "-c", _AUDIT, str(root)], check=True)
        block = os.urandom(1 << 20)
        with open(Path(tmp) / "other-data", "wb") as handle:
            for _ in range(dirty_mb):
                handle.write(block)
        out = subprocess.run([sys.executable, "-c", _NEXT, str(root)], check=True, capture_output=True, text=True)
        synced, seconds = out.stdout.split()
        return synced == "1", float(seconds)


def first_computes(kernel: str) -> list[float]:
    """Seconds each of the notebook's four computes took inside its cell on ``kernel``."""
    with tempfile.TemporaryDirectory(prefix="nbrewind-first-") as tmp:
        folder = Path(tmp)
        nb = folder / "first.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS]), nb)
        store = folder / "first.ipynb.nbrewind" if kernel != "python3" else None
        run_notebook(nb, kernel=kernel, store=store, output=folder / "out.ipynb", timeout=600, quiet=True)
        done = nbformat.read(folder / "out.ipynb", as_version=4)
        return [
            float(o["text"].split()[1])
            for cell in done.cells
            for o in cell.get("outputs", [])
            if o.get("name") == "stdout" and o.get("text", "").startswith("inside")
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dirty-mb", type=int, default=200)
    args = parser.parse_args()

    barriers = [first_barrier(args.dirty_mb) for _ in range(args.rounds)]
    print(f"first barrier of a new process ({args.dirty_mb} MB dirty elsewhere):")
    for synced, seconds in barriers:
        print(f"  {'synced' if synced else 'skipped'} in {seconds * 1e3:.1f} ms")

    computes: dict[str, list[list[float]]] = {"python3": [], "audit": []}
    for _ in range(args.rounds):
        for kernel in computes:
            computes[kernel].append(first_computes(kernel))
    print("seconds inside each compute cell (median over rounds): first, second, third, fourth")
    for kernel, runs in computes.items():
        medians = [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]
        print(f"  {kernel:8s} " + "  ".join(f"{m:.3f}" for m in medians))


if __name__ == "__main__":
    main()
