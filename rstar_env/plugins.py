"""Plugins: tools, rewards and group samplers, discovered with pluggy.

The hookspecs below are the documented API. A package provides plugins by implementing any of them in a module and
naming that module under the ``rstar_env`` entry-point group::

    # my_pkg/rstar.py
    from rstar_env.plugins import hookimpl

    @hookimpl
    def rstar_env_tools():
        return [MyTool]

    # pyproject.toml
    [project.entry-points.rstar_env]
    my_pkg = "my_pkg.rstar"

or at run time, with ``register(MyTool)`` (a plugin class) or ``register(module_or_object_with_hookimpls)``.
Built-in plugins are registered through the same entry-point group, so they have no privilege a user's lack.
Then ``load_tool("my_tool", **options)`` builds an instance, as the env does for ``tools=["my_tool"]``.

Each entry point is loaded in isolation: one that fails is skipped with a :class:`PluginLoadWarning` and listed
by :func:`failed_plugins`. A plugin's options are declared once: as ``options_model`` (a pydantic model or a
dataclass) that the constructor receives as ``options``, as the fields of a dataclass plugin, or as a constructor's
keywords (checked against their type annotations). They are validated when a config loads, with errors that name
the config key; a tool's schema is checked when the tool is built.

Plugin methods may be coroutines or plain functions: :func:`invoke` runs a plain one in a thread, so its time
limit holds and it never blocks the event loop every env shares. Plugin authors import from
:mod:`rstar_env.plugin`, the one place that gathers what they need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import inspect
import threading
import types
import typing
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pluggy
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from rstar_env.invoke import invoke
from rstar_env.reward import Reward
from rstar_env.sampler import Sampler
from rstar_env.tool import Tool

PROJECT = "rstar_env"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

PluginKind = Literal["tool", "reward", "sampler"]
T = TypeVar("T")
M = TypeVar("M")


class PluginSpecs:
    """The hookspecs. Each returns plugin *classes*; instances are built by ``load_*`` with the user's options."""

    @hookspec
    def rstar_env_tools(self) -> Sequence[type]:
        """Tool plugin classes: ``name``, ``schema``, ``call(arguments, episode) -> ToolResult`` and optionally
        ``close(episode)``, each ``async def`` or plain ``def``. See :mod:`rstar_env.plugin`."""

    @hookspec
    def rstar_env_rewards(self) -> Sequence[type]:
        """Reward plugin classes: ``name``, ``score(response, answer) -> RewardResult`` (``async def`` or ``def``).
        See :mod:`rstar_env.reward`."""

    @hookspec
    def rstar_env_samplers(self) -> Sequence[type]:
        """Group sampler classes: ``name``, ``select(group, keep, rng) -> list[int] | None``.
        See :mod:`rstar_env.sampler`."""


_HOOKS: dict[PluginKind, str] = {
    "tool": "rstar_env_tools",
    "reward": "rstar_env_rewards",
    "sampler": "rstar_env_samplers",
}
# The method that tells a bare plugin class's kind, for ``register(cls)``.
_SIGNATURE_METHOD: dict[PluginKind, str] = {"tool": "call", "reward": "score", "sampler": "select"}


class PluginError(LookupError):
    """A plugin cannot be found, loaded or built; the message says what is registered and how to fix it."""


class OptionsError(PluginError, ValueError):
    """A plugin's options have bad values. ``problems`` holds ``(option, message)`` pairs, each option a dotted path
    (``mode``, ``sandbox_options.memory_mb``; ``""`` for the options as a whole), so a config error names its key.
    A ``ValueError`` too, as a constructor's bad argument."""

    def __init__(self, prefix: str, problems: list[tuple[str, str]]) -> None:
        self.prefix = prefix
        self.problems = problems
        super().__init__(f"{prefix}: " + "; ".join(f"{o}: {m}" if o else m for o, m in problems))


