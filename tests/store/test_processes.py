"""Real processes against one store: a writer killed with SIGKILL, two writers at
once, and a real read-only bind mount."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nbrewind.store import CellRun, Store, gc, verify_store

REPO_ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


WRITER = """
    import sys
    import numpy as np
    from nbrewind.store import Store

    store = Store.open(sys.argv[1])
    big = memoryview(np.random.default_rng(0).bytes(40 * 1024 * 1024))
    print("ready", flush=True)
    i = 0
    while True:  # every put has new content, so every put writes
        piece = big[8 * i :]
        if i % 2:
            store.objects.put(piece)
        else:
            store.objects.put_blob(piece)
        i += 1
"""


@pytest.mark.parametrize("delay", [0.15, 0.4])
def test_sigkill_mid_put_leaves_no_visible_partial_object(tmp_path: Path, delay: float) -> None:
    root = tmp_path / "store"
    child = _python(WRITER, str(root))
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
        time.sleep(delay)
        assert child.poll() is None, "the writer stopped before it was killed"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert child.returncode == -signal.SIGKILL

    with Store.open(root) as store:
        visible = list(store.objects.iter_digests())
        assert visible, "the writer was killed before it stored anything"
        report = verify_store(store)
        assert report.checked == len(visible)
        assert report.corrupt == []
        # Leftover temporaries (if the kill landed mid-write) are invisible and gc clears them.
        leftovers = list(store.objects.iter_temp_files())
        cleaned = gc(store, dry_run=False, grace_seconds=0, temp_max_age=0)
        assert len(cleaned.temp_files) == len(leftovers)
        assert list(store.objects.iter_temp_files()) == []


TWIN = """
    import sys, time
    from pathlib import Path
    import numpy as np
    from nbrewind.store import CellRun, Store, TaskLogEntry

    root, tag, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    while not go.exists():
        time.sleep(0.005)
    rng = np.random.default_rng(int(tag[-1]))
    with Store.open(root) as store:  # both processes may create the store at once
        for i in range(15):
            shared = store.objects.put(b"shared %d" % i * 1000)
            own = store.objects.put(f"{tag} {i} ".encode() * 500)
            blob = store.objects.put_blob(rng.bytes(2 * 1024 * 1024 + 1000 * i))
            with store.catalog.transaction():
                run = store.catalog.add_cell_run(CellRun(session=tag, code=f"step {i}", outputs=own))
                cp = store.catalog.add_checkpoint(run, None, {"shared": (shared, {}), "blob": (blob, {})})
                store.catalog.set_cell_run_checkpoint(run, cp)
                store.catalog.log_tasks([TaskLogEntry(fingerprint=f"{tag}-{i}", result_digest=own)])
            store.objects.ref_set("tasks", f"{tag}-{i}", own)
    print("done", flush=True)
"""


def test_two_processes_share_a_store(tmp_path: Path) -> None:
    root, go = tmp_path / "store", tmp_path / "go"
    children = [_python(TWIN, str(root), tag, str(go)) for tag in ("p1", "p2")]
    time.sleep(0.3)  # let both reach the starting line (they import numpy first)
    go.touch()
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.strip() == "done"

    with Store.open(root) as store:
        for tag in ("p1", "p2"):
            runs = store.catalog.cell_runs(session=tag)
            assert [r.code for r in runs] == [f"step {i}" for i in range(15)]
            for run in runs:
                assert run.checkpoint_id is not None
                assert store.catalog.get_checkpoint(run.checkpoint_id).cell_run_id == run.id
                assert set(store.catalog.checkpoint_entries(run.checkpoint_id)) == {"shared", "blob"}
            assert len(list(store.objects.iter_refs("tasks"))) == 30
        assert len(store.catalog.task_log()) == 30
        report = verify_store(store)
        assert report.ok, report
        assert gc(store, dry_run=True, grace_seconds=0).removed == []


READONLY_PROBE = """
    import sys
    from pathlib import Path
    from nbrewind.errors import ReadOnlyStoreError
    from nbrewind.store import ObjectStore, Store

    root, digest = sys.argv[1], sys.argv[2]
    try:
        Store.open(root)
    except ReadOnlyStoreError:
        print("open-refused")
    with Store.open(root, readonly=True) as store:
        assert store.objects.get(digest) == b"on a read-only mount"
        print("runs", len(store.catalog.cell_runs()))
    try:
        ObjectStore(Path(root)).put(b"cannot land")  # writable object API, real EROFS
    except ReadOnlyStoreError:
        print("put-refused")
"""


def test_real_read_only_mount(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to make a private read-only bind mount")
    source, mount_point = tmp_path / "store", tmp_path / "ro"
    mount_point.mkdir()
    with Store.open(source) as store:
        digest = store.objects.put(b"on a read-only mount")
        store.catalog.add_cell_run(CellRun(code="x"))
    before = sorted(p.name for p in source.rglob("*"))
    # The mount lives in a private mount namespace and vanishes with the process.
    script = (
        f"mount --bind {source} {mount_point} && mount -o remount,bind,ro {mount_point} && "
        f'exec "$0" -c "$1" {mount_point} {digest}'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script, sys.executable,
         textwrap.dedent(READONLY_PROBE)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    if "mount:" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["open-refused", "runs", "1", "put-refused"]
    assert sorted(p.name for p in source.rglob("*")) == before

