"""State outside the namespace that cell keys depend on and replays must restore:
library settings, the user's own modules, and what a cell read of the world.

The pseudo-inputs it computes are in `OWNED`; their names are built and parsed by
`session.pseudo`, which lists every kind.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import inspect
import sys
import types
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.serialize import Unserializable, restoring_into
from nbrewind.checkpoint.values import load_group, stage_group
from nbrewind.checkpoint.world import listing_key, stat_key
from nbrewind.identity import settings as settings_registry
from nbrewind.identity.code import code_info
from nbrewind.identity.imports import AfterImport, after_import
from nbrewind.identity.modules import is_local_module, local_modules, module_source_path, source_digest
from nbrewind.session import libcalls, patches, pseudo
from nbrewind.session.pseudo import ABSENT, Pseudo
from nbrewind.session.state import HIDDEN, Entry
from nbrewind.store.digest import digest_bytes
from nbrewind.store.objects import ObjectStore

SYS_PATH = "sys.path"
"""The setting replayed cells put back at once (see `Outside.apply`)."""
SYS_PATH_INPUT = pseudo.name(Pseudo.SETTING, SYS_PATH)

IMPURE = pseudo.name(Pseudo.IMPURE)

#: The pseudo-inputs this module computes the keys of.
OWNED = frozenset(
    {Pseudo.SETTING, Pseudo.SOURCE, Pseudo.MODULE_STATE, Pseudo.LISTING, Pseudo.STAT, Pseudo.KIND, Pseudo.IMPURE, Pseudo.PATCHES}
)
PATCHES = pseudo.name(Pseudo.PATCHES)
# Names through which code reads a global RNG's state without drawing from it
# (`random.getstate()`, `np.random.get_state()`, the generators behind the module
# functions). A draw changes the state and is seen without them; seeding and making
# a new generator (`default_rng(7)`, `random.Random()`) do not read the global state.
RNG_NAMES = frozenset({"getstate", "get_state", "_inst", "_rand", "get_bit_generator"})


def note_impure(inputs: dict[str, str], reasons: list[str]) -> None:
    """Add `reasons` why a replay could not do what the cell did to its `inputs` (with any already there)."""
    if reasons:
        had = [inputs[IMPURE]] if IMPURE in inputs else []
        inputs[IMPURE] = "; ".join(sorted({*had, *reasons}))


def owns(name: str) -> bool:
    """Whether `name` is a pseudo-input this module computes."""
    parsed = pseudo.parse(name)
    return parsed is not None and parsed[0] in OWNED


class Outside:
    """Computes keys of the outside state and stages and applies its snapshots.

    `rel` / `absolute` turn paths into the portable form used in names and back.
    """

    def __init__(
        self,
        objects: ObjectStore,
        entries: dict[str, Entry],
        rel: Callable[[str], str],
        absolute: Callable[[str], str],
        warn: Callable[[str, BaseException], None],
        namespace: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.objects = objects
        self._namespace = namespace
        self._warn = warn
        self.entries = entries
        self.rel = rel
        self.absolute = absolute
        self.pending_settings: dict[str, Entry] = {}
        self._waiting: dict[str, AfterImport] = {}
        """Libraries not loaded yet whose pending settings wait for their first import, by top-level package."""
        self._unapplied: list[str] = []
        """Settings that could not be put back at an import: the next cell that runs is not replayable."""
        self._patched: dict[tuple[int, str | None], tuple[Any, str | None]] = {}
        """Library attributes cells of this session patched (the objects held, so ids stay theirs)."""
        self._calls: dict[str, str] = {}
        """Library calls cells of this session made for their effect (`libcalls`): text -> key."""
        self.imports = libcalls.Imports()
        """Which notebook names imports bound (`libcalls`)."""
        self._caches_before: dict[str, Any] = {}
        """``cache_infos`` of the local modules before the running cell."""
        self.code_names: set[str] = set()
        """Globals read by the notebook's functions that settings or patched libraries hold
        (a formatter): whenever a cell runs, they must be in the namespace."""
        settings_registry.note_baselines()

    # -- keys -------------------------------------------------------------------------

    def key(self, kind: Pseudo, arg: str) -> str:
        """The digest the pseudo-input `kind`/`arg` has now (compare with a recorded input)."""
        if kind is Pseudo.IMPURE:
            return ""  # never equal to a recorded reason: an impure cell always runs
        if kind is Pseudo.PATCHES:
            return self.patches_key() or ABSENT
        if kind is Pseudo.SETTING:
            return self.setting_keys([arg]).get(arg, ABSENT)
        if kind is Pseudo.SOURCE:
            return self._source_key(arg)
        if kind is Pseudo.MODULE_STATE:
            module = sys.modules.get(arg)
            return module_state_key(module) if module is not None else ABSENT
        if kind is Pseudo.LISTING:
            return listing_key(self.absolute(arg))
        if kind is Pseudo.STAT:
            return stat_key(self.absolute(arg))
        if kind is Pseudo.KIND:
            return stat_key(self.absolute(arg), kind_only=True)
        return ABSENT

    def setting_keys(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """Current digest of each setting: pending (replayed, not applied yet), live, or ABSENT."""
        wanted = [s.name for s in settings_registry.REGISTRY] if names is None else list(names)
        live = settings_registry.settings_digests([s for s in settings_registry.REGISTRY if s.name in wanted])
        if live is None:
            # Unreadable now: a key no record can match, so the cell runs.
            return {name: f"unreadable|{uuid.uuid4().hex}" for name in wanted}
        out = {}
        for name in wanted:
            pending = self.pending_settings.get(name)
            out[name] = pending.key if pending is not None else live.get(name, ABSENT)
        return out

    def note_patched(self, sites: Iterable[tuple[Any, str | None]]) -> None:
        """Remember library attributes a cell patched: every later cell is keyed on them."""
        for obj, attr in sites:
            self._patched[(id(obj), attr)] = (obj, attr)
            held = vars(obj) if attr is None else {attr: inspect.getattr_static(obj, attr, None)}
            self.code_names |= settings_registry.notebook_code_names(list(held.values()))

    def note_library_calls(self, calls: Mapping[str, str]) -> None:
        """Remember calls a cell made that change what a library keeps: every later cell is
        keyed on them (`libcalls`)."""
        self._calls.update(calls)

    def patches_key(self) -> str | None:
        """What the patched library attributes hold now, and which calls changed what
        libraries keep; None while no cell did either."""
        if not self._patched and not self._calls:
            return None
        try:
            sites = patches.sites_key(self._patched.values()) if self._patched else ""
        except Exception:  # noqa: BLE001 - a patched value we cannot read: a key nothing matches
            return f"unreadable|{uuid.uuid4().hex}"
        return sites if not self._calls else digest_bytes(f"{sites}\0{libcalls.calls_key(self._calls)}".encode())

    def _source_key(self, module_name: str) -> str:
        module = sys.modules.get(module_name)
        path = module_source_path(module) if module is not None else None
        if path is None:
            try:
                spec = importlib.util.find_spec(module_name)
            except (ImportError, ValueError):
                return ABSENT
            path = spec.origin if spec is not None else None
        return (source_digest(path) or ABSENT) if path else ABSENT

    def before(self) -> dict[str, str]:
        """Inputs every cell has: each setting, and each loaded local module's source and state."""
        inputs = {pseudo.name(Pseudo.SETTING, k): v for k, v in self.setting_keys().items()}
        patched = self.patches_key()
        if patched is not None:
            inputs[PATCHES] = patched
        modules = local_modules()
        for name, module in modules.items():
            inputs[pseudo.name(Pseudo.SOURCE, name)] = self._source_key(name)
            inputs[pseudo.name(Pseudo.MODULE_STATE, name)] = module_state_key(module)
        self._caches_before = cache_infos(modules) if modules else {}
        return inputs

    # -- after a cell ran -----------------------------------------------------------------

    def after(self, before: Mapping[str, str], inputs: dict[str, str], changed: dict[str, Entry], staged: list[Any]) -> tuple[int, list[str]]:
        """Add what the cell changed outside the namespace to `changed` (staging snapshots).

        Returns (bytes staged, reasons the cell cannot be replayed).
        """
        written = 0
        impure: list[str] = list(self._unapplied)
        self._unapplied.clear()
        modules = local_modules()
        for label, info in (cache_infos(modules) if modules else {}).items():
            was = self._caches_before.get(label)
            used = (info.hits, info.misses) != ((was.hits, was.misses) if was is not None else (0, 0))
            if used:
                impure.append(f"uses the cache of {label}, which a replay cannot fill")
        now = self.setting_keys()
        # A pending setting (restored by `%nbrewind restore` in this cell, not applied yet)
        # is already an entry: only live changes are this cell's.
        moved = [
            n for n, key in now.items()
            if before.get(pseudo.name(Pseudo.SETTING, n)) != key and key != ABSENT and n not in self.pending_settings
        ]
        if moved:
            snapshots = settings_registry.capture_settings(moved)
            for name in moved:
                result = stage_group(self.objects, {"snapshot": snapshots[name]})
                if isinstance(result, Unserializable):
                    impure.append(f"changes the {name} setting to a value that cannot be stored")
                    continue
                staged.append(result)
                written += result.new_bytes
                extra: dict[str, Any] = {"what": "setting", "setting": name}
                code_names = settings_registry.notebook_code_names(snapshots[name])
                if code_names:
                    extra["code_names"] = sorted(code_names)
                    self.code_names |= code_names
                changed[pseudo.name(Pseudo.SETTING, name)] = Entry(result.digest, HIDDEN, now[name], (), extra)
        for name, module in modules.items():
            source = pseudo.name(Pseudo.SOURCE, name)
            if source not in before:  # imported by this cell: it depended on the file it loaded
                inputs[source] = self._source_key(name)
            state = module_state_key(module)
            if before.get(pseudo.name(Pseudo.MODULE_STATE, name), "") == state:
                continue
            result = stage_group(self.objects, module_data(module))
            if isinstance(result, Unserializable):
                if pseudo.name(Pseudo.MODULE_STATE, name) in before:
                    impure.append(f"changes module {name}, whose state cannot be stored")
                continue
            staged.append(result)
            written += result.new_bytes
            changed[pseudo.name(Pseudo.MODULE_STATE, name)] = Entry(result.digest, HIDDEN, state, (), {"what": "mstate", "module": name})
        return written, impure

    def world_inputs(self, tracker: Any, env_before: Mapping[str, str], inputs: dict[str, str], env_key: Callable[[str | None], str]) -> None:
        """Listings, stats and environment variables the cell read (`checkpoint.world.WorldTracker`)."""
        for path, key in sorted(tracker.listings.items()):
            inputs[pseudo.name(Pseudo.LISTING, self.rel(path))] = key
        for path, key in sorted(tracker.stats.items()):
            inputs[pseudo.name(Pseudo.STAT, self.rel(path))] = key
        for path, key in sorted(tracker.kinds.items()):
            if path not in tracker.stats:  # a full stat says more
                inputs[pseudo.name(Pseudo.KIND, self.rel(path))] = key
        names = set(tracker.env_reads) | (set(env_before) if tracker.env_listed else set())
        for var in sorted(names):
            inputs[pseudo.name(Pseudo.ENV, var)] = env_key(env_before.get(var))
        if tracker.impure:
            inputs[IMPURE] = "; ".join(tracker.impure)

    # -- replay -----------------------------------------------------------------------------

    def apply(self, entry: Entry) -> bool:
        """Restore a written entry of this module's kinds; False if `entry` is not one."""
        what = entry.extra.get("what")
        if what == "setting":
            self.code_names.update(entry.extra.get("code_names", ()))
            if entry.extra["setting"] == SYS_PATH:
                # Now: it imports nothing, and a local module a replayed import brings back
                # (or that the next cell's key looks up) is found where the notebook put it.
                self._apply_setting(entry)
                return True
            # Applied when a cell runs (`apply_pending`): a replayed cell runs no code, and
            # restoring a setting can import its library (pandas options, or warnings
            # filters naming pandas' warning classes), which a replay must not pay for.
            self.pending_settings[entry.extra["setting"]] = entry
            return True
        if what == "mstate":
            module = importlib.import_module(entry.extra["module"])
            put_module_data(module, load_group(self.objects, entry.digest))
            return True
        return False

    def _apply_setting(self, entry: Entry) -> None:
        if self._namespace is not None:
            # A formatter the notebook defined reads the notebook's globals, not a copy.
            with restoring_into(self._namespace()):
                snapshot = load_group(self.objects, entry.digest)["snapshot"]
        else:
            snapshot = load_group(self.objects, entry.digest)["snapshot"]
        settings_registry.apply_settings({entry.extra["setting"]: snapshot})
        self.pending_settings.pop(entry.extra["setting"], None)

    def apply_pending(self) -> None:
        """Before a cell runs: put back the settings replayed cells made.

        A setting of a library that is not loaded is put back right after the library's
        first import instead (by the cell, or by a value restored later), so a cell that
        never imports it does not pay for importing it (dask: 0.1-0.3 s). Until then the
        setting's key is the pending one, which is what the library will have when it
        is loaded."""
        for entry in list(self.pending_settings.values()):
            top = _library(entry)
            if top in sys.modules:
                self._apply_setting(entry)
            elif top not in self._waiting:
                hook = after_import(top, self._imported)
                if hook is not None:
                    self._waiting[top] = hook

    def _imported(self, module: types.ModuleType) -> None:
        """A library with pending settings was just imported: put them back before the
        importer gets it. A failure must not fail the import: the running cell is then
        kept from being replayed (`after`)."""
        self._waiting.pop(module.__name__, None)
        for entry in list(self.pending_settings.values()):
            if _library(entry) != module.__name__:
                continue
            try:
                self._apply_setting(entry)
            except Exception as exc:  # noqa: BLE001 - reported, and the cell is not recorded as replayable
                name = entry.extra["setting"]
                self.pending_settings.pop(name, None)
                self._unapplied.append(f"could not put back the {name} setting a replayed cell made")
                self._warn(f"could not put back the {name} setting a replayed cell made; this cell will not be replayed", exc)

    def close(self) -> None:
        """Stop waiting for imports."""
        for hook in self._waiting.values():
            hook.remove()
        self._waiting.clear()


