"""Binding recorded state into the namespace: for replays, `%nbrewind restore` and lazy
loads (values that must be made again are the `Rebuilder`'s, rebuild.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import hidden, randomness
from nbrewind.checkpoint.functions import name_cells_later, note_cell_file
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.values import load_group
from nbrewind.session.keys import user_names
from nbrewind.session.outside import SYS_PATH_INPUT
from nbrewind.session.results import OutputHistory
from nbrewind.session.state import HIDDEN, MODULE, UNSERIALIZABLE, VALUE, Entry, finalizes_on_drop

if TYPE_CHECKING:
    from nbrewind.analysis import CellEffects
    from nbrewind.session.commit import Committer
    from nbrewind.session.notices import Notices
    from nbrewind.session.outside import Outside
    from nbrewind.session.plan import Paths, RngLedger
    from nbrewind.session.history import Deferred
    from nbrewind.session.rebuild import Rebuilder
    from nbrewind.session.state import LiveState
    from nbrewind.session.writer import BackgroundWriter
    from nbrewind.store.catalog import Catalog

__all__ = ["BroughtBack", "Restorer", "complete_pending"]


@dataclass
class BroughtBack:
    """Values a cell found pending (replays bind names lazily) and had to load, or to
    rebuild by re-running the cell that made them: what a fresh run had in memory."""

    seconds: float = 0.0
    loaded: list[str] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)


class Restorer:
    """Binds recorded state into the kernel; it only reads and binds, it never records.

    A value it cannot read, or one that could not be stored, is made again by the
    `Rebuilder`, which re-runs the cell that made it.
    """

    def __init__(
        self,
        shell: Any,
        *,
        session_id: str,
        state: LiveState,
        catalog: Catalog,
        outside: Outside,
        writer: BackgroundWriter,
        committer: Committer,
        rng: RngLedger,
        paths: Paths,
        notices: Notices,
        rebuilder: Rebuilder,
        unrecordable: list[str],
    ) -> None:
        self._shell = shell
        self._session_id = session_id
        self._state = state
        self._catalog = catalog
        self._outside = outside
        self._writer = writer
        self._committer = committer
        self._rng = rng
        self._paths = paths
        self._notices = notices
        self._rebuilder = rebuilder
        self._unrecordable = unrecordable
        """Why the current cell must not be recorded: the session's list, cleared per request."""
        # Recorded cells that run again must find the temp files replayed cells left, too.
        rebuilder.before_run = self.apply_pending_files
        self._depth = 0
        self._brought_back = BroughtBack()
        self.output_history = OutputHistory(shell, state, notices)
        """Results of replayed cells, for `_`, `Out[N]` (filled before a cell that reads them runs)."""
        self._unnamed_cells: list[tuple[str, int, str]] = []
        """Replayed cells not in the kernel's cache of cell sources yet: (transformed, count, raw)."""

    def take_brought_back(self) -> BroughtBack:
        """What bringing back pending values cost since the last call (then start again)."""
        taken, self._brought_back = self._brought_back, BroughtBack()
        return taken

    def rebuild_pending(self, reads: Iterable[str], *, clients: bool = True) -> None:
        """Before a cell runs, bring back the unstorable values it reads and (unless
        `clients` is False: the cell cannot reach Dask, see `clients.may_need_client`)
        the Dask clients replayed cells made.

        Rebuilding re-runs the cell that made a value, side effects included (a logging
        handler installed, a client made the default scheduler): that must happen before
        this cell's first statement, as it did in a fresh run, not at first use. Without
        the clients, a cell that calls `.compute()` would silently run on local threads.
        """
        ns = self._shell.user_ns
        if not isinstance(ns, LazyNamespace):
            return
        wanted = set(reads)
        for name, token in ns.pending().items():
            if not isinstance(token, Entry) or token.kind != UNSERIALIZABLE:
                continue
            kind = token.extra.get("type", "")
            if (name in wanted or (clients and kind.startswith("distributed.") and kind.endswith("Client"))) and ns.is_pending(name):
                ns.materialize(name)

    def load_before_dropping(self, effects: CellEffects) -> None:
        """Load the pending values this cell may rebind or delete whose death runs a finalizer
        the notebook can see (`state.FINALIZES`): dropping one must run it, as in a plain
        kernel. A `del` the analysis cannot see (in `exec`) is handled where it happens
        (`LazyNamespace.__delitem__`); a dynamic cell may rebind any name."""
        ns = self._shell.user_ns
        if not isinstance(ns, LazyNamespace):
            return
        pending = ns.pending()
        names = pending if effects.dynamic or effects.deferred_dynamic else effects.writes | effects.deletes | effects.deferred_writes
        for name in [n for n in names if n in pending and finalizes_on_drop(pending[n])]:
            with contextlib.suppress(KeyError):  # one that cannot be loaded is not defined
                self.load_to_drop(name, pending[name])

    def load_to_drop(self, name: str, token: Any) -> None:
        """Load `name` (pending under `token`, or already loaded with another) for a cell about
        to drop it, and hold it nowhere but in the namespace, so that the drop runs its finalizer
        as in a plain kernel: the resources made again hold it weakly (`Rebuilder.hold_weakly`),
        the last checkpointed object is not held (`LiveState.release`)."""
        ns = self._shell.user_ns
        assert isinstance(ns, LazyNamespace)
        if ns.is_pending(name):
            ns.materialize(name)
        if isinstance(token, Entry) and token.kind == UNSERIALIZABLE:
            self._rebuilder.hold_weakly(token.digest)
        self._state.release(name)

    def bring_back(self, names: Iterable[str]) -> None:
        """Load the pending values among `names` now (globals a library will call code with)."""
        ns = self._shell.user_ns
        if isinstance(ns, LazyNamespace):
            for name in names:
                if ns.is_pending(name):
                    ns.materialize(name)

    def defer(self, step: Deferred) -> None:
        """A replayed cell made or used a pending resource: see `Rebuilder.defer`."""
        self._rebuilder.defer(step)

    def apply_pending(self) -> None:
        """Just before a cell runs: put in place the RNG states and temp files that replayed
        cells left pending (`RngLedger`), as a fresh run would have them by now."""
        self.apply_pending_rng()
        self.apply_pending_files()

    def apply_pending_rng(self) -> None:
        for which, entry in list(self._rng.pending.items()):
            state = load_group(self._state.objects, entry.digest)["state"]
            randomness.restore_rng({which: state})
            del self._rng.pending[which]

    def apply_pending_files(self) -> None:
        """Write (or remove) the temp files replayed cells left pending: before a cell runs,
        and before the `Rebuilder` re-runs recorded cells. One that cannot be written is
        reported, and the cell runs without it."""
        files = self._rng.files
        while files:
            path = next(iter(files))
            entry = files.pop(path)
            try:
                self._write_file(Path(path), entry)
            except Exception as exc:
                self._notices.notice(
                    f"NBRewind warning: {path}, which a replayed cell left in the temp folder, could not be "
                    f"written back ({type(exc).__name__}: {exc}); a cell that reads it may not do what a fresh run does"
                )

    def advance_history(self, code: str, count: int, transformed: str | None = None) -> None:
        """A replayed cell is in the kernel's history, and in its cache of cell sources as a run
        cell is (functions it defined show its lines in tracebacks: `note_cell_file`)."""
        shell = self._shell
        with contextlib.suppress(Exception):
            shell.history_manager.store_inputs(count, code, code)
        self._unnamed_cells.append((transformed if transformed is not None else code, count, code))
        name_cells_later(self._name_cells)
        shell.execution_count = count + 1

    def _name_cells(self) -> None:
        """Put the replayed cells in the kernel's cache of cell sources (`advance_history`)."""
        while self._unnamed_cells:
            transformed, count, code = self._unnamed_cells.pop(0)
            with contextlib.suppress(Exception):
                note_cell_file(self._shell.compile.cache(transformed, count, raw_code=code))

    def apply(self, entries: Mapping[str, Entry], writes: list[str], deletes: list[str]) -> None:
        """Make the namespace and hidden state what `entries` say for these names."""
        ns = self._shell.user_ns
        state = self._state
        for name in deletes:
            if isinstance(ns, LazyNamespace):
                if dict.__contains__(ns, name) or ns.is_pending(name):
                    ns.drop(name)  # what the drop did is in the replayed record: nothing to bring back
            elif name in ns:
                del ns[name]
            state.entries.pop(name, None)
            state.forget(name)
        eager: dict[str, list[str]] = {}
        # sys.path first: a local module the same cell imported is found where it put it.
        for name in sorted(writes, key=lambda n: n != SYS_PATH_INPUT):
            entry = entries.get(name)
            if entry is None:
                continue
            state.entries[name] = entry
            if entry.kind == HIDDEN:
                self._apply_hidden(entry)
            elif entry.kind == MODULE and (not isinstance(ns, LazyNamespace) or entry.extra.get("local")):
                # A local module is imported now: its data state is restored into it and
                # is an input of later cells, which must see it loaded as a fresh run does.
                ns[name] = state.load(entry)[name]
                state.remember(name, ns[name])
            elif entry.kind in (VALUE, MODULE, UNSERIALIZABLE):
                if isinstance(ns, LazyNamespace):
                    ns.set_pending(name, entry)
                    state.forget(name)
                    if entry.kind == UNSERIALIZABLE:
                        self._rebuilder.forget_made(entry.digest)  # bound again: a new one is made
                elif entry.kind == UNSERIALIZABLE:
                    value = self._rebuilder.rebuild(name, entry)[name]
                    ns[name] = value
                    state.remember(name, value)
                else:
                    eager.setdefault(entry.digest, []).append(name)
        for digest, names in eager.items():
            values = state.load(entries[names[0]])
            for name in names:
                ns[name] = values[name]
                state.remember(name, values[name])

    def _apply_hidden(self, entry: Entry) -> None:
        what = entry.extra.get("what")
        if what == "rng":
            # Applied just before the next cell runs: replayed cells draw nothing,
            # and restoring numpy's state would import numpy now.
            self._rng.pending[entry.extra["rng"]] = entry
        elif what == "file":
            path = self._paths.abs(entry.extra["path"])
            if hidden.in_temp_folder(path, self._paths.start_dir):
                # Written when user code runs again (`apply_pending_files`): perhaps no cell
                # ever reads it. Its objects must be there now, while this cell can still run
                # instead of replaying.
                if not entry.extra.get("deleted") and not entry.extra.get("dir"):
                    self._check_blob(entry.digest)
                self._rng.files[path] = entry
            else:
                self._write_file(Path(path), entry)
        elif what == "env":
            value = entry.extra.get("value")
            if value is None:
                os.environ.pop(entry.extra["var"], None)
            else:
                os.environ[entry.extra["var"]] = value
        elif what == "cwd":
            os.chdir(self._paths.abs(entry.extra["path"]))
        else:
            self._outside.apply(entry)  # library settings and local modules' state

    def _write_file(self, path: Path, entry: Entry) -> None:
        """Make the file at `path` what a `@file:` entry says: its content, or gone (a
        directory the cell removed goes with everything under it, as the cell's removal took it)."""
        if entry.extra.get("dir") and not entry.extra.get("deleted"):
            path.mkdir(parents=True, exist_ok=True)  # a folder the cell made
            return
        if path.is_dir() and not path.is_symlink():
            if entry.extra.get("deleted") and entry.extra.get("dir"):
                shutil.rmtree(path)
            return  # otherwise never a file we recorded; leave directories alone
        if entry.extra.get("deleted"):
            path.unlink(missing_ok=True)
        elif hidden.file_digest(path) != entry.key:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".nbrewind-tmp")
            tmp.write_bytes(self._state.objects.get_blob(entry.digest))
            os.replace(tmp, path)

    def check_files(self, entries: Mapping[str, Entry], writes: Iterable[str]) -> None:
        """Read and verify, before anything is applied, the stored content of every file a
        replay of these writes will put back (one whose content on disk differs, or one left
        pending in the temp folder): a damaged one raises here, while the cell can still run
        instead on the state it found, not after the replay removed or moved half of its files."""
        objects = self._state.objects
        for name in writes:
            entry = entries.get(name)
            if entry is None or entry.kind != HIDDEN or entry.extra.get("what") != "file":
                continue
            if entry.extra.get("deleted") or entry.extra.get("dir"):
                continue
            if hidden.file_digest(self._paths.abs(entry.extra["path"])) == entry.key:
                continue  # already there: nothing to write
            children, _ = objects.get_tree(entry.digest)
            for child in children:
                objects.verify(child)

    def _check_blob(self, digest: str) -> None:
        """Raise LookupError unless the stored blob `digest` and its chunks are there and
        look sound (a chunk's header and length; small ones are re-hashed), without reading it."""
        objects = self._state.objects
        children, _ = objects.get_tree(digest)
        if not all(objects.has_sound(child) for child in children):
            raise LookupError(f"the stored content of a file ({digest}) is damaged or missing")

    def load_pending(self, name: str, token: Any) -> dict[str, Any]:
        """LazyNamespace loader: load the group behind `token` and return its pending members.

        A value whose objects cannot be read (missing, corrupt, unloadable) is made again
        by re-running the cell run that wrote it. If that is impossible too, the name is
        dropped (KeyError): the user's cell sees NBRewind raise nothing.
        """
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame in tracebacks)
        entry: Entry = token
        self._depth += 1
        started = time.perf_counter()
        try:
            return self._load_pending(name, entry)
        finally:
            self._depth -= 1
            if self._depth == 0:  # a value made again may load others: count the outermost load once
                self._brought_back.seconds += time.perf_counter() - started
                (self._brought_back.rebuilt if entry.kind == UNSERIALIZABLE else self._brought_back.loaded).append(name)

    def _load_pending(self, name: str, entry: Entry) -> dict[str, Any]:
        __tracebackhide__ = True  # noqa: F841
        ns = self._shell.user_ns
        assert isinstance(ns, LazyNamespace)
        self._writer.flush()  # the value may have been staged by this kernel moments ago, and the replays before
        try:
            if entry.kind == UNSERIALIZABLE:
                values = self._rebuilder.rebuild(name, entry)
            else:
                try:
                    values = self._state.load(entry)
                except Exception as exc:
                    values = self._rebuilder.regenerate(name, entry)
                    self._notices.notice(
                        f"NBRewind: {name!r} could not be read from the store ({type(exc).__name__}: {exc}); "
                        "it was made again by re-running the cell that wrote it"
                    )
        except Exception as exc:
            # The cell sees what a plain kernel shows for a name nobody defined (a NameError
            # raised in its own frame, since a lookup's KeyError becomes one); why is logged.
            self._unrecordable.append(name)
            self._notices.notice(
                f"NBRewind warning: {name!r} could not be brought back: its stored value cannot be read and "
                f"re-running the cell that made it failed ({type(exc).__name__}: {exc}). Re-run the cell that "
                "defines it; this cell is not recorded."
            )
            raise KeyError(name) from None
        if entry.kind == UNSERIALIZABLE:
            for member, value in values.items():
                self._state.remember(member, value)
            return values
        pending = ns.pending()
        out = {}
        for member, value in values.items():
            token_of = pending.get(member)
            if member == name or (isinstance(token_of, Entry) and token_of.digest == entry.digest):
                out[member] = value
                self._state.remember(member, value)
            elif member not in pending:
                out[member] = value  # dropped since its replay: the namespace leaves it unbound
        return out

    def restore(self, target: str) -> str:
        """Make the namespace what it was after a recorded cell run (by execution count or cell id)."""
        self._writer.flush()
        runs = self._catalog.cell_runs()
        if target.startswith("#") and target[1:].isdigit():
            matches = [r for r in runs if r.id == int(target[1:])]
        elif target.isdigit():
            number = int(target)
            mine = [r for r in runs if r.session == self._session_id and r.execution_count == number]
            matches = mine or [r for r in runs if r.execution_count == number]
        else:
            matches = [r for r in runs if r.cell_id == target]
        chosen = matches[-1] if matches else None
        if chosen is None or chosen.checkpoint_id is None:
            return f"no recorded cell run for {target!r}; see `jupyter nbrewind log`"
        entries = {k: Entry.from_meta(d, m) for k, (d, m) in self._catalog.checkpoint_entries(chosen.checkpoint_id).items()}
        current = user_names(self._shell)
        gone = [n for n in current if n not in entries]
        self.apply(entries, [n for n in entries if entries[n].kind != UNSERIALIZABLE], gone)
        self._committer.rebase(chosen.checkpoint_id)
        self._rng.left = {}  # the restored state is the one to key on, not the last cell's
        missing = sorted(n for n, e in entries.items() if e.kind == UNSERIALIZABLE)
        note = f"; not restorable: {', '.join(missing)}" if missing else ""
        return f"restored the state after cell run #{chosen.id} (In [{chosen.execution_count}]): {len(entries)} names{note}"


def complete_pending(ns: dict[str, Any], code: str, cursor_pos: int | None, reply: dict[str, Any]) -> dict[str, Any]:
    """Add pending (replayed, not yet loaded) names to a completion reply."""
    if not isinstance(ns, LazyNamespace) or reply.get("status") != "ok":
        return reply
    pos = len(code) if cursor_pos is None else cursor_pos
    start = pos
    while start > 0 and (code[start - 1].isalnum() or code[start - 1] == "_"):
        start -= 1
    prefix = code[start:pos]
    if not prefix or reply.get("cursor_start", start) != start:
        return reply
    extra = [n for n in ns.pending() if n.startswith(prefix) and n not in reply.get("matches", [])]
    if extra:
        reply = dict(reply)
        reply["matches"] = sorted(set(reply.get("matches", [])) | set(extra))
    return reply
