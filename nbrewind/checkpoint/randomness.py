"""The global random number generators as hidden state of a cell run.

A cell that draws from ``random`` or ``numpy.random`` without seeding depends on
the state it found and leaves another behind; a faithful repeat must key on the
first and restore the second.  Here are stable digests of those states, the
states themselves, and a watcher that notes whether a block reseeded a
generator before drawing from it.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from typing import Any

import xxhash

__all__ = ["NUMPY_RANDOM", "RANDOM", "capture_rng", "restore_rng", "rng_states", "watching_seeds"]

RANDOM = "random"
NUMPY_RANDOM = "numpy.random"


def rng_states() -> dict[str, str]:
    """Digest of each global RNG state: ``random`` and, if loaded, ``numpy.random``.

    numpy is never imported here: if ``numpy.random`` is not loaded, no cell
    has drawn from its global generator.  Digests are stable across processes,
    so a cell key can record them.
    """
    states: dict[str, str] = {RANDOM: _digest_random_state(random.getstate())}
    np_random = sys.modules.get(NUMPY_RANDOM)
    if np_random is not None:
        states[NUMPY_RANDOM] = _digest_numpy_state(np_random.get_state(legacy=True))
    return states


def _digest_random_state(state: tuple[Any, ...]) -> str:
    version, internal, gauss_next = state
    hasher = xxhash.xxh3_128(b"nbrewind.rng.random.v1")
    hasher.update(f"{version}|{gauss_next!r}|".encode())
    hasher.update(b"".join(word.to_bytes(4, "little") for word in internal))
    return hasher.hexdigest()


def _digest_numpy_state(state: tuple[Any, ...]) -> str:
    name, key, pos, has_gauss, cached_gaussian = state
    hasher = xxhash.xxh3_128(b"nbrewind.rng.numpy.v1")
    hasher.update(f"{name}|{int(pos)}|{int(has_gauss)}|{float(cached_gaussian)!r}|".encode())
    hasher.update(key.astype("<u4").tobytes())
    return hasher.hexdigest()


def capture_rng() -> dict[str, object]:
    """The global RNG states themselves (picklable), for :func:`restore_rng`."""
    saved: dict[str, object] = {RANDOM: random.getstate()}
    np_random = sys.modules.get(NUMPY_RANDOM)
    if np_random is not None:
        saved[NUMPY_RANDOM] = np_random.get_state(legacy=True)
    return saved


def restore_rng(saved: dict[str, object]) -> None:
    """Put back the states from :func:`capture_rng`, importing numpy.random if needed."""
    if RANDOM in saved:
        random.setstate(saved[RANDOM])  # type: ignore[arg-type]
    if NUMPY_RANDOM in saved:
        import numpy.random  # only reached when a saved numpy state exists

        numpy.random.set_state(saved[NUMPY_RANDOM])  # type: ignore[arg-type]


@contextlib.contextmanager
def watching_seeds() -> Iterator[dict[str, bool]]:
    """Note, per global RNG, whether a block reseeded it before drawing from it.

    A cell that starts with `random.seed(k)` does not depend on the state it
    found, so that state is not an input of the cell. While the block runs,
    `random.seed` and (if numpy is loaded) `numpy.random.seed` are wrapped; the
    originals are put back on exit. The yielded dict maps the RNG name to True
    when its first seeding happened before any draw.
    """
    seeded: dict[str, bool] = {}
    start = rng_states()
    patched: list[tuple[Any, str, Any]] = []

    def wrap(module: Any, which: str) -> None:
        original = module.seed

        def seed(*args: Any, **kwargs: Any) -> Any:
            if which not in seeded:
                seeded[which] = rng_states().get(which) == start.get(which)
            return original(*args, **kwargs)

        module.seed = seed
        patched.append((module, "seed", original))

    wrap(random, RANDOM)
    np_random = sys.modules.get(NUMPY_RANDOM)
    if np_random is not None:
        wrap(np_random, NUMPY_RANDOM)
    try:
        yield seeded
    finally:
        for module, attr, original in reversed(patched):
            setattr(module, attr, original)
