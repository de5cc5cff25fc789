"""Interpreter and process state a cell can change: settings as the notebook left them.

``sys.setrecursionlimit(150)`` decides whether a later cell's recursion succeeds,
``os.umask(0o077)`` the mode of every file a later cell creates,
``sys.set_int_max_str_digits(640)`` whether ``str()`` of a big int raises,
``time.tzset()`` (after setting ``TZ``) what ``time.localtime`` says,
``logging.basicConfig(level=logging.INFO)`` whether a later ``logging.info`` prints,
``gc.disable()`` whether cyclic garbage is ever collected,
``socket.setdefaulttimeout(5)`` how long a later connection may wait, and
``locale.setlocale(locale.LC_ALL, "C.UTF-8")`` how later cells format and compare text.
None of it is a variable, so a replayed cell that made such a change must make it
again; `nbrewind.identity.settings` registers each as a `Setting`.

Only what the notebook changed is state: each getter compares with the value the
process had when the session started (`note_baseline`) and returns an empty snapshot
while nothing moved. Machines differ in their defaults (a site's umask, a
``PYTHONINTMAXSTRDIGITS``, the system time zone), and keying every cell on them
would keep a store from replaying anywhere else.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import locale
import logging
import os
import sys
import time
import weakref
from collections.abc import Iterator
from typing import Any

from nbrewind.identity.modules import library_kind

__all__ = [
    "collector_paused", "display_get", "display_put", "interpreter_get", "interpreter_put", "locale_get", "locale_put", "loggers_get", "loggers_put",
    "logging_get", "logging_put", "note_baseline",
    "socket_get", "socket_put", "time_zone_get", "time_zone_put",
]

_BASELINE: dict[str, Any] | None = None
_collector_paused = False  # the collector is off for `collector_paused`, not for the notebook


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Suspend the cyclic garbage collector for a walk over a whole graph, unseen as state.

    Fingerprinting and rewriting a task graph make a few container objects per task and
    keep many, so the collector ran again and again over the whole heap: about a third of
    the rewrite's time on a 100k-task graph. What a walk drops is freed by reference
    counting; only cyclic garbage waits until the collector runs again after it.

    While paused, the collector counts as on for `interpreter_get` and the baseline: a
    snapshot or a task's settings taken during a walk must not record ``gc.disable()`` the
    notebook never made. A notebook's own ``gc.disable()`` put during the pause (a replay)
    is kept when it ends. Nested uses and a collector already off are left as they are.
    """
    global _collector_paused
    if _collector_paused or not gc.isenabled():
        yield
        return
    gc.disable()
    _collector_paused = True
    try:
        yield
    finally:
        if _collector_paused:
            _collector_paused = False
            gc.enable()


def note_baseline() -> None:
    """Remember the process's own values, once: only a notebook's changes are state."""
    global _BASELINE
    if _BASELINE is None:
        _BASELINE = {
            "interpreter": _interpreter_now(),
            "zone": _zone_now(),
            "TZ": os.environ.get("TZ"),
            "logging": _root_now(),
            "loggers": _named_now(),
            "disable": logging.root.manager.disable,
            "socket": _socket_now(),
            "locale": _locale_now(),
        }
        display_get()


def _baseline(key: str) -> Any:
    note_baseline()
    assert _BASELINE is not None
    return _BASELINE[key]


# -- recursion limit, int digits, umask ----------------------------------------------


def _umask() -> int:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it, and put it straight back
    os.umask(mask)
    return mask


def _interpreter_now() -> dict[str, int]:
    now = {"recursionlimit": sys.getrecursionlimit(), "umask": _umask(), "gc": int(gc.isenabled() or _collector_paused)}
    if hasattr(sys, "get_int_max_str_digits"):
        now["int_max_str_digits"] = sys.get_int_max_str_digits()
    return now


def interpreter_get() -> dict[str, int]:
    """The recursion limit, int-to-str digit limit, umask and whether the cyclic garbage
    collector runs, where the notebook changed them."""
    start = _baseline("interpreter")
    return {k: v for k, v in _interpreter_now().items() if start.get(k) != v}


def interpreter_put(snapshot: dict[str, int]) -> None:
    global _collector_paused
    start = _baseline("interpreter")
    wanted = {**start, **snapshot}
    now = _interpreter_now()
    if now["recursionlimit"] != wanted["recursionlimit"]:
        sys.setrecursionlimit(wanted["recursionlimit"])
    if now["umask"] != wanted["umask"]:
        os.umask(wanted["umask"])
    if "int_max_str_digits" in wanted and now.get("int_max_str_digits") != wanted["int_max_str_digits"]:
        sys.set_int_max_str_digits(wanted["int_max_str_digits"])
    if now["gc"] != wanted.get("gc", now["gc"]):
        if wanted["gc"]:
            gc.enable()
        else:
            _collector_paused = False  # stays off when the pause ends
            gc.disable()