class PluginLoadWarning(UserWarning):
    """An installed plugin failed to import or register and was skipped (the others keep working)."""


@dataclass(frozen=True)
class PluginInfo:
    kind: PluginKind
    name: str
    cls: type
    source: str
    """The distribution that provides it (entry point), or ``runtime`` for ``register()``."""


@dataclass(frozen=True)
class FailedPlugin:
    """An entry point that was skipped: it failed to import, or what it registers is invalid."""

    distribution: str
    entry_point: str
    """``name = module`` as written in the distribution's ``[project.entry-points.rstar_env]``."""
    error: str

    def __str__(self) -> str:
        return f"{self.distribution}: entry point {self.entry_point!r} skipped: {self.error}"


class _ClassPlugin:
    """Adapts a bare plugin class passed to ``register()`` to the hookspecs."""

    def __init__(self, cls: type, kind: PluginKind) -> None:
        self.cls = cls
        self.kind = kind
        setattr(self, _HOOKS[kind], hookimpl(specname=_HOOKS[kind])(lambda: [cls]))


class PluginRegistry:
    """Owns a pluggy ``PluginManager`` and the name -> class tables derived from it.

    Each entry point is loaded on its own: one that fails to import, defines a hook that does not exist, or
    provides an invalid plugin (no name, a name already taken) is skipped with one :class:`PluginLoadWarning` and
    listed in :attr:`failed`; every other plugin keeps working.
    """

    def __init__(self, *, load_entrypoints: bool = True) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(PluginSpecs)
        self.failed: list[FailedPlugin] = []
        # Registered plugin objects in order, with where each came from and the infos it provides.
        self._entries: list[tuple[Any, str, list[PluginInfo]]] = []
        self._lock = threading.RLock()
        if load_entrypoints:
            self._load_entrypoints()

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
        unknown = sorted(hooks - set(_HOOKS.values()))
        if unknown:
            raise PluginError(
                f"it implements {', '.join(unknown)}, which is no rstar_env hook (the hooks are "
                f"{', '.join(_HOOKS.values())})"
            )
        if not hooks:
            raise PluginError(
                f"it implements no rstar_env hook (mark {', '.join(_HOOKS.values())} with rstar_env.plugins.hookimpl)"
            )
        infos: list[PluginInfo] = []
        for kind, hook_name in _HOOKS.items():
            if hook_name not in hooks:
                continue
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    classes = impl.function()
                except Exception as exc:
                    raise PluginError(f"its {hook_name}() raised {type(exc).__name__}: {exc}") from exc
                if classes is None:
                    classes = []
                if isinstance(classes, str | bytes | dict | type) or not isinstance(classes, list | tuple | set):
                    raise PluginError(f"its {hook_name}() must return a list of plugin classes, got {classes!r}")
                for cls in classes or ():
                    infos.append(PluginInfo(kind, _checked_name(cls, kind, source), cls, source))
        return infos

    def _check_clashes(self, infos: list[PluginInfo]) -> None:
        taken = {(i.kind, i.name): i for _, _, known in self._entries for i in known}
        for info in infos:
            known = taken.get((info.kind, info.name))
            if known is not None and known.cls is not info.cls:
                raise PluginError(
                    f"two {info.kind} plugins are named {info.name!r}: {_qualname(known.cls)} from {known.source} "
                    f"and {_qualname(info.cls)} from {info.source}; rename one (plugin names must be unique)"
                )
            taken[(info.kind, info.name)] = info

    def register(self, obj: Any, name: str | None = None) -> Any:
        """Register a plugin class (kind told by its ``call``/``score``/``select`` method) or an object or module
        with hookimpls. Registering the same object twice is a no-op. Returns ``obj``, so it works as a decorator.
        Raises :class:`PluginError` (and registers nothing) when what it provides is invalid."""
        with self._lock:
            if inspect.isclass(obj) and not any(hasattr(obj, h) for h in _HOOKS.values()):
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
        label = f"{kind} {name!r} ({_qualname(cls)})"
        if not isinstance(options, dict):
            raise PluginError(f"{label}: options must be a mapping, got {type(options).__name__}")
        model = getattr(cls, "options_model", None)
        if model is not None:
            fields = _model_fields(model, label)
            validated = _validate(model, fields, options, label)
            if _takes_options_object(cls, fields):
                return {"options": validated}
            options = {field: getattr(validated, field) for field in fields}
        elif dataclasses.is_dataclass(cls):
            fields = [f.name for f in dataclasses.fields(cls) if f.init]
            validated = _validate(_dataclass_model(cls), fields, options, label)
            options = {field: getattr(validated, field) for field in fields if field in options}
        try:
            inspect.signature(cls).bind(**options)
        except TypeError as exc:
            raise PluginError(f"{label} rejects options {sorted(options)}: {exc}") from exc
        if model is None and not dataclasses.is_dataclass(cls):
            options = _validate_signature(cls, options, label)
        return options

    def build(self, kind: PluginKind, name: str, options: dict[str, Any]) -> Any:
        """An instance of plugin ``name`` built with ``options`` (see :meth:`check_options`); a tool's schema is
        checked (:func:`check_tool`)."""
        cls = self.get(kind, name)
        kwargs = self.check_options(kind, name, options)
        if "options" in kwargs and not _has_init(cls):  # an options_model and no constructor: set as documented
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
        raise PluginError(f"tool {name!r} ({_qualname(type(tool))}) has an invalid schema: {problem}")


