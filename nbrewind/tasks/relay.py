"""The kernel side of a cluster whose workers cannot see the store.

A :class:`StoreRelay` belongs to one task cache. When a graph is first sent to a
distributed scheduler it writes the probe file (see ``remote.py``) and
subscribes the client to its event topic; from then on every task spec of such
graphs carries the :class:`~nbrewind.tasks.remote.StoreLink`.

Workers that see the store never send anything. A worker that does not sends an
event per missed result ("put") and per cached result it needs ("get"). The
client's event handler only queues them; one thread of the kernel, started on
the first event, serves the queue: gets first (a load task is waiting), read from
the store and sent back with ``Client.run(deliver)`` (entries of :data:`SCATTER_BYTES`
or more are scattered to the worker first: ``Client.run`` copies its arguments into
one pickle, scattered data travels out of band); then puts, taken from the
worker with ``Client.run(take_results)`` in batches of at most
:data:`BATCH_BYTES` and written as entry objects plus the ref
``tasks/<fingerprint>``, without fsync (the session's durability barrier covers
them, as it covers deferred writes of workers on this machine).

Events reach the client in the order the worker sent them, before the client
learns that the task finished; so when a computation's results are back, its
puts are queued, and :meth:`StoreRelay.flush` (called before the task log is
read) waits until they are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbrewind.store import ObjectStore
from nbrewind.store.fsio import deferred_sync
from nbrewind.tasks.remote import RELAYED_REFS, OutOfBand, StoreLink, deliver, probe_path, take_results, write_probe
from nbrewind.tasks.reads import READS_REFS
from nbrewind.tasks.results import entry_frames, store_frames

__all__ = ["BATCH_BYTES", "FLUSH_TIMEOUT", "SCATTER_BYTES", "StoreRelay"]

logger = logging.getLogger(__name__)

#: Pickled results taken from one worker in one ``Client.run`` at most (one result may exceed it).
BATCH_BYTES = 64 << 20
#: Entries at least this large reach a load task as scattered data (sent out of band), smaller
#: ones inside the ``Client.run`` message (one round trip less, but copied into its pickle).
SCATTER_BYTES = 1 << 20
#: Seconds :meth:`StoreRelay.flush` waits for queued results to be written.
FLUSH_TIMEOUT = 120.0


@dataclass
class RelayStats:
    """What the relay did, for tests and benchmarks."""

    stored: int = 0
    """Results written for workers."""
    served: int = 0
    """Entries sent to load tasks."""
    failed: int = 0
    """Results or entries that could not be taken, written, read or sent."""


class StoreRelay:
    """Stores the results of workers that cannot see the store, and reads entries for them."""

    def __init__(self, objects: ObjectStore, ref_namespace: str) -> None:
        self.objects = objects
        self.namespace = ref_namespace
        nonce = os.urandom(16)
        self.topic = f"nbrewind-store-{nonce.hex()}"
        self._probe_bytes = b"nbrewind store probe\n" + nonce
        self._probe_name = nonce.hex()
        self._probe: str | None = None
        self._clients: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._cond = threading.Condition()
        self._queue: list[tuple[weakref.ref[Any], dict[str, Any]]] = []
        self._queued = self._finished = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.stats = RelayStats()

    def __repr__(self) -> str:
        return f"StoreRelay({self.topic!r}, {self.stats})"

    def link(self, client: Any) -> StoreLink:
        """The link for graphs ``client`` sends, subscribing it to the topic first if needed."""
        if self._probe is None or not os.path.exists(probe_path(str(self.objects.root), self._probe_name)):
            write_probe(str(self.objects.root), self._probe_name, self._probe_bytes)
            self._probe = self._probe_name
        address = str(client.scheduler.address)
        if self._clients.get(client) != address:
            client.subscribe_topic(self.topic, self._handler(weakref.ref(client)))
            self._clients[client] = address
        return StoreLink(self.topic, self._probe)

    def _handler(self, client: weakref.ref[Any]) -> Callable[[tuple[float, Any]], None]:
        def on_event(event: tuple[float, Any]) -> None:
            msg = event[1]
            if self._closed or not _well_formed(msg):
                return
            with self._cond:
                self._queue.append((client, msg))
                self._queued += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="nbrewind-store-relay", daemon=True)
                    self._thread.start()
                self._cond.notify_all()

        return on_event

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Wait until every request received so far is served; False on timeout.

        Returns False at once when called on the event loop of an asynchronous client:
        serving needs that loop, so waiting there would only wait for the timeout.
        """
        if self._on_a_client_loop():
            return False
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._queued
            while self._finished < target:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._cond.wait(left)
        return True

    def _on_a_client_loop(self) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        for client in list(self._clients.keys()):
            if getattr(getattr(client, "loop", None), "asyncio_loop", None) is running:
                return True
        return False

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Write what was received, stop the thread and unsubscribe the clients."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for client in list(self._clients.keys()):
            try:
                client.unsubscribe_topic(self.topic)
            except Exception:  # a closed client has nothing to unsubscribe
                pass
        self._clients.clear()
        if self._probe is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe_path(str(self.objects.root), self._probe))

    # -- the serving thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    self._thread = None
                    return
                batch, self._queue = self._queue, []
            try:
                self._handle(batch)
            except Exception:  # never let one bad batch stop the relay
                logger.debug("NBRewind: store relay batch failed", exc_info=True)
            with self._cond:
                self._finished += len(batch)
                self._cond.notify_all()

    def _handle(self, batch: list[tuple[weakref.ref[Any], dict[str, Any]]]) -> None:
        gets: defaultdict[tuple[weakref.ref[Any], str], list[dict[str, Any]]] = defaultdict(list)
        puts: defaultdict[tuple[weakref.ref[Any], str], list[dict[str, Any]]] = defaultdict(list)
        for client, msg in batch:
            (gets if msg["op"] == "get" else puts)[(client, str(msg.get("worker")))].append(msg)
        for (client, worker), msgs in gets.items():
            self._serve_gets(client(), worker, msgs)
        for (client, worker), msgs in puts.items():
            size, ids = 0, list[str]()
            for msg in msgs:
                if ids and size + int(msg.get("nbytes", 0)) > BATCH_BYTES:
                    self._store_puts(client(), worker, ids)
                    size, ids = 0, list[str]()
                ids.append(str(msg["id"]))
                size += int(msg.get("nbytes", 0))
            self._store_puts(client(), worker, ids)

    def _serve_gets(self, client: Any, worker: str, msgs: list[dict[str, Any]]) -> None:
        replies: dict[str, tuple[Any, str | None]] = {}
        large: dict[str, list[OutOfBand]] = {}
        for msg in msgs:
            rid = str(msg["id"])
            try:
                if "ref" in msg:
                    namespace, _, name = str(msg["ref"]).partition("/")
                    found = self.objects.ref_get(namespace, name)
                    if found is None:
                        replies[rid] = (None, None)  # no checkpoint yet: resume() gets its default
                        continue
                    frames = entry_frames(self.objects, found)
                else:
                    frames = entry_frames(self.objects, str(msg["entry"]))
            except Exception as exc:  # damaged or missing: the load task recomputes
                replies[rid] = (None, f"{type(exc).__name__}: {exc}")
                self.stats.failed += 1
                continue
            if sum(len(f) for f in frames) >= SCATTER_BYTES:
                key = f"nbrewind-entry-{uuid.uuid4().hex}"
                large[key] = [OutOfBand(f) for f in frames]
                replies[rid] = (key, None)
            else:
                replies[rid] = (frames, None)
        if client is None:
            return
        scattered: dict[str, Any] = {}
        try:
            if large:
                scattered = client.scatter(large, workers=[worker], hash=False, asynchronous=False)
            client.run(deliver, replies, workers=[worker], asynchronous=False)
        except Exception as exc:  # the worker left: nobody is waiting any more
            logger.debug("NBRewind: could not send cached results to %s: %s", worker, exc)
            self.stats.failed += len(replies)
            return
        finally:
            for future in scattered.values():  # deliver has taken them (or the worker is gone)
                future.release()
        self.stats.served += sum(1 for frames, _ in replies.values() if frames is not None)

    def _store_puts(self, client: Any, worker: str, ids: list[str]) -> None:
        if client is None:
            self.stats.failed += len(ids)
            return
        try:
            taken = client.run(take_results, ids, workers=[worker], asynchronous=False).get(worker, {})
        except Exception as exc:  # the worker left with them: they are just not cached
            logger.debug("NBRewind: could not take results from %s: %s", worker, exc)
            self.stats.failed += len(ids)
            return
        self.stats.failed += len(ids) - len(taken)
        for record, frames in taken.values():
            fingerprint = record.pop("fingerprint", None)
            namespace = record.pop("ref", None) or self.namespace
            record["relayed"] = True  # stored by the kernel: `nbrewind log` and the benchmarks tell them apart
            try:
                if namespace != self.namespace and namespace not in RELAYED_REFS:
                    raise ValueError(f"not a ref namespace workers may write: {namespace!r}")
                if record.get("drop"):
                    self.objects.ref_delete(namespace, str(fingerprint))
                    continue
                with deferred_sync(self.objects.root):
                    entry, _ = store_frames(self.objects, frames[0], frames[1:], record)
                    if namespace == self.namespace and record.get("reads"):
                        self.objects.ref_set(READS_REFS, str(fingerprint), entry)
                    self.objects.ref_set(namespace, str(fingerprint), entry)
            except Exception as exc:  # full disk, read-only store: the result is not cached
                logger.debug("NBRewind: could not store a result from %s: %s", worker, exc)
                self.stats.failed += 1
                continue
            self.stats.stored += 1


def _well_formed(msg: Any) -> bool:
    """Whether an event is a request this relay serves (anyone on the scheduler can send one)."""
    if not isinstance(msg, dict) or not isinstance(msg.get("id"), str) or not isinstance(msg.get("worker"), str):
        return False
    if msg.get("op") == "get":
        ref = msg.get("ref")
        if isinstance(ref, str):
            namespace, _, name = ref.partition("/")
            return namespace in RELAYED_REFS and name.isalnum()
        return isinstance(msg.get("entry"), str)
    return msg.get("op") == "put" and isinstance(msg.get("nbytes"), int)
