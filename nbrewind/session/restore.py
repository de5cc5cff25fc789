"""Binding recorded state into the namespace: replays, `%nbrewind restore`, lazy loads
and rebuilding values that could not be stored."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import hidden
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.values import load_group, load_json
from nbrewind.session import policy
from nbrewind.session.state import HIDDEN, MODULE, UNSERIALIZABLE, VALUE, Entry, LiveState

if TYPE_CHECKING:
    from nbrewind.session.commit import Committer
    from nbrewind.session.outside import Outside
    from nbrewind.session.writer import BackgroundWriter
    from nbrewind.store import Store


class RestoreMixin:
    """The Session's restoring half; it only reads and binds, it never records."""

    if TYPE_CHECKING:
        shell: Any
        session_id: str
        writer: BackgroundWriter
        _pending_rng: dict[str, Entry]
        _rng_left: dict[str, str]
        committer: Committer

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

    def _rebuild_pending_clients(self) -> None:
        """Before a cell runs, bring back the Dask clients replayed cells made.

        Creating a Client makes it the default scheduler; without it, a cell that
        calls `.compute()` would silently run on local threads instead of the cluster.
        """
        ns = self.namespace
        if not isinstance(ns, LazyNamespace):
            return
        for name, token in ns.pending().items():
            kind = token.extra.get("type", "") if isinstance(token, Entry) and token.kind == UNSERIALIZABLE else ""
            if kind.startswith("distributed.") and kind.endswith("Client") and ns.is_pending(name):
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
        """LazyNamespace loader: load the group behind `token` and return its pending members."""
        entry: Entry = token
        ns = self.namespace
        assert isinstance(ns, LazyNamespace)
        self.writer.flush()  # the value may have been staged by this kernel moments ago
        if entry.kind == UNSERIALIZABLE:
            values = self._rebuild(name, entry)
            for member, value in values.items():
                self.state.remember(member, value)
            return values
        try:
            values = self.state.load(entry)
        except Exception as exc:
            raise NameError(
                f"NBRewind could not load {name!r} from the store ({type(exc).__name__}: {exc}); "
                f"run `jupyter nbrewind verify`, then re-run the cell that defines {name!r}"
            ) from exc
        pending = ns.pending()
        out = {}
        for member, value in values.items():
            token_of = pending.get(member)
            if member == name or (isinstance(token_of, Entry) and token_of.digest == entry.digest):
                out[member] = value
                self.state.remember(member, value)
        return out

    def _rebuild(self, name: str, entry: Entry) -> dict[str, Any]:
        """Make an unstorable value again by re-running the cell that made it.

        The cell runs in a scratch namespace holding the state from just before
        it originally ran (loaded lazily, so only what it reads is loaded; values
        it reads that could not be stored are rebuilt the same way). `name` is
        taken from the scratch namespace, and so is every other pending value the
        same cell run made (a cluster and its client come back together, from
        one re-run).
        """
        self.writer.flush()
        record = load_json(self.state.objects, entry.digest)
        code, parent = record.get("code"), record.get("parent_entries")
        if not code:
            raise NameError(f"{name!r} could not be stored and no record says how it was made; re-run the cell that defines it")
        self.info(
            f"NBRewind: rebuilding {name!r} ({entry.extra.get('type')}, which cannot be stored) by re-running the cell "
            f"that made it; side effects of that cell happen again"
        )
        scratch = LazyNamespace()
        dict.update(scratch, {k: v for k, v in dict.items(self.namespace) if k in policy.MODULE_DUNDERS})
        entries = load_json(self.state.objects, parent)["entries"] if parent is not None else {}

        def load(member: str, token: Any) -> dict[str, Any]:
            item: Entry = token
            if item.kind == UNSERIALIZABLE:
                return {member: self._rebuild(member, item)[member]}
            values = self.state.load(item)
            return {k: v for k, v in values.items() if k == member or isinstance(scratch.pending().get(k), Entry)}

        scratch.set_loader(load)
        for member, (digest, meta) in entries.items():
            if not member.startswith("@"):
                scratch.set_pending(member, Entry.from_meta(digest, meta))
        # The re-run must leave the process as it found it: a fresh run of the notebook never
        # ran this cell a second time, so its draws from the global RNGs must not count.
        rng = hidden.capture_rng()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                exec(compile(code, f"<nbrewind rebuild of {name}>", "exec"), scratch)
        finally:
            hidden.restore_rng(rng)
        scratch.set_loader(None)
        if not dict.__contains__(scratch, name):
            raise NameError(f"re-running the cell that made {name!r} did not define it again")
        made = {name: dict.__getitem__(scratch, name)}
        ns = self.namespace
        if isinstance(ns, LazyNamespace):
            for other, token in ns.pending().items():
                if other in made or not dict.__contains__(scratch, other):
                    continue
                if isinstance(token, Entry) and token.kind == UNSERIALIZABLE:
                    twin = load_json(self.state.objects, token.digest)
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
