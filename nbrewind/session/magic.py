"""`%nbrewind`: status, why, log, off/on and restore, rendered as plain text."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.store.report import cell_log, format_log

if TYPE_CHECKING:
    from nbrewind.session.core import Session

USAGE = """usage: %nbrewind status | why | log | off | on | restore <execution count | cell id>"""


def run_magic(session: Session, line: str) -> None:
    """Print the answer to one `%nbrewind` command."""
    args = shlex.split(line)
    command = args[0] if args else "status"
    if command == "status":
        print(status_text(session))
    elif command == "why":
        last = session.last
        if last is None:
            print("no cell has been recorded yet in this kernel")
        else:
            print(f"In [{last.execution_count}]: {last.decision}: {last.reason}")
    elif command == "log":
        print(format_log(cell_log(session.store, session=session.session_id)))
    elif command == "off":
        session.enabled = False
        print("NBRewind recording is paused; `%nbrewind on` resumes it")
    elif command == "on":
        session.enabled = True
        print("NBRewind recording is on")
    elif command == "restore" and len(args) == 2:
        print(session.restore(args[1]))
    else:
        print(USAGE)


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
