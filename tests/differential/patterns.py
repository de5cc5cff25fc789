"""Named everyday stale-replay patterns and a runner for them.

A :class:`Pattern` is a small hand-written notebook N, its edit N' (often N
itself, or N with one cell changed or appended) and what lies on disk beside
it: ``files_audit`` are written into the audit run's working directory,
``files_repeat`` into the repeat run's *and* the fresh plain run's (a helper
module edited on disk, a new file in ``data/``); ``setup_audit`` /
``setup_repeat`` are callables for what text files cannot express (a binary
SQLite database changed outside the notebook).

The property (DESIGN.md, property 1): audit N, then repeat N' on the same
store in a new working directory, must show exactly what a fresh plain run of
N' shows: the same outputs cell by cell, the same final namespace, files,
``NBR_DIFF_*`` environment variables and seeded RNG states; and the audit must
not warn. ``why`` says what a stale replay would look like.

In-process runs share one Python process, so :func:`clean_process_state`
(used around every run) puts back what a new kernel process would start with:
it purges modules loaded from any pattern working directory, invalidates the
import caches, stops bytecode writing (no ``__pycache__`` in the compared
files, no stale ``.pyc``), and resets pandas options, numpy print/error
options, matplotlib rcParams, dask.config, ``sys.path`` (with ``''`` first, as
ipykernel has it), ``warnings.filters`` (Python's own defaults), the
decimal context, the recursion and int-to-str digit limits, the umask and the
time zone, before the run and again after it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import decimal
import gc
import importlib
import importlib.machinery
import locale
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import time
import warnings
import zipfile
import zipimport
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import dask.config
import distributed  # noqa: F401  (adds its defaults to dask.config before the snapshot)
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from IPython.core.completer import ProvisionalCompleterWarning  # noqa: E402

from differential.inprocess import RunOutcome, run_cells  # noqa: E402

Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Pattern:
    """One named notebook story; see the module docstring."""

    name: str
    why: str
    cells: tuple[str, ...]
    edited: tuple[str, ...]
    files_audit: dict[str, str] = field(default_factory=dict)
    files_repeat: dict[str, str] = field(default_factory=dict)
    setup_audit: Setup | None = None
    setup_repeat: Setup | None = None
    seeded: tuple[str, ...] = ()
    """Global RNGs the notebook seeds ("random", "numpy.random"): only their final states are compared."""
    inprocess: bool = True
    """False where an in-process shell cannot reproduce the story faithfully (kernel tier only)."""
    replays: tuple[int, ...] | None = None
    """Cells of N' the repeat must replay (minimal work); None: every cell before the first edited one,
    or none when the files or setup change between the runs."""

    @property
    def must_replay(self) -> tuple[int, ...]:
        if self.replays is not None:
            return self.replays
        if self.files_audit != self.files_repeat or self.setup_repeat is not None:
            return ()
        first = next((i for i, (a, b) in enumerate(zip(self.cells, self.edited)) if a != b), min(len(self.cells), len(self.edited)))
        return tuple(range(first))

    def describe(self) -> str:
        lines = [f"pattern {self.name}: {self.why}", "N:"]
        lines += [f"  [{i}] " + c.replace("\n", "\n      ") for i, c in enumerate(self.cells)]
        lines.append("N':" + (" (same as N)" if self.edited == self.cells else ""))
        if self.edited != self.cells:
            for i, c in enumerate(self.edited):
                mark = "*" if i >= len(self.cells) or self.cells[i] != c else " "
                lines.append(f" {mark}[{i}] " + c.replace("\n", "\n      "))
        if self.files_audit or self.files_repeat:
            lines.append(f"files before audit: {self.files_audit}")
            lines.append(f"files before repeat/fresh: {self.files_repeat}")
        if self.setup_audit or self.setup_repeat:
            lines.append(f"setup: audit {getattr(self.setup_audit, '__name__', None)}, repeat {getattr(self.setup_repeat, '__name__', None)}")
        return "\n".join(lines)


def pattern(
    name: str,
    why: str,
    cells: list[str],
    edit: dict[int, str] | None = None,
    append: list[str] | None = None,
    files: dict[str, str] | None = None,
    files_repeat: dict[str, str] | None = None,
    **more: Any,
) -> Pattern:
    """A Pattern from N, the cells `edit` replaces (by index) and the cells `append` adds.

    `files` go to every run; `files_repeat` (default: `files`) replace them for the repeat and fresh runs.
    """
    edited = list(cells)
    for index, code in (edit or {}).items():
        edited[index] = code
    edited += append or []
    files = files or {}
    return Pattern(name, why, tuple(cells), tuple(edited), dict(files), dict(files if files_repeat is None else files_repeat), **more)


# ---------------------------------------------------------------------------
# Setups that plain text files cannot express


def _sqlite_rows(path: Path, n: int) -> None:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (v INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(n)])
    con.commit()
    con.close()


def sqlite_three_rows(workdir: Path) -> None:
    """db.sqlite with rows 0..2."""
    _sqlite_rows(workdir / "db.sqlite", 3)


def sqlite_five_rows(workdir: Path) -> None:
    """db.sqlite with rows 0..4."""
    _sqlite_rows(workdir / "db.sqlite", 5)


def parquet_one_two(workdir: Path) -> None:
    """t.parquet with v = [1, 2], written by pyarrow (in C++)."""
    pd.DataFrame({"v": [1, 2]}).to_parquet(workdir / "t.parquet")


def parquet_three_four(workdir: Path) -> None:
    """t.parquet with v = [3, 4]."""
    pd.DataFrame({"v": [3, 4]}).to_parquet(workdir / "t.parquet")


def _on_a_cluster(how: str, define: str, use: str) -> list[str]:
    """A one-worker LocalCluster (`how`: its other arguments), a cell defining a task
    function, one submitting it, the close."""
    return [
        "from distributed import Client, LocalCluster\n"
        f"cluster = LocalCluster(n_workers=1, {how}, dashboard_address=None)\nclient = Client(cluster)",
        define,
        use,
        "client.close()\ncluster.close()\ndel client, cluster",
    ]


def _cluster_reads_a_file(how: str) -> list[str]:
    """`_on_a_cluster` with a task reading in.txt."""
    return _on_a_cluster(
        how,
        "def load(p):\n    with open(p) as fh:\n        return sum(int(t) for t in fh.read().split())",
        'total = client.submit(load, "in.txt").result()\nprint(total)',
    )


# ---------------------------------------------------------------------------
# The patterns

_HELPERS_V1 = "def f(x):\n    return x + 1\n"
_HELPERS_V2 = "def f(x):\n    return x * 10\n"
_ACC = "class Acc:\n    def __init__(self):\n        self.items = []\n    def apply(self, x):\n        self.items.append(x)"
_NODE_CLASS = "class Node:\n    def __init__(self, kids=()):\n        self.kids = list(kids)\n        self.val = 0"
_CLASS_C = "class C:\n    def f(self):\n        return 1"
_SCALE = "SCALE = 1\ndef f(x):\n    return x * SCALE\n"
_WARN = 'try:\n    warnings.warn("careful", UserWarning)\n    print("no error")\nexcept UserWarning as e:\n    print("raised", e)'


# An editable install (`pip install -e`) leaves distribution metadata beside the package's
# source: the package is installed, yet its files are the ones being edited and its version
# stays 1.0. Every shape of install below times every way a cell can reach its code.
_MYLIB_METADATA = "Metadata-Version: 2.1\nName: mylib\nVersion: 1.0\n"
_MYLIB_V1 = "SCALE = 1\ndef f(x):\n    return x + 1\nclass K:\n    def g(self):\n        return 'one'\n"
_MYLIB_V2 = "SCALE = 2\ndef f(x):\n    return x * 10\nclass K:\n    def g(self):\n        return 'two'\n"
_MYLIB_INSTALLS: dict[str, tuple[str, str]] = {
    # name: (folder on sys.path, metadata file below it)
    "dist_info": ("", "mylib-1.0.dist-info/METADATA"),
    "egg_info": ("", "mylib.egg-info/PKG-INFO"),
    "src_layout": ("src/", "mylib-1.0.dist-info/METADATA"),
}
_MYLIB_USES: dict[str, list[str]] = {
    "module_call": ["import mylib", "print(mylib.f(2))"],
    "from_import": ["from mylib import f", "print(f(2))"],
    "submodule": ["import mylib.sub as sub", "print(sub.f(2))"],
    "constant": ["import mylib", "print(mylib.SCALE * 3)"],
    "object_made_earlier": ["from mylib import K\nk = K()", "print(k.g())"],
}


def _installed_own_package_patterns() -> list[Pattern]:
    out = []
    for install, (folder, metadata) in _MYLIB_INSTALLS.items():
        for use, cells in _MYLIB_USES.items():
            module = "mylib/sub.py" if use == "submodule" else "mylib/__init__.py"
            common = {folder + metadata: _MYLIB_METADATA}
            if use == "submodule":
                common[folder + "mylib/__init__.py"] = ""
            first = cells
            if folder:
                first = [f"import sys\nsys.path.insert(0, {folder.rstrip('/')!r})\n" + cells[0], *cells[1:]]
            out.append(
                pattern(
                    f"own_package_{install}_{use}_edited_on_disk",
                    f"mylib, installed in development mode ({install}), edited on disk between audit and repeat "
                    f"({use}): its version says 1.0 both times, so a replay keyed by it shows the old result",
                    first,
                    files={**common, folder + module: _MYLIB_V1},
                    files_repeat={**common, folder + module: _MYLIB_V2},
                )
            )
    return out


def _zip_of(files: dict[str, str]) -> Setup:
    """A setup writing `lib.zip` holding `files`, byte for byte the same on every run."""

    def setup(workdir: Path) -> None:
        with zipfile.ZipFile(workdir / "lib.zip", "w") as archive:
            for name, text in files.items():
                archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), text)

    return setup


_EXTENSION_C = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *f(PyObject *self, PyObject *arg) { long x = PyLong_AsLong(arg); return PyLong_FromLong(%s); }
static PyMethodDef methods[] = {{"f", f, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_cext(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL) PyModule_AddIntConstant(m, "SCALE", %d);
    return m;
}
"""


def _extension(expression: str, scale: int) -> Setup:
    """A setup building extension module `cext` in the folder, its f(x) returning `expression`
    (as `build_ext --inplace` would leave it); the test is skipped where no C compiler is."""

    def setup(workdir: Path) -> None:
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            pytest.skip("no C compiler to build an extension module with")
        source = workdir / "cext.c"
        source.write_text(_EXTENSION_C % (expression, scale))
        built = workdir / ("cext" + importlib.machinery.EXTENSION_SUFFIXES[0])
        include = sysconfig.get_paths()["include"]
        subprocess.run([compiler, "-shared", "-fPIC", "-O0", "-I", include, "-o", str(built), str(source)], check=True)
        source.unlink()

    return setup


_BY_PATH = (
    "import importlib.util\nspec = importlib.util.spec_from_file_location('hm', 'code/h.py')\n"
    "hm = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(hm)\ndel spec"
)


def _module_loaded_other_ways_patterns() -> list[Pattern]:
    """Modules whose code is not a `.py` file on sys.path that sys.modules names: one inside a
    zip archive on sys.path, one executed from a file path without entering sys.modules, one
    made with types.ModuleType. Each with its file edited, and with only the reading cell
    edited (the module must then come back as the audit had it)."""
    out = []
    zip_uses = {
        "module_call": ("import zmod", "print(zmod.f(2))", "print('f', zmod.f(3))", {"zmod.py": "{}"}),
        "from_import": ("from zmod import f", "print(f(2))", "print('f', f(3))", {"zmod.py": "{}"}),
        "package_submodule": ("import zpkg.sub as sub", "print(sub.f(2))", "print('f', sub.f(3))",
                              {"zpkg/__init__.py": "", "zpkg/sub.py": "{}"}),
        "constant": ("import zmod", "print(zmod.SCALE * 3)", "print('scale', zmod.SCALE)", {"zmod.py": "{}"}),
    }
    for use, (first, second, second_edited, layout) in zip_uses.items():
        v1 = {name: text.format(_MYLIB_V1) if text else text for name, text in layout.items()}
        v2 = {name: text.format(_MYLIB_V2) if text else text for name, text in layout.items()}
        cells = ["import sys\nsys.path.insert(0, 'lib.zip')", first, second]
        out.append(pattern(
            f"zip_module_{use}_archive_rewritten",
            f"a module imported from lib.zip on sys.path ({use}), the archive rewritten between audit and repeat: "
            "its path names no regular file, so a source key of it was 'absent' both times and the reader replayed",
            cells, setup_audit=_zip_of(v1), setup_repeat=_zip_of(v2),
        ))
        out.append(pattern(
            f"zip_module_{use}_reader_edited", f"a module imported from lib.zip ({use}); only the reading cell edited",
            cells, edit={2: second_edited}, setup_audit=_zip_of(v1),
        ))
    by_path_uses = {
        "call": ("print(hm.f(2))", "print('f', hm.f(3))"),
        "constant": ("print(hm.SCALE * 3)", "print('scale', hm.SCALE)"),
        "object_made_earlier": ("k = hm.K()\nprint(k.g())", "k = hm.K()\nprint('g', k.g())"),
    }
    for use, (second, second_edited) in by_path_uses.items():
        out.append(pattern(
            f"module_by_path_{use}_file_edited",
            f"a module executed from code/h.py without entering sys.modules ({use}), the file edited: it was "
            "recorded by its name, which re-imports nothing, so the reader replayed the old result",
            [_BY_PATH, second], files={"code/h.py": _MYLIB_V1}, files_repeat={"code/h.py": _MYLIB_V2},
        ))
        out.append(pattern(
            f"module_by_path_{use}_reader_edited",
            f"a module executed from code/h.py without entering sys.modules ({use}); only the reading cell edited: "
            "restoring it by name failed",
            [_BY_PATH, second], edit={1: second_edited}, files={"code/h.py": _MYLIB_V1},
        ))
    out.append(pattern(
        "sys_path_cell_then_local_import_reader_edited",
        "sys.path.insert(0, 'lib') in one cell, import mylib in the next, the reader edited: the import cell must "
        "replay, so the path the first cell added is back before the module is (it was put back only when a "
        "cell ran, and the replayed import failed)",
        ["import sys\nsys.path.insert(0, 'lib')", "import mylib", "print(mylib.f(2))"],
        edit={2: "print('f', mylib.f(3))"}, files={"lib/mylib.py": _MYLIB_V1},
    ))
    for use, (first, second, second_edited) in {
        "module_call": ("import cext", "print(cext.f(2))", "print('f', cext.f(3))"),
        "from_import": ("from cext import f", "print(f(2))", "print('f', f(3))"),
        "constant": ("import cext", "print(cext.SCALE * 3)", "print('scale', cext.SCALE)"),
    }.items():
        out.append(pattern(
            f"extension_module_{use}_rebuilt",
            f"an extension module built in place next to the notebook ({use}), rebuilt between audit and repeat: "
            "a .so was not the notebook's own code, so the reader replayed the old result",
            [first, second], setup_audit=_extension("x + 1", 1), setup_repeat=_extension("x * 10", 2),
        ))
        out.append(pattern(
            f"extension_module_{use}_reader_edited", f"an extension module built in place ({use}); only the reader edited",
            [first, second], edit={1: second_edited}, setup_audit=_extension("x + 1", 1),
        ))
    made = "import types\ncfg = types.ModuleType('cfg')\ncfg.a = {}"
    out.append(pattern(
        "module_made_by_moduletype_edited", "a module object made with types.ModuleType, its attribute edited",
        [made.format(1), "print(cfg.a * 2)"], edit={0: made.format(2)},
    ))
    out.append(pattern(
        "module_made_by_moduletype_reader_edited",
        "a module object made with types.ModuleType; only the reader edited (the maker sets an attribute of a "
        "module, which a replay cannot do again: it runs)",
        [made.format(1), "print(cfg.a * 2)"], edit={1: "print('a', cfg.a * 3)"}, replays=(),
    ))
    return out


# A handler writing to the cell's stdout, made in a cell of its own. In process the shell's
# stdout is swapped per cell, so the handler is one NBRewind cannot make again and that cell
# always runs; the cells changing levels around it are what these patterns key.
_LOG_HANDLER = (
    "import logging, sys\nh = logging.StreamHandler(sys.stdout)\n"
    "h.setFormatter(logging.Formatter('%(levelname)s %(name)s %(message)s'))\n"
    "logging.getLogger('{logger}').addHandler(h)\ndel h"
)
_LOG_READER = "for level in (10, 20, 30):\n    logging.getLogger('{logger}').log(level, 'at %d', level)"


