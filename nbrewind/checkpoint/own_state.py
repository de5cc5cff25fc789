"""Instances of the notebook's own classes that pickle themselves their own way.

``__getstate__``, ``__reduce__`` and the like decide what a pickle keeps for
persistence (a cache dropped, a field recomputed in ``__setstate__``), while a
checkpoint must bring back what the notebook had. A restore through them, or a
digest of what they keep, would miss what they leave out: a later cell reading the
dropped cache, or a cell changing only it, replayed stale. So an instance of such a
class (defined by the notebook or a local module, possibly extending list, dict or
set) is stored as its ``__dict__``, slots and items, and set back without calling its
hooks or overridden methods. :mod:`nbrewind.checkpoint.serialize`'s pickler asks
:func:`own_state_base` once per class and reduces with :func:`own_state_reduce`.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from nbrewind.identity.modules import is_local_module
from nbrewind.identity.values import is_notebook_code

__all__ = ["own_state_base", "own_state_reduce", "user_class"]

def user_class(cls: type) -> bool:
    """A class the notebook or one of the user's own modules (a .py file beside it) defined."""
    if is_notebook_code(cls):
        return True
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    return module is not None and is_local_module(module)


_STATE_HOOKS = ("__getstate__", "__setstate__", "__reduce__", "__reduce_ex__", "__getnewargs__", "__getnewargs_ex__")
# The builtin containers a notebook class may extend: what they hold is stored beside the instance's own state.
_CONTAINERS: tuple[type, ...] = (list, dict, set)
_own_hooks: weakref.WeakKeyDictionary[type, type | None] = weakref.WeakKeyDictionary()


def own_state_base(cls: type, is_notebook_class: Callable[[type], bool]) -> type | None:
    """The builtin base (``object``, ``list``, ``dict`` or ``set``) of ``cls`` when every
    other class of its MRO is a notebook class and one of them defines how its instances
    pickle; None otherwise (cached per class)."""
    try:
        return _own_hooks[cls]
    except KeyError:
        pass
    except TypeError:  # not weakly referenceable
        return None
    mro = cls.__mro__
    base: type | None = None
    if mro[-1] is object:
        rest = mro[:-1]
        if len(rest) > 1 and rest[-1] in _CONTAINERS:
            base, rest = rest[-1], rest[:-1]
        else:
            base = object
        if not (all(is_notebook_class(k) for k in rest) and any(hook in vars(k) for k in rest for hook in _STATE_HOOKS)):
            base = None
    _own_hooks[cls] = base
    return base


def own_state_reduce(obj: Any, base: type) -> tuple[Any, ...]:
    """The instance's ``__dict__``, slots and items, and how to set them back without its
    hooks; ``base`` is what :func:`own_state_base` said of its class. A member the hooks
    hid because it cannot be pickled (a lock) makes the value unstorable, to be made
    again by re-running its cells."""
    cls = type(obj)
    try:
        state = dict(object.__getattribute__(obj, "__dict__"))
    except AttributeError:
        state = None
    slots: dict[str, Any] = {}
    for klass in cls.__mro__:
        names = klass.__dict__.get("__slots__", ())
        for slot in (names,) if isinstance(names, str) else names:
            if slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):
                slot = f"_{klass.__name__.lstrip('_')}{slot}"
            try:
                slots[slot] = object.__getattribute__(obj, slot)
            except AttributeError:  # never assigned
                pass
    items: list[Any] | None = None
    if base is dict:
        items = list(dict.items(obj))
    elif base is not object:
        items = list(base.__iter__(obj))  # type: ignore[attr-defined]
    return (_new_instance, (cls, base), (state, slots, items), None, None, _set_instance_state)


def _new_instance(cls: type, base: type = object) -> Any:
    return base.__new__(cls)  # type: ignore[call-overload]


def _set_instance_state(obj: Any, state: tuple[dict[str, Any] | None, dict[str, Any], list[Any] | None]) -> None:
    values, slots, items = state
    if values is not None:
        object.__getattribute__(obj, "__dict__").update(values)
    for name, value in slots.items():
        object.__setattr__(obj, name, value)
    if items is not None:
        if isinstance(obj, list):
            list.extend(obj, items)
        elif isinstance(obj, dict):
            dict.update(obj, items)
        else:
            set.update(obj, items)
