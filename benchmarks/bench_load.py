"""Loading the state-heavy notebook's state after cell 9, against the simplest alternative.

Run: ``python -m benchmarks.bench_load [--rounds N] [--threads 1,2,4] [--before DIR] [--kernel] [--json OUT]``.

One run builds the state once and then, for each of N rounds and in a rotating order,
starts one fresh process per contender and takes the time until every value of the
state is usable (loaded and touched); medians over rounds are reported:

* **nbrewind**: cells 1-9 of ``benchmarks/notebooks/state-heavy.ipynb`` run on the
  audit kernel (as ``bench_kernels.py`` does) into a store; the fresh process opens
  the store, finds the checkpoint after cell 9 and loads every value group the way
  the repeat kernel's lazy namespace does (``load_group`` under ``restoring_into``),
  once per ``--threads`` value (``NBREWIND_READ_THREADS``);
* **before**, with ``--before DIR``: the same with ``PYTHONPATH=DIR``, a copy of the
  code to compare with (``git archive HEAD nbrewind | tar -x -C DIR``);
* **dill**: the same cells executed in a process's ``__main__``, saved with
  ``dill.dump_session``; the fresh process runs ``dill.load_session`` (skipped with a
  message when dill is not installed: it is no dependency of nbrewind);
* **floor**: the object files that hold the nbrewind state (trees and chunks), each
  read whole from the page cache into a page-aligned slot of one fresh numpy buffer
  and xxh3-128 hashed right after, on 1 thread and on 2: what reading plus verifying
  costs at the least; and, on 1 thread, each file's bytes after its 8-byte header read
  straight into consecutive places (where a restored array needs them): slower, since
  the kernel copies page cache 2-3 times slower between addresses misaligned by 8 bytes.

With ``--kernel`` it also times, in a fresh repeat kernel, ``%nbrewind restore 9`` and
then the first access of every name, inside the cell (so kernel start and messaging
are excluded), for the current code and for ``--before``.

Every fresh process imports numpy, pandas and its loader before its clock starts, so
import time is excluded for every contender alike. The files are in the page cache
throughout (the store was just written and is read every round). Each process then
loads the state 4 more times (``again``: the median of those), which on a shared VM,
where first touches of fresh memory vary most, is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOTEBOOK = Path(__file__).resolve().parent / "notebooks" / "state-heavy.ipynb"
CELLS = 9
# The user names of the state after cell 9 (``_touch`` checks a few of their values).
NAMES = ("np", "pd", "math", "time", "rng", "a", "n", "df", "agg", "a_stats", "b", "config", "f", "sq", "total", "i")


def _cells() -> list[str]:
    notebook = json.loads(NOTEBOOK.read_text())
    code = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    return code[:CELLS]


def _touch(ns: dict[str, Any]) -> None:
    """Use every value a little (and check the state is the notebook's)."""
    for name in NAMES:
        value = ns[name]
        if hasattr(value, "__len__"):
            len(value)
    a, df = ns["a"], ns["df"]
    assert ns["b"] is a and a.shape == (25_000_000,), "a / b restored wrong"
    assert float(a[-1]) >= 0.0 and df.shape == (1_000_000, 4) and float(df["x"].iloc[-1]) >= 0.0
    assert ns["total"] == 599994 and ns["sq"][3] == 7 and ns["f"](3) == 7 and ns["config"]["items"] == [1, 2, 3, 4]


# -- the fresh processes --------------------------------------------------------------

AGAIN = 4


def _repeat(load: Callable[[], float]) -> dict[str, Any]:
    first = load()
    again = [load() for _ in range(AGAIN)]
    return {"seconds": first, "again": statistics.median(again)}


def _child_nbrewind(store_path: str) -> dict[str, Any]:
    import importlib

    import numpy  # noqa: F401 - imported before the clock, as for every contender
    import pandas  # noqa: F401

    import nbrewind
    from nbrewind.checkpoint.serialize import restoring_into
    from nbrewind.checkpoint.values import load_group
    from nbrewind.store import Store

    groups: dict[str, float] = {}

    def load() -> float:
        start = time.perf_counter()
        store = Store.open(store_path, create=False)
        run = [r for r in store.catalog.cell_runs() if r.execution_count == CELLS][-1]
        assert run.checkpoint_id is not None
        ns: dict[str, Any] = {}
        for name, (digest, meta) in store.catalog.checkpoint_entries(run.checkpoint_id).items():
            if name in ns:
                continue
            if meta["kind"] == "module":
                ns[name] = importlib.import_module(meta["module"])
            elif meta["kind"] == "value":
                began = time.perf_counter()
                with restoring_into(ns):
                    ns.update(load_group(store.objects, digest))
                groups.setdefault("+".join(meta["group"]), time.perf_counter() - began)
        _touch(ns)
        seconds = time.perf_counter() - start
        assert ns["a"].flags.owndata, "a restored array must own its memory"
        store.close()
        return seconds

    return {**_repeat(load), "groups": groups, "code": nbrewind.__file__}


def _dill_main() -> Any:
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    return main


def _child_dill_dump(path: str) -> dict[str, Any]:
    import dill

    main = _dill_main()
    for number, code in enumerate(_cells(), start=1):
        exec(compile(code, f"<cell {number}>", "exec"), main.__dict__)
    dill.dump_session(path, main=main)
    return {"bytes": os.path.getsize(path)}


def _child_dill_load(path: str) -> dict[str, Any]:
    import warnings

    import dill
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    warnings.simplefilter("ignore")  # load_session() has been renamed load_module()

    def load() -> float:
        main = _dill_main()
        start = time.perf_counter()
        dill.load_session(path, main=main)
        _touch(main.__dict__)
        return time.perf_counter() - start

    return _repeat(load)


def _child_floor(files_json: str, threads: str, layout: str = "aligned") -> dict[str, Any]:
    """Read the object files into fresh memory and hash them. ``aligned``: each file whole
    into a page-aligned slot; ``payload``: each file's bytes after its 8-byte header into
    consecutive places, as a chunk's bytes must end up in a restored array."""
    import threading

    import numpy
    import xxhash

    paths: list[str] = json.loads(Path(files_json).read_text())
    sizes = [os.path.getsize(p) for p in paths]
    page = 4096

    def load() -> float:
        start = time.perf_counter()
        # Each file whole into its own page-aligned slot: the kernel copies at full speed
        # only between equally aligned addresses, and a file starts on a page.
        skip = 0 if layout == "aligned" else 8
        slots = [-(-size // page) * page if layout == "aligned" else size - skip for size in sizes]
        out = numpy.empty(sum(slots) + page, dtype=numpy.uint8)
        view = memoryview(out)
        jobs, offset = [], (-out.ctypes.data) % page
        for path, size, slot in zip(paths, sizes, slots):
            jobs.append((path, view[offset : offset + size - skip]))
            offset += slot
        lock = threading.Lock()
        pending = iter(jobs)

        def work() -> None:
            while True:
                with lock:
                    job = next(pending, None)
                if job is None:
                    return
                fd = os.open(job[0], os.O_RDONLY)
                try:
                    os.preadv(fd, [job[1]], skip)
                finally:
                    os.close(fd)
                hasher = xxhash.xxh3_128()
                hasher.update(job[1])  # releases the GIL on every xxhash version
                hasher.hexdigest()

        helpers = [threading.Thread(target=work) for _ in range(int(threads) - 1)]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
        return time.perf_counter() - start

    return {**_repeat(load), "bytes": sum(sizes)}


_CHILDREN = {"nbrewind": _child_nbrewind, "dill-dump": _child_dill_dump, "dill-load": _child_dill_load, "floor": _child_floor}


def _spawn(mode: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Run this file as a fresh process in ``mode``; its last stdout line is its JSON result.

    It runs as a script, not ``-m``, from a scratch folder: sys.path then starts with
    this folder, so ``PYTHONPATH`` decides which nbrewind is imported.
    """
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", mode, *args],
        capture_output=True, text=True, env=dict(os.environ, **(env or {})), cwd=cwd, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- building the state -------------------------------------------------------------


def _audit_store(work: Path) -> Path:
    """Cells 1-9 on the audit kernel; the store they wrote."""
    from nbrewind.run import run_notebook

    notebook = json.loads(NOTEBOOK.read_text())
    kept, code = [], 0
    for cell in notebook["cells"]:
        code += cell["cell_type"] == "code"
        if code > CELLS:
            break
        kept.append(cell)
    notebook["cells"] = kept
    path = work / "nine.ipynb"
    path.write_text(json.dumps(notebook))
    store = work / "nine.ipynb.nbrewind"
    run_notebook(path, kernel="audit", store=store)
    return store


def _state_files(store_path: Path) -> list[str]:
    """The object files that hold the values of the checkpoint after cell 9 (trees and chunks)."""
    from nbrewind.store import Store

    with Store.open(store_path, create=False) as store:
        run = [r for r in store.catalog.cell_runs() if r.execution_count == CELLS][-1]
        assert run.checkpoint_id is not None
        entries = store.catalog.checkpoint_entries(run.checkpoint_id)
        seen: dict[str, None] = {}
        todo = [digest for digest, meta in entries.values() if meta["kind"] == "value"]
        while todo:
            digest = todo.pop()
            if digest in seen:
                continue
            seen[digest] = None
            decoded = store.objects.get_children(digest)
            if decoded is not None:
                todo.extend(decoded[0])
        return [os.fspath(store.objects.path_of(d)) for d in seen]


# -- the kernel row ------------------------------------------------------------------

_KERNEL_CELL = """\
__import__("numpy"), __import__("pandas")
__import__("sys").__dict__["_nbrewind_bench"] = [__import__("time").perf_counter()]
%nbrewind restore {cells}
__import__("sys").__dict__["_nbrewind_bench"].append(__import__("time").perf_counter())
for _name in {names!r}:
    globals()[_name]
__import__("sys").__dict__["_nbrewind_bench"].append(__import__("time").perf_counter())
assert total == 599994 and b is a
print(__import__("json").dumps(__import__("sys").__dict__["_nbrewind_bench"]))
"""


def _kernel_restore(store: Path, folder: Path, env: dict[str, str]) -> dict[str, float]:
    """In a fresh repeat kernel: seconds of ``%nbrewind restore 9`` and of the first access of every name
    (numpy and pandas imported before the clock, as in the other contenders)."""
    from jupyter_client.manager import start_new_kernel

    lines: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            lines.extend(msg["content"]["text"].splitlines())

    km, kc = start_new_kernel(kernel_name="nbrewind-repeat", cwd=str(folder), env=dict(os.environ, NBREWIND_STORE=str(store), **env))
    try:
        reply = kc.execute_interactive(_KERNEL_CELL.format(cells=CELLS, names=NAMES), timeout=300, output_hook=hook)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the restore cell failed: {reply['content']}")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    t0, t1, t2 = json.loads(lines[-1])
    return {"restore": t1 - t0, "first_access": t2 - t1, "seconds": t2 - t0}


# -- the run -------------------------------------------------------------------------


def run(rounds: int, threads: list[int], before: Path | None, kernel: bool, work: Path) -> dict[str, Any]:
    store = _audit_store(work)
    files = _state_files(store)
    files_json = work / "files.json"
    files_json.write_text(json.dumps(files))
    scratch = work / "cwd"
    scratch.mkdir()
    contenders: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {}
    if before is not None:
        contenders["before"] = ("nbrewind", (str(store),), {"PYTHONPATH": str(before)})
    for count in threads:
        contenders[f"nbrewind {count} thread{'s' if count > 1 else ''}"] = (
            "nbrewind", (str(store),), {"NBREWIND_READ_THREADS": str(count)}
        )
    notes: list[str] = []
    try:
        import dill  # noqa: F401
    except ImportError:
        notes.append("dill is not installed: its row is skipped (pip install dill)")
    else:
        dill_file = work / "session.dill"
        dumped = _spawn("dill-dump", str(dill_file), cwd=scratch)
        notes.append(f"dill session file: {dumped['bytes'] / 1e6:.1f} MB")
        contenders["dill.load_session"] = ("dill-load", (str(dill_file),), {})
    contenders["floor: page cache + xxh3, 1 thread"] = ("floor", (str(files_json), "1"), {})
    contenders["floor: page cache + xxh3, 2 threads"] = ("floor", (str(files_json), "2"), {})
    contenders["floor, payloads read straight into place"] = ("floor", (str(files_json), "1", "payload"), {})

    names = list(contenders)
    for name in names:  # warm-up: page cache, bytecode caches
        _spawn(contenders[name][0], *contenders[name][1], env=contenders[name][2], cwd=scratch)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    kernel_samples: dict[str, list[dict[str, float]]] = {}
    kernels: dict[str, dict[str, str]] = {"current": {}}
    if before is not None:
        kernels["before"] = {"PYTHONPATH": str(before)}
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            mode, args, env = contenders[name]
            samples[name].append(_spawn(mode, *args, env=env, cwd=scratch))
        if kernel:
            for label, env in list(kernels.items())[:: 1 if index % 2 == 0 else -1]:
                kernel_samples.setdefault(label, []).append(_kernel_restore(store, work, env))
    codes = {name: samples[name][0].get("code") for name in names if samples[name][0].get("code")}
    summary = {name: statistics.median(s["seconds"] for s in samples[name]) for name in names}
    again = {name: statistics.median(s["again"] for s in samples[name]) for name in names}
    paired = {
        name: {
            other: statistics.median(a["seconds"] / b["seconds"] for a, b in zip(samples[name], samples[other]))
            for other in ("before", "dill.load_session")
            if other in samples and other != name
        }
        for name in names
    }
    groups = {
        name: {g: statistics.median(s["groups"][g] for s in samples[name]) for g in samples[name][0]["groups"]}
        for name in names
        if "groups" in samples[name][0]
    }
    kernel_summary = {
        label: {key: statistics.median(s[key] for s in runs) for key in ("restore", "first_access", "seconds")}
        for label, runs in kernel_samples.items()
    }
    floor_bytes = samples["floor: page cache + xxh3, 1 thread"][0]["bytes"]
    return {
        "rounds": rounds,
        "median_seconds": summary,
        "median_again_seconds": again,
        "paired_ratios": paired,
        "median_group_seconds": groups,
        "kernel_median_seconds": kernel_summary,
        "floor_bytes": floor_bytes,
        "code": codes,
        "notes": notes,
        "samples": samples,
        "kernel_samples": kernel_samples,
    }


def _report(result: dict[str, Any]) -> str:
    first, again = result["median_seconds"], result["median_again_seconds"]
    floor_name = "floor: page cache + xxh3, 1 thread"
    paired = result["paired_ratios"]
    lines = [
        f"state after cell {CELLS} ({result['floor_bytes'] / 1e6:.1f} MB of object files); medians of "
        f"{result['rounds']} rounds, one fresh process per contender and round",
        f"{'contender':<38}{'first load s':>13}{'vs floor':>9}{'again s':>9}{'vs floor':>9}"
        f"{'/ before':>10}{'/ dill':>8}",
    ]
    for name in first:
        ratios = paired.get(name, {})
        before = f"{ratios['before']:.2f}x" if "before" in ratios else ""
        dill = f"{ratios['dill.load_session']:.2f}x" if "dill.load_session" in ratios else ""
        lines.append(
            f"{name:<38}{first[name]:>13.3f}{first[name] / first[floor_name]:>8.2f}x{again[name]:>9.3f}"
            f"{again[name] / again[floor_name]:>8.2f}x{before:>10}{dill:>8}"
        )
    lines.append("(/ before, / dill: medians of the per-round ratios of first loads)")
    for name, groups in result["median_group_seconds"].items():
        biggest = sorted(groups.items(), key=lambda item: -item[1])[:2]
        lines.append(f"  {name}, first load: " + ", ".join(f"{g} {s * 1000:.0f} ms" for g, s in biggest))
    for label, figures in result["kernel_median_seconds"].items():
        lines.append(
            f"repeat kernel ({label}): %nbrewind restore {CELLS} {figures['restore']:.3f} s, "
            f"then the first access of every name {figures['first_access']:.3f} s"
        )
    for name, code in result["code"].items():
        lines.append(f"  {name}: {code}")
    lines.extend(result["notes"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2,4", help="NBREWIND_READ_THREADS values to measure (comma-separated)")
    parser.add_argument("--before", type=Path, help="a folder holding another nbrewind/ to compare with (PYTHONPATH)")
    parser.add_argument("--kernel", action="store_true", help="also time %%nbrewind restore in fresh repeat kernels")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nbrewind-bench-load-") as tmp:
        result = run(args.rounds, [int(t) for t in args.threads.split(",") if t], args.before, args.kernel, Path(tmp))
    print(_report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(_CHILDREN[sys.argv[2]](*sys.argv[3:])))
    else:
        main()
