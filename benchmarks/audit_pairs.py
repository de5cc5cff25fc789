"""Audit overhead on the domain notebooks, from many alternating python3/audit pairs.

Run: `python -m benchmarks.audit_pairs [--pairs N] [--only NAME] [--json OUT]`.

`python -m benchmarks.run` times one python3 run and one audit run per round, and on this
2-core machine one pair says little: the same code measured +6.7 % and +25.2 % on one
notebook minutes apart. Here each notebook runs N pairs of python3 and audit (which goes
first alternates), each in a new folder (the audit into a new store, so every pair pays the
whole audit), and the overhead is the median of the pairs' ratios of summed cell time
(kernel start excluded), with the spread beside it. Per cell, the median extra seconds say
where the overhead lives. Every audit's outputs are compared with its python3 partner's, as
the main harness does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.run import NOTEBOOK_DIR, compare_outputs, run, write_variant
from benchmarks.scenarios import NOTEBOOKS, spec


def pairs(name: str, count: int, work: Path) -> dict[str, Any]:
    """`count` python3/audit pairs of notebook `name` at full scale, in `work`."""
    item = spec(name)
    source = NOTEBOOK_DIR / f"{name}.ipynb"
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for number in range(count):
        done: dict[str, dict[str, Any]] = {}
        order = ("python3", "audit") if number % 2 == 0 else ("audit", "python3")  # neither always finds a warmer machine
        for kernel in order:
            folder = work / f"{kernel}-{number}"
            folder.mkdir()
            nb = folder / f"{name}.ipynb"
            write_variant(source, nb, item.full_scale)
            done[kernel] = run(nb, kernel, work, nb.with_name(f"{nb.name}.nbrewind") if kernel == "audit" else None)
        fresh, audit = done["python3"], done["audit"]
        failures += [f"{name} pair {number}: {p}" for p in compare_outputs(Path(fresh["output"]), Path(audit["output"]))]
        rows.append({"python3": fresh["cells"], "audit": audit["cells"]})
        for kernel in order:
            shutil.rmtree(work / f"{kernel}-{number}")
    ratios = [100 * (sum(r["audit"]) / sum(r["python3"]) - 1) for r in rows]
    extra = [statistics.median(r["audit"][i] - r["python3"][i] for r in rows) for i in range(len(rows[0]["python3"]))]
    return {
        "pairs": rows,
        "overhead_pct": statistics.median(ratios),
        "overhead_pct_each": ratios,
        "python3_s": statistics.median(sum(r["python3"]) for r in rows),
        "cell_extra_s": extra,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the pairs; 0 when every audit's outputs matched python3's."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.audit_pairs", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="python3/audit pairs per notebook (default 5)")
    parser.add_argument("--only", action="append", help="this notebook only (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    names = args.only or [item.name for item in NOTEBOOKS]
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"nbrewind-pairs-{name}-") as tmp:
            results[name] = pairs(name, args.pairs, Path(tmp))
        r = results[name]
        print(
            f"{name:>10}: python3 {r['python3_s']:.2f} s, audit {r['overhead_pct']:+.1f} % median of {args.pairs} "
            f"({min(r['overhead_pct_each']):+.1f} to {max(r['overhead_pct_each']):+.1f} %), "
            f"cell extra s {[round(x, 2) for x in r['cell_extra_s']]}",
            flush=True,
        )
    medians = [r["overhead_pct"] for r in results.values()]
    print(f"median over notebooks {statistics.median(medians):+.1f} %, max {max(medians):+.1f} % (goals 5 % and 10 %)")
    failures = [f for r in results.values() for f in r["failures"]]
    for problem in failures:
        print(f"FAIL {problem}")
    if args.json is not None:
        args.json.write_text(json.dumps({"command": "python -m benchmarks.audit_pairs", "pairs": args.pairs, "seconds": time.perf_counter() - started, "results": results}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
