"""Capture a cell's IOPub output messages while it runs, store them, and replay them.

The kernel sends every output through one `jupyter_client.Session.send`; wrapping
that method for the kernel's lifetime (and restoring it on exit) sees stdout and
stderr streams from the IOPub thread, display data, execute results and errors,
each tagged with the request that caused it. Captures are keyed by the request's
msg_id because ipykernel 7 can handle requests concurrently.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

OUTPUT_TYPES = frozenset(
    {"stream", "display_data", "update_display_data", "clear_output", "execute_result", "error"}
)

_FORMAT = "nbrewind-outputs/1"


@dataclass
class OutputMessage:
    """One recorded IOPub message: what the frontend needs to show it again."""

    msg_type: str
    content: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    buffers: list[bytes] = field(default_factory=list)


class OutputCapture:
    """Collects output messages per parent msg_id while a capture for it is open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, list[OutputMessage]] = {}
        self.failures = 0
        self._incomplete: set[str] = set()

    def start(self, msg_id: str) -> None:
        """Begin recording messages whose parent is `msg_id`."""
        with self._lock:
            self._active[msg_id] = []

    def stop(self, msg_id: str) -> list[OutputMessage]:
        """End recording for `msg_id` and return its messages in send order."""
        with self._lock:
            return self._active.pop(msg_id, [])

    def complete(self, msg_id: str) -> bool:
        """Whether every message sent while `msg_id` was recorded was recorded (ask after
        `stop`). A record missing one would replay less than the cell showed."""
        with self._lock:
            if msg_id in self._incomplete:
                self._incomplete.discard(msg_id)
                return False
            return True

    def observe(self, msg: dict[str, Any] | None, buffers: list[Any] | None) -> None:
        """Record `msg` if it is an output message of an open capture."""
        if not msg or not self._active:
            return
        msg_type = msg.get("msg_type") or (msg.get("header") or {}).get("msg_type")
        if msg_type not in OUTPUT_TYPES:
            return
        parent_id = (msg.get("parent_header") or {}).get("msg_id")
        with self._lock:
            bucket = self._active.get(parent_id) if parent_id else None
            if bucket is None:
                return
            bucket.append(
                OutputMessage(
                    msg_type=msg_type,
                    content=_plain(msg.get("content") or {}),
                    metadata=_plain(msg.get("metadata") or {}),
                    buffers=[bytes(b) for b in (buffers or msg.get("buffers") or [])],
                )
            )

    @contextlib.contextmanager
    def observing(self, session: Any) -> Iterator[None]:
        """Wrap `session.send` so every sent message passes through `observe`; undone on exit."""
        original: Callable[..., Any] = session.send
        had_instance_attr = "send" in vars(session)
        signature = inspect.signature(original)
        at = _positional_index(signature, "buffers")

        def send(*args: Any, **kwargs: Any) -> Any:
            msg = original(*args, **kwargs)
            if not self._active:
                return msg  # nothing to record (a replay, a status message between cells): no cost
            try:
                if "buffers" in kwargs:
                    buffers = kwargs["buffers"]
                elif at is not None:
                    buffers = args[at] if len(args) > at else None
                else:
                    buffers = signature.bind_partial(*args, **kwargs).arguments.get("buffers")
                self.observe(msg, buffers)
            except Exception:  # recording must never break the kernel's messaging
                with self._lock:
                    self.failures += 1
                    self._incomplete.update(self._active)  # whichever it belonged to is incomplete
            return msg

        session.send = send
        try:
            yield
        finally:
            if had_instance_attr:
                session.send = original
            else:
                del session.send


def _positional_index(signature: inspect.Signature, name: str) -> int | None:
    """Where parameter `name` sits among the positional arguments of a call (None when it
    cannot be passed positionally, or a ``*args`` before it makes that unknowable)."""
    for i, param in enumerate(signature.parameters.values()):
        if param.kind is param.VAR_POSITIONAL:
            return None
        if param.name == name:
            return i if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) else None
    return None


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON-safe deep copy made as jupyter_client serializes content for the wire (bytes
    as base64, datetimes in ISO form), so a replay sends what the frontend received."""
    from jupyter_client.jsonutil import json_default  # the kernel has it loaded already

    plain: dict[str, Any] = json.loads(json.dumps(value, default=json_default))
    return plain


def encode_outputs(messages: list[OutputMessage], result: dict[str, Any] | None = None) -> tuple[bytes, list[bytes]]:
    """Messages -> (JSON payload, binary buffers in order) for storage as one tree object;
    `result` is what was kept of the value the cell put into IPython's output history."""
    items = []
    buffers: list[bytes] = []
    for m in messages:
        items.append(
            {
                "msg_type": m.msg_type,
                "content": m.content,
                "metadata": m.metadata,
                "buffers": list(range(len(buffers), len(buffers) + len(m.buffers))),
            }
        )
        buffers.extend(m.buffers)
    doc: dict[str, Any] = {"format": _FORMAT, "messages": items}
    if result is not None:
        doc["result"] = result
    payload = json.dumps(doc, sort_keys=True).encode()
    return payload, buffers


def decode_outputs(payload: bytes, buffers: list[bytes]) -> list[OutputMessage]:
    """Inverse of `encode_outputs` (the messages; `decode_recorded` gives the result too)."""
    return decode_recorded(payload, buffers.__getitem__)[0]


def decode_recorded(payload: bytes, buffer: Callable[[int], bytes]) -> tuple[list[OutputMessage], dict[str, Any] | None]:
    """The messages and the kept result of one `encode_outputs` payload, parsed once.

    `buffer(i)` gives the i-th binary buffer; only those the messages name are asked for, so a
    stored result after them is not read."""
    doc = json.loads(payload)
    if doc.get("format") != _FORMAT:
        raise ValueError(f"unknown outputs format {doc.get('format')!r}")
    messages = [
        OutputMessage(
            msg_type=item["msg_type"],
            content=item["content"],
            metadata=item["metadata"],
            buffers=[buffer(i) for i in item["buffers"]],
        )
        for item in doc["messages"]
    ]
    result = doc.get("result")
    return messages, result if isinstance(result, dict) else None


def for_replay(message: OutputMessage, execution_count: int) -> OutputMessage:
    """The message as a replay sends it: an execute_result carries the current count."""
    if message.msg_type != "execute_result":
        return message
    content = dict(message.content)
    content["execution_count"] = execution_count
    return OutputMessage(message.msg_type, content, message.metadata, message.buffers)