def _library(entry: Entry) -> str:
    """The top-level package of the library a setting entry belongs to."""
    name = entry.extra["setting"]
    module = next((s.module for s in settings_registry.REGISTRY if s.name == name), name)
    return module.partition(".")[0]


def module_data(module: types.ModuleType) -> dict[str, Any]:
    """A local module's data: its attributes other than dunders and modules, and the state
    its own functions and classes hold (their code is its source, keyed by `@src:`): a
    class attribute (``Registry.items``), a function's defaults (``def add(x, acc=[])``),
    attributes (``f.calls``) and closure. Those sit under ``@``-names (`put_module_data`)."""
    out: dict[str, Any] = {}
    for key, value in vars(module).items():
        if key.startswith("__") or isinstance(value, types.ModuleType) or type(value).__module__ == "__future__":
            continue  # `from __future__ import annotations` binds a compiler flag, not data
        if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == module.__name__:
            _code_state(key, value, out, module.__name__)
            continue
        out[key] = value
    return out


# Entries of a class's dict that are the interpreter's or a library's bookkeeping, not state
# the module's code keeps there (an ABC's registry cannot even be pickled).
_CLASS_BOOKKEEPING = frozenset({"_abc_impl", "_abc_registry", "_abc_cache", "_abc_negative_cache", "_abc_negative_cache_version"})
_CODE_LIKE = (types.FunctionType, classmethod, staticmethod, property, type, types.MethodType, types.BuiltinFunctionType)


