"""Plugins: tools, reward verifiers and group samplers, discovered with pluggy.

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
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pluggy

PROJECT = "rstar_env"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

PluginKind = Literal["tool", "reward", "sampler"]
T = TypeVar("T")


class PluginSpecs:
    """The hookspecs. Each returns plugin *classes*; instances are built by ``load_*`` with the user's options."""

    @hookspec
    def rstar_env_tools(self) -> Sequence[type]:
        """Tool plugin classes: ``name``, ``schema``, ``async call(arguments, episode) -> ToolResult``,
        ``async close(episode)``. See :mod:`rstar_env.tool`."""

    @hookspec
    def rstar_env_rewards(self) -> Sequence[type]:
        """Reward plugin classes: ``name``, ``async score(response, answer) -> RewardResult``.
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


@dataclass(frozen=True)
class PluginInfo:
    kind: PluginKind
    name: str
    cls: type
    source: str
    """The distribution that provides it (entry point), or ``runtime`` for ``register()``."""


class _ClassPlugin:
    """Adapts a bare plugin class passed to ``register()`` to the hookspecs."""

    def __init__(self, cls: type, kind: PluginKind) -> None:
        self.cls = cls
        self.kind = kind
        setattr(self, _HOOKS[kind], hookimpl(specname=_HOOKS[kind])(lambda: [cls]))


class PluginRegistry:
    """Owns a pluggy ``PluginManager`` and the name -> class tables derived from it."""

    def __init__(self, *, load_entrypoints: bool = True) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(PluginSpecs)
        self._sources: dict[int, str] = {}
        self._table: dict[PluginKind, dict[str, PluginInfo]] | None = None
        self._lock = threading.RLock()
        if load_entrypoints:
            self.pm.load_setuptools_entrypoints(PROJECT)
            for plugin, dist in self.pm.list_plugin_distinfo():
                self._sources[id(plugin)] = dist.project_name

    def register(self, obj: Any, name: str | None = None) -> Any:
        """Register a plugin class (kind told by its ``call``/``score``/``select`` method) or an object or module
        with hookimpls. Registering the same object twice is a no-op. Returns ``obj``, so it works as a decorator."""
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
            self.pm.register(plugin, name=name)
            self._sources[id(plugin)] = "runtime"
            try:
                self._table = self._collect()
            except PluginError:
                self.pm.unregister(plugin)
                self._table = None
                raise
            return obj

    def unregister(self, obj: Any) -> None:
        """Undo ``register(obj)`` (for tests and interactive sessions)."""
        with self._lock:
            for plugin in self.pm.get_plugins():
                if plugin is obj or (isinstance(plugin, _ClassPlugin) and plugin.cls is obj):
                    self.pm.unregister(plugin)
            self._table = None

    def plugins(self, kind: PluginKind) -> dict[str, PluginInfo]:
        with self._lock:
            if self._table is None:
                self._table = self._collect()
            return dict(self._table[kind])

    def get(self, kind: PluginKind, name: str) -> type:
        table = self.plugins(kind)
        if name not in table:
            known = ", ".join(f"{n} (from {i.source})" for n, i in sorted(table.items())) or "none"
            raise PluginError(
                f"unknown {kind} {name!r}; registered {kind}s: {known}. Register one with "
                f"rstar_env.plugins.register(MyClass) or an [project.entry-points.rstar_env] entry in its package."
            )
        return table[name].cls

    def build(self, kind: PluginKind, name: str, options: dict[str, Any]) -> Any:
        cls = self.get(kind, name)
        try:
            inspect.signature(cls).bind(**options)
        except TypeError as exc:
            raise PluginError(f"{kind} {name!r} ({cls.__module__}.{cls.__qualname__}) rejects options "
                              f"{sorted(options)}: {exc}") from exc
        return cls(**options)

    def _collect(self) -> dict[PluginKind, dict[str, PluginInfo]]:
        table: dict[PluginKind, dict[str, PluginInfo]] = {kind: {} for kind in _HOOKS}
        for kind, hook_name in _HOOKS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                source = self._sources.get(id(impl.plugin), impl.plugin_name)
                for cls in impl.function() or ():
                    name = getattr(cls, "name", None)
                    if not isinstance(name, str) or not name:
                        raise PluginError(f"{kind} plugin {cls!r} from {source} has no string `name` attribute")
                    known = table[kind].get(name)
                    if known is not None and known.cls is not cls:
                        raise PluginError(
                            f"two {kind} plugins are named {name!r}: {_qualname(known.cls)} from {known.source} "
                            f"and {_qualname(cls)} from {source}; rename one (plugin names must be unique)"
                        )
                    table[kind][name] = PluginInfo(kind, name, cls, source)
        return table


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


def load_tool(name: str, **options: Any) -> Any:
    """Build the tool plugin called ``name`` with ``options`` (e.g. ``load_tool("python", stateful=True)``)."""
    return get_registry().build("tool", name, options)


def load_reward(name: str, **options: Any) -> Any:
    """Build the reward plugin called ``name`` with ``options``."""
    return get_registry().build("reward", name, options)


def load_sampler(name: str, **options: Any) -> Any:
    """Build the group sampler called ``name`` with ``options``."""
    return get_registry().build("sampler", name, options)


__all__ = [
    "PluginError",
    "PluginInfo",
    "PluginRegistry",
    "PluginSpecs",
    "get_registry",
    "hookimpl",
    "hookspec",
    "list_plugins",
    "load_reward",
    "load_sampler",
    "load_tool",
    "register",
    "unregister",
]
