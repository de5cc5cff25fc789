"""Stores on shared filesystems: detection, the catalog's journal, and two users at once.

Detection is tested on mountinfo texts of the filesystems a cluster has (no NFS,
Lustre or GPFS can be mounted here), and live on this machine's own mounts. Two
users writing one store concurrently run as two real processes, as two uids when
the tests run as root (privileges dropped after the imports, so the interpreter
need not be readable by them), in the group setup docs/hpc.md describes: a
setgid folder of their group and umask 002. They run on a local folder with the
rollback journal forced, and on the shared mount `.ci/install-nfs` makes (an NFS
export on loopback, or an sshfs mount where the kernel has no NFS client) when
it is there: NBREWIND_SHARED_FS names it; NBREWIND_REQUIRE_SHARED_FS=1 makes
its absence a failure instead of a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbrewind.errors import StoreError
from nbrewind.store import Catalog, CellRun, Store, verify_store
from nbrewind.store import catalog as catalog_module
from nbrewind.store.fstype import JOURNAL_ENV, choose_journal, filesystem_of, parse_mountinfo, rollback_marker
from nbrewind.store.secret import user_keys

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_MOUNT = os.environ.get("NBREWIND_SHARED_FS", "/mnt/nbrewind-shared")

MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
60 27 0:50 / /home rw,relatime shared:30 - nfs4 fs1:/export/home rw,vers=4.2,rsize=1048576,hard,proto=tcp,sec=sys,local_lock=none,addr=10.0.0.5
61 60 0:51 / /home/alice/My\040Project rw,relatime - ext4 /dev/vdb rw
62 27 0:52 / /scratch rw,relatime - lustre 10.0.0.9@tcp:/scratch rw,flock,lazystatfs
63 27 0:53 / /old-scratch rw,relatime - lustre 10.0.0.9@tcp:/old rw,localflock
64 27 0:54 / /gpfs/proj rw,relatime - gpfs proj rw
65 27 0:55 / /cephfs rw,relatime - ceph 10.0.0.7:6789:/ rw,name=admin
66 27 0:56 / /mnt/ssh rw,nosuid,nodev,relatime - fuse.sshfs me@host:/data rw,user_id=0,group_id=0
67 27 0:57 / /mnt/nolock rw,relatime - nfs 10.0.0.5:/data rw,vers=3,nolock,local_lock=all
68 27 0:58 / /data rw,relatime - ext4 /dev/vdc rw
69 27 0:59 / /data rw,relatime - nfs4 fs1:/data rw,vers=4.1
70 27 0:60 / /mnt/ntfs rw,relatime - fuseblk /dev/sdb1 rw,user_id=0
71 27 0:61 / /beegfs rw,relatime - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs/beegfs-client.conf
this line is not a mount
"""


# -- detection -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fstype", "network", "caveat"),
    [
        ("/home/alice/analysis.nbrewind", "nfs4", True, None),
        ("/home/alice/My Project/nb.ipynb.nbrewind", "ext4", False, None),  # a local mount under NFS, with a space
        ("/home", "nfs4", True, None),
        ("/homework/x", "ext4", False, None),  # a prefix of the name is not a parent folder
        ("/scratch/me/run.nbrewind", "lustre", True, None),
        ("/old-scratch/me", "lustre", True, "without the flock option"),
        ("/gpfs/proj/me", "gpfs", True, None),
        ("/cephfs/me", "ceph", True, None),
        ("/mnt/ssh/me", "fuse.sshfs", True, "sshfs does not forward locks"),
        ("/mnt/nolock/me", "nfs", True, "nolock or local_lock"),
        ("/data/me", "nfs4", True, None),  # the later of two mounts on one point hides the earlier
        ("/mnt/ntfs/me", "fuseblk", False, None),
        ("/beegfs/me", "beegfs", True, "tuneUseGlobalFileLocks"),
        ("/tmp/x", "ext4", False, None),
    ],
)
def test_the_filesystem_of_a_path_is_found_in_mountinfo(path: str, fstype: str, network: bool, caveat: str | None) -> None:
    fs = filesystem_of(path, mountinfo=MOUNTINFO)
    assert fs.fstype == fstype
    assert fs.network is network
    if caveat is None:
        assert fs.lock_caveat is None
    else:
        assert fs.lock_caveat is not None and caveat in fs.lock_caveat


