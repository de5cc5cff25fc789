"""The global `random` state is a cell's input unless only distributed's own threads moved it.

Draws "by distributed" here are real draws through the real `random` module, made by
code whose module name is `distributed.*` (compiled with that `__name__`), since the
scheduler's draws cannot be triggered on demand; the attribution reads exactly that.
"""

from __future__ import annotations

import pickle
import random
import threading
from collections.abc import Callable
from typing import Any

from nbrewind.checkpoint.draws import DrawWatch


def _as_module(name: str, source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name, "random": random}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace


SCHEDULER = _as_module("distributed.scheduler_like", "def pick(items):\n    return random.sample(items, 2)\n")
NOTEBOOK = _as_module("__main__", "def draw():\n    return random.random()\n")
LIBRARY = _as_module("somelib.shuffling", "def shuffle(items):\n    random.shuffle(items)\n    return items\n")


def _in_thread(work: Callable[[], Any]) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def test_draws_made_only_by_distributed_threads_are_not_the_cells() -> None:
    random.seed(5)
    start = random.getstate()
    with DrawWatch().watching() as watch:
        for _ in range(3):
            _in_thread(lambda: SCHEDULER["pick"](list(range(10))))
        assert random.getstate() != start  # the state did move
        assert watch.explained()


def test_a_cell_draw_or_a_library_drawing_for_the_cell_makes_the_state_an_input() -> None:
    with DrawWatch().watching() as watch:
        SCHEDULER["pick"](list(range(10)))
        NOTEBOOK["draw"]()
    assert not watch.explained()
    with DrawWatch().watching() as watch:
        LIBRARY["shuffle"](list(range(10)))  # any library but the scheduling ones acts for the cell
    assert not watch.explained()


def test_dask_sizeof_draws_for_whoever_calls_it() -> None:
    """distributed estimates a list's size with the real `dask.sizeof`, which samples its
    items: a background draw when distributed asks, the cell's when the cell asks."""
    from dask.sizeof import sizeof

    items = [str(i) * 3 for i in range(100)]  # sampled: more items than sizeof looks at
    asker = _as_module("distributed.worker_like", "def estimate(sizeof, items):\n    return sizeof(items)\n")
    start = random.getstate()
    with DrawWatch().watching() as watch:
        _in_thread(lambda: asker["estimate"](sizeof, items))
        assert random.getstate() != start
        assert watch.explained()
    with DrawWatch().watching() as watch:
        sizeof(items)
    assert not watch.explained()


def test_an_unobserved_move_breaks_the_chain() -> None:
    captured = random.random  # bound before the watch: its draws pass no wrapper
    with DrawWatch().watching() as watch:
        SCHEDULER["pick"](list(range(10)))
        captured()
        SCHEDULER["pick"](list(range(10)))
    assert not watch.explained()
    with DrawWatch().watching() as watch:
        SCHEDULER["pick"](list(range(10)))
        captured()  # after the last observed draw: caught at the end
    assert not watch.explained()


def test_no_draw_at_all_is_explained_and_the_sequence_is_unchanged() -> None:
    random.seed(11)
    plain = [random.random() for _ in range(3)], random.sample(range(100), 5)
    random.seed(11)
    with DrawWatch().watching() as watch:
        assert watch.explained()
        watched = [NOTEBOOK["draw"]() for _ in range(3)], random.sample(range(100), 5)
    assert watched == plain  # pass-through: the notebook sees the very same numbers


def test_wrappers_are_removed_and_pickle_as_the_function() -> None:
    original = random.random
    with DrawWatch().watching():
        wrapped = random.random
        assert wrapped is not original
        assert pickle.loads(pickle.dumps(wrapped)) is not None
    assert random.random is original
    assert pickle.loads(pickle.dumps(wrapped)) is original  # after the cell: the function itself
    assert isinstance(wrapped(), float)  # a wrapper kept by the notebook still works