def _code_state(key: str, value: Any, out: dict[str, Any], module: str) -> None:
    if isinstance(value, type):
        if type(value) not in (type, abc.ABCMeta):
            return  # a library's metaclass keeps its own bookkeeping in the class (traitlets, pydantic, enum)
        for attr, item in list(vars(value).items()):
            if attr.startswith("__") or attr in _CLASS_BOOKKEEPING or isinstance(item, _CODE_LIKE) or hasattr(type(item), "__get__"):
                continue  # methods and descriptors are code; the lru cache of a method is `cache_infos`'
            out[f"@class:{key}.{attr}"] = item
        return
    if value.__defaults__:
        out[f"@defaults:{key}"] = value.__defaults__
    if value.__kwdefaults__:
        out[f"@kwdefaults:{key}"] = dict(value.__kwdefaults__)
    # The module's own functions a decorator holds (``__wrapped__``, a closure) are code,
    # keyed by its source: only what they are is noted, never pickled by value.
    attributes = {k: _CodeOf(v) if _own_code(v, module) else v for k, v in value.__dict__.items()}
    if attributes:
        out[f"@dict:{key}"] = attributes
    if value.__closure__:
        cells = tuple(_cell_contents(c) for c in value.__closure__)
        out[f"@closure:{key}"] = tuple(_CodeOf(c) if _own_code(c, module) else c for c in cells)


