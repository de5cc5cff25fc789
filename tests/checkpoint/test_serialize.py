"""Values to bytes and back, Unserializable records, and content digests."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import io
import logging
import mmap
import os
import pickle
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import xxhash
import pandas as pd
import pytest

from nbrewind.checkpoint.digests import digest_buffer, digest_pickled, digest_value
from nbrewind.checkpoint.serialize import (
    OOB_THRESHOLD,
    Pickled,
    Unserializable,
    pickle_group,
    pickle_value,
    split_unserializable,
    unpickle_group,
    unpickle_value,
)

REPO = Path(__file__).resolve().parents[2]


def roundtrip(obj: object) -> object:
    pickled = pickle_value(obj)
    assert isinstance(pickled, Pickled), pickled
    return unpickle_value(pickled.payload, [bytes(view) for view in pickled.buffers])


# -- the unpicklable kinds -------------------------------------------------------------


def _generator() -> Iterator[object]:
    yield (i for i in range(3))


def _lock() -> Iterator[object]:
    yield threading.Lock()


def _rlock() -> Iterator[object]:
    yield threading.RLock()


def _socket() -> Iterator[object]:
    with socket.socket() as sock:
        yield sock


def _open_file(tmp_path: Path) -> Iterator[object]:
    with open(tmp_path / "f.txt", "w") as handle:
        yield handle


def _sqlite_connection() -> Iterator[object]:
    connection = sqlite3.connect(":memory:")
    yield connection
    connection.close()


def _sqlite_cursor() -> Iterator[object]:
    connection = sqlite3.connect(":memory:")
    yield connection.cursor()
    connection.close()


def _thread() -> Iterator[object]:
    yield threading.Thread(target=print)


def _sqlite3_module() -> Iterator[object]:
    yield sqlite3


def _thread_module() -> Iterator[object]:
    import _thread

    yield _thread


def _memoryview() -> Iterator[object]:
    yield memoryview(bytearray(b"abc"))


def _ctypes_pointer() -> Iterator[object]:
    yield ctypes.pointer(ctypes.c_int(5))


class _Target:
    def method(self) -> None:
        pass


# A weakref.ref is stored (see test_restore_exact.py); these weak kinds are not.


def _weakproxy() -> Iterator[object]:
    target = _Target()
    yield weakref.proxy(target)  # pickle would store a strong copy of the target


def _weakmethod() -> Iterator[object]:
    target = _Target()
    yield weakref.WeakMethod(target.method)


def _finalizer() -> Iterator[object]:
    target = _Target()
    yield weakref.finalize(target, print)


def _frame() -> Iterator[object]:
    yield sys._getframe()


def _traceback() -> Iterator[object]:
    try:
        raise ValueError("boom")
    except ValueError as exc:
        yield exc.__traceback__


def _coroutine() -> Iterator[object]:
    async def work() -> int:
        return 1

    coroutine = work()
    yield coroutine
    coroutine.close()


def _async_generator() -> Iterator[object]:
    async def numbers() -> object:
        yield 1

    yield numbers()


def _event_loop() -> Iterator[object]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _popen() -> Iterator[object]:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    yield process
    process.wait()


def _mmap() -> Iterator[object]:
    with mmap.mmap(-1, 4096) as mapped:
        yield mapped


def _named_temporary_file() -> Iterator[object]:
    with tempfile.NamedTemporaryFile() as handle:
        yield handle


def _stream_handler() -> Iterator[object]:
    handler = logging.StreamHandler(io.StringIO())
    yield handler
    handler.close()


def _zmq_socket() -> Iterator[object]:
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.PAIR)
    yield sock
    sock.close()
    context.term()


def _lambda_with_lock() -> Iterator[object]:
    lock = threading.Lock()
    yield lambda: lock.locked()


def _lock_in_container() -> Iterator[object]:
    yield {"data": [1, 2, 3], "guard": (threading.Lock(),)}


UNPICKLABLE: dict[str, Callable[..., Iterator[object]]] = {
    "generator": _generator,
    "lock": _lock,
    "rlock": _rlock,
    "socket": _socket,
    "open_file": _open_file,
    "sqlite_connection": _sqlite_connection,
    "sqlite_cursor": _sqlite_cursor,
    "thread": _thread,
    "sqlite3_module": _sqlite3_module,
    "thread_module": _thread_module,
    "memoryview": _memoryview,
    "ctypes_pointer": _ctypes_pointer,
    "weakproxy": _weakproxy,
    "weakmethod": _weakmethod,
    "finalizer": _finalizer,
    "frame": _frame,
    "traceback": _traceback,
    "coroutine": _coroutine,
    "async_generator": _async_generator,
    "event_loop": _event_loop,
    "popen": _popen,
    "mmap": _mmap,
    "named_temporary_file": _named_temporary_file,
    "stream_handler": _stream_handler,
    "zmq_socket": _zmq_socket,
    "lambda_with_lock": _lambda_with_lock,
    "lock_in_container": _lock_in_container,
}


@contextlib.contextmanager
def make(kind: str, tmp_path: Path) -> Iterator[object]:
    factory = UNPICKLABLE[kind]
    wants_path = factory.__code__.co_argcount == 1
    yield from factory(tmp_path) if wants_path else factory()


def assert_unserializable(obj: object) -> None:
    result = pickle_value(obj)
    assert isinstance(result, Unserializable), result
    assert result.type_name and result.reason
    group = pickle_group({"fine": [1, 2], "bad": obj})
    assert isinstance(group, Unserializable)
    assert group.members == ("bad",)
    assert "bad" in group.reason and "fine" not in group.members


@pytest.mark.parametrize("kind", sorted(UNPICKLABLE))
def test_unpicklable_kinds_give_unserializable(kind: str, tmp_path: Path) -> None:
    with make(kind, tmp_path) as obj:
        assert_unserializable(obj)
        digest = digest_value(obj)
        if kind == "memoryview":  # hashed in place although it cannot be stored
            assert isinstance(digest, str)
        else:
            assert isinstance(digest, Unserializable)


@pytest.mark.cluster
def test_dask_client_cluster_and_future_are_unserializable() -> None:
    from distributed import Client, LocalCluster

    # ":0", not None: with None the scheduler's HTTP server still binds port 8787 and
    # fails when another cluster (a parallel test run) holds it.
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            future = client.submit(sum, [1, 2])
            assert future.result() == 3
            for obj in (cluster, client, future, {"results": [future]}):
                assert_unserializable(obj)
            assert "distributed.client.Future" in str(pickle_value(future))


def test_live_resource_detection_keeps_in_memory_streams() -> None:
    buffer = io.BytesIO(b"payload")
    restored = roundtrip(buffer)
    assert isinstance(restored, io.BytesIO) and restored.getvalue() == b"payload"


def test_failing_reduce_is_data_but_keyboard_interrupt_propagates() -> None:
    # Classes of a library (this file would count as the user's own module, whose classes
    # are stored whole without their hooks: see test_own_pickling.py).
    class Broken:
        __module__ = "nbr_some_library"

        def __reduce__(self) -> tuple[object, ...]:
            raise ValueError("no state")

    class Interrupting:
        __module__ = "nbr_some_library"

        def __reduce__(self) -> tuple[object, ...]:
            raise KeyboardInterrupt

    result = pickle_value(Broken())
    assert isinstance(result, Unserializable) and "ValueError: no state" in result.reason
    with pytest.raises(KeyboardInterrupt):
        pickle_value(Interrupting())


def test_too_deep_nesting_is_unserializable() -> None:
    nested: list[object] = []
    for _ in range(200_000):
        nested = [nested]
    result = pickle_value(nested)
    assert isinstance(result, Unserializable)
    assert "deep" in result.reason or "recursion" in result.reason


def test_unserializable_is_frozen() -> None:
    record = Unserializable("t", "r")
    with pytest.raises(AttributeError):
        record.reason = "x"  # type: ignore[misc]


# -- round trips -----------------------------------------------------------------------


def test_large_array_goes_out_of_band_without_copy() -> None:
    array = np.arange(OOB_THRESHOLD, dtype=np.float64)
    pickled = pickle_value(array)
    assert isinstance(pickled, Pickled)
    assert len(pickled.buffers) == 1 and pickled.buffers[0].nbytes == array.nbytes
    assert len(pickled.payload) < 1024
    assert np.shares_memory(np.frombuffer(pickled.buffers[0], dtype=np.float64), array)
    restored = unpickle_value(pickled.payload, [bytes(pickled.buffers[0])])
    assert isinstance(restored, np.ndarray)
    np.testing.assert_array_equal(restored, array)
    assert restored.flags.writeable  # bytes were copied into a writable buffer


def test_restore_adopts_a_fresh_uint8_buffer_and_the_array_owns_its_memory() -> None:
    array = np.arange(20_000, dtype=np.float64).reshape(100, 200)
    pickled = pickle_value(array)
    assert isinstance(pickled, Pickled)
    buffer = np.frombuffer(bytes(pickled.buffers[0]), np.uint8).copy()
    restored = unpickle_value(pickled.payload, [buffer], adopt=True)
    assert restored is buffer  # the load buffer became the array: no copy
    assert isinstance(restored, np.ndarray) and restored.flags.owndata and restored.base is None
    np.testing.assert_array_equal(restored, array)
    assert restored[3:5].base is restored  # as for a freshly made array


def test_restore_from_other_buffers_copies_into_an_owning_array() -> None:
    array = np.ones(20_000)
    pickled = pickle_value(array)
    assert isinstance(pickled, Pickled)
    buffer = bytearray(pickled.buffers[0])
    restored = unpickle_value(pickled.payload, [buffer])
    assert isinstance(restored, np.ndarray) and restored.flags.owndata
    assert not np.shares_memory(restored, np.frombuffer(buffer))
    restored.resize(10, refcheck=False)  # only an array owning its memory may resize
    readonly = array.copy()
    readonly.flags.writeable = False
    pickled = pickle_value(readonly)
    assert isinstance(pickled, Pickled)
    assert unpickle_value(pickled.payload, [bytes(pickled.buffers[0])]).flags.owndata


def test_small_array_stays_in_band_and_orders_survive() -> None:
    small = np.arange(100, dtype=np.int32)
    pickled = pickle_value(small)
    assert isinstance(pickled, Pickled) and pickled.buffers == []
    np.testing.assert_array_equal(unpickle_value(pickled.payload, []), small)
    fortran = np.asfortranarray(np.arange(40_000, dtype=np.float64).reshape(200, 200))
    restored = roundtrip(fortran)
    assert isinstance(restored, np.ndarray) and restored.flags.f_contiguous
    np.testing.assert_array_equal(restored, fortran)


def _segment_digests(pickled: Pickled) -> set[str]:
    return {
        digest_buffer(segment)
        for index in range(len(pickled.buffers))
        for segment in pickled.buffer_segments(index)
    }


def test_dataframe_unchanged_columns_keep_their_buffer_digests() -> None:
    rows = 20_000
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({name: rng.random(rows) for name in "abcd"})
    frame["n"] = np.arange(rows, dtype=np.int64)
    before = pickle_value(frame)
    assert isinstance(before, Pickled)
    assert sum(view.nbytes for view in before.buffers) >= 5 * rows * 8  # all columns out of band

    changed = frame.copy()
    changed["b"] = changed["b"] * 2  # regroups pandas' float block
    after = pickle_value(changed)
    assert isinstance(after, Pickled)

    columns = {name: digest_buffer(frame[name].to_numpy()) for name in frame.columns}
    old, new = _segment_digests(before), _segment_digests(after)
    assert set(columns.values()) == old
    assert {columns[name] for name in "acdn"} <= new
    assert columns["b"] not in new and digest_buffer(changed["b"].to_numpy()) in new

    restored = unpickle_value(after.payload, after.buffers)
    assert isinstance(restored, pd.DataFrame)
    pd.testing.assert_frame_equal(restored, changed)


def test_nested_containers_roundtrip() -> None:
    value = {
        "list": [1, 2.5, None, (3, "x")],
        "set": {1, 2, 3},
        "bytes": b"\x00" * (OOB_THRESHOLD + 1),
        "array": np.arange(10),
        "frame": pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}),
    }
    restored = roundtrip(value)
    assert isinstance(restored, dict)
    assert restored["list"] == value["list"] and restored["set"] == value["set"]
    assert restored["bytes"] == value["bytes"]
    np.testing.assert_array_equal(restored["array"], value["array"])
    pd.testing.assert_frame_equal(restored["frame"], value["frame"])


NOTEBOOK_CELL = '''
SCALE = 3

def helper(x):
    return x + 1

def scaled(x):
    return helper(x) * SCALE

class Point:
    def __init__(self, x):
        self.x = x
    def norm(self):
        return abs(self.x)

square = lambda v: v * v
'''


def notebook_namespace() -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<cell 1>", "exec"), namespace)
    return namespace


def test_notebook_functions_and_classes_pickle_by_value() -> None:
    """Functions travel as code and bind to the namespace they are restored into:
    their globals (SCALE, helper) come from that namespace, not from a copy."""
    namespace = notebook_namespace()
    scaled, point_class, square = namespace["scaled"], namespace["Point"], namespace["square"]
    assert scaled.__module__ == "__main__"
    pickled = pickle_group({"scaled": scaled, "p": point_class(-4), "square": square, "helper": namespace["helper"]})  # type: ignore[operator]
    assert isinstance(pickled, Pickled)
    code = (
        "import sys, pickle\n"
        "from nbrewind.checkpoint.serialize import restoring_into\n"
        "ns = {'__name__': '__main__', 'SCALE': 10}\n"
        "with restoring_into(ns):\n"
        "    group = pickle.loads(sys.stdin.buffer.read())\n"
        "ns.update(group)\n"
        "print(group['scaled'](1), group['p'].norm(), group['square'](5), group['scaled'].__globals__ is ns)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [sys.executable, "-c", code], input=pickled.payload, capture_output=True, check=True, timeout=60, env=env
    )
    assert result.stdout.split() == [b"20", b"4", b"25", b"True"]


def test_function_digest_ignores_where_the_code_was_compiled() -> None:
    """The same function text compiled under another file name and line gives the same digest;
    a changed body does not. Globals it references are not part of its digest."""
    first = notebook_namespace()
    moved: dict[str, object] = {"__name__": "__main__"}
    exec(compile("\n\n# a comment\n" + NOTEBOOK_CELL, "/tmp/ipykernel_99/other.py", "exec"), moved)
    assert digest_value(first["scaled"]) == digest_value(moved["scaled"])
    assert digest_value(first["Point"]) == digest_value(moved["Point"])
    moved["SCALE"] = 1000
    assert digest_value(first["scaled"]) == digest_value(moved["scaled"])
    edited: dict[str, object] = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL.replace("* SCALE", "* SCALE * 2"), "<cell 1>", "exec"), edited)
    assert digest_value(first["scaled"]) != digest_value(edited["scaled"])


def test_groups_preserve_aliasing() -> None:
    shared = [1, 2, 3]
    array = np.zeros(OOB_THRESHOLD)
    group = {"a": shared, "b": shared, "d": {"x": shared}, "arr": array, "view": array}
    pickled = pickle_group(group)
    assert isinstance(pickled, Pickled)
    assert len(pickled.buffers) == 1  # the shared array is written once
    restored = unpickle_group(pickled.payload, pickled.buffers)
    first, holder = restored["a"], restored["d"]
    assert isinstance(first, list) and isinstance(holder, dict)
    assert restored["b"] is first and holder["x"] is first
    assert restored["view"] is restored["arr"]
    first.append(4)
    assert restored["b"] == [1, 2, 3, 4]


def test_unpickle_group_rejects_non_groups() -> None:
    pickled = pickle_value([1, 2])
    assert isinstance(pickled, Pickled)
    with pytest.raises(TypeError):
        unpickle_group(pickled.payload, [])


def test_group_failure_names_members_and_splits() -> None:
    lock = threading.Lock()
    members = {"data": [1], "lock": lock, "uses_lock": lambda: lock.locked(), "np": np}
    group = pickle_group(members)
    assert isinstance(group, Unserializable)
    assert group.members == ("lock", "uses_lock", "np")
    assert all(name in group.reason for name in group.members)
    good, bad = split_unserializable(members)
    assert list(good) == ["data"] and good["data"] is members["data"]
    assert set(bad) == {"lock", "uses_lock", "np"}
    assert all(isinstance(record, Unserializable) for record in bad.values())


def test_numpy_generator_state_survives() -> None:
    generator = np.random.default_rng(42)
    generator.random(7)
    restored = roundtrip(generator)
    assert isinstance(restored, np.random.Generator)
    np.testing.assert_array_equal(restored.random(5), generator.random(5))


# -- digests ---------------------------------------------------------------------------


def test_array_digest_tracks_content_dtype_shape_and_order() -> None:
    array = np.arange(1000, dtype=np.float64)
    same = np.arange(1000, dtype=np.float64)
    digest = digest_value(array)
    assert isinstance(digest, str) and digest == digest_value(same)
    digests = {
        digest,
        digest_value(array.view(np.int64)),
        digest_value(array.reshape(10, 100)),
        digest_value(np.asfortranarray(array.reshape(10, 100))),
        digest_value(array.astype(">f8")),
    }
    assert len(digests) == 5
    same[-1] += 1
    assert digest_value(same) != digest


def test_strided_view_digests_like_its_copy() -> None:
    array = np.arange(10_000, dtype=np.int16).reshape(100, 100)
    view = array[::2, 1::3]
    assert not view.flags.c_contiguous and not view.flags.f_contiguous
    assert digest_value(view) == digest_value(view.copy())
    assert digest_value(view) != digest_value(array[1::2, 1::3])


def test_bytes_like_digests() -> None:
    data = b"x" * 1000
    assert digest_value(data) == digest_value(b"x" * 1000)
    assert digest_value(data) != digest_value(bytearray(data))  # a different type restores differently
    assert digest_value(memoryview(data)) == digest_value(memoryview(bytearray(data)))
    assert digest_value(data) != digest_value(b"x" * 999 + b"y")


def test_generic_digest_detects_changes_and_is_repeatable() -> None:
    frame = pd.DataFrame({name: np.arange(50_000, dtype=np.float64) for name in "abc"})
    first = digest_value(frame)
    assert isinstance(first, str) and first == digest_value(frame) == digest_value(frame.copy())
    frame.loc[49_999, "c"] = -1.0
    assert digest_value(frame) != first
    assert digest_value({"k": [1, 2]}) != digest_value({"k": [1, 3]})


def test_object_and_structured_arrays_are_digested_by_pickle() -> None:
    objects = np.array([[1], "a"], dtype=object)
    assert digest_value(objects) == digest_value(np.array([[1], "a"], dtype=object))
    assert digest_value(objects) != digest_value(np.array([[2], "a"], dtype=object))
    records = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
    renamed = np.zeros(3, dtype=[("x", "<i4"), ("b", "<f8")])
    assert digest_value(records) != digest_value(renamed)


def test_digest_pickled_is_consistent() -> None:
    value = {"array": np.arange(OOB_THRESHOLD), "text": "hello"}
    first, second = pickle_value(value), pickle_value(value)
    assert isinstance(first, Pickled) and isinstance(second, Pickled)
    assert digest_pickled(first) == digest_pickled(second) == digest_pickled(first)
    moved = Pickled(first.payload + first.buffers[0].tobytes()[:8], [first.buffers[0][8:]])
    assert digest_pickled(moved) != digest_pickled(first)  # framing: bytes cannot shift between parts


def test_golden_digests() -> None:
    # Changing these invalidates every recorded cell key: bump the format tag instead.
    array = np.arange(10, dtype="<i8")
    assert digest_value(array) == "c3bab4bd1647c38a4b864a955bac750e"
    # The array scheme, re-derived by hand: tag, dtype|fields|shape|order|nbytes, raw bytes.
    by_hand = xxhash.xxh3_128(b"nbrewind.value.ndarray.v2" + b"<i8||(10,)|C|80" + array.tobytes())
    assert digest_value(array) == by_hand.hexdigest()
    assert digest_value(b"abc") == "9451e317f74ef4806eb73855c3053259"
    assert digest_buffer(b"abc") == "06b05ab6733a618578af5f94892f3950"  # plain xxh3-128
    # Plain containers pickle identically on every supported Python.
    assert digest_value({"a": [1, 2.5, "x"]}) == "e0926bf760d704603c93c558b1cf406d"


def test_sharing_of_mutable_parts_is_part_of_a_cell_digest() -> None:
    # After x = [l, l] a write through x[0] shows in x[1]; after x = [l, list(l)] it does not.
    shared = [1, 2, 3]
    assert digest_value([shared, shared]) != digest_value([shared, list(shared)])
    big = np.arange(1000.0)
    assert digest_value([big, big]) != digest_value([big, big.copy()])
    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    assert isinstance(digest_value(cyclic), str) and digest_value(cyclic) == digest_value(cyclic)


def test_import_has_no_side_effects() -> None:
    code = (
        "import sys\n"
        "import nbrewind.checkpoint.serialize, nbrewind.checkpoint.hidden as hidden\n"
        "assert 'numpy' not in sys.modules and 'pandas' not in sys.modules\n"
        "assert not hidden._hook_installed\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


@pytest.mark.slow
def test_digest_speed() -> None:
    array = np.random.default_rng(0).random(25_000_000)  # 200 MB
    digest_value(array)
    start = time.perf_counter()
    digest_value(array)
    elapsed = time.perf_counter() - start
    assert array.nbytes / elapsed > 1e9, f"{array.nbytes / elapsed / 1e9:.2f} GB/s"


_COW_VIEWS: dict[str, Callable[[pd.DataFrame], object]] = {
    "column": lambda df: df["x"],
    "attribute": lambda df: df.y,
    "rows": lambda df: df.iloc[:2],
    "columns by label": lambda df: df.loc[:, ["y", "z"]],
    "column list": lambda df: df[["x", "y"]],
    "head": lambda df: df.head(2),
    "transpose": lambda df: df.T,
    "reset index": lambda df: df.reset_index(),
    "slice of a column": lambda df: df["y"].iloc[1:],
    "shallow copy": lambda df: df.copy(deep=False),
    "renamed": lambda df: df.rename(columns={"x": "w"}),
}


def _write_first(value: object) -> str | None:
    try:
        if isinstance(value, pd.Series):
            value.iloc[0] = 100
        else:
            value.iloc[0, 0] = 100  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - compared with the live twin's
        return type(exc).__name__
    return None


@pytest.mark.parametrize("writer", ["view", "frame"])
@pytest.mark.parametrize("view", list(_COW_VIEWS))
def test_pandas_copy_on_write_references_come_back(view: str, writer: str) -> None:
    """A frame and an object sharing its memory under copy-on-write, restored together: a
    write through one copies first and leaves the other as it was, as it does live."""
    live = pd.DataFrame({"x": [3, 1, 2], "y": [1.0, None, 3.0], "z": [4.0, 5.0, 6.0]})
    live_view = _COW_VIEWS[view](live)
    pickled = pickle_group({"df": live, "v": live_view})
    assert isinstance(pickled, Pickled), pickled
    back = unpickle_group(pickled.payload, [bytearray(b) for b in pickled.buffers])
    assert _write_first(live_view if writer == "view" else live) == _write_first(back["v"] if writer == "view" else back["df"])
    assert back["df"].equals(live)  # type: ignore[attr-defined]
    assert back["v"].equals(live_view)  # type: ignore[attr-defined]


def test_frames_over_one_array_without_copies_still_write_through() -> None:
    """Only references that were shared are shared again: frames made with copy=False over
    one numpy array share its memory and no references, so a write shows in all of them."""
    a = np.arange(6.0)
    first, second = pd.DataFrame(a, copy=False), pd.DataFrame(a, copy=False)
    pickled = pickle_group({"a": a, "first": first, "second": second})
    assert isinstance(pickled, Pickled), pickled
    back = unpickle_group(pickled.payload, [bytearray(b) for b in pickled.buffers])
    first.iloc[0, 0] = 50
    back["first"].iloc[0, 0] = 50  # type: ignore[attr-defined]
    assert second.iloc[0, 0] == back["second"].iloc[0, 0] == 50  # type: ignore[attr-defined]
    assert back["a"][0] == 50  # type: ignore[index]


def test_pandas_digests_do_not_change_with_the_stored_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cell keys digest pandas' own reduction, so stores recorded before the stored one
    changed keep matching: a frame's digest is the same without the storing reductions."""
    from nbrewind.checkpoint import serialize

    df = pd.DataFrame({"x": [1, 2], "y": [0.5, 1.5]})
    pickled = pickle_group({"df": df})
    assert isinstance(pickled, Pickled)
    assert b"load_manager" in pickled.payload
    with_them = digest_value(df)
    monkeypatch.setattr(serialize, "manager_reducers", dict)
    assert b"load_manager" not in pickle_group({"df": df}).payload  # type: ignore[union-attr]
    assert digest_value(df) == with_them


