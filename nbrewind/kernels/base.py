"""What both NBRewind kernels share: the session wiring and the `%nbrewind` magic.

Every decision lives in `nbrewind.session`; this class only translates between
ipykernel's request handlers and the session, and owns the patches it installs
(an ExitStack undone at shutdown).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, ClassVar

from ipykernel.ipkernel import IPythonKernel

from nbrewind._version import __version__
from nbrewind.session import Session


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
        self.nbrewind = Session.for_shell(self.shell, mode=self.mode, emit=self._emit)
        self._patches.callback(self.nbrewind.close)
        self._patches.enter_context(self.nbrewind.observe_sends(self.session))
        assert self.shell is not None
        self.shell.register_magic_function(self.nbrewind.magic, magic_kind="line", magic_name="nbrewind")

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
        return reply

    def do_complete(self, code: str, cursor_pos: int | None) -> dict[str, Any]:  # type: ignore[override]
        reply = super().do_complete(code, cursor_pos)
        return self.nbrewind.complete_pending(code, cursor_pos, reply)

    def do_shutdown(self, restart: bool) -> dict[str, Any]:  # type: ignore[override]
        self._patches.close()
        return super().do_shutdown(restart)
