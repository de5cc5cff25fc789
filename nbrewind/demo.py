"""`jupyter nbrewind demo`: audit a bundled notebook, change one of its parameters, repeat
it, and show per cell what replayed, what ran, the audit and repeat times and the time
saved. The folder is kept, so the report command it ends with can be run."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nbrewind.run import run_notebook
from nbrewind.store import Store
from nbrewind.store.report import LogRow, cell_log

DEMO_NOTEBOOK = Path(__file__).resolve().parent / "_demo" / "demo.ipynb"
PARAMETER, OLD_VALUE, NEW_VALUE = "REDUCER", "max", "min"


@dataclass
class DemoResult:
    """Both runs' wall times, each cell's audit and repeat record, and what was saved."""

    folder: str
    audit_seconds: float
    repeat_seconds: float
    edited_cell: int
    """The code cell (1-based) holding the parameter that was changed."""
    rows: list[LogRow]
    """The repeat run's records, one per code cell."""
    audit_rows: list[LogRow] = field(default_factory=list)
    parameter: str = PARAMETER
    old_value: str = OLD_VALUE
    new_value: str = NEW_VALUE
    saved_seconds: float = 0.0
    report_command: str = ""


def run_demo(folder: str | None = None, *, keep: bool = True) -> DemoResult:
    """Copy the demo notebook to `folder` (a new temporary folder by default), audit it,
    change the parameter in the cell tagged ``parameters``, and repeat it. The folder is
    kept unless `keep` is false and it is a temporary one."""
    import nbformat

    work = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="nbrewind-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    notebook = work / "demo.ipynb"
    shutil.copyfile(DEMO_NOTEBOOK, notebook)
    store_path = work / "demo.ipynb.nbrewind"
    try:
        audit = run_notebook(notebook, kernel="audit", store=store_path, quiet=True)
        nb = nbformat.read(notebook, as_version=4)
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        edited = next(i for i, c in enumerate(code_cells) if "parameters" in c.metadata.get("tags", []))
        before, after = f"{PARAMETER} = {OLD_VALUE}", f"{PARAMETER} = {NEW_VALUE}"
        code_cells[edited].source = code_cells[edited].source.replace(before, after)
        nbformat.write(nb, str(notebook))
        repeat = run_notebook(notebook, kernel="repeat", store=store_path, output=work / "demo.repeat.ipynb", quiet=True)
        with Store.open(store_path, create=False) as store:
            everything = cell_log(store)
            rows = cell_log(store, last_session=True)
    finally:
        if not keep and folder is None:
            shutil.rmtree(work, ignore_errors=True)
    audit_rows = [r for r in everything if r.session == everything[0].session] if everything else []
    report = work / "demo-report.html"
    return DemoResult(
        str(work), audit.seconds, repeat.seconds, edited + 1, rows, audit_rows,
        saved_seconds=sum(r.saved for r in rows),
        report_command=f"jupyter nbrewind report {notebook} -o {report}" if keep or folder else "",
    )


def format_demo(result: DemoResult) -> str:
    """The table the README shows: per cell, what the repeat did and what it saved."""
    lines = [
        f"Audited the demo notebook ({result.audit_seconds:.1f} s wall, kernel start included), changed the "
        f"parameter {result.parameter} = {result.old_value} -> {result.parameter} = {result.new_value} in code cell "
        f"{result.edited_cell}, and repeated it ({result.repeat_seconds:.1f} s wall).",
        "",
        f"{'cell':>4}  {'repeat':<9} {'audit':>9} {'repeat':>9} {'saved':>9}  {'tasks hit/miss':>14}  why",
    ]
    for number, row in enumerate(result.rows, start=1):
        audited = result.audit_rows[number - 1].duration if number <= len(result.audit_rows) else None
        tasks = f"{row.task_hits}/{row.task_misses}" if (row.task_hits or row.task_misses) else "-"
        lines.append(
            f"{number:>4}  {row.decision or '':<9} {_ms(audited):>9} {_ms(row.duration):>9} "
            f"{_ms(row.saved) if row.saved else '-':>9}  {tasks:>14}  {row.why}"
        )
    replayed = sum(r.decision == "replayed" for r in result.rows)
    hits = sum(r.task_hits for r in result.rows)
    lines += [
        "",
        f"{replayed} of {len(result.rows)} cells replayed from the store; the rest ran"
        + (f", loading {hits} Dask task result(s) from the cache" if hits else "")
        + f". Time saved against the audit: {_ms(result.saved_seconds)}.",
    ]
    if result.report_command:
        lines += [f"The folder {result.folder} is kept. Open the report:", f"  {result.report_command}"]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