def _logger_patterns() -> list[Pattern]:
    """A named logger's configuration set in one cell and used by a later one: its level, a
    parent's level, `disabled`, `logging.disable`, for a logger of the notebook's own name and
    for `__main__`'s. Each with the configuring cell edited (the reader must see the new
    configuration) and with only the reader edited (the replayed configuration must be back)."""
    changes = {
        "level": ("logging.getLogger('{logger}').setLevel(logging.DEBUG)", "logging.getLogger('{logger}').setLevel(logging.WARNING)"),
        "parent_level": ("logging.getLogger('{parent}').setLevel(logging.DEBUG)", "logging.getLogger('{parent}').setLevel(logging.WARNING)"),
        "disabled": ("logging.getLogger('{logger}').setLevel(logging.DEBUG)", "logging.getLogger('{logger}').disabled = True"),
        "disable_all": ("logging.getLogger('{logger}').setLevel(logging.DEBUG)\nlogging.disable(logging.NOTSET)",
                        "logging.getLogger('{logger}').setLevel(logging.DEBUG)\nlogging.disable(logging.INFO)"),
    }
    out = []
    for who, logger, parent in (("own", "nbr.nb", "nbr"), ("main", "__main__.part", "__main__")):
        for change, (before, after) in changes.items():
            names = {"logger": logger, "parent": parent}
            cells = [_LOG_HANDLER.format(**names), before.format(**names), _LOG_READER.format(**names)]
            out.append(pattern(
                f"logger_{who}_{change}_edited",
                f"a {who} named logger's {change} edited: a replay of the reader keyed without the named "
                "loggers' configuration showed the old messages",
                cells, edit={1: after.format(**names)}, replays=(),
            ))
            # In process, the configuring cell cannot replay either: the snapshot of the named
            # loggers holds the handler NBRewind cannot make again. On a kernel it replays (below).
            out.append(pattern(
                f"logger_{who}_{change}_reader_edited",
                f"a {who} named logger's {change} set by a cell before; only the reader edited",
                cells, edit={2: _LOG_READER.format(**names) + "\nprint('read')"}, replays=(),
            ))
    for change in ("level", "disable_all"):
        names = {"logger": "nbr.nb", "parent": "nbr"}
        before, after = changes[change]
        cells = [_LOG_HANDLER.format(**names), before.format(**names), _LOG_READER.format(**names)]
        out.append(pattern(
            f"logger_{change}_on_a_kernel_edited", f"a named logger's {change} edited, on a kernel", cells,
            edit={1: after.format(**names)}, inprocess=False,
        ))
        out.append(pattern(
            f"logger_{change}_on_a_kernel_reader_edited",
            f"a named logger's {change} and handler (to the kernel's stdout, which NBRewind makes again) set by "
            "replayed cells; only the reader edited: the logger must be configured again before it runs",
            cells, edit={2: _LOG_READER.format(**names) + "\nprint('read')"}, inprocess=False,
        ))
    return out


def _own_code_in_tasks_patterns() -> list[Pattern]:
    """Dask tasks (threaded scheduler) calling the notebook's own code of each shape, directly
    and through a notebook function, the code changed between audit and repeat: the cell runs,
    and its task must miss the cache (a compiled function was fingerprinted by its name)."""
    compute = "print(dask.compute(dask.delayed({fn})(2), scheduler='threads'))"
    indirect = "def g(x):\n    return {fn}(x) + 1"
    shapes: dict[str, tuple[str, str, dict[str, Any]]] = {
        "extension_module": ("import dask, cext", "cext.f", {"setup_audit": _extension("x + 1", 1), "setup_repeat": _extension("x * 10", 2)}),
        "editable_install": ("import dask, mylib", "mylib.f", {
            "files": {"mylib/__init__.py": _MYLIB_V1, "mylib-1.0.dist-info/METADATA": _MYLIB_METADATA},
            "files_repeat": {"mylib/__init__.py": _MYLIB_V2, "mylib-1.0.dist-info/METADATA": _MYLIB_METADATA}}),
        "zip_archive": ("import sys\nsys.path.insert(0, 'lib.zip')\nimport dask, zmod", "zmod.f",
                        {"setup_audit": _zip_of({"zmod.py": _MYLIB_V1}), "setup_repeat": _zip_of({"zmod.py": _MYLIB_V2})}),
        "module_by_path": ("import dask\n" + _BY_PATH, "hm.f", {"files": {"code/h.py": _MYLIB_V1}, "files_repeat": {"code/h.py": _MYLIB_V2}}),
    }
    out = []
    for shape, (first, fn, setup) in shapes.items():
        out.append(pattern(
            f"task_calls_own_{shape}_changed", f"a task calling the notebook's own code ({shape}) that changed",
            [first, compute.format(fn=fn)], **setup,
        ))
        out.append(pattern(
            f"task_calls_own_{shape}_through_a_function_changed",
            f"a task calling a notebook function that calls the notebook's own code ({shape}) that changed",
            [first + "\n" + indirect.format(fn=fn), compute.format(fn="g")], **setup,
        ))
    return out


# Tasks that find their files while they run: the paths are in no argument or constant the
# fingerprint could see.
_TASK_READERS: dict[str, str] = {
    "open_built_path": "def load(i):\n    with open(f'd/part{i}.txt') as fh:\n        return fh.read()",
    "pathlib_built_path": "import pathlib\ndef load(i):\n    return (pathlib.Path('d') / f'part{i}.txt').read_text()",
    "listdir_then_open": "import os, pathlib\ndef load(i):\n    return [pathlib.Path('d', n).read_text() for n in sorted(os.listdir('d'))]",
    "glob_then_open": "import glob, pathlib\ndef load(i):\n    return [pathlib.Path(p).read_text() for p in sorted(glob.glob('d/*.txt'))]",
    "glob_names": "import glob\ndef load(i):\n    return sorted(glob.glob('d/*.txt'))",
    "scandir_names": "import os\ndef load(i):\n    return sorted(e.name for e in os.scandir('d'))",
    "numpy_built_path": "import numpy as np\ndef load(i):\n    return float(np.loadtxt(f'd/part{i}.txt').sum())",
    "pandas_built_path": "import pandas as pd\ndef load(i):\n    return pd.read_csv(f'd/part{i}.txt', header=None)[0].tolist()",
}
_TASK_FILES = {"d/part0.txt": "1\n2\n"}
_TASK_CHANGES: dict[str, dict[str, str]] = {
    "file_changed": {"d/part0.txt": "1\n5\n"},
    "file_added": {"d/part0.txt": "1\n2\n", "d/part1.txt": "7\n"},
}


def _task_reads_patterns() -> list[Pattern]:
    """A task (threaded scheduler) reading files by paths it builds, the files changed between
    audit and repeat: the cell ran (the session saw the reads) but the task was a cache hit,
    and a task downstream of it as well. Each reader x each change x (alone, with a
    dependent task)."""
    out = []
    for reader, code in _TASK_READERS.items():
        for change, files in _TASK_CHANGES.items():
            for shape, compute in (
                ("", "print(dask.compute(dask.delayed(load)(0), scheduler='threads'))"),
                ("_and_a_dependent", "print(dask.compute(dask.delayed(len)(dask.delayed(str)(dask.delayed(load)(0))), scheduler='threads'))"),
            ):
                out.append(pattern(
                    f"task_{reader}_{change}{shape}",
                    f"a task reading d/ by a path it builds ({reader}), {change.replace('_', ' ')}: its result (and a "
                    "dependent's) came from the cache, made from the old files",
                    ["import dask\n" + code, compute], files=_TASK_FILES, files_repeat=files,
                ))
    return out


# A library patched by a cell (always run), the patch changed: the cells after it, keyed
# on their own reads only, replayed what the old patch printed. Each: (name, the patch
# as audited, as edited or made by an edited cell, the cells around it, the reader).
_PATCHES: list[tuple[str, list[str], dict[int, str], str]] = [
    ("module_attribute", ["import math\nmath.tau = 6"], {0: "import math\nmath.tau = 7"}, "print(math.tau)"),
    ("module_attribute_removed", ["import math\nmath.nb_flag = 1"], {0: "import math"}, "print(getattr(math, 'nb_flag', None))"),
    ("class_method_lambda", ["import collections\ncollections.Counter.total2 = lambda self: sum(self.values())"],
     {0: "import collections\ncollections.Counter.total2 = lambda self: len(self)"}, "print(collections.Counter('aab').total2())"),
    ("setattr_from_an_earlier_value", ["k = 6", "import math\nsetattr(math, 'tau', k)"], {0: "k = 7"}, "print(math.tau)"),
    ("builtins_name", ["import builtins\nbuiltins.SCALE = 1"], {0: "import builtins\nbuiltins.SCALE = 2"}, "print(SCALE)"),
    ("argv_for_argparse", ["import sys\nsys.argv = ['prog', '--n', '3']"], {0: "import sys\nsys.argv = ['prog', '--n', '4']"},
     "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--n', type=int)\nprint(parser.parse_args().n)"),
    ("method_defined_in_another_cell", ["def twice(self):\n    return self * 2", "import fractions\nfractions.Fraction.twice = twice"],
     {0: "def twice(self):\n    return self * 3"}, "print(fractions.Fraction(1, 3).twice())"),
    ("library_function_replaced", ["import statistics\nstatistics.mean = lambda xs: 'v1'"],
     {0: "import statistics\nstatistics.mean = lambda xs: 'v2'"}, "import statistics\nprint(statistics.mean([1, 2]))"),
    ("accessor_body", ["import pandas as pd\n@pd.api.extensions.register_series_accessor('nb')\nclass Nb:\n    def __init__(self, s):\n"
     "        self._s = s\n    def top(self):\n        return float(self._s.max())"],
     {0: "import pandas as pd\n@pd.api.extensions.register_series_accessor('nb')\nclass Nb:\n    def __init__(self, s):\n"
      "        self._s = s\n    def top(self):\n        return float(self._s.min())"}, "print(pd.Series([1.0, 3.0]).nb.top())"),
]


def _replayed_code_patterns() -> list[Pattern]:
    """A function (a method, a lambda, a comprehension inside one) defined by a replayed cell
    raises or warns in a cell that runs: its code came back from the store with cloudpickle's
    "<dynamic-code>" as its file, so the traceback showed no cell and no source lines, and the
    warning no line. Kernel tier: the cell file names are ipykernel's."""
    defined = {
        "function": ("def f(x):\n    if x > 1:\n        raise ValueError('big')\n    return x", "f({})"),
        "method": ("class C:\n    def f(self, x):\n        if x > 1:\n            raise ValueError('big')\n        return x", "C().f({})"),
        "lambda": ("f = lambda x: [1][x]", "f({})"),
        "comprehension": ("def f(x):\n    return [1 / (x - i) for i in range(3)]", "f({})"),
    }
    out = []
    for name, (code, call) in defined.items():
        out.append(pattern(
            f"replayed_{name}_raises_in_a_cell_that_runs",
            f"a {name} defined by a replayed cell raised in the edited cell: the traceback showed <dynamic-code> without source",
            [code, call.format(0)], edit={1: call.format(0) + "\n" + call.format(2)}, inprocess=False,
        ))
    out.append(pattern(
        "replayed_function_warns_in_a_cell_that_runs",
        "a function defined by a replayed cell warned in the edited cell: the warning named <dynamic-code>, without its line",
        ["import warnings\ndef f():\n    warnings.warn('careful')\n    return 1", "print('a')"], edit={1: "print('a', f())"}, inprocess=False,
    ))
    return out


# State a local module keeps in its own functions and classes, changed by a call. Each:
# (name, mylib.py, the changing call as audited, as edited, the reader).
_MODULE_CODE_STATE: list[tuple[str, str, str, str, str]] = [
    ("class_attribute", "class Reg:\n    items = []\n\ndef add(x):\n    Reg.items.append(x)\n", "mylib.add(1)", "mylib.add(2)",
     "print(mylib.Reg.items)"),
    ("class_attribute_rebound", "class Conf:\n    level = 0\n\ndef set_level(n):\n    Conf.level = n\n", "mylib.set_level(1)",
     "mylib.set_level(2)", "print(mylib.Conf.level)"),
    ("mutable_default", "def add(x, acc=[]):\n    acc.append(x)\n    return acc\n", "mylib.add(1)", "mylib.add(2)", "print(mylib.add(0))"),
    ("keyword_default", "def add(x, *, acc={}):\n    acc[x] = 1\n    return sorted(acc)\n", "mylib.add(1)", "mylib.add(2)", "print(mylib.add(0))"),
    ("function_attribute", "def add(x):\n    add.total = getattr(add, 'total', 0) + x\n    return add.total\n", "mylib.add(1)", "mylib.add(2)",
     "print(mylib.add(0))"),
    ("closure_counter", "def counted(f):\n    n = [0]\n    def wrapper(x):\n        n[0] += x\n        return f(n[0])\n    return wrapper\n\n"
     "@counted\ndef show(v):\n    return v\n", "mylib.show(1)", "mylib.show(2)", "print(mylib.show(0))"),
    ("lru_cache_of_a_file", "import functools\n\n@functools.lru_cache\ndef load(p):\n    with open(p) as f:\n        return f.read()\n",
     "mylib.load('d.txt')", "mylib.load('d.txt')\nwith open('d.txt', 'w') as f:\n    f.write('other')", "print(mylib.load('d.txt'))"),
    ("cache_with_output", "import functools\n\n@functools.cache\ndef sq(x):\n    print('computing', x)\n    return x * x\n", "mylib.sq(2)",
     "mylib.sq(3)", "print(mylib.sq(2))"),
    ("cached_method", "import functools\n\nclass Store:\n    @functools.lru_cache\n    def get(self, k):\n        print('miss', k)\n        return k\n\n"
     "S = Store()\n", "mylib.S.get(1)", "mylib.S.get(2)", "print(mylib.S.get(1))"),
]


def _module_code_state_patterns() -> list[Pattern]:
    """The changing cell edited (the reader replayed the old state: module data was keyed on
    its plain attributes only), and kept with the reader edited (the state a replay puts back,
    or the cell using a cache runs)."""
    out = []
    for name, lib, call, edited_call, reader in _MODULE_CODE_STATE:
        files = {"mylib.py": lib, "d.txt": "data"}
        out.append(pattern(
            f"module_{name}_changed_by_an_edited_cell",
            f"a local module's {name.replace('_', ' ')} changed by a call, the call edited: the reader replayed the old state",
            ["import mylib", call, reader], edit={1: edited_call}, files=files,
        ))
        out.append(pattern(
            f"module_{name}_kept_reader_edited",
            f"a local module's {name.replace('_', ' ')} changed by a replayed call: the edited reader sees it as a fresh run does",
            ["import mylib", call, reader], edit={2: reader + "\nprint('again')"}, files=files,
            replays=(0,) if "cache" in name else None,
        ))
    return out


# A Dask task doing something besides returning a value: a hit skipped it. Each: (name, the
# function's module-level setup and body, the reader cell showing the effect or "").
_TASK_EFFECTS: list[tuple[str, str, str]] = [
    ("prints", "def f(x):\n    print('in task', x)\n    return x", ""),
    ("logs", "import logging, sys\nlogging.basicConfig(stream=sys.stdout, level=logging.INFO, force=True, format='%(message)s')\n"
     "def f(x):\n    logging.info('task %s', x)\n    return x", ""),
    ("warns", "import warnings\ndef f(x):\n    warnings.warn('from a task')\n    return x", ""),
    ("appends_to_a_global", "seen = []\ndef f(x):\n    seen.append(x)\n    return x", "print(seen)"),
    ("sets_an_item_of_a_global", "seen = {}\ndef f(x):\n    seen[x] = True\n    return x", "print(seen)"),
    ("counts_on_a_class", "class K:\n    n = 0\ndef f(x):\n    K.n += 1\n    return x", "print(K.n)"),
    ("sets_a_global", "total = 0\ndef f(x):\n    global total\n    total += x\n    return x", "print(total)"),
    ("draws_from_the_global_rng", "import random\nrandom.seed(3)\ndef f(x):\n    return x + random.random()", "print(round(random.random(), 6))"),
    ("calls_a_helper_that_prints", "def helper(x):\n    print('helper', x)\ndef f(x):\n    helper(x)\n    return x", ""),
    ("writes_a_file", "def f(x):\n    with open('out.txt', 'w') as fh:\n        fh.write(str(x))\n    return x",
     "with open('out.txt') as fh:\n    print(fh.read())"),
    ("changes_its_argument", "acc = {}\ndef f(d):\n    d['hit'] = True\n    return len(d)", "print(acc)"),
]


