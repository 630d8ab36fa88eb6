"""Everything a plugin author needs, from one place (the full guide: ``docs/plugins.md``)::

    from rstar_env.plugins import EpisodeContext, ToolResult, hookimpl, register, tool_schema

Tools, rewards and group samplers are discovered with pluggy. A package provides plugins by implementing the hooks
(``rstar_env_tools``, ``rstar_env_rewards``, ``rstar_env_samplers``) in a module and naming that module under the
``rstar_env`` entry-point group::

    # my_pkg/rstar.py
    from rstar_env.plugins import hookimpl

    @hookimpl
    def rstar_env_tools():
        return [MyTool]

    # pyproject.toml
    [project.entry-points.rstar_env]
    my_pkg = "my_pkg.rstar"

or at run time, with ``register(MyTool)`` (a plugin class) or ``register(module_or_object_with_hookimpls)``.
Built-in plugins are registered through the same entry-point group and import only this module and the public
modules it names (``rstar_env.sandbox`` for a sandbox), so they have no privilege a user's lack. Then
``load_tool("my_tool", **options)`` builds an instance, as the env does for ``tools=["my_tool"]``.

A tool, its schema derived from its name and an arguments model (the name written once)::

    class FactorizeArguments(BaseModel):
        n: int = Field(description="The number to factorize.")

    class Factorize:
        name = "factorize"
        schema = tool_schema(name, "Prime factors of n.", FactorizeArguments)

        def call(self, arguments, episode):          # plain def: runs in a thread, under the tool time limit
            import sympy
            return ToolResult(str(sympy.factorint(arguments["n"])))

    register(Factorize)

A reward plugin reads the final answer in the prompt's format with ``extract_answer(response)`` (the last
``\\boxed{}`` of the last ``<answer>`` block, else the last ``\\boxed{}``; ``None`` when there is none), and may
compare answers as the built-in ``math`` reward does (``same_answer``, ``parse_number``, ``compare_numbers``, ...).

Options are declared once: as ``options_model`` (a pydantic model or a dataclass) that the constructor receives as
``options``, as the fields of a dataclass plugin, or as a constructor's keywords (checked against their type
annotations: ``timeout: float`` refuses ``"abc"``). They are validated when a config loads, with errors that name
the key (``tools[0].options.max_n: ...``); a tool's schema is checked when the tool is built::

    class Options(BaseModel):
        max_n: int = Field(10**12, ge=2)

    class Factorize:
        options_model = Options
        def __init__(self, options: Options | None = None, **settings):
            self.options = plugin_options(Options, options, settings)   # also Factorize(max_n=100) by hand

Each entry point is loaded in isolation: one that fails is skipped with a :class:`PluginLoadWarning` and listed
by :func:`failed_plugins`.

**The event loop.** All envs of a process share one event loop. An ``async def`` method runs on it and must never
block it (no ``time.sleep``, no heavy CPU work, no blocking I/O): use ``await asyncio.sleep``, async clients, or
``await asyncio.to_thread(...)``. A plain ``def`` method runs in a thread, where blocking is fine and the time
limit holds (:func:`invoke`, defined in :mod:`rstar_env.invoke` and re-exported here, is how the env calls one). A
watchdog (:mod:`rstar_env.watchdog`) logs the plugin and the seconds when the loop is blocked.

Behind this module, private: ``_hookspecs`` (the hooks), ``_registry`` (the registry), ``_options`` (option models),
``_errors``. The process's registry belongs to the runtime (:meth:`rstar_env.runtime.Runtime.component`).
:mod:`rstar_env.plugin` is an alias of this module; ``rstar_env.tool``, ``rstar_env.reward``, ``rstar_env.sampler``
and ``rstar_env.trajectory`` define what it gathers and stay import places too.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator
from typing import Any, TypeVar

from rstar_env.data.answers import text_answer
from rstar_env.data.numbers import (
    compare_number_sets,
    compare_numbers,
    parse_number,
    same_answer,
    strip_presentation,
)
from rstar_env.format import extract_answer
from rstar_env.invoke import invoke  # the one definition; re-exported for plugin authors
from rstar_env.reward import Reward, current_client
from rstar_env.runtime import SharedSandboxes, runtime
from rstar_env.sampler import Sampler, TrajectorySummary, checked_select
from rstar_env.tool import EpisodeContext, Tool, function_schema, tool_schema, validate_arguments
from rstar_env.trajectory import RewardResult, ToolErrorKind, ToolResult, Trajectory

from ._errors import FailedPlugin, OptionsError, PluginError, PluginInfo, PluginLoadWarning
from ._hookspecs import HOOKS, PROJECT, PluginKind, PluginSpecs, hookimpl, hookspec
from ._options import plugin_options
from ._registry import PluginRegistry, check_tool

T = TypeVar("T")

_COMPONENT = "plugins"
"""The key of the process's registry among the runtime's components."""


def get_registry() -> PluginRegistry:
    """The process-wide registry, owned by the runtime (entry points loaded on first use)."""
    return runtime().component(_COMPONENT, PluginRegistry)


@contextlib.contextmanager
def use_registry(registry: PluginRegistry) -> Iterator[PluginRegistry]:
    """Make ``registry`` the process's registry inside the ``with`` block, then put the previous one back (for
    tests, and for a program that checks a config against a registry of its own)."""
    previous = runtime().replace_component(_COMPONENT, registry)
    try:
        yield registry
    finally:
        runtime().replace_component(_COMPONENT, previous)


def register(obj: T, name: str | None = None) -> T:
    """Register a plugin at run time: a plugin class, or a module/object with ``@hookimpl`` functions."""
    return typing.cast(T, get_registry().register(obj, name=name))


def unregister(obj: Any) -> None:
    get_registry().unregister(obj)


def list_plugins(kind: PluginKind | None = None) -> list[PluginInfo]:
    kinds: list[PluginKind] = [kind] if kind else list(HOOKS)
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


def shared_sandboxes() -> SharedSandboxes:
    """The process's shared sandboxes: a tool's sandbox counted by reference under its settings, so the tools of
    every env share one warm pool per settings (``acquire(key, build)``, ``await release(key)``)."""
    return runtime().sandboxes


__all__ = [
    "PROJECT",
    "EpisodeContext",
    "FailedPlugin",
    "OptionsError",
    "PluginError",
    "PluginInfo",
    "PluginKind",
    "PluginLoadWarning",
    "PluginRegistry",
    "PluginSpecs",
    "Reward",
    "RewardResult",
    "Sampler",
    "SharedSandboxes",
    "Tool",
    "ToolErrorKind",
    "ToolResult",
    "Trajectory",
    "TrajectorySummary",
    "check_tool",
    "checked_select",
    "compare_number_sets",
    "compare_numbers",
    "current_client",
    "extract_answer",
    "failed_plugins",
    "function_schema",
    "get_registry",
    "hookimpl",
    "hookspec",
    "invoke",
    "list_plugins",
    "load_reward",
    "load_sampler",
    "load_tool",
    "parse_number",
    "plugin_options",
    "register",
    "same_answer",
    "shared_sandboxes",
    "strip_presentation",
    "text_answer",
    "tool_schema",
    "unregister",
    "use_registry",
    "validate_arguments",
]