def test_mountinfo_parsing_unescapes_and_merges_options() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 14  # the malformed line is skipped
    spaced = next(m for m in mounts if m.mount_point.endswith("Project"))
    assert spaced.mount_point == "/home/alice/My Project"
    home = next(m for m in mounts if m.mount_point == "/home")
    assert {"relatime", "vers=4.2", "local_lock=none"} <= home.options
    assert home.source == "fs1:/export/home"


def test_symlinks_are_resolved_before_the_mount_is_looked_up(tmp_path: Path) -> None:
    """A store reached through a symlink lives where the link points."""
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    text = f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {target} rw - nfs4 fs:/x rw\n"
    assert filesystem_of(tmp_path / "link" / "store.nbrewind" / "catalog.sqlite", mountinfo=text).fstype == "nfs4"
    assert filesystem_of(tmp_path / "other", mountinfo=text).fstype == "ext4"


def test_this_machines_own_mounts_are_read(tmp_path: Path) -> None:
    """Without a text, /proc/self/mountinfo is read: the root is a mount of some type."""
    fs = filesystem_of(tmp_path / "not-yet" / "catalog.sqlite")
    assert fs.mount_point and fs.fstype
    root = filesystem_of("/")
    assert root.mount_point == "/"


# -- the journal the catalog chooses ---------------------------------------------------------------


def test_a_network_filesystem_gets_a_rollback_journal_and_a_local_one_wal(tmp_path: Path) -> None:
    db = tmp_path / "catalog.sqlite"
    nfs = f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {tmp_path} rw - nfs4 fs:/x rw,vers=4.2\n"
    local = "1 0 0:1 / / rw - ext4 /dev/vda rw\n"
    on_nfs = choose_journal(db, environ={}, mountinfo=nfs)
    assert (on_nfs.mode, on_nfs.rollback) == ("truncate", True)
    assert "nfs4" in on_nfs.reason and on_nfs.notice() is None
    assert choose_journal(db, environ={}, mountinfo=local).mode == "wal"
    forced_wal = choose_journal(db, environ={JOURNAL_ENV: "wal"}, mountinfo=nfs)
    assert forced_wal.mode == "wal"
    notice = forced_wal.notice()
    assert notice is not None and "every kernel and command using this store runs on this machine" in notice
    assert choose_journal(db, environ={JOURNAL_ENV: "Rollback"}, mountinfo=local).mode == "truncate"
    assert choose_journal(db, environ={JOURNAL_ENV: "delete"}, mountinfo=local).mode == "delete"
    assert choose_journal(db, environ={JOURNAL_ENV: "auto"}, mountinfo=nfs).mode == "truncate"
    with pytest.raises(StoreError, match=f"{JOURNAL_ENV}='journal' is not a journal mode.*unset it"):
        choose_journal(db, environ={JOURNAL_ENV: "journal"}, mountinfo=local)
    lustre = f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {tmp_path} rw - lustre mgs:/fs rw,localflock\n"
    caveat = choose_journal(db, environ={}, mountinfo=lustre).notice()
    assert caveat is not None and "must not record into this store at the same time" in caveat


def _files(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_the_override_gives_a_local_catalog_a_rollback_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOURNAL_ENV, "rollback")
    with Store.open(tmp_path / "s") as store:
        assert store.catalog.journal_mode == "truncate"
        assert store.catalog.journal is not None and store.catalog.journal.reason == f"{JOURNAL_ENV}=rollback"
        store.catalog.add_cell_run(CellRun(session="s", code="x = 1"))
        names = _files(tmp_path / "s")
        # TRUNCATE keeps the journal file, empty between transactions; WAL's files never appear.
        assert "catalog.sqlite-journal" in names and "catalog.sqlite-wal" not in names
        assert (tmp_path / "s" / "catalog.sqlite-journal").stat().st_size == 0
    with sqlite3.connect(tmp_path / "s" / "catalog.sqlite") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # a plain connection: not WAL
        assert raw.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL is the default for rollback journals


