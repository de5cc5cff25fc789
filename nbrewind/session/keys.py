"""The cell key before a cell runs: what the cell may read, and the key of every input now.

A key is conservative: a name the cell might read is an input, and anything that cannot
be digested makes the key one no record matches. On repeat the same keys answer
`find_match` (matching.py): is there a recorded run whose every input is as it is now?
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbrewind.analysis import DYNAMIC_NAMES, CellEffects, RecordedReads, analyze_cell, transitive_reads
from nbrewind.checkpoint import hidden, randomness
from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.serialize import Unserializable
from nbrewind.session import outside, policy, pseudo
from nbrewind.session.matching import Match, find_match
from nbrewind.session.plan import CellPlan, FunctionView, Paths, RngLedger, env_key
from nbrewind.session.pseudo import ABSENT, Pseudo
from nbrewind.session.state import UNSERIALIZABLE
from nbrewind.store.digest import digest_bytes

_LINE_MAGIC = re.compile(r"run_line_magic\('([\w.]+)'")

if TYPE_CHECKING:
    from nbrewind.session.state import LiveState
    from nbrewind.store.catalog import Catalog

__all__ = ["Keys", "user_names"]

# Pseudo-inputs that observe the filesystem without reading a file's content.
_WORLD = frozenset({Pseudo.LISTING, Pseudo.STAT, Pseudo.KIND})


def user_names(shell: Any) -> set[str]:
    """The names the user's cells made (not IPython's own)."""
    ns = shell.user_ns
    hidden_ns = getattr(shell, "user_ns_hidden", {})
    return {n for n in ns.keys() if policy.is_user_name(n, dict.get(ns, n), hidden_ns)}


class Keys:
    """Plans a request: analyses the cell, lists what it reads, keys every input, and on
    repeat looks for a recorded run to replay."""

    def __init__(
        self,
        shell: Any,
        *,
        mode: str,
        state: LiveState,
        outside: outside.Outside,
        rng: RngLedger,
        paths: Paths,
        catalog: Catalog,
    ) -> None:
        self._shell = shell
        self._mode = mode
        self._state = state
        self._outside = outside
        self._rng = rng
        self._paths = paths
        self._catalog = catalog

    def analyse(
        self, code: str, cell_id: str | None, msg_id: str | None, view: RecordedReads | None = None,
        foreseen: Callable[[str], bool] | None = None,
    ) -> CellPlan:
        """The request's code, effects and reads, before any input is keyed. `view` is the
        namespace as `transitive_reads` sees it (the kernel's now, unless a forecast says
        otherwise); `foreseen` tells the names a forecast expects bound when the cell runs."""
        ns = self._shell.user_ns
        try:
            with ns.peeking() if isinstance(ns, LazyNamespace) else contextlib.nullcontext():
                transformed = self._shell.transform_cell(code)
                if foreseen is not None and "run_line_magic(" in transformed:
                    transformed = self._unshadowed(code, transformed, foreseen)
        except Exception:
            transformed = code
        effects = analyze_cell(transformed, allowed_magics=policy.ALLOWED_MAGICS, code_magics=policy.CODE_MAGICS)
        plan = CellPlan(
            record=True,
            code=code,
            transformed=transformed,
            code_digest=policy.code_digest(transformed),
            cell_id=cell_id,
            msg_id=msg_id,
            effects=effects,
        )
        plan.reads = self.reads(effects, view)
        return plan

    def _unshadowed(self, code: str, transformed: str, foreseen: Callable[[str], bool]) -> str:
        """The cell as the kernel will transform it once the foreseen names are bound: IPython
        calls a bare line naming an alias magic (`lk`, `ll`) as that magic only while no name
        shadows it, and the forecast's namespace does not hold those names yet."""
        shell = self._shell
        automagic = shell.automagic
        shell.automagic = False
        try:
            plain = shell.transform_cell(code)
        finally:
            shell.automagic = automagic
        magics = set(_LINE_MAGIC.findall(transformed)) - set(_LINE_MAGIC.findall(plain))
        return plain if magics and all(foreseen(m.split(".")[0]) for m in magics) else transformed

    def plan(self, code: str, cell_id: str | None, msg_id: str | None) -> CellPlan:
        """The request's plan: its effects, reads and inputs, and on repeat the decision."""
        plan = self.analyse(code, cell_id, msg_id)
        effects = plan.effects
        assert effects is not None
        plan.inputs = {name: self.key(name) for name in sorted(plan.reads)}
        may_bind = (effects.writes | effects.deferred_writes) - plan.inputs.keys()
        plan.prior = {name: self.key(name) for name in sorted(may_bind)}
        if effects.dynamic or plan.reads & DYNAMIC_NAMES:
            # `'x' in globals()`: which names exist is itself an input.
            plan.inputs[pseudo.name(Pseudo.NAMES)] = self.hidden_key(pseudo.name(Pseudo.NAMES))
        if self._mode == "repeat":
            self._find_match(plan)
        return plan

    def reads(self, effects: CellEffects, view: RecordedReads | None = None) -> set[str]:
        """Every name whose value the cell may depend on (statically, and through the
        notebook functions it calls)."""
        names = user_names(self._shell) if view is None else set(view)
        if effects.dynamic:
            return names | set(effects.reads) | set(effects.mutated)
        reads = set(effects.reads) | set(effects.mutated) | set(effects.deletes)
        reads |= set(transitive_reads(frozenset(reads), self.function_view() if view is None else view))
        if reads & DYNAMIC_NAMES:
            return reads | names
        return reads

    def function_view(self) -> FunctionView:
        """The kernel's namespace as `transitive_reads` sees it now."""
        return FunctionView(self._shell.user_ns, self._state.entries)

    def key(self, name: str) -> str:
        """The digest a cell key records for `name` now."""
        entry = self._state.entries.get(name)
        ns = self._shell.user_ns
        present = dict.__contains__(ns, name)
        if entry is not None and (not present or self._state.rebound([name], ns) == set()):
            return entry.key
        if isinstance(ns, LazyNamespace) and ns.is_pending(name) and entry is not None:
            return entry.key
        if not present:
            return ABSENT
        vd = digest_value(dict.__getitem__(ns, name))
        if isinstance(vd, Unserializable):
            return "unserializable|" + vd.type_name
        return "untracked|" + vd

    def hidden_key(self, name: str) -> str:
        """The key a pseudo-input (`session.pseudo`) has now."""
        parsed = pseudo.parse(name)
        if parsed is None:
            return ABSENT
        kind, arg = parsed
        if kind in outside.OWNED:
            key = self._outside.key(kind, arg)
            if self._rng.files and kind in _WORLD:
                return self._with_pending_files(kind, self._paths.abs(arg), key)
            return key
        if kind is Pseudo.RNG:
            pending = self._rng.pending.get(arg)
            if pending is not None:
                return pending.key
            left = self._rng.left.get(arg)
            return left if left is not None else randomness.rng_states().get(arg, ABSENT)
        if kind is Pseudo.FILE:
            path = self._paths.abs(arg)
            pending_file = self._rng.files.get(path)
            if pending_file is not None:
                return pending_file.key  # the key it has once written back
            return hidden.file_digest(path) or ABSENT
        if kind is Pseudo.CWD:
            return self._paths.rel(os.getcwd())
        if kind is Pseudo.ENV:
            return env_key(os.environ.get(arg))
        if kind is Pseudo.NAMES:
            return digest_bytes("\n".join(sorted(user_names(self._shell))).encode())
        return ABSENT

    def _with_pending_files(self, kind: Pseudo, path: str, key: str) -> str:
        """The key of a listing, stat or existence check of `path` (`key` on disk now) as it
        will be once the temp files replayed cells left pending are written back: a replayed
        chain that checks them still matches, and a record made while one was missing does not.

        Listings are digested as `checkpoint.world.listing_key` digests them, stats as
        `stat_key` does (a file's size and content digest).
        """
        files = self._rng.files
        if kind is Pseudo.LISTING:
            prefix = path.rstrip(os.sep) + os.sep
            below = {p[len(prefix):]: entry for p, entry in files.items() if p.startswith(prefix)}
            if not below:
                return key
            try:
                names: set[str] | None = set(os.listdir(path))
            except OSError:
                names = None
            for rest, entry in below.items():
                child, _, deeper = rest.partition(os.sep)
                if not entry.extra.get("deleted"):
                    names = (names or set()) | {child}  # its folders are made when it is written
                elif names is not None and not deeper:
                    names.discard(child)
            return ABSENT if names is None else digest_bytes("\0".join(sorted(names)).encode("utf-8", "surrogateescape"))
        found = files.get(path)
        if found is None:
            prefix = path.rstrip(os.sep) + os.sep
            made = any(p.startswith(prefix) and not e.extra.get("deleted") for p, e in files.items())
            return "dir" if made and key == ABSENT else key
        if key == "dir":
            return key  # a folder is left alone when files are written back
        if found.extra.get("deleted"):
            return ABSENT
        if found.extra.get("dir"):
            return "dir"  # a folder a replayed cell made
        if kind is Pseudo.KIND:
            return "file"
        try:
            size = self._state.objects.blob_size(found.digest)
        except Exception:
            return f"unreadable|{found.digest}"  # no record matches it: the cell runs
        return f"file|{size}|{found.key}"

    def _is_pending(self, name: str) -> bool:
        ns = self._shell.user_ns
        return isinstance(ns, LazyNamespace) and ns.is_pending(name)

    def current_key(self, name: str) -> str:
        """The key an input of a recorded run has now: a name's, or a pseudo-input's."""
        return self.hidden_key(name) if pseudo.is_pseudo(name) else self.key(name)

    def _find_match(self, plan: CellPlan) -> None:
        catalog = self._catalog
        result = find_match(
            plan,
            self._state.entries,
            lambda: catalog.iter_cell_runs(plan.code_digest),
            lambda: plan.cell_id is not None and catalog.has_cell_id(plan.cell_id),
            self.current_key,
            self._is_pending,
        )
        plan.reason = result.reason
        if isinstance(result, Match):
            plan.replay, plan.match = True, result.run
            entries = self._state.entries
            plan.resources = sorted(n for n in plan.reads if (e := entries.get(n)) is not None and e.kind == UNSERIALIZABLE)
