"""The trust boundary on real kernels (issue 13, item 5): stores an attacker shaped
in every way the issue names are never loaded.

The attacker's payload is an object whose ``__reduce__`` writes a marker file:
unpickling it anywhere creates the marker. Each hostile case asserts the marker
does not exist, that the repeat kernel ran every cell (a cell printing the kernel's
pid shows a new pid, not the recorded one) and printed exactly one NBRewind line,
naming `jupyter nbrewind trust ...`. Each case's positive control (trusting the
same store) shows the payload does fire once the user trusts it, so the absence
of the marker means something.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from backpack_tools import entry, notebook_json, read_members, resign, write_members

from nbrewind.cli import main
from nbrewind.errors import PackError
from nbrewind.pack import pack, trust, unpack
from nbrewind.run import run_notebook
from nbrewind.store import ObjectStore, Store
from nbrewind.tasks.cache import REF_NAMESPACE, store_result

pytestmark = pytest.mark.kernel

PID_CELL = "import os\nprint('pid', os.getpid())"


def _evil_cell(marker: Path) -> str:
    payload = f"open({str(marker)!r}, 'w').write('unpickled')"
    # A library base class: instances of plain notebook classes are stored without their
    # hooks (checkpoint/own_state.py), so their __reduce__ would never reach the pickle.
    return f"class Evil(Exception):\n    def __reduce__(self):\n        return (exec, ({payload!r},))\ne = Evil()"


AUDITED_USE = "print('e is', type(e).__name__)"
EDITED_USE = "print('e is now', type(e).__name__)"  # an edit that needs `e` from the checkpoint


@dataclass
class Attacker:
    """A folder audited under another user's secret, and the backpack they packed of it."""

    folder: Path
    marker: Path
    pid: str
    backpack: Path

    @property
    def store(self) -> Path:
        return self.folder / "x.ipynb.nbrewind"


def _cells(marker: Path, use: str) -> list[str]:
    return [PID_CELL, _evil_cell(marker), use]


def _write_notebook(path: Path, cells: list[str]) -> None:
    path.write_text(notebook_json(*cells))


def _texts(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join("".join(o.get("text", "")) for o in cell["outputs"]) for cell in cells]


@pytest.fixture(scope="module")
def attacker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attacker]:
    base = tmp_path_factory.mktemp("attacker")
    marker = tmp_path_factory.mktemp("victim-marker") / "UNPICKLED"
    folder = base / "work"
    folder.mkdir()
    nb = folder / "x.ipynb"
    _write_notebook(nb, _cells(marker, AUDITED_USE))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NBREWIND_TRUST_DB", str(base / "attacker-home" / "trust.db"))
        run_notebook(nb, kernel="audit", output=base / "audited.ipynb")
        backpack = base / "x.backpack.tar.zst"
        pack(nb, backpack)  # trusted on the attacker's machine, not on ours
    texts = _texts(base / "audited.ipynb")
    assert texts[2] == "e is Evil\n"
    marker.unlink(missing_ok=True)  # only what the victim's kernels do counts
    yield Attacker(folder, marker, texts[0].split()[1], backpack)
    marker.unlink(missing_ok=True)


def _catalog_sha(store: Path) -> str:
    return hashlib.sha256((store / "catalog.sqlite").read_bytes()).hexdigest()


def _nbrewind_lines(err: str) -> list[str]:
    """NBRewind's lines on stderr, without the kernel log's ``[IPKernelApp] WARNING |`` prefix."""
    return [line[line.index("NBRewind") :] for line in err.splitlines() if "NBRewind" in line]


def _assert_refused_run(texts: list[str], err: str, attacker: Attacker, trust_target: Path, copies: int = 1) -> None:
    assert not attacker.marker.exists(), "the attacker's payload was unpickled"
    assert texts[0].startswith("pid ") and texts[0].split()[1] != attacker.pid  # ran, not replayed
    assert texts[2] == "e is now Evil\n"  # the cell ran on the namespace this kernel built
    lines = _nbrewind_lines(err)
    assert len(lines) == copies and len(set(lines)) == 1, lines  # one message for the whole kernel
    assert "not signed by you" in lines[0] and f"jupyter nbrewind trust {trust_target}" in lines[0]


def _victim_copy(attacker: Attacker, folder: Path, store_name: str = "x.ipynb.nbrewind") -> Path:
    folder.mkdir(parents=True)
    shutil.copytree(attacker.store, folder / store_name)  # what `cp -r` or `rsync` makes
    _write_notebook(folder / "x.ipynb", _cells(attacker.marker, EDITED_USE))
    return folder / "x.ipynb"


# -- a store another user signed, copied with cp -r ------------------------------------------