# -- socket default timeout, locale ----------------------------------------------------


def _socket_now() -> float | None:
    socket = sys.modules.get("socket")
    return None if socket is None else socket.getdefaulttimeout()


def socket_get() -> dict[str, float | None]:
    """``socket.getdefaulttimeout()``, if the notebook changed it."""
    now = _socket_now()
    return {} if now == _baseline("socket") else {"timeout": now}


def socket_put(snapshot: dict[str, float | None]) -> None:
    import socket

    wanted = snapshot["timeout"] if snapshot else _baseline("socket")
    if socket.getdefaulttimeout() != wanted:
        socket.setdefaulttimeout(wanted)


def _locale_now() -> str:
    return locale.setlocale(locale.LC_ALL)  # no second argument: a query, nothing is set


def locale_get() -> dict[str, str]:
    """The C library's locale (every category, as ``setlocale`` names it), if the notebook changed it."""
    now = _locale_now()
    return {} if now == _baseline("locale") else {"LC_ALL": now}


def locale_put(snapshot: dict[str, str]) -> None:
    wanted = snapshot["LC_ALL"] if snapshot else _baseline("locale")
    if _locale_now() != wanted:
        locale.setlocale(locale.LC_ALL, wanted)


# -- time zone -----------------------------------------------------------------------


def _zone_now() -> list[Any]:
    return [list(time.tzname), time.timezone, time.altzone, time.daylight]


def time_zone_get() -> dict[str, Any]:
    """The zone ``time.tzset`` applied and the ``TZ`` it read, if not the process's own."""
    zone = _zone_now()
    if zone == _baseline("zone"):
        return {}
    return {"TZ": os.environ.get("TZ"), "zone": zone}


def time_zone_put(snapshot: dict[str, Any]) -> None:
    wanted_zone = snapshot.get("zone", _baseline("zone"))
    if _zone_now() == wanted_zone:
        return
    tz = snapshot["TZ"] if snapshot else _baseline("TZ")
    if tz is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = tz
    time.tzset()


# -- the root logger -----------------------------------------------------------------

_STREAMS = ("stderr", "stdout")


def _handler(handler: logging.Handler) -> tuple[Any, ...] | None:
    """A handler as plain values, or None when it is not one `logging_put` can make again."""
    formatter = handler.formatter
    fmt = None
    if formatter is not None:
        if type(formatter) is not logging.Formatter:
            return None
        style_class: Any = type(formatter._style)
        style = next((k for k, v in logging._STYLES.items() if style_class is v[0]), None)
        if style is None:
            return None
        fmt = (formatter._fmt, formatter.datefmt, style)
    if handler.filters:
        return None
    kind = type(handler)
    if kind is logging.FileHandler:
        assert isinstance(handler, logging.FileHandler)
        target: Any = ("file", handler.baseFilename, handler.encoding)
    elif kind is logging.StreamHandler:
        stream = getattr(handler, "stream", None)
        names = [n for n in _STREAMS if stream is getattr(sys, n) or stream is getattr(sys, f"__{n}__")]
        if not names:
            return None
        target = ("stream", names[0])
    else:
        return None
    return (target, handler.level, fmt)


def _own(handler: logging.Handler) -> bool:
    """Whether a root handler is the notebook's, not a test runner's capture (pytest adds
    and removes its own around every test phase)."""
    return not type(handler).__module__.startswith("_pytest")


def _root_now() -> dict[str, Any]:
    root = logging.getLogger()
    handlers = [_handler(h) for h in root.handlers if _own(h)]
    return {"level": root.level, "handlers": handlers, "filters": bool(root.filters)}


def logging_get() -> dict[str, Any]:
    """The root logger's level and handlers, if not as the process started.

    A handler of another kind (a filter, a custom formatter, a rotating file) is
    described as None, which makes the snapshot unstorable: the cell then always
    runs, as it must when its effect cannot be made again.
    """
    now = _root_now()
    if now == _baseline("logging"):
        return {}
    if now["filters"] or any(h is None for h in now["handlers"]):
        root = logging.getLogger()
        kinds = ",".join(f"{type(h).__module__}.{type(h).__qualname__}" for h in root.handlers if _own(h))
        return {"unrestorable": _Unrestorable(f"level {root.level}, handlers {kinds}")}
    return now