def test_a_catalog_in_rollback_mode_is_not_switched_back_to_wal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that sees the folder as local (the machine that exports it over NFS) keeps the
    rollback journal the network clients use: switching to WAL would move them onto WAL too."""
    root = tmp_path / "s"
    monkeypatch.setenv(JOURNAL_ENV, "rollback")
    with Store.open(root) as store:
        store.catalog.add_cell_run(CellRun(session="remote", code="x = 1"))
    assert rollback_marker(root / "catalog.sqlite")
    monkeypatch.delenv(JOURNAL_ENV)
    with Store.open(root) as store:
        assert store.catalog.journal_mode == "truncate"
        assert store.catalog.journal is not None and "rollback journal" in store.catalog.journal.reason
        assert [r.session for r in store.catalog.cell_runs()] == ["remote"]
    # Without the kept journal file (a backpack's catalog is in DELETE mode), WAL as before.
    (root / "catalog.sqlite-journal").unlink()
    assert not rollback_marker(root / "catalog.sqlite")
    with Store.open(root) as store:
        assert store.catalog.journal_mode == "wal"
    # And WAL goes back to a rollback journal when it is the only connection.
    monkeypatch.setenv(JOURNAL_ENV, "rollback")
    with Store.open(root) as store:
        assert store.catalog.journal_mode == "truncate"
        assert [r.session for r in store.catalog.cell_runs()] == ["remote"]
    assert "catalog.sqlite-wal" not in _files(root)


def test_a_wal_catalog_another_process_holds_open_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving WAL needs the only connection; rather than use WAL on a network filesystem
    (or wait forever) the kernel names the problem and the two ways out."""
    root = tmp_path / "s"
    Store.open(root).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sqlite3, sys
            conn = sqlite3.connect(sys.argv[1])
            conn.execute("SELECT COUNT(*) FROM meta").fetchone()
            print("open", flush=True)
            sys.stdin.read()
        """), str(root / "catalog.sqlite")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        monkeypatch.setenv(JOURNAL_ENV, "rollback")
        monkeypatch.setattr(catalog_module, "_LEAVE_WAL_SECONDS", 0.3)
        started = time.monotonic()
        with pytest.raises(StoreError, match="in WAL mode.*another process has it open.*NBREWIND_CATALOG_JOURNAL=wal"):
            Catalog(root / "catalog.sqlite")
        assert time.monotonic() - started < 10
    finally:
        holder.communicate(timeout=30)  # closes its stdin: it exits
    with Catalog(root / "catalog.sqlite") as catalog:  # the other process is gone: it switches
        assert catalog.journal_mode == "truncate"


def test_the_catalog_file_follows_the_umask(tmp_path: Path) -> None:
    """SQLite creates databases 0644 whatever the umask; a group's store needs 0664 under umask 002."""
    old = os.umask(0o002)
    try:
        Store.open(tmp_path / "group").close()
    finally:
        os.umask(old)
    old = os.umask(0o022)
    try:
        Store.open(tmp_path / "private").close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "group" / "catalog.sqlite").stat().st_mode) == 0o664
    assert stat.S_IMODE((tmp_path / "private" / "catalog.sqlite").stat().st_mode) == 0o644


# -- two users, one store, at the same time ------------------------------------------------------

CHILD = """
import json, os, sys, time
args = json.loads(sys.argv[1])
from nbrewind.store import Store, CellRun, digest_bytes
from nbrewind.store.origin import store_trust
# Everything it will import, before dropping privileges: the interpreter may be unreadable to those uids.
import encodings.ascii, encodings.latin_1, nbrewind.store.signed_refs, nbrewind.store.trustdb  # noqa: F401,E401
if args["uid"] >= 0:
    os.setgroups([args["gid"]])
    os.setgid(args["gid"])
    os.setuid(args["uid"])
os.umask(0o002)
out = {"errors": [], "runs": [], "peer_seen": []}
if args["action"] == "write":
    deadline = time.monotonic() + 60
    while not os.path.exists(args["go"]) and time.monotonic() < deadline:
        time.sleep(0.005)
    me, peer = args["me"], args["peer"]
    with Store.open(args["root"]) as store:
        out["journal"] = store.catalog.journal_mode
        shared = store.objects.put(b"the same bytes from both users\\n" * 200)
        for i in range(args["n"]):
            try:
                own = store.objects.put(f"{me} wrote value {i}\\n".encode() * 40)
                with store.catalog.transaction():
                    run = store.catalog.add_cell_run(
                        CellRun(session=me, code=f"x = {i}", code_digest=digest_bytes(f"x = {i}".encode()), execution_count=i + 1)
                    )
                    cp = store.catalog.add_checkpoint(run, None, {"x": (own, None), "shared": (shared, None)})
                    store.catalog.set_cell_run_checkpoint(run, cp)
                store.objects.ref_set("tasks", f"{me}-{i:04d}", own)
                out["runs"].append([run, cp, own])
                out["peer_seen"].append(len(store.catalog.cell_runs(session=peer)))
            except Exception as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}")
        out["shared"] = shared
else:
    with Store.open(args["root"], readonly=True) as store:
        out["trusted"] = store_trust(args["root"]).trusted
        for who in (args["me"], args["peer"]):
            names = [n for n, _ in store.objects.iter_refs("tasks", trusted_only=True) if n.startswith(who + "-")]
            out[f"refs_{who}"] = len(names)
print(json.dumps(out))
"""


