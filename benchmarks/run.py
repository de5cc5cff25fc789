"""The domain-notebook benchmark: plain python3 vs audit vs repeat, unmodified and edited.

Run: `python -m benchmarks.run [--quick] [--only NAME] [--rounds N] [--json OUT] [--plots DIR]`.

For each notebook of `benchmarks/scenarios.py` (written by `notebooks/make_notebooks.py`),
in one run and in a scratch folder:

1. a plain ``python3`` kernel run (the baseline and the reference outputs);
2. an ``nbrewind-audit`` run into a fresh store;
3. an ``nbrewind-repeat`` run of the unmodified notebook;
4. for each edit scenario, on a copy of the audited folder (notebook, data, store):
   the edited notebook on ``nbrewind-repeat`` and fresh on ``python3``.

Every repeat's outputs must equal the matching python3 outputs after normalizing only
what legitimately differs (NBRewind's own stderr notes, memory addresses, dashboard
links, timestamps of log lines); a scenario whose expected task-miss count is known
must recompute exactly that many tasks. Any difference is a failure: the exit status
is 1 and the JSON lists it.

Times are summed per-cell times (nbclient's execute_input -> execute_reply span), so
kernel start-up is excluded, as in `benchmarks/bench_kernels.py`; medians over rounds.
Without ``--quick`` the first round also runs, for analysis only, the edited notebook
on a fresh audit store (every task's fingerprint and duration, to estimate the
invalidated work and the expected unchanged fraction) and a python3 pass that
pickles the whole namespace after every cell (the naive store's bytes). See
`docs/benchmarks.md`, "Domain notebooks", for the definitions.

``--quick`` runs every notebook at a tiny scale, one round, no analysis runs: the
correctness check CI runs (`tests/test_benchmark_harness.py`); its times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.scenarios import NOTEBOOKS, NotebookSpec, Scenario, apply_edits, spec
from nbrewind.tasks.remote import RELAY_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
DEFAULT_JSON = ROOT / "docs" / "images" / "domain-notebooks.json"

# The published evaluation's means, drawn as reference rows beside ours.
PUBLISHED = {
    "audit_overhead_pct": 18.0,
    "unmodified_speedup": 18.4,
    "modified_speedup": 2.08,
    "hit_rate_pct": 75.1,
    "storage_saving_pct": 27.3,
}
GOALS = {
    "audit_overhead_median_pct": 5.0,
    "audit_overhead_max_pct": 10.0,
    "unmodified_speedup_median": 100.0,
    "modified_fraction_of_ideal": 0.90,
    "storage_saving_pct": 60.0,
}

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_DASHBOARD = re.compile(r"https?://[\w.\-]+:\d+/\S*")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - ")


# -- notebooks ---------------------------------------------------------------------------


def code_cells(path: Path) -> list[str]:
    """The sources of a notebook's code cells."""
    import nbformat

    return [c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def write_variant(source: Path, target: Path, scale: float, edits: tuple[tuple[str, str], ...] = ()) -> None:
    """Write `source` to `target` with `SCALE = scale` in its first cell and `edits` applied."""
    import nbformat

    nb = nbformat.read(str(source), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    if "SCALE = 1.0" not in cells[0].source:
        raise ValueError(f"{source.name}: the first code cell must set SCALE = 1.0")
    cells[0].source = cells[0].source.replace("SCALE = 1.0", f"SCALE = {scale!r}")
    for cell, new in zip(cells, apply_edits([c.source for c in cells], edits)):
        cell.source = new
    nbformat.write(nb, str(target))


_TRACEBACK_LINE = re.compile(
    r"^(Traceback \(most recent call last\):|\s|$|The above exception was|During handling of the above exception"
    r"|[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b)"
)


def strip_log_records(stderr: str) -> str:
    """``stderr`` without NBRewind's own notes and without the log records of libraries
    (distributed's timestamped lines), each with the traceback it carries: a cluster
    shutting down may log a closed connection in one run and not in another. Any other
    text, a traceback the notebook printed included, is kept."""
    kept: list[str] = []
    in_record = False
    for line in stderr.splitlines(True):
        if line.startswith("NBRewind:") or _LOG_LINE.match(line):
            in_record = not line.startswith("NBRewind:")
            continue
        if in_record and _TRACEBACK_LINE.match(line):
            continue
        in_record = False
        kept.append(line)
    return "".join(kept)


def normalized_outputs(path: Path) -> list[list[Any]]:
    """Per code cell, its outputs with only the legitimately varying parts normalized."""
    import nbformat

    out = []
    for cell in nbformat.read(str(path), as_version=4).cells:
        if cell.cell_type != "code":
            continue
        items: list[Any] = []
        for o in cell.outputs:
            kind = o.output_type
            if kind == "stream":
                text = o.text
                if o.name == "stderr":
                    text = strip_log_records(text)
                if text:
                    items.append(["stream", o.name, _normalize_text(text)])
            elif kind in ("execute_result", "display_data"):
                data = {mime: _normalize_text(v) if isinstance(v, str) and mime.startswith("text/") else v for mime, v in o.data.items()}
                items.append([kind, data])
            elif kind == "error":
                items.append(["error", o.ename, _normalize_text(o.evalue)])
        merged: list[Any] = []
        for item in items:  # a stream may arrive in several messages: compare the concatenation
            if merged and item[0] == "stream" and merged[-1][0] == "stream" and merged[-1][1] == item[1]:
                merged[-1] = ["stream", item[1], merged[-1][2] + item[2]]
            else:
                merged.append(item)
        out.append(merged)
    return out


def _normalize_text(text: str) -> str:
    return _DASHBOARD.sub("<dashboard>", _ADDRESS.sub("0x?", text))


def compare_outputs(fresh: Path, other: Path) -> list[str]:
    """Human-readable differences between two executed notebooks' normalized outputs."""
    a, b = normalized_outputs(fresh), normalized_outputs(other)
    if len(a) != len(b):
        return [f"{len(a)} code cells vs {len(b)}"]
    problems = []
    for i, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            problems.append(f"cell {i}: fresh {json.dumps(x)[:300]} != {json.dumps(y)[:300]}")
    return problems


# -- runs --------------------------------------------------------------------------------


@contextmanager
def dask_scratch(folder: Path) -> Iterator[dict[str, str]]:
    """Environment for one kernel run with its own Dask scratch directory, removed afterwards,
    so no run finds another's worker directories or lock files."""
    scratch = folder / f"dask-scratch-{time.monotonic_ns()}"
    for old in folder.glob("dask-scratch-*"):
        shutil.rmtree(old, ignore_errors=True)
    try:
        yield dict(os.environ, DASK_TEMPORARY_DIRECTORY=str(scratch))
    finally:
        for old in folder.glob("dask-scratch-*"):
            shutil.rmtree(old, ignore_errors=True)


def run(nb: Path, kernel: str, scratch_root: Path, store: Path | None = None) -> dict[str, Any]:
    """Run `nb` on `kernel`; the executed copy is written beside it as `<stem>.<kernel>.out.ipynb`."""
    from nbrewind.run import run_notebook

    output = nb.with_name(f"{nb.stem}.{kernel}.out.ipynb")
    with dask_scratch(scratch_root) as env:
        result = run_notebook(nb, kernel=kernel, store=store, output=output, env=env, timeout=900)
    said = [c.nbrewind for c in result.cells]
    return {"seconds": sum(result.cell_seconds), "cells": result.cell_seconds, "wall": result.seconds, "output": str(output), "said": said}


def session_log(store: Path) -> list[dict[str, Any]]:
    """The newest kernel session's cell runs: decision, reason, duration, task hits and misses."""
    from nbrewind.store import Store
    from nbrewind.store.report import cell_log

    with Store.open(store, create=False) as opened:
        return [
            {"decision": r.decision, "reason": r.reason, "duration": r.duration, "hits": r.task_hits, "misses": r.task_misses}
            for r in cell_log(opened, last_session=True)
        ]


def task_fingerprints(store: Path) -> dict[int, list[tuple[str, float]]]:
    """Per cell position (1-based, newest session) the tasks its run logged: (fingerprint, seconds)."""
    from nbrewind.store import Store

    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
        newest = runs[-1].session if runs else None
        position = {r.id: i for i, r in enumerate((r for r in runs if r.session == newest), start=1)}
        out: dict[int, list[tuple[str, float]]] = {}
        for entry in opened.catalog.task_log():
            if entry.cell_run_id in position:
                out.setdefault(position[entry.cell_run_id], []).append((entry.fingerprint, float(entry.duration or 0.0)))
        return out


def all_fingerprints(store: Path) -> set[str]:
    """Every task fingerprint with a stored result in `store`."""
    from nbrewind.store import Store

    with Store.open(store, create=False) as opened:
        return {e.fingerprint for e in opened.catalog.task_log()}


def task_result_bytes(store: Path) -> int:
    """Bytes of the Dask task results the store logged (as the workers measured them)."""
    from nbrewind.store import Store

    with Store.open(store, create=False) as opened:
        return sum(int(e.nbytes or 0) for e in opened.catalog.task_log() if not e.hit)


def task_counts(store: Path) -> dict[str, int]:
    """The newest session's task hits and misses, and how many of the misses' results the
    kernel stored for workers that did not write the store themselves (`--relay`)."""
    from nbrewind.store import Store
    from nbrewind.tasks.results import read_entry

    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
        newest = {r.id for r in runs if runs and r.session == runs[-1].session}
        rows = [e for e in opened.catalog.task_log() if e.cell_run_id in newest]
        relayed = direct = 0
        for row in rows:
            if row.hit or not row.result_digest:
                continue
            _, meta = read_entry(opened.objects, row.result_digest)
            relayed += bool(meta.get("relayed"))
            direct += not meta.get("relayed")
        return {"hits": sum(e.hit for e in rows), "misses": sum(not e.hit for e in rows), "relayed": relayed, "direct": direct}


def check_relay(label: str, counts: dict[str, int], failures: list[str]) -> None:
    """With `--relay`, no worker may have written a result into the store itself."""
    if os.environ.get(RELAY_VARIABLE) == "relay" and counts["direct"]:
        failures.append(f"{label}: {counts['direct']} task results were written by workers, not through the kernel")


def stored_bytes(store: Path) -> int:
    """Bytes the store occupies on disk (objects after compression and deduplication)."""
    from nbrewind.store import Store, du

    with Store.open(store, create=False) as opened:
        return du(opened).stored_bytes


NAIVE_CELL = """\
import pickle as _nv_pickle, types as _nv_types
_nv_bytes = globals().get("_nv_bytes", 0)
for _nv_k, _nv_v in list(globals().items()):
    if _nv_k.startswith("_") or _nv_k in ("In", "Out", "exit", "quit", "get_ipython") or isinstance(_nv_v, _nv_types.ModuleType):
        continue
    try:
        _nv_bytes += len(_nv_pickle.dumps(_nv_v, protocol=5))
    except Exception:
        pass
print("NAIVE", _nv_bytes)"""


def copy_floor_seconds(files: list[Path], scratch_root: Path) -> float:
    """Seconds `shutil.copyfile` plus an fsync per file takes to copy `files` (those the
    notebook's cells wrote, still in the page cache): the least any tool that keeps a
    durable copy of what a cell wrote pays on this machine, by reflink-less filesystems."""
    target = Path(tempfile.mkdtemp(prefix="copy-floor-", dir=scratch_root))
    try:
        started = time.perf_counter()
        for i, path in enumerate(files):
            copy = target / f"{i}"
            shutil.copyfile(path, copy)
            fd = os.open(copy, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(target, ignore_errors=True)


def naive_bytes(nb: Path, scratch_root: Path) -> int:
    """Bytes of pickling the whole user namespace after every cell (what a naive checkpointer stores)."""
    import nbformat
    import nbformat.v4 as v4

    book = nbformat.read(str(nb), as_version=4)
    cells = []
    for cell in book.cells:
        cells.append(cell)
        if cell.cell_type == "code":
            cells.append(v4.new_code_cell(NAIVE_CELL))
    book.cells = cells
    target = nb.with_name(nb.stem + "-naive.ipynb")
    nbformat.write(book, str(target))
    done = run(target, "python3", scratch_root)
    last = [c for c in nbformat.read(done["output"], as_version=4).cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs)
    return int(re.findall(r"NAIVE (\d+)", text)[-1])


# -- one notebook ------------------------------------------------------------------------


@dataclass
class NotebookResult:
    """Everything measured for one notebook, over all rounds."""

    name: str
    scale: float
    rounds: list[dict[str, Any]] = field(default_factory=list)
    analysis: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def one_round(item: NotebookSpec, work: Path, scale: float, analyse: bool, failures: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One round of every run for one notebook in `work`; appends correctness failures."""
    source = NOTEBOOK_DIR / f"{item.name}.ipynb"
    base, rec = work / "base", work / "rec"
    base.mkdir(parents=True)
    rec.mkdir()
    write_variant(source, base / f"{item.name}.ipynb", scale)
    write_variant(source, rec / f"{item.name}.ipynb", scale)
    store = rec / f"{item.name}.ipynb.nbrewind"
    out: dict[str, Any] = {"scenarios": {}}
    analysis: dict[str, Any] = {"scenarios": {}}

    out["python3"] = run(base / f"{item.name}.ipynb", "python3", work)
    out["audit"] = run(rec / f"{item.name}.ipynb", "audit", work, store)
    out["stored_bytes"] = stored_bytes(store)
    out["task_result_bytes"] = task_result_bytes(store)
    out["input_file_bytes"] = sum(f.stat().st_size for f in rec.glob("*-data/*") if f.is_file())
    out["copy_floor_s"] = copy_floor_seconds(sorted(f for f in rec.glob("*-data/*") if f.is_file()), work)
    audited_fps = all_fingerprints(store)
    out["audit_log"] = session_log(store)
    out["audit_tasks"] = task_counts(store)
    check_relay(f"{item.name} audit", out["audit_tasks"], failures)
    out["repeat"] = run(rec / f"{item.name}.ipynb", "repeat", work, store)
    out["repeat_log"] = session_log(store)
    out["repeat_tasks"] = task_counts(store)
    check_relay(f"{item.name} unmodified repeat", out["repeat_tasks"], failures)
    for what in ("audit", "repeat"):
        for problem in compare_outputs(Path(out["python3"]["output"]), Path(out[what]["output"])):
            failures.append(f"{item.name} unmodified {what}: {problem}")
    if analyse:
        analysis["naive_bytes"] = naive_bytes(base / f"{item.name}.ipynb", work)
        analysis["audited_fingerprints"] = sorted(audited_fps)

    for scenario in item.scenarios:
        out["scenarios"][scenario.name], detail = run_scenario(item, scenario, work, rec, scale, analyse, audited_fps, failures)
        if analyse:
            analysis["scenarios"][scenario.name] = detail
    return out, analysis


def run_scenario(
    item: NotebookSpec,
    scenario: Scenario,
    work: Path,
    rec: Path,
    scale: float,
    analyse: bool,
    audited_fps: set[str],
    failures: list[str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The edited notebook on repeat (over a copy of the audited folder) and fresh on python3."""
    source = NOTEBOOK_DIR / f"{item.name}.ipynb"
    folder, fresh = work / f"s-{scenario.name}", work / f"s-{scenario.name}-fresh"
    shutil.copytree(rec, folder, ignore=shutil.ignore_patterns("*.out.ipynb"))
    # A store written earlier is on disk; a copy made just now is in the page cache, and the
    # repeat's first durability barrier would flush it, the copied input files included.
    os.sync()
    fresh.mkdir()
    nb = folder / f"{item.name}.ipynb"
    store = folder / f"{item.name}.ipynb.nbrewind"
    write_variant(source, nb, scale, scenario.edits)
    write_variant(source, fresh / nb.name, scale, scenario.edits)
    res: dict[str, Any] = {}
    res["repeat"] = run(nb, "repeat", work, store)
    res["log"] = session_log(store)
    res["fresh"] = run(fresh / nb.name, "python3", work)
    hits = sum(r["hits"] for r in res["log"])
    misses = sum(r["misses"] for r in res["log"])
    res["hits"], res["misses"] = hits, misses
    label = f"{item.name}/{scenario.name}"
    res["tasks"] = task_counts(store)
    check_relay(label, res["tasks"], failures)
    for problem in compare_outputs(Path(res["fresh"]["output"]), Path(res["repeat"]["output"])):
        failures.append(f"{label} repeat: {problem}")
    if scenario.expected_misses is not None:
        expected = scenario.expected_misses(scale)
        res["expected_misses"] = expected
        if misses != expected:
            failures.append(f"{label}: the repeat recomputed {misses} tasks, expected exactly {expected}")
    detail: dict[str, Any] = {}
    if analyse:
        faudit = work / f"s-{scenario.name}-faudit"
        faudit.mkdir()
        write_variant(source, faudit / nb.name, scale, scenario.edits)
        fstore = faudit / f"{nb.name}.nbrewind"
        detail["fresh_audit"] = run(faudit / nb.name, "audit", work, fstore)
        detail["tasks"] = {str(k): v for k, v in task_fingerprints(fstore).items()}
        detail["unchanged_tasks"] = sum(1 for v in detail["tasks"].values() for fp, _ in v if fp in audited_fps)
        detail["total_tasks"] = sum(len(v) for v in detail["tasks"].values())
    for path in (folder, fresh):
        shutil.rmtree(path / f"{item.name}.ipynb.nbrewind", ignore_errors=True)
    return res, detail


def run_notebook_benchmark(item: NotebookSpec, rounds: int, quick: bool, keep: Path | None = None) -> NotebookResult:
    """All rounds for one notebook; round one also does the analysis runs unless `quick`."""
    scale = item.quick_scale if quick else item.full_scale
    result = NotebookResult(item.name, scale)
    for number in range(rounds):
        with tempfile.TemporaryDirectory(prefix=f"nbrewind-{item.name}-") as tmp:
            work = Path(tmp)
            data, analysis = one_round(item, work, scale, analyse=(number == 0 and not quick), failures=result.failures)
            result.rounds.append(data)
            if number == 0:
                result.analysis = analysis
            if keep is not None:
                shutil.copytree(work, keep / f"{item.name}-round{number}", ignore=shutil.ignore_patterns("*.nbrewind", "*-data", "dask-scratch-*"))
    return result


# -- figures -----------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def invalidated_seconds(fresh_cells: list[float], log: list[dict[str, Any]], tasks: dict[str, list[tuple[str, float]]], audited: set[str]) -> float:
    """Estimated seconds of the work an edit invalidates (the denominator of the ideal speedup).

    Over the cells the repeat kernel executed: a cell without Dask tasks counts its
    whole fresh python3 time; a cell with tasks counts its fresh time times the share
    of its task-seconds (fresh audit of the edited notebook) whose fingerprints were
    not in the original audit's store.
    """
    total = 0.0
    for position, (seconds, row) in enumerate(zip(fresh_cells, log), start=1):
        if row["decision"] != "executed":
            continue
        cell_tasks = tasks.get(str(position), [])
        all_s = sum(d for _, d in cell_tasks)
        if not cell_tasks or all_s <= 0:
            total += seconds
            continue
        total += seconds * sum(d for fp, d in cell_tasks if fp not in audited) / all_s
    return total


def brought_back_seconds(said: list[dict[str, Any] | None]) -> float:
    """Seconds the repeat's cells that ran spent bringing back values the replays left
    pending (loads, and rebuilds of what cannot be stored, such as the cluster), as their
    replies said (docs/reply-metadata.md)."""
    return sum(
        float(info.get("brought_back", {}).get("seconds", 0.0))
        for info in said
        if info is not None and info.get("decision") != "replayed"
    )


def summarize(result: NotebookResult, audited_fps: set[str] | None = None) -> dict[str, Any]:
    """Medians over rounds of the five figures (and the per-scenario details)."""
    r = result.rounds
    plain = _median([x["python3"]["seconds"] for x in r])
    audit = _median([x["audit"]["seconds"] for x in r])
    repeat = _median([x["repeat"]["seconds"] for x in r])
    summary: dict[str, Any] = {
        "scale": result.scale,
        "rounds": len(r),
        "python3_s": plain,
        "audit_s": audit,
        "repeat_s": repeat,
        "audit_overhead_pct": 100 * (audit - plain) / plain,
        "unmodified_speedup": plain / max(repeat, 1e-9),
        "audit_tasks": r[-1]["audit_tasks"],
        "unmodified_tasks": r[-1]["repeat_tasks"],
        "unmodified_decisions": [row["decision"] for row in r[-1]["repeat_log"]],
        "unmodified_reasons": [row["reason"] for row in r[-1]["repeat_log"]],
        "stored_bytes": int(_median([x["stored_bytes"] for x in r])),
        "task_result_bytes": int(_median([x["task_result_bytes"] for x in r])),
        "input_file_bytes": int(_median([x["input_file_bytes"] for x in r])),
        "scenarios": {},
    }
    if all("copy_floor_s" in x for x in r):  # results written before it was measured have none
        copy_floor = _median([x["copy_floor_s"] for x in r])
        summary["copy_floor_s"] = copy_floor
        summary["copy_floor_pct"] = 100 * copy_floor / plain
        summary["audit_overhead_beyond_copy_pct"] = summary["audit_overhead_pct"] - summary["copy_floor_pct"]
    naive = result.analysis.get("naive_bytes")
    if naive:
        summary["naive_bytes"] = naive
        summary["storage_saving_pct"] = 100 * (1 - summary["stored_bytes"] / naive)
    for name in r[0]["scenarios"]:
        runs = [x["scenarios"][name] for x in r]
        fresh = _median([s["fresh"]["seconds"] for s in runs])
        rep = _median([s["repeat"]["seconds"] for s in runs])
        row: dict[str, Any] = {
            "fresh_s": fresh,
            "repeat_s": rep,
            "speedup": fresh / max(rep, 1e-9),
            "hits": runs[-1]["hits"],
            "misses": runs[-1]["misses"],
            "expected_misses": runs[-1].get("expected_misses"),
            "relayed": runs[-1]["tasks"]["relayed"],
            "decisions": [row["decision"] for row in runs[-1]["log"]],
        }
        detail = result.analysis.get("scenarios", {}).get(name)
        if detail and audited_fps is not None:
            fresh_cells = [statistics.median(c) for c in zip(*[s["fresh"]["cells"] for s in runs])]
            work = invalidated_seconds(fresh_cells, runs[-1]["log"], detail["tasks"], audited_fps)
            row["invalidated_s"] = work
            row["ideal_speedup"] = fresh / max(work, 1e-9)
            row["fraction_of_ideal"] = row["speedup"] / row["ideal_speedup"]
            back = _median([brought_back_seconds(x["repeat"].get("said") or []) for x in runs])
            if back == back:
                # The floor adds what no repeat can skip: the values the running cells read,
                # which the fresh run had in memory (loads and the imports they need), and the
                # resources they use that cannot be stored (the cluster, started again).
                row["brought_back_s"] = back
                row["floor_speedup"] = fresh / max(work + back, 1e-9)
                row["fraction_of_floor"] = row["speedup"] / row["floor_speedup"]
            total = detail["total_tasks"]
            if total:
                row["tasks_total"] = total
                row["hit_rate_pct"] = 100 * (1 - row["misses"] / total)
                row["expected_unchanged_pct"] = 100 * detail["unchanged_tasks"] / total
        summary["scenarios"][name] = row
    mods = list(summary["scenarios"].values())
    summary["modified_speedup"] = _median([m["speedup"] for m in mods])
    ideals = [m["ideal_speedup"] for m in mods if "ideal_speedup" in m]
    if ideals:
        summary["modified_ideal_speedup"] = _median(ideals)
        summary["modified_fraction_of_ideal"] = _median([m["fraction_of_ideal"] for m in mods])
    floors = [m["fraction_of_floor"] for m in mods if "fraction_of_floor" in m]
    if floors:
        summary["modified_fraction_of_floor"] = _median(floors)
        summary["modified_worst_fraction_of_floor"] = min(floors)
    rates = [m for m in mods if "hit_rate_pct" in m]
    if rates:
        hit = sum(m["tasks_total"] * m["hit_rate_pct"] / 100 for m in rates)
        exp = sum(m["tasks_total"] * m["expected_unchanged_pct"] / 100 for m in rates)
        tot = sum(m["tasks_total"] for m in rates)
        summary["hit_rate_pct"] = 100 * hit / tot
        summary["expected_unchanged_pct"] = 100 * exp / tot
    return summary


def plot(summaries: dict[str, dict[str, Any]], folder: Path) -> list[Path]:
    """One PNG per figure: a bar per notebook, our median, the published mean and the goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [
        ("audit_overhead_pct", "audit overhead, %", PUBLISHED["audit_overhead_pct"], GOALS["audit_overhead_median_pct"], False),
        ("unmodified_speedup", "unmodified repeat speedup, x", PUBLISHED["unmodified_speedup"], GOALS["unmodified_speedup_median"], True),
        ("modified_speedup", "modified repeat speedup, x (ideal hatched)", PUBLISHED["modified_speedup"], None, True),
        ("hit_rate_pct", "task hit rate, % (expected unchanged hatched)", PUBLISHED["hit_rate_pct"], None, False),
        ("storage_saving_pct", "store bytes below naive pickles, %", PUBLISHED["storage_saving_pct"], GOALS["storage_saving_pct"], False),
    ]
    second = {"modified_speedup": "modified_ideal_speedup", "hit_rate_pct": "expected_unchanged_pct"}
    written = []
    fig, axes = plt.subplots(1, len(figures), figsize=(4.2 * len(figures), 3.6))
    names = list(summaries)
    for ax, (key, title, published, goal, log) in zip(axes, figures):
        labels = [*names, "median", "published"]
        ours = [summaries[n].get(key, float("nan")) for n in names]
        vals = [*ours, _median([v for v in ours if v == v]), published]
        colors = ["tab:blue"] * len(names) + ["tab:green", "tab:gray"]
        x = range(len(labels))
        ax.bar(x, vals, color=colors, width=0.6)
        if key in second:
            extra = [summaries[n].get(second[key], float("nan")) for n in names]
            ax.bar(list(x)[: len(names)], extra, width=0.6, fill=False, hatch="//", edgecolor="k")
        if goal is not None:
            ax.axhline(goal, color="tab:red", linestyle="--", linewidth=1, label=f"goal {goal:g}")
            ax.legend(fontsize=7)
        if log:
            ax.set_yscale("log")
        if key == "storage_saving_pct":  # stores far above naive would flatten the chart: clip and label
            ax.set_ylim(-150, 100)
            for i, v in enumerate(vals):
                if v == v and v < -150:
                    ax.annotate(f"{v:,.0f}", (i, -150), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = folder / "domain-notebooks.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


def markdown_table(summaries: dict[str, dict[str, Any]]) -> str:
    """The results table for docs/benchmarks.md."""
    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"

    lines = [
        "| notebook | python3 s | audit overhead | unmodified repeat | modified repeat (ideal) | hit rate (expected) | store vs naive |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        store = f"{s['stored_bytes'] / 1e6:.1f} MB vs {s['naive_bytes'] / 1e6:.1f} MB ({-s['storage_saving_pct']:+.0f} %)" if "naive_bytes" in s else f"{s['stored_bytes'] / 1e6:.1f} MB"
        store += f"; inputs {s['input_file_bytes'] / 1e6:.0f} MB, task results {s['task_result_bytes'] / 1e6:.0f} MB"
        floor = f" (copy floor {f(s.get('copy_floor_pct'), '.1f')} %)" if "copy_floor_pct" in s else ""
        lines.append(
            f"| {name} | {f(s['python3_s'], '.1f')} | {f(s['audit_overhead_pct'], '+.1f')} %{floor} | {f(s['unmodified_speedup'], '.1f')}x "
            f"| {f(s['modified_speedup'], '.2f')}x ({f(s.get('modified_ideal_speedup'), '.1f')}x) "
            f"| {f(s.get('hit_rate_pct'), '.1f')} % ({f(s.get('expected_unchanged_pct'), '.1f')} %) | {store} |"
        )
    lines.append(
        f"| published mean | | +{PUBLISHED['audit_overhead_pct']:g} % | {PUBLISHED['unmodified_speedup']}x | {PUBLISHED['modified_speedup']}x | "
        f"{PUBLISHED['hit_rate_pct']} % | -{PUBLISHED['storage_saving_pct']} % |"
    )
    return "\n".join(lines)


def scenario_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Per scenario: times, speedup vs ideal, tasks recomputed vs expected."""
    lines = [
        "| notebook / scenario | fresh s | repeat s | speedup | ideal (% reached) | brought back s | floor (% reached) | tasks hit / missed (expected misses) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        for scen, m in s["scenarios"].items():
            ideal = f"{m['ideal_speedup']:.1f}x ({100 * m['fraction_of_ideal']:.0f} %)" if "ideal_speedup" in m else "-"
            back = f"{m['brought_back_s']:.2f}" if "brought_back_s" in m else "-"
            floor = f"{m['floor_speedup']:.1f}x ({100 * m['fraction_of_floor']:.0f} %)" if "floor_speedup" in m else "-"
            exp = "" if m["expected_misses"] is None else f" ({m['expected_misses']})"
            lines.append(
                f"| {name} / {scen} | {m['fresh_s']:.2f} | {m['repeat_s']:.2f} | {m['speedup']:.2f}x | {ideal} | {back} | {floor} "
                f"| {m['hits']} / {m['misses']}{exp} |"
            )
    return "\n".join(lines)


def repeat_time_parts(raw: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Where each scenario's repeat spends its time, medians over rounds (from the results
    file's ``raw``): replayed cells; what was brought back for cells that ran (a cluster,
    loaded values); those cells' own run, beside the same cells' fresh python3 time; and the
    kernel's work around them (nbclient's cell time less the duration the kernel reports:
    keying the cell before it runs, the checkpoint after)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, data in raw.items():
        per: dict[str, list[dict[str, float]]] = {}
        for round_ in data.get("rounds", []):
            for scen, s in round_.get("scenarios", {}).items():
                rep, fresh = s["repeat"], s["fresh"]["cells"]
                parts = {"repeat_s": sum(rep["cells"]), "replays_s": 0.0, "brought_back_s": 0.0, "own_s": 0.0, "fresh_own_s": 0.0, "around_s": 0.0}
                for i, (seconds, said) in enumerate(zip(rep["cells"], rep["said"])):
                    if not said:
                        continue
                    if said["decision"] == "replayed":
                        parts["replays_s"] += seconds
                        continue
                    back = (said.get("brought_back") or {}).get("seconds") or 0.0
                    duration = said.get("duration") or 0.0
                    parts["brought_back_s"] += back
                    parts["own_s"] += duration - back
                    parts["fresh_own_s"] += fresh[i]
                    parts["around_s"] += seconds - duration
                per.setdefault(scen, []).append(parts)
        out[name] = {scen: {k: _median([p[k] for p in rows]) for k in rows[0]} for scen, rows in per.items()}
    return out


def repeat_time_table(raw: dict[str, Any]) -> str:
    """`repeat_time_parts` as a table for docs/benchmarks.md."""
    lines = [
        "| notebook / scenario | repeat s | replays | brought back | run cells' own time vs fresh | kernel work around run cells |",
        "|---|---|---|---|---|---|",
    ]
    for name, scenarios in repeat_time_parts(raw).items():
        for scen, m in scenarios.items():
            lines.append(
                f"| {name} / {scen} | {m['repeat_s']:.2f} | {m['replays_s']:.3f} | {m['brought_back_s']:.2f} "
                f"| {m['own_s']:.2f} vs {m['fresh_own_s']:.2f} | {m['around_s']:.2f} |"
            )
    return "\n".join(lines)


def all_tables(summaries: dict[str, dict[str, Any]], raw: dict[str, Any]) -> str:
    """Every table a run prints: per notebook, per scenario, and where repeats spend time."""
    return "\n\n".join((markdown_table(summaries), scenario_table(summaries), repeat_time_table(raw)))


# -- main --------------------------------------------------------------------------------


def warm_up(folder: Path) -> None:
    """One tiny python3 and audit run so imports and the page cache do not penalize round one."""
    item = NOTEBOOKS[0]
    nb = folder / "warm.ipynb"
    write_variant(NOTEBOOK_DIR / f"{item.name}.ipynb", nb, item.quick_scale)
    run(nb, "python3", folder)
    run(nb, "audit", folder, folder / "warm.nbrewind")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every check passed, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny scale, one round, no analysis runs: a correctness check")
    parser.add_argument("--only", action="append", help="run only this notebook (repeatable)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per notebook (default 2, 1 with --quick)")
    parser.add_argument("--json", type=Path, default=None, help=f"results file (default {DEFAULT_JSON.relative_to(ROOT)}; with --quick none)")
    parser.add_argument("--plots", type=Path, default=None, help="folder for the PNG (default docs/images; with --quick none)")
    parser.add_argument("--jobs", type=int, default=None, help="notebooks benchmarked at once (default 1, 2 with --quick; keep 1 for timings)")
    parser.add_argument("--keep", type=Path, default=None, help="copy the executed notebooks here for inspection")
    parser.add_argument(
        "--relay", action="store_true", help=f"workers store and load task results through the kernel ({RELAY_VARIABLE}=relay)"
    )
    parser.add_argument("--explain", type=Path, default=None, help="run nothing: print the tables of this results file")
    args = parser.parse_args(argv)
    if args.explain is not None:
        saved = json.loads(args.explain.read_text())
        print(all_tables(saved["summary"], saved["raw"]))
        return 0
    if args.relay:
        os.environ[RELAY_VARIABLE] = "relay"  # kernels and the workers their clusters start inherit it
    rounds = args.rounds or (1 if args.quick else 2)
    chosen = [spec(n) for n in args.only] if args.only else list(NOTEBOOKS)
    json_path = args.json or (None if args.quick else DEFAULT_JSON)
    plots = args.plots or (None if args.quick else ROOT / "docs" / "images")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not args.quick:
        with tempfile.TemporaryDirectory(prefix="nbrewind-warm-") as tmp:
            warm_up(Path(tmp))
    results, summaries, failures = {}, {}, []
    jobs = args.jobs or (2 if args.quick else 1)
    for item, result, took in _each_result(chosen, rounds, args.quick, args.keep, jobs):
        results[item.name] = result
        failures.extend(result.failures)
        audited = _audited_from(result)
        summaries[item.name] = summarize(result, audited)
        s = summaries[item.name]
        print(
            f"{item.name:>10}: python3 {s['python3_s']:.2f} s, audit {s['audit_overhead_pct']:+.1f} %, "
            f"unmodified repeat {s['unmodified_speedup']:.1f}x, modified {s['modified_speedup']:.2f}x, "
            f"{len(result.failures)} failures ({took:.0f} s)",
            flush=True,
        )
        for problem in result.failures:
            print(f"    FAIL {problem}", flush=True)
    report = {
        "command": "python -m benchmarks.run" + (" --quick" if args.quick else "") + (" --relay" if args.relay else "") + "".join(f" --only {n}" for n in args.only or []),
        "quick": args.quick,
        "rounds": rounds,
        "seconds": time.perf_counter() - started,
        "published": PUBLISHED,
        "goals": GOALS,
        "summary": summaries,
        "failures": failures,
        "raw": {name: {"scale": r.scale, "rounds": r.rounds, "analysis": r.analysis} for name, r in results.items()},
    }
    print(all_tables(summaries, report["raw"]))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {json_path}")
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
        for path in plot(summaries, plots):
            print(f"wrote {path}")
    print(f"{len(failures)} failures")
    return 1 if failures else 0


def _timed_benchmark(name: str, rounds: int, quick: bool, keep: Path | None) -> tuple[NotebookResult, float]:
    started = time.perf_counter()
    return run_notebook_benchmark(spec(name), rounds, quick, keep), time.perf_counter() - started


def _each_result(
    chosen: list[NotebookSpec], rounds: int, quick: bool, keep: Path | None, jobs: int
) -> Iterator[tuple[NotebookSpec, NotebookResult, float]]:
    """Benchmark each notebook, `jobs` at a time (in spawned processes), in the given order."""
    if jobs <= 1:
        for item in chosen:
            yield (item, *_timed_benchmark(item.name, rounds, quick, keep))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_timed_benchmark, item.name, rounds, quick, keep) for item in chosen]
        for item, future in zip(chosen, futures):
            yield (item, *future.result())


def _audited_from(result: NotebookResult) -> set[str] | None:
    """Fingerprints of the original audit, as recorded in round one's analysis (None without analysis)."""
    fps = result.analysis.get("audited_fingerprints")
    return set(fps) if fps is not None else None


if __name__ == "__main__":
    sys.exit(main())