class _Unrestorable:
    """Refuses pickling, so a snapshot holding it cannot be stored; its repr (what the
    digest reads) names the configuration, never an address."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<logging configured: {self.what}>"

    def __reduce__(self) -> Any:
        raise TypeError("a logging handler that cannot be made again")


def logging_put(snapshot: dict[str, Any]) -> None:
    if "unrestorable" in snapshot:
        return  # only ever captured in this process, never stored: nothing to make again
    wanted = snapshot or _baseline("logging")
    if _root_now() == wanted:
        return
    root = logging.getLogger()
    for old in [h for h in root.handlers if _own(h)]:
        root.removeHandler(old)
        old.close()  # as basicConfig(force=True) does: a file handler lets go of its file
    for described in wanted["handlers"]:
        root.addHandler(_make_handler(described))
    root.setLevel(wanted["level"])


def _make_handler(described: Any) -> logging.Handler:
    """A handler made again from `_handler`'s description of it."""
    target, level, fmt = described
    if target[0] == "file":
        handler: logging.Handler = logging.FileHandler(target[1], mode="a", encoding=target[2])
    else:
        handler = logging.StreamHandler(getattr(sys, target[1]))
    handler.setLevel(level)
    if fmt is not None:
        handler.setFormatter(logging.Formatter(fmt[0], fmt[1], style=fmt[2]))
    return handler


# -- the notebook's named loggers ------------------------------------------------------


def _library_logger(name: str, set_up_by_distributed: set[str]) -> bool:
    """Whether logger `name` is a library's (named after a loaded installed or standard
    module): libraries configure their loggers when imported, which a replay does not do,
    so their configuration is not the notebook's state."""
    top = name.partition(".")[0]
    if top == "__main__":
        return False
    if top == "nbrewind":
        return True  # the tool's own logger, wherever it is installed from
    if top in set_up_by_distributed:
        return True  # "bokeh", "tornado": loaded or not
    module = sys.modules.get(top)
    if module is None:
        return _installed(top)
    file = getattr(module, "__file__", None)
    return not isinstance(file, str) or library_kind(file) is not None


def _named_by_dask_config() -> set[str]:
    """The top-level logger names distributed sets up when imported: its built-in defaults
    (`distributed.config`: "bokeh" and "tornado" besides its own, whether they are installed
    or not) and the ``logging`` section of dask's configuration."""
    if "distributed" not in sys.modules:
        return set()
    out = {"bokeh", "tornado"}
    config = getattr(sys.modules.get("dask.config"), "config", {})
    for section in (config.get("logging"), config.get("distributed", {}).get("logging")):
        if isinstance(section, dict):
            names = section.get("loggers", {}) if "version" in section else section
            if isinstance(names, dict):
                out.update(str(n).partition(".")[0] for n in names)
    return out


