"""Audit and repeat on the 12-cell, 234 MB state-heavy notebook, side by side with python3.

Run: `python -m benchmarks.bench_kernels [--runs N] [--json OUT] [--plot PNG]`.

In one run, for each of N rounds: a plain python3 kernel, the audit kernel, the
repeat kernel on the unmodified notebook, the repeat kernel after editing cell 10,
and naive per-cell pickling of the whole namespace (in process); and what the JupyterLab
extension adds: the plan request on a fresh repeat kernel, and the reply metadata per
reply (in process). Per-cell times
are the kernel's execute_input -> execute_reply span as nbclient records it, so
kernel start-up is excluded. Medians over rounds are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat

from nbrewind.run import run_notebook
from nbrewind.store import Store, du

NOTEBOOK = Path(__file__).resolve().parent / "notebooks" / "state-heavy.ipynb"
EDIT_CELL = 10  # 1-based code cell: `b[:1000] *= 0.0`


def _code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def naive_pickling(cells: list[str], folder: Path) -> dict[str, Any]:
    """Run the cells in process and pickle the whole user namespace after each one (write + fsync)."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    extra, written = [], 0
    for i, code in enumerate(cells):
        exec(compile(code, f"<cell {i}>", "exec"), ns)
        start = time.perf_counter()
        state = {k: v for k, v in ns.items() if not k.startswith("_") and not hasattr(v, "__spec__") and not callable(v)}
        path = folder / f"cell{i}.pkl"
        with open(path, "wb") as f:
            pickle.dump(state, f, protocol=5)
            f.flush()
            os.fsync(f.fileno())
        written += path.stat().st_size
        extra.append(time.perf_counter() - start)
    return {"extra_seconds_cells_2_12": sum(extra[1:]), "bytes": written}