def _task_effect_patterns() -> list[Pattern]:
    """Each effect, the task run by a delayed call and by a bag's map; the compute cell edited
    (it runs, its task was a hit): the effect was missing from its output or a later cell."""
    out = []
    for name, define, reader in _TASK_EFFECTS:
        arg = "acc" if name == "changes_its_argument" else "1"
        for shape, compute in (
            ("delayed", f"print(dask.compute(dask.delayed(f)({arg}), scheduler='sync'))"),
            ("bag_map", f"print(db.from_sequence([{arg}], npartitions=1).map(f).compute(scheduler='sync'))"),
        ):
            if name == "changes_its_argument" and shape == "bag_map":
                continue  # a bag's items are the graph's, not the notebook's object
            cells = ["import dask, dask.bag as db\n" + define, compute] + ([reader] if reader else [])
            seeded = ("random",) if "rng" in name else ()
            out.append(pattern(
                f"task_{name}_{shape}",
                f"a task that {name.replace('_', ' ')}, its cell edited: the task was a cache hit and its effect was missing",
                cells, edit={1: compute.replace("print(", "print('again', ", 1)}, seeded=seeded,
                # A handler on sys.stdout cannot be stored: that cell runs again, as it must.
                replays=() if name == "logs" else None,
            ))
    return out


def _library_patch_patterns() -> list[Pattern]:
    """A patch edited (or the value it patches in), read by a later cell; and one patch kept,
    where the cell between replays (the patched state is keyed alike in both kernels).
    Kernel tier: in process, every run shares the patched library."""
    out = [
        pattern(
            f"library_patch_{name}_edited",
            "a cell patching a library always runs, and ran with the edit; the later cell reading the library was keyed "
            "on its own reads only and replayed what the old patch printed",
            [*cells, reader], edit=edit, inprocess=False,
            replays=(),
        )
        for name, cells, edit, reader in _PATCHES
    ]
    out.append(pattern(
        "library_patch_kept_reader_between_replays",
        "the patch unchanged: the reader between it and the edited last cell replays (same patched state in both kernels)",
        ["def twice(self):\n    return self * 2", "import fractions\nfractions.Fraction.twice = twice",
         "print(fractions.Fraction(1, 3).twice())", "print('end')"],
        edit={3: "print('end', fractions.Fraction(1, 5).twice())"}, inprocess=False, replays=(0, 2),
    ))
    return out


# Settings holding the notebook's functions, and IPython's display: a formatter edited, a
# later cell replayed what the old one printed (keyed by the function's name alone, or
# not at all). Each: (name, the setting cell as audited, as edited, the reader).
_SETTING_CODE: list[tuple[str, str, str, str]] = [
    ("pandas_float_format_lambda", "import pandas as pd\npd.options.display.float_format = lambda v: f'{v:.2f}'",
     "import pandas as pd\npd.options.display.float_format = lambda v: f'{v:.4f}'", "print(pd.DataFrame({'a': [1.23456]}))"),
    ("pandas_float_format_str_format", "import pandas as pd\npd.set_option('display.float_format', '{:.2f}'.format)",
     "import pandas as pd\npd.set_option('display.float_format', '{:.3f}'.format)", "print(pd.DataFrame({'a': [1.23456]}))"),
    ("pandas_float_format_function", "import pandas as pd\ndef fmt(v):\n    return f'{v:.2f}'\npd.set_option('display.float_format', fmt)",
     "import pandas as pd\ndef fmt(v):\n    return f'{v:.3f}'\npd.set_option('display.float_format', fmt)", "print(pd.DataFrame({'a': [1.23456]}))"),
    ("pandas_float_format_reads_a_global", "import pandas as pd\nP = 2\npd.set_option('display.float_format', lambda v: f'{v:.{P}f}')",
     "import pandas as pd\nP = 3\npd.set_option('display.float_format', lambda v: f'{v:.{P}f}')", "print(pd.DataFrame({'a': [1.23456]}))"),
    # A formatter must return text (pandas 3 takes the len() of what it returns).
    ("pandas_float_format_partial", "import functools, pandas as pd\npd.set_option('display.float_format', functools.partial('{:.{ndigits}f}'.format, ndigits=1))",
     "import functools, pandas as pd\npd.set_option('display.float_format', functools.partial('{:.{ndigits}f}'.format, ndigits=3))", "print(pd.DataFrame({'a': [1.23456]}))"),
    ("numpy_print_formatter", "import numpy as np\nnp.set_printoptions(formatter={'float': lambda v: f'{v:.1f}'})",
     "import numpy as np\nnp.set_printoptions(formatter={'float': lambda v: f'{v:.3f}'})", "import numpy as np\nprint(np.array([1.23456]))"),
    ("dask_config_function", "import dask\n_ = dask.config.set({'nb.fn': lambda: 1})", "import dask\n_ = dask.config.set({'nb.fn': lambda: 2})",
     "import dask\nprint(dask.config.get('nb.fn')())"),
    ("ipython_interactivity", "get_ipython().ast_node_interactivity = 'all'", "get_ipython().ast_node_interactivity = 'last_expr'", "1 + 1\n2 + 2"),
    ("ipython_printer_for_type", "get_ipython().display_formatter.formatters['text/plain'].for_type(float, lambda o, p, c: p.text('F%.1f' % o))",
     "get_ipython().display_formatter.formatters['text/plain'].for_type(float, lambda o, p, c: p.text('G%.1f' % o))", "2.5"),
    ("ipython_precision_magic", "%precision 2", "%precision 4", "3.14159265"),
    ("ipython_pprint_magic", "%pprint", "pass", "list(range(40))"),
]


def _setting_code_patterns() -> list[Pattern]:
    """Each setting edited (the reader runs), and kept with the reader edited (the setting
    cell replays, or runs where it must, and the reader sees it as set)."""
    out = []
    for name, before, after, reader in _SETTING_CODE:
        out.append(pattern(
            f"setting_{name}_edited",
            "a setting holding the notebook's code (or IPython's display) edited: the reader replayed what the old one printed",
            [before, reader], edit={0: after},
        ))
        out.append(pattern(
            f"setting_{name}_kept",
            "the setting kept, the reader edited: the setting is put back as it was",
            [before, reader, "print('end')"], edit={2: "print('end')\n" + reader.rsplit("\n", 1)[-1]},
            replays=() if "get_ipython" in before or before.startswith("%") else None,
        ))
    out.append(pattern(
        "ipython_xmode_edited_on_a_kernel",
        "%xmode Plain edited to Minimal: a later failing cell replayed its Plain traceback (kernel tier: in process "
        "only the exception is recorded)",
        ["%xmode Plain", "def fail():\n    raise ValueError('x')\nfail()"], edit={0: "%xmode Minimal"}, inprocess=False,
    ))
    out.append(pattern(
        "dir_without_arguments_after_a_del_edited",
        "dir() lists the notebook's names: `del x` edited away, and the cell printing 'x' in dir() replayed False",
        ["x = 1", "del x", "print('x' in dir())"], edit={1: "pass"},
    ))
    return out


_UNPICKLABLE = (
    "import threading\nclass Held:\n    def __init__(self):\n        self.lock = threading.Lock()\n"
    "    def __repr__(self):\n        return 'Held()'"
)
_HISTORY_PRODUCERS = (
    # (label, cells ending before the reader, the count of the cell shown by name or value, first cell edited)
    ("values", ["1 + 1", "2 * 3", "[7] * 2"], 2, "1 + 5"),
    ("named", ["a = [1]", "a", "b = 2"], 2, "a = [3]"),
    ("named_changed_in_place", ["a = [1]", "a", "a.append(2)"], 2, "a = [3]"),
    ("named_bound_anew", ["a = [1]", "a", "a = [5]"], 2, "a = [3]"),
    ("named_changed_then_bound_anew", ["a = [1]", "a", "a.append(2)\nb = a", "a = 0"], 2, "a = [3]"),
    ("suppressed_and_printed", ["1 + 1", "2 + 2;", "print(3)", "None"], 1, "1 + 5"),
    ("frame", ["import pandas as pd\ndf = pd.DataFrame({'x': [1, 2]})", "df.describe()", "df['y'] = df.x * 2", "df"], 2,
     "import pandas as pd\ndf = pd.DataFrame({'x': [1, 5]})"),
    ("unstorable_by_name", [_UNPICKLABLE + "\nheld = Held()\nn = 1", "held", "n"], 2, _UNPICKLABLE + "\nheld = Held()\nn = 4"),
    ("function_result", ["def f(k):\n    return {'k': k}", "f(1)", "f(2)['k']"], 2, "def f(k):\n    return {'k': k + 1}"),
)
_HISTORY_READERS = (
    ("unders", "print(repr(_), repr(__), repr(___))"),
    ("indexed", "print(repr(Out[{k}]), repr(_{k}))"),
    ("keys", "print(sorted(Out), len(_oh), _ is Out[max(Out)] if Out else None)"),
)


def _output_history_patterns() -> list[Pattern]:
    """Cells that show values, then a cell reading IPython's output history: the reader
    edited (the shows replay and must leave `_`, `Out[N]`, `_N` as a run leaves them), the
    first cell edited, and a cell inserted before them all (every count moves)."""
    out = []
    for label, cells, k, first in _HISTORY_PRODUCERS:
        for reader_label, reader in _HISTORY_READERS:
            read = reader.format(k=k)
            whole = [*cells, read]
            why = f"{label} shown, then {reader_label} read: a replayed cell's result was not in the output history"
            out.append(pattern(f"history_{label}_{reader_label}_reader_edited", why, whole, edit={len(cells): "print('x')\n" + read}))
            out.append(pattern(f"history_{label}_{reader_label}_first_edited", why, whole, edit={0: first}))
            out.append(Pattern(
                f"history_{label}_{reader_label}_cell_inserted", why + " (every count moves)", tuple(whole),
                ("z = 0", *whole), replays=(),
            ))
    for label, read in (
        ("eval", "print(eval('Out[3]'), eval('_1'), eval('_'))"),
        ("user_ns", "print(get_ipython().user_ns['Out'][3])"),
    ):
        out.append(pattern(
            f"history_read_through_{label}_reader_edited",
            "the output history read where only the text names it: a replayed cell's result was missing",
            ["1 + 1", "a = [3]", "a", "a.append(4)", read], edit={4: "print('x')\n" + read},
        ))
    return out


_LIBRARY_CALLS = (
    # (label, imports, the call that changes state a library keeps, the same call edited, a reader)
    ("calendar_first_weekday", "import calendar", "calendar.setfirstweekday(6)", "calendar.setfirstweekday(0)",
     "print(calendar.firstweekday(), calendar.weekheader(2))"),
    ("mimetypes_added_type", "import mimetypes", "mimetypes.add_type('text/x-foo', '.foo')",
     "mimetypes.add_type('text/x-bar', '.foo')", "print(mimetypes.guess_type('a.foo'))"),
    ("switch_interval", "import sys", "sys.setswitchinterval(0.002)", "sys.setswitchinterval(0.003)",
     "print(sys.getswitchinterval())"),
    ("tqdm_pandas", "import pandas as pd\nfrom tqdm.auto import tqdm", "tqdm.pandas(disable=True)",
     "tqdm.pandas(disable=True, desc='b')", "print(pd.Series([1, 2]).progress_apply(lambda v: v + 1).tolist())"),
    ("dask_normalize_token", "from dask.base import normalize_token, tokenize\nclass P:\n    def __init__(self, v):\n        self.v = v",
     "normalize_token.register(P)(lambda p: ('P', p.v))", "normalize_token.register(P)(lambda p: ('P', p.v + 1))",
     "print(tokenize(P(1)) == tokenize(P(1)), tokenize(P(1)) == tokenize(P(2)))"),
    ("copyreg_reducer", "import copyreg, pickle\nclass Q:\n    pass", "copyreg.pickle(Q, lambda q: (int, (7,)))",
     "copyreg.pickle(Q, lambda q: (int, (8,)))", "print(pickle.loads(pickle.dumps(Q())))"),
)


def _edited_and_kept(name: str, cells: list[str], edit: dict[int, str], why: str, why_kept: str, *, replays: tuple[int, ...]) -> list[Pattern]:
    """`name`_edited (N' applies `edit`) and `name`_kept (N' edits only the reader, the last
    cell, which must then find the library as the cells above left it); kernel tier."""
    reader = cells[-1]
    return [
        pattern(f"{name}_edited", why, cells, edit=edit, inprocess=False),
        pattern(f"{name}_kept", why_kept, cells, edit={len(cells) - 1: "print('x')\n" + reader}, inprocess=False, replays=replays),
    ]


def _library_call_state_patterns() -> list[Pattern]:
    """A library call that changes what the library keeps (no attribute of the notebook's,
    no known setting): edited, a later reader replayed the old state; kept, a reader that
    ran after the call's replay found the library as it was before the call. Kernel tier:
    in process the library keeps what the audit's run left."""
    out = []
    for label, imports, call, edited, reader in _LIBRARY_CALLS:
        out += _edited_and_kept(
            f"library_call_{label}", [imports, call, reader], {1: edited}, f"{call} edited: a reader replayed what the old call left",
            f"{call} kept, the reader edited: the reader must find the library as the call left it", replays=(0,),
        )
    # Where and how the call is written: amid other statements, in a block, through an alias,
    # a method of a library object, an argument from an earlier cell (that cell edited).
    reader = "print(calendar.firstweekday())"
    for label, cells, edit in (
        ("amid_statements", ["import calendar\nx = 1\ncalendar.setfirstweekday(6)\ny = 2", reader], {0: "import calendar\nx = 1\ncalendar.setfirstweekday(5)\ny = 2"}),
        ("in_a_block", ["import calendar\nfor d in (3, 6):\n    calendar.setfirstweekday(d)", reader], {0: "import calendar\nfor d in (3, 5):\n    calendar.setfirstweekday(d)"}),
        ("through_an_alias", ["import calendar\nfrom calendar import setfirstweekday as first\nfirst(6)", reader], {0: "import calendar\nfrom calendar import setfirstweekday as first\nfirst(5)"}),
        ("library_object_method", ["import calendar\ncalendar.c.setfirstweekday(6)", reader], {0: "import calendar\ncalendar.c.setfirstweekday(5)"}),
        ("argument_from_a_cell", ["import calendar\nday = 6", "calendar.setfirstweekday(day)", reader], {0: "import calendar\nday = 5"}),
    ):
        out += _edited_and_kept(
            f"library_call_calendar_{label}", cells, edit, "calendar.setfirstweekday written another way, edited: the reader replayed the old day",
            "calendar.setfirstweekday written another way, kept: the reader must see the day it set", replays=(),
        )
    return out


# How a cell reaches an object a library keeps (http.client.responses, a dict), and what it
# does to it. Stored by value, a name bound by `from http.client import responses` came back
# as a copy; item stores, `del` and calls through a notebook function were not seen at all.
_LIBRARY_REACHES = ("module_chain", "from_import", "alias_of_import", "in_function", "in_nested_function")
_LIBRARY_OPS = (
    # (label, the change with {T} for the object and {v} for the value, the two values, a reader)
    ("item_store", "{T}[299] = {v}", ("'Custom'", "'Other'"), "print(http.client.responses.get(299))"),
    ("augmented_store", "{T}[200] += {v}", ("'!'", "'?'"), "print(http.client.responses[200])"),
    ("delete", "del {T}[{v}]", ("200", "201"), "print(http.client.responses.get(200), http.client.responses.get(201))"),
    ("update_call", "{T}.update({{299: {v}}})", ("'Custom'", "'Other'"), "print(http.client.responses.get(299))"),
)
_LIBRARY_OBJECTS = (
    # (label, set-up cell, the change, the change edited, a reader)
    ("copyreg_dispatch_table", "import copyreg, pickle\nclass Q:\n    pass", "copyreg.dispatch_table[Q] = lambda q: (int, (7,))",
     "copyreg.dispatch_table[Q] = lambda q: (int, (8,))", "print(pickle.loads(pickle.dumps(Q())))"),
    ("sys_modules_injected", "import sys, types", "sys.modules['nbr_fake'] = types.SimpleNamespace(v=1)",
     "sys.modules['nbr_fake'] = types.SimpleNamespace(v=2)", "import nbr_fake\nprint(nbr_fake.v)\ndel nbr_fake"),
    ("rcparams_from_import", "from matplotlib import rcParams\nimport matplotlib", "rcParams['lines.linewidth'] = 3",
     "rcParams['lines.linewidth'] = 4", "print(matplotlib.rcParams['lines.linewidth'])"),
    ("environ_from_import", "from os import environ\nimport os", "environ['NBR_DIFF_A'] = '1'", "environ['NBR_DIFF_A'] = '2'",
     "print(os.environ.get('NBR_DIFF_A'))\ndel environ"),  # the kernels' environments differ beyond it
    ("sys_path_from_import", "from sys import path\nimport sys", "path.append('/nbr-x')", "path.append('/nbr-y')",
     "print(sys.path[-1])\ndel path"),  # the folders on it differ between the runs
    ("sys_path_appended", "import sys", "sys.path.append('/nbr-x')", "sys.path.append('/nbr-y')", "print(sys.path[-1])"),
    ("calendar_through_a_function_in_a_comprehension", "import calendar\ndef first(d):\n    calendar.setfirstweekday(d)",
     "days = [first(d) for d in (2, 6)]", "days = [first(d) for d in (2, 5)]", "print(calendar.firstweekday())"),
)
# The diagonal of reaches x operations runs by default; every pair with -m slow.
_LIBRARY_DIAGONAL = [(r, _LIBRARY_OPS[i % len(_LIBRARY_OPS)][0]) for i, r in enumerate(_LIBRARY_REACHES)]


