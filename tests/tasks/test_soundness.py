"""The task cache never serves a result its inputs no longer support: global RNG draws,
library settings, the files a result was made from, and one notion of "the same code".

Real calls are counted as in test_cache.py: every task function drops a uniquely
named file into a counts folder (a directory, which fingerprints by name only).
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

dask = pytest.importorskip("dask")

from dask._task_spec import DataNode, List, Task, TaskRef  # noqa: E402

from nbrewind.identity.code import code_digest, code_info  # noqa: E402
from nbrewind.identity.files import file_digest  # noqa: E402
from nbrewind.store import Store, TaskLogEntry  # noqa: E402
from nbrewind.tasks.cache import TaskCache  # noqa: E402
from nbrewind.tasks.fingerprint import Fingerprinter  # noqa: E402
from nbrewind.tasks.intercept import intercepting  # noqa: E402

from counting import Calls  # noqa: E402  (tests/tasks/counting.py)
from nbrewind.tasks.settings import task_settings  # noqa: E402

NOTEBOOK = '''
import os, random, uuid
from nbrewind.identity.files import quietly
import numpy as np
from random import gauss
COUNTS = {counts!r}

def tick(name):
    # The test's own observation, not the task's effect: unseen, or every task would run.
    with quietly(), open(os.path.join(COUNTS, name + "-" + uuid.uuid4().hex), "w"):
        pass

def draw(i):
    tick("draw")
    return i + random.random()

def draw_np(i):
    tick("draw_np")
    return i + float(np.random.normal())

def draw_gauss(i):
    tick("draw_gauss")
    return i + gauss(0, 1)

def via_helper(i):
    tick("via_helper")
    return draw(i)

def local_import(i):
    tick("local_import")
    import numpy.random as npr
    return i + float(npr.rand())

def with_rng(rng, n):
    tick("with_rng")
    return rng.normal(size=n).tolist()

def seeded(seed):
    tick("seeded")
    return float(np.random.default_rng(seed).normal())

def total(xs):
    tick("total")
    return sum(xs)

def ratio(a, b):
    tick("ratio")
    return np.asarray(a) / np.asarray(b)

def show(a):
    tick("show")
    return str(np.asarray(a) / 3)

def read(path):
    tick("read")
    with open(path) as f:
        return f.read()

def read_in(folder):
    tick("read_in")
    with open(os.path.join(folder, "data.txt")) as f:
        return f.read()

def length(text):
    tick("length")
    return len(text)
'''


@pytest.fixture
def ns(calls: Calls) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(NOTEBOOK.format(counts=str(calls.folder)), "<notebook>", "exec"), namespace)
    return namespace


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[TaskCache]:
    c = TaskCache(tmp_path / "store.nbrewind")
    with intercepting(c):
        yield c


def threaded(*collections: Any) -> Any:
    return dask.compute(*collections, scheduler="threads")


# -- 1. the global RNG ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["draw", "draw_np", "draw_gauss", "via_helper", "local_import"])
def test_a_task_drawing_from_the_global_rng_is_never_cached(
    cache: TaskCache, calls: Calls, ns: dict[str, Any], name: str
) -> None:
    delayed = dask.delayed

    def run(seed: int) -> Any:
        random_module = ns["random"]
        random_module.seed(seed)
        ns["np"].random.seed(seed)
        return threaded(delayed(ns["total"])([delayed(ns[name])(i) for i in range(3)]))[0]

    first = run(1)
    ran = calls.take()
    assert ran[name] == 3 and ran["total"] == 1
    again = run(1)
    assert calls.take() == ran  # rerun, not served: the draws (and their dependent) ran again
    # Same seed, same draws (threads may take them in another order): they came from the global state.
    assert again == pytest.approx(first)
    assert run(2) != first
    assert calls.take() == ran
    rows = cache.drain_log()
    assert not any(r.key_prefix in (name, "total") for r in rows)  # uncached: never rewritten


def test_global_rng_references_are_found_by_value_and_by_dotted_name(ns: dict[str, Any]) -> None:
    import random

    fp = Fingerprinter()
    for func in (ns["draw"], ns["draw_np"], ns["draw_gauss"], random.random, np.random.normal, np.random.seed):
        assert "t" not in fp.fingerprint_graph({"t": Task("t", func, 1)})
        assert "global random number generator" in fp.failures["t"]
    for func in (ns["seeded"], ns["total"]):
        assert "t" in fp.fingerprint_graph({"t": Task("t", func, 1)})


def test_a_generator_passed_as_a_value_is_keyed_by_its_state(
    cache: TaskCache, calls: Calls, ns: dict[str, Any]
) -> None:
    delayed = dask.delayed

    def run(seed: int) -> Any:
        return threaded(delayed(ns["with_rng"])(np.random.default_rng(seed), 3), delayed(ns["seeded"])(seed))

    first = run(0)
    assert calls.take() == {"with_rng": 1, "seeded": 1}
    assert run(0) == first
    assert calls.take() == {}  # equal generator state, equal seed: served from the cache
    assert run(1) != first
    assert calls.take() == {"with_rng": 1, "seeded": 1}


# -- 2. library settings --------------------------------------------------------------------------


def test_numpy_error_options_are_part_of_the_fingerprint(cache: TaskCache, calls: Calls, ns: dict[str, Any]) -> None:
    task = dask.delayed(ns["ratio"])([1.0, 2.0], [0.0, 1.0])
    with np.errstate(divide="ignore"):
        first = threaded(task)[0]
        assert calls.take() == {"ratio": 1}
        threaded(task)
        assert calls.take() == {}
    with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
        threaded(task)  # a cached value would hide the error this setting asks for
    assert calls.take() == {"ratio": 1}
    with np.errstate(divide="ignore"):
        assert list(threaded(task)[0]) == list(first)
    assert calls.take() == {}


def test_print_options_count_for_a_task_that_prints(cache: TaskCache, calls: Calls, ns: dict[str, Any]) -> None:
    task = dask.delayed(ns["show"])([1.0, 2.0])
    with np.printoptions(precision=8):
        wide = threaded(task)[0]
    with np.printoptions(precision=2):
        narrow = threaded(task)[0]
    assert calls.take() == {"show": 2}
    assert narrow != wide and "0.33" in narrow and "0.33333333" in wide


def test_pandas_option_change_misses_and_reverting_hits(cache: TaskCache, calls: Calls, ns: dict[str, Any]) -> None:
    import pandas as pd

    task = dask.delayed(ns["total"])([1, 2, 3])
    threaded(task)
    assert calls.take() == {"total": 1}
    with pd.option_context("display.precision", 2):
        threaded(task)
        assert calls.take() == {"total": 1}
    threaded(task)
    assert calls.take() == {}


def test_warnings_filters_count_only_up_to_the_last_error_filter() -> None:
    with warnings.catch_warnings():
        warnings.resetwarnings()
        base = task_settings()
        warnings.filterwarnings("ignore", category=UserWarning)
        assert task_settings() == base  # no filter makes anything raise: nothing counts
        warnings.filterwarnings("error", category=RuntimeWarning)
        with_error = task_settings()
        assert with_error != base
        warnings.filterwarnings("ignore", message="shadowed", append=True)
        assert task_settings() == with_error  # after the last error filter
        warnings.filterwarnings("ignore", message="shadows")
        assert task_settings() != with_error  # before it: decides what reaches the error filter


def test_dask_config_keys_set_by_the_client_are_not_part_of_the_settings() -> None:
    import dask.config

    before = task_settings()
    with dask.config.set(scheduler="sync", pool=object()):
        assert task_settings() == before
    with dask.config.set({"array.chunk-size": "7MiB"}):
        assert task_settings() != before


def test_the_scratch_directory_from_the_environment_is_not_a_setting(tmp_path: Path) -> None:
    # Batch systems and the benchmark harness give every process its own scratch folder.
    import subprocess
    import sys

    code = (
        "import dask.config\n"
        "from nbrewind.identity.settings import apply_settings, capture_settings, settings_digests\n"
        "snapshot = capture_settings(['dask.config'])\n"
        "dask.config.set({'temporary-directory': '/elsewhere'})\n"
        "apply_settings(snapshot)\n"
        "print((settings_digests() or {})['dask.config'], dask.config.get('temporary-directory'))\n"
    )
    seen = []
    for run in ("a", "b"):
        env = {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(tmp_path / run)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
        seen.append(out.stdout.split())
    assert seen[0][0] == seen[1][0]  # the same settings in both processes
    assert seen[0][1] == "/elsewhere"  # and restoring settings leaves the scratch folder alone


@pytest.mark.cluster
def test_making_a_client_again_leaves_the_settings_unchanged() -> None:
    from distributed import Client, LocalCluster

    import dask.config

    digests = []
    for _ in range(2):
        with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster):
            assert dask.config.get("scheduler") == "dask.distributed"
            digests.append(task_settings())
    assert digests[0] == digests[1]
    assert digests[0] == task_settings()  # and equal to no client at all


def test_settings_salt_every_task_and_leave_unsalted_goldens_alone() -> None:
    dsk = {"a": DataNode("a", 1), "c": List(TaskRef("a"), 3), "d": Task("d", len, TaskRef("c"))}
    fp = Fingerprinter()
    plain = fp.fingerprint_graph(dsk)
    assert fp.fingerprint_graph(dsk, settings={}) == plain
    salted = fp.fingerprint_graph(dsk, settings={"numpy": "0" * 32})
    assert salted["a"] == plain["a"]  # a literal computes nothing
    assert salted["c"] != plain["c"] and salted["d"] != plain["d"]
    assert fp.fingerprint_graph(dsk, settings={"numpy": "1" * 32})["c"] != salted["c"]
    assert salted["c"] == _salted_list_by_hand() == "0b55b217979efd6f19da9fe42db0de08"


def _salted_list_by_hand() -> str:
    """The salted List(TaskRef("a"), 3) fingerprint, derived from the scheme by hand."""
    scheme = b"nbrewind-fp/2;"
    setting = b"5:numpy32:" + b"0" * 32
    salt = b"$" + xxhash.xxh3_128_digest(b"1:" + setting)
    a = b"@" + xxhash.xxh3_128_digest(scheme + b"D" + b"i1;")
    return xxhash.xxh3_128_hexdigest(scheme + b"T" + salt + b"[" + a + b"i3;" + b"]")


# -- 3. the files a result depends on -------------------------------------------------------------


def test_rows_carry_the_file_inputs_on_a_miss_and_on_a_hit(
    cache: TaskCache, calls: Calls, ns: dict[str, Any], tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("first")
    delayed = dask.delayed

    def run() -> Any:
        return threaded(delayed(ns["length"])(delayed(ns["read"])(str(data))))[0]

    assert run() == 5
    assert calls.take() == {"read": 1, "length": 1}
    rows = cache.drain_log()
    first_digest = file_digest(data)
    assert {r.key_prefix: r.file_inputs for r in rows} == {
        "read": {str(data): first_digest},
        "length": {str(data): first_digest},  # through its dependency
    }
    assert cache.file_inputs(rows) == {str(data): first_digest}

    assert run() == 5
    assert calls.take() == {}
    rows = cache.drain_log()
    assert [(r.key_prefix, r.hit) for r in rows] == [("length", True)]  # read was culled
    assert cache.file_inputs(rows) == {str(data): first_digest}

    data.write_text("second!")
    assert run() == 7
    assert calls.take() == {"read": 1, "length": 1}
    rows = cache.drain_log()
    assert cache.file_inputs(rows) == {str(data): file_digest(data)} != {str(data): first_digest}


def test_a_hit_reports_the_files_recorded_with_the_result(
    cache: TaskCache, calls: Calls, ns: dict[str, Any], tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("content")
    task = dask.delayed(ns["read"])(str(data))
    threaded(task)
    miss = cache.drain_log()
    assert miss[0].result_digest is not None

    # A new client-side cache (a repeat kernel): the hit's files come from the stored entry too.
    other = TaskCache(cache.root)
    with intercepting(other):
        threaded(task)
    hit = other.drain_log()
    assert [r.hit for r in hit] == [True]
    assert hit[0].file_inputs == {str(data): file_digest(data)}
    # Plain rows (as the catalog returns them) are resolved through the stored entry.
    plain = TaskLogEntry(fingerprint=hit[0].fingerprint, result_digest=hit[0].result_digest)
    assert other.file_inputs([plain]) == {str(data): file_digest(data)}
    assert other.file_inputs([dataclasses.replace(plain, result_digest=None)]) == {}


def test_reads_the_fingerprint_covers_are_not_recorded_again(
    cache: TaskCache, calls: Calls, ns: dict[str, Any], tmp_path: Path
) -> None:
    """A task that read only the file its argument names (`clean(path)`) stores no reads
    record and no reads ref: an edit of that file changes its fingerprint. One that builds
    the path while it runs keeps both, and misses once the file changed."""
    from nbrewind.tasks.reads import READS_REFS
    from nbrewind.tasks.results import read_entry

    folder = tmp_path / "in"
    folder.mkdir()
    data = folder / "data.txt"
    data.write_text("first")
    named = dask.delayed(ns["read"])(str(data))
    built = dask.delayed(ns["read_in"])(str(folder))
    assert threaded(named, built) == ("first", "first")
    rows = {r.key_prefix: r for r in cache.drain_log()}
    objects = cache.objects
    metas = {k: read_entry(objects, r.result_digest)[1] for k, r in rows.items() if r.result_digest}
    assert set(metas) == {"read", "read_in"}
    assert "reads" not in metas["read"]
    assert metas["read"]["files"] == {str(data): file_digest(data)}
    recorded = metas["read_in"]["reads"]["files"]  # relative to the working folder where under it
    assert {os.path.abspath(p): d for p, d in recorded.items()} == {str(data): file_digest(data)}
    with_reads = {name for name, _ in objects.iter_refs(READS_REFS)}
    assert rows["read_in"].fingerprint in with_reads
    assert rows["read"].fingerprint not in with_reads
    # Both still rest on the file for the cell's key.
    assert rows["read"].file_inputs == rows["read_in"].file_inputs == {str(data): file_digest(data)}

    assert threaded(named, built) == ("first", "first")
    assert calls.take() == {"read": 1, "read_in": 1}  # the first run only
    data.write_text("second")
    assert threaded(dask.delayed(ns["read"])(str(data)), built) == ("second", "second")
    assert calls.take() == {"read": 1, "read_in": 1}


def test_drained_rows_are_accepted_by_the_catalog(cache: TaskCache, ns: dict[str, Any], tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("x")
    threaded(dask.delayed(ns["read"])(str(data)))
    rows = cache.drain_log()
    with Store.open(tmp_path / "other.nbrewind", create=True) as store:
        assert store.catalog.log_tasks(rows) == 1  # file_inputs is no column
        logged = store.catalog.task_log()
    assert [(e.fingerprint, e.hit, e.result_digest) for e in logged] == [(r.fingerprint, r.hit, r.result_digest) for r in rows]


# -- 4. one notion of a function's code -----------------------------------------------------------


def _function(src: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(src), "<cell>", "exec"), namespace)
    return namespace["f"]


def test_code_digest_ignores_comments_blank_lines_and_docstrings() -> None:
    base = _function("""
        def f(x):
            y = x + 1
            return y * 2
    """)
    commented = _function("""


        def f(x):
            '''A docstring.'''
            # a comment

            y = x + 1  # another
            return y * 2
    """)
    edited = _function("""
        def f(x):
            y = x + 2
            return y * 2
    """)
    assert code_digest(base) == code_digest(commented) == code_digest(base.__code__)
    assert code_digest(edited) != code_digest(base)
    assert Fingerprinter().fingerprint_function(base) == Fingerprinter().fingerprint_function(commented)
    with pytest.raises(TypeError):
        code_digest(len)  # type: ignore[arg-type]


def test_code_info_lists_globals_and_reference_chains() -> None:
    f = _function("""
        import numpy as np
        def f(x):
            import os.path
            return np.random.default_rng(x).normal() + len(os.path.basename(PATH))
    """)
    info = code_info(f.__code__)
    assert info.global_names == ("np", "len", "PATH")
    assert ("g", "np", ("random", "default_rng")) in info.chains
    assert ("i", "os", ("path", "basename")) in info.chains
    assert "path" not in info.global_names  # an attribute, not a global