def test_a_copied_store_of_another_user_is_never_loaded(
    attacker: Attacker, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    nb = _victim_copy(attacker, tmp_path / "victim")
    store = nb.with_name("x.ipynb.nbrewind")
    before = _catalog_sha(store)
    capfd.readouterr()
    run_notebook(nb, kernel="repeat", output=tmp_path / "out.ipynb")
    _assert_refused_run(_texts(tmp_path / "out.ipynb"), capfd.readouterr().err, attacker, store)
    assert _catalog_sha(store) == before  # nothing read from it, nothing recorded in it

    # Positive control: once the user trusts it, the same store does load the payload.
    trust(store)
    run_notebook(nb, kernel="repeat", output=tmp_path / "trusted.ipynb")
    assert attacker.marker.exists()
    attacker.marker.unlink()
    assert _texts(tmp_path / "trusted.ipynb")[0] == f"pid {attacker.pid}\n"  # replayed


def test_the_audit_kernel_does_not_use_an_untrusted_store(
    attacker: Attacker, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = _victim_copy(attacker, tmp_path / "victim")
    monkeypatch.delenv("NBREWIND_STORE")  # `run` would take it before the notebook's own store
    store = nb.with_name("x.ipynb.nbrewind")
    before = _catalog_sha(store)
    capfd.readouterr()
    assert main(["run", str(nb), "--kernel", "audit", "-o", str(tmp_path / "out.ipynb")]) == 0
    # `jupyter nbrewind run` repeats the kernel's line on the terminal, after the run.
    _assert_refused_run(_texts(tmp_path / "out.ipynb"), capfd.readouterr().err, attacker, store, copies=2)
    assert _catalog_sha(store) == before  # it records nothing there either (no old record is ever read back)


# -- smuggled stores inside a backpack ---------------------------------------------------------------


def _smuggle(attacker: Attacker, out: Path, prefix: str, notebook: str | None) -> Path:
    """The attacker's backpack with their store also under ``prefix`` (and a notebook
    beside it), listed in a re-checksummed manifest: it verifies entry by entry."""
    members = read_members(attacker.backpack)
    manifest = json.loads(members[0][1])
    extra = [
        (f"{prefix}/{p.relative_to(attacker.store).as_posix()}", p.read_bytes())
        for p in sorted(attacker.store.rglob("*"))
        if p.is_file() and not p.name.startswith(("catalog.sqlite-", "."))
    ]
    if notebook:
        extra.append((f"data/{notebook}", (attacker.folder / "x.ipynb").read_bytes()))
    for name, data in extra:
        manifest["files"].append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest["files"].sort(key=lambda f: f["path"])
    members = [(members[0][0], resign(manifest)), *members[1:], *(entry(name, data) for name, data in extra)]
    write_members(out, members)
    return out


@pytest.mark.parametrize(
    ("prefix", "notebook"),
    [("data/y.ipynb.nbrewind", "y.ipynb"), ("data/.nbrewind", None), ("data/deep/z.nbrewind", None)],
    ids=["beside-a-notebook", "default-store", "nested"],
)
def test_unpack_refuses_a_smuggled_store(attacker: Attacker, tmp_path: Path, prefix: str, notebook: str | None) -> None:
    hostile = _smuggle(attacker, tmp_path / "hostile.tar.zst", prefix, notebook)
    with pytest.raises(PackError, match=f"carries a store besides its own \\({re.escape(prefix)}/"):
        unpack(hostile, tmp_path / "B")
    assert not (tmp_path / "B").exists() and sorted(os.listdir(tmp_path)) == ["hostile.tar.zst"]


def test_unpack_refuses_a_lone_store_marker_or_catalog(attacker: Attacker, tmp_path: Path) -> None:
    for name in ("data/notes/nbrewind-store.json", "data/catalog.sqlite", "workflow/lib/catalog.sqlite-wal"):
        members = read_members(attacker.backpack)
        manifest = json.loads(members[0][1])
        manifest["files"].append({"path": name, "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()})
        write_members(tmp_path / "h.tar.zst", [(members[0][0], resign(manifest)), *members[1:], entry(name, b"{}")])
        with pytest.raises(PackError, match="carries a store besides its own"):
            unpack(tmp_path / "h.tar.zst", tmp_path / "B")


def test_a_smuggled_default_store_laid_out_by_hand_is_never_loaded(
    attacker: Attacker, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``data/.nbrewind`` extracted with plain ``tar`` instead of ``unpack``: a kernel
    that cannot learn the notebook's path (nbclient, papermill) takes ``./.nbrewind``."""
    from nbclient import NotebookClient
    import nbformat

    nb = _victim_copy(attacker, tmp_path / "victim", store_name=".nbrewind")
    monkeypatch.delenv("NBREWIND_STORE")
    notebook = nbformat.read(nb, as_version=4)
    capfd.readouterr()
    NotebookClient(notebook, kernel_name="nbrewind-repeat", resources={"metadata": {"path": str(nb.parent)}}).execute()
    nbformat.write(notebook, tmp_path / "out.ipynb")
    _assert_refused_run(_texts(tmp_path / "out.ipynb"), capfd.readouterr().err, attacker, nb.parent / ".nbrewind")


# -- an unpacked backpack whose manifest was deleted -----------------------------------------------


def test_deleting_the_manifest_does_not_trust_a_backpack(
    attacker: Attacker, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = unpack(attacker.backpack, tmp_path / "B")
    assert not result.trusted
    store = Path(result.store)
    (store / "manifest.json").unlink()
    _write_notebook(Path(result.notebook), _cells(attacker.marker, EDITED_USE))
    capfd.readouterr()
    run_notebook(result.notebook, kernel="repeat", output=tmp_path / "out.ipynb")
    _assert_refused_run(_texts(tmp_path / "out.ipynb"), capfd.readouterr().err, attacker, store)


# -- our own store, edited or given a forged ref afterwards -----------------------------------------------

DASK_CELLS = [
    "import dask\nfrom dask import delayed",
    "def bump(v):\n    return v + 1",
    "r = delayed(bump)(41).compute(scheduler='sync')\nprint('r =', r)",
]


def _own_audit(folder: Path, cells: list[str]) -> Path:
    folder.mkdir()
    nb = folder / "own.ipynb"
    _write_notebook(nb, cells)
    run_notebook(nb, kernel="audit", output=folder / "audited.ipynb")
    return nb


def _repeat_decisions(store: Path) -> list[str]:
    with Store.open(store, create=False, readonly=True) as opened:
        return [r.decision or "" for r in opened.catalog.cell_runs() if r.kernel == "repeat"]


def test_our_own_audit_replays_and_an_edited_row_is_never_loaded(
    attacker: Attacker, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    nb = _own_audit(tmp_path / "own", [PID_CELL, "e = 41", "print('e is', e)"])
    store = nb.with_name("own.ipynb.nbrewind")
    capfd.readouterr()
    run_notebook(nb, kernel="repeat", output=tmp_path / "replayed.ipynb")
    assert _nbrewind_lines(capfd.readouterr().err) == []  # signed at every commit: trusted, silently
    assert _repeat_decisions(store) == ["replayed"] * 3
    recorded_pid = _texts(tmp_path / "replayed.ipynb")[0].split()[1]

    # The attacker plants their object and points our checkpoint of `e` at it.
    for path in (attacker.store / "objects").rglob("*"):
        target = store / path.relative_to(attacker.store)
        if path.is_file() and not target.exists():
            shutil.copy(path, target)
    with sqlite3.connect(attacker.store / "catalog.sqlite") as conn:
        digest, meta = conn.execute("SELECT digest, meta FROM checkpoint_entries WHERE name = 'e' LIMIT 1").fetchone()
    with sqlite3.connect(store / "catalog.sqlite") as conn:
        conn.execute("UPDATE checkpoint_entries SET digest = ?, meta = ? WHERE name = 'e'", (digest, meta))
    _write_notebook(nb, [PID_CELL, "e = 41", "print('e is now', e)"])
    capfd.readouterr()
    run_notebook(nb, kernel="repeat", output=tmp_path / "out.ipynb")
    texts = _texts(tmp_path / "out.ipynb")
    assert not attacker.marker.exists()
    assert texts[0] != f"pid {recorded_pid}\n" and texts[2] == "e is now 41\n"  # every cell ran
    lines = _nbrewind_lines(capfd.readouterr().err)
    assert len(lines) == 1 and f"jupyter nbrewind trust {store}" in lines[0] and "changed outside NBRewind" in lines[0]

    trust(store)  # positive control: the planted row does reach the payload once trusted
    run_notebook(nb, kernel="repeat", output=tmp_path / "trusted.ipynb")
    assert attacker.marker.exists()
    attacker.marker.unlink()


class Evil:
    """A task result whose unpickling writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


def test_a_forged_task_ref_is_a_miss(attacker: Attacker, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    nb = _own_audit(tmp_path / "own", DASK_CELLS)
    store = nb.with_name("own.ipynb.nbrewind")
    objects = ObjectStore(store)
    [(fingerprint, _)] = list(objects.iter_refs(REF_NAMESPACE))
    evil, _ = store_result(objects, Evil(attacker.marker), {"duration": 1.0})
    ref = objects.refs_dir / REF_NAMESPACE / fingerprint[:2] / fingerprint
    ref.write_text(f"{evil}\n")  # a ref as an attacker with a copy of our store would write it

    _write_notebook(nb, [*DASK_CELLS[:2], DASK_CELLS[2] + "\nprint('again')"])
    capfd.readouterr()
    run_notebook(nb, kernel="repeat", output=tmp_path / "out.ipynb")
    assert not attacker.marker.exists()
    assert _texts(tmp_path / "out.ipynb")[2] == "r = 42\nagain\n"  # the task ran again
    assert _nbrewind_lines(capfd.readouterr().err) == []  # the store itself is ours and trusted
    with Store.open(store, create=False, readonly=True) as opened:
        last = opened.catalog.task_log()[-1]
        assert not last.hit and last.fingerprint == fingerprint

    # Positive control: the same forged target behind a valid MAC is loaded.
    objects.ref_set(REF_NAMESPACE, fingerprint, evil)
    _write_notebook(nb, [*DASK_CELLS[:2], DASK_CELLS[2] + "\nprint('once more')"])
    run_notebook(nb, kernel="repeat", output=tmp_path / "trusted.ipynb")
    assert attacker.marker.exists()
    attacker.marker.unlink()