def _library_object_cells(reach: str, change: str, value: str, reader: str) -> tuple[list[str], int]:
    """The cells of one reach x operation pattern, and the index of the cell whose value is edited."""
    if reach in ("module_chain", "from_import", "alias_of_import"):
        setup, target = {
            "module_chain": ("import http.client", "http.client.responses"),
            "from_import": ("from http.client import responses\nimport http.client", "responses"),
            "alias_of_import": ("from http.client import responses\nimport http.client\ncodes = responses", "codes"),
        }[reach]
        return [setup, change.format(T=target, v=value), reader], 1
    body = "import http.client\ndef change(v):\n    " + change.format(T="http.client.responses", v="v")
    if reach == "in_function":
        return [body, f"change({value})", reader], 1
    return [body, "def setup(v):\n    for _ in range(1):\n        change(v)", f"setup({value})", reader], 2


def _library_object_patterns() -> list[Pattern]:
    """Objects a library keeps, changed by item stores, `del`, augmented stores or calls,
    reached through the module, a name an import bound, another name for it, or notebook
    functions: edited, a reader replayed what the old change left; kept, a reader that ran
    found the library as it was before (the change went into a restored copy, or its replay
    did nothing). Kernel tier: in process the library keeps what the audit's run left."""
    out = []
    for reach in _LIBRARY_REACHES:
        for label, change, (first, second), reader in _LIBRARY_OPS:
            cells, at = _library_object_cells(reach, change, first, reader)
            edited, _ = _library_object_cells(reach, change, second, reader)
            how = f"http.client.responses changed ({label}) {reach.replace('_', ' ')}"
            out += _edited_and_kept(f"library_object_{reach}_{label}", cells, {at: edited[at]}, f"{how}, edited", f"{how}, the reader edited", replays=(0,))
    for label, imports, name, owner in (
        ("http_responses", "from http.client import responses\nimport http.client", "responses", "http.client.responses"),
        ("os_environ", "from os import environ\nimport os", "environ", "os.environ"),
        ("rcparams", "from matplotlib import rcParams\nimport matplotlib", "rcParams", "matplotlib.rcParams"),
        ("sys_path_alias", "import sys\nsearch = sys.path", "search", "sys.path"),
    ):
        reader = f"print({name} is {owner}, type({name}).__name__)\ndel {name}"
        out.append(pattern(
            f"library_object_{label}_identity", f"{name} is {owner} after a replay: it came back as a copy",
            [imports, reader], edit={1: "print('x')\n" + reader},
        ))
    for label, setup, change, changed, reader in _LIBRARY_OBJECTS:
        out += _edited_and_kept(
            f"library_object_{label}", [setup, change, reader], {1: changed}, f"{change} edited: a reader replayed what the old change left",
            f"{change} kept, the reader edited: it must find the library as the change left it", replays=(0,),
        )
    return out


_COW_VIEWS = (
    ("column", "s = df['x']", True),
    ("attribute", "s = df.y", True),
    ("series_slice", "s = df['y'].iloc[1:]", True),
    ("rows", "s = df.iloc[:2]", False),
    ("columns", "s = df[['x', 'y']]", False),
    ("head", "s = df.head(2)", False),
    ("shallow_copy", "s = df.copy(deep=False)", False),
    ("renamed", "s = df.rename(columns={'x': 'w'})", False),
)


def _copy_on_write_patterns() -> list[Pattern]:
    """pandas objects that share a frame's memory under copy-on-write (`s = df['x']`, a
    row slice, a shallow copy...), restored, then written through one of them in an edited
    cell: live, the write copies first and the other one keeps its values; restored without
    their shared references, the write went through to both."""
    out = []
    for label, view, is_series in _COW_VIEWS:
        at = "[0]" if is_series else "[0, 0]"
        for writer, target in (("view", f"s.iloc{at}"), ("owner", "df.iloc[0, 0]")):
            out.append(pattern(
                f"copy_on_write_{label}_written_through_the_{writer}",
                f"{view}, then {target} = ... edited: the repeat's restored frames shared memory without "
                f"pandas' copy-on-write references, so the write showed in both",
                ["import pandas as pd\ndf = pd.DataFrame({'x': [3, 1, 2], 'y': [1.0, None, 3.0], 'z': [4.0, 5.0, 6.0]})",
                 view, f"{target} = 100\nprint(df)\nprint(s)"],
                edit={2: f"{target} = 200\nprint(df)\nprint(s)"},
            ))
    return out


# np.matrix warns that it is not recommended (an error under the test run's warning filters).
_QUIET = "import warnings\nwarnings.simplefilter('ignore', PendingDeprecationWarning)\n"
_SUBCLASS_VIEWS = (
    ("matrix_over_an_array", _QUIET + "import numpy as np\na = np.zeros((2, 2))", "v = np.asmatrix(a)", "v[0, 0]", "a[0, 0]"),
    ("array_over_a_matrix", _QUIET + "import numpy as np\na = np.asmatrix(np.ones((2, 2)))", "v = np.asarray(a)", "v[0, 0]", "a[0, 0]"),
    ("row_of_a_matrix", _QUIET + "import numpy as np\na = np.asmatrix(np.ones((2, 2)))", "v = a[1]", "v[0, 0]", "a[1, 0]"),
    ("recarray_over_a_structured_array", "import numpy as np\na = np.zeros(3, dtype=[('x', 'f8'), ('y', 'i4')])", "v = a.view(np.recarray)", "v.x[0]", "a['x'][0]"),
    ("field_of_a_recarray", "import numpy as np\na = np.zeros(3, dtype=[('x', 'f8'), ('y', 'i4')]).view(np.recarray)", "v = a.x", "v[0]", "a.x[0]"),
)


def _subclass_view_patterns() -> list[Pattern]:
    """A numpy subclass (`np.matrix`, `np.recarray`) and an array sharing its memory,
    restored, then written through one of them in an edited cell: stored as copies, the
    write no longer showed through the other."""
    out = []
    for label, make, view, through_view, through_root in _SUBCLASS_VIEWS:
        for writer, target in (("view", through_view), ("root", through_root)):
            out.append(pattern(
                f"numpy_{label}_written_through_the_{writer}",
                f"{view}, then {target} = ... edited: a restored subclass view was a copy",
                [make, view, f"{target} = 5\nprint(a)\nprint(v)"],
                edit={2: f"{target} = 7\nprint(a)\nprint(v)"},
            ))
    return out


_FREED_KINDS = {
    "array": "np.ones(4)",
    "frame": "pd.DataFrame({'v': [1, 2]})",
    "instance": "Box()",
    # Only the cyclic collector frees it: loaded after the drop with a co-variable (`alive`),
    # its copy outlived the cell's `gc.collect()`.
    "cycle": "Box()\nx.me = x",
    "set": "{1, 2}",
    "function": "lambda: 1",
}
_FREED_DROPS = {
    "deleted": "del x",
    "rebound": "x = None",
    "popped_from_globals": "globals().pop('x')",
    "deleted_by_exec": "exec('del x')",
}


def _freed_value_patterns() -> list[Pattern]:
    """A value a cell drops is freed when a plain kernel frees it: the kernel compared each
    name with its last checkpointed object, held strongly, so the object lived until the
    cell ended (a weak reference to it still alive; a cell replacing a large array held both)."""
    setup = "import gc\nimport weakref\nimport numpy as np\nimport pandas as pd\nclass Box:\n    pass\n"
    # (name, why, the value, the dropping cell, its edit), over every way to drop it.
    stories = [
        (
            f"{kind}_freed_inside_the_cell",
            f"a {kind} dropped with `{{how}}` stayed alive until the cell ended (False where a fresh run prints True)",
            make,
            "{how}\ngc.collect()\nprint(alive() is None)",
            "{how}\ngc.collect()\nprint('freed', alive() is None)",
        )
        for kind, make in _FREED_KINDS.items()
    ] + [
        (
            "cycle_kept_until_a_full_collection",
            "a self-referencing object dropped with `{how}` lives until the next full collection, not less",
            _FREED_KINDS["cycle"],
            "{how}\nprint(alive() is None)\ngc.collect()\nprint(alive() is None)",
            "{how}\nprint('kept', alive() is None)\ngc.collect()\nprint('freed', alive() is None)",
        )
    ]
    return [
        pattern(
            f"{drop}_{name}",
            why.format(how=how),
            [f"{setup}x = {make}\nalive = weakref.ref(x)", cell.format(how=how)],
            edit={1: edited.format(how=how)},
        )
        for name, why, make, cell, edited in stories
        for drop, how in _FREED_DROPS.items()
    ]


# A file dropped unclosed warns (an error under the test run's warning filters).
_UNCLOSED = "import warnings\nwarnings.simplefilter('ignore', ResourceWarning)\n"
# A value whose death the notebook sees: what the drop prints or writes, and a check after it.
_FINALIZING_KINDS = {
    "class_with_del": (
        "class Noisy:\n    def __del__(self):\n        print('finalized')\nx = Noisy()",
        "print('after')",
    ),
    "del_writing_a_file": (
        "class Log:\n    def __del__(self):\n        with open('log.txt', 'a') as f:\n            f.write('closed;')\nx = Log()",
        "print(pathlib.Path('log.txt').read_text() if os.path.exists('log.txt') else 'no log')",
    ),
    "weakref_finalize_bound": (
        "class B:\n    pass\nx = B()\nf = weakref.finalize(x, print, 'finalized')",
        "print(f.alive)",
    ),
    "weakref_finalize_unbound": (
        "class B:\n    pass\nx = B()\nweakref.finalize(x, print, 'finalized')\nx.n = 1",
        "print('after')",
    ),
    "open_file_with_buffered_write": (
        _UNCLOSED + "x = open('out.txt', 'w')\nx.write('buffered')",
        "print(pathlib.Path('out.txt').read_text())",
    ),
    "generator_suspended_in_try": (
        "def gen():\n    try:\n        yield 1\n        yield 2\n    finally:\n        print('closed')\nx = gen()\nnext(x)",
        "print('after')",
    ),
    "list_of_objects_with_del": (
        "class Noisy:\n    def __del__(self):\n        print('finalized')\nx = [Noisy(), Noisy()]",
        "print('after')",
    ),
    "dict_holding_an_open_file": (
        _UNCLOSED + "x = {'log': open('out.txt', 'w')}\nx['log'].write('buffered')",
        "print(pathlib.Path('out.txt').read_text())",
    ),
}


def _finalizer_patterns() -> list[Pattern]:
    """A value whose death runs a finalizer the notebook can see, dropped by the edited cell:
    replayed, it stayed in the store, so the drop ran nothing (no print, a file never flushed);
    a list or dict holding one was kept alive by the kernel's record of the last checkpoint,
    in the audit too. (A `tempfile.TemporaryDirectory` is left out: its folder has a random name,
    and rebuilt on repeat it makes another folder while the replayed one stays: README, missing.)"""
    setup = "import os\nimport pathlib\nimport weakref\n"
    return [
        pattern(
            f"{kind}_{drop}_runs_its_finalizer",
            f"{kind} dropped with `{how}`: the finalizer ran in a plain kernel only",
            [setup + make, f"{how}\n{after}"],
            edit={1: f"{how}\n{after}\nprint('edited')"},
            # A cell that calls `weakref.finalize` changes what the library keeps: it never replays.
            replays=() if kind == "weakref_finalize_unbound" else None,
        )
        for kind, (make, after) in _FINALIZING_KINDS.items()
        for drop, how in _FREED_DROPS.items()
    ]


