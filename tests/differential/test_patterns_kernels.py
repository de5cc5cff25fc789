"""Named stale-replay patterns through real kernels and nbclient (a subset of `patterns.py`).

For each pattern in `KERNEL_PATTERNS` (and `SLOW_KERNEL_PATTERNS` with ``-m slow``): audit N on `nbrewind-audit` in a folder
holding `files_audit` (and `setup_audit`), repeat N' on `nbrewind-repeat` with
the same store in a new folder holding `files_repeat` (and `setup_repeat`), and
run N' on a plain `python3` kernel in a third folder prepared like the repeat's.
A probe cell appended to N' prints the canonical namespace, the seeded RNG
states, the `NBR_DIFF_*` variables and a digest of every file in the folder;
the two N' notebooks must then match cell by cell (as in test_kernels.py), and
the audit's notebook must show no NBRewind message. Every kernel is a new
process, so nothing leaks between the runs.

Run one pattern with `pytest tests/differential/test_patterns_kernels.py -k main_dict_read`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from differential import patterns
from differential.patterns import KERNEL_PATTERNS, SLOW_KERNEL_PATTERNS, Pattern, prepare_workdir
from differential.test_kernels import TESTS_DIR, _write, normalized_cells


pytestmark = pytest.mark.long  # its own CI step (pyproject.toml)


def probe_cell(p: Pattern) -> str:
    """Namespace picture, seeded RNG states, env and files of the folder, one item per line."""
    return "\n".join(
        [
            "import sys as _nbr_sys, os as _nbr_os, random as _nbr_random, hashlib as _nbr_hashlib, pathlib as _nbr_pathlib",
            f"_nbr_sys.path.insert(0, {str(TESTS_DIR)!r})",
            "from differential.canon import dump as _nbr_dump",
            f"_nbr_sys.path.remove({str(TESTS_DIR)!r})",
            "print('namespace', _nbr_dump(globals()))",
            f"if 'random' in {list(p.seeded)!r}:",
            "    print('random', _nbr_random.getstate())",
            f"if 'numpy.random' in {list(p.seeded)!r}:",
            "    _nbr_np_state = _nbr_sys.modules['numpy'].random.get_state(legacy=True)",
            "    print('numpy.random', _nbr_np_state[1].tolist(), _nbr_np_state[2:])",
            "print('env', sorted((k, v) for k, v in _nbr_os.environ.items() if k.startswith('NBR_DIFF_')))",
            "_nbr_files = []",
            "for _nbr_dir, _nbr_dirs, _nbr_names in _nbr_os.walk('.'):",
            "    _nbr_dirs[:] = sorted(d for d in _nbr_dirs if d != '__pycache__' and not d.endswith('.nbrewind'))",
            "    for _nbr_name in sorted(_nbr_names):",
            "        _nbr_path = _nbr_os.path.join(_nbr_dir, _nbr_name)",
            "        if _nbr_path != './nb.ipynb':  # read through pathlib: no file object is left in the namespace",
            "            _nbr_files.append((_nbr_path, _nbr_hashlib.sha256(_nbr_pathlib.Path(_nbr_path).read_bytes()).hexdigest()))",
            "print('files', _nbr_files)",
        ]
    )


def _mentions_nbrewind(cells: list[tuple[Any, ...]]) -> list[str]:
    return [repr(out)[:300] for _, outputs in cells for out in outputs if "nbrewind" in repr(out).lower()]


@functools.lru_cache(maxsize=None)
def _runs(name: str, base: Path) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(audit cells, repeat cells, python3 cells, the repeat's cell-log rows) of pattern `name`."""
    from nbrewind.run import run_notebook
    from nbrewind.store import Store
    from nbrewind.store.report import cell_log

    p = patterns.BY_NAME[name]
    root = base / f"kpattern_{name}"
    store = root / "store"
    edited = [*p.edited, probe_cell(p)]
    setup_repeat = p.setup_repeat or p.setup_audit
    outs = {}
    for run, cells, files, setup, kernel in [
        ("audit", list(p.cells), p.files_audit, p.setup_audit, "audit"),
        ("repeat", edited, p.files_repeat, setup_repeat, "repeat"),
        ("fresh", edited, p.files_repeat, setup_repeat, "python3"),
    ]:
        folder = prepare_workdir(root / run, files, setup)
        outs[run] = root / f"{run}-out.ipynb"
        run_notebook(
            _write(folder / "nb.ipynb", cells),
            kernel=kernel,
            store=None if kernel == "python3" else store,
            allow_errors=True,
            output=outs[run],
            timeout=120,
        )
    with Store.open(store) as opened:
        rows = cell_log(opened, last_session=True)
    return normalized_cells(outs["audit"]), normalized_cells(outs["repeat"]), normalized_cells(outs["fresh"]), rows


_NAMES = [*KERNEL_PATTERNS, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW_KERNEL_PATTERNS)]


@pytest.mark.kernel
@pytest.mark.parametrize("name", _NAMES)
def test_repeat_matches_python3(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Audit N, repeat N': outputs, counts, namespace and hidden state equal a python3 run of N'; the audit is silent."""
    p = patterns.BY_NAME[name]
    audit, repeat, fresh, rows = _runs(name, tmp_path_factory.getbasetemp())
    assert len(repeat) == len(fresh) == len(p.edited) + 1
    decisions = [row.decision for row in rows]
    problems = [
        f"cell {i} ({decisions[i] if i < len(decisions) else '?'}): repeat {r!r}\n   python3 {f!r}"
        for i, (r, f) in enumerate(zip(repeat, fresh))
        if r != f
    ]
    problems += [f"NBRewind spoke in the audit: {m}" for m in _mentions_nbrewind(audit)]
    assert not problems, p.describe() + f"\n\nrepeat decisions {decisions}\nrepeat of N' differs from python3:\n" + "\n".join(problems)


@pytest.mark.kernel
@pytest.mark.parametrize("name", _NAMES)
def test_unchanged_prefix_replays(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The pattern exercises replay on real kernels: the cells before the first edit replay (DESIGN property 2)."""
    p = patterns.BY_NAME[name]
    rows = _runs(name, tmp_path_factory.getbasetemp())[3]
    ran = [(i, rows[i].decision, rows[i].reason) for i in p.must_replay if rows[i].decision != "replayed"]
    assert not ran, p.describe() + f"\n\nthese cells before the first edit did not replay: {ran}"
