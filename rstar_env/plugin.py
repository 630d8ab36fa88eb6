"""Everything a plugin author needs, from one place (the full guide: ``docs/plugins.md``)::

    from rstar_env.plugin import EpisodeContext, ToolResult, hookimpl, register, tool_schema

A reward plugin reads the final answer in the prompt's format with ``extract_answer(response)`` (the last
``\\boxed{}`` of the last ``<answer>`` block, else the last ``\\boxed{}``; ``None`` when there is none).

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

Options are declared once, as an ``options_model`` (a pydantic model or a dataclass) that the constructor receives;
they are checked when a config loads, with errors that name the key (``tools[0].options.max_n: ...``)::

    class Options(BaseModel):
        max_n: int = Field(10**12, ge=2)

    class Factorize:
        options_model = Options
        def __init__(self, options: Options | None = None, **settings):
            self.options = plugin_options(Options, options, settings)   # also Factorize(max_n=100) by hand

A constructor with plain keywords and no ``options_model`` works too: its options are checked against its type
annotations (``timeout: float`` refuses ``"abc"``).

**The event loop.** All envs of a process share one event loop. An ``async def`` method runs on it and must never
block it (no ``time.sleep``, no heavy CPU work, no blocking I/O): use ``await asyncio.sleep``, async clients, or
``await asyncio.to_thread(...)``. A plain ``def`` method runs in a thread, where blocking is fine and the time
limit holds. A watchdog (:mod:`rstar_env.watchdog`) logs the plugin and the seconds when the loop is blocked.

The old import places (``rstar_env.plugins``, ``rstar_env.tool``, ``rstar_env.reward``, ``rstar_env.sampler``,
``rstar_env.trajectory``) keep working.
"""

from __future__ import annotations

from rstar_env.format import extract_answer
from rstar_env.plugins import (
    OptionsError,
    PluginError,
    PluginLoadWarning,
    hookimpl,
    invoke,
    list_plugins,
    load_reward,
    load_sampler,
    load_tool,
    plugin_options,
    register,
    unregister,
)
from rstar_env.reward import Reward
from rstar_env.sampler import Sampler, TrajectorySummary, checked_select
from rstar_env.tool import EpisodeContext, Tool, function_schema, tool_schema, validate_arguments
from rstar_env.trajectory import RewardResult, ToolErrorKind, ToolResult, Trajectory

__all__ = [
    "EpisodeContext",
    "OptionsError",
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
    "extract_answer",
    "function_schema",
    "hookimpl",
    "invoke",
    "list_plugins",
    "load_reward",
    "load_sampler",
    "load_tool",
    "plugin_options",
    "register",
    "tool_schema",
    "unregister",
    "validate_arguments",
]