def _patterns() -> list[Pattern]:
    """Every pattern, made on first use (see `__getattr__`)."""
    return [
    # -- Class 1: in-place changes static analysis misses --------------------
    pattern(
        "sort_inplace",
        "lst.sort() mutates without assigning: a stale replay of the sort or print cell shows [1, 2, 3] instead of [1, 2, 9]",
        ["lst = [3, 1, 2]", "lst.sort()", "print(lst)"],
        edit={0: "lst = [9, 1, 2]"},
    ),
    pattern(
        "alias_becomes_copy",
        "x = [l, l] edited to x = [l, list(l)]: equal content, different sharing; a digest blind to "
        "sharing replays the reader, which shows the write through x[0] in x[1]",
        ["l = [1, 2]", "x = [l, l]", "x[0].append(9)\nprint(x[1])"],
        edit={1: "x = [l, list(l)]  # a copy now"},
    ),
    *(
        pattern(
            f"inner_alias_outlives_its_owner{suffix}",
            f"sub is inside big's reach and indexed short; once big {how}, leaf = sub.kids[0] must still be "
            "grouped with sub, or the restored leaf is a copy and the write through it misses sub",
            [_NODE_CLASS + "\nbig = Node([Node([Node()])])\nsub = big.kids[0]", goes, "leaf = sub.kids[0]",
             "leaf.val = 5\nprint(sub.kids[0].val, leaf is sub.kids[0])"],
            edit={3: "leaf.val = 6\nprint(sub.kids[0].val, leaf is sub.kids[0])"},
        )
        for suffix, how, goes in (("", "is deleted", "del big"), ("_rebound", "is rebound to another tree", "big = Node()"))
    ),
    pattern(
        "inner_alias_and_owner_both_new",
        "big and sub made in one cell (one walk indexes both); a later cell mutates through sub only",
        [_NODE_CLASS + "\nbig = Node([Node([Node()])])\nsub = big.kids[0]", "sub.kids[0].val = 3",
         "print(big.kids[0].kids[0].val, sub is big.kids[0])"],
        edit={2: "print('v', big.kids[0].kids[0].val, sub is big.kids[0])"},
    ),
    *(
        pattern(
            f"loop_leftover_carries_an_insert{suffix}",
            "row is left aliasing rows' last item, and an object is put into rows through it: once row "
            "is rebound, inner = that object must still be grouped with rows, or the restored inner is a "
            "copy and the write through it misses rows",
            [f"rows = {rows}", f"for row in {loop}:\n    pass", "row.append([7])", "row = None", f"inner = {inner}",
             f"inner.append(8)\nprint(rows, inner is {inner})"],
            edit={5: f"inner.append(9)\nprint('rows', rows, inner is {inner})"},
        )
        for suffix, rows, loop, inner in (
            ("", "[[1], [2], [3]]", "rows", "rows[-1][-1]"),
            ("_dict", "{'a': [1], 'b': [2]}", "rows.values()", "rows['b'][-1]"),
        )
    ),
    pattern(
        "write_through_alias_owner_changed_elsewhere",
        "inner.append(3) writes big through an alias without reading it; big changed upstream in an other "
        "key, so a replay that brings back the recorded big shows [2, 5] instead of [2, 6]",
        ["big = {'x': [1], 'y': [2]}", "inner = big['x']", "big['y'].append(5)", "inner.append(3)", "print(big)"],
        edit={2: "big['y'].append(6)"},
    ),
    pattern(
        "loop_mutates_every_item",
        "the edited loop appends to every item of rows through row: rows is only read through a pure "
        "method (.values()), yet it changed, and a replay of its reader shows the lists without the 0",
        ["rows = {'k0': [53], 'k1': [54], 'k2': [55]}", "for row in rows.values():\n    pass", "row.append([2])\nrow.append({'v': 18})", "row = None",
         "inner = rows['k2'][-2]\nbox = rows['k2'][-1]", "inner.append(11)\nbox['v'] += 1", "print(rows)"],
        edit={1: "for row in rows.values():\n    row.append(0)"},
    ),
    pattern(
        "alias_becomes_copy_same_text",
        "the cell making x runs (its code changed) and makes equal content with other sharing; the "
        "unchanged writer-reader cell must run too",
        ["l = [1, 2]", "x = [l, l]", "x[0].append(9)", "print(x[1])"],
        edit={1: "x = [l, l[:]]"},
    ),
    pattern(
        "sort_inplace_restore",
        "the sort and literal cells replay; a checkpoint that missed the in-place sort restores [3, 1, 2] for the edited reader",
        ["lst = [3, 1, 2]", "lst.sort()", "print(lst)"],
        edit={2: 'print("sorted", lst)'},
    ),
    pattern(
        "method_mutates_self",
        "acc.apply(5) mutates acc through self: a restore that missed it shows [] instead of [5]",
        [_ACC, "acc = Acc()", "acc.apply(5)", "print(acc.items)"],
        edit={3: 'print("items", acc.items)'},
    ),
    pattern(
        "numpy_out_inplace",
        "np.exp(a, out=a) writes a through out=: a restore that missed it shows [0. 1.] instead of [1. 2.718]",
        ["import numpy as np\na = np.array([0.0, 1.0])", "np.exp(a, out=a);", "print(a.round(3))"],
        edit={2: 'print("a", a.round(3))'},
    ),
    pattern(
        "fillna_inplace_kwargs",
        "df.fillna(0, **kw) with kw={'inplace': True} mutates df: a restore that missed it shows NaN instead of 0.0",
        ['import pandas as pd\ndf = pd.DataFrame({"x": [1.0, None, 3.0]})', 'kw = {"inplace": True}', "df.fillna(0, **kw)", "print(df)\ndel df"],
        edit={3: "print(df.x.tolist())\ndel df"},
    ),
    pattern(
        "bound_method_alias",
        "push = lst.append; push(2) mutates lst under another name: a restore that missed it shows [1] instead of [1, 2]",
        ["lst = [1]", "push = lst.append", "push(2)", "print(lst)\ndel push"],
        edit={3: 'push(3)\nprint("lst", lst)\ndel push'},
    ),
    pattern(
        "map_append",
        "list(map(out.append, range(3))) fills out: a restore that missed it shows [] instead of [0, 1, 2]",
        ["out = []", "list(map(out.append, range(3)))", "print(out)"],
        edit={2: 'print("out", out)'},
    ),
    pattern(
        "defaultdict_missing_read",
        "reading a missing defaultdict key inserts it: a restore that missed it shows [] instead of ['a']",
        ["from collections import defaultdict\ncounts = defaultdict(int)", 'print(counts["a"])', "print(sorted(counts))"],
        edit={2: 'print("keys", sorted(counts))'},
    ),
    pattern(
        "function_appends_global",
        "a function defined and called in one cell appends to a global: a restore that missed it shows [] instead of [1, 2]",
        ["log = []", "def note(x):\n    log.append(x)\nnote(1)\nnote(2)", "print(log)"],
        edit={2: 'print("log", log)'},
    ),
    pattern(
        "class_method_assigned",
        "C.f = lambda self: 3 changes what obj.f() returns without touching obj: a stale replay of the reader prints 2",
        [_CLASS_C, "obj = C()", "C.f = lambda self: 2", "print(obj.f())"],
        edit={2: "C.f = lambda self: 3"},
    ),
    pattern(
        "class_method_assigned_restore",
        "the class cell and the assignment replay; restoring C from its class statement alone makes obj.f() return 1, not 2",
        [_CLASS_C, "obj = C()", "C.f = lambda self: 2", "print(obj.f())"],
        edit={3: 'print("f", obj.f())'},
    ),
    # -- Class 2: modules and library settings --------------------------------
    pattern(
        "module_edited_on_disk",
        "helpers.py changed on disk between audit and repeat: a stale replay prints 3 instead of 20",
        ["import helpers", "print(helpers.f(2))"],
        files={"helpers.py": _HELPERS_V1},
        files_repeat={"helpers.py": _HELPERS_V2},
    ),
    pattern(
        "module_reload_after_rewrite",
        "the notebook rewrites helpers.py and reloads it; after editing the rewrite a stale replay of the reload prints 200, not 2000",
        [
            f'with open("helpers.py", "w") as fh:\n    fh.write({_HELPERS_V1!r})\ndel fh',
            "import helpers\nprint(helpers.f(2))",
            'with open("helpers.py", "w") as fh:\n    fh.write("def f(x):\\n    return x * 100\\n")\ndel fh',
            "import importlib\nhelpers = importlib.reload(helpers)\nprint(helpers.f(2))",
        ],
        edit={2: 'with open("helpers.py", "w") as fh:\n    fh.write("def f(x):\\n    return x * 1000\\n")\ndel fh'},
    ),
    pattern(
        "module_attr_set",
        "helpers.SCALE = 9 is a module attribute set by a cell: a stale replay of helpers.f(2) prints 14 instead of 18",
        ["import helpers", "helpers.SCALE = 7", "print(helpers.f(2))"],
        edit={1: "helpers.SCALE = 9"},
        files={"helpers.py": _SCALE},
    ),
    pattern(
        "module_attr_set_restore",
        "the attribute cell replays; restoring helpers by importing it again loses SCALE = 7 and prints 2 instead of 14",
        ["import helpers", "helpers.SCALE = 7", "print(helpers.f(2))"],
        edit={2: 'print("f", helpers.f(2))'},
        files={"helpers.py": _SCALE},
    ),
    pattern(
        "module_registry_append",
        "helpers.REG.append('x') mutates a module-level list: a restore that missed it prints [] instead of ['x']",
        ["import helpers", 'helpers.REG.append("x")', "print(helpers.REG)"],
        edit={2: 'print("reg", helpers.REG)'},
        files={"helpers.py": "REG = []\n"},
    ),
    pattern(
        "pandas_set_option_edited",
        "display.precision edited 2 -> 4: a stale replay of print(df) shows 1.23 instead of 1.2346",
        ["import pandas as pd", 'pd.set_option("display.precision", 2)', 'df = pd.DataFrame({"v": [1.23456, 2.5]})', "print(df)\ndel df"],
        edit={1: 'pd.set_option("display.precision", 4)'},
    ),
    pattern(
        "pandas_set_option_unmodified",
        "an unmodified repeat replays the set_option cell; a new cell printing df must still see precision 2 (stale: 1.234560)",
        ["import pandas as pd", 'pd.set_option("display.precision", 2)', 'def show():\n    print(pd.DataFrame({"v": [1.23456, 2.5]}))', "show()"],
        append=['print("again")\nshow()'],
    ),
    pattern(
        "pandas_set_option_after_import_edit",
        "the import cell is edited (so pandas is loaded when the unchanged set_option cell replays): "
        "the replayed option must be in force for show() (stale: 1.234560)",
        ["import pandas as pd", 'pd.set_option("display.precision", 2)', 'def show():\n    print(pd.DataFrame({"v": [1.23456, 2.5]}))', "show()"],
        edit={0: "import pandas as pd\nimport math"},
    ),
    pattern(
        "pandas_options_attr_edited",
        "pd.options.display.precision edited 2 -> 4: a stale replay of print(df) shows 1.23 instead of 1.2346",
        ["import pandas as pd", "pd.options.display.precision = 2", 'df = pd.DataFrame({"v": [1.23456, 2.5]})', "print(df)\ndel df"],
        edit={1: "pd.options.display.precision = 4"},
    ),
    pattern(
        "pandas_options_attr_unmodified",
        "an unmodified repeat replays the pd.options cell; a new cell printing df must still see precision 2 (stale: 1.234560)",
        ["import pandas as pd", "pd.options.display.precision = 2", 'def show():\n    print(pd.DataFrame({"v": [1.23456, 2.5]}))', "show()"],
        append=['print("again")\nshow()'],
    ),
    pattern(
        "numpy_printoptions_edited",
        "np.set_printoptions precision edited 2 -> 4: a stale replay of print(a) shows [1.23 2.5 ] instead of [1.2346 2.5   ]",
        ["import numpy as np", "np.set_printoptions(precision=2)", "a = np.array([1.23456, 2.5])", "print(a)"],
        edit={1: "np.set_printoptions(precision=4)"},
    ),
    pattern(
        "matplotlib_rcparams_edited",
        "rcParams['lines.linewidth'] edited 3 -> 5: a stale replay of the reader prints 3.0",
        ["import matplotlib", 'matplotlib.rcParams["lines.linewidth"] = 3', 'print(matplotlib.rcParams["lines.linewidth"])'],
        edit={1: 'matplotlib.rcParams["lines.linewidth"] = 5'},
    ),
    pattern(
        "dask_config_edited",
        "dask.config array.chunk-size edited 1MiB -> 4MiB: a stale replay of the reader prints 1MiB",
        ["import dask", 'dask.config.set({"array.chunk-size": "1MiB"});', 'print(dask.config.get("array.chunk-size"))'],
        edit={1: 'dask.config.set({"array.chunk-size": "4MiB"});'},
    ),
    pattern(
        "sys_path_insert_edited",
        "sys.path.insert(0, 'lib') edited to 'lib2': a stale replay of `import mylib` prints 1 instead of 2",
        ["import sys\nsys.path.insert(0, 'lib')", "import mylib\nprint(mylib.VALUE)"],
        edit={0: "import sys\nsys.path.insert(0, 'lib2')"},
        files={"lib/mylib.py": "VALUE = 1\n", "lib2/mylib.py": "VALUE = 2\n"},
    ),
    pattern(
        "warnings_filter_edited",
        "warnings.filterwarnings edited 'error' -> 'ignore': a stale replay prints 'raised careful' instead of 'no error'",
        ['import warnings\nwarnings.filterwarnings("error")', _WARN],
        edit={0: 'import warnings\nwarnings.filterwarnings("ignore")'},
    ),
    pattern(
        "decimal_context_edited",
        "decimal.getcontext().prec edited 5 -> 8: a stale replay prints 0.14286 instead of 0.14285714",
        ["import decimal\ndecimal.getcontext().prec = 5", "print(decimal.Decimal(1) / decimal.Decimal(7))"],
        edit={0: "import decimal\ndecimal.getcontext().prec = 8"},
    ),
    pattern(
        "settings_unmodified_replay",
        "every setting cell replays in an unmodified repeat; a new cell must still see numpy precision 2, linewidth 3, "
        "chunk-size 1MiB, prec 5, lib/ on sys.path and the UserWarning error filter (stale: the defaults)",
        [
            "import numpy as np, matplotlib, dask, decimal, sys, warnings",
            "np.set_printoptions(precision=2)",
            'matplotlib.rcParams["lines.linewidth"] = 3',
            'dask.config.set({"array.chunk-size": "1MiB"});',
            "decimal.getcontext().prec = 5",
            "sys.path.insert(0, 'lib')",
            'warnings.filterwarnings("error", category=UserWarning)',
        ],
        append=[
            "print(np.array([1.23456]))\n"
            'print(matplotlib.rcParams["lines.linewidth"])\n'
            'print(dask.config.get("array.chunk-size"))\n'
            "print(decimal.Decimal(1) / decimal.Decimal(7))\n"
            "import mylib\nprint(mylib.VALUE)\n" + _WARN
        ],
        files={"lib/mylib.py": "VALUE = 1\n"},
    ),
    # -- Class 3: hidden inputs ------------------------------------------------
    pattern(
        "listdir_new_file",
        "data/b.csv appeared between runs: a stale replay of os.listdir prints ['a.csv']",
        ['import os\nnames = sorted(os.listdir("data"))', "print(names)"],
        files={"data/a.csv": "x\n1\n"},
        files_repeat={"data/a.csv": "x\n1\n", "data/b.csv": "x\n2\n"},
    ),
    pattern(
        "glob_new_file",
        "data/b.csv appeared between runs: a stale replay of glob.glob prints ['data/a.csv']",
        ['import glob\nfound = sorted(glob.glob("data/*.csv"))', "print(found)"],
        files={"data/a.csv": "x\n1\n"},
        files_repeat={"data/a.csv": "x\n1\n", "data/b.csv": "x\n2\n"},
    ),
    pattern(
        "scandir_new_file",
        "data/b.csv appeared between runs: a stale replay of os.scandir prints ['a.csv']",
        ['import os\nwith os.scandir("data") as it:\n    names = sorted(e.name for e in it)\ndel it', "print(names)"],
        files={"data/a.csv": "x\n1\n"},
        files_repeat={"data/a.csv": "x\n1\n", "data/b.csv": "x\n2\n"},
    ),
    pattern(
        "path_exists_flag",
        "the file 'flag' appeared between runs: a stale replay of os.path.exists prints False",
        ['import os\nprint(os.path.exists("flag"))'],
        files={},
        files_repeat={"flag": "on\n"},
    ),
    pattern(
        "getsize_changed",
        "in.txt grew from 3 to 6 bytes between runs: a stale replay of os.path.getsize prints 3",
        ['import os\nprint(os.path.getsize("in.txt"))'],
        files={"in.txt": "abc"},
        files_repeat={"in.txt": "abcdef"},
    ),
    pattern(
        "stat_size_changed",
        "in.txt grew from 3 to 6 bytes between runs: a stale replay of os.stat(p).st_size prints 3",
        ['import os\nsize = os.stat("in.txt").st_size\nprint(size)'],
        files={"in.txt": "abc"},
        files_repeat={"in.txt": "abcdef"},
    ),
    pattern(
        "file_removed_then_checked",
        "a later cell removes a file an earlier one wrote; the check after it is edited: a replay that does not "
        "remove it again leaves the file in place, so the edited check prints True where a fresh run prints False",
        [
            'with open("made.txt", "w") as fh:\n    fh.write("x")\ndel fh',
            'import os\nos.remove("made.txt")',
            'print(os.path.exists("made.txt"))',
        ],
        edit={2: 'print("exists:", os.path.exists("made.txt"))'},
    ),
    pattern(
        "file_renamed_then_read",
        "a later cell renames (os.replace) a file an earlier one wrote; the reader after it is edited: a replay that "
        "does not rename it again leaves the old name in place and the new one missing",
        [
            'with open("draft.txt", "w") as fh:\n    fh.write("v1")\ndel fh',
            'import os\nos.replace("draft.txt", "final.txt")',
            'print(sorted(p for p in os.listdir(".") if p.endswith(".txt")))',
        ],
        edit={2: 'print("txt:", sorted(p for p in os.listdir(".") if p.endswith(".txt")))'},
    ),
    pattern(
        "tree_removed_then_listed",
        "a later cell removes a folder of files an earlier one wrote (shutil.rmtree); the listing after it is edited",
        [
            'import os\nos.makedirs("parts", exist_ok=True)\nfor i in range(3):\n    with open(f"parts/{i}.txt", "w") as fh:\n        fh.write(str(i))\ndel fh, i',
            'import shutil\nshutil.rmtree("parts")',
            'print(os.path.isdir("parts"))',
        ],
        edit={2: 'print("parts:", os.path.isdir("parts"))'},
    ),
    pattern(
        "folder_moved_after_its_files_changed",
        "the cell writing a folder's files is edited to write fewer; the unchanged cell that moves the folder must "
        "run again: replayed, it would put back the moved files the audit saw (a rename reads nothing through open)",
        [
            'import os\nos.makedirs("keep", exist_ok=True)\nfor i in range(4):\n    with open(f"keep/f{i}.txt", "w") as fh:\n        fh.write(str(i))\ndel fh, i',
            'import shutil\nshutil.move("keep", "tree")',
            'print(sorted(os.listdir("tree")))',
        ],
        edit={0: 'import os\nos.makedirs("keep", exist_ok=True)\nfor i in range(2):\n    with open(f"keep/f{i}.txt", "w") as fh:\n        fh.write(str(i))\ndel fh, i'},
        replays=(),
    ),
    pattern(
        "remove_of_a_file_no_longer_made",
        "the cell that made a file is edited not to; the unchanged cell removing it must run (and fail as a fresh run "
        "does): a removal depends on the path existing",
        [
            'with open("made.txt", "w") as fh:\n    fh.write("x")\ndel fh',
            'import os\nos.remove("made.txt")\nprint("removed")',
        ],
        edit={0: 'print("nothing made")'},
        replays=(),
    ),
    pattern(
        "folder_made_then_written_into",
        "a cell makes an empty folder; the later cell writing into it is edited: a replay that does not make the "
        "folder again leaves the edited cell to fail with FileNotFoundError where a fresh run writes the file",
        [
            'import os\nos.makedirs("out/plots", exist_ok=True)',
            'with open("out/plots/a.txt", "w") as fh:\n    fh.write("a")\ndel fh',
        ],
        edit={1: 'with open("out/plots/a.txt", "w") as fh:\n    fh.write("b")\ndel fh'},
    ),
    pattern(
        "folder_made_then_checked",
        "a cell makes an empty folder (os.mkdir); the check after it is edited",
        ['import os\nos.mkdir("empty")', 'print(os.path.isdir("empty"))'],
        edit={1: 'print("isdir:", os.path.isdir("empty"))'},
    ),
    pattern(
        "name_bound_again_to_the_same_value",
        "a cell imports Path, which an earlier cell had imported too (no value changed, so no write was recorded); "
        "the earlier cell is edited not to import it: the replayed later cell must still bind Path",
        ["from pathlib import Path\nroot = Path('.')", "x = 1", "from pathlib import Path\ny = 2", "print(Path('a').name, y)"],
        edit={0: "root = '.'"},
        replays=(1, 2),
    ),
    pattern(
        "constant_assigned_again",
        "a later cell assigns k = 3 again; the first assignment is edited to k = 4: the replayed later cell must "
        "leave k at 3, as a fresh run does",
        ["k = 3", "k = 3\nz = 0", "print(k)"],
        edit={0: "k = 4"},
        replays=(1,),
    ),
    pattern(
        "dask_tasks_write_files",
        "a Dask graph writes files (dask.dataframe.to_csv, one task per partition); the cell is edited so it runs "
        "again over the same tasks, which the task cache serves: a fresh run writes the files, so must the repeat",
        [
            "import dask.dataframe as dd\ndata = {'v': list(range(6))}",
            "n = len(dd.from_dict(data, npartitions=2).to_csv('parts-*.csv', index=False))",
            "import os\nprint(sorted(p for p in os.listdir('.') if p.startswith('parts-')))",
        ],
        edit={1: "n = len(dd.from_dict(data, npartitions=2).to_csv('parts-*.csv', index=False))\nprint(n)"},
    ),
    pattern(
        "dask_bag_writes_files_in_worker_processes",
        "dask.bag's default scheduler runs tasks in other processes, where no open is seen; to_textfiles' tasks "
        "write the files: the edited cell runs again over the same tasks, and the files must be there as after a fresh run",
        [
            "import dask.bag as db\nitems = list(range(6))",
            "n = len(db.from_sequence(items, npartitions=2).map(str).to_textfiles('lines-*.txt'))",
            "import os\nprint(sorted(p for p in os.listdir('.') if p.startswith('lines-')))",
        ],
        edit={1: "n = len(db.from_sequence(items, npartitions=2).map(str).to_textfiles('lines-*.txt'))\nprint(n)"},
    ),
    pattern(
        "constant_assigned_again_in_a_branch",
        "a later cell assigns k = 3 again inside an if; the first assignment is edited to k = 4: the replayed "
        "later cell must leave k at 3",
        ["k = 3", "if True:\n    k = 3\nz = 0", "print(k)"],
        edit={0: "k = 4"},
    ),
    pattern(
        "global_reset_by_a_function",
        "a function sets the global k = 3 (as it already was); the first assignment is edited to k = 4: the replayed "
        "cell calling the function must leave k at 3",
        ["k = 3", "def reset():\n    global k\n    k = 3", "reset()", "print(k)"],
        edit={0: "k = 4"},
    ),
    pattern(
        "file_handle_written_in_a_later_cell",
        "a file opened in one cell is written and flushed through the open handle in a later one (no open then); "
        "the cell reading the file is edited: the file must hold what the later cell wrote, as after a fresh run",
        [
            "log = open('log.txt', 'w')",
            "log.write('first\\n')\nlog.flush()",
            "with open('log.txt') as fh:\n    print(fh.read().splitlines())\ndel fh",
            "log.close()\ndel log",
        ],
        edit={2: "with open('log.txt') as fh:\n    print('lines:', fh.read().splitlines())\ndel fh"},
    ),
    pattern(
        "handle_closed_and_deleted_then_names_listed",
        "a file handle is opened, closed and deleted in later cells, then a cell lists the notebook's names; "
        "a cosmetic edit of the closing cell: every cell replays, and the forecast must know the handle is gone "
        "(it kept the handle, re-keyed as used by the closing cell, and foresaw the listing cell running)",
        [
            "h = open('h.txt', 'w')",
            "h.write('x\\n')\nh.flush()",
            "h.close()\ndel h",
            "print(sorted(n for n in globals() if not n.startswith('_') and n not in ('In', 'Out', 'exit', 'quit', 'get_ipython')))",
        ],
        edit={2: "h.close()\ndel h\n# closed"},
        replays=(0, 1, 2, 3),
    ),
    pattern(
        "handle_brought_back_after_replayed_writes",
        "a file handle opened in append mode and written through by the next cell; the cell that writes through it "
        "again is edited, so the open and the first write, replayed (the file restored as they left it), re-run to "
        "bring the handle back: they must find the file as they first did, or the first line is written twice",
        [
            "with open('log.txt', 'w') as fh:\n    fh.write('start\\n')\ndel fh",
            "h = open('log.txt', 'a')",
            "h.write('gold\\n')\nh.flush()",
            "with open('log.txt') as fh:\n    print(fh.read().splitlines())\ndel fh",
            "h.write('blue\\n')\nh.flush()",
            "h.close()\ndel h\nwith open('log.txt') as fh:\n    print('after', fh.read().splitlines())\ndel fh",
        ],
        edit={4: "h.write('red\\n')\nh.flush()"},
    ),
    pattern(
        "handle_made_by_open_brought_back",
        "as above, but the open makes the file: re-run, it must find the file absent, as it did, not holding what "
        "the replayed write left",
        [
            "h = open('made.txt', 'a')",
            "h.write('gold\\n')\nh.flush()",
            "with open('made.txt') as fh:\n    print(fh.read().splitlines())\ndel fh",
            "h.write('blue\\n')\nh.flush()",
            "h.close()\ndel h\nwith open('made.txt') as fh:\n    print('after', fh.read().splitlines())\ndel fh",
        ],
        edit={3: "h.write('red\\n')\nh.flush()"},
    ),
    pattern(
        "handle_on_a_file_no_cell_wrote_brought_back",
        "as above, on a file that was there before the notebook, opened and first written in one cell: no "
        "checkpoint holds what the open found, so that cell must run (it wrote the first line twice when it "
        "replayed and was re-run to bring the handle back); the reader after it replays",
        [
            "h = open('given.txt', 'a')\nh.write('gold\\n')\nh.flush()",
            "with open('given.txt') as fh:\n    print(fh.read().splitlines())\ndel fh",
            "h.write('blue\\n')\nh.flush()",
            "h.close()\ndel h\nwith open('given.txt') as fh:\n    print('after', fh.read().splitlines())\ndel fh",
        ],
        edit={2: "h.write('red\\n')\nh.flush()"},
        files={"given.txt": "start\n"},
        replays=(1,),
    ),
    pattern(
        "tempfile_read_after_edit",
        "a cell writes a mkstemp file, the last cell reads and removes it, and is edited; replays leave temp files "
        "pending, so a repeat that does not write it back before the edited cell runs fails with FileNotFoundError, "
        "and a reader keyed on the missing file runs instead of replaying",
        [
            "import os, tempfile\nfd, path = tempfile.mkstemp(suffix='.txt')\n"
            "with os.fdopen(fd, 'w') as fh:\n    fh.write('alpha\\nbeta\\n')\ndel fd, fh",
            "with open(path) as fh:\n    first = fh.readline().strip()\ndel fh\nprint(first)",
            "with open(path) as fh:\n    n = len(fh.read().splitlines())\ndel fh\nos.remove(path)\ndel path\nprint(n)",
        ],
        edit={2: "with open(path) as fh:\n    text = fh.read().upper()\ndel fh\nos.remove(path)\ndel path\nprint(text)"},
    ),
    pattern(
        "sqlite_param_edited",
        "the notebook builds db.sqlite from N_ROWS (edited 3 -> 5); sqlite opens the file natively, "
        "so a stale replay of the query prints (3, 3) instead of (5, 10)",
        [
            "N_ROWS = 3",
            "import sqlite3\ncon = sqlite3.connect('db.sqlite')\ncon.execute('CREATE TABLE t (v INTEGER)')\n"
            "con.executemany('INSERT INTO t VALUES (?)', [(i,) for i in range(N_ROWS)])\ncon.commit()\ncon.close()\ndel con",
            "con = sqlite3.connect('db.sqlite')\nprint(con.execute('SELECT COUNT(*), SUM(v) FROM t').fetchone())\ncon.close()\ndel con",
        ],
        edit={0: "N_ROWS = 5"},
    ),
    pattern(
        "sqlite_changed_outside",
        "db.sqlite was rewritten outside the notebook (3 -> 5 rows): a stale replay prints [(0,), (1,), (2,)]",
        [
            "import sqlite3\ncon = sqlite3.connect('db.sqlite')\nrows = con.execute('SELECT v FROM t ORDER BY v').fetchall()\ncon.close()\ndel con",
            "print(rows)",
        ],
        setup_audit=sqlite_three_rows,
        setup_repeat=sqlite_five_rows,
    ),
    pattern(
        "subprocess_cat_changed",
        "`cat in.txt` in a subprocess reads a file that changed (old -> new): a stale replay prints 'old'",
        ['import subprocess\nres = subprocess.run(["cat", "in.txt"], capture_output=True, text=True)\nprint(res.stdout)'],
        files={"in.txt": "old\n"},
        files_repeat={"in.txt": "new\n"},
    ),
    pattern(
        "env_var_in_function",
        "a notebook function reads NBR_DIFF_X set by an edited earlier cell: a stale replay of print(f()) prints 'one'",
        ['import os\nos.environ["NBR_DIFF_X"] = "one"', 'def f():\n    return os.environ.get("NBR_DIFF_X")', "print(f())"],
        edit={0: 'import os\nos.environ["NBR_DIFF_X"] = "two"'},
    ),
    pattern(
        "random_getstate_after_seed",
        "random.getstate() read without drawing after the seed cell is edited 1 -> 2: a stale replay prints seed 1's state",
        ["import random\nrandom.seed(1)", "state = random.getstate()\nprint(state[1][:4])"],
        edit={0: "import random\nrandom.seed(2)"},
        seeded=("random",),
    ),
    pattern(
        "numpy_get_state_after_seed",
        "np.random.get_state() read without drawing after the seed cell is edited 1 -> 2: a stale replay prints seed 1's keys",
        ["import numpy as np\nnp.random.seed(1)", "st = np.random.get_state()\nprint(st[1][:4])"],
        edit={0: "import numpy as np\nnp.random.seed(2)"},
        seeded=("numpy.random",),
    ),
    pattern(
        "main_dict_read",
        "sys.modules['__main__'].__dict__['x'] reads x behind static analysis' back: a stale replay prints 1 instead of 2",
        ["x = 1", 'import sys\nprint(sys.modules["__main__"].__dict__["x"])'],
        edit={0: "x = 2"},
    ),
    pattern(
        "globals_dict_read",
        "globals()['x'] reads x by a string key: a stale replay prints 1 instead of 2",
        ["x = 1", 'print(globals()["x"])'],
        edit={0: "x = 2"},
    ),
    # -- Class 4: restore fidelity ---------------------------------------------
    pattern(
        "numpy_view_base",
        "v = a[:2] is a view: if a and v are restored as separate arrays, v[0] = 6 no longer shows in a ([0. 0. 0.])",
        ["import numpy as np\na = np.zeros(3)", "v = a[:2]", "v[0] = 5\nprint(a)"],
        edit={2: "v[0] = 6\nprint(a)"},
    ),
    pattern(
        "class_dict_order",
        "a restored class must keep its __dict__ order: a rebuilt class lists its members in another order",
        ["class C:\n    b = 1\n    a = 2\n    def m(self):\n        return 0", 'print("C")'],
        edit={1: "print(list(vars(C)))"},
    ),
    pattern(
        "weakref_identity",
        "r = weakref.ref(obj): restoring obj as a copy leaves r dead or pointing elsewhere (False instead of True)",
        ["class Box:\n    pass\nobj = Box()", "import weakref\nr = weakref.ref(obj)", "print(r() is obj)\ndel r"],
        edit={2: 'print("alive", r() is obj)\ndel r'},
    ),
    pattern(
        "weakref_same_cell",
        "obj and r = weakref.ref(obj) made in one cell: r cannot be stored and is rebuilt by re-running the cell; "
        "a rebuilt r pointing at the rebuilt cell's own obj prints False",
        ["import weakref\nclass Box:\n    pass\nobj = Box()\nr = weakref.ref(obj)", "print(r() is obj)"],
        edit={1: 'print("alive", r() is obj)'},
    ),
    pattern(
        "weakref_read_before_obj",
        "r is read before obj in the edited cell, so r is rebuilt first; obj must still be what r points at",
        ["import weakref\nclass Box:\n    pass\nobj = Box()\nobj.n = 3\nr = weakref.ref(obj)", "print(obj.n)"],
        edit={1: "t = r()\nprint(t is obj, t.n)\ndel t"},
    ),
    pattern(
        "weak_value_dictionary",
        "a WeakValueDictionary of values that live in a list: the rebuilt mapping must point at the list's items",
        [
            "import weakref\nclass Item:\n    def __init__(self, k):\n        self.k = k\n"
            "items = [Item(i) for i in range(3)]\nindex = weakref.WeakValueDictionary({i.k: i for i in items})",
            "print(len(index))",
        ],
        edit={1: "print(len(index), index[1] is items[1])"},
    ),
    pattern(
        "logger_notebook_handler",
        "a logging handler class defined in the notebook (its methods' globals are the namespace): "
        "indexing it must not load every replayed value (recursion, then a NameError)",
        [
            "import logging\nclass Keep(logging.Handler):\n    def __init__(self):\n        super().__init__()\n"
            "        self.seen = []\n    def emit(self, record):\n        self.seen.append(record.getMessage())\n"
            "log = logging.getLogger('nbr.test')\nlog.propagate = False\nkeep = Keep()\nlog.handlers[:] = [keep]",
            "data = list(range(5))",
            "log.warning('n=%d', len(data))\nprint(keep.seen)\ndel log",
        ],
        edit={2: "log.warning('sum=%d', sum(data))\nprint(keep.seen)\ndel log"},
        # The handler is the notebook's own class: the cell attaching it cannot be replayed (the
        # logger would be restored without it), so it runs; the data cell replays.
        replays=(1,),
    ),
    pattern(
        "closed_file_left_in_namespace",
        "`with open(...) as fh` leaves a closed file in the namespace: the audit must record (or skip) it silently "
        "and the edited reader must still see out.txt (stale: a warning, or a missing file)",
        ['with open("out.txt", "w") as fh:\n    fh.write("hi")', 'from pathlib import Path\nprint(Path("out.txt").read_text())'],
        edit={1: 'from pathlib import Path\nprint("text", Path("out.txt").read_text())'},
    ),
    pattern(
        "thread_pool_random_seed_edited",
        "random.random() drawn in a ThreadPoolExecutor after random.seed edited 1 -> 2: a stale replay prints seed 1's values",
        [
            "import random\nrandom.seed(1)",
            "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(max_workers=1) as ex:\n"
            "    vals = list(ex.map(lambda _: round(random.random(), 6), range(3)))\ndel ex\nprint(vals)",
            "print(round(random.random(), 6))",
        ],
        edit={0: "import random\nrandom.seed(2)"},
        seeded=("random",),
    ),
    pattern(
        "thread_pool_random_restore",
        "the seed and thread-pool cells replay; the RNG state after draws made in worker threads must be restored "
        "(stale: the edited reader prints the first draw after seed(1) again)",
        [
            "import random\nrandom.seed(1)",
            "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(max_workers=1) as ex:\n"
            "    vals = list(ex.map(lambda _: round(random.random(), 6), range(3)))\ndel ex\nprint(vals)",
            "print(round(random.random(), 6))",
        ],
        edit={2: 'print("next", round(random.random(), 6))'},
        seeded=("random",),
    ),
    pattern(
        "generator_consumed_later",
        "g = gen() is advanced by a replayed cell: a generator rebuilt from scratch yields [0, 1, 2, 3, 4] instead of [1, 2, 3, 4]",
        ["def gen():\n    yield from range(5)", "g = gen()", "print(next(g))", "print(list(g))\ndel g"],
        edit={3: 'print("rest", list(g))\ndel g'},
        # g cannot be stored: by design the repeat rebuilds it by re-running the cells that advanced it.
        replays=(0, 1),
    ),
    # -- Dask on the threaded scheduler ----------------------------------------
    pattern(
        "dask_delayed_reads_file",
        "a delayed task reads in.txt, which changed between runs: a stale task/cell replay prints 6 instead of 15",
        [
            'import dask\ndask.config.set(scheduler="threads");',
            "def load(p):\n    with open(p) as fh:\n        return sum(int(t) for t in fh.read().split())",
            'total = dask.delayed(load)("in.txt").compute()\nprint(total)',
        ],
        files={"in.txt": "1 2 3\n"},
        files_repeat={"in.txt": "4 5 6\n"},
    ),
    pattern(
        "dask_task_global_np_random",
        "a delayed task draws from the global np.random after the seed cell is edited 3 -> 4: a stale task replay prints seed 3's draws",
        [
            'import dask, numpy as np\ndask.config.set(scheduler="threads");',
            "np.random.seed(3)",
            "def draw(n):\n    return np.random.random(n).round(6).tolist()",
            "print(dask.delayed(draw)(3).compute())",
        ],
        edit={1: "np.random.seed(4)"},
        seeded=("numpy.random",),
    ),
    pattern(
        "dask_array_param_edited",
        "a dask array computed from an edited scale parameter on the threaded scheduler: a stale task replay prints 45.0",
        [
            'import dask, dask.array as da\ndask.config.set(scheduler="threads");',
            "SCALE = 1.0",
            "x = da.arange(10, chunks=5) * SCALE",
            "print(float(x.sum().compute()))\ndel x",
        ],
        edit={1: "SCALE = 2.0"},
    ),
    pattern(
        "dask_delayed_bound_to_a_name",
        "a delayed object kept in a name and computed in a later cell after its input is edited: a stale replay prints 4. "
        "A Delayed answers every attribute with another Delayed whose truth raises: its cells must still be recorded",
        [
            'import dask\ndask.config.set(scheduler="threads");',
            "def inc(v):\n    return v + 1",
            "N = 3",
            "lazy = dask.delayed(inc, pure=True)(N)",
            "print(lazy.compute())",
        ],
        edit={2: "N = 5"},
    ),
    pattern(
        "distributed_local_cluster_file",
        "a task on an in-process distributed LocalCluster reads in.txt, changed between runs: a stale replay prints 6 instead of 15. "
        "Kernel tier only: a cluster's threads and event loop outlive an in-process shell",
        _cluster_reads_a_file("processes=False"),
        files={"in.txt": "1 2 3\n"},
        files_repeat={"in.txt": "4 5 6\n"},
        inprocess=False,
    ),
    pattern(
        "worker_process_reads_a_file_by_a_built_path",
        "a task on a LocalCluster worker process opens d/part0.txt by a path it builds, changed between runs: "
        "no open happens in the kernel and no argument names the file, so the cell replayed and the task hit",
        _on_a_cluster(
            "threads_per_worker=1",
            "def load(i):\n    with open(f'd/part{i}.txt') as fh:\n        return sum(int(t) for t in fh.read().split())",
            "total = client.submit(load, 0).result()\nprint(total)",
        ),
        files={"d/part0.txt": "1 2 3\n"},
        files_repeat={"d/part0.txt": "4 5 6\n"},
        inprocess=False,
        replays=(0, 1),
    ),
    pattern(
        "worker_process_lists_a_folder",
        "a task on a LocalCluster worker process lists d/, where a file was added between runs",
        _on_a_cluster(
            "threads_per_worker=1",
            "import os\ndef names(folder):\n    return sorted(os.listdir(folder))",
            "print(client.submit(names, 'd').result())",
        ),
        files={"d/a.txt": "1"},
        files_repeat={"d/a.txt": "1", "d/b.txt": "2"},
        inprocess=False,
        replays=(0, 1),
    ),
    pattern(
        "worker_process_reads_a_changed_file",
        "a task on a LocalCluster worker process reads in.txt (its path only in the task's arguments), changed "
        "between runs: no open of it happens in the kernel",
        _cluster_reads_a_file("threads_per_worker=1"),
        files={"in.txt": "1 2 3\n"},
        files_repeat={"in.txt": "4 5 6\n"},
        inprocess=False,
        replays=(0, 1),
    ),
    # -- Class 6: state outside variables that no pickle reaches ---------------
    pattern(
        "lru_cache_reads_a_changed_global",
        "a notebook function under functools.lru_cache answers f(1) from its cache after K changed; "
        "restored with an empty cache it computes 3 instead of 2 (and the wrapper pickled by reference "
        "to __main__ could not be loaded at all: NameError)",
        ["import functools\nK = 1\n@functools.lru_cache\ndef f(x):\n    return x + K", "print(f(1))", "K = 2", "print(f(1))"],
        edit={3: "print('again', f(1), f.cache_info())"},
    ),
    pattern(
        "two_handles_one_cell",
        "two file objects opened by one cell and written by later ones: brought back as one object, "
        "both words land in one file ('' and '12' instead of '1' and '2')",
        ["f1 = open('a.txt', 'w')\nf2 = open('b.txt', 'w')", "f1.write('1')\nf1.flush()\nf2.write('2')\nf2.flush()",
         "f1.close()\nf2.close()\nwith open('a.txt') as fa, open('b.txt') as fb:\n    print(fa.read(), fb.read())\ndel f1, f2, fa, fb"],
        edit={2: "f1.close()\nf2.close()\nwith open('a.txt') as fa, open('b.txt') as fb:\n    print('a b', fa.read(), fb.read())\ndel f1, f2, fa, fb"},
    ),
    pattern(
        "two_locks_one_cell",
        "two locks made by one cell, one acquired later: brought back as one object, both show locked",
        ["import threading\nl1 = threading.Lock()\nl2 = threading.Lock()", "l1.acquire()", "print(l1.locked(), l2.locked())\nl1.release()"],
        edit={2: "print('locks', l1.locked(), l2.locked())\nl1.release()"},
    ),
    pattern(
        "memmap_written_through",
        "writes through a numpy.memmap reach the file with no open(): restored as a plain array, the "
        "edited write never reaches d.npy and the reader shows [0. 0. 0.] instead of [8. 0. 0.]",
        ["import numpy as np\nnp.save('d.npy', np.zeros(3))", "m = np.load('d.npy', mmap_mode='r+')", "m[0] = 7\nm.flush()",
         "print(np.load('d.npy'))\ndel m"],
        edit={2: "m[0] = 8\nm.flush()"},
    ),
    pattern(
        "recursion_limit_set_by_a_replayed_cell",
        "sys.setrecursionlimit(150) in a replayed cell: a later cell that runs must still hit the limit "
        "(the repeat printed 'depth 400' where a fresh run says 'too deep')",
        ["import sys\nsys.setrecursionlimit(150)", "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)",
         "try:\n    print(f(400))\nexcept RecursionError:\n    print('too deep')\nsys.setrecursionlimit(3000)"],
        edit={2: "try:\n    print('depth', f(400))\nexcept RecursionError:\n    print('too deep!')\nsys.setrecursionlimit(3000)"},
    ),
    pattern(
        "umask_set_by_a_replayed_cell",
        "os.umask(0o077) in a replayed cell: a file a later cell creates must be 0o600, not 0o644",
        ["import os, stat\nold = os.umask(0o077)",
         "open('f.txt', 'w').close()\nprint(oct(stat.S_IMODE(os.stat('f.txt').st_mode)))\nos.umask(old)"],
        edit={1: "open('f.txt', 'w').close()\nprint('mode', oct(stat.S_IMODE(os.stat('f.txt').st_mode)))\nos.umask(old)"},
    ),
    pattern(
        "time_zone_set_by_a_replayed_cell",
        "TZ set and time.tzset() called in a replayed cell: a later cell's localtime must be Tokyo's (09), not UTC's (00)",
        ["import os, time\nos.environ['TZ'] = 'Asia/Tokyo'\ntime.tzset()",
         "print(time.strftime('%H', time.localtime(0)))\ndel os.environ['TZ']\ntime.tzset()"],
        edit={1: "print('hour', time.strftime('%H', time.localtime(0)))\ndel os.environ['TZ']\ntime.tzset()"},
    ),
    pattern(
        "logging_basic_config_by_a_replayed_cell",
        "logging.basicConfig(level=INFO) in a replayed cell: a later cell's logging.info must still print. "
        "Kernel tier only: an in-process shell gives every cell its own sys.stderr",
        ["import logging\nlogging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s', force=True)",
         "logging.info('hello')"],
        edit={1: "logging.info('hello again')"},
        inprocess=False,
    ),
    pattern(
        "getstate_drops_a_changed_cache",
        "a notebook class whose __getstate__ drops its cache: a digest of what the hook keeps misses the "
        "edited cell's change, and the reader replays 1 where a fresh run prints 2",
        ["class C:\n    def __init__(self):\n        self.n = 1\n        self.cache = None\n    def __getstate__(self):\n        d = dict(self.__dict__)\n        d['cache'] = None\n        return d", "c = C()", "c.cache = 1", "print(c.cache)"],
        edit={2: "c.cache = 2"},
    ),
    pattern(
        "getstate_cache_brought_back",
        "restored through its __getstate__, the instance lost the cache a later cell prints (None, not 5)",
        ["class C:\n    def __init__(self):\n        self.n = 1\n        self.cache = None\n    def __getstate__(self):\n        d = dict(self.__dict__)\n        d['cache'] = None\n        return d", "c = C()\nc.cache = 5", "print(c.cache)"],
        edit={2: "print('cache', c.cache)"},
    ),
    pattern(
        "reduce_from_constructor_arguments",
        "a __reduce__ that rebuilds from the constructor argument recomputes b: the restore said 6, the notebook had 100",
        ["class R:\n    def __init__(self, a):\n        self.a = a\n        self.b = a * 2\n    def __reduce__(self):\n        return (R, (self.a,))",
         "r = R(3)\nr.b = 100", "print(r.b)"],
        edit={2: "print('b', r.b)"},
    ),
    pattern(
        "slots_with_a_partial_getstate",
        "a __slots__ class whose __getstate__ keeps one slot: restored, the other slot was missing (AttributeError)",
        ["class S:\n    __slots__ = ('a', 'b')\n    def __init__(self):\n        self.a = 1\n        self.b = 2\n    def __getstate__(self):\n        return (None, {'a': self.a})",
         "s = S()\ns.b = 9", "print(s.a, s.b)"],
        edit={2: "print('ab', s.a, s.b)"},
    ),
    pattern(
        "frozen_dataclass_setstate",
        "a frozen dataclass whose __setstate__ resets a field: restored, y was -1 where the notebook had 5",
        ["from dataclasses import dataclass\n@dataclass(frozen=True)\nclass F:\n    x: int\n    y: int = 0\n    def __getstate__(self):\n        return {'x': self.x}\n"
         "    def __setstate__(self, s):\n        object.__setattr__(self, 'x', s['x'])\n        object.__setattr__(self, 'y', -1)",
         "f = F(1, 5)", "print(f)"],
        edit={2: "print('f', f)"},
    ),
    pattern(
        "list_subclass_getstate_forgets_its_tag",
        "a list subclass whose __getstate__ returns {}: the tag changed by the edited cell was not in the digest, "
        "and the reader replayed 3 where a fresh run prints 4",
        ["class LL(list):\n    def __init__(self, *a):\n        super().__init__(*a)\n        self.tag = 0\n    def __getstate__(self):\n        return {}",
         "l = LL([1, 2])", "l.tag = 3", "print(l, l.tag)"],
        edit={2: "l.tag = 4"},
    ),
    pattern(
        "dict_subclass_reduce_forgets_its_items",
        "a dict subclass whose __reduce__ rebuilds it empty: the edited item was not in the digest (stale {'a': 2})",
        ["class DD(dict):\n    def __reduce__(self):\n        return (DD, ())", "d = DD(a=1)", "d['a'] = 2", "print(d)"],
        edit={2: "d['a'] = 3"},
    ),
    pattern(
        "local_module_class_getstate",
        "a class from a module beside the notebook whose __getstate__ drops its cache: the reader replayed 1, not 2",
        ["from shapes import Box", "b = Box()", "b.cache = 1", "print(b.cache)"],
        edit={2: "b.cache = 2"},
        files={"shapes.py": "class Box:\n    def __init__(self):\n        self.cache = 0\n    def __getstate__(self):\n        return {'cache': 0}\n"},
    ),
    pattern(
        "object_array_holds_a_list",
        "a numpy object array holding a list another name holds: the list changed through the name after an edit "
        "came back in the array as it was before ([1] False, not [1, 3] True)",
        ["import numpy as np\nl = [1]\na = np.empty(2, dtype=object)\na[0] = l\na[1] = 'x'", "l.append(2)", "print(a[0], a[0] is l)"],
        edit={1: "l.append(3)"},
    ),
    pattern(
        "library_module_attribute_patched",
        "math.tau = 6 in a replayed cell: a replay left math as it was, and a later cell printed 6.283... where a "
        "fresh run prints 6. Kernel tier only: in-process runs share one math module",
        ["import math\nmath.tau = 6", "print(math.tau)"],
        edit={1: "print('tau', math.tau)"},
        inprocess=False,
        replays=(),  # the patching cell always runs
    ),
    pattern(
        "library_class_method_added",
        "a method added to collections.Counter by a replayed cell: the later cell that calls it raised AttributeError",
        ["import collections\ncollections.Counter.total2 = lambda self: sum(self.values())",
         "c = collections.Counter('aab')\nprint(c.total2())"],
        edit={1: "c = collections.Counter('aab')\nprint('t', c.total2())"},
        inprocess=False,
        replays=(),  # the patching cell always runs
    ),
    pattern(
        "setattr_on_a_library_class_imported_earlier",
        "setattr(fractions.Fraction, 'half', ...) in a replayed cell, fractions imported by an earlier cell",
        ["import fractions", "setattr(fractions.Fraction, 'half', lambda self: self / 2)", "print(fractions.Fraction(1, 3).half())"],
        edit={2: "print('h', fractions.Fraction(1, 3).half())"},
        inprocess=False,
        replays=(0,),  # the import replays; the patching cell always runs
    ),
    pattern(
        "pandas_accessor_registered_by_a_replayed_cell",
        "@pd.api.extensions.register_dataframe_accessor in a replayed cell: the accessor was missing when a "
        "later cell used it ('DataFrame' object has no attribute 'geo')",
        ["import pandas as pd\n@pd.api.extensions.register_dataframe_accessor('geo')\nclass Geo:\n    def __init__(self, df):\n"
         "        self._df = df\n    def center(self):\n        return float(self._df['x'].mean())",
         "print(pd.DataFrame({'x': [1.0, 3.0]}).geo.center())"],
        edit={1: "print('c', pd.DataFrame({'x': [1.0, 3.0]}).geo.center())"},
        inprocess=False,
        replays=(),  # the patching cell always runs
    ),
    pattern(
        "collector_timeout_and_locale_set_by_a_replayed_cell",
        "gc.disable(), socket.setdefaulttimeout(5) and setlocale(LC_ALL, 'C.UTF-8') in a replayed cell: a later "
        "cell saw the collector on, no timeout and the C locale",
        ["import gc, locale, socket\ngc.disable()\nsocket.setdefaulttimeout(5)\nlocale.setlocale(locale.LC_ALL, 'C.UTF-8')",
         "print(gc.isenabled(), socket.getdefaulttimeout(), locale.setlocale(locale.LC_CTYPE))"],
        edit={1: "print('now', gc.isenabled(), socket.getdefaulttimeout(), locale.setlocale(locale.LC_CTYPE))"},
    ),
    pattern(
        "dict_view_sees_a_later_insert",
        "ks = d.keys() restored over a copy of d: a key a replayed cell added to d was missing from it "
        "(['a'] where a fresh run prints ['a', 'b'])",
        ["d = {'a': 1}\nks = d.keys()", "d['b'] = 2", "print(list(ks))"],
        edit={2: "print('keys', list(ks))"},
    ),
    pattern(
        "iterators_see_a_later_append",
        "iter(lst), enumerate(lst) and zip(lst, lst) restored over a copy of lst: an item a replayed cell "
        "appended was missing from them",
        ["lst = [1, 2]\nit = iter(lst)\ncounted = enumerate(lst)\npairs = zip(lst, lst)", "lst.append(3)",
         "print(list(it), list(counted), list(pairs))"],
        edit={2: "print('all', list(it), list(counted), list(pairs))"},
    ),
    pattern(
        "array_made_read_only_by_a_replayed_cell",
        "a.setflags(write=False) in a replayed cell: the array's key ignored the flag, so it was not stored "
        "again and came back writeable (a later write succeeded where a fresh run raises)",
        ["import numpy as np\na = np.arange(3)", "a.setflags(write=False)", "print(a.flags.writeable)"],
        edit={2: "print('writeable', a.flags.writeable)"},
    ),
    pattern(
        "memoryview_over_a_bytearray_a_replayed_cell_changed",
        "mv = memoryview(buf), which cannot be stored: buf was stored on its own, so the rebuilt mv was over a "
        "new buf without the replayed cell's write (b'ab' where a fresh run prints b'xb')",
        ["buf = bytearray(b'ab')\nmv = memoryview(buf)", "buf[0] = 120", "print(bytes(mv))"],
        edit={2: "print('view', bytes(mv))"},
        replays=(0,),  # the write to a value rebuilt with mv runs
    ),
    pattern(
        "csv_writer_into_a_stringio",
        "w = csv.writer(buf) keeps buf.write from C: w and buf were stored apart, and the reader printed an "
        "empty buffer where a fresh run prints the row the replayed cell wrote",
        ["import csv, io\nbuf = io.StringIO()\nw = csv.writer(buf)", "w.writerow([1, 2])", "print(repr(buf.getvalue()))"],
        edit={2: "print('csv', repr(buf.getvalue()))"},
    ),
    pattern(
        "parquet_input_changed_on_disk",
        "pd.read_parquet opens the file in pyarrow's C++, so no open was seen: a changed t.parquet replayed "
        "the old rows ([1, 2] where a fresh run prints [3, 4])",
        ["import pandas as pd\ndf = pd.read_parquet('t.parquet')", "print(df.v.tolist())"],
        edit={1: "print('rows', df.v.tolist())"},
        setup_audit=parquet_one_two,
        setup_repeat=parquet_three_four,
        replays=(),  # its input changed
    ),
    pattern(
        "parquet_written_by_a_replayed_cell",
        "df.to_parquet writes through pyarrow's OSFile: the file was not recorded, so a repeat in a new folder "
        "did not put it back and the reader raised FileNotFoundError",
        ["import pandas as pd\npd.DataFrame({'v': [5]}).to_parquet('w.parquet')", "print(pd.read_parquet('w.parquet').v.tolist())"],
        edit={1: "print('back', pd.read_parquet('w.parquet').v.tolist())"},
    ),
    pattern(
        "task_reads_an_environment_variable_a_cell_set",
        "a Dask task whose function reads os.environ['NBR_DIFF_K'], set by an edited cell: the cell ran but its "
        "task was a cache hit from the audit ((0, 2, 4) where a fresh run prints (0, 4, 8))",
        ["import dask\nimport os\nos.environ['NBR_DIFF_K'] = '2'\ndef f(x):\n    return x * int(os.environ['NBR_DIFF_K'])",
         "print(dask.compute(*[dask.delayed(f)(i) for i in range(3)], scheduler='threads'))"],
        edit={0: "import dask\nimport os\nos.environ['NBR_DIFF_K'] = '4'\ndef f(x):\n    return x * int(os.environ['NBR_DIFF_K'])"},
    ),
    pattern(
        "object_array_identity_restore",
        "restored, an object array's element was a copy of the list the notebook also named (is: False)",
        ["import numpy as np\nl = [1]\na = np.empty(1, dtype=object)\na[0] = l", "print(a[0] is l)"],
        edit={1: "print('same', a[0] is l)"},
    ),
    # -- Class 2 again: the notebook's own package, installed in development mode -------------
    *_installed_own_package_patterns(),
    *_module_loaded_other_ways_patterns(),
    *_logger_patterns(),
    *_own_code_in_tasks_patterns(),
    *_task_reads_patterns(),
    *_library_patch_patterns(),
    *_task_effect_patterns(),
    *_module_code_state_patterns(),
    *_replayed_code_patterns(),
    *_setting_code_patterns(),
    *_output_history_patterns(),
    *_library_call_state_patterns(),
    *_library_object_patterns(),
    *_copy_on_write_patterns(),
    *_subclass_view_patterns(),
    *_freed_value_patterns(),
    *_finalizer_patterns(),
    *(
        pattern(
            f"automagic_name_{name}_shown", f"{name}, a notebook name that is also an IPython alias magic, shown alone: "
            f"the forecast transformed the line as `%{name}` (the name was not bound yet) and said the cell would run",
            [f"{name} = [1, 2]", name, f"print(len({name}))"], edit={2: f"print(len({name}), 'x')"},
        )
        for name in ("lk", "ll", "lf")
    ),
]

