"""The audit overhead of another checkout and of this one, side by side, per cell, in one run.

Run: `python -m benchmarks.compare_trees TREE [--notebooks ctrend rag dconv] [--rounds 3]`,
TREE being another checkout of NBRewind (for example `git worktree add /tmp/before <commit>`).
Each round runs every domain notebook (`notebooks/`, scale 1) three times, alternating: on a
plain python3 kernel, on the audit kernel importing nbrewind from TREE (`PYTHONPATH`), and on
this checkout's audit kernel, each in a new folder with its own store. Per-cell times are
nbclient's execute_input -> execute_reply spans (kernel start excluded); medians over rounds are
printed, with each run's total, because on a shared machine the totals of one notebook move by
more than most changes do: read the side-by-side difference, not one number.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.run import NOTEBOOK_DIR, ROOT, run, write_variant

KINDS = ("python3", "before", "after")


def one_run(name: str, kind: str, tree: Path) -> list[float]:
    """Per-cell seconds of one run of notebook `name` as `kind`."""
    saved = os.environ.get("PYTHONPATH")
    if kind == "before":
        os.environ["PYTHONPATH"] = str(tree)
    elif kind == "after":
        # This checkout, not whichever one an editable install of nbrewind points at.
        os.environ["PYTHONPATH"] = str(ROOT)
    else:
        os.environ.pop("PYTHONPATH", None)
    work = Path(tempfile.mkdtemp(prefix=f"compare-{name}-"))
    try:
        nb = work / f"{name}.ipynb"
        write_variant(NOTEBOOK_DIR / f"{name}.ipynb", nb, 1.0)
        kernel = "python3" if kind == "python3" else "audit"
        store = None if kernel == "python3" else work / f"{name}.ipynb.nbrewind"
        cells: list[float] = run(nb, kernel, work, store)["cells"]
        return cells
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def report(name: str, runs: dict[str, list[list[float]]]) -> str:
    """The per-cell medians of each kind and the overhead of both checkouts."""
    lines = [f"{name}: cell  python3   before    after  before-p3  after-p3"]
    totals = dict.fromkeys(KINDS, 0.0)
    for i in range(len(runs["python3"][0])):
        medians = [statistics.median(cells[i] for cells in runs[kind]) for kind in KINDS]
        for kind, value in zip(KINDS, medians):
            totals[kind] += value
        p3, before, after = medians
        lines.append(f"{i + 1:4d} {p3:9.3f} {before:8.3f} {after:8.3f} {before - p3:+10.3f} {after - p3:+9.3f}")
    base = totals["python3"]
    lines.append(
        f"sum  {base:9.3f} {totals['before']:8.3f} {totals['after']:8.3f}   "
        f"audit overhead: before {100 * (totals['before'] / base - 1):+.1f} %, after {100 * (totals['after'] / base - 1):+.1f} %"
    )
    lines += [f"  {kind} run totals: {[round(sum(cells), 3) for cells in runs[kind]]}" for kind in KINDS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", type=Path, help="another checkout of NBRewind, measured as 'before'")
    parser.add_argument("--notebooks", nargs="+", default=["ctrend", "rag", "dconv"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not (args.tree / "nbrewind" / "__init__.py").is_file():
        parser.error(f"{args.tree} is not a checkout of NBRewind (no nbrewind/__init__.py there)")
    for name in args.notebooks:
        runs: dict[str, list[list[float]]] = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                runs[kind].append(one_run(name, kind, args.tree.resolve()))
        print(report(name, runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