def _child(args: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )


def _finish(child: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = child.communicate(timeout=240)
    assert child.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


_GID, _UIDS = 61000, (61001, 61002)


def _as_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def group_folder() -> Iterator[Path]:
    """A folder of the two users' group, setgid, outside pytest's private (0700) temp tree."""
    folder = Path(tempfile.mkdtemp(prefix="nbrewind-group-"))
    try:
        if _as_root():
            os.chown(folder, 0, _GID)
        os.chmod(folder, 0o2775)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def network_folder() -> Iterator[Path]:
    """A fresh folder on the shared mount `.ci/install-nfs` makes (skipped when absent)."""
    mount = Path(SHARED_MOUNT)
    fs = filesystem_of(mount)
    if not (mount.is_dir() and fs.network and fs.mount_point == str(mount)):
        if os.environ.get("NBREWIND_REQUIRE_SHARED_FS") == "1":
            pytest.fail(f"no network filesystem mounted at {mount} (found {fs.fstype} at {fs.mount_point}); run .ci/install-nfs")
        pytest.skip(f"no network filesystem mounted at {mount}: run .ci/install-nfs")
    folder = Path(tempfile.mkdtemp(prefix="nbrewind-test-", dir=mount))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _user(base: Path, name: str, uid: int, gid: int, trust_db: Path | None) -> tuple[int, dict[str, str]]:
    """A home with this user's trust database (or the group's shared one) for ``uid``."""
    home = base / f"home-{name}"
    home.mkdir()
    if uid >= 0:
        os.chown(home, uid, gid)
    db = trust_db or home / "nbrewind" / "trust.db"
    return uid, {"HOME": str(home), "NBREWIND_TRUST_DB": str(db), JOURNAL_ENV: os.environ.get(JOURNAL_ENV, "")}


def _shared_secret(folder: Path, gid: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The group setup docs/hpc.md gives: one secret and trust database, readable and writable by the group."""
    trust = folder / "group-trust"
    trust.mkdir()
    os.chmod(trust, 0o2770)
    db = trust / "trust.db"
    monkeypatch.setenv("NBREWIND_TRUST_DB", str(db))
    user_keys()  # creates trust.secret, 0600
    db.touch()
    os.chmod(trust / "trust.secret", 0o640)
    os.chmod(db, 0o660)
    if gid >= 0:
        for path in (trust, trust / "trust.secret", db):
            os.chown(path, 0, gid)
    return db


def _run_two_users(base: Path, root: Path, users: list[tuple[int, dict[str, str]]], gid: int, n: int) -> list[dict[str, Any]]:
    go = base / "go"
    names = ("alice", "bob")
    children = [
        _child({"action": "write", "root": str(root), "me": me, "peer": peer, "n": n, "uid": uid, "gid": gid, "go": str(go)}, env)
        for (me, peer), (uid, env) in zip((names, names[::-1]), users)
    ]
    time.sleep(0.3)  # both interpreters are up and waiting: start them together
    go.touch()
    results = [_finish(c) for c in children]
    for result in results:
        assert result["errors"] == []
    return results


def _check_store(root: Path, results: list[dict[str, Any]], n: int) -> None:
    with Store.open(root, readonly=True) as store:
        runs = store.catalog.cell_runs()
        assert sorted(r.session or "" for r in runs) == ["alice"] * n + ["bob"] * n
        by_id = {r.id: r for r in runs}
        for name, result in zip(("alice", "bob"), results):
            assert len(result["runs"]) == n
            for run_id, checkpoint_id, digest in result["runs"]:
                assert by_id[run_id].session == name and by_id[run_id].checkpoint_id == checkpoint_id
                entries = store.catalog.checkpoint_entries(checkpoint_id)
                assert entries["x"][0] == digest and entries["shared"][0] == result["shared"]
            seen = result["peer_seen"]
            assert seen == sorted(seen) and seen[-1] <= n  # a reader never sees rows vanish
        report = verify_store(store)
        assert report.ok, report
        assert report.checked >= 2 * n + 1
    assert "catalog.sqlite-wal" not in _files(root) and "catalog.sqlite-shm" not in _files(root)


@pytest.mark.parametrize("secret", ["own secrets", "one group secret"])
def test_two_users_write_one_store_at_once_in_rollback_mode(
    group_folder: Path, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv(JOURNAL_ENV, "rollback")  # this folder is local: force what a network filesystem gets
    separate = _as_root()
    gid = _GID if separate else -1
    shared_db = _shared_secret(group_folder, gid, monkeypatch) if secret == "one group secret" else None
    uids = _UIDS if separate else (-1, -1)
    users = [_user(group_folder, name, uid, gid, shared_db) for name, uid in zip(("alice", "bob"), uids)]
    root = group_folder / "project.nbrewind"  # created by whichever user gets there first
    n = 25
    results = _run_two_users(group_folder, root, users, gid, n)
    assert [r["journal"] for r in results] == ["truncate", "truncate"]
    _check_store(root, results, n)

    if separate:  # the group setup: every folder is the group's and group-writable, and so is the catalog
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                info = os.lstat(os.path.join(folder, name))
                assert info.st_gid == _GID, (folder, name)
                if stat.S_ISDIR(info.st_mode):
                    assert info.st_mode & 0o2070 == 0o2070, (folder, name, oct(info.st_mode))
        for name in ("catalog.sqlite", "catalog.sqlite-journal"):
            assert (root / name).stat().st_mode & 0o060 == 0o060, name

    checks = [
        _finish(_child({"action": "check", "root": str(root), "me": me, "peer": peer, "uid": uid, "gid": gid}, env))
        for (me, peer), (uid, env) in zip((("alice", "bob"), ("bob", "alice")), users)
    ]
    if shared_db is None:
        # Each user's writes are signed with that user's secret: after both wrote, the store is
        # the other's too, so neither trusts it, and each sees only their own task refs.
        assert [c["trusted"] for c in checks] == [False, False]
        assert (checks[0]["refs_alice"], checks[0]["refs_bob"]) == (n, 0)
        assert (checks[1]["refs_bob"], checks[1]["refs_alice"]) == (n, 0)
    else:
        # One secret for the group: one signature, kept current by both, and every ref valid for both.
        assert [c["trusted"] for c in checks] == [True, True]
        assert all(c["refs_alice"] == n and c["refs_bob"] == n for c in checks)


def test_two_writers_on_the_shared_mount_detect_it_and_stay_consistent(
    network_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real network mount the journal is chosen by detection alone. (One uid: an sshfs mount
    shows every file as its login user's, so per-user permissions cannot be tested on it.)"""
    monkeypatch.delenv(JOURNAL_ENV, raising=False)
    users = [_user(network_folder, name, -1, -1, None) for name in ("alice", "bob")]
    root = network_folder / "project.nbrewind"
    n = 15
    results = _run_two_users(network_folder, root, users, -1, n)
    assert [r["journal"] for r in results] == ["truncate", "truncate"]
    _check_store(root, results, n)
    assert (root / "catalog.sqlite-journal").is_file()


def test_a_kernel_opening_a_store_on_the_shared_mount_is_told_its_limits(
    network_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's store opening passes the catalog's shared-filesystem notice on (sshfs keeps
    locks on one machine); on a local folder it says nothing of the kind."""
    from nbrewind.session.parts import open_store

    monkeypatch.delenv(JOURNAL_ENV, raising=False)
    said: list[str] = []
    open_store(network_folder / "kernel.nbrewind", said.append).close()
    assert any("must not record into this store at the same time" in s for s in said), said
    local: list[str] = []
    open_store(Path(tempfile.mkdtemp()) / "local.nbrewind", local.append).close()
    assert not any("machines" in s for s in local), local