@functools.lru_cache(maxsize=1)
def _registry() -> tuple[list[Pattern], dict[str, Pattern]]:
    patterns = _patterns()
    by_name = {p.name: p for p in patterns}
    assert len(by_name) == len(patterns), "pattern names must be unique"
    return patterns, by_name


def __getattr__(name: str) -> Any:
    # PATTERNS and BY_NAME are not module attributes: in process this module is one of the
    # notebook's "local modules", whose data every cell digests twice (about 15 ms for these
    # lists); held by a function, they are code, not data.
    if name == "PATTERNS":
        return _registry()[0]
    if name == "BY_NAME":
        return _registry()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


KERNEL_PATTERNS: list[str] = [
    "worker_process_reads_a_file_by_a_built_path",
    "worker_process_lists_a_folder",
    "logger_level_on_a_kernel_edited",
    "logger_level_on_a_kernel_reader_edited",
    "logger_disable_all_on_a_kernel_edited",
    "logger_disable_all_on_a_kernel_reader_edited",
    "sort_inplace",
    "class_method_assigned_restore",
    "numpy_view_base",
    "random_getstate_after_seed",
    "dask_task_global_np_random",
    "module_edited_on_disk",
    "pandas_set_option_unmodified",
    "settings_unmodified_replay",
    "pandas_set_option_after_import_edit",
    "listdir_new_file",
    "tempfile_read_after_edit",
    "file_renamed_then_read",
    "folder_moved_after_its_files_changed",
    "sqlite_changed_outside",
    "env_var_in_function",
    "main_dict_read",
    "thread_pool_random_restore",
    "generator_consumed_later",
    "distributed_local_cluster_file",
    "worker_process_reads_a_changed_file",
    "handle_brought_back_after_replayed_writes",
    "handle_on_a_file_no_cell_wrote_brought_back",
    "lru_cache_reads_a_changed_global",
    "two_handles_one_cell",
    "memmap_written_through",
    "umask_set_by_a_replayed_cell",
    "logging_basic_config_by_a_replayed_cell",
    "getstate_drops_a_changed_cache",
    "object_array_holds_a_list",
    "library_module_attribute_patched",
    "library_class_method_added",
    "setattr_on_a_library_class_imported_earlier",
    "pandas_accessor_registered_by_a_replayed_cell",
    "collector_timeout_and_locale_set_by_a_replayed_cell",
]
KERNEL_PATTERNS += [f"library_patch_{name}_edited" for name, *_ in _PATCHES] + ["library_patch_kept_reader_between_replays"]
KERNEL_PATTERNS += [f"replayed_{n}_raises_in_a_cell_that_runs" for n in ("function", "method", "lambda", "comprehension")]
KERNEL_PATTERNS += ["replayed_function_warns_in_a_cell_that_runs", "ipython_xmode_edited_on_a_kernel"]
KERNEL_PATTERNS += ["deleted_array_freed_inside_the_cell", "rebound_instance_freed_inside_the_cell", "deleted_cycle_freed_inside_the_cell"]
KERNEL_PATTERNS += ["open_file_with_buffered_write_rebound_runs_its_finalizer", "list_of_objects_with_del_deleted_runs_its_finalizer"]
KERNEL_PATTERNS += ["module_class_attribute_kept_reader_edited", "module_closure_counter_kept_reader_edited"]
KERNEL_PATTERNS += [f"library_call_{label}_{how}" for label, *_ in _LIBRARY_CALLS for how in ("edited", "kept")]
KERNEL_PATTERNS += [
    f"library_call_calendar_{label}_{how}" for label in ("amid_statements", "in_a_block", "through_an_alias", "library_object_method",
                                                          "argument_from_a_cell") for how in ("edited", "kept")
]
KERNEL_PATTERNS += [f"library_object_{label}_{how}" for label, *_ in _LIBRARY_OBJECTS for how in ("edited", "kept")]
KERNEL_PATTERNS += [f"library_object_{reach}_{op}_{how}" for reach, op in _LIBRARY_DIAGONAL for how in ("edited", "kept")]
KERNEL_PATTERNS += ["copy_on_write_column_written_through_the_view", "copy_on_write_rows_written_through_the_owner"]
SLOW_KERNEL_PATTERNS: list[str] = [
    f"library_object_{reach}_{op}_{how}" for reach in _LIBRARY_REACHES for op, *_ in _LIBRARY_OPS for how in ("edited", "kept")
    if (reach, op) not in _LIBRARY_DIAGONAL
]
"""Run on kernels with ``-m slow`` only: the rest of a generated class whose diagonal is in `KERNEL_PATTERNS`."""
KERNEL_PATTERNS += [
    "history_values_unders_reader_edited", "history_named_changed_then_bound_anew_indexed_reader_edited",
    "history_frame_keys_cell_inserted", "history_unstorable_by_name_indexed_reader_edited",
]


