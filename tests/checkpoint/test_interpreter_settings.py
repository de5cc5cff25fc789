"""Process state as settings (`nbrewind.identity.interpreter`), and values that are live
resources only as some instances of their type (`nbrewind.checkpoint.live`).

Each test changes real process state (the umask, the recursion limit, the time zone,
the root logger) and puts it back in a `finally`, so the rest of the run is unaffected.
"""

from __future__ import annotations

import functools
import gc
import locale
import logging
import os
import pickle
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import numpy as np
import pytest

from nbrewind.checkpoint.live import live_instance_name
from nbrewind.checkpoint.serialize import Unserializable, pickle_value
from nbrewind.identity import interpreter
from nbrewind.identity.settings import REGISTRY, capture_settings, settings_digests
from nbrewind.identity.values import is_notebook_code


@pytest.fixture(autouse=True)
def _process_state_put_back() -> Iterator[None]:
    interpreter.note_baseline()
    limit, digits = sys.getrecursionlimit(), sys.get_int_max_str_digits()
    mask = os.umask(0o022)
    os.umask(mask)
    tz = os.environ.get("TZ")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    collecting, timeout, lc_all = gc.isenabled(), socket.getdefaulttimeout(), locale.setlocale(locale.LC_ALL)
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        socket.setdefaulttimeout(timeout)
        locale.setlocale(locale.LC_ALL, lc_all)
        sys.setrecursionlimit(limit)
        sys.set_int_max_str_digits(digits)
        os.umask(mask)
        if tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = tz
        time.tzset()
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


def _digest(name: str) -> str:
    digests = settings_digests([s for s in REGISTRY if s.name == name])
    assert digests is not None
    return digests[name]


def test_unchanged_process_state_is_an_empty_snapshot() -> None:
    """A machine's own defaults are not state: only what a notebook changed is keyed."""
    assert interpreter.interpreter_get() == {}
    assert interpreter.time_zone_get() == {}
    assert interpreter.logging_get() == {}
    assert interpreter.socket_get() == {}
    assert interpreter.locale_get() == {}


def test_interpreter_limits_and_umask_round_trip() -> None:
    before = _digest("interpreter")
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(old_limit + 77)
    old_mask = os.umask(0o077)
    snapshot = capture_settings(["interpreter"])["interpreter"]
    assert snapshot == {"recursionlimit": old_limit + 77, "umask": 0o077}
    changed = _digest("interpreter")
    assert changed != before
    # Back to the process's own values: the snapshot puts the change back exactly.
    sys.setrecursionlimit(old_limit)
    os.umask(old_mask)
    assert _digest("interpreter") == before
    interpreter.interpreter_put(pickle.loads(pickle.dumps(snapshot)))
    assert sys.getrecursionlimit() == old_limit + 77
    assert interpreter.interpreter_get()["umask"] == 0o077
    assert _digest("interpreter") == changed
    # And an empty snapshot means the process's own values again.
    interpreter.interpreter_put({})
    assert sys.getrecursionlimit() == old_limit and interpreter.interpreter_get() == {}


def test_garbage_collector_socket_timeout_and_locale_round_trip() -> None:
    other = "C" if locale.setlocale(locale.LC_ALL) != "C" else "C.UTF-8"
    gc.disable()
    socket.setdefaulttimeout(5.5)
    locale.setlocale(locale.LC_ALL, other)
    snapshots = pickle.loads(pickle.dumps(capture_settings(["interpreter", "socket", "locale"])))
    assert snapshots["interpreter"] == {"gc": 0}
    assert snapshots["socket"] == {"timeout": 5.5}
    assert snapshots["locale"] == {"LC_ALL": locale.setlocale(locale.LC_ALL)}
    interpreter.interpreter_put({})
    interpreter.socket_put({})
    interpreter.locale_put({})
    assert gc.isenabled() and socket.getdefaulttimeout() is None
    assert interpreter.locale_get() == {}
    interpreter.interpreter_put(snapshots["interpreter"])
    interpreter.socket_put(snapshots["socket"])
    interpreter.locale_put(snapshots["locale"])
    assert not gc.isenabled() and socket.getdefaulttimeout() == 5.5
    assert interpreter.locale_get() == snapshots["locale"]


def test_the_collector_paused_for_a_graph_walk_is_not_the_notebooks_state() -> None:
    """A graph walk pauses the cyclic collector; a settings snapshot taken meanwhile (a task's
    settings salt, a baseline noted for the first time) must see it as on. A notebook's own
    `gc.disable()` put during the pause (a replay) stays when the pause ends."""
    assert gc.isenabled()
    with interpreter.collector_paused():
        assert not gc.isenabled()
        assert interpreter.interpreter_get() == {}
        assert capture_settings(["interpreter"])["interpreter"] == {}
    assert gc.isenabled()
    with interpreter.collector_paused():
        interpreter.interpreter_put({"gc": 0})
        assert interpreter.interpreter_get() == {"gc": 0}
    assert not gc.isenabled() and interpreter.interpreter_get() == {"gc": 0}