def _own_code(value: Any, module: str) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ == module


class _CodeOf:
    """Stands for one of the module's functions in its code state: its name, not its pickle."""

    def __init__(self, func: types.FunctionType) -> None:
        self.name = func.__qualname__

    def __reduce__(self) -> tuple[Any, ...]:
        return (_CodeOf.__new__, (_CodeOf,), {"name": self.name})


class _EmptyCell:
    """A closure cell without a value."""


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EmptyCell


def put_module_data(module: types.ModuleType, data: Mapping[str, Any]) -> None:
    """Make a local module's data what `module_data` read (plain names, then code state)."""
    module.__dict__.update({k: v for k, v in data.items() if not k.startswith("@")})
    for key, value in data.items():
        if not key.startswith("@"):
            continue
        kind, _, rest = key[1:].partition(":")
        if kind == "class":
            name, _, attr = rest.partition(".")
            setattr(getattr(module, name), attr, value)
            continue
        func = getattr(module, rest)
        if kind == "defaults":
            func.__defaults__ = value
        elif kind == "kwdefaults":
            func.__kwdefaults__ = value
        elif kind == "dict":
            func.__dict__.update({k: v for k, v in value.items() if not isinstance(v, _CodeOf)})
        elif kind == "closure":
            for cell, item in zip(func.__closure__ or (), value):
                if item is not _EmptyCell and not isinstance(item, _CodeOf):
                    cell.cell_contents = item