_SUBCLASS_VIEWS: dict[str, Callable[[], dict[str, Any]]] = {
    "matrix over an array": lambda: (lambda a: {"root": a, "view": np.asmatrix(a)})(np.zeros((2, 2))),
    "array over a matrix": lambda: (lambda m: {"root": m, "view": np.asarray(m)})(np.asmatrix(np.ones((2, 2)))),
    "row of a matrix": lambda: (lambda m: {"root": m, "view": m[1]})(np.asmatrix(np.ones((2, 2)))),
    "matrix over a Fortran array": lambda: (lambda a: {"root": a, "view": np.asmatrix(a)})(np.asfortranarray(np.zeros((2, 3)))),
    "recarray over a structured array": lambda: (lambda a: {"root": a, "view": a.view(np.recarray)})(
        np.zeros(3, dtype=[("x", "f8"), ("y", "i4")])
    ),
    "field of a recarray": lambda: (lambda r: {"root": r, "view": r.x})(np.zeros(3, dtype=[("x", "f8"), ("y", "i4")]).view(np.recarray)),
}


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix is not recommended
@pytest.mark.parametrize("writer", ["view", "root"])
@pytest.mark.parametrize("story", list(_SUBCLASS_VIEWS))
def test_numpy_subclass_views_share_memory_again(story: str, writer: str) -> None:
    """np.matrix and np.recarray views (and arrays over them) come back as views of the
    restored root, of their own class: a write through one shows in the other, as live."""
    live = _SUBCLASS_VIEWS[story]()
    pickled = pickle_group(live)
    assert isinstance(pickled, Pickled), pickled
    back = unpickle_group(pickled.payload, [bytearray(b) for b in pickled.buffers])
    for ns in (live, back):
        target = ns[writer]
        flat = target.reshape(-1) if type(target) is np.ndarray else np.asarray(target).reshape(-1)
        if flat.dtype.names:
            flat["x"][0] = 5
        else:
            flat[0] = 5
    for name in ("root", "view"):
        assert type(back[name]) is type(live[name])
        assert np.asarray(back[name]).tobytes() == np.asarray(live[name]).tobytes()
    assert np.shares_memory(back["root"], back["view"])
