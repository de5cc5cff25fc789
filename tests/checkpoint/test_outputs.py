"""Tests for nbrewind.checkpoint.outputs: capture a cell's IOPub outputs, store them, replay them.

Real parts only: a real ``jupyter_client.Session`` (signing, serializing) sending
on real ZMQ sockets (``inproc`` PAIR pairs), whose receiving end deserializes
what a frontend would get; stored outputs go into a real store in ``tmp_path``
as the session stores them (one blob per buffer, one tree holding the payload).
The property that matters: a replayed message reaches the frontend as the
original did (only an ``execute_result``'s count changes).
"""

from __future__ import annotations

import base64
import datetime
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from jupyter_client.session import Session

from nbrewind.checkpoint.outputs import (
    OUTPUT_TYPES,
    OutputCapture,
    OutputMessage,
    decode_outputs,
    decode_recorded,
    encode_outputs,
    for_replay,
)
from nbrewind.store import Store


class Wire:
    """A Session and a PAIR of inproc sockets: what `send` puts on one end, `receive` reads on the other."""

    _count = 0

    def __init__(self, context: zmq.Context[Any], session: Session) -> None:
        Wire._count += 1
        address = f"inproc://nbrewind-outputs-{id(self)}-{Wire._count}"
        self.session = session
        self.out = context.socket(zmq.PAIR)
        self.out.bind(address)
        self.into = context.socket(zmq.PAIR)
        self.into.connect(address)

    def send(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None, **kwargs: Any) -> None:
        self.session.send(self.out, msg_type, content, parent=parent, **kwargs)

    def receive(self) -> dict[str, Any]:
        """The next message as a frontend deserializes it (buffers as bytes)."""
        if not self.into.poll(10_000):
            raise TimeoutError("nothing arrived on the socket")
        _, parts = self.session.feed_identities(self.into.recv_multipart(copy=True), copy=True)
        msg = self.session.deserialize(parts)
        msg["buffers"] = [bytes(b) for b in msg["buffers"]]
        return msg

    def close(self) -> None:
        self.out.close(linger=0)
        self.into.close(linger=0)


@pytest.fixture
def session() -> Session:
    return Session(key=b"test-key")


@pytest.fixture
def wire(session: Session) -> Iterator[Wire]:
    context: zmq.Context[Any] = zmq.Context()
    w = Wire(context, session)
    yield w
    w.close()
    context.term()


def request(session: Session) -> dict[str, Any]:
    """An execute_request to be the parent of outputs."""
    return session.msg("execute_request", {"code": "cell"})


def msg_id_of(msg: dict[str, Any]) -> str:
    return str(msg["header"]["msg_id"])


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


def sample_outputs(parent: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any], list[bytes]]]:
    """(msg_type, content, metadata, buffers) of one of each output type, as ipykernel sends them."""
    return [
        ("stream", {"name": "stdout", "text": "hello ünïcode ✓\n"}, {}, []),
        ("stream", {"name": "stderr", "text": "warned\n"}, {}, []),
        (
            "display_data",
            {
                "data": {"image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure>"},
                "metadata": {"image/png": {"width": 10}},
                "transient": {"display_id": "d1"},
            },
            {"tag": 1},
            [],
        ),
        ("update_display_data", {"data": {"text/plain": "2"}, "metadata": {}, "transient": {"display_id": "d1"}}, {}, []),
        ("display_data", {"data": {"application/x-binary": "see buffers"}, "metadata": {}}, {}, [b"\x00\x01\xff", PNG]),
        ("clear_output", {"wait": True}, {}, []),
        ("execute_result", {"data": {"text/plain": "42"}, "metadata": {}, "execution_count": 3}, {}, []),
        ("error", {"ename": "ValueError", "evalue": "boom", "traceback": ["Traceback", "ValueError: boom"]}, {}, []),
    ]


def capture_and_receive(
    capture: OutputCapture, wire: Wire, parent: dict[str, Any],
    outputs: list[tuple[str, dict[str, Any], dict[str, Any], list[bytes]]],
) -> tuple[list[OutputMessage], list[dict[str, Any]]]:
    """Send `outputs` as children of `parent` while a capture observes; return (captured, received)."""
    capture.start(msg_id_of(parent))
    with capture.observing(wire.session):
        for msg_type, content, metadata, buffers in outputs:
            wire.send(msg_type, content, parent, metadata=metadata, buffers=buffers or None)
    captured = capture.stop(msg_id_of(parent))
    return captured, [wire.receive() for _ in outputs]


