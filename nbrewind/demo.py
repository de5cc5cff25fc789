"""`jupyter nbrewind demo`: audit a bundled notebook, edit one cell, repeat it, and show
which cells were replayed and which ran."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nbrewind.run import run_notebook
from nbrewind.store import Store
from nbrewind.store.report import LogRow, cell_log

DEMO_NOTEBOOK = Path(__file__).resolve().parent / "_demo" / "demo.ipynb"
EDIT_FROM, EDIT_TO = "combined = delayed(max)(means)", "combined = delayed(min)(means)"


@dataclass
class DemoResult:
    """Both runs' wall times and the repeat run's per-cell decisions."""

    folder: str
    audit_seconds: float
    repeat_seconds: float
    edited_cell: int
    rows: list[LogRow]


def run_demo(folder: str | None = None, *, keep: bool = False) -> DemoResult:
    """Copy the demo notebook to `folder` (a temp dir by default), audit, edit, repeat."""
    import nbformat

    work = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="nbrewind-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    notebook = work / "demo.ipynb"
    shutil.copyfile(DEMO_NOTEBOOK, notebook)
    try:
        audit = run_notebook(notebook, kernel="audit", quiet=True)
        nb = nbformat.read(notebook, as_version=4)
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        edited = next(i for i, c in enumerate(code_cells) if EDIT_FROM in c.source)
        code_cells[edited].source = code_cells[edited].source.replace(EDIT_FROM, EDIT_TO)
        nbformat.write(nb, str(notebook))
        repeat = run_notebook(notebook, kernel="repeat", output=work / "demo.repeat.ipynb", quiet=True)
        with Store.open(work / "demo.ipynb.nbrewind", create=False) as store:
            rows = cell_log(store, last_session=True)
    finally:
        if not keep and folder is None:
            shutil.rmtree(work, ignore_errors=True)
    return DemoResult(str(work), audit.seconds, repeat.seconds, edited + 1, rows)


def format_demo(result: DemoResult) -> str:
    """The table the README shows."""
    lines = [
        f"Audited the demo notebook ({result.audit_seconds:.1f} s wall, kernel start included), "
        f"changed code cell {result.edited_cell} ({EDIT_FROM!r} -> {EDIT_TO!r}), and repeated it "
        f"({result.repeat_seconds:.1f} s wall).",
        "",
        f"{'cell':>4}  {'decision':<9} {'time':>9}  {'tasks hit/miss':>14}  why",
    ]
    for number, row in enumerate(result.rows, start=1):
        tasks = f"{row.task_hits}/{row.task_misses}" if (row.task_hits or row.task_misses) else "-"
        took = f"{(row.duration or 0) * 1000:.1f} ms"
        lines.append(f"{number:>4}  {row.decision or '':<9} {took:>9}  {tasks:>14}  {row.reason or ''}")
    replayed = sum(r.decision == "replayed" for r in result.rows)
    lines += ["", f"{replayed} of {len(result.rows)} cells replayed from the store; the rest ran."]
    return "\n".join(lines)
