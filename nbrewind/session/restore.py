"""Binding recorded state into the namespace: replays, `%nbrewind restore`, lazy loads
and rebuilding values that could not be stored."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import hidden
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.values import StagedGroup, load_group, load_json, stage_group
from nbrewind.session import policy, pseudo
from nbrewind.session.pseudo import Pseudo
from nbrewind.checkpoint.serialize import Unserializable, digest_value
from nbrewind.session.state import HIDDEN, MODULE, UNSERIALIZABLE, VALUE, Entry, LiveState, value_key

if TYPE_CHECKING:
    from nbrewind.session.commit import Committer
    from nbrewind.session.outside import Outside
    from nbrewind.session.writer import BackgroundWriter
    from nbrewind.store import Store


_MAX_REGENERATION_DEPTH = 50


class RestoreMixin:
    """The Session's restoring half; it only reads and binds, it never records."""

    if TYPE_CHECKING:
        shell: Any
        session_id: str
        writer: BackgroundWriter
        _pending_rng: dict[str, Entry]
        _rng_left: dict[str, str]
        committer: Committer
        unrecordable: list[str]

        @property
        def namespace(self) -> dict[str, Any]: ...
        @property
        def state(self) -> LiveState: ...
        @property
        def store(self) -> Store: ...
        def _user_names(self) -> set[str]: ...
        def _abs(self, rel: str) -> str: ...
        def notice(self, text: str) -> None: ...
        def info(self, text: str) -> None: ...
        @property
        def outside(self) -> Outside: ...

    def _rebuild_pending(self, reads: Iterable[str]) -> None:
        """Before a cell runs, bring back the unstorable values it reads and the Dask
        clients replayed cells made.

        Rebuilding re-runs the cell that made a value, side effects included (a logging
        handler installed, a client made the default scheduler): that must happen before
        this cell's first statement, as it did in a fresh run, not at first use. Without
        the clients, a cell that calls `.compute()` would silently run on local threads.
        """
        ns = self.namespace
        if not isinstance(ns, LazyNamespace):
            return
        wanted = set(reads)
        for name, token in ns.pending().items():
            if not isinstance(token, Entry) or token.kind != UNSERIALIZABLE:
                continue
            kind = token.extra.get("type", "")
            if (name in wanted or (kind.startswith("distributed.") and kind.endswith("Client"))) and ns.is_pending(name):
                ns.materialize(name)

    def _apply_pending_rng(self) -> None:
        for which, entry in list(self._pending_rng.items()):
            state = load_group(self.state.objects, entry.digest)["state"]
            hidden.restore_rng({which: state})
            del self._pending_rng[which]


    def _advance_history(self, code: str, count: int) -> None:
        shell = self.shell
        with contextlib.suppress(Exception):
            shell.history_manager.store_inputs(count, code, code)
        shell.execution_count = count + 1

    def _apply(self, entries: Mapping[str, Entry], writes: list[str], deletes: list[str]) -> None:
        """Make the namespace and hidden state what `entries` say for these names."""
        ns = self.namespace
        state = self.state
        for name in deletes:
            if dict.__contains__(ns, name) or (isinstance(ns, LazyNamespace) and ns.is_pending(name)):
                with contextlib.suppress(KeyError):
                    del ns[name]
            state.entries.pop(name, None)
            state.forget(name)
        eager: dict[str, list[str]] = {}
        for name in writes:
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
                elif entry.kind == UNSERIALIZABLE:
                    value = self._rebuild(name, entry)[name]
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
            self._pending_rng[entry.extra["rng"]] = entry
        elif what == "file":
            path = Path(self._abs(entry.extra["path"]))
            if path.is_dir():
                return  # never a file we recorded; leave directories alone
            if entry.extra.get("deleted"):
                path.unlink(missing_ok=True)
            elif hidden.file_digest(path) != entry.key:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".nbrewind-tmp")
                tmp.write_bytes(self.state.objects.get_blob(entry.digest))
                os.replace(tmp, path)
        elif what == "env":
            value = entry.extra.get("value")
            if value is None:
                os.environ.pop(entry.extra["var"], None)
            else:
                os.environ[entry.extra["var"]] = value
        elif what == "cwd":
            os.chdir(self._abs(entry.extra["path"]))
        else:
            self.outside.apply(entry)  # library settings and local modules' state

    def _load_pending(self, name: str, token: Any) -> dict[str, Any]:
        """LazyNamespace loader: load the group behind `token` and return its pending members.

        A value whose objects cannot be read (missing, corrupt, unloadable) is made again
        by re-running the cell run that wrote it. If that is impossible too, the name is
        dropped (KeyError): the user's cell sees NBRewind raise nothing.
        """
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame in tracebacks)
        entry: Entry = token
        ns = self.namespace
        assert isinstance(ns, LazyNamespace)
        self.writer.flush()  # the value may have been staged by this kernel moments ago
        try:
            if entry.kind == UNSERIALIZABLE:
                values = self._rebuild(name, entry)
            else:
                try:
                    values = self.state.load(entry)
                except Exception as exc:
                    values = self._regenerate(name, entry)
                    self.notice(
                        f"NBRewind: {name!r} could not be read from the store ({type(exc).__name__}: {exc}); "
                        "it was made again by re-running the cell that wrote it"
                    )
        except Exception as exc:
            # The cell sees what a plain kernel shows for a name nobody defined (a NameError
            # raised in its own frame, since a lookup's KeyError becomes one); why is logged.
            self.unrecordable.append(name)
            self.notice(
                f"NBRewind warning: {name!r} could not be brought back: its stored value cannot be read and "
                f"re-running the cell that made it failed ({type(exc).__name__}: {exc}). Re-run the cell that "
                "defines it; this cell is not recorded."
            )
            raise KeyError(name) from None
        if entry.kind == UNSERIALIZABLE:
            for member, value in values.items():
                self.state.remember(member, value)
            return values
        pending = ns.pending()
        out = {}
        for member, value in values.items():
            token_of = pending.get(member)
            if member == name or (isinstance(token_of, Entry) and token_of.digest == entry.digest):
                out[member] = value
                self.state.remember(member, value)
        return out

    def _producer(self, name: str, entry: Entry) -> tuple[str, dict[str, Any]] | None:
        """The code of the newest recorded cell run that wrote `entry` for `name`, and the
        checkpoint entries it started from."""
        catalog = self.store.catalog
        for run in reversed(catalog.cell_runs()):
            if run.checkpoint_id is None or run.status != "ok" or name not in (run.writes or ()):
                continue
            if catalog.checkpoint_entries(run.checkpoint_id).get(name, ("",))[0] != entry.digest:
                continue
            parent = catalog.get_checkpoint(run.checkpoint_id).parent_id
            return run.code, catalog.checkpoint_entries(parent) if parent is not None else {}
        return None

    def _regenerate(self, name: str, entry: Entry, depth: int = 0, into: dict[str, Any] | None = None) -> dict[str, Any]:
        """Make a stored value whose objects cannot be read again, by re-running the cell
        run that wrote it from the state it started from (whose unreadable values are
        made again the same way, and so on back).

        The value made again must have the recorded content (else LookupError: a stale
        value is worse than none). It is stored again, which repairs the store, and
        loaded back from there into `into` (the kernel's namespace by default), so its
        functions see that namespace as their globals, as restored values always do.
        """
        if depth > _MAX_REGENERATION_DEPTH:
            raise RecursionError(f"more than {_MAX_REGENERATION_DEPTH} earlier cells would have to run again")
        found = self._producer(name, entry)
        if found is None:
            raise LookupError(f"no recorded cell run wrote {name!r} as it is stored")
        code, parent_entries = found
        try:
            code = self.shell.transform_cell(code)
        except Exception:
            pass
        scratch = self._rerun(code, parent_entries, f"<nbrewind re-run to make {name} again>", depth + 1)
        members = entry.group or (name,)
        group = {m: dict.__getitem__(scratch, m) for m in members if dict.__contains__(scratch, m)}
        if name not in group:
            raise NameError(f"re-running the cell that made {name!r} did not define it again")
        value = digest_value(group[name])
        if isinstance(value, Unserializable) or value_key(value, members) != entry.key:
            # Something the cell read then (a file, a setting) is not what it is now: the
            # value made again is not the recorded one.
            raise LookupError(f"re-running the cell that wrote {name!r} gave a different value than the recorded one")
        staged = stage_group(self.state.objects, group)
        if not isinstance(staged, StagedGroup):
            raise LookupError(f"{name!r} made again cannot be stored ({staged.reason})")
        staged.commit(self.state.objects)
        target = self.namespace if into is None else into
        stored = Entry(staged.digest, VALUE, entry.key, entry.group, entry.extra)
        values = self.state.load(stored, namespace=target)
        if into is None and staged.digest != entry.digest:
            for member in group:  # pickles of equal values may differ: point at the new one
                old = self.state.entries.get(member)
                if old is not None and old.digest == entry.digest:
                    self.state.entries[member] = Entry(staged.digest, old.kind, old.key, old.group, old.extra)
        return values

    def _rerun(self, code: str, entries: Mapping[str, Any], label: str, depth: int = 0) -> LazyNamespace:
        """Run `code` in a scratch namespace holding `entries` (a checkpoint's name ->
        (digest, meta)), loaded lazily so only what it reads is loaded, with the global
        RNGs as that checkpoint had them; the process is left as it was found."""
        scratch = LazyNamespace()
        dict.update(scratch, {k: v for k, v in dict.items(self.namespace) if k in policy.MODULE_DUNDERS})

        def load(member: str, token: Any) -> dict[str, Any]:
            item: Entry = token
            if item.kind == UNSERIALIZABLE:
                return {member: self._rebuild(member, item)[member]}
            try:
                values = self.state.load(item, namespace=scratch)
            except Exception:
                values = self._regenerate(member, item, depth, into=scratch)
            return {k: v for k, v in values.items() if k == member or isinstance(scratch.pending().get(k), Entry)}

        scratch.set_loader(load)
        rng_states: dict[str, Any] = {}
        env: dict[str, str | None] = {}
        cwd: str | None = None
        for member, (digest, meta) in entries.items():
            parsed = pseudo.parse(member)
            if parsed is None:
                scratch.set_pending(member, Entry.from_meta(digest, meta))
            elif parsed[0] is Pseudo.RNG:
                rng_states[parsed[1]] = digest
            elif parsed[0] is Pseudo.ENV and "var" in meta:
                env[meta["var"]] = meta.get("value")
            elif parsed[0] is Pseudo.CWD and "path" in meta:
                cwd = meta["path"]
        # A fresh run of the notebook never ran this cell a second time: its draws from the
        # global RNGs must not count, and it draws what the original run drew; it sees the
        # environment variables and working directory the notebook had set by then.
        saved = hidden.capture_rng()
        saved_env = {var: os.environ.get(var) for var in env}
        saved_cwd = os.getcwd()
        try:
            hidden.restore_rng({which: load_group(self.state.objects, d)["state"] for which, d in rng_states.items()})
            _set_env(env)
            if cwd is not None:
                os.chdir(self._abs(cwd))
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                # The shell's own compiler flags (a cell's `from __future__ import ...` lasts),
                # never this module's: inherited, they would change what the code compiles to.
                flags = getattr(getattr(self.shell, "compile", None), "flags", 0)
                exec(compile(code, label, "exec", flags=flags, dont_inherit=True), scratch)
        finally:
            os.chdir(saved_cwd)
            _set_env(saved_env)
            hidden.restore_rng(saved)
            scratch.set_loader(None)
        return scratch

    def _rebuild(self, name: str, entry: Entry) -> dict[str, Any]:
        """Make an unstorable value again by re-running the cell that made it.

        The cell runs in a scratch namespace holding the state from just before
        it originally ran (see `_rerun`). `name` is taken from the scratch
        namespace, and so is every other pending value the same cell run made
        (a cluster and its client come back together, from one re-run).
        """
        self.writer.flush()
        parent: str | None = None
        try:
            record = load_json(self.state.objects, entry.digest)
            code, parent = record.get("code"), record.get("parent_entries")
            entries = load_json(self.state.objects, parent)["entries"] if parent is not None else {}
        except Exception:
            # The record (or the state it names) cannot be read: the catalog holds the same
            # two things, the cell run's code and the checkpoint it started from.
            found = self._producer(name, entry)
            if found is None:
                raise
            code, entries = found
            try:
                code = self.shell.transform_cell(code)
            except Exception:
                pass
        if not code:
            raise NameError(f"{name!r} could not be stored and no record says how it was made; re-run the cell that defines it")
        self.info(
            f"NBRewind: rebuilding {name!r} ({entry.extra.get('type')}, which cannot be stored) by re-running the cell "
            f"that made it; side effects of that cell happen again"
        )
        scratch = self._rerun(code, entries, f"<nbrewind rebuild of {name}>")
        if not dict.__contains__(scratch, name):
            raise NameError(f"re-running the cell that made {name!r} did not define it again")
        made = {name: dict.__getitem__(scratch, name)}
        ns = self.namespace
        if isinstance(ns, LazyNamespace):
            for other, token in ns.pending().items():
                if other in made or not dict.__contains__(scratch, other):
                    continue
                if isinstance(token, Entry) and token.kind == UNSERIALIZABLE and parent is not None:
                    try:
                        twin = load_json(self.state.objects, token.digest)
                    except Exception:
                        continue  # its own rebuild will find its way
                    if twin.get("code") == code and twin.get("parent_entries") == parent:
                        made[other] = dict.__getitem__(scratch, other)
        return made

    def restore(self, target: str) -> str:
        """Make the namespace what it was after a recorded cell run (by execution count or cell id)."""
        self.writer.flush()
        runs = self.store.catalog.cell_runs()
        if target.isdigit():
            number = int(target)
            mine = [r for r in runs if r.session == self.session_id and r.execution_count == number]
            matches = mine or [r for r in runs if r.execution_count == number]
        else:
            matches = [r for r in runs if r.cell_id == target]
        chosen = matches[-1] if matches else None
        if chosen is None or chosen.checkpoint_id is None:
            return f"no recorded cell run for {target!r}; see `jupyter nbrewind log`"
        entries = {k: Entry.from_meta(d, m) for k, (d, m) in self.store.catalog.checkpoint_entries(chosen.checkpoint_id).items()}
        current = self._user_names()
        gone = [n for n in current if n not in entries]
        self._apply(entries, [n for n in entries if entries[n].kind != UNSERIALIZABLE], gone)
        self.committer.rebase(chosen.checkpoint_id)
        self._rng_left = {}  # the restored state is the one to key on, not the last cell's
        missing = sorted(n for n, e in entries.items() if e.kind == UNSERIALIZABLE)
        note = f"; not restorable: {', '.join(missing)}" if missing else ""
        return f"restored the state after cell run #{chosen.id} (In [{chosen.execution_count}]): {len(entries)} names{note}"

    def complete_pending(self, code: str, cursor_pos: int | None, reply: dict[str, Any]) -> dict[str, Any]:
        """Add pending (replayed, not yet loaded) names to a completion reply."""
        ns = self.namespace
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


def _set_env(values: Mapping[str, str | None]) -> None:
    for var, value in values.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
