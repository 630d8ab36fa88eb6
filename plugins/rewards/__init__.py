"""Built-in reward plugins: ``math`` (answer correctness) and ``format`` (answer-format compliance).

Registered through the ``rstar_env`` entry-point group (``math_rewards = "rstar_plugins.rewards"``), like any
third-party plugin: ``rstar_env.plugins.load_reward("math", timeout_s=3.0)``.
"""

from __future__ import annotations

from rstar_env.plugins import hookimpl

from .format_reward import FormatOptions, FormatReward
from .math_reward import MathOptions, MathReward


@hookimpl
def rstar_env_rewards() -> list[type]:
    return [MathReward, FormatReward]


__all__ = ["FormatOptions", "FormatReward", "MathOptions", "MathReward", "rstar_env_rewards"]
