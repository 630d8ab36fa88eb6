"""Everything a plugin author needs, from one place (the full guide: ``docs/plugins.md``)::

    from rstar_env.plugin import EpisodeContext, ToolResult, function_schema, hookimpl, register

A tool::

    class Factorize:
        name = "factorize"
        schema = function_schema("factorize", "Prime factors of n.", {"n": {"type": "integer"}}, ["n"])

        def call(self, arguments, episode):          # plain def: runs in a thread, under the tool time limit
            import sympy
            return ToolResult(str(sympy.factorint(arguments["n"])))

    register(Factorize)

Options are declared once, as an ``options_model`` (a pydantic model or a dataclass) that the constructor receives::

    class Options(BaseModel):
        max_n: int = 10**12

    class Factorize:
        options_model = Options
        def __init__(self, options: Options):
            self.max_n = options.max_n

**The event loop.** All envs of a process share one event loop. An ``async def`` method runs on it and must never
block it (no ``time.sleep``, no heavy CPU work, no blocking I/O): use ``await asyncio.sleep``, async clients, or
``await asyncio.to_thread(...)``. A plain ``def`` method runs in a thread, where blocking is fine and the time
limit holds. A watchdog (:mod:`rstar_env.watchdog`) logs the plugin and the seconds when the loop is blocked.

The old import places (``rstar_env.plugins``, ``rstar_env.tool``, ``rstar_env.reward``, ``rstar_env.sampler``,
``rstar_env.trajectory``) keep working.
"""

from __future__ import annotations

from rstar_env.plugins import (
    PluginError,
    PluginLoadWarning,
    hookimpl,
    invoke,
    list_plugins,
    load_reward,
    load_sampler,
    load_tool,
    register,
    unregister,
)
from rstar_env.reward import Reward
from rstar_env.sampler import Sampler, TrajectorySummary, checked_select
from rstar_env.tool import EpisodeContext, Tool, function_schema, validate_arguments
from rstar_env.trajectory import RewardResult, ToolErrorKind, ToolResult, Trajectory

__all__ = [
    "EpisodeContext",
    "PluginError",
    "PluginLoadWarning",
    "Reward",
    "RewardResult",
    "Sampler",
    "Tool",
    "ToolErrorKind",
    "ToolResult",
    "Trajectory",
    "TrajectorySummary",
    "checked_select",
    "function_schema",
    "hookimpl",
    "invoke",
    "list_plugins",
    "load_reward",
    "load_sampler",
    "load_tool",
    "register",
    "unregister",
    "validate_arguments",
]