def _checked_name(cls: Any, kind: PluginKind, source: str) -> str:
    name = getattr(cls, "name", None)
    if not inspect.isclass(cls):
        raise PluginError(f"{kind} plugin {cls!r} from {source} is not a class (hooks return plugin classes)")
    if not isinstance(name, str) or not name:
        raise PluginError(f"{kind} plugin {cls!r} from {source} has no string `name` attribute")
    method = _SIGNATURE_METHOD[kind]
    if not callable(getattr(cls, method, None)):
        raise PluginError(f"{kind} plugin {_qualname(cls)} ({name!r}) from {source} has no `{method}` method")
    return name


def _model_fields(model: Any, label: str) -> list[str]:
    if inspect.isclass(model) and issubclass(model, BaseModel):
        return list(model.model_fields)
    if inspect.isclass(model) and dataclasses.is_dataclass(model):
        return [f.name for f in dataclasses.fields(model) if f.init]
    raise PluginError(f"{label}: options_model must be a pydantic BaseModel subclass or a dataclass, got {model!r}")


def _validate(model: Any, fields: list[str], options: dict[str, Any], label: str) -> Any:
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise PluginError(
            f"{label} has no option(s) {', '.join(map(repr, unknown))}; its options are: {', '.join(fields) or 'none'}"
        )
    return _validated(model, options, f"{label} rejects its options")