# ---------------------------------------------------------------------------
# Process-state hygiene for in-process runs


def _python_default_filters() -> list[Any]:
    """The warnings filters a fresh non-dev-mode interpreter (and so a kernel) starts with."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.simplefilter("ignore", ImportWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        # What importing IPython.core.completer adds: a kernel imports it at startup, an
        # in-process shell on first use (which would make the first run's filters differ).
        warnings.filterwarnings("error", category=ProvisionalCompleterWarning)
        return list(warnings.filters)


_BASE_SYS_PATH = ["", *(p for p in sys.path if p != "")]
_BASE_FILTERS = _python_default_filters()
_BASE_DASK_CONFIG = copy.deepcopy(dask.config.config)
_BASE_NP_PRINT = np.get_printoptions()
_BASE_RECURSION = sys.getrecursionlimit()
_BASE_DIGITS = sys.get_int_max_str_digits()
_BASE_UMASK = os.umask(0o022)
os.umask(_BASE_UMASK)
_BASE_LOGGERS = frozenset(logging.Logger.manager.loggerDict)
_BASE_ROOT_HANDLERS = tuple(logging.getLogger().handlers)
_BASE_ROOT_LEVEL = logging.getLogger().level
_BASE_TZ = os.environ.get("TZ")
_BASE_LOCALE = locale.setlocale(locale.LC_ALL)


def _under(path: Any, workdir: str) -> bool:
    """Whether a module file or path-finder entry belongs to the run in `workdir` (or is relative, as "lib" is)."""
    if not isinstance(path, str):
        return False
    return not os.path.isabs(path) or path == workdir or path.startswith(workdir + os.sep)


def purge_local_modules(workdir: Path) -> None:
    """Forget modules imported from `workdir` or through a relative sys.path entry, and their path finders.

    No registry of past workdirs is kept at module level on purpose: the session records
    every loaded local module's data attributes (this module is one, in-process), so
    state changing here between runs would change every cell's key.
    """
    here = str(workdir.resolve())
    for name, module in list(sys.modules.items()):
        if _under(getattr(module, "__file__", None), here):
            del sys.modules[name]
    for entry in list(sys.path_importer_cache):
        if _under(entry, here):
            del sys.path_importer_cache[entry]
    # zipimport keeps each archive's listing by its path: a relative "lib.zip" would be the
    # previous run's archive, which holds other modules.
    for archive in list(getattr(zipimport, "_zip_directory_cache", {})):
        if _under(archive, here):
            del zipimport._zip_directory_cache[archive]
    importlib.invalidate_caches()


def reset_library_settings() -> None:
    """Library settings back to what a new kernel process starts with."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pd.reset_option("all")
    np.set_printoptions(**_BASE_NP_PRINT)
    np.seterr(divide="warn", over="warn", under="ignore", invalid="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matplotlib.rcdefaults()
    dask.config.config.clear()
    dask.config.config.update(copy.deepcopy(_BASE_DASK_CONFIG))
    decimal.setcontext(decimal.Context())
    sys.setrecursionlimit(_BASE_RECURSION)
    sys.set_int_max_str_digits(_BASE_DIGITS)
    os.umask(_BASE_UMASK)
    if os.environ.get("TZ") != _BASE_TZ:
        if _BASE_TZ is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = _BASE_TZ
    time.tzset()
    gc.enable()
    socket.setdefaulttimeout(None)
    locale.setlocale(locale.LC_ALL, _BASE_LOCALE)
    _reset_loggers()


def _reset_loggers() -> None:
    """Loggers a run made or configured back to a new logger's defaults, and the root logger's
    level and handlers back to this process's (a test runner's own capture handlers stay)."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name not in _BASE_LOGGERS:
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.filters.clear()
            logger.setLevel(logging.NOTSET)
            logger.propagate, logger.disabled = True, False
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in _BASE_ROOT_HANDLERS and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(_BASE_ROOT_LEVEL)
    logging.disable(logging.NOTSET)


@contextlib.contextmanager
def clean_process_state(workdir: Path) -> Iterator[None]:
    """Around one in-process run in `workdir`: start from a new process's state, leave nothing behind."""
    saved_path, saved_filters, saved_bytecode = list(sys.path), list(warnings.filters), sys.dont_write_bytecode

    def reset() -> None:
        purge_local_modules(workdir)
        reset_library_settings()

    reset()
    sys.path[:] = _BASE_SYS_PATH
    warnings.filters[:] = _BASE_FILTERS
    warnings._filters_mutated()  # type: ignore[attr-defined]
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.path[:] = saved_path
        warnings.filters[:] = saved_filters
        warnings._filters_mutated()  # type: ignore[attr-defined]
        sys.dont_write_bytecode = saved_bytecode
        reset()


def prepare_workdir(workdir: Path, files: dict[str, str], setup: Setup | None) -> Path:
    """Create `workdir` with `files` (fresh mtimes) and run `setup` in it."""
    workdir.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        path = workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if setup is not None:
        setup(workdir)
    return workdir


def run_one(cells: tuple[str, ...], workdir: Path, files: dict[str, str], setup: Setup | None, **kw: Any) -> RunOutcome:
    """One in-process run of `cells` in a new `workdir` prepared with `files`/`setup`."""
    prepare_workdir(workdir, files, setup)
    with clean_process_state(workdir):
        return run_cells(cells, workdir, **kw)


@dataclass
class PatternRuns:
    """The in-process runs of one pattern (the control runs only when asked for)."""

    pattern: Pattern
    audit: RunOutcome
    repeat: RunOutcome
    fresh_edited: RunOutcome
    fresh_edited_again: RunOutcome | None = None
    fresh_original: RunOutcome | None = None


def keep_seeded_rngs(p: Pattern, *runs: RunOutcome) -> None:
    """Only the global RNGs the notebook seeds have a determined final state."""
    for run in runs:
        for which in list(run.rng):
            if which not in p.seeded:
                del run.rng[which]


def run_pattern(p: Pattern, root: Path, *, control: bool = True) -> PatternRuns:
    """Audit N, repeat N' (same store) and N' fresh, each in its own folder under `root`; with
    `control`, also N' fresh again and N fresh (the harness's own check)."""
    store = root / "store"
    runs = PatternRuns(
        p,
        audit=run_one(p.cells, root / "audit", p.files_audit, p.setup_audit, mode="audit", store=store),
        repeat=run_one(p.edited, root / "repeat", p.files_repeat, p.setup_repeat or p.setup_audit, mode="repeat", store=store, forecast=True),
        fresh_edited=run_one(p.edited, root / "fresh-edited", p.files_repeat, p.setup_repeat or p.setup_audit),
    )
    if control:
        runs.fresh_edited_again = run_one(p.edited, root / "fresh-edited-again", p.files_repeat, p.setup_repeat or p.setup_audit)
        runs.fresh_original = run_one(p.cells, root / "fresh-original", p.files_audit, p.setup_audit)
    keep_seeded_rngs(p, *(r for r in (runs.audit, runs.repeat, runs.fresh_edited, runs.fresh_edited_again, runs.fresh_original) if r is not None))
    return runs
