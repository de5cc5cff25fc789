"""The domain notebooks' task graphs with and without the store on the workers.

Run: `python -m benchmarks.relay_domain [--only NAME] [--full]`.

Runs the domain-notebook benchmark (`benchmarks/run.py`, `--quick` unless `--full`)
twice: once as is (the workers write and read the store), once with `--relay` (every
worker sends its results to the kernel and asks it for hits, `NBREWIND_WORKER_STORE=relay`,
as on a cluster without a shared filesystem). Each run already checks every repeat's
outputs against a fresh python3 run; this compares the task hit and miss counts of the
audit, the unmodified repeat and every edit scenario, and checks that in the relay run
every stored result came through the kernel. Exit 1 on any difference or failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def counts(report: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(hits, misses) of every run in a `benchmarks.run` report, by "notebook / run"."""
    out: dict[str, tuple[int, int]] = {}
    for name, summary in report["summary"].items():
        out[f"{name} / audit"] = (summary["audit_tasks"]["hits"], summary["audit_tasks"]["misses"])
        out[f"{name} / unmodified"] = (summary["unmodified_tasks"]["hits"], summary["unmodified_tasks"]["misses"])
        for scenario, row in summary["scenarios"].items():
            out[f"{name} / {scenario}"] = (row["hits"], row["misses"])
    return out


def relayed(report: dict[str, Any]) -> dict[str, int]:
    """Results the kernel stored for workers, by "notebook / run"."""
    out: dict[str, int] = {}
    for name, summary in report["summary"].items():
        out[f"{name} / audit"] = summary["audit_tasks"]["relayed"]
        out[f"{name} / unmodified"] = summary["unmodified_tasks"]["relayed"]
        for scenario, row in summary["scenarios"].items():
            out[f"{name} / {scenario}"] = row["relayed"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relay_domain", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run only this notebook (repeatable)")
    parser.add_argument("--full", action="store_true", help="the benchmark's full scale (default: --quick)")
    args = parser.parse_args(argv)
    reports: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="nbrewind-relay-") as tmp:
        for mode in ("shared", "relay"):
            out = Path(tmp) / f"{mode}.json"
            command = [sys.executable, "-m", "benchmarks.run", "--json", str(out), "--plots", tmp, "--rounds", "1"]
            command += [] if args.full else ["--quick"]
            command += ["--relay"] if mode == "relay" else []
            for name in args.only:
                command += ["--only", name]
            print(f"$ {' '.join(command[1:])}", flush=True)
            subprocess.run(command, cwd=ROOT, check=False)
            reports[mode] = json.loads(out.read_text())
    shared, relay = counts(reports["shared"]), counts(reports["relay"])
    through = relayed(reports["relay"])
    problems = [f"{mode}: {failure}" for mode in reports for failure in reports[mode]["failures"]]
    print("\n| notebook / run | shared: hits / misses | relay: hits / misses | results stored through the kernel |")
    print("|---|---|---|---|")
    for key in sorted(set(shared) | set(relay)):
        a, b = shared.get(key), relay.get(key)
        print(f"| {key} | {a[0] if a else '-'} / {a[1] if a else '-'} | {b[0] if b else '-'} / {b[1] if b else '-'} | {through.get(key, '-')} |")
        if a != b:
            problems.append(f"{key}: shared {a} vs relay {b}")
    if not any(through.values()):
        problems.append("the relay run stored no result through the kernel: the mode was not exercised")
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
