"""Audit and repeat on the 12-cell, 234 MB state-heavy notebook, side by side with python3.

Run: `python -m benchmarks.bench_kernels [--runs N] [--json OUT] [--plot PNG]`.

In one run, for each of N rounds: a plain python3 kernel, the audit kernel, the
repeat kernel on the unmodified notebook, the repeat kernel after editing cell 10,
and naive per-cell pickling of the whole namespace (in process); and what the JupyterLab
extension adds: the plan request on a fresh repeat kernel, and the reply metadata per
reply (in process). Per-cell times
are the kernel's execute_input -> execute_reply span as nbclient records it, so
kernel start-up is excluded. Medians over rounds are reported.

`--replay-ratio` measures issue 14's goal instead: a replayed cell against an empty one.
Each round runs a python3 notebook of 12 `pass` cells (ipykernel's own round trip), a
python3 notebook whose cells show exactly what the state-heavy notebook's cells showed and
compute nothing (the round trip of the messages a replay sends), and the unmodified repeat
of the audited state-heavy notebook, side by side; with `--compare TREE` also the repeat
kernel of another checkout (PYTHONPATH at TREE, e.g. an old commit's git worktree), the two
trees alternating (`--against TREE` measures another checkout as "after"). What counts is the
ratio, on a machine that is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
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


EMPTY_SOURCE = "pass"
"""An empty cell: nbclient skips a cell whose source is blank, so it would not reach the kernel."""


def _empty_notebook(path: Path, cells: int) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(EMPTY_SOURCE) for _ in range(cells)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(path))


def _same_outputs_notebook(executed: Path, path: Path) -> None:
    """A python3 notebook whose cells show what `executed`'s code cells showed and compute
    nothing else (streams written, results through the display hook): ipykernel's round
    trip for the very messages a replay of those cells sends."""
    nb = nbformat.read(str(executed), as_version=4)
    sources = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        lines = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                lines.append(f"print({out.text!r}, end='', file=sys.{out.name})")
            elif out.output_type == "display_data":
                lines.append(f"display({dict(out.data)!r}, raw=True)")
            elif out.output_type == "execute_result":
                lines.append(f"_Shown({dict(out.data)!r})")
        sources.append("\n".join(lines) or EMPTY_SOURCE)
    sources[0] = (
        "import sys\nfrom IPython.display import display\n"
        "class _Shown:\n    def __init__(self, data):\n        self.data = data\n"
        "    def _repr_mimebundle_(self, include=None, exclude=None):\n        return self.data\n" + sources[0]
    )
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(path))


def _tree_env(tree: Path | None) -> dict[str, str] | None:
    """The kernel environment that imports nbrewind from `tree` (None: this interpreter's own)."""
    if tree is None:
        return None
    env = dict(os.environ, PYTHONPATH=str(tree))
    found = subprocess.run([sys.executable, "-c", "import nbrewind; print(nbrewind.__file__)"], env=env, cwd=tempfile.gettempdir(),
                           capture_output=True, text=True, check=True).stdout.strip()
    if not found.startswith(str(tree)):
        raise SystemExit(f"PYTHONPATH={tree} imports nbrewind from {found}")
    return env


def replay_ratio(rounds: int, compare: Path | None = None, against: Path | None = None) -> dict[str, Any]:
    """Replayed cells against empty python3 cells, side by side (see the module's docstring).

    Each repeat kernel (`against`'s, default this interpreter's, and `compare`'s) repeats a
    store it audited itself. Per round and contender: the median cell of cells 2-12 and the
    sum of all 12 cells; each round's ratios are taken against that round's python3 cells
    (empty, and showing the same outputs), and the medians over rounds are reported.
    """
    this = against.resolve() if against is not None else None
    trees: dict[str, Path | None] = {"this tree": this}
    if compare is not None:
        trees = {"before": compare.resolve(), "after": this}
    envs = {name: _tree_env(tree) for name, tree in trees.items()}
    cells = len(_code_cells(NOTEBOOK))
    samples: dict[str, list[list[float]]] = {"python3 empty": [], "python3 same outputs": [], **{name: [] for name in trees}}
    with tempfile.TemporaryDirectory(prefix="nbrewind-ratio-") as tmp:
        work = Path(tmp)
        empty, shown = work / "empty.ipynb", work / "same-outputs.ipynb"
        _empty_notebook(empty, cells)
        notebooks = {}
        for name, env in envs.items():
            folder = work / name.replace(" ", "-")
            folder.mkdir()
            notebooks[name] = nb = folder / "state-heavy.ipynb"
            shutil.copyfile(NOTEBOOK, nb)
            run_notebook(nb, kernel="audit", env=env, output=folder / "executed.ipynb")
            run_notebook(nb, kernel="repeat", env=env)  # warm-up, not counted
        _same_outputs_notebook(folder / "executed.ipynb", shown)
        run_notebook(empty, kernel="python3")
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            samples["python3 empty"].append(run_notebook(empty, kernel="python3").cell_seconds)
            samples["python3 same outputs"].append(run_notebook(shown, kernel="python3").cell_seconds)
            for name in order:
                samples[name].append(run_notebook(notebooks[name], kernel="repeat", env=envs[name]).cell_seconds)
    empty_rounds, shown_rounds = samples["python3 empty"], samples["python3 same outputs"]
    summary: dict[str, Any] = {"rounds": rounds, "cells": cells, "per_round": samples, "contenders": {}}
    for name, runs in samples.items():
        typical = [statistics.median(run[1:]) for run in runs]
        totals = [sum(run) for run in runs]
        summary["contenders"][name] = {
            "median_cell_2_12_s": statistics.median(typical),
            "total_s": statistics.median(totals),
            "cell_ratio": statistics.median(t / statistics.median(e[1:]) for t, e in zip(typical, empty_rounds)),
            "cell_ratio_same_outputs": statistics.median(t / statistics.median(o[1:]) for t, o in zip(typical, shown_rounds)),
            "total_ratio": statistics.median(t / sum(e) for t, e in zip(totals, empty_rounds)),
            "first_cell_s": statistics.median(run[0] for run in runs),
        }
    return summary


def print_replay_ratio(summary: dict[str, Any]) -> None:
    print(f"rounds: {summary['rounds']}, {summary['cells']} cells each; ratios are per round against its empty cells, then medians")
    print(f"{'':<22} {'cell 2-12 ms':>12} {'x empty':>8} {'x same outputs':>14} {'cell 1 ms':>9} {'12 cells ms':>11} {'x empty':>8}")
    for name, c in summary["contenders"].items():
        print(f"{name:<22} {c['median_cell_2_12_s'] * 1e3:>12.2f} {c['cell_ratio']:>8.2f} {c['cell_ratio_same_outputs']:>14.2f} "
              f"{c['first_cell_s'] * 1e3:>9.2f} {c['total_s'] * 1e3:>11.2f} {c['total_ratio']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--replay-ratio", action="store_true", help="replayed cells against empty python3 cells only")
    parser.add_argument("--compare", type=Path, metavar="TREE", help="with --replay-ratio: also the repeat kernel of this checkout")
    parser.add_argument("--against", type=Path, metavar="TREE",
                        help="with --replay-ratio: the checkout measured as 'after' (default: the one this interpreter imports)")
    args = parser.parse_args()
    if args.replay_ratio:
        ratio = replay_ratio(args.runs, args.compare, args.against)
        print_replay_ratio(ratio)
        if args.json:
            args.json.write_text(json.dumps(ratio, indent=1))
        return
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