def store_and_load(root: Path, messages: list[OutputMessage]) -> list[OutputMessage]:
    """Store outputs as the session does (blobs + one tree), then read them back as a replay does."""
    payload, buffers = encode_outputs(messages)
    with Store.open(root, create=True) as store:
        objects = store.objects
        blobs = [objects.stage_blob(b) for b in buffers]
        tree = objects.stage_tree([b.digest for b in blobs], payload)
        for staged in [*blobs, tree]:
            objects.commit(staged)
    with Store.open(root, create=False) as store:
        children, stored_payload = store.objects.get_tree(tree.digest)
        return decode_outputs(stored_payload, [bytes(store.objects.get_blob(c)) for c in children])


def as_frontend_sees(received: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any], list[bytes]]:
    return received["msg_type"], received["content"], received["metadata"], received["buffers"]


# -- capture -------------------------------------------------------------------------------------


def test_capture_records_every_output_type_in_send_order(session: Session, wire: Wire) -> None:
    """Each output message of the request is recorded, in order, equal to what went on the wire."""
    capture = OutputCapture()
    parent = request(session)
    outputs = sample_outputs(parent)
    captured, received = capture_and_receive(capture, wire, parent, outputs)
    assert {m[0] for m in outputs} == OUTPUT_TYPES
    assert [m.msg_type for m in captured] == [m[0] for m in outputs]
    for message, got in zip(captured, received, strict=True):
        assert (message.msg_type, message.content, message.metadata, message.buffers) == as_frontend_sees(got)
    assert capture.failures == 0


def test_messages_that_are_not_outputs_or_not_of_the_request_are_ignored(session: Session, wire: Wire) -> None:
    """Status, execute_input, comm and unknown message types, other requests' outputs and
    outputs with no parent are not recorded; the open capture keeps only its own."""
    capture = OutputCapture()
    parent, other = request(session), request(session)
    capture.start(msg_id_of(parent))
    with capture.observing(session):
        wire.send("status", {"execution_state": "busy"}, parent)
        wire.send("execute_input", {"code": "cell", "execution_count": 1}, parent)
        wire.send("comm_msg", {"comm_id": "c", "data": {}}, parent, buffers=[b"x"])
        wire.send("nbrewind_custom", {"anything": 1}, parent)
        wire.send("stream", {"name": "stdout", "text": "someone else's\n"}, other)
        wire.send("stream", {"name": "stdout", "text": "no parent\n"}, None)
        wire.send("stream", {"name": "stdout", "text": "mine\n"}, parent)
    captured = capture.stop(msg_id_of(parent))
    assert [(m.msg_type, m.content["text"]) for m in captured] == [("stream", "mine\n")]
    sent = [wire.receive()["msg_type"] for _ in range(7)]  # everything was still sent
    assert sent == ["status", "execute_input", "comm_msg", "nbrewind_custom", "stream", "stream", "stream"]


def test_a_capture_sees_nothing_before_start_or_after_stop(session: Session, wire: Wire) -> None:
    """Recording is bounded by start/stop; stopping twice, or an id never started, gives []."""
    capture = OutputCapture()
    parent = request(session)
    with capture.observing(session):
        wire.send("stream", {"name": "stdout", "text": "before\n"}, parent)
        capture.start(msg_id_of(parent))
        wire.send("stream", {"name": "stdout", "text": "during\n"}, parent)
        first = capture.stop(msg_id_of(parent))
        wire.send("stream", {"name": "stdout", "text": "after\n"}, parent)
    assert [m.content["text"] for m in first] == ["during\n"]
    assert capture.stop(msg_id_of(parent)) == []
    assert capture.stop("never-started") == []


def test_buffers_are_recorded_whether_passed_by_keyword_or_by_position(session: Session, wire: Wire) -> None:
    """The wrapper finds `buffers` without binding the call's signature (every message the
    kernel sends passes through it): by keyword, by position, or not at all."""
    capture = OutputCapture()
    parent = request(session)
    content = {"data": {"application/x-binary": "see buffers"}, "metadata": {}}
    capture.start(msg_id_of(parent))
    with capture.observing(session):
        wire.send("display_data", content, parent, buffers=[b"kw"])
        # Session.send(stream, msg_or_type, content, parent, ident, buffers): buffers sixth.
        session.send(wire.out, "display_data", content, parent, None, [b"pos"])
        wire.send("display_data", content, parent)
    captured = capture.stop(msg_id_of(parent))
    assert [m.buffers for m in captured] == [[b"kw"], [b"pos"], []]
    assert [wire.receive()["buffers"] for _ in range(3)] == [[b"kw"], [b"pos"], []]


