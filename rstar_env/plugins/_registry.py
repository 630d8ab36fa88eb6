"""The plugin registry: a pluggy ``PluginManager`` and the name -> class tables derived from it."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import threading
import warnings
from typing import Any

import pluggy

from rstar_env.runtime import runtime

from . import _options
from ._errors import FailedPlugin, PluginError, PluginInfo, PluginLoadWarning, qualname
from ._hookspecs import HOOKS, PROJECT, SIGNATURE_METHOD, PluginKind, PluginSpecs, hookimpl


class _ClassPlugin:
    """Adapts a bare plugin class passed to ``register()`` to the hookspecs."""

    def __init__(self, cls: type, kind: PluginKind) -> None:
        self.cls = cls
        self.kind = kind
        setattr(self, HOOKS[kind], hookimpl(specname=HOOKS[kind])(lambda: [cls]))


class PluginRegistry:
    """Owns a pluggy ``PluginManager`` and the name -> class tables derived from it.

    Each entry point is loaded on its own: one that fails to import, defines a hook that does not exist, or
    provides an invalid plugin (no name, a name already taken) is skipped with one :class:`PluginLoadWarning` and
    listed in :attr:`failed`; every other plugin keeps working. The process's registry is the runtime's
    (:func:`rstar_env.plugins.get_registry`); a registry built here is independent of it (for a fresh scan, a test).
    """

    def __init__(self, *, load_entrypoints: bool = True) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(PluginSpecs)
        self.failed: list[FailedPlugin] = []
        # Registered plugin objects in order, with where each came from and the infos it provides.
        self._entries: list[tuple[Any, str, list[PluginInfo]]] = []
        self._lock = threading.RLock()
        runtime().on_fork(self._after_fork_in_child)
        if load_entrypoints:
            self._load_entrypoints()

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the lock at the fork: the child's copy would stay held forever.
        self._lock = threading.RLock()

    def _load_entrypoints(self) -> None:
        seen: set[tuple[str, str]] = set()
        for ep in importlib.metadata.entry_points(group=PROJECT):
            if (ep.name, ep.value) in seen:  # one distribution seen twice on sys.path (an editable install, ...)
                continue
            seen.add((ep.name, ep.value))
            dist = ep.dist.name if ep.dist is not None else "(unknown distribution)"
            where = f"{ep.name} = {ep.value}"
            try:
                plugin = ep.load()
            except BaseException as exc:  # an import may raise anything, SystemExit included: isolate it
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self._skip(FailedPlugin(dist, where, f"import failed: {type(exc).__name__}: {exc}"))
                continue
            if self.pm.get_plugin(ep.name) is not None:
                self._skip(FailedPlugin(dist, where, f"another entry point is already named {ep.name!r}"))
                continue
            try:
                self._add(plugin, dist, name=ep.name)
            except PluginError as exc:
                self._skip(FailedPlugin(dist, where, str(exc)))

    def _skip(self, failure: FailedPlugin) -> None:
        self.failed.append(failure)
        warnings.warn(f"rstar_env plugin {failure}", PluginLoadWarning, stacklevel=4)

    def _add(self, plugin: Any, source: str, name: str | None = None) -> None:
        """Register ``plugin`` with pluggy and add what it provides to the tables, or undo it and raise."""
        try:
            self.pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise PluginError(f"pluggy refused it: {exc}") from exc
        try:
            infos = self._provided(plugin, source)
            self._check_clashes(infos)
        except BaseException:
            self.pm.unregister(plugin)
            raise
        self._entries.append((plugin, source, infos))

    def _provided(self, plugin: Any, source: str) -> list[PluginInfo]:
        hooks = {caller.name for caller in self.pm.get_hookcallers(plugin) or ()}
        unknown = sorted(hooks - set(HOOKS.values()))
        if unknown:
            raise PluginError(
                f"it implements {', '.join(unknown)}, which is no rstar_env hook (the hooks are "
                f"{', '.join(HOOKS.values())})"
            )
        if not hooks:
            raise PluginError(
                f"it implements no rstar_env hook (mark {', '.join(HOOKS.values())} with rstar_env.plugins.hookimpl)"
            )
        # Called through pluggy, as every hook call, on a manager that holds this plugin alone: what it returns and
        # any failure are its own (pluggy's subset_hook_caller would need every other plugin to be hashable).
        alone = pluggy.PluginManager(PROJECT)
        alone.add_hookspecs(PluginSpecs)
        alone.register(plugin)
        infos: list[PluginInfo] = []
        for kind, hook_name in HOOKS.items():
            if hook_name not in hooks:
                continue
            try:
                results = getattr(alone.hook, hook_name)()
            except Exception as exc:
                raise PluginError(f"its {hook_name}() raised {type(exc).__name__}: {exc}") from exc
            for classes in results:  # pluggy leaves out a None result
                if isinstance(classes, str | bytes | dict | type) or not isinstance(classes, list | tuple | set):
                    raise PluginError(f"its {hook_name}() must return a list of plugin classes, got {classes!r}")
                for cls in classes:
                    infos.append(PluginInfo(kind, _checked_name(cls, kind, source), cls, source))
        return infos

    def _check_clashes(self, infos: list[PluginInfo]) -> None:
        taken = {(i.kind, i.name): i for _, _, known in self._entries for i in known}
        for info in infos:
            known = taken.get((info.kind, info.name))
            if known is not None and known.cls is not info.cls:
                raise PluginError(
                    f"two {info.kind} plugins are named {info.name!r}: {qualname(known.cls)} from {known.source} "
                    f"and {qualname(info.cls)} from {info.source}; rename one (plugin names must be unique)"
                )
            taken[(info.kind, info.name)] = info

    def register(self, obj: Any, name: str | None = None) -> Any:
        """Register a plugin class (kind told by its ``call``/``score``/``select`` method) or an object or module
        with hookimpls. Registering the same object twice is a no-op. Returns ``obj``, so it works as a decorator.
        Raises :class:`PluginError` (and registers nothing) when what it provides is invalid."""
        with self._lock:
            if inspect.isclass(obj) and not any(hasattr(obj, h) for h in HOOKS.values()):
                kind = _kind_of_class(obj)
                if any(isinstance(p, _ClassPlugin) and p.cls is obj for p in self.pm.get_plugins()):
                    return obj
                plugin: Any = _ClassPlugin(obj, kind)
            else:
                if self.pm.is_registered(obj):
                    return obj
                plugin = obj
            self._add(plugin, "runtime", name=name)
            return obj

    def unregister(self, obj: Any) -> None:
        """Undo ``register(obj)`` (for tests and interactive sessions)."""
        with self._lock:
            for plugin, source, infos in list(self._entries):
                if plugin is obj or (isinstance(plugin, _ClassPlugin) and plugin.cls is obj):
                    self.pm.unregister(plugin)
                    self._entries.remove((plugin, source, infos))

    def plugins(self, kind: PluginKind) -> dict[str, PluginInfo]:
        with self._lock:
            return {i.name: i for _, _, infos in self._entries for i in infos if i.kind == kind}

    def get(self, kind: PluginKind, name: str) -> type:
        table = self.plugins(kind)
        if name not in table:
            raise PluginError(
                f"unknown {kind} {name!r}; registered {kind}s: {self.known(kind)}. Register one with "
                "rstar_env.plugins.register(MyClass) or an [project.entry-points.rstar_env] entry in "
                f"its package{self._failed_note()}."
            )
        return table[name].cls

    def known(self, kind: PluginKind) -> str:
        """The registered names of ``kind`` and where each comes from, for error messages."""
        table = self.plugins(kind)
        return ", ".join(f"{n} (from {i.source})" for n, i in sorted(table.items())) or "none"

    def _failed_note(self) -> str:
        if not self.failed:
            return ""
        return "; some installed plugins failed to load (rstar-env plugins lists them): " + "; ".join(
            f"{f.distribution} ({f.entry_point})" for f in self.failed
        )

    def check_options(self, kind: PluginKind, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to build plugin ``name`` with, from a config's ``options``.

        Options are declared once, in one of three ways:

        - ``options_model``, a pydantic model or a dataclass, with a constructor that takes ``options``: the
          constructor receives the validated model (``def __init__(self, options: MyOptions)``; or no constructor
          at all, and the instance gets ``self.options``);
        - ``options_model`` with a constructor that takes the fields as keywords: it gets every field;
        - a dataclass plugin with no ``options_model``: its init fields are the options, validated by type.

        Without any of these, ``options`` must bind to the constructor's signature, and are validated by its type
        annotations as pydantic's ``validate_call`` does (``timeout: float`` refuses ``"abc"``; an unannotated
        parameter accepts anything; ``**kwargs`` accepts unknown keys). Unknown keys raise :class:`PluginError`, bad
        values :class:`OptionsError` (a ``PluginError`` listing each option and what is wrong), naming the plugin.
        """
        cls = self.get(kind, name)
        label = f"{kind} {name!r} ({qualname(cls)})"
        if not isinstance(options, dict):
            raise PluginError(f"{label}: options must be a mapping, got {type(options).__name__}")
        model = getattr(cls, "options_model", None)
        if model is not None:
            fields = _options.model_fields(model, label)
            validated = _options.validate(model, fields, options, label)
            if _options.takes_options_object(cls, fields):
                return {"options": validated}
            options = {field: getattr(validated, field) for field in fields}
        elif dataclasses.is_dataclass(cls):
            fields = [f.name for f in dataclasses.fields(cls) if f.init]
            validated = _options.validate(_options.dataclass_model(cls), fields, options, label)
            options = {field: getattr(validated, field) for field in fields if field in options}
        try:
            inspect.signature(cls).bind(**options)
        except TypeError as exc:
            raise PluginError(f"{label} rejects options {sorted(options)}: {exc}") from exc
        if model is None and not dataclasses.is_dataclass(cls):
            options = _options.validate_signature(cls, options, label)
        return options

    def build(self, kind: PluginKind, name: str, options: dict[str, Any]) -> Any:
        """An instance of plugin ``name`` built with ``options`` (see :meth:`check_options`); a tool's schema is
        checked (:func:`check_tool`)."""
        cls = self.get(kind, name)
        kwargs = self.check_options(kind, name, options)
        if "options" in kwargs and not _options.has_init(cls):  # an options_model and no constructor: as documented
            instance = cls()
            instance.options = kwargs["options"]
        else:
            instance = cls(**kwargs)
        if kind == "tool":
            check_tool(instance)
        return instance


