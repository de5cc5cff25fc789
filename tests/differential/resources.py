"""Seeded notebooks whose state includes values that cannot be stored: resources.

A lock, a semaphore, a generator or an object holding a lock cannot be pickled, so
NBRewind records how it was made (the cell and the state it started from) and, on
repeat, which replayed cells used it while it was still only a record. A cell that
really needs one live makes it again from that recorded life. These cases test that
life: each fragment makes a resource, uses and changes it in later cells (some read
only, some advance or mutate it, one may close it), reads storable values beside it,
and offers edits anywhere in that story.

The edited notebook N' ends with a *probe* cell N never had, so the repeat always
runs it: it prints every resource's state, which must be what a fresh run of N'
shows. Everything is a pure function of the seed (`make_resource_case(5)`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from differential.generator import Edit, _interleave, _other, cosmetic

__all__ = ["RESOURCE_FAMILIES", "ResourceCase", "make_resource_case"]


@dataclass
class ResourceFragment:
    family: str
    cells: list[str]
    edits: list[Edit]
    probe: str


@dataclass(frozen=True)
class ResourceCase:
    """Notebook N, N' (the edit, then the probe cell), and what was edited."""

    seed: int
    cells: tuple[str, ...]
    edited: tuple[str, ...]
    labels: tuple[str, ...]
    first_edited: int
    """Index of the first cell whose code changed (len(cells) when only comments did)."""

    @property
    def id(self) -> str:
        return f"resources_{self.seed}"

    def describe(self) -> str:
        lines = [f"case {self.id}: edit={list(self.labels)}"]
        for i, src in enumerate(self.edited):
            changed = i >= len(self.cells) or self.cells[i] != src
            lines.append(f"--- cell {i}" + (" (edited)" if changed else ""))
            if changed and i < len(self.cells):
                lines.append(self.cells[i])
                lines.append(f"--- cell {i} in N'")
            lines.append(src)
        return "\n".join(lines)


def semaphore(rng: random.Random, s: str) -> ResourceFragment:
    """Permits taken and given back across cells; the count it starts with is a storable input."""
    k, m = rng.randint(2, 5), rng.randint(1, 4)
    cells = [
        f"import threading\nn{s} = {k}",
        f"sem{s} = threading.Semaphore(n{s})",
        f"got{s} = [sem{s}.acquire(blocking=False) for _ in range({m})]\nprint(got{s})",
        f"sem{s}.release()",
        f"print('permits', sem{s}._value)",
    ]
    edits = [
        Edit("edit-permits", 0, f"import threading\nn{s} = {_other(rng, k, 2, 5)}"),
        Edit("edit-taken", 2, f"got{s} = [sem{s}.acquire(blocking=False) for _ in range({_other(rng, m, 1, 4)})]\nprint(got{s})"),
        Edit("edit-no-release", 3, "pass"),
        Edit("edit-reader", 4, f"print('left', sem{s}._value)"),
    ]
    return ResourceFragment("semaphore", cells, edits, f"print('sem{s}', sem{s}._value)")


def generator(rng: random.Random, s: str) -> ResourceFragment:
    """A generator advanced by later cells, reading a global that changes between them."""
    k, k2, n = rng.randint(2, 9), rng.randint(2, 9), rng.randint(8, 12)
    cells = [
        f"STEP{s} = {k}\ndef gen{s}(n):\n    for i in range(n):\n        yield i * STEP{s}",
        f"g{s} = gen{s}({n})",
        f"print(next(g{s}))",
        f"STEP{s} = {k2}",
        f"pair{s} = [next(g{s}), next(g{s})]",
        f"print(pair{s}, sum(pair{s}))",
    ]
    edits = [
        Edit("edit-step", 0, f"STEP{s} = {_other(rng, k, 2, 9)}\ndef gen{s}(n):\n    for i in range(n):\n        yield i * STEP{s}"),
        Edit("edit-first-draw", 2, f"print('first', next(g{s}))"),
        Edit("edit-later-step", 3, f"STEP{s} = {_other(rng, k2, 2, 9)}"),
        Edit("edit-one-draw", 4, f"pair{s} = [next(g{s})]"),
        Edit("edit-reader", 5, f"print(len(pair{s}))"),
        Edit("edit-close", 5, f"g{s}.close()"),
    ]
    return ResourceFragment("generator", cells, edits, f"print('gen{s}', list(g{s}))")


def tally(rng: random.Random, s: str) -> ResourceFragment:
    """A notebook class whose instances hold a lock: mutated through methods that read a
    global, read into storable values."""
    a, b, w = rng.randint(1, 30), rng.randint(1, 30), rng.randint(2, 5)
    method = (
        f"import threading\nWEIGHT{s} = 1\nclass Tally{s}:\n    def __init__(self):\n        self.lock = threading.Lock()\n"
        f"        self.n = 0\n    def add(self, k):\n        with self.lock:\n            self.n += k * WEIGHT{s}\n        return self.n"
    )
    cells = [
        method,
        f"t{s} = Tally{s}()",
        f"t{s}.add({a})",
        f"WEIGHT{s} = {w}\nsnap{s} = t{s}.n",
        f"t{s}.add({b})\nprint(t{s}.n, snap{s})",
    ]
    edits = [
        Edit("edit-first-add", 2, f"t{s}.add({_other(rng, a, 1, 30)})"),
        Edit("edit-snapshot", 3, f"WEIGHT{s} = {w}\nsnap{s} = t{s}.n * 2"),
        Edit("edit-weight", 3, f"WEIGHT{s} = {_other(rng, w, 2, 5)}\nsnap{s} = t{s}.n"),
        Edit("edit-last-add", 4, f"t{s}.add({_other(rng, b, 1, 30)})\nprint(t{s}.n, snap{s})"),
        Edit("edit-method", 0, method.replace("self.n += k", "self.n += 2 * k")),
    ]
    return ResourceFragment("tally", cells, edits, f"print('tally{s}', t{s}.add(1), snap{s}, WEIGHT{s})")


RESOURCE_FAMILIES: dict[str, Callable[[random.Random, str], ResourceFragment]] = {
    "semaphore": semaphore,
    "generator": generator,
    "tally": tally,
}


def make_resource_case(seed: int) -> ResourceCase:
    """The case for `seed`: one or two fragments interleaved, one semantic edit (or a
    cosmetic one, or none), then the probe of every fragment's resource."""
    rng = random.Random(seed)
    names = list(RESOURCE_FAMILIES)
    chosen = [names[seed % len(names)]]
    if rng.random() < 0.6:
        chosen.append(rng.choice(names))
    fragments = [RESOURCE_FAMILIES[name](rng, f"_{i}") for i, name in enumerate(chosen)]
    order = _interleave(rng, fragments)  # type: ignore[arg-type]
    where = {pos: idx for idx, pos in enumerate(order)}
    cells = [fragments[f].cells[i] for f, i in order]
    edited = list(cells)
    roll = rng.random()
    labels: list[str] = []
    first = len(cells)
    if roll < 0.1:
        labels.append("none")
    elif roll < 0.25:
        index = rng.randrange(len(cells))
        edited[index] = cosmetic(cells[index], rng)
        labels.append("cosmetic")
    else:
        f = rng.randrange(len(fragments))
        choice = rng.choice(fragments[f].edits)
        index = where[(f, choice.cell)]
        edited[index] = choice.source
        labels.append(f"{fragments[f].family}:{choice.label}")
        first = index
    edited.append("\n".join(frag.probe for frag in fragments))
    return ResourceCase(seed, tuple(cells), tuple(edited), tuple(labels), first)