def test_concurrent_requests_are_captured_apart(session: Session) -> None:
    """Two requests sending from two threads at once (ipykernel 7 can) each get only their own
    outputs, in their own order."""
    context: zmq.Context[Any] = zmq.Context()
    wires = [Wire(context, session), Wire(context, session)]
    capture = OutputCapture()
    parents = [request(session), request(session)]
    for parent in parents:
        capture.start(msg_id_of(parent))
    barrier = threading.Barrier(2)

    def cell(index: int) -> None:
        barrier.wait()
        for i in range(200):
            wires[index].send("stream", {"name": "stdout", "text": f"{index}:{i}\n"}, parents[index])

    try:
        with capture.observing(session):
            threads = [threading.Thread(target=cell, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for index, parent in enumerate(parents):
            texts = [m.content["text"] for m in capture.stop(msg_id_of(parent))]
            assert texts == [f"{index}:{i}\n" for i in range(200)]
    finally:
        for w in wires:
            w.close()
        context.term()


def test_observing_restores_send_exactly_even_when_nested(session: Session, wire: Wire) -> None:
    """The wrapper is undone on exit: a nested capture restores the outer one, the outer the class method."""
    outer, inner = OutputCapture(), OutputCapture()
    parent = request(session)
    outer.start(msg_id_of(parent))
    inner.start(msg_id_of(parent))
    assert "send" not in vars(session)
    with outer.observing(session):
        outer_send = session.send
        with inner.observing(session):
            wire.send("stream", {"name": "stdout", "text": "both\n"}, parent)
        assert session.send is outer_send
        wire.send("stream", {"name": "stdout", "text": "outer only\n"}, parent)
    assert "send" not in vars(session)
    wire.send("stream", {"name": "stdout", "text": "neither\n"}, parent)
    assert [m.content["text"] for m in outer.stop(msg_id_of(parent))] == ["both\n", "outer only\n"]
    assert [m.content["text"] for m in inner.stop(msg_id_of(parent))] == ["both\n"]


def test_a_message_that_cannot_be_recorded_is_still_sent(session: Session, wire: Wire) -> None:
    """Recording never breaks messaging: content jupyter_client can only send after cleaning
    (a tuple dict key) is sent, not recorded, counted in ``failures``, and the capture says
    it is incomplete."""
    capture = OutputCapture()
    parent = request(session)
    capture.start(msg_id_of(parent))
    with capture.observing(session), pytest.warns(UserWarning, match="Message serialization failed"):
        wire.send("display_data", {"data": {("text", "plain"): "odd"}, "metadata": {}}, parent)
    assert capture.stop(msg_id_of(parent)) == []
    assert capture.failures == 1
    assert not capture.complete(msg_id_of(parent)), "the session must not record a cell whose outputs are incomplete"
    assert wire.receive()["content"]["data"] == {"('text', 'plain')": "odd"}


# -- encode / decode -----------------------------------------------------------------------------


def test_encode_decode_round_trip_keeps_buffers_with_their_messages() -> None:
    """Buffers are stored flat and given back to the message that carried them."""
    messages = [
        OutputMessage("display_data", {"data": {"a": 1}}, {}, [b"one", b"two"]),
        OutputMessage("stream", {"name": "stdout", "text": "x"}),
        OutputMessage("display_data", {"data": {"b": 2}}, {"m": True}, [b"three"]),
    ]
    payload, buffers = encode_outputs(messages)
    assert buffers == [b"one", b"two", b"three"]
    assert decode_outputs(payload, buffers) == messages
    assert decode_outputs(*encode_outputs([])) == []


def test_decode_recorded_gives_the_result_and_reads_only_message_buffers() -> None:
    """The kept result comes back with the messages; a stored result's child (after the
    message buffers) is never asked for, so a replay does not load it."""
    messages = [OutputMessage("display_data", {"data": {}, "metadata": {}}, {}, [b"one", b"two"])]
    result = {"digest": "d" * 64}
    payload, buffers = encode_outputs(messages, result)
    asked: list[int] = []

    def buffer(i: int) -> bytes:
        asked.append(i)
        return [*buffers, b"the stored result"][i]

    assert decode_recorded(payload, buffer) == (messages, result)
    assert asked == [0, 1]
    assert decode_recorded(encode_outputs(messages)[0], buffer)[1] is None


def test_encoding_is_deterministic() -> None:
    """Equal outputs encode to equal bytes (the store deduplicates them by digest)."""
    a = [OutputMessage("display_data", {"data": {"z": 1, "a": 2}, "metadata": {}}, {"y": 1, "b": 2})]
    b = [OutputMessage("display_data", {"metadata": {}, "data": {"a": 2, "z": 1}}, {"b": 2, "y": 1})]
    assert encode_outputs(a) == encode_outputs(b)


def test_an_unknown_format_is_refused() -> None:
    """A payload from another format version is an error, not outputs decoded wrongly."""
    with pytest.raises(ValueError, match="unknown outputs format"):
        decode_outputs(b'{"format": "nbrewind-outputs/999", "messages": []}', [])
    with pytest.raises(ValueError, match="unknown outputs format"):
        decode_outputs(b"{}", [])


def test_large_outputs_round_trip_through_the_store(session: Session, wire: Wire, tmp_path: Path) -> None:
    """Megabytes of text and binary buffers (larger than one store chunk) come back byte for byte."""
    capture = OutputCapture()
    parent = request(session)
    text = "".join(f"line {i} ✓\n" for i in range(300_000))  # ~3.6 MB
    big = bytes(range(256)) * (6 * 4096 + 7)  # ~6 MB, not a multiple of anything
    outputs: list[tuple[str, dict[str, Any], dict[str, Any], list[bytes]]] = [
        ("stream", {"name": "stdout", "text": text}, {}, []),
        ("display_data", {"data": {"text/plain": "blob"}, "metadata": {}}, {}, [big, b""]),
    ]
    captured, received = capture_and_receive(capture, wire, parent, outputs)
    loaded = store_and_load(tmp_path / "store", captured)
    assert loaded == captured
    assert loaded[0].content["text"] == text
    assert loaded[1].buffers == [big, b""] == received[1]["buffers"]


# -- replay --------------------------------------------------------------------------------------


def test_stored_outputs_replay_as_the_frontend_first_saw_them(session: Session, wire: Wire, tmp_path: Path) -> None:
    """Captured, stored, loaded and sent again, every message reaches the frontend as it did the
    first time, except the execute_result's count, which is the replaying cell's."""
    capture = OutputCapture()
    parent = request(session)
    captured, received = capture_and_receive(capture, wire, parent, sample_outputs(parent))
    loaded = store_and_load(tmp_path / "store", captured)

    replay_parent = request(session)
    for message in loaded:
        m = for_replay(message, 17)
        wire.send(m.msg_type, m.content, replay_parent, metadata=m.metadata, buffers=list(m.buffers) or None)
    replayed = [wire.receive() for _ in loaded]
    for first, again in zip(received, replayed, strict=True):
        assert again["parent_header"]["msg_id"] == msg_id_of(replay_parent)
        expected = dict(first["content"])
        if first["msg_type"] == "execute_result":
            expected["execution_count"] = 17
        assert as_frontend_sees(again) == (first["msg_type"], expected, first["metadata"], first["buffers"])


def test_for_replay_sets_only_the_execute_result_count_and_copies() -> None:
    """for_replay changes an execute_result's count in a copy, and leaves every other message alone."""
    result = OutputMessage("execute_result", {"data": {"text/plain": "1"}, "execution_count": 3}, {"k": 1}, [b"b"])
    replayed = for_replay(result, 9)
    assert replayed.content == {"data": {"text/plain": "1"}, "execution_count": 9}
    assert (replayed.metadata, replayed.buffers) == ({"k": 1}, [b"b"])
    assert result.content["execution_count"] == 3  # the stored message is not changed
    for other in (
        OutputMessage("stream", {"name": "stdout", "text": "x"}),
        OutputMessage("display_data", {"data": {}, "execution_count": 3}),
        OutputMessage("error", {"ename": "E", "evalue": "", "traceback": []}),
    ):
        assert for_replay(other, 9) == other


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"image/png": PNG, "text/plain": "<PIL image>"}, id="raw-png-bytes"),
        pytest.param({"text/plain": "t", "when": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)}, id="datetime"),
    ],
)
def test_content_jupyter_client_encodes_itself_replays_as_sent(
    session: Session, wire: Wire, data: dict[str, Any]
) -> None:
    """Content values jupyter_client serializes itself (bytes, datetimes) replay as the wire had them."""
    capture = OutputCapture()
    parent = request(session)
    captured, received = capture_and_receive(capture, wire, parent, [("display_data", {"data": data, "metadata": {}}, {}, [])])
    message = for_replay(decode_outputs(*encode_outputs(captured))[0], 1)
    wire.send(message.msg_type, message.content, parent, metadata=message.metadata)
    assert wire.receive()["content"] == received[0]["content"]
