"""The public `Fingerprinter` and its walk over a task graph in dependency order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nbrewind.identity.interpreter import collector_paused
from nbrewind.tasks.fingerprint.common import (
    _DATA,
    _FUNC,
    _INF,
    _TASK,
    _VALUE,
    Files,
    Key,
    UnfingerprintableError,
    _digest,
    _name,
    _settings_salt,
)
from nbrewind.tasks.fingerprint.values import ValueEncoding

_SUB_MEMO_LIMIT = 1 << 16
"""Fused-task tokens memoized per run (`Fingerprinter._subgraph_digest`) before the memo is emptied."""


class Fingerprinter(ValueEncoding):
    """Computes task fingerprints, keeping memo tables between and within runs.

    Cross-run caches hold what cannot change while the process lives (code
    objects' own content, whether a module is library code and its version,
    file digests keyed by stat data). Per-run caches (functions, large values,
    path checks) are cleared after every public call, because a function's
    globals or a value may change between cells.
    """

    # ------------------------------------------------------------------ public API

    def fingerprint_graph(
        self,
        dsk: Mapping[Key, Any],
        keys_subset: Iterable[Key] | None = None,
        *,
        external: Mapping[Key, str] | None = None,
        external_files: Mapping[Key, Mapping[str, str]] | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> dict[Key, str]:
        """Fingerprint every task of ``dsk`` (or ``keys_subset`` and what it depends on).

        Tasks are visited in dependency order, each one's bytes embedding its
        dependencies' fingerprints. Legacy tuple tasks are converted on the fly.
        ``external`` gives fingerprints for keys the graph refers to but does
        not hold (persisted futures), ``external_files`` the files those
        fingerprints cover. ``settings`` (setting name -> digest, e.g. the
        library settings at submission) is folded into every task's
        fingerprint; without it, or when empty, nothing is (the encoding is
        then that of tasks before settings existed). Keys that cannot be
        fingerprinted, and everything depending on them, are left out of the
        result and listed with the reason in ``self.failures``: the caller runs
        them uncached. ``self.file_inputs`` tells which files each key covers.
        """
        self._load_dask()
        self._refresh_rngs()
        if not isinstance(dsk, dict):
            dsk = dict(dsk)
        roots = list(dsk) if keys_subset is None else list(keys_subset)
        fps: dict[Key, bytes] = {}
        ext = {k: b"@" + bytes.fromhex(v) for k, v in (external or {}).items()}
        failed: dict[Key, str] = {}
        self._fps = fps
        self._salt = _settings_salt(settings) if settings else b""
        node_files: dict[Key, Files] = {}
        if external_files:
            node_files.update((k, dict(v)) for k, v in external_files.items() if v and k in ext)
        self._node_files = node_files
        try:
            with collector_paused():
                self._traverse(dsk, roots, failed, ext)
        finally:
            self._end_run()
        self.failures = failed
        self.file_inputs = {k: v for k, v in node_files.items() if k in dsk and k in fps}
        result = {}
        last, last_hex = b"", ""
        for k, v in fps.items():  # equal tasks share a token object (the memos): and so one str
            if k in dsk:
                if v is not last:
                    last, last_hex = v, v[1:].hex()
                result[k] = last_hex
        return result

    def fingerprint_value(self, obj: object) -> str:
        """Content fingerprint of one value, as it would count as a task argument."""
        self._refresh_rngs()
        try:
            out = [_VALUE]
            self._enc(obj, out)
            return _digest(b"".join(out)).hex()
        finally:
            self._end_run()

    def fingerprint_function(self, fn: Callable[..., Any]) -> str:
        """Fingerprint of a callable: by code for user functions, by name and version for library ones.

        Raises UnfingerprintableError for one that draws from a global RNG.
        """
        self._refresh_rngs()
        try:
            out = [_FUNC]
            self._enc(fn, out)
            return _digest(b"".join(out)).hex()
        finally:
            self._end_run()

    # ------------------------------------------------------------------ graph walk

    def _traverse(self, dsk: Mapping[Key, Any], roots: Iterable[Key], failed: dict[Key, str],
                  external: Mapping[Key, bytes]) -> None:
        GraphNode = self._load_dask().GraphNode
        fps = self._fps
        converted: dict[Key, Any] = {}
        for root in roots:
            if root in fps or root in failed:
                continue
            if root not in dsk:
                raise KeyError(root)
            stack = [root]
            expanded: set[Key] = set()
            while stack:
                k = stack[-1]
                if k in fps or k in failed:
                    stack.pop()
                    continue
                node = dsk[k]
                if not isinstance(node, GraphNode):
                    node = converted.get(k)
                    if node is None:
                        node = converted[k] = self._convert_legacy(k, dsk)
                    if node is None:
                        failed[k] = "key whose value is its own name"
                        stack.pop()
                        continue
                blocked = None
                pending = []
                for d in node.dependencies:
                    if d in fps:
                        continue
                    if d in failed:
                        blocked = d
                        break
                    if d not in dsk:
                        if d in external:
                            fps[d] = external[d]
                            continue
                        failed[d] = "key outside the graph without a known fingerprint"
                        blocked = d
                        break
                    pending.append(d)
                if blocked is not None:
                    failed[k] = f"depends on {blocked!r}: {failed[blocked]}"
                elif pending:
                    if k in expanded:
                        failed[k] = "dependency cycle"
                    else:
                        expanded.add(k)
                        stack.extend(pending)
                        continue
                else:
                    outer_files, self._files = self._files, None
                    try:
                        fps[k] = self._node_token(node)
                    except (UnfingerprintableError, RecursionError) as e:
                        failed[k] = f"{type(e).__name__}: {e}"
                        self._stack.clear()
                        self._low = _INF
                    else:
                        self._node_files_of(k, node)
                    finally:
                        self._files = outer_files
                stack.pop()

    def _node_files_of(self, k: Key, node: Any) -> None:
        """Record the files ``k``'s fingerprint covers: those noted while encoding it, and its
        dependencies' (a Merkle fingerprint covers what its dependencies' cover)."""
        files = self._files
        node_files = self._node_files
        if node_files:
            for d in node.dependencies:
                more = node_files.get(d)
                if more:
                    files = {**files, **more} if files else more
        if files:
            node_files[k] = files

    def _convert_legacy(self, k: Key, dsk: Mapping[Key, Any]) -> Any:
        """A legacy tuple task or literal as a GraphNode; None for a key mapped to itself."""
        ts = self._ts
        node = ts.convert_legacy_task(k, dsk[k], dsk)
        if isinstance(node, ts.Alias) and node.target == k:
            return None
        return node if isinstance(node, ts.GraphNode) else ts.DataNode(k, node)

    def _node_token(self, node: Any) -> bytes:
        """b"@" + the node's fingerprint (an Alias has its target's), as embedded in dependents."""
        ts = self._ts
        if type(node) is not ts.Task:  # a plain Task (the common case) is none of these
            if isinstance(node, ts.Alias):
                return self._dep(node.target)
            if isinstance(node, ts.DataNode):
                out = [_DATA]
                self._enc(node.value, out)
                return b"@" + _digest(b"".join(out))
            if not isinstance(node, ts.Task):
                raise UnfingerprintableError(f"unknown graph node type {type(node).__qualname__}")
        func = node.func
        self._check_rng(func)
        if func is ts._execute_subgraph:
            return self._subgraph_digest(node)
        out = [_TASK, self._salt]
        if isinstance(node, ts.NestedContainer):
            self._enc_container(node.klass, node.args, out)
        elif func is ts._identity_cast and node.kwargs.get("typ") in (list, tuple, set, frozenset):
            self._enc_container(node.kwargs["typ"], node.args, out)
        else:
            if type(node) is not ts.Task:
                self._enc(type(node), out)
            self._enc(func, out)
            out.append(b"(")
            for a in node.args:
                self._enc(a, out)
            kwargs = node.kwargs
            if kwargs:
                out.append(b"k")
                for name in sorted(kwargs):
                    out.append(_name(name))
                    self._enc(kwargs[name], out)
            out.append(b")")
        return b"@" + _digest(b"".join(out))

    def _enc_container(self, klass: type, items: tuple[Any, ...], out: list[bytes]) -> None:
        """A List/Tuple/Set/Dict node, encoded like the literal container it builds."""
        if klass is dict:
            out.append(b"{")
            for x in items:
                self._enc(x, out)
            out.append(b"}")
        elif klass is set or klass is frozenset:
            self._enc_items_sorted(items, b"<" if klass is set else b"~<", out)
        else:
            out.append(b"[" if klass is list else b"(")
            for x in items:
                self._enc(x, out)
            out.append(b"]" if klass is list else b")")

    def _subgraph_digest(self, node: Any) -> bytes:
        """A fused task: the token its inner output task would have in the unfused graph.

        Each inner input key is bound to what the outer argument contributes: an
        upstream task's token, or a literal's (DataNode's) inline encoding, exactly
        as the unfused task would have embedded that argument.
        """
        inner, outkey, inkeys, *refs = node.args
        if not (isinstance(inner, dict) and isinstance(inkeys, tuple) and len(refs) == len(inkeys)):
            raise UnfingerprintableError("fused task of an unknown layout")
        enc = self._enc
        ts = self._ts
        DataNode, TaskRef = ts.DataNode, ts.TaskRef
        bound = []
        for r in refs:
            t = type(r)
            if t is TaskRef:  # as `_enc_ref` encodes it
                bound.append(self._dep(r.key))
                continue
            sub: list[bytes] = []
            enc(r.value if t is DataNode else r, sub)  # a DataNode as `_enc_graphnode` encodes it
            bound.append(b"".join(sub))
        # Blockwise fusion shares one inner graph between all the chunks' fused tasks, and
        # the token is a function of that graph, the output key and what each input key is
        # bound to: computed once per run for each such triple. Only at the top of an
        # encoding (an empty cycle stack), where no back-reference can reach out of it.
        memo_key = None
        if not self._stack:
            memo_key = (id(inner), outkey, inkeys, tuple(bound))
            try:
                hit = self._sub_memo.get(memo_key)
            except TypeError:  # an unhashable key in the layout
                hit = memo_key = None
            if hit is not None and hit[0] is inner:
                if hit[2]:
                    self._merge_files(hit[2])
                return hit[1]
        local: dict[Key, bytes] = dict(zip(inkeys, bound))
        outer, outer_files = self._fps, self._node_files
        failed: dict[Key, str] = {}
        self._fps, self._node_files = local, {}
        try:
            if not self._inner_walk(inner, outkey, local, 0):
                self._traverse(inner, [outkey], failed, {})  # legacy nodes, deep chains: the general walk
            inner_files = self._node_files.get(outkey)
        finally:
            self._fps, self._node_files = outer, outer_files
        if inner_files:
            self._merge_files(inner_files)
        token = local.get(outkey, b"")
        if not token.startswith(b"@") or outkey in inkeys:
            raise UnfingerprintableError(f"fused task: {failed.get(outkey, 'output is not a task')}")
        if memo_key is not None:
            memo = self._sub_memo
            if len(memo) >= _SUB_MEMO_LIMIT:  # tasks whose inputs all differ: keep memory bounded
                memo.clear()
            memo[memo_key] = (inner, token, inner_files)
        return token

    def _inner_walk(self, inner: Mapping[Key, Any], k: Key, local: dict[Key, bytes], depth: int) -> bool:
        """Tokens of a fused task's inner graph, depth first, as `_traverse` computes them
        (the common case: a few GraphNodes, no cycle); False when it must be left to
        `_traverse` (a legacy node, a key it does not hold, a chain too deep)."""
        node = inner.get(k)
        if depth > 64 or not isinstance(node, self._ts.GraphNode):
            return False
        for d in node.dependencies:
            if d not in local and not self._inner_walk(inner, d, local, depth + 1):
                return False
        outer_files, self._files = self._files, None
        try:
            local[k] = self._node_token(node)
            self._node_files_of(k, node)
        finally:
            self._files = outer_files
        return True

    def _dep(self, key: Key) -> bytes:
        try:
            return self._fps[key]
        except (KeyError, TypeError):
            raise UnfingerprintableError("refers to a key without a fingerprint") from None