def check_tool(tool: Any) -> None:
    """Refuse a tool whose ``schema`` is not a valid OpenAI function tool named as the tool (a
    :class:`PluginError` that names it and says what is wrong)."""
    from rstar_env.tool import schema_problem

    name = getattr(tool, "name", None)
    problem = schema_problem(getattr(tool, "schema", None), name)
    if problem is not None:
        raise PluginError(f"tool {name!r} ({qualname(type(tool))}) has an invalid schema: {problem}")


def _checked_name(cls: Any, kind: PluginKind, source: str) -> str:
    name = getattr(cls, "name", None)
    if not inspect.isclass(cls):
        raise PluginError(f"{kind} plugin {cls!r} from {source} is not a class (hooks return plugin classes)")
    if not isinstance(name, str) or not name:
        raise PluginError(f"{kind} plugin {cls!r} from {source} has no string `name` attribute")
    method = SIGNATURE_METHOD[kind]
    if not callable(getattr(cls, method, None)):
        raise PluginError(f"{kind} plugin {qualname(cls)} ({name!r}) from {source} has no `{method}` method")
    return name


def _kind_of_class(cls: type) -> PluginKind:
    kinds = [kind for kind, method in SIGNATURE_METHOD.items() if callable(getattr(cls, method, None))]
    if len(kinds) != 1:
        raise PluginError(
            f"cannot tell what kind of plugin {qualname(cls)} is: a tool defines `call`, a reward `score`, "
            f"a sampler `select` (it defines {kinds or 'none of them'})"
        )
    return kinds[0]