def test_time_zone_round_trip() -> None:
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    snapshot = interpreter.time_zone_get()
    assert snapshot["TZ"] == "Asia/Tokyo" and snapshot["zone"][1] == -9 * 3600
    os.environ.pop("TZ")
    time.tzset()
    interpreter.time_zone_put(snapshot)
    assert time.strftime("%H", time.localtime(0)) == "09"
    interpreter.time_zone_put({})
    assert interpreter.time_zone_get() == {}


def test_root_logger_configuration_is_made_again(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s|%(message)s", force=True)
    file_handler = logging.FileHandler(tmp_path / "run.log", mode="w")
    logging.getLogger().addHandler(file_handler)
    snapshot = pickle.loads(pickle.dumps(interpreter.logging_get()))
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    file_handler.close()
    root.setLevel(logging.WARNING)
    interpreter.logging_put(snapshot)
    try:
        logging.info("made again")
        assert "INFO|made again" in capsys.readouterr().err
        assert (tmp_path / "run.log").read_text() == "made again\n"  # appended to, never truncated again
    finally:
        interpreter.logging_put({})
    assert interpreter.logging_get() == {}


def test_a_logging_setup_that_cannot_be_made_again_cannot_be_stored() -> None:
    """A filter (or a handler of another kind) cannot be put back: the snapshot refuses
    pickling, so the cell that made it always runs; its digest names it, never an id."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(lambda record: True)
    root.addHandler(handler)
    snapshot = interpreter.logging_get()
    assert "unrestorable" in snapshot
    with pytest.raises(TypeError):
        pickle.dumps(snapshot)
    assert _digest("logging") == _digest("logging")
    interpreter.logging_put(snapshot)  # nothing to make again: leaves the live setup alone
    assert handler in root.handlers


def _notebook_namespace() -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile("import functools\n@functools.lru_cache\ndef f(x):\n    return x + 1", "<cell>", "exec"), namespace)
    return namespace


def test_a_notebook_cached_function_is_a_live_resource() -> None:
    f = _notebook_namespace()["f"]
    assert is_notebook_code(f.__wrapped__)  # type: ignore[attr-defined]
    assert live_instance_name(f, is_notebook_code) == "functools._lru_cache_wrapper"
    refused = pickle_value({"f": f})
    assert isinstance(refused, Unserializable) and "lru_cache_wrapper" in refused.reason
    # A library's cached function is stored by reference, as any library function.
    assert live_instance_name(functools.lru_cache(os.path.join), is_notebook_code) is None


def test_a_file_backed_memmap_is_a_live_resource(tmp_path: Path) -> None:
    path = tmp_path / "d.npy"
    np.save(path, np.zeros(4))
    mapped = np.load(path, mmap_mode="r+")
    try:
        assert live_instance_name(mapped, is_notebook_code) == "numpy.memmap"
        assert live_instance_name(mapped[1:], is_notebook_code) == "numpy.memmap"
        assert live_instance_name(np.asarray(mapped) + 1, is_notebook_code) is None
        assert isinstance(pickle_value({"m": mapped}), Unserializable)
    finally:
        del mapped


def test_functions_in_a_setting_are_keyed_by_what_they_do() -> None:
    """A formatter's name says nothing: every lambda is ``__main__.<lambda>`` and both of
    these are ``str.format``. Code, bound object, partial arguments and the globals the
    code reads all count; a library's function counts by where it is defined."""
    from nbrewind.identity.settings import canonical_bytes

    ns: dict[str, Any] = {"__name__": "__main__", "P": 2}
    exec("f2 = lambda v: f'{v:.2f}'\nf4 = lambda v: f'{v:.4f}'\ng = lambda v: f'{v:.{P}f}'", ns)
    assert canonical_bytes(ns["f2"]) != canonical_bytes(ns["f4"])
    assert canonical_bytes("{:.2f}".format) != canonical_bytes("{:.4f}".format)
    assert canonical_bytes(functools.partial(round, ndigits=1)) != canonical_bytes(functools.partial(round, ndigits=2))
    before = canonical_bytes(ns["g"])
    ns["P"] = 3
    assert canonical_bytes(ns["g"]) != before
    exec("again = lambda v: f'{v:.2f}'", ns)
    assert canonical_bytes(ns["again"]) == canonical_bytes(ns["f2"])
    assert canonical_bytes(len) == canonical_bytes(len)