@functools.lru_cache(maxsize=1024)
def _installed(top: str) -> bool:
    """Whether a module not loaded yet would be imported as `top` from an installed library."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None)
    return isinstance(origin, str) and library_kind(origin) is not None


def _named_now() -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_distributed = _named_by_dask_config()
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger):
            continue
        if logger.level == logging.NOTSET and logger.propagate and not logger.disabled and not logger.handlers and not logger.filters:
            continue
        if _library_logger(name, by_distributed):
            continue
        out[name] = {
            "level": logger.level, "propagate": logger.propagate, "disabled": logger.disabled,
            "handlers": [_handler(h) for h in logger.handlers], "filters": bool(logger.filters),
        }
    return out


_DEFAULT_LOGGER = {"level": logging.NOTSET, "propagate": True, "disabled": False, "handlers": [], "filters": False}


def loggers_get() -> dict[str, Any]:
    """The notebook's own named loggers (``logging.getLogger("nb")``, not a library's) whose
    level, propagation, handlers or filters differ from the process's start, and the level
    ``logging.disable`` set.

    As for the root logger, one that `loggers_put` could not make again (a filter, a custom
    handler or formatter) makes the snapshot unstorable, so the cell always runs; what the
    digest reads still names every level and handler kind.
    """
    now = _named_now()
    base = _baseline("loggers")
    changed = {n: v for n, v in now.items() if base.get(n) != v}
    reset = sorted(n for n in base if n not in now)
    disable = logging.root.manager.disable
    if not changed and not reset and disable == _baseline("disable"):
        return {}
    snapshot: dict[str, Any] = {"loggers": changed, "reset": reset, "disable": disable}
    bad = sorted(n for n, v in changed.items() if v["filters"] or any(h is None for h in v["handlers"]))
    if bad:
        kinds = "; ".join(
            f"{n}: " + ",".join(f"{type(h).__module__}.{type(h).__qualname__}" for h in logging.getLogger(n).handlers)
            for n in bad
        )
        snapshot["unrestorable"] = _Unrestorable(kinds)
    return snapshot


def loggers_put(snapshot: dict[str, Any]) -> None:
    if "unrestorable" in snapshot:
        return  # only ever captured in this process, never stored: nothing to make again
    logging.disable(snapshot.get("disable", _baseline("disable")))
    base = _baseline("loggers")
    reset = set(snapshot.get("reset", ()))
    wanted = {**{n: v for n, v in base.items() if n not in reset}, **snapshot.get("loggers", {})}
    now = _named_now()
    for name in sorted(set(now) | set(wanted)):
        want = wanted.get(name, _DEFAULT_LOGGER)
        if now.get(name, _DEFAULT_LOGGER) == want:
            continue
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
            old.close()
        for described in want["handlers"]:
            logger.addHandler(_make_handler(described))
        logger.setLevel(want["level"])
        logger.propagate = want["propagate"]
        logger.disabled = want["disabled"]


# -- IPython's display -------------------------------------------------------------------

# Per formatter, the tables a notebook registers printers in (``for_type``,
# ``for_type_by_name``). ``singleton_printers`` is keyed by object ids, which another
# process does not share; notebooks leave it alone.
_PRINTER_TABLES = ("type_printers", "deferred_printers")
_display_baselines: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return get() if get is not None else None


def _display_now(shell: Any) -> dict[str, Any]:
    formatters = shell.display_formatter
    now: dict[str, Any] = {
        "interactivity": shell.ast_node_interactivity,
        "active_types": list(formatters.active_types),
        "xmode": getattr(shell.InteractiveTB, "mode", None),
    }
    for mime, formatter in sorted(formatters.formatters.items()):
        entry: dict[str, Any] = {"enabled": formatter.enabled}
        for table in _PRINTER_TABLES:
            entry[table] = dict(getattr(formatter, table))
        if hasattr(formatter, "float_precision"):
            entry["float_precision"] = formatter.float_precision
            entry["pprint"] = formatter.pprint
        now[mime] = entry
    return now


def _same(a: Any, b: Any) -> bool:
    """Equal, a function compared by identity (a lambda compares equal to nothing else)."""
    if type(a) is dict and type(b) is dict:
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if callable(a) or callable(b):
        return a is b
    return bool(a == b)


def display_get() -> dict[str, Any]:
    """IPython's display configuration where the notebook changed it: which expressions show
    (``ast_node_interactivity``), how tracebacks look (``%xmode``), ``%precision``, ``%pprint``, the printers a cell
    registered with ``for_type`` and which formatters are on. Empty outside IPython."""
    shell = _shell()
    if shell is None:
        return {}
    now = _display_now(shell)
    base = _display_baselines.setdefault(shell, now)
    if base is now:
        return {}
    out: dict[str, Any] = {}
    for key, value in now.items():
        if type(value) is dict:
            changed = {k: v for k, v in value.items() if not _same(v, base.get(key, {}).get(k))}
            if changed:
                out[key] = changed
        elif not _same(value, base.get(key)):
            out[key] = value
    return out


def display_put(snapshot: dict[str, Any]) -> None:
    shell = _shell()
    if shell is None:
        return
    now = _display_now(shell)
    base = _display_baselines.setdefault(shell, now)
    wanted = {k: snapshot.get(k, v) if type(v) is not dict else {**v, **snapshot.get(k, {})} for k, v in base.items()}
    wanted.update({k: v for k, v in snapshot.items() if k not in wanted})
    if shell.ast_node_interactivity != wanted["interactivity"]:
        shell.ast_node_interactivity = wanted["interactivity"]
    if wanted.get("xmode") is not None and shell.InteractiveTB.mode != wanted["xmode"]:
        shell.InteractiveTB.set_mode(wanted["xmode"])
    if list(shell.display_formatter.active_types) != wanted["active_types"]:
        shell.display_formatter.active_types = list(wanted["active_types"])
    for mime, formatter in shell.display_formatter.formatters.items():
        want = wanted.get(mime)
        if want is None:
            continue
        for table in _PRINTER_TABLES:
            live = getattr(formatter, table)
            if not _same(dict(live), want[table]):
                live.clear()
                live.update(want[table])
        if formatter.enabled != want["enabled"]:
            formatter.enabled = want["enabled"]
        if "float_precision" in want and formatter.float_precision != want["float_precision"]:
            formatter.float_precision = want["float_precision"]
        if "pprint" in want and formatter.pprint != want["pprint"]:
            formatter.pprint = want["pprint"]
