"""`%nbrewind`: status, why, log, off/on, restore and priority, rendered as plain text.

A wrong subcommand or argument is IPython's UsageError, so the cell fails (status
"error") with one line instead of printing usage and succeeding.
"""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.store.report import LogRow, cell_log, format_log, format_tasks, task_rows

if TYPE_CHECKING:
    from nbrewind.session.core import Session

USAGE = (
    "usage: %nbrewind status | why [N] | log [--tasks] | plan NOTEBOOK.ipynb | off | on "
    "| restore <execution count | cell id | #cell run> | priority on|off"
)


def _usage_error(message: str) -> Exception:
    """IPython's UsageError (one line, the cell fails) when IPython is loaded, as it is in
    every kernel; a ValueError elsewhere. Looked up, not imported: the session does not
    import IPython at run time."""
    error = getattr(sys.modules.get("IPython.core.error"), "UsageError", ValueError)
    return error(f"{message}\n{USAGE}")


def run_magic(session: Session, line: str) -> None:
    """Print the answer to one `%nbrewind` command; raise UsageError for a wrong one."""
    args = shlex.split(line)
    command, rest = (args[0], args[1:]) if args else ("status", [])
    if command == "status" and not rest:
        print(status_text(session))
    elif command == "why" and not rest:
        last = session.last
        if last is None:
            print("no cell has been recorded yet in this kernel")
        else:
            print(f"In [{last.execution_count}]: {last.decision}: {last.reason}")
    elif command == "why" and len(rest) == 1:
        print(why_text(session, rest[0]))
    elif command == "log" and rest in ([], ["--tasks"]):
        session.writer.flush()
        rows = cell_log(session.store, session=session.session_id)
        print(format_log(rows))
        if rest:
            print()
            print(format_tasks(task_rows(session.store, [r.id for r in rows])))
    elif command == "off" and not rest:
        session.enabled = False
        print("NBRewind recording is paused; `%nbrewind on` resumes it")
    elif command == "on" and not rest:
        session.enabled = True
        print("NBRewind recording is on")
    elif command == "restore" and len(rest) == 1:
        print(session.restore(rest[0]))
    elif command == "plan" and len(rest) == 1:
        print(plan_text(session, rest[0]))
    elif command == "priority" and rest in (["on"], ["off"]):
        print(set_priority(rest[0] == "on"))
    elif command in ("status", "why", "log", "plan", "off", "on", "restore", "priority"):
        raise _usage_error(f"%nbrewind {command}: wrong arguments {' '.join(rest) or '(none)'}")
    else:
        raise _usage_error(f"%nbrewind: unknown subcommand {command!r}")


def plan_text(session: Session, notebook: str) -> str:
    """Which code cells of `notebook` this kernel would replay or run if they were sent now,
    in order (`Session.forecast`): one line each."""
    import json
    from pathlib import Path

    path = Path(notebook).expanduser()
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _usage_error(f"%nbrewind plan: cannot read notebook {notebook!r} ({type(exc).__name__})") from None
    code = [c for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"]
    pairs = [(c.get("id"), "".join(c["source"]) if isinstance(c.get("source"), list) else str(c.get("source", ""))) for c in code]
    lines = []
    for f in session.forecast(pairs):
        head = (pairs[f.index][1].strip().splitlines() or [""])[0][:50]
        after = f" (after cell {', '.join(str(i + 1) for i in f.after)})" if f.after else ""
        lines.append(f"cell {f.index + 1:>3}  {f.decision:<8} {f.reason}{after}  | {head}")
    return "\n".join(lines) if lines else f"{notebook} has no code cells"


def why_text(session: Session, which: str) -> str:
    """Why cell In [N] of this kernel was replayed or executed, what the key checked and what it cost."""
    try:
        count = int(which.removeprefix("In[").removeprefix("[").removesuffix("]"))
    except ValueError:
        raise _usage_error(f"%nbrewind why: {which!r} is not an execution count") from None
    session.writer.flush()  # the cell's record may still be in the background writer
    rows = [r for r in cell_log(session.store, session=session.session_id) if r.execution_count == count]
    if not rows:
        raise _usage_error(f"%nbrewind why: no cell In [{count}] was recorded in this kernel")
    return explain(rows[-1])


def explain(row: LogRow) -> str:
    """A cell run's decision in a few lines: the verdict, its reason, its cost."""
    lines = [f"In [{row.execution_count}]: {row.decision}: {row.why}"]
    if row.decision == "replayed":
        recorded = f"{row.recorded_duration * 1000:.1f} ms" if row.recorded_duration is not None else "?"
        lines.append(f"  the recorded run took {recorded}; the replay {(row.duration or 0) * 1000:.1f} ms "
                     f"(saved {row.saved * 1000:.1f} ms)")
    else:
        lines.append(f"  ran in {(row.duration or 0) * 1000:.1f} ms; checkpoint {row.bytes_written or 0:,} bytes written")
    if row.task_hits or row.task_misses:
        lines.append(f"  Dask tasks: {row.task_hits} loaded from the cache, {row.task_misses} computed")
    lines.append(f"  status: {row.status}; the key checks {row.inputs} recorded input(s)")
    return "\n".join(lines)


def set_priority(enabled: bool) -> str:
    """Turn automatic priority bumps of awaited Dask work on or off, and say so."""
    try:
        from nbrewind.tasks.priority import set_auto_priority
    except (ImportError, AttributeError) as exc:
        return f"automatic priority is not available in this NBRewind ({type(exc).__name__}: {exc})"
    set_auto_priority(enabled)
    return f"automatic priority bumps are {'on' if enabled else 'off'} (explicit nbrewind.prioritize calls still work)"


def status_text(session: Session) -> str:
    """Store path, checkpoints, bytes and the last cell's cost, as lines of text."""
    lines = [f"NBRewind {session.mode} kernel; recording {'on' if session.enabled else 'paused'}"]
    try:
        store = session.store
    except Exception as exc:  # the status must render even when the store is broken
        return "\n".join([*lines, f"store: unusable ({type(exc).__name__}: {exc})"])
    runs = store.catalog.cell_runs()
    mine = [r for r in runs if r.session == session.session_id]
    lines.append(f"store: {store.root}")
    lines.append(f"cell runs: {len(runs)} in the store, {len(mine)} in this kernel "
                 f"({sum(r.decision == 'replayed' for r in mine)} replayed, {sum(r.decision == 'executed' for r in mine)} executed)")
    lines.append(f"names in the checkpoint: {sum(not n.startswith('@') for n in session.state.entries)}")
    lines.append(f"bytes written by this kernel: {sum(r.bytes_written or 0 for r in mine):,}")
    jobs, nbytes = session.writer.pending()
    lines.append(f"pending writes: {jobs} cell checkpoints, {nbytes:,} bytes (written in the background; durable when 0)")
    ns = session.namespace
    if isinstance(ns, LazyNamespace):
        lines.append(f"replayed names not loaded yet: {len(ns.pending())}")
    last = session.last
    if last is not None:
        lines.append(
            f"last cell In [{last.execution_count}]: {last.decision} ({last.reason}); "
            f"checkpoint {last.checkpoint_seconds * 1000:.1f} ms, {last.bytes_written:,} bytes"
        )
    return "\n".join(lines)