def cache_infos(modules: Mapping[str, types.ModuleType]) -> dict[str, Any]:
    """``cache_info()`` of every ``functools.lru_cache``/``cache`` of local modules (module
    functions and methods of their classes), by dotted name. Their content cannot be read,
    stored or compared: a cell that used one (a hit or a miss) cannot be replayed."""
    out = {}
    for name, module in modules.items():
        for key, value in list(vars(module).items()):
            holders = [(key, value)]
            if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                holders += [(f"{key}.{attr}", item) for attr, item in list(vars(value).items())]
            for label, item in holders:
                item = getattr(item, "__func__", item)
                info = getattr(item, "cache_info", None)
                if callable(info) and hasattr(item, "cache_clear"):
                    try:
                        out[f"{name}.{label}"] = info()
                    except Exception:  # noqa: BLE001 - not functools' cache after all
                        continue
    return out


def module_state_key(module: types.ModuleType | None) -> str:
    """Digest of a local module's data attributes (its code is keyed by ``@src:``)."""
    if module is None or not is_local_module(module):
        return ABSENT
    data = module_data(module)
    digest = digest_value(data)
    if isinstance(digest, Unserializable):
        # Keyed by which names hold unstorable values: their content cannot be compared.
        parts = []
        for key in sorted(data):
            d = digest_value(data[key])
            parts.append(f"{key}={d if isinstance(d, str) else 'unserializable:' + d.type_name}")
        return f"partial|{digest_value(parts)}"
    return digest


def touches_rng(code_names: Iterable[str]) -> bool:
    """Whether code using these names may read or set a global RNG without drawing from it."""
    return not RNG_NAMES.isdisjoint(code_names)


def code_names(obj: Any) -> set[str]:
    """Every name a function's code (and its nested code) refers to (`identity.code`)."""
    code = getattr(obj, "__code__", None)
    return set(code_info(code).names) if isinstance(code, types.CodeType) else set()


def installed_modules(names: Iterable[str], namespace: Mapping[str, Any]) -> list[types.ModuleType]:
    """The installed (not local) modules that `names` are bound to."""
    out = []
    for name in names:
        value = dict.get(namespace, name) if isinstance(namespace, dict) else namespace.get(name)
        if isinstance(value, types.ModuleType) and not is_local_module(value):
            out.append(value)
    return out


def bindings(modules: Iterable[types.ModuleType]) -> dict[str, dict[str, int]]:
    """Which object each attribute of these modules is bound to (ids: compared within this process only)."""
    return {m.__name__: {k: id(v) for k, v in list(vars(m).items())} for m in modules}


def rebound_modules(before: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Modules of `before` (from `bindings`) an attribute of which was bound, rebound or deleted since.

    `somelib.attr = v` is such a change; a replay cannot restore it, so the cell must run.
    Changes inside an attribute's object (`os.environ[k] = v`) are not: the ones that
    matter are tracked as environment variables and settings.
    """
    out = []
    for name, was in before.items():
        module = sys.modules.get(name)
        if module is None or bindings([module])[name] != was:
            out.append(name)
    return out
