"""The hookspecs: what a plugin module implements (``rstar_env_tools``, ``rstar_env_rewards``,
``rstar_env_samplers``), and the markers that tie an implementation to them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pluggy

PROJECT = "rstar_env"
"""pluggy's project name, and the entry-point group plugins are installed under."""
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

PluginKind = Literal["tool", "reward", "sampler"]


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


HOOKS: dict[PluginKind, str] = {
    "tool": "rstar_env_tools",
    "reward": "rstar_env_rewards",
    "sampler": "rstar_env_samplers",
}
"""The hook that provides each kind of plugin."""

SIGNATURE_METHOD: dict[PluginKind, str] = {"tool": "call", "reward": "score", "sampler": "select"}
"""The method that tells a bare plugin class's kind, for ``register(cls)``."""
