"""What both NBRewind kernels share: the session wiring and the `%nbrewind` magic.

Every decision lives in `nbrewind.session`; this class only translates between
ipykernel's request handlers and the session, and owns the patches it installs
(an ExitStack undone at shutdown).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, ClassVar

from ipykernel.ipkernel import IPythonKernel

from nbrewind._version import __version__
from nbrewind.session import COMM_TARGET, Session
from nbrewind.tasks.priority import auto_priority_for_new_clients

#: Longest the writer's backlog may take to drain when the kernel replies to a cell (seconds).
#: Jupyter clients send SIGTERM half-way through their shutdown wait (5 s by default) and
#: SIGKILL at its end; the kernel holds off SIGTERM while it finishes writing, so a backlog
#: this short is durable before the kill. NBREWIND_BACKLOG_SECONDS overrides it.
BACKLOG_SECONDS = 2.0


def _backlog_bound() -> float:
    try:
        return float(os.environ.get("NBREWIND_BACKLOG_SECONDS", BACKLOG_SECONDS))
    except ValueError:
        return BACKLOG_SECONDS


class NbrewindKernel(IPythonKernel):
    """IPythonKernel with an NBRewind session attached."""

    implementation = "nbrewind"
    implementation_version = __version__
    mode: ClassVar[str] = "audit"

    def __init__(self, **kwargs: Any) -> None:
        namespace = Session.make_namespace(self.mode)
        if namespace is not None and kwargs.get("user_ns") is None:  # IPKernelApp passes user_ns=None
            kwargs["user_ns"] = namespace
        super().__init__(**kwargs)
        self._patches = contextlib.ExitStack()
        self._backlog_seconds = _backlog_bound()
        self._shutting_down = False
        self._frozen = False
        self._sigterm_before: Any = None
        if threading.current_thread() is threading.main_thread():
            self._sigterm_before = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._patches.callback(self._restore_sigterm)  # undone last: after the final flush
        # The kernel's logger writes to the terminal; fd 2 itself is piped into cell outputs.
        self.nbrewind = Session.for_shell(self.shell, mode=self.mode, emit=self._emit, log=self.log.warning)
        self._patches.callback(self.nbrewind.close)
        self._patches.enter_context(self.nbrewind.observe_sends(self.session))
        # Every distributed Client the notebook creates bumps what it waits for
        # (docs/priority.md); the dask config key nbrewind.auto-priority switches it off.
        self._patches.enter_context(auto_priority_for_new_clients())
        assert self.shell is not None
        self.shell.register_magic_function(self.nbrewind.magic, magic_kind="line", magic_name="nbrewind")
        # A frontend asks what the kernel would do, or what the store holds (docs/reply-metadata.md).
        self.comm_manager.register_target(COMM_TARGET, self._on_comm_open)
        self._patches.callback(self.comm_manager.unregister_target, COMM_TARGET, self._on_comm_open)

    def _on_comm_open(self, comm: Any, open_msg: dict[str, Any]) -> None:
        """Answer each message on an ``nbrewind`` comm with one message (`Session.answer`)."""

        def on_msg(msg: dict[str, Any]) -> None:
            comm.send(self.nbrewind.answer((msg.get("content") or {}).get("data")))

        comm.on_msg(on_msg)
        data = (open_msg.get("content") or {}).get("data")
        if isinstance(data, dict) and data.get("request"):
            on_msg(open_msg)

    def _emit(self, msg_type: str, content: dict[str, Any], metadata: dict[str, Any], buffers: list[bytes]) -> None:
        """Publish one recorded output message on IOPub as a child of the current request."""
        assert self.session is not None
        self.session.send(
            self.iopub_socket,
            msg_type,
            content,
            parent=self.get_parent("shell"),
            metadata=metadata,
            buffers=list(buffers) or None,
            ident=self._topic(msg_type),
        )

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        parent = self.get_parent("shell")
        msg_id = (parent.get("header") or {}).get("msg_id") if parent else None
        plan = self.nbrewind.begin(code, silent=silent, store_history=store_history, cell_id=cell_id, msg_id=msg_id)
        if not self._frozen:
            self._freeze_startup_objects()
        if plan.replay:
            try:
                reply = self.nbrewind.replay(plan)
            except Exception as exc:  # the one boundary: never leave a request without a reply
                self.nbrewind.notice(f"NBRewind warning: the replay failed ({type(exc).__name__}: {exc}); running the cell.")
                plan = self.nbrewind.begin(code, silent=True)
                reply = None
            if reply is not None:
                if user_expressions and reply.get("status") == "ok" and self.shell is not None:
                    reply["user_expressions"] = self.shell.user_expressions(user_expressions)
                return reply
        reply = await super().do_execute(
            code, silent, store_history, user_expressions, allow_stdin, cell_meta=cell_meta, cell_id=cell_id
        )
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        self.nbrewind.finish(plan, reply)
        # Before the reply: a client that shuts the kernel down after its last cell
        # (nbclient, papermill) kills it a few seconds later, so keep what is left short.
        self.nbrewind.writer.wait_for_backlog(self._backlog_seconds)
        return reply

    def _freeze_startup_objects(self) -> None:
        """Move what the kernel, ipykernel and the open session allocated so far out of the
        cyclic collector's reach (`gc.freeze`), before the first cell's code runs.

        NBRewind's machinery adds thousands of long-lived objects that every full collection
        would walk again, in the middle of the notebook's imports and cells: measured on
        `import pandas` plus a matplotlib figure, 0.13 s of collections against 0.07 s on a
        plain kernel, and 0.04-0.06 s once frozen. Nothing the notebook makes is frozen: its
        garbage is collected as on a plain kernel. Undone at shutdown."""
        self._frozen = True
        gc.freeze()
        self._patches.callback(gc.unfreeze)

    def finish_metadata(self, parent: dict[str, Any], metadata: dict[str, Any], reply_content: dict[str, Any]) -> dict[str, Any]:
        """ipykernel's reply metadata, plus ``nbrewind``: what this kernel did with the
        request (docs/reply-metadata.md), for execute replies only."""
        metadata = super().finish_metadata(parent, metadata, reply_content)
        header = parent.get("header") or {}
        if header.get("msg_type") == "execute_request":
            info = self.nbrewind.reply_metadata(header.get("msg_id"))
            if info is not None:
                metadata["nbrewind"] = info
        return metadata

    def do_complete(self, code: str, cursor_pos: int | None) -> dict[str, Any]:  # type: ignore[override]
        reply = super().do_complete(code, cursor_pos)
        return self.nbrewind.complete_pending(code, cursor_pos, reply)

    def do_shutdown(self, restart: bool) -> dict[str, Any]:  # type: ignore[override]
        """Make every recorded cell durable (the writer's backlog), then shut down.

        Runs on ipykernel's control thread. The client's SIGTERM, which comes half-way
        through its shutdown wait, is held off meanwhile; its SIGKILL still ends a
        kernel that takes longer.
        """
        self._shutting_down = True
        self._patches.close()
        return super().do_shutdown(restart)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._shutting_down:
            return  # do_shutdown is finishing the writes; the process exits right after
        before = self._sigterm_before
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)

    def _restore_sigterm(self) -> None:
        # Only the main thread may set handlers; a shutdown request arrives on the
        # control thread, and the process ends right after it anyway.
        if threading.current_thread() is threading.main_thread() and self._sigterm_before is not None:
            signal.signal(signal.SIGTERM, self._sigterm_before)