def restore_time(store: Path, folder: Path, count: int = 9) -> float:
    """Seconds from `%nbrewind restore N` to a namespace whose `total` is usable, in a fresh repeat kernel."""
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, NBREWIND_STORE=str(store))
    km, kc = start_new_kernel(kernel_name="nbrewind-repeat", cwd=str(folder), env=env)
    try:
        start = time.perf_counter()
        kc.execute_interactive(f"%nbrewind restore {count}\nassert total == 599994", timeout=120, output_hook=lambda m: None)
        return time.perf_counter() - start
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def metadata_cost_seconds(n: int = 20000) -> float:
    """Median seconds the reply's ``metadata.nbrewind`` adds per reply: building it and
    serializing it with the message (in process; everything else in a reply is ipykernel's)."""
    from jupyter_client.session import json_packer

    from nbrewind.session import outcome
    from nbrewind.store import CellRun

    run = CellRun(id=12, duration=0.2034)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            json_packer({"nbrewind": dict(outcome.replayed("code and 22 inputs match cell run #12", 0.0021, run))})
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def plan_request(store: Path, folder: Path, cells: list[str]) -> tuple[float, list[str]]:
    """Seconds a fresh repeat kernel takes to answer the JupyterLab extension's "which cells
    will run?" (the ``plan`` comm request) for `cells`, and its decisions."""
    import uuid

    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, NBREWIND_STORE=str(store))
    km, kc = start_new_kernel(kernel_name="nbrewind-repeat", cwd=str(folder), env=env)
    try:
        comm_id, rid = uuid.uuid4().hex, uuid.uuid4().hex
        data = {"request": "plan", "id": rid, "cells": [{"cell_id": None, "code": c} for c in cells]}
        start = time.perf_counter()
        kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "nbrewind", "data": data}))
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("id") == rid:
                elapsed = time.perf_counter() - start
                return elapsed, [c["decision"] for c in msg["content"]["data"]["cells"]]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def one_round(work: Path) -> dict[str, Any]:
    nb = work / "state-heavy.ipynb"
    shutil.copyfile(NOTEBOOK, nb)
    store = work / "state-heavy.ipynb.nbrewind"
    result: dict[str, Any] = {}
    result["python3"] = run_notebook(nb, kernel="python3").cell_seconds
    result["audit"] = run_notebook(nb, kernel="audit", store=store).cell_seconds
    with Store.open(store, create=False) as opened:
        result["stored_bytes"] = du(opened).stored_bytes
    result["repeat"] = run_notebook(nb, kernel="repeat", store=store).cell_seconds
    result["restore9_seconds"] = restore_time(store, work)
    result["plan_seconds"], result["plan_decisions"] = plan_request(store, work, _code_cells(nb))
    notebook = nbformat.read(str(nb), as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    code[EDIT_CELL - 1].source = code[EDIT_CELL - 1].source.replace("*= 0.0", "*= 2.0")
    nbformat.write(notebook, str(nb))
    result["plan_edited_seconds"], result["plan_edited_decisions"] = plan_request(store, work, [c.source for c in code])
    result["repeat_edited"] = run_notebook(nb, kernel="repeat", store=store).cell_seconds
    result["fresh_edited"] = run_notebook(nb, kernel="python3").cell_seconds
    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
        newest = runs[-1].session
        result["edited_decisions"] = [r.decision for r in runs if r.session == newest]
    result["metadata_seconds"] = metadata_cost_seconds()
    naive_dir = work / "naive"
    naive_dir.mkdir()
    result["naive"] = naive_pickling(_code_cells(NOTEBOOK), naive_dir)
    return result


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med_cells(key: str) -> list[float]:
        return [statistics.median(r[key][i] for r in rounds) for i in range(len(rounds[0][key]))]

    plain, audit, repeat = med_cells("python3"), med_cells("audit"), med_cells("repeat")
    edited, fresh_edited = med_cells("repeat_edited"), med_cells("fresh_edited")
    over = [a - p for a, p in zip(audit, plain)]
    return {
        "rounds": len(rounds),
        "per_cell": {"python3": plain, "audit": audit, "repeat": repeat, "repeat_edited": edited, "fresh_edited": fresh_edited},
        "python3_cells_2_12_s": sum(plain[1:]),
        "audit_extra_cells_2_12_s": sum(over[1:]),
        "audit_extra_per_cell_s": over,
        "stored_bytes": statistics.median(r["stored_bytes"] for r in rounds),
        "naive_extra_cells_2_12_s": statistics.median(r["naive"]["extra_seconds_cells_2_12"] for r in rounds),
        "naive_bytes": statistics.median(r["naive"]["bytes"] for r in rounds),
        "repeat_cells_s": sum(repeat),
        "unmodified_speedup": sum(plain) / max(sum(repeat), 1e-9),
        "restore9_s": statistics.median(r["restore9_seconds"] for r in rounds),
        "edited_decisions": rounds[-1]["edited_decisions"],
        "edited_repeat_s": sum(edited),
        "edited_fresh_s": sum(fresh_edited),
        "plan_s": statistics.median(r["plan_seconds"] for r in rounds),
        "plan_edited_s": statistics.median(r["plan_edited_seconds"] for r in rounds),
        "plan_decisions": rounds[-1]["plan_decisions"],
        "plan_edited_decisions": rounds[-1]["plan_edited_decisions"],
        "replayed_cell_median_s": statistics.median(repeat),
        "metadata_per_reply_s": statistics.median(r["metadata_seconds"] for r in rounds),
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = range(1, len(summary["per_cell"]["python3"]) + 1)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    for offset, key, label in ((-width, "python3", "python3"), (0, "audit", "audit"), (width, "repeat", "repeat (unmodified)")):
        ax.bar([c + offset for c in cells], [v * 1000 for v in summary["per_cell"][key]], width, label=label)
    ax.set_xlabel("code cell")
    ax.set_ylabel("cell time, ms (median)")
    ax.set_title("state-heavy notebook: per-cell time, kernel start excluded")
    ax.set_xticks(list(cells))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nbrewind-warmup-") as tmp:
        # Warm the page cache and the imports once so the first measured kernel is not penalized.
        shutil.copyfile(NOTEBOOK, Path(tmp) / "warm.ipynb")
        run_notebook(Path(tmp) / "warm.ipynb", kernel="python3")
        run_notebook(Path(tmp) / "warm.ipynb", kernel="audit")
    rounds = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="nbrewind-bench-") as tmp:
            rounds.append(one_round(Path(tmp)))
    summary = summarize(rounds)
    print(f"rounds: {summary['rounds']}")
    print(f"python3, cells 2-12:            {summary['python3_cells_2_12_s']:.3f} s")
    print(f"audit extra, cells 2-12:        {summary['audit_extra_cells_2_12_s']:+.3f} s")
    print(f"naive pickling extra, 2-12:     {summary['naive_extra_cells_2_12_s']:+.3f} s")
    print(f"stored bytes (audit):           {summary['stored_bytes'] / 1e6:.1f} MB (naive pickles: {summary['naive_bytes'] / 1e6:.1f} MB)")
    for i, extra in enumerate(summary["audit_extra_per_cell_s"], start=1):
        print(f"  cell {i:>2} extra: {extra * 1000:+7.1f} ms")
    print(f"unmodified repeat: {summary['repeat_cells_s'] * 1000:.1f} ms of cell time vs {sum(summary['per_cell']['python3']):.3f} s: {summary['unmodified_speedup']:.0f}x")
    print(f"restore to cell 9 in a fresh kernel: {summary['restore9_s']:.3f} s")
    print(f"after editing cell {EDIT_CELL}: {summary['edited_decisions']}")
    print(f"  edited repeat {summary['edited_repeat_s']:.3f} s vs fresh {summary['edited_fresh_s']:.3f} s")
    print(f"the plan request (which cells will run?), fresh repeat kernel: unmodified {summary['plan_s'] * 1000:.1f} ms "
          f"{summary['plan_decisions']}; edited {summary['plan_edited_s'] * 1000:.1f} ms {summary['plan_edited_decisions']}")
    print(f"metadata.nbrewind per reply: {summary['metadata_per_reply_s'] * 1e6:.1f} us "
          f"(a replayed cell's median: {summary['replayed_cell_median_s'] * 1000:.2f} ms)")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=1))
    if args.plot:
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