def _validated(model: Any, options: Mapping[str, Any], prefix: str) -> Any:
    """``options`` validated by ``model`` (a pydantic model or a dataclass), or :class:`OptionsError`."""
    try:
        if issubclass(model, BaseModel):
            return model.model_validate(options)
        return TypeAdapter(model).validate_python(options)
    except ValidationError as exc:
        raise OptionsError(prefix, _problems(exc)) from None


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    """``(option, message)`` for each error of ``exc``, the message with the value it got."""
    problems = []
    for error in exc.errors():
        got = "" if error["type"] == "missing" else f" (got {_short(repr(error.get('input')))})"
        # A validator's own ValueError says it all; pydantic would prefix it with "Value error, ".
        message = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
        problems.append((".".join(str(p) for p in error["loc"]), f"{message}{got}"))
    return problems


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dataclass_model(cls: type) -> type[BaseModel]:
    """A pydantic model of a dataclass plugin's init fields, to validate its options without building it."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints.get(f.name, Any), f.default)
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints.get(f.name, Any), Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (hints.get(f.name, Any), ...)
    return create_model(f"{cls.__name__}Options", __config__={"arbitrary_types_allowed": True}, **fields)


# Per plugin class: the model of its constructor's keyword parameters and, per field, the parameter it stands for.
_SIGNATURE_MODELS: weakref.WeakKeyDictionary[type, tuple[type[BaseModel], dict[str, str]]] = weakref.WeakKeyDictionary()


def _validate_signature(cls: type, options: dict[str, Any], label: str) -> dict[str, Any]:
    """``options`` (already bound to ``cls``'s signature) validated by the constructor's type annotations and
    converted as pydantic's ``validate_call`` would; keys that only ``**kwargs`` takes pass unchanged."""
    built = _signature_model(cls)
    if built is None:
        return options
    model, params = built
    validated = _validated(model, options, f"{label} rejects its options")
    out = dict(options)
    for field, param in params.items():
        if param in options:
            out[param] = getattr(validated, field)
    return out


def _signature_model(cls: type) -> tuple[type[BaseModel], dict[str, str]] | None:
    """A pydantic model of the keyword parameters of ``cls``'s constructor, as ``validate_call`` builds one: an
    annotated parameter is validated by its type, an unannotated one (or one whose annotation pydantic cannot
    check, or that does not resolve) is ``Any``; ``**kwargs`` allows extra keys. Fields are named ``p0``, ``p1``,
    ... with the parameter's name as alias, so a parameter may be called ``schema`` or ``model_config``."""
    with contextlib.suppress(TypeError):  # an unhashable or non-weakref-able class: just rebuild it
        if cls in _SIGNATURE_MODELS:
            return _SIGNATURE_MODELS[cls]
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a builtin without a signature: binding already said what it could
        return None
    init = getattr(cls, "__init__", None)
    namespace = getattr(init, "__globals__", {})
    fields: dict[str, Any] = {}
    params: dict[str, str] = {}
    extra: Literal["allow", "forbid"] = "forbid"
    for param in signature.parameters.values():
        if param.kind is param.VAR_KEYWORD:
            extra = "allow"
            continue
        if param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):  # never given by a config's keys
            continue
        field = f"p{len(params)}"
        default = ... if param.default is param.empty else param.default
        fields[field] = (_checkable(param.annotation, namespace), Field(default, alias=param.name))
        params[field] = param.name
    config = ConfigDict(arbitrary_types_allowed=True, extra=extra)
    model = create_model(f"{cls.__name__}Options", __config__=config, **fields)
    with contextlib.suppress(TypeError):
        _SIGNATURE_MODELS[cls] = (model, params)
    return model, params


def _checkable(annotation: Any, namespace: dict[str, Any]) -> Any:
    """``annotation`` resolved (a string under ``from __future__ import annotations``), or ``Any`` when it is
    absent, does not resolve, or is a type pydantic cannot validate (a plain ``Protocol``, say)."""
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        holder = types.SimpleNamespace(__annotations__={"value": annotation})
        try:
            annotation = typing.get_type_hints(holder, globalns=namespace, include_extras=True)["value"]
        except Exception:  # a name only imported under TYPE_CHECKING, a typo: not ours to fail on
            return Any
    try:
        create_model("_Probe", __config__=ConfigDict(arbitrary_types_allowed=True), value=(annotation, ...))
    except Exception:
        return Any
    return annotation


def _has_init(cls: type) -> bool:
    return any("__init__" in vars(base) for base in cls.__mro__ if base is not object)


