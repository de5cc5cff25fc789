"""Differential fidelity tests through real kernels and nbclient (`nbrewind.run.run_notebook`).

For each case: audit N on the `nbrewind-audit` kernel, repeat N' on
`nbrewind-repeat` with the same store but in a new, empty folder, and run N' on
a plain `python3` kernel. A probe cell appended to N' (new code, so it always
runs) prints the canonical namespace and the hidden state (seeded RNG states,
`NBR_DIFF_*` environment variables, files in the folder). The two N' notebooks
must then match cell by cell: execution counts, and every output after
normalizing only what legitimately differs between processes (ANSI colour
codes and ipykernel's temporary cell file names in tracebacks). The store's
cell log must show the replays that minimal work promises.

Run one case with `pytest tests/differential/test_kernels.py -k seed_3`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from differential.generator import Case, make_case
from differential.known_bugs import FIDELITY_BUGS, MINIMAL_WORK_BUGS, expected_failures

TESTS_DIR = Path(__file__).resolve().parents[1]
FAST_SEEDS = range(0, 12)
SLOW_SEEDS = range(12, 60)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CELL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py|<ipython-input-[^>]*>")


def probe_cell(case: Case) -> str:
    """A cell printing the namespace picture and hidden state, one item per line."""
    seeded = sorted(set(case.global_seed_cells.values()))
    return "\n".join(
        [
            "import sys as _nbr_sys, os as _nbr_os, random as _nbr_random, json as _nbr_json",
            f"_nbr_sys.path.insert(0, {str(TESTS_DIR)!r})",
            "from differential.canon import dump as _nbr_dump",
            "print('namespace', _nbr_dump(globals()))",
            f"if 'random' in {seeded!r}:",
            "    print('random', _nbr_random.getstate())",
            f"if 'numpy.random' in {seeded!r}:",
            "    _nbr_np_state = _nbr_sys.modules['numpy'].random.get_state(legacy=True)",
            "    print('numpy.random', _nbr_np_state[1].tolist(), _nbr_np_state[2:])",
            "print('env', sorted((k, v) for k, v in _nbr_os.environ.items() if k.startswith('NBR_DIFF_')))",
            "print('files', sorted((p, open(p).read()) for p in _nbr_os.listdir('.') if p != 'nb.ipynb'))",
        ]
    )


def _write(path: Path, cells: list[str]) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def _normal_output(output: dict[str, Any]) -> tuple[Any, ...]:
    kind = output["output_type"]
    if kind == "stream":
        # A warning names the file of the cell that warned, which holds the kernel's pid.
        return ("stream", output["name"], _CELL_FILE.sub("<cell>", output["text"]))
    if kind == "execute_result":
        return ("execute_result", output.get("execution_count"), dict(output["data"]))
    if kind == "display_data":
        return ("display_data", dict(output["data"]))
    if kind == "error":
        trace = [_CELL_FILE.sub("<cell>", _ANSI.sub("", line)) for line in output.get("traceback", [])]
        return ("error", output["ename"], output["evalue"], tuple(trace))
    return (kind, repr(output))


def normalized_cells(path: Path) -> list[tuple[Any, ...]]:
    """Per code cell: (execution_count, outputs), adjacent stream outputs merged."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs: list[tuple[Any, ...]] = []
        for out in map(_normal_output, cell.get("outputs", [])):
            if outputs and out[0] == "stream" and outputs[-1][:2] == out[:2]:
                outputs[-1] = ("stream", out[1], outputs[-1][2] + out[2])
            else:
                outputs.append(out)
        cells.append((cell.get("execution_count"), tuple(outputs)))
    return cells


def run_case(case: Case, root: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[Any]]:
    """Audit N, repeat N' and run N' plainly; return both N' results and the repeat's log rows."""
    from nbrewind.run import run_notebook
    from nbrewind.store import Store
    from nbrewind.store.report import cell_log

    store = root / "store"
    edited = [*case.edited, probe_cell(case)]
    audit = run_notebook(_write(root / "audit" / "nb.ipynb", list(case.cells)), kernel="audit", store=store, allow_errors=True, timeout=120)
    assert audit.error is None or "Error" in audit.error
    repeat_out, fresh_out = root / "repeat-out.ipynb", root / "fresh-out.ipynb"
    run_notebook(_write(root / "repeat" / "nb.ipynb", edited), kernel="repeat", store=store, allow_errors=True, output=repeat_out, timeout=120)
    run_notebook(_write(root / "fresh" / "nb.ipynb", edited), kernel="python3", allow_errors=True, output=fresh_out, timeout=120)
    with Store.open(store) as opened:
        rows = cell_log(opened, last_session=True)
    return normalized_cells(repeat_out), normalized_cells(fresh_out), rows


def _params(seeds: range, *marks: pytest.MarkDecorator) -> list[Any]:
    out = []
    for seed in seeds:
        case = make_case(seed)
        reasons = expected_failures(case, FIDELITY_BUGS + MINIMAL_WORK_BUGS, "kernel")
        case_marks = [pytest.mark.kernel, *marks]
        if reasons:
            case_marks.append(pytest.mark.xfail(strict=True, reason=" | ".join(reasons)))
        out.append(pytest.param(seed, marks=case_marks, id=case.id))
    return out


def check_case(seed: int, root: Path) -> None:
    case = make_case(seed)
    repeat, fresh, rows = run_case(case, root)
    assert len(repeat) == len(fresh) == len(case.cells) + 1
    problems = [
        f"cell {i} ({rows[i].decision if i < len(rows) else '?'}): repeat {r!r}\n   python3 {f!r}"
        for i, (r, f) in enumerate(zip(repeat, fresh))
        if r != f
    ]
    assert not problems, case.describe() + "\n\nrepeat of N' differs from python3:\n" + "\n".join(problems)
    decisions = [row.decision for row in rows]
    assert len(decisions) == len(case.cells) + 1, decisions
    assert decisions[-1] == "executed", "the probe cell is new code and must run"
    replay_until = len(case.cells) if case.cosmetic_only else case.first_edited
    # By design a cell whose recorded run raised replays only for identical text (its
    # traceback shows the source), so a cosmetic edit of such a cell runs.
    assert all(
        row.decision == "replayed" or "traceback shows the old source" in (row.reason or "") for row in rows[:replay_until]
    ), (case.describe(), decisions)


@pytest.mark.parametrize("seed", _params(FAST_SEEDS))
def test_repeat_matches_python3(seed: int, tmp_path: Path) -> None:
    """Audit N, repeat N': outputs, counts, namespace and hidden state equal a python3 run of N'."""
    check_case(seed, tmp_path)


@pytest.mark.parametrize("seed", _params(SLOW_SEEDS, pytest.mark.slow))
def test_repeat_matches_python3_more(seed: int, tmp_path: Path) -> None:
    """test_repeat_matches_python3 on more seeds."""
    check_case(seed, tmp_path)
