"""What a frontend may ask the kernel between cells: a forecast of the notebook, the store's log.

JupyterLab's extension (and any other frontend) opens a comm with target ``nbrewind``
and sends requests as comm messages; each gets one reply with the same ``id``. The
contract is in docs/reply-metadata.md ("Asking the kernel"). A request never runs a
cell and never changes the kernel's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbrewind.store.report import cell_log

if TYPE_CHECKING:
    from nbrewind.session.core import Session

__all__ = ["COMM_TARGET", "VERSION", "answer"]

COMM_TARGET = "nbrewind"
VERSION = 1


def answer(session: Session, request: Any) -> dict[str, Any]:
    """The reply to one comm request (a dict with ``request`` and ``id``); an ``error``
    reply, naming the problem, for anything malformed or failing."""
    rid = request.get("id") if isinstance(request, dict) else None
    try:
        if not isinstance(request, dict):
            raise ValueError("a request is a JSON object with 'request' and 'id'")
        kind = request.get("request")
        if kind == "plan":
            return {"reply": "plan", "id": rid, "version": VERSION, **plan_reply(session, request.get("cells"))}
        if kind == "log":
            return {"reply": "log", "id": rid, "version": VERSION, "sessions": log_reply(session)}
        raise ValueError(f"unknown request {kind!r}; this kernel answers 'plan' and 'log'")
    except Exception as exc:
        return {"reply": "error", "id": rid, "message": f"{type(exc).__name__}: {exc}"}


def plan_reply(session: Session, cells: Any) -> dict[str, Any]:
    """The forecast of `cells` (a list of {"cell_id", "code"}) as JSON."""
    if not isinstance(cells, list) or not all(isinstance(c, dict) and isinstance(c.get("code"), str) for c in cells):
        raise ValueError("'cells' must be a list of {'cell_id': ..., 'code': '...'}")
    pairs = [(c.get("cell_id") if isinstance(c.get("cell_id"), str) else None, c["code"]) for c in cells]
    return {"kernel": session.mode, "cells": [f.to_json() for f in session.forecast(pairs)]}


def log_reply(session: Session) -> list[dict[str, Any]]:
    """The store's sessions, newest first, each with its cell runs in order."""
    session.writer.flush()
    grouped: dict[str | None, list[dict[str, Any]]] = {}
    info: dict[str | None, dict[str, Any]] = {}
    for row in cell_log(session.store):
        if row.session not in info:
            info[row.session] = {"session": row.session, "kernel": row.kernel, "started": row.started, "current": row.session == session.session_id}
        grouped.setdefault(row.session, []).append({
            "cell_run": row.id,
            "execution_count": row.execution_count,
            "cell_id": row.cell_id,
            "decision": "ran" if row.decision == "executed" else row.decision,
            "status": row.status,
            "reason": row.reason,
            "duration": row.duration,
            "saved": row.saved,
            "code": (row.code.strip().splitlines() or [""])[0],
        })
    return [{**info[s], "cells": grouped[s]} for s in reversed(list(info))]