def _takes_options_object(cls: type, fields: list[str]) -> bool:
    """Whether ``cls`` is built with the validated options model (``cls(options=...)``) rather than its fields."""
    if not _has_init(cls):
        return True
    params = inspect.signature(cls).parameters
    return "options" in params and "options" not in fields


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _kind_of_class(cls: type) -> PluginKind:
    kinds = [kind for kind, method in _SIGNATURE_METHOD.items() if callable(getattr(cls, method, None))]
    if len(kinds) != 1:
        raise PluginError(
            f"cannot tell what kind of plugin {_qualname(cls)} is: a tool defines `call`, a reward `score`, "
            f"a sampler `select` (it defines {kinds or 'none of them'})"
        )
    return kinds[0]


_registry: PluginRegistry | None = None
_registry_lock = threading.Lock()


def get_registry() -> PluginRegistry:
    """The process-wide registry (entry points loaded on first use)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = PluginRegistry()
        return _registry


def register(obj: T, name: str | None = None) -> T:
    """Register a plugin at run time: a plugin class, or a module/object with ``@hookimpl`` functions."""
    return get_registry().register(obj, name=name)


def unregister(obj: Any) -> None:
    get_registry().unregister(obj)


def list_plugins(kind: PluginKind | None = None) -> list[PluginInfo]:
    kinds: list[PluginKind] = [kind] if kind else list(_HOOKS)
    registry = get_registry()
    return [info for k in kinds for info in sorted(registry.plugins(k).values(), key=lambda i: i.name)]


def failed_plugins() -> list[FailedPlugin]:
    """Installed entry points that were skipped because they failed to load (see :class:`FailedPlugin`)."""
    return list(get_registry().failed)


def load_tool(name: str, **options: Any) -> Tool:
    """Build the tool plugin called ``name`` with ``options`` (e.g. ``load_tool("python", stateful=True)``)."""
    return typing.cast(Tool, get_registry().build("tool", name, options))


def load_reward(name: str, **options: Any) -> Reward:
    """Build the reward plugin called ``name`` with ``options``."""
    return typing.cast(Reward, get_registry().build("reward", name, options))


def load_sampler(name: str, **options: Any) -> Sampler:
    """Build the group sampler called ``name`` with ``options``."""
    return typing.cast(Sampler, get_registry().build("sampler", name, options))


def plugin_options(model: type[M], options: M | Mapping[str, Any] | None = None, settings: Mapping[str, Any] = {}) -> M:
    """The validated options of a constructor that takes its ``options_model`` or keywords, or both::

        def __init__(self, options: MyOptions | None = None, **settings: Any) -> None:
            self.options = plugin_options(MyOptions, options, settings)

    so ``load_tool("my_tool", timeout_s=2)`` (the registry passes the model it validated, which is returned as is)
    and ``MyTool(timeout_s=2)`` both work, with the constraints declared once, in the model. ``settings`` override
    ``options``. Raises ``TypeError`` for a key that is no option, :class:`OptionsError` (a ``ValueError``) for bad
    values, naming each option.
    """
    fields = _model_fields(model, model.__name__)
    if isinstance(options, model) and not settings:
        return options
    if options is None:
        given: dict[str, Any] = {}
    elif isinstance(options, model):
        given = {field: getattr(options, field) for field in fields}
    elif isinstance(options, Mapping):
        given = dict(options)
    else:
        raise TypeError(f"options must be a {model.__name__}, a mapping or None, got {type(options).__name__}")
    given.update(settings)
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise TypeError(f"{', '.join(map(repr, unknown))}: no such option; the options are {', '.join(fields)}")
    return typing.cast(M, _validated(model, given, f"invalid {model.__name__}"))


__all__ = [
    "FailedPlugin",
    "OptionsError",
    "PluginError",
    "PluginInfo",
    "PluginLoadWarning",
    "PluginRegistry",
    "PluginSpecs",
    "check_tool",
    "failed_plugins",
    "get_registry",
    "hookimpl",
    "hookspec",
    "invoke",
    "list_plugins",
    "load_reward",
    "load_sampler",
    "load_tool",
    "plugin_options",
    "register",
    "unregister",
]
